"""Profile checks: which collectives a group's members may run.

Whether a collective's precondition can hold depends on the members'
*profiles* only (which chunks each holds and how many contributors each
chunk has, :func:`~synth.synthesis.semantics.profile_of`), not on which
devices contributed: :func:`~synth.synthesis.semantics.profile_reason`. So
the checks are memoised per tuple of members' profile ids, and many groups
that differ in contributors share one entry.

Invariant: ``_passes(profiles)`` is the bit set (:mod:`.bits`) of the
collectives ``c`` for which ``profile_reason(c, members, size)`` is None.
Example, ``k = 2``, a group of two members that each hold both chunks from
themselves (profile ``((2,), (1,))``, one id ``p``): ``_passes((p, p))`` is
``SUMMING`` (AllReduce, ReduceScatter and Reduce pass: equal chunks, at most
``k`` contributors in the sum); AllGather fails (the members' chunks
overlap), Broadcast too (no member gains). A root that is done passes
Broadcast alone.

The shape check (which chunks are held) is memoised on the members' held
chunks, and the contributor counts are looked at only for the collectives
that pass it. Groups of many members at many positions (a ReduceScatter's
parts) are checked from their base states' runs with numpy
(:meth:`ProfileChecks._positions_shape`); groups that are chunk shifts of one
another share one check (:meth:`ProfileChecks._passes_shifted`); a pattern's
large classes are checked on their distinct profiles and counts
(:meth:`ProfileChecks._passes_counted`).

Test hooks: the tests (tests/synthesis/test_semantics.py, test_search.py) read or call
these members of this part directly, to check its invariants against an independent
reference: ``_check_profiles``, ``_passes_counted``, ``_passing``, ``_positions_shape``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from functools import reduce
from operator import and_

import numpy as np

from ..language import Collective
from ..semantics import count_reason, more_contributors, shape_bits
from .bits import BIT, BROADCASTING, COUNT_FREE, SUMMING
from .positions import first_occurrences


class ProfileChecks:
    """The profile checks of :class:`~synth.synthesis.statespace.StateSpace`
    (a mixin): it owns their memos (``_passing``, ``_shifted_passing``,
    ``_counted_passing``, ``_shapes``, ``_exceeds``) and ``_chosen``."""

    def _init_checks(self) -> None:
        self._passing: dict[tuple[int, ...], int] = {}  # member profiles -> bit set of collectives that pass them
        self._shifted_passing: dict[tuple, int] = {}  # see _passes_shifted
        self._counted_passing: dict[tuple[int, tuple[tuple[int, int], ...]], int] = {}  # see _passes_counted
        # (held chunks of the distinct profiles, size) -> shape_bits
        self._shapes: dict[tuple[tuple[int, ...], int], int] = {}
        self._exceeds: dict[tuple[int, int], bool] = {}  # (profile, root profile) -> more_contributors
        self._chosen: dict[tuple[Collective, ...], dict[int, tuple[Collective, ...]]] = {}  # see _choose
        self._done_profile = self._intern_profile(((self.k,), (self.k,)))  # every chunk from every device

    def _passes(self, profiles: tuple[int, ...]) -> int:
        """The collectives (bit ``i`` = the ``i``-th of :class:`Collective`) whose
        :func:`profile_reason` passes members with these profile ids, memoised:
        many groups differ in contributors only. The shape check (which chunks
        are held) is memoised on the members' held chunks, and the contributor
        counts are looked at only for the collectives that pass it. A root that
        is done (every chunk from every device) passes Broadcast alone: it
        contains every member, and no other collective can run with it."""
        bits = self._passing.get(profiles)
        if bits is None:
            if profiles[0] == self._done_profile:
                bits = BROADCASTING
            elif self._device_frame and len(profiles) <= self.tuning.shifted_groups_upto:
                bits = self._passes_shifted(profiles)
            else:
                bits = self._check_profiles(profiles)
            if len(profiles) < self._whole_key:
                self._passing[profiles] = bits
        return bits

    def _passes_shifted(self, profiles: tuple[int, ...]) -> int:
        """:meth:`_check_profiles`, shared by groups whose members' profiles are
        the same up to one chunk shift (device frame; see :meth:`_compute_shifted`)."""
        base, key = self._moved_down(profiles)
        if not base:
            return self._check_profiles(profiles)
        bits = self._shifted_passing.get(key)
        if bits is None:
            bits = self._shifted_passing[key] = self._check_profiles(profiles)
        return bits

    def _check_profiles(self, profiles: tuple[int, ...]) -> int:
        """See :meth:`_passes` (not memoised)."""
        arrays = None
        if self._encoded and len(profiles) >= self.tuning.numpy_counts_from:  # counted with numpy
            arrays = first_occurrences(profiles)
            counted = list(zip(arrays[0].tolist(), arrays[1].tolist()))
        else:
            counted = self._counted(profiles)
        return self._check_counted(counted, len(profiles), arrays)

    def _passes_counted(self, counted: tuple[tuple[int, int], ...], size: int) -> int:
        """:meth:`_passes` of a group of ``size`` members given as its distinct
        profile ids and how many members hold each (root first, the others in
        any order): the checks look at the root and the multiset of profiles
        only. Memoised on ``(size, counted)``, a key of a few pairs however
        many members the group has (a pattern's large classes, see
        :meth:`_pattern_successors`)."""
        key = (size, counted)
        bits = self._counted_passing.get(key)
        if bits is None:
            if counted[0][0] == self._done_profile:
                bits = BROADCASTING
            else:
                bits = self._check_counted(counted, size)
            self._counted_passing[key] = bits
        return bits

    def _check_counted(self, counted: Sequence[tuple[int, int]], size: int,
                       arrays: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """:meth:`_check_profiles` of the members' distinct profile ids with
        their counts (root first; ``arrays``: the same as two arrays, for many)."""
        few = self.tuning.few_profiles_upto
        if self._encoded and len(counted) > few:  # many positions: from the base states' runs
            shape = self._positions_shape(counted, size, arrays)
        elif len(counted) > few:  # rare and large: hashing would cost more than checking
            shape = shape_bits([self._held[p] for p, _ in counted], size)
        else:
            held = [self._held[p] for p, _ in counted]
            shape_key = (tuple(held), size)
            shape = self._shapes.get(shape_key)
            if shape is None:
                shape = self._shapes[shape_key] = shape_bits(held, size)
        bits = shape & COUNT_FREE
        if shape & SUMMING:  # the same count check for the three summing collectives
            if count_reason(Collective.ALLREDUCE, [(self._profiles[p], n) for p, n in counted]) is None:
                bits |= shape & SUMMING
        if shape & BROADCASTING:  # count_reason of Broadcast, one pair of profiles at a time
            root, exceeds = counted[0][0], self._exceeds
            if not any(exceeds[p, root] if (p, root) in exceeds else self._exceeding(p, root) for p, _ in counted):
                bits |= BROADCASTING
        return bits

    def _positions_shape(self, counted: Sequence[tuple[int, int]], size: int,
                         arrays: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """:func:`shape_bits` of members with these encoded profile ids (each
        with how many members have it, root first; ``arrays``: the same as two
        arrays, for many members) without building their held runs: each
        distinct base's runs moved to each of its positions, with numpy
        ("Positions"; after a ReduceScatter every member's runs lie elsewhere).
        The same bits: summing when every member holds the root's runs at the
        root's position (a run set moved elsewhere is another set), Broadcast
        when every member's runs lie within the root's, AllGather when the
        counts are equal and no two members' runs overlap."""
        stride = self._stride
        root_base, root_first = divmod(counted[0][0], stride)
        root_first -= 1
        if arrays is None:  # a loop over the few distinct profiles
            by_base: dict[int, list[tuple[int, int]]] = {}
            for p, n in counted:
                by_base.setdefault(p // stride, []).append((p % stride - 1, n))
            firsts_of = {b: np.array([f for f, _ in at if f >= 0], dtype=np.int64) for b, at in by_base.items()}
            copies = sum(n - 1 for at in by_base.values() for f, n in at if f >= 0)
            at_root = all(f == root_first for at in by_base.values() for f, _ in at)
        else:  # many: grouped by base with numpy
            ids, counts = arrays
            bases, firsts = np.divmod(ids, stride)
            firsts -= 1  # the first held chunk; -1: holds none
            holding = firsts >= 0
            firsts_of = {b: firsts[holding & (bases == b)] for b in np.unique(bases).tolist()}
            copies = int((counts[holding] - 1).sum())
            at_root = bool((firsts == root_first).all())
        root_held = self._base_held[root_base]
        if root_first < 0 or not root_held:  # the root holds nothing: at most AllGather, if none holds any
            return COUNT_FREE if all(not self._base_held[b] for b in firsts_of) else 0
        bits = 0
        if at_root and all(self._base_held[b] == root_held for b in firsts_of):
            count = self._base_held_count[root_base]
            bits |= SUMMING if count % size == 0 else SUMMING & ~(1 << BIT[Collective.REDUCESCATTER])
        starts, stops = [], []
        for b, at in firsts_of.items():
            if len(at):
                held = np.array(self._base_held[b], dtype=np.int64).reshape(-1, 2)
                starts.append((at[:, None] + held[None, :, 0]).ravel())
                stops.append((at[:, None] + held[None, :, 1]).ravel())
        start, stop = np.concatenate(starts), np.concatenate(stops)
        root_runs = np.array(root_held, dtype=np.int64) + root_first
        inside = np.searchsorted(root_runs[:, 0], start, side="right") - 1  # the root run each could lie in
        if ((inside >= 0) & (stop <= root_runs[np.maximum(inside, 0), 1])).all():
            bits |= BROADCASTING
        if len({self._base_held_count[b] for b in firsts_of}) == 1 and not copies:  # equal counts, none at one place
            order = np.argsort(start, kind="stable")
            start, stop = start[order], stop[order]
            if (start[1:] >= np.maximum.accumulate(stop)[:-1]).all():  # pairwise disjoint
                bits |= COUNT_FREE
        return bits

    def _exceeding(self, p: int, root: int) -> bool:
        """Whether profile ``p`` carries more contributors than profile ``root``
        on some chunk (:func:`more_contributors`), memoised in ``_exceeds``."""
        out = self._exceeds[p, root] = more_contributors(self._profiles[p], self._profiles[root])
        return out

    def _counted(self, profiles: tuple[int, ...]) -> list[tuple[int, int]]:
        """Distinct profile ids (first occurrence first) and how many members have each."""
        if len(profiles) > self.tuning.few_profiles_upto:
            return list(Counter(profiles).items())
        return [(p, profiles.count(p)) for p in dict.fromkeys(profiles)]

    def _passing_all(self, keys: Collection[tuple[int, ...]], wanted: int) -> int:
        """The collectives of ``wanted`` (bit set) that pass the profile checks
        (:meth:`_passes`) of every group in ``keys`` (members' profile ids,
        repeats allowed); when some key is new, each distinct key is checked
        until none is left."""
        try:
            return reduce(and_, map(self._passing.__getitem__, keys), wanted)
        except KeyError:
            ok = wanted
            for key in dict.fromkeys(keys):
                bits = self._passing.get(key)
                ok &= self._passes(key) if bits is None else bits
                if not ok:
                    break
            return ok

    def _choose(self, collectives: Sequence[Collective], ok: int) -> tuple[Collective, ...]:
        """The ``collectives`` (in their order) whose bits are set in ``ok``,
        memoised per ``collectives`` (:meth:`successors`)."""
        out = self._chosen.setdefault(tuple(collectives), {})[ok] = tuple(c for c in collectives if ok >> BIT[c] & 1)
        return out
