"""Group outcomes: the rules applied to one group, in the space's frames.

**Frames.** A stored device state is in a *frame* that makes states of
symmetric devices equal: in the device frame (allreduce, reducescatter from
``tuning.device_frame_from`` devices) device ``d`` stores its state with
every mask translated by ``-d`` (:class:`.Translations`); in the chunk frame
(allgather) the mask of chunk ``x`` is translated by ``-x``; else the
absolute state. The rules compare and combine masks chunk by chunk, so they
hold in the chunk frame as they are; in the device frame the members are
first translated into the root's frame by their offsets from the root
(:meth:`GroupOutcomes._general`), and the results taken back
(:meth:`GroupOutcomes._member_ids`).

**Orbits.** The groups of one grouping are translates of each other and the
rules commute with translations, so a group's outcome depends only on the
collective, the grouping and its members' stored ids: it is computed once per
distinct key and memoised (``_memos``). Invariant: ``_apply`` gives the
state that :func:`~synth.synthesis.semantics.apply_step` gives, in the
space's ids (tests compare every reachable step). Example, device frame,
``sizes = (2,)``: initially both devices store id ``s`` ("every chunk from
device 0" in their own frame); an AllReduce on the one group ``(0, 1)`` looks
up the key ``(s, s)`` once: in the root's frame the members hold ``{0}`` and
``{1}``, the union ``{0, 1}`` is invariant under the group's translation, so
both members store the same new id.

**Chunk shifts.** The rules also commute with moving every held chunk of a
group's members by the same amount. In the device frame a group of at most
``tuning.shifted_groups_upto`` members that holds nothing below chunk ``b``
is computed once moved down by ``b`` (``_shifted_memos``) and its results
moved back up (:meth:`GroupOutcomes._compute_shifted`).

**Shared memos** (device frame). A group's outcome depends on its members'
offsets from its root, the same in all groups of a grouping: groupings with
the same first group (parallel(j) and master(j) at one level) share one memo
(``_alike``).

Test hooks: the tests (tests/synthesis/test_semantics.py, test_search.py) read or call
these members of this part directly, to check its invariants against an independent
reference: ``_compute_here``, ``_gathered``, ``_member_ids``, ``_memos``,
``_shifted_memos``, ``_split_ids``, ``_translated``.
"""

from __future__ import annotations

from typing import Union

import numpy as np

from ..language import Collective
from ..semantics import (
    NO_CHANGE,
    REDUCING,
    DeviceState,
    Goal,
    Loads,
    apply_counted,
    contains,
    from_runs,
    profile_reason,
    reduced,
    runs_of,
    sum_states,
)
from .bits import BIT, COLLECTIVES
from .interning import Derived
from .positions import runs_at

Outcome = Union[tuple[tuple[int, ...], int], str]  # (members' new ids, chunks moved) or why not


class _RootFrame(list):
    """A group's results in its root's frame, for :meth:`GroupOutcomes._member_ids`
    to take into each member's frame."""

    __slots__ = ()


