"""Patterns: stepping a state of few distinct ids once per class of groups.

A device-frame state (fewer than ``tuning.numpy_profiles_from`` devices)
that holds at most ``tuning.pattern_ids_upto`` distinct ids is its *pattern*
(per device, the index of its id among the distinct ids, first occurrence
first, as bytes) and its distinct ids, the *palette*. Many states share a
pattern: at five levels of 4, the search's 9,891 states share 2,357 patterns
of 27 distinct ids on average. Per pattern and grouping the groups fall into
classes that hold equal ids (6.5 on average); the checks, the lookahead and
the outcomes are looked up once per class through the palette, so a state
costs per class, not per device (:meth:`PatternSteps._pattern_successors`).

Invariant: stepping per pattern gives the same steps, in the same order, as
the per-device path (tests compare both on every reachable state). Example,
``sizes = (2, 2)``: the state ``(7, 9, 7, 9)`` has palette ``(7, 9)`` and
pattern ``b"\\x00\\x01\\x00\\x01"``; on the grouping of groups ``(0, 1), (2,
3)`` both groups hold ``(7, 9)``: one class of two groups, one look-up.

The search keeps such a state as a :class:`~.keys.Packed` key and steps it
without a tuple of ``k`` ids: each next state's pattern is found from its
parent's classes with one bytes translation (:meth:`PatternSteps._tokens`,
:meth:`PatternSteps._packed_key`).

Test hooks: the tests (tests/synthesis/test_semantics.py, test_search.py) read or call
these members of this part directly, to check its invariants against an independent
reference: ``_classes``, ``_pattern``, ``_pattern_successors``, ``_patterns``,
``_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING
from functools import partial
from itertools import chain
from operator import itemgetter

import numpy as np

from ..language import Collective
from ..semantics import NO_CHANGE, Loads
from .keys import Packed, StateKey, class_array, labels_of
from .positions import first_occurrences

if TYPE_CHECKING:
    from .space import StateSpace

_ROW_TYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


class Pattern:
    """Which devices of a state hold equal ids: per device, the index of its id
    among the state's distinct ids (first occurrence first), as bytes. Many
    states share a pattern (they differ in what the ids are, not in where they
    repeat), and per grouping the pattern fixes which groups are alike: for
    each grouping (filled on first use) the classes of groups, each as a
    callable that takes its members' values (ids, profile ids) from the
    state's distinct ones, the number of groups in each class, and each
    group's class in group order. Classes of many members keep their indices
    as bytes (an itemgetter keeps 8 bytes per member, and thousands of
    patterns are kept). The lookahead's counts of devices per set and distinct
    id (:meth:`Lookahead._set_counts`) depend on the pattern only and are
    kept too (16-bit: six levels of 4, 6,532 patterns, +42 MiB, 9% faster)."""

    __slots__ = ("space", "labels", "counts", "set_counts", "_classes", "_tallies", "tokens", "_firsts")

    def __init__(self, space: StateSpace, labels: bytes) -> None:
        self.space = space
        self.labels = labels
        self.set_counts: np.ndarray | None = None  # see Lookahead._set_counts
        self.counts = np.bincount(np.frombuffer(labels, np.uint8)).tolist()  # devices per distinct id
        self._classes: list[tuple[list[Callable], list[int], Sequence[int]] | None] = [None] * len(space.groupings)
        self._tallies: dict[int, list[tuple[tuple[int, int], ...]]] = {}
        self.tokens: dict[int, tuple[bytes, tuple[int, ...]] | None] = {}  # see PatternSteps._tokens
        self._firsts: dict[int, np.ndarray] = {}  # see representatives

    def classes(self, g: int) -> tuple[list[Callable], list[int], Sequence[int]]:
        """Grouping ``g``'s classes of groups: (one callable per class taking
        its members' values from the state's distinct ones, groups per class,
        each group's class in group order), found on first use."""
        found = self._classes[g]
        if found is None:
            space = self.space
            m = space._size[g]
            if m * len(space.groupings[g].groups) >= space.tuning.numpy_classes_from:  # rows told apart by np.unique
                rows = np.ascontiguousarray(np.frombuffer(self.labels, np.uint8)[space._member_array(g)])
                # a row of 1, 2, 4 or 8 bytes sorts as one unsigned integer (2x faster than as bytes)
                _, first, inverse, many = np.unique(rows.view(_ROW_TYPES.get(m, np.dtype((np.void, m)))).ravel(),
                                                    return_index=True, return_inverse=True, return_counts=True)
                keys = [rows[i].tobytes() for i in first.tolist()]
                counts = many.tolist()
                group_class = inverse.ravel().astype(np.uint8).tobytes() if len(keys) < 256 else inverse.tolist()
            else:
                members = bytes(space._flat[g](self.labels))  # the itemgetter gives a tuple of indices
                index: dict[bytes, int] = {}
                group_class = [index.setdefault(members[i:i + m], len(index)) for i in range(0, len(members), m)]
                keys = list(index)
                counts = [0] * len(keys)
                for n in group_class:
                    counts[n] += 1
                group_class = bytes(group_class) if len(keys) < 256 else group_class
            takes = [itemgetter(*key) if m <= space.tuning.getter_members_upto else partial(_take, key) for key in keys]
            found = self._classes[g] = (takes, counts, group_class)
        return found

    def representatives(self, g: int) -> np.ndarray:
        """Per class of grouping ``g`` (as :meth:`classes`), its first group's
        index; found on first use."""
        found = self._firsts.get(g)
        if found is None:
            _, _, group_class = self.classes(g)
            found = self._firsts[g] = np.unique(class_array(group_class), return_index=True)[1]
        return found

    def tallies(self, g: int) -> list[tuple[tuple[int, int], ...]]:
        """Per class of grouping ``g`` (as :meth:`classes`), its members'
        distinct ids as indices into the state's distinct ones, each with how
        many members hold it, the root's first; found on first use."""
        found = self._tallies.get(g)
        if found is None:
            space = self.space
            rows = np.frombuffer(self.labels, np.uint8)[space._member_array(g)]
            classes, _, group_class = self.classes(g)
            first = {}
            for group, c in enumerate(group_class):
                first.setdefault(c, group)
            found = self._tallies[g] = [_tally(rows[first[c]]) for c in range(len(classes))]
        return found


