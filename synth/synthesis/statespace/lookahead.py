"""The lookahead: which steps can still lead to the goal in time.

The search asks, at the step before last, for next states that may finish
in one step (``"finish"``, :meth:`Lookahead.may_finish`) and at the last
step for the goal (``"goal"``). Both are judged before any group is looked
at, from two summaries of a state:

**Packed counts** (:mod:`.bits`): per profile, five numbers (holds every
chunk, complete, done, final, mass) packed in one integer; a state's counts
are their sum over devices, and a step changes them by the sum over its
groups of what each group changes (:meth:`Lookahead._delta`, memoised per
members' profiles).

**Grouping sums.** A state's per-device :class:`Quantities` summed over fixed
sets of devices: device 0, every device, and per grouping its group 0, its
roots and its members (:meth:`Lookahead._grouping_sums`; one small matrix
product per state, the counts per set and distinct id kept per pattern).
The sums bound each collective's validity, and for the AllReduce goal they
decide the lookahead of the last two steps exactly
(:meth:`Lookahead._hopeful`): at five levels of 4, 5,590 of the 7,675 states
the step before last expands are done with before any grouping's classes are
found.

Invariant: a step passes ``_hopeful``'s bit for the AllReduce goal exactly
when its next state passes :meth:`Lookahead.may_finish` (``"finish"``) or is
the goal (``"goal"``). Example, ``k = 4``, the state after a ReduceScatter
over all four devices (device ``d`` holds chunk ``d`` from every device):
each device's quantities are ``Quantities(holds_all=0, complete=1, held=1,
mass=4, empty=0, held_squared=1)``, so every device's sum is ``(0, 4, 4, 16,
0, 4)``; the last step must give every device mass ``k**2 = 16``, i.e. a
total of 64: an AllGather over all four (``m * S = 4 * 16``, complete) passes
"goal", a Broadcast cannot (its roots are not done).

Test hooks: the tests (tests/synthesis/test_semantics.py, test_search.py) read or call
these members of this part directly, to check its invariants against an independent
reference: ``_deltas``, ``_exact_in_floats``, ``_grouping_sums``, ``_hopeful``,
``_named_sums``, ``_set_counts``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from ..language import Collective
from ..semantics import Goal, finishing_masses, profile_results
from .bits import (
    ALL_BITS,
    BIT,
    BIT_ALLGATHER,
    BIT_ALLREDUCE,
    BIT_REDUCE,
    BIT_REDUCESCATTER,
    BROADCASTING,
    COUNT_FREE,
    FIELD,
    MASK,
    OFFSETS,
    SUMMING,
)
from .keys import Packed, StateKey


class Quantities(NamedTuple):
    """What the lookahead sums per device (:meth:`Lookahead._grouping_sums`),
    or a sum of them over a set of devices."""

    holds_all: int  #: holds every chunk (0 or 1 per device)
    complete: int  #: every held chunk has 0 or k contributors
    held: int  #: held chunks
    mass: int  #: contributor counts summed over chunks
    empty: int  #: holds nothing
    held_squared: int  #: held chunks squared


#: the quantities' names, in order
QUANTITIES = Quantities._fields


class GroupingShape(NamedTuple):
    """A grouping's members per group, groups, and devices in its groups."""

    size: int
    groups: int
    devices: int


class SetSums(NamedTuple):
    """A state's :class:`Quantities` summed over each distinct set of devices
    of :meth:`Lookahead._grouping_sets`, one list per quantity indexed by set
    (columns: a state builds one tuple, not one per set, and
    :meth:`Lookahead._hopeful` reads ``mass[roots]``)."""

    holds_all: list[int]
    complete: list[int]
    held: list[int]
    mass: list[int]
    empty: list[int]
    held_squared: list[int]

    def of(self, index: int) -> Quantities:
        """The quantities of one set."""
        return Quantities(*(column[index] for column in self))


class GroupingSets(NamedTuple):
    """A grouping's sets of devices, as indices into :class:`SetSums`: its
    group 0, its roots, and its members (every device when every device is
    in a group)."""

    group0: int
    roots: int
    members: int