class GroupOutcomes:
    """The group outcomes of :class:`~synth.synthesis.statespace.StateSpace`
    (a mixin): it owns the outcome memos (``_memos``, ``_shifted_memos``),
    the sums shared by the summing collectives, and the memos of
    translations (``_moved``, ``_translated``, ``_invariants``)."""

    def _init_outcomes(self) -> None:
        t = self.translations
        # per grouping, the inverse offsets of its group 0's members as devices (built when first
        # needed: a grouping of 131,072 members takes a while) and the levels whose digits vary
        self._inverse_offsets: dict[int, tuple[int, ...]] = Derived(
            lambda g: tuple(t.index(t.inverse(t.digits(m))) for m in self.groupings[g].groups[0]))
        strides, sizes = np.array(t.strides), np.array(self.sizes)
        digits = [(np.array(g.groups[0])[:, None] // strides) % sizes for g in self.groupings]
        self._varied = [tuple(np.flatnonzero(d.any(axis=0)).tolist()) for d in digits]
        # per collective and grouping: group members' ids -> outcome; in the
        # device frame a group's outcome depends on its members' offsets from
        # the root, the same in all its groups: groupings whose first groups are
        # the same (parallel(j) and master(j) at one level: 15 of 36 groupings
        # at six levels of 4) share one memo; elsewhere every grouping of a
        # collective shares one
        first_of: dict[tuple[int, ...], int] = {}
        self._alike = [first_of.setdefault(g.groups[0], i) for i, g in enumerate(self.groupings)]
        memos = [[{} for _ in self.groupings] if self._device_frame else [{}] * len(self.groupings)
                 for _ in COLLECTIVES]
        self._memos: list[list[dict[tuple[int, ...], Outcome]]] = [[per[g] for g in self._alike] for per in memos]
        # chunk shifts (see _compute_shifted; device frame, where ids move by adding)
        self._shifted_memos: list[list[dict[tuple, Outcome]]] = [  # shared like _memos
            [per[g] for g in self._alike] for per in [[{} for _ in self.groupings] for _ in COLLECTIVES]]
        self._contained: dict[tuple[int, int], bool] = {}  # (root id, member id) -> contains, see _broadcast
        self._sums: dict[tuple, DeviceState | str] = {}  # a group's sum, shared by the summing collectives
        self._invariants: dict[tuple[int, int], bool] = {}
        self._moved: dict[tuple[int, int], DeviceState] = {}  # see _move
        self._translated: dict[int, int] = {}  # base * k + offset -> base id, see _member_ids

    def _keys(self, grouping: int, flat: tuple[int, ...]) -> list[tuple[int, ...]]:
        """``flat`` (a value per member of every group of ``grouping``,
        group-major) cut into one tuple per group."""
        m = self._size[grouping]
        return list(zip(*[iter(flat)] * m)) if m < self.k else [flat]

    def _apply(self, state: tuple[int, ...], grouping: int, collective: Collective,
               keys: list[tuple[int, ...]], explain: bool = False) -> tuple[tuple[int, ...], Loads] | str:
        """The next state and loads of one step whose groups' members store
        ``keys`` (:meth:`_keys`), or why it is invalid. Outcomes are memoised
        per key; when every group stores the same ids (a uniform state) one
        lookup serves them all. Without ``explain`` (the search) every group is
        known to pass the profile checks, and the reason does not name the
        failing group (the search drops it)."""
        memo = self._memos[BIT[collective]][grouping]
        if len(keys) == 1 or keys.count(keys[0]) == len(keys):  # every group stores the same ids
            uniform: list[tuple[int, ...]] = keys[:1]
        else:
            uniform = []
        result: list[int] = []
        loads = []
        for j, key in enumerate(uniform or keys):
            outcome = memo.get(key)
            if outcome is None:
                outcome = self._compute(grouping, collective, key, not explain)
                if len(key) < self._whole_key:
                    memo[key] = outcome
            if outcome.__class__ is str:
                return f"group {list(self.groupings[grouping].groups[j])}: {outcome}" if explain else outcome
            result += outcome[0]
            loads.append(outcome[1])
        if uniform:
            result, loads = result * len(keys), loads * len(keys)
        result, loads = tuple(result), tuple(loads)
        nxt = self._pickers[grouping](result if self._covers[grouping] else result + state)
        return NO_CHANGE if nxt == state else (nxt, loads)

    def step(self, state: tuple[int, ...], grouping: int, collective: Collective) -> tuple[int, ...] | str:
        """The state after one instruction, or why it is invalid (group lists name
        synthesis indices)."""
        done = self._apply(state, grouping, collective, self._keys(grouping, self._flat[grouping](state)), explain=True)
        return done if isinstance(done, str) else done[0]

    def _class_outcomes(self, grouping: int, collective: Collective, keys: list[tuple[int, ...]]
                        ) -> tuple[list[tuple[int, ...]], list[int]] | str:
        """Per class (members' ids ``keys``), the members' new ids and the
        chunks each group moves, memoised; or the first class's reason."""
        memo = self._memos[BIT[collective]][grouping]
        results, loads = [], []
        for key in keys:
            outcome = memo.get(key)
            if outcome is None:
                outcome = self._compute(grouping, collective, key, True)
                if len(key) < self._whole_key:
                    memo[key] = outcome
            if outcome.__class__ is str:
                return outcome
            results.append(outcome[0])
            loads.append(outcome[1])
        return results, loads

    def _compute(self, grouping: int, collective: Collective, key: tuple[int, ...], checked: bool = False) -> Outcome:
        """The outcome of ``collective`` on one group of ``grouping`` whose
        members store ``key``; ``checked``: the members are known to pass the
        profile checks (:meth:`_passes`)."""
        if not checked:
            profiles = tuple(map(self._profile.__getitem__, key))
            if not self._passes(profiles) >> BIT[collective] & 1:
                members = self._counted(profiles)
                return profile_reason(collective, [(self._profiles[p], n) for p, n in members], len(profiles),
                                       [self._held[p] for p, _ in members])
        if collective is Collective.BROADCAST and key[0] == self._goal_id and self.goal is not Goal.ALLGATHER:
            # the root holds every chunk from every device: it contains every member
            if key.count(key[0]) == len(key):
                return "no member gains information"
            return (key[0],) * len(key), self.k
        if collective is Collective.BROADCAST and not self._device_frame:
            return self._broadcast(key)
        if self._device_frame and checked and len(key) <= self.tuning.shifted_groups_upto:
            return self._compute_shifted(grouping, collective, key)
        return self._compute_here(grouping, collective, key)

    def _compute_shifted(self, grouping: int, collective: Collective, key: tuple[int, ...]) -> Outcome:
        """:meth:`_compute_here`, shared by groups whose members are the same up
        to one chunk shift: a group whose members hold nothing below chunk
        ``base`` is computed once with every member moved down by ``base``
        (memoised per the members' states moved to start at chunk 0 and their
        shifts relative to ``base``), and the results are moved back up. After a
        ReduceScatter over many devices each device holds other chunks, so every
        group's ids differ while the groups are shifts of one another.

        A step that fails is computed again unshifted: its reason names chunks."""
        base, down = self._moved_down(key)
        if not base:
            return self._compute_here(grouping, collective, key)
        memo = self._shifted_memos[BIT[collective]][grouping]
        out = memo.get(down)
        if out is None:
            out = memo[down] = self._compute_here(grouping, collective, down)
        if out.__class__ is str:
            return self._compute_here(grouping, collective, key)
        ids, load = out
        stride = self._stride
        return tuple(r + base if r % stride else r for r in ids), load  # back up by base

    def _moved_down(self, ids: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """For group members ``ids`` (encoded state or profile ids, "Positions"):
        ``base``, the first chunk any of them holds (0 if none), and the members
        moved down by ``base``, which every group that is a chunk shift of this
        one shares (moving an encoded id by ``x`` chunks adds ``x``)."""
        stride = self._stride
        base = min([i % stride for i in ids if i % stride], default=1) - 1
        if base <= 0:
            return 0, ids
        return base, tuple([i - base if i % stride else i for i in ids])

    def _compute_here(self, grouping: int, collective: Collective, key: tuple[int, ...]) -> Outcome:
        """:meth:`_compute` once the profile checks have passed."""
        if collective is Collective.BROADCAST and not self._device_frame:
            return self._broadcast(key)
        states = self.device_states
        if not self._device_frame:
            result = self._rule(collective, [states[i] for i in key], key)
        else:
            # the last member first: most groups of many members that are not uniform differ there
            uniform = key[-1] == key[0] and key.count(key[0]) == len(key)
            if uniform and collective is Collective.REDUCESCATTER:
                # the AllReduce's union, split: its parts are often one shape at many positions
                total = self._uniform(grouping, Collective.ALLREDUCE, states[key[0]], len(key))
                if isinstance(total, str):
                    return total
                ids = self._split_ids(total[0], len(key))
                if ids is not None:
                    return ids, self._held_count[self._profile[key[0]]]
                result = reduced(collective, total[0], len(key))
            elif uniform:
                result = self._uniform(grouping, collective, states[key[0]], len(key))
            elif collective is Collective.ALLGATHER and (gathered := self._gathered(grouping, key)) is not None:
                # one base at many positions: every member holds as many chunks as the first
                return (self.intern(gathered),) * len(key), len(key) * self._held_count[self._profile[key[0]]]
            else:
                result = self._general(grouping, collective, key)
        if isinstance(result, str):
            return result
        if result.__class__ is _RootFrame:
            ids = self._member_ids(grouping, result)
        elif result.count(first := result[0]) == len(result):  # often one object for all (count: identity first)
            ids = (self.intern(first),) * len(result)
        else:
            interned: dict[int, int] = {}  # results often repeat one object: hash it once
            ids = tuple(interned[id(s)] if id(s) in interned else interned.setdefault(id(s), self.intern(s))
                        for s in result)
        if collective is Collective.ALLGATHER:
            load = sum(self._held_count[self._profile[i]] for i in key)
        else:
            load = self._held_count[self._profile[key[0]]]
        return ids, load

    def _gathered(self, grouping: int, key: tuple[int, ...]) -> DeviceState | None:
        """The state every member of an AllGather ends with, where the members
        hold one base state of one run at several positions and its masks are
        the same in every member's frame (:meth:`_invariant`; device frame,
        "Positions"): the runs at the members' positions, one mask, without
        building each member's state (the profile checks passed: they are
        disjoint). None for other members."""
        stride = self._stride
        base = key[0] // stride
        if any(i // stride != base for i in key) or not self._invariant(grouping, key[0]):
            return None
        runs = runs_of(self._base_states[base])
        if len(runs) != 1:
            return None
        first, stop, mask = runs[0]
        if len(key) < self.tuning.numpy_runs_from:
            return from_runs([(f, f + stop - first, mask) for f in sorted(i % stride - 1 for i in key)], self.k)
        firsts = np.sort(np.fromiter(key, np.int64, len(key)) % stride - 1)
        return runs_at(firsts, stop - first, mask, self.k)

    def _split_ids(self, total: DeviceState, parts: int) -> tuple[int, ...] | None:
        """The ids of :func:`split_state` ``(total, parts)`` where ``total`` holds one
        run of chunks with one mask (device frame): every part is the same
        shape, one run of ``size`` chunks, at ``parts`` positions, so one state
        is interned and the others are its id plus their first chunk ("Positions").
        None for other totals."""
        runs = runs_of(total)
        if len(runs) != 1:
            return None
        first, stop, mask = runs[0]
        size, k = (stop - first) // parts, self.k
        at0 = self.intern(((size, k), (mask, 0)) if size < k else ((k,), (mask,)))
        return tuple(range(at0 + first, at0 + first + parts * size, size))

    def _broadcast(self, key: tuple[int, ...]) -> Outcome:
        """A Broadcast's outcome (chunk and absolute frames, where a state's
        masks are compared as they are) from which stored states contain which
        (:func:`contains`, memoised per pair of ids): the reasons and results of
        :func:`apply_counted`."""
        root, known = key[0], self._contained
        others = set(key)
        others.discard(root)
        for i in others:
            inside = known.get((root, i))
            if inside is None:
                inside = known[root, i] = contains(self.device_states[root], self.device_states[i])
            if not inside:
                return "a member holds data the root does not contain"
        if not others:
            return "no member gains information"
        return (root,) * len(key), self._held_count[self._profile[root]]

    def _general(self, grouping: int, collective: Collective, key: tuple[int, ...]):
        """The rule (device frame) on the members (stored ids ``key``, not all
        the same) brought into the root's frame, and the
        results taken back into each member's frame. A state whose masks
        are invariant under the group's translations (:meth:`_invariant`) is the
        same in every member's frame and is not translated; in particular a
        Broadcast from such a root is judged on the members' distinct states alone."""
        t = self.translations
        states = self.device_states
        if collective is Collective.BROADCAST and self._invariant(grouping, key[0]):
            root = states[key[0]]
            states = [self.device_states[i] for i in dict.fromkeys(key[1:])]
            if not all(contains(root, s) for s in states):
                return "a member holds data the root does not contain"
            return [root] * len(key)  # not every member holds the root's id: some member gains
        if collective is Collective.BROADCAST:
            # members one at a time, so that the first one the root does not
            # contain ends the walk (big groups: most such Broadcasts fail early,
            # 3,646 of 4,096 members at six levels of 4), without first finding
            # the distinct ids (as long as the walk, for groups of 4,096)
            root, gains = states[key[0]], False
            for i, s, d in zip(key, map(states.__getitem__, key), self.groupings[grouping].groups[0]):
                aligned = s if self._invariant(grouping, i) else self._moved.get((i, d)) or self._move(i, d)
                if aligned != root:
                    if not contains(root, aligned):
                        return "a member holds data the root does not contain"
                    gains = True
            if not gains:
                return "no member gains information"
            return _RootFrame([root] * len(key))
        sum_key = (self._alike[grouping], key)  # groupings of the same first group sum alike (_memos)
        members = [states[i] for i in key]
        if collective in REDUCING and sum_key in self._sums:
            aligned = members  # the sum is memoised: the members are not looked at again
        else:
            moved, invariant = self._moved, self._invariant
            aligned = [s if invariant(grouping, i) else moved[i, d] if (i, d) in moved else self._move(i, d)
                       for i, s, d in zip(key, members, self.groupings[grouping].groups[0])]
        result = self._rule(collective, aligned, sum_key)
        if isinstance(result, str):
            return result
        varied = self._varied[grouping]
        masks = {id(m): m for s in {id(s): s for s in result}.values() for m in s[1]}
        if all(t.invariant(m, varied) for m in masks.values()):
            return result
        return _RootFrame(result)

    def _member_ids(self, grouping: int, result: _RootFrame) -> tuple[int, ...]:
        """The ids of a group's results given in its root's frame, each taken
        into its member's frame (translated by the member's inverse offset).
        A translation moves masks, not chunks, so a result's id is its base
        state's translation's id at the result's position (:meth:`_translated_base`):
        memoised per (base, offset), a result met at any position, or by
        several members, is translated and interned once (capped at
        ``tuning.moved_masks_upto``)."""
        stride, translated, k = self._stride, self._translated, self.k
        if len(translated) > self.tuning.moved_masks_upto:
            translated.clear()
        interned: dict[int, int] = {}  # results often repeat one object: intern it once
        out = []
        for s, o in zip(result, self._inverse_offsets[grouping]):
            i = interned.get(id(s))
            if i is None:
                i = interned[id(s)] = self.intern(s)
            base, position = divmod(i, stride)
            moved = translated.get(base * k + o)
            if moved is None:
                moved = translated[base * k + o] = self._translated_base(base, o)
            out.append(moved * stride + position)
        return tuple(out)

    def _move(self, i: int, d: int) -> DeviceState:
        """Device state ``i`` with its masks translated by the digits of device
        ``d`` (a member's offset from its group's root), memoised in ``_moved``:
        the same stored states meet the same offsets in many groups and steps."""
        out = self._moved[i, d] = self.translations.state(self.device_states[i], self.translations.digits(d))
        return out

    def _rule(self, collective: Collective, members: list[DeviceState], sum_key: tuple):
        """:func:`apply_counted`, with the sum of a group shared by AllReduce,
        ReduceScatter and Reduce (memoised under ``sum_key``)."""
        if collective not in REDUCING:
            return apply_counted(collective, members)
        total = self._sums.get(sum_key)
        if total is None:
            total = self._sums[sum_key] = sum_states(members)
        return total if isinstance(total, str) else reduced(collective, total, len(members))

    def _invariant(self, grouping: int, i: int) -> bool:
        """Whether every mask of device state ``i`` is invariant under the
        translations of ``grouping``'s varied digits."""
        key = (self._alike[grouping], i // self._stride if self._encoded else i)  # masks: not on chunk positions
        out = self._invariants.get(key)
        if out is None:
            varied = self._varied[grouping]
            out = self._invariants[key] = all(self.translations.invariant(m, varied) for m in self._masks(i))
        return out

    def _uniform(self, grouping: int, collective: Collective, s: DeviceState, size: int):
        """The rule for a group whose members all store ``s`` (device frame): in
        the root's frame the members hold ``s`` translated by every value of the
        varied digits, so their union is ``s`` saturated along those digits, and
        they are pairwise disjoint exactly when that union is ``size`` times as
        large. The results are saturated, hence the same in every member's frame.
        Same outcomes (and reasons) as :func:`apply_collective`."""
        t, varied = self.translations, self._varied[grouping]
        if collective is Collective.ALLGATHER:
            return [s] * size if not any(s[1]) else "members hold overlapping chunks"
        if not any(s[1]):
            return "the root holds no data" if collective is Collective.BROADCAST else "a member holds no data"
        if collective is Collective.BROADCAST:
            if all(t.invariant(m, varied) for m in s[1]):
                return "no member gains information"
            return "a member holds data the root does not contain"
        masks, first = [], 0
        for stop, mask in zip(*s):
            union = t.saturate(mask, varied)
            if mask and union.bit_count() != size * mask.bit_count():
                return f"contributors overlap on chunks {first}..{stop - 1} (double counting)"
            masks.append(union)
            first = stop
        return reduced(collective, (s[0], tuple(masks)), size)