def _tally(labels: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Each distinct label of a uint8 array with how many times it occurs, in
    order of first occurrence (``tuple(Counter(labels).items())``)."""
    distinct, counts = first_occurrences(labels)
    return tuple(zip(distinct.tolist(), counts.tolist()))


def tallied(values: Sequence[int], tally: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """A class's :meth:`Pattern.tallies` entry through the state's distinct
    ``values`` (profile ids): each distinct value and how many members hold
    it, in first-occurrence order (distinct ids of equal value add up)."""
    merged: dict[int, int] = {}
    for label, n in tally:
        v = values[label]
        merged[v] = merged.get(v, 0) + n
    return tuple(merged.items())


def _take(indices: bytes, values: tuple[int, ...]) -> tuple[int, ...]:
    """``values`` at ``indices``, as a tuple of the same int objects (memo
    keys share them), through a numpy array of objects: 4x faster than a
    map for 4,096 indices."""
    table = np.empty(len(values), dtype=object)
    table[:] = values
    return tuple(table[np.frombuffer(indices, np.uint8)].tolist())


class PatternSteps:
    """Stepping per pattern, a part of
    :class:`~synth.synthesis.statespace.StateSpace` (a mixin): it owns the
    patterns met (``_patterns``), which keep their classes and tokens."""

    def _init_patterns(self) -> None:
        self._patterns: dict[bytes, Pattern] = {}  # see _pattern_successors

    def _pattern(self, state: tuple[int, ...], palette: tuple[int, ...]) -> Pattern:
        """The :class:`Pattern` of ``state`` (whose distinct ids are ``palette``), memoised."""
        return self._pattern_of(labels_of(state, palette))

    def _pattern_of(self, labels: bytes) -> Pattern:
        """The :class:`Pattern` of these labels, memoised."""
        found = self._patterns.get(labels)
        if found is None:
            found = self._patterns[labels] = Pattern(self, labels)
        return found

    def _pattern_successors(self, state: tuple[int, ...] | None, palette: tuple[int, ...],
                            collectives: Sequence[Collective], wanted: int, lookahead: str | None,
                            labels: bytes | None = None) -> list[tuple[int, Collective, StateKey, Loads]]:
        """:meth:`successors` of a state holding few distinct ids, ``palette``
        (first occurrence first). The state is its *pattern* (each device's
        index into the palette) and the palette; the pattern says which groups
        of a grouping hold equal ids (:class:`Pattern`, found once per
        pattern), so the profile checks, the lookahead and the outcomes are
        looked up once per class of groups, through the palette, with the same
        memos as the per-device path, and the next state is assembled from
        the classes' outcomes.

        With ``state`` None the state is given as its pattern ``labels`` and
        ``palette`` (a :class:`Packed` key, :meth:`expand`), and so are the
        next states: each is found from this one's classes through per-pattern
        tokens and one bytes translation (:meth:`_tokens`, :meth:`_packed_key`),
        without a tuple of ``k`` ids; where a next state has more tokens than
        a byte holds, from an array of ids (:meth:`_apply_ids`)."""
        pattern = self._pattern(state, palette) if labels is None else self._pattern_of(labels)
        profiles = tuple(map(self._profile.__getitem__, palette))
        packing = state is None
        counting = self._counts_decide(lookahead)
        totals = 0
        if counting:
            packed = self._packed
            totals = sum(n * packed[p] for p, n in zip(profiles, pattern.counts))
        chosen = self._chosen.get(tuple(collectives), {})
        if pattern.set_counts is None:
            pattern.set_counts = self._set_counts(np.frombuffer(pattern.labels, np.uint8), len(palette))
        sums = self._grouping_sums(pattern.set_counts, palette)
        devices = None  # each device's id, where a next state has too many tokens (_apply_ids)
        out = []
        for g, hope in enumerate(self._hopeful(lookahead, sums)):
            if not wanted & hope:
                continue
            classes, counts, group_class = pattern.classes(g)
            if counting or self._size[g] <= self.tuning.getter_members_upto:
                keys = [take(profiles) for take in classes]  # each class's members' profile ids
                ok = self._passing_all(keys, wanted & hope)
            else:  # large groups: each class's profiles counted from its members' distinct ids (a few)
                ok, m = wanted & hope, self._size[g]
                for tally in pattern.tallies(g):
                    ok &= self._passes_counted(tallied(profiles, tally), m)
                    if not ok:
                        break
            if not ok:
                continue
            ids = ahead = tokens = None  # each class's members' ids, once a step gets past the lookahead
            for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
                if counting:
                    if ahead is None:  # classes of ids that hold equal profiles count as one
                        ahead = {}
                        for key, n in zip(keys, counts):
                            ahead[key] = ahead.get(key, 0) + n
                    if not self._ahead_by_class(totals, c, ahead.items(), len(group_class), lookahead):
                        continue
                if ids is None:
                    ids = [take(palette) for take in classes]
                    if packing:
                        tokens = self._tokens(pattern, g, palette)
                        if tokens is None and devices is None:  # too many tokens: built from the devices' ids
                            devices = np.array(palette, dtype=np.int64)[np.frombuffer(pattern.labels, np.uint8)]
                if tokens is not None:
                    done = self._apply_packed(Packed(pattern.labels, palette), g, c, ids, group_class, tokens)
                elif packing:
                    done = self._apply_ids(devices, g, c, ids, class_array(group_class))
                else:
                    done = self._apply_classes(state, g, c, ids, group_class)
                if done.__class__ is not str:
                    out.append((g, c) + done)
        return out

    def _apply_classes(self, state: tuple[int, ...], grouping: int, collective: Collective,
                       keys: list[tuple[int, ...]], group_class: Sequence[int]) -> tuple[tuple[int, ...], Loads] | str:
        """:meth:`_apply` (the search's, without ``explain``) of a step whose
        groups fall into classes: ``keys`` the members' ids per class,
        ``group_class`` each group's class, in group order."""
        outcomes = self._class_outcomes(grouping, collective, keys)
        if outcomes.__class__ is str:
            return outcomes
        results, loads = outcomes
        result = tuple(chain.from_iterable(map(results.__getitem__, group_class)))
        nxt = self._pickers[grouping](result if self._covers[grouping] else result + state)
        return NO_CHANGE if nxt == state else (nxt, tuple(map(loads.__getitem__, group_class)))

    def _tokens(self, pattern: Pattern, g: int, palette: tuple[int, ...]
                ) -> tuple[bytes, tuple[int, ...], tuple[int, ...]] | None:
        """Where each device of a next state on grouping ``g`` takes its id
        from, for :meth:`_packed_key`: one *token* per member position of each class
        of groups (``class * m + position``; the classes' outcomes, in order)
        and, when some device is in no group, one per distinct id of the
        state, which it keeps (after them). Returns each device's token as
        bytes, the tokens in order of their first device (kept per pattern),
        and the kept ids; None when there are more than ``tuning.tokens_upto``. The
        first two depend on the pattern only and are kept with it (five
        levels of 4: 4,669 kept for 20,486 calls, 7 MB)."""
        found = pattern.tokens.get(g, False)
        if found is False:
            classes, _, group_class = pattern.classes(g)
            m, covers = self._size[g], self._covers[g]
            members = len(classes) * m
            if members + (0 if covers else len(palette)) > self.tuning.tokens_upto:
                found = None
            else:  # a device in no group keeps its label, moved past the members' tokens
                labels = np.frombuffer(pattern.labels, np.uint8)
                tokens = np.empty(self.k, np.uint8) if covers else labels + np.uint8(members)
                tokens[self._member_array(g)] = class_array(group_class).astype(np.intp)[:, None] * m + np.arange(m)
                found = tokens.tobytes(), tuple(first_occurrences(tokens)[0].tolist())
            pattern.tokens[g] = found
        return None if found is None else found + (() if self._covers[g] else palette,)

    def _packed_key(self, tokens: tuple[bytes, tuple[int, ...], tuple[int, ...]],
                results: list[tuple[int, ...]]) -> StateKey:
        """The key of the next state built from its classes' outcomes
        ``results`` (new ids per class, by position) and its tokens
        (:meth:`_tokens`): each token's new id is its class's outcome at its
        position or the kept id; the distinct ids in order of first device
        and a table from token to label give the labels with one translation
        of the tokens. A next state of more than ``tuning.pattern_ids_upto``
        distinct ids is its tuple of ids (:meth:`key`)."""
        device_tokens, order, kept = tokens
        values = tuple(chain.from_iterable(results)) + kept
        seen: dict[int, int] = {}
        table = bytearray(256)
        for token in order:
            value = values[token]
            label = seen.get(value)
            if label is None:
                label = seen[value] = len(seen)
            table[token] = label
        if len(seen) > self.tuning.pattern_ids_upto:
            state = tuple(map(values.__getitem__, device_tokens))
            return self._shifted_key(np.fromiter(state, np.int64, self.k)) or state
        return Packed(device_tokens.translate(table), tuple(seen))

    def _apply_packed(self, parent: Packed, grouping: int, collective: Collective, keys: list[tuple[int, ...]],
                      group_class: Sequence[int], tokens: tuple[bytes, tuple[int, ...], tuple[int, ...]]
                      ) -> tuple[StateKey, Loads] | str:
        """:meth:`_apply_classes` of a state given as its :class:`Packed` key,
        the next state as its key too (:meth:`_packed_key`)."""
        outcomes = self._class_outcomes(grouping, collective, keys)
        if outcomes.__class__ is str:
            return outcomes
        results, loads = outcomes
        nxt = self._packed_key(tokens, results)
        if nxt == parent:
            return NO_CHANGE
        return nxt, tuple(map(loads.__getitem__, group_class))