class GroupingSums(NamedTuple):
    """A state's :class:`Quantities` at device 0, summed over every device,
    and per grouping over its :class:`GroupingSets` (for reading; the search
    reads :class:`SetSums`)."""

    device0: Quantities
    every: Quantities
    per_grouping: list[tuple[Quantities, Quantities, Quantities]]


class Lookahead:
    """The lookahead of :class:`~synth.synthesis.statespace.StateSpace` (a
    mixin): it owns the memos of packed deltas (``_deltas``) and the rows of
    quantities per base state."""

    def _init_lookahead(self) -> None:
        # the masses a state that the last step (AllReduce or AllGather) finishes can have (see may_finish)
        self._finishing_masses = finishing_masses(self.groupings, self.k)
        self._shapes_of = [GroupingShape(len(g.groups[0]), len(g.groups), len(g.groups) * len(g.groups[0]))
                           for g in self.groupings]
        self._deltas: list[dict[tuple[int, ...], int]] = [{} for _ in Collective]  # per collective (see _delta)
        # per base device state its profile's QUANTITIES, as rows of an array grown as states are interned
        # (see _device_quantities)
        self._quantity_rows = np.zeros((0, len(QUANTITIES)), dtype=np.int64)
        self._quantities_filled = 0
        self._set_index: tuple[np.ndarray, np.ndarray, list[int]] | None = None  # see _grouping_sets
        # device 0's and every device's distinct set, and each grouping's sets (see _grouping_sets)
        self._device0_set = self._every_set = 0
        self._sets_of: list[GroupingSets] = []
        self._exact_in_floats = self.k**3 < 2**53  # sums of quantities (at most k**3) are exact as floats

    def may_finish(self, state: StateKey) -> bool:
        """:func:`may_finish_in_one_step`, on the state's packed profile
        counts (:meth:`_after_passes`) and device 0: the last step is an
        AllReduce (every device holds every chunk), an AllGather (every held
        sum is complete) or a Broadcast (device 0, the root of its group in
        every grouping, is done already), and a last AllReduce or AllGather on
        a grouping of ``G`` groups over ``n`` devices leaves the ``k - n``
        others as they are, so they are done, and gives each group ``k`` chunks
        of ``k`` contributors: the state's mass (its contributor counts summed
        over devices and chunks) is ``(G + k - n) * k**2`` for one of the
        groupings."""
        if self.goal is not Goal.ALLREDUCE:
            return True
        packed = self._packed
        profile = self._profile
        if (packed[profile[state[0] if state.__class__ is not Packed else state.palette[0]]]
                >> (FIELD * 2)) & MASK:  # device 0 is done (a Packed state's first distinct id is device 0's)
            return True
        if state.__class__ is Packed:
            counted = zip(self._palette_ids(state), self._pattern_of(state.labels).counts)
        else:
            counted = Counter(state).items()
        return self._after_passes(sum(n * packed[profile[i]] for i, n in counted), "finish")

    def _delta(self, collective: Collective, profiles: tuple[int, ...]) -> int:
        """How one group changes the packed counts, plus OFFSETS (keeps every
        field non-negative); for members that pass the profile checks."""
        deltas = self._deltas[BIT[collective]]
        out = deltas.get(profiles)
        if out is None:
            packed = self._packed
            if collective is Collective.BROADCAST:  # every member ends with the root's profile
                gained = len(profiles) * packed[profiles[0]]
            else:  # members that end alike often share one result object: intern it once
                members = [(self._profiles[p], n) for p, n in self._counted(profiles)]
                gained, interned = 0, {}
                for result in profile_results(collective, members, self.k):
                    flags = interned.get(id(result))
                    if flags is None:
                        flags = interned[id(result)] = packed[self._intern_profile(result)]
                    gained += flags
            out = gained - sum(map(packed.__getitem__, profiles)) + OFFSETS
            if len(profiles) < self._whole_key:
                deltas[profiles] = out
        return out

    def _device_quantities(self, ids: np.ndarray) -> np.ndarray:
        """Per device state id in ``ids``: its profile's :data:`QUANTITIES`,
        one row each. The rows per base state are kept in an array that grows
        (doubling) as states are interned."""
        n = len(self._base_profile)
        if self._quantities_filled < n:
            rows = self._quantity_rows
            if len(rows) < n:
                more = np.zeros((max(n, 2 * len(rows)) - len(rows), len(QUANTITIES)), dtype=np.int64)
                rows = self._quantity_rows = np.concatenate([rows, more])
            base = self._stride if self._encoded else 1
            packed, held = self._base_packed, self._base_held_count
            new = []
            for p in self._base_profile[self._quantities_filled:n]:
                flags, count = packed[p // base], held[p // base]
                new.append((flags & MASK, (flags >> FIELD) & MASK, count, flags >> (FIELD * 4), int(not count),
                            count * count))
            rows[self._quantities_filled:n] = new
            self._quantities_filled = n
        return self._quantity_rows[ids // self._stride if self._encoded else ids]

    def _grouping_sets(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The sets of devices :meth:`_grouping_sums` sums over: device 0;
        every device; then per grouping its group 0, its roots, and its
        members when some device is in no group, else none. Many are the
        same set (parallel(j) and master(j) share their group 0, the group 0
        of the grouping of every device is every device: 33 distinct of 110
        at six levels of 4), so each distinct one is listed once. Returns
        their devices, one distinct set after the other, each listed
        device's distinct set, and per set (in the order above) its distinct
        set."""
        if self._set_index is None:
            parts = [np.zeros(1, dtype=np.int64), np.arange(self.k, dtype=np.int64)]
            for g in range(len(self.groupings)):
                rows = self._member_array(g)
                parts += [rows[0], rows[:, 0], rows.ravel() if rows.size < self.k else rows[:0, 0]]
            distinct: dict[bytes, int] = {}
            which = [distinct.setdefault(part.tobytes(), len(distinct)) for part in parts]
            kept = [parts[which.index(n)] for n in range(len(distinct))]
            sets = np.repeat(np.arange(len(kept)), [len(part) for part in kept])
            self._set_index = (np.concatenate(kept), sets, which)
            self._device0_set, self._every_set = which[0], which[1]
            self._sets_of = [GroupingSets(which[i], which[i + 1], which[i + 2] if shape.devices < self.k else which[1])
                             for i, shape in zip(range(2, len(which), 3), self._shapes_of)]
        return self._set_index

    def _set_counts(self, labels: np.ndarray, width: int) -> np.ndarray:
        """How many devices of each distinct set of :meth:`_grouping_sets`
        hold each of ``width`` distinct ids, where device ``d`` holds the
        ``labels[d]``-th: a (distinct sets, width) array (16-bit below 65,536
        devices), which depends on which devices hold equal ids only (a
        :class:`Pattern` keeps it)."""
        index, sets, which = self._grouping_sets()
        count = max(which) + 1
        held = np.bincount(sets * width + labels[index], minlength=count * width).reshape(count, width)
        return held.astype(np.uint16) if self.k < 1 << 16 else held

    def _grouping_sums(self, held: np.ndarray, palette: Sequence[int]) -> SetSums:
        """The quantities (:meth:`_device_quantities`) summed over each
        distinct set of devices of :meth:`_grouping_sets` (device 0, every
        device, and per grouping its group 0, its roots and its members), for
        a state of distinct ids ``palette`` held as :meth:`_set_counts` says:
        how many devices of each set hold each id, times the ids' quantities
        (a sum is at most ``k**3``)."""
        if not self._sets_of:  # the sets are found on first use (see _hopeful)
            self._grouping_sets()
        quantities = self._device_quantities(np.array(palette, dtype=np.int64))
        if self._exact_in_floats:  # a float product (BLAS) is exact and several times faster
            held, quantities = held.astype(np.float64), quantities.astype(np.float64)
        return SetSums._make((held @ quantities).astype(np.int64).T.tolist())

    def _named_sums(self, sums: SetSums) -> GroupingSums:
        """``sums`` as :class:`Quantities` at device 0, over every device and
        per grouping (group 0, roots, members): what :meth:`_hopeful` reads,
        by name (tests compare it with sums over the absolute state)."""
        self._grouping_sets()
        return GroupingSums(sums.of(self._device0_set), sums.of(self._every_set),
                            [(sums.of(f), sums.of(r), sums.of(m)) for f, r, m in self._sets_of])

    def _hopeful(self, lookahead: str | None, sums: SetSums) -> list[int]:
        """Per grouping, the collectives (bit sets) whose step from a state of
        grouping sums ``sums`` (:meth:`_grouping_sums`) may be valid and pass
        the lookahead, judged before any group is looked at. For the AllReduce
        goal this decides the lookahead: a
        valid step's bit is set exactly when its next state passes
        :meth:`may_finish` (``"finish"``) or is the goal (``"goal"``), so the
        packed counts (:meth:`_ahead`) need not be looked at; without a
        lookahead, and for the other goals, the bits are the validity bounds
        alone (and the packed counts decide the lookahead,
        :meth:`_counts_decide`).

        For the AllReduce goal, on a grouping of ``G`` groups of ``m`` over
        ``n`` devices (``k - n`` others keep their state), with ``H`` devices
        holding every chunk, ``C`` complete, mass ``M`` (contributor counts
        summed over devices and chunks), ``N`` the others' mass, ``S = M - N``
        the members', ``R`` the roots' held chunks and ``F`` the finishing
        masses (:func:`finishing_masses`); every device's mass is at most
        ``k**2``, exactly when it is done:

        * validity (necessary): an AllReduce, ReduceScatter or Reduce needs
          members that hold their root's chunks (members' held chunks ``m *
          R``, and squared ``m`` times the roots'), non-empty, with at most
          ``k`` contributors per chunk (``S <= k * R``); an AllGather equal
          shares (``m * R``, squared too) that fit (``m * R <= G * k``); a
          Broadcast non-empty roots containing their members (held chunks at
          most ``m * R``) and some member gaining (its mass below the root's:
          ``S < m`` times the roots' mass). Group 0 is checked on its own as
          well (its root is device 0);
        * device 0 is the root of group 0 in every grouping: after a valid step
          it is done exactly when it was done (an AllReduce, Reduce,
          ReduceScatter or AllGather with it would double count or overlap, a
          Broadcast keeps its root), or after an AllReduce or Reduce of a group
          0 whose members hold every chunk, or an AllGather of complete ones,
          with group 0's mass ``k**2``;
        * otherwise ("finish") every device must end holding every chunk or
          complete, with mass in ``F``. After a valid step: an AllReduce or
          AllGather gives each member its group's mass (``m * S + N`` after),
          a Broadcast its root's, a ReduceScatter or Reduce keeps ``M``; every
          sum is complete exactly when the others are complete and ``S = k *
          R`` (a group's mass is at most ``k`` per chunk its root holds, so the
          sum is met only with equality in every group); an AllReduce keeps
          who holds every chunk; an AllGather gives every chunk exactly when
          each group's ``m`` equal shares add to ``k``, and keeps completeness;
          a Broadcast gives its roots' state; a ReduceScatter or Reduce leaves
          members with part or nothing, so only completeness can hold;
        * "goal": the others are done (``N = (k - n) * k**2``) and the mass
          after is ``k**3`` (so every member ends with ``k**2``): an AllReduce
          needs ``H = k``, an AllGather ``C = k``; a Broadcast needs its roots
          and the others done."""
        k = self.k
        kk = k * k
        holds_all, complete, held, mass, empty, held_squared = sums  # per set of devices
        zero, every = self._device0_set, self._every_set
        holds_total, complete_total, mass_total = holds_all[every], complete[every], mass[every]
        # the lookahead's bits first where they decide (most states the step before last meets have none);
        # validity only where some bit is left
        deciding = lookahead is not None and self.goal is Goal.ALLREDUCE and not (
            lookahead == "finish" and mass[zero] == kk)  # device 0 is done and stays done
        finishing = lookahead == "finish"
        masses = self._finishing_masses
        possible = []
        held0, mass0 = held[zero], mass[zero]
        for (m, groups, n), (first, roots, members) in zip(self._shapes_of, self._sets_of):
            grouped = mass[members]
            if deciding:
                others = k - n
                others_holding = holds_total - holds_all[members]
                others_complete = complete_total - complete[members]
                others_mass = mass_total - grouped
                bits = 0
                if not finishing:  # "goal"
                    if others_mass == others * kk and m * grouped + others_mass == k * kk:
                        bits |= ((BIT_ALLREDUCE if holds_total == k else 0)
                                 | (BIT_ALLGATHER if complete_total == k else 0))
                    if mass[roots] + others_mass == (groups + others) * kk:
                        bits |= BROADCASTING
                else:
                    if mass[first] == kk:  # device 0 ends done
                        bits = ((BIT_ALLREDUCE | BIT_REDUCE if holds_all[first] == m else 0)
                                | (BIT_ALLGATHER if complete[first] == m else 0))
                    complete_sums = others_complete == others and grouped == k * held[roots]
                    if m * grouped + others_mass in masses:
                        if holds_total == k or complete_sums:
                            bits |= BIT_ALLREDUCE
                        if (others_holding == others and m * held[roots] == groups * k) or complete_total == k:
                            bits |= BIT_ALLGATHER
                    if complete_sums and mass_total in masses:
                        bits |= BIT_REDUCESCATTER | BIT_REDUCE
                    if (m * mass[roots] + others_mass in masses
                            and (holds_all[roots] + others_holding == groups + others
                                 or complete[roots] + others_complete == groups + others)):
                        bits |= BROADCASTING
                if not bits:
                    possible.append(0)
                    continue
            else:
                bits = ALL_BITS
            valid = 0
            # equal held chunks per group
            if (held[members] == m * held[roots] and held_squared[members] == m * held_squared[roots]
                    and held[first] == m * held0 and held_squared[first] == m * held0 * held0):
                if grouped <= k * held[roots] and mass[first] <= k * held0 and not empty[roots]:
                    valid |= SUMMING
                if m * held[roots] <= groups * k and m * held0 <= k:
                    valid |= COUNT_FREE
            if (held[members] <= m * held[roots] and grouped < m * mass[roots] and held[first] <= m * held0
                    and mass[first] < m * mass0 and not empty[roots]):
                valid |= BROADCASTING
            possible.append(bits & valid)
        return possible

    def _counts_decide(self, lookahead: str | None) -> bool:
        """Whether the packed counts (:meth:`_ahead`) judge the lookahead: for
        the AllReduce goal the grouping sums decide it (:meth:`_hopeful`), and
        for the others every state may finish, so only "goal" is left."""
        return lookahead == "goal" and self.goal is not Goal.ALLREDUCE

    def _after_passes(self, after: int, lookahead: str) -> bool:
        """Whether packed counts ``after`` a step make the next state the goal
        (``"goal"``) or pass :meth:`may_finish` without device 0 being done
        (``"finish"``: every device holds every chunk or is complete, and the
        mass is a finishing one), see :meth:`_ahead`."""
        if lookahead == "goal":
            return (after >> (FIELD * 3)) & MASK == self.k
        if self.goal is not Goal.ALLREDUCE:
            return True
        return ((after & MASK == self.k or (after >> FIELD) & MASK == self.k)
                and after >> (FIELD * 4) in self._finishing_masses)

    def _ahead(self, totals: int, collective: Collective, groups: list[tuple[int, ...]] | Counter,
               lookahead: str) -> bool:
        """Whether the state after ``collective`` on groups whose members have
        profile ids ``groups`` (one tuple per group, or a Counter of them) can
        pass :meth:`may_finish` (``"finish"``) or be the goal (``"goal"``):
        both depend on the packed counts only."""
        if isinstance(groups, Counter):
            return self._ahead_by_class(totals, collective, groups.items(), groups.total(), lookahead)
        deltas = self._deltas[BIT[collective]]
        try:
            change = sum(map(deltas.__getitem__, groups))
        except KeyError:
            change = sum(self._delta(collective, key) for key in groups)
        return self._after_passes(totals + change - len(groups) * OFFSETS, lookahead)

    def _ahead_by_class(self, totals: int, collective: Collective, classes: Iterable[tuple[tuple[int, ...], int]],
                        groups: int, lookahead: str) -> bool:
        """:meth:`_ahead` of ``groups`` groups given as classes: (members'
        profile ids, how many groups have them)."""
        deltas, delta = self._deltas[BIT[collective]], self._delta
        change = sum(n * (deltas[key] if key in deltas else delta(collective, key)) for key, n in classes)
        return self._after_passes(totals + change - groups * OFFSETS, lookahead)
