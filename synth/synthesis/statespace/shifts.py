"""Shifted keys: states whose chunk positions follow their devices' digits.

After ReduceScatters every device holds other chunks, so a state holds many
distinct ids; but where each device's chunks lie follows its digits, and the
ids relative to those positions are few. Such a state is keyed as the
pattern of its ids moved back by a *shift* (chunks per digit, one per level;
:class:`~.keys.Packed` with ``shift``; :meth:`ShiftedKeys._shifted_key`), and
its groups of one class are alike up to one chunk shift each, computed once
per class (:meth:`ShiftedKeys._shifted_successors`).

Invariant: device ``d`` of a key with shift ``s`` holds its palette id moved
by ``sum(s[l] * digit_l(d))`` chunks (``~id``: an id that does not move), and
:meth:`ShiftedKeys._absolute_ids` takes a key back to its state. Example,
``sizes = (4,)``, ``k = 4``, stride 5, with ``pattern_ids_upto`` lowered to 3
(as tests do): after a ReduceScatter from the start the state is ``(11, 12,
13, 14)``, one base (2) at chunks 0..3, four distinct ids; device 1 starts one
chunk after device 0, so the shift is ``(1,)`` and the key is
``Packed(b"\\x00\\x00\\x00\\x00", (11,), (1,))``: one relative id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..language import Collective
from ..semantics import NO_CHANGE, Loads
from .keys import Packed, StateKey, class_array, pattern_of_array


class ShiftedKeys:
    """Shifted keys, a part of :class:`~synth.synthesis.statespace.StateSpace`
    (a mixin): it owns the per-shift offsets (``_refs``) and the digit matrix."""

    def _init_shifts(self) -> None:
        self._refs: dict[tuple[int, ...], np.ndarray] = {}  # see _ref
        self._digits: np.ndarray | None = None  # see _digit_matrix
        self._shiftable: bool | None = None  # see _shifts_apply

    def _shifted_successors(self, key: Packed, collectives: Sequence[Collective], wanted: int,
                            lookahead: str | None) -> list[tuple[int, Collective, StateKey, Loads]]:
        """:meth:`expand` of a :class:`Packed` key with a shift. Its pattern
        gives the lookahead's sums and, per grouping, the classes of groups
        alike in relative ids, as for :meth:`_pattern_successors`. The groups
        of one class are alike up to one chunk shift each (:meth:`_shifts_apply`),
        and the profile checks, the lookahead's counts and the outcomes do not
        change under a chunk shift of a whole group (:meth:`_compute_shifted`).
        So each class is checked and computed once, on the ids of its first
        group, and every group of the class takes that group's new ids moved
        by the chunks between the two groups' roots. A class with a member
        that the shift does not move (``~id``) is not alike up to a shift:
        each of its groups is computed on its own ids. The next states are
        keyed from their ids (:meth:`key`)."""
        palette = key.palette
        pattern = self._pattern_of(key.labels)
        counting = self._counts_decide(lookahead)
        totals = 0
        unshifted = self._palette_ids(key)  # the lookahead reads base states only, which a shift keeps
        if counting:
            packed, profile = self._packed, self._profile
            totals = sum(n * packed[profile[i]] for i, n in zip(unshifted, pattern.counts))
        chosen = self._chosen.get(tuple(collectives), {})
        if pattern.set_counts is None:
            pattern.set_counts = self._set_counts(np.frombuffer(pattern.labels, np.uint8), len(palette))
        sums = self._grouping_sums(pattern.set_counts, unshifted)
        ids = None  # each device's id, once a step gets past the lookahead
        out = []
        for g, hope in enumerate(self._hopeful(lookahead, sums)):
            if not wanted & hope:
                continue
            if ids is None:
                ids = self._absolute_ids(key)
            takes, counts, group_class = pattern.classes(g)
            firsts = pattern.representatives(g)
            group_key = class_array(group_class)
            if min(palette) < 0 and min(min(take(palette)) for take in takes) < 0:
                firsts, group_key, counts = _split_classes(firsts, group_key, counts,
                                                           [min(take(palette)) >= 0 for take in takes])
            members = ids[self._member_array(g)[firsts]]  # the ids of each class's first group
            keys = list(map(tuple, members.tolist()))
            profiles = list(map(tuple, self._profile_ids_of(members).tolist()))
            ok = self._passing_all(profiles, wanted & hope)
            if not ok:
                continue
            ahead = None
            for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
                if counting:
                    if ahead is None:  # classes that hold equal profiles count as one
                        ahead = {}
                        for group_profiles, n in zip(profiles, counts):
                            ahead[group_profiles] = ahead.get(group_profiles, 0) + n
                    if not self._ahead_by_class(totals, c, ahead.items(), len(group_class), lookahead):
                        continue
                done = self._apply_ids(ids, g, c, keys, group_key, firsts, key.shift)
                if done.__class__ is not str:
                    out.append((g, c) + done)
        return out

    def _apply_ids(self, ids: np.ndarray, grouping: int, collective: Collective, keys: list[tuple[int, ...]],
                   classes: np.ndarray, firsts: np.ndarray | None = None, shift: tuple[int, ...] = ()
                   ) -> tuple[StateKey, Loads] | str:
        """The next state's key and loads of one step from a state of ids
        ``ids`` (an array) whose groups fall into classes: ``keys`` the ids
        of each class's first group (``firsts``), ``classes`` each group's
        class. The next state's ids are set in an array from the classes'
        outcomes and keyed with numpy (:meth:`_key_of_ids`). With the
        ``shift`` of the state's key (:meth:`_shifted_successors`) a group
        takes its class's new ids moved by the chunks between its root and
        the first group's root; without, as they are (:meth:`_pattern_successors`,
        where a next state has more tokens than a byte holds: groups of 1,024
        or 4,096 members)."""
        outcomes = self._class_outcomes(grouping, collective, keys)
        if outcomes.__class__ is str:
            return outcomes
        results, loads = outcomes
        rows = self._member_array(grouping)
        new = np.array(results, dtype=np.int64)[classes]
        if shift:
            roots = self._ref(shift)[rows[:, 0]]
            moved = roots - roots[firsts][classes]  # chunks between each group's root and its class's first group's
            new += np.where(new % self._stride != 0, moved[:, None], 0)
        nxt = ids.copy()
        nxt[rows] = new
        if np.array_equal(nxt, ids):
            return NO_CHANGE
        return self._key_of_ids(nxt), tuple(np.array(loads, dtype=np.int64)[classes].tolist())

    def _shifted_key(self, ids: np.ndarray) -> Packed | None:
        """The :class:`Packed` key with a shift of a state of more than
        ``tuning.pattern_ids_upto`` distinct ids, or None where there is none.
        The shift is read from the state: per level, how many chunks further
        the device one digit along it (``digit_l = 1``, the others 0) starts
        than device 0 (0 where either holds nothing); where that leaves more
        than ``tuning.pattern_ids_upto`` relative ids, how many chunks further
        the last device starts than the one a digit before it along the
        level (device 0 is the root of every grouping's first group, so a
        step on the roots of a grouping moves it and not the rest). A device
        that holds something and still starts inside the chunks once moved
        back by its shift stores the moved id; another one (it holds every
        chunk, say, where a step left it out) stores ``~id`` (negative), and
        one that holds nothing its id. The key exists when a shift is not
        zero and leaves at most ``tuning.pattern_ids_upto`` distinct relative
        ids. So it is a function of the state (its ids as an array), and
        :meth:`devices` takes it back."""
        if not self._shifts_apply():
            return None
        k, stride = self.k, self._stride
        first = ids % stride - 1  # the first chunk each device holds; -1: none
        tried = set()
        for ahead, behind in ((0, 1), (k - 1, -1)):  # from device 0 forward, from the last device back
            shift = []
            for size, w in zip(self.sizes, self.translations.strides):
                here, there = int(first[ahead]), int(first[ahead + behind * w]) if size > 1 else -1
                shift.append((there - here) * behind if here >= 0 and there >= 0 else 0)
            shift = tuple(shift)
            if not any(shift) or shift in tried:
                continue
            tried.add(shift)
            ref = self._ref(shift)
            moved = (first >= 0) & (first >= ref) & (first - ref < k)
            relative = np.where(moved, ids - ref, np.where(first >= 0, ~ids, ids))
            found = pattern_of_array(relative, self.tuning.pattern_ids_upto)
            if found is not None:
                return Packed(*found, shift)
        return None

    def _shifts_apply(self) -> bool:
        """Whether states may be keyed with a shift (:class:`Packed`): in the
        device frame with encoded positions, where in every grouping each
        member lies the same digits (as integers, without wrapping) from its
        group's root in every group, so the chunks a shift puts between a
        member and its root are the same in every group, and a class of
        groups alike in relative ids is alike up to one chunk shift per
        group (:meth:`_shifted_successors`)."""
        if self._shiftable is None:
            digits = self._digit_matrix()
            rows = map(self._member_array, range(len(self.groupings)))
            offsets = [digits[members] - digits[members[:, :1]] for members in rows]  # per group, member, level
            self._shiftable = self._encoded and all((o == o[:1]).all() for o in offsets)
        return self._shiftable

    def _digit_matrix(self) -> np.ndarray:
        """Each device's digits, a (k, levels) array, memoised."""
        if self._digits is None:
            t = self.translations
            self._digits = (np.arange(self.k)[:, None] // np.array(t.strides, dtype=np.int64)) % np.array(self.sizes)
        return self._digits

    def _ref(self, shift: tuple[int, ...]) -> np.ndarray:
        """Per device, the chunks a key's ``shift`` moves its id by
        (:class:`Packed`), memoised."""
        found = self._refs.get(shift)
        if found is None:
            found = self._refs[shift] = self._digit_matrix() @ np.array(shift, dtype=np.int64)
        return found

    def _absolute_ids(self, key: Packed) -> np.ndarray:
        """Each device's id of a :class:`Packed` key with a shift, as an array."""
        relative = np.array(key.palette, dtype=np.int64)[np.frombuffer(key.labels, np.uint8)]
        return np.where(relative < 0, ~relative,
                        relative + np.where(relative % self._stride != 0, self._ref(key.shift), 0))

    @staticmethod
    def _palette_ids(key: Packed) -> tuple[int, ...]:
        """Per distinct id of a :class:`Packed` key, an id of the same base
        state (a shift moves ids along their base's positions; ``~id``
        stands for ``id``): what the lookahead's sums and flags read."""
        return tuple(i if i >= 0 else ~i for i in key.palette) if key.shift else key.palette


def _split_classes(firsts: np.ndarray, classes: np.ndarray, counts: Sequence[int], alike: Sequence[bool]
                   ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Classes of groups (each one's first group ``firsts``, each group's class
    ``classes``, groups per class ``counts``) with those not ``alike`` split
    into one class per group: the alike ones first, in order, then each
    group of the others, in group order; the same three for them."""
    alike = np.array(alike, dtype=bool)
    alone = ~alike[classes]
    kept = int(alike.sum())
    new_classes = np.where(alone, kept + np.cumsum(alone) - 1, (np.cumsum(alike) - 1)[classes])
    new_firsts = np.concatenate([firsts[alike], np.flatnonzero(alone)])
    new_counts = [n for n, a in zip(counts, alike.tolist()) if a] + [1] * int(alone.sum())
    return new_firsts, new_classes, new_counts
