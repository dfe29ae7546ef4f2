"""The state space the search walks: :class:`StateSpace`, assembled from its parts.

A state is a tuple of ``k`` device state ids (:mod:`.interning`); a step is
a collective on a grouping; its next state comes from the group outcomes
(:mod:`.outcomes`) of the groups that pass the profile checks
(:mod:`.checks`) and the lookahead (:mod:`.lookahead`). Depending on the
state it is stepped per device, per pattern (:mod:`.patterns`), per shifted
key (:mod:`.shifts`) or with numpy per class of groups (:mod:`.vectors`);
:mod:`.tuning` holds the thresholds that choose.

Invariant: every path gives the steps that the reference rules of
:mod:`synth.synthesis.semantics` give, in grouping-major, collective order
(tests check every reachable step of many spaces against
:func:`~synth.synthesis.semantics.apply_step`). Example::

    space = StateSpace((2, 2), Goal.ALLREDUCE)
    [(g, c.value) for g, c, _, _ in space.successors(space.start, [Collective.ALLREDUCE])]
    # one AllReduce per grouping whose groups hold disjoint contributors
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain
from operator import itemgetter

import numpy as np

from ...caches import memoised
from ..language import Collective
from ..semantics import Goal, Group, Hierarchy, Loads, distinct_groupings, make_state
from .bits import BIT
from .checks import ProfileChecks
from .interning import InternedStates
from .keys import Packed, StateKey, labels_of, pattern_of_array
from .lookahead import Lookahead
from .outcomes import GroupOutcomes
from .patterns import PatternSteps
from .shifts import ShiftedKeys
from .translations import Translations
from .tuning import DEFAULT_TUNING, SearchTuning
from .vectors import VectorSteps


class StateSpace(InternedStates, ProfileChecks, GroupOutcomes, Lookahead, PatternSteps, ShiftedKeys, VectorSteps):
    """The semantics as the search and the tracer use it, on one synthesis
    hierarchy (its sizes) and goal, with the thresholds of ``tuning``.

    Each part is a mixin in its own module and owns its memo tables, built
    by its ``_init_*`` method: interning of states, masks and profiles
    (:class:`~.interning.InternedStates`), the profile checks
    (:class:`~.checks.ProfileChecks`), the group outcomes in the space's
    frames (:class:`~.outcomes.GroupOutcomes`), the lookahead
    (:class:`~.lookahead.Lookahead`), steps per pattern
    (:class:`~.patterns.PatternSteps`), shifted keys
    (:class:`~.shifts.ShiftedKeys`) and vector steps
    (:class:`~.vectors.VectorSteps`).

    **Frames** (:mod:`.outcomes`): ``frame`` is "device" (allreduce and
    reducescatter from ``tuning.device_frame_from`` devices), "chunk"
    (allgather) or "absolute"; each is a bijection of the absolute states,
    so a tuple of ids names exactly one absolute state (:meth:`absolute`).
    ``by_value`` keys device states by value (default: below
    ``tuning.device_frame_from`` devices)."""

    def __init__(self, sizes: Sequence[int], goal: Goal, frame: str | None = None,
                 by_value: bool | None = None, tuning: SearchTuning = DEFAULT_TUNING) -> None:
        self.sizes = tuple(sizes)
        self.goal = goal
        self.tuning = tuning
        self.hierarchy = Hierarchy(tuple(f"l{i}" for i in range(len(self.sizes))), self.sizes)
        self.k = k = self.hierarchy.k
        self.groupings = distinct_groupings(self.hierarchy)
        self.translations = t = Translations(self.sizes, tuning.moved_masks_upto)
        # the frame (see "Frames" in .outcomes); "absolute" (no translation) where
        # few devices make orbits small and translating costs more than it saves
        if frame is None:
            frame = "chunk" if goal is Goal.ALLGATHER else "device" if k >= tuning.device_frame_from else "absolute"
        if frame not in ("device", "chunk", "absolute") or (frame == "chunk") != (goal is Goal.ALLGATHER):
            raise ValueError(f"frame {frame!r} for {goal.value}")
        self.frame = frame
        self._device_frame = self.frame == "device"
        # per grouping: the members of all its groups in one tuple (group-major),
        # the group size, and the picker that assembles the next state from
        # (members' new ids + old state)
        self._flat = [itemgetter(*chain.from_iterable(g.groups)) for g in self.groupings]
        self._size = [len(g.groups[0]) for g in self.groupings]
        self._pickers = [picker(g.groups, k) for g in self.groupings]
        # whether a grouping's groups hold every device: its picker then reads the members' new ids alone
        self._covers = [len(g.groups) * len(g.groups[0]) == k for g in self.groupings]
        # from tuning.whole_keys_from devices a group of every device is not memoised (checks, deltas,
        # outcomes): its key is a whole state, met about once by the search, and k integers to keep
        self._whole_key = k if k >= tuning.whole_keys_from else k + 1
        self._init_interning(by_value)
        self._init_lookahead()
        self._init_checks()
        self._init_outcomes()
        self._init_patterns()
        self._init_shifts()
        self._init_vectors()
        if goal is Goal.ALLGATHER:
            self.start = tuple(self.intern(make_state((d, d + 1, k), (0, 1, 0))) for d in range(k))
            self._goal_id = self.intern(((k,), (1,)))
        elif self._device_frame:
            self.start = (self.intern(((k,), (1,))),) * k
            self._goal_id = self.intern(((k,), (t.full,)))
        else:
            self.start = tuple(self.intern(((k,), (1 << d,))) for d in range(k))
            self._goal_id = self.intern(((k,), (t.full,)))

    def is_goal(self, state: StateKey) -> bool:
        """:func:`is_goal` of the absolute state (masks 0 and full, and chunk
        positions, look the same in every frame); ``state`` may be a search
        key (:meth:`key`)."""
        if state.__class__ is Packed:
            if self.goal is not Goal.REDUCESCATTER:
                return state.palette == (self._goal_id,) and not state.shift
            state = self.devices(state)
        if self.goal is not Goal.REDUCESCATTER:  # device 0 first: most states are told apart there
            return state[0] == self._goal_id and state.count(self._goal_id) == self.k
        full, chunk = self.translations.full, {}
        for i in set(state):
            runs = self.runs(i)
            if len(runs) != 1 or runs[0][1] - runs[0][0] != 1 or runs[0][2] != full:
                return False
            chunk[i] = runs[0][0]
        return len({chunk[i] for i in state}) == self.k

    def chunk_runs(self, state: tuple[int, ...], grouping: int, collective: Collective,
                   group: int) -> tuple[tuple[int, int], ...]:
        """The ordered chunk list of one group of a valid step, as ``(first,
        stop)`` runs (:func:`step_chunks`; which chunks are held is the same in
        every frame)."""
        members = self.groupings[grouping].groups[group]
        if collective is not Collective.ALLGATHER:
            return self._held_runs[state[members[0]]]
        return tuple(chain.from_iterable(map(self._held_runs.__getitem__, map(state.__getitem__, members))))

    def successors(
        self, state: tuple[int, ...], collectives: Sequence[Collective], lookahead: str | None = None
    ) -> list[tuple[int, Collective, tuple[int, ...], Loads]]:
        """Every valid step from ``state``: (grouping index, collective, next
        state, chunks moved per group), grouping-major, collectives in the given
        order. Steps that change nothing are not valid.

        Per grouping the members' profiles are checked first (memoised per
        group's profiles, stopping at the first group that fails), then each
        passing collective's outcome per group (memoised per members' ids). With
        ``lookahead`` (``"finish"``: the next state passes :meth:`may_finish`;
        ``"goal"``: it is the goal) only the steps whose next state does are
        kept, judged before any group is looked at: on sums of per-device
        quantities over fixed sets of devices for the AllReduce goal
        (:meth:`_hopeful`), else on the packed counts of :meth:`_delta`, from
        profiles alone."""
        out = []
        wanted = sum(1 << BIT[c] for c in collectives)
        k = self.k
        if self._encoded and k < self.tuning.numpy_profiles_from:
            labels = dict.fromkeys(state)
            if len(labels) <= self.tuning.pattern_ids_upto:
                return self._pattern_successors(state, tuple(labels), collectives, wanted, lookahead)
        counting = self._counts_decide(lookahead)
        id_array = np.fromiter(state, np.int64, k)
        if self._encoded and k >= self.tuning.numpy_profiles_from:  # with numpy: a new state often holds k new ids
            profile_ids = self._profile_ids_of(id_array)
            profiles = tuple(profile_ids.tolist())
            if counting:  # the lookahead's flags are the base profiles': count the devices per base
                bases, counts = np.unique(profile_ids // self._stride, return_counts=True)
                totals = sum(n * self._base_packed[b] for b, n in zip(bases.tolist(), counts.tolist()))
            else:
                totals = 0
        else:
            profiles = tuple(map(self._profile.__getitem__, state))
            totals = sum(n * self._packed[p] for p, n in Counter(profiles).items()) if counting else 0
            if self._encoded and any(len(g.groups) >= self.tuning.vector_groups_from for g in self.groupings):
                profile_ids = np.fromiter(profiles, np.int64, k)
        chosen = self._chosen.get(tuple(collectives), {})
        palette, labels = np.unique(id_array, return_inverse=True)
        sums = self._grouping_sums(self._set_counts(labels.ravel(), len(palette)), palette)
        hopeful = self._hopeful(lookahead, sums)
        for g, flat in enumerate(self._flat):
            if not wanted & hopeful[g]:
                continue
            if self._encoded and len(self.groupings[g].groups) >= self.tuning.vector_groups_from:
                out += self._vector_successors(g, id_array, profile_ids, collectives, wanted & hopeful[g], totals,
                                               lookahead if counting else None)
                continue
            m = self._size[g]
            members = flat(profiles)
            counted = list(zip(*[iter(members)] * m)) if m < k else [members]  # each group's members' profiles
            classes = counting and self._device_frame
            if classes:  # the groups counted once per class (they repeat there): the lookahead looks at each collective
                counted = Counter(counted)
            ok = self._passing_all(counted, wanted & hopeful[g])
            if not ok:
                continue
            keys = None  # the groups' members' ids, once a step gets past the lookahead
            for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
                if counting and not self._ahead(totals, c, counted, lookahead):
                    continue
                if keys is None:
                    ids = flat(state)
                    keys = list(zip(*[iter(ids)] * m)) if m < k else [ids]
                done = self._apply(state, g, c, keys)
                if done.__class__ is not str:
                    out.append((g, c) + done)
        return out

    def expand(self, key: StateKey, collectives: Sequence[Collective], lookahead: str | None = None
               ) -> list[tuple[int, Collective, StateKey, Loads]]:
        """:meth:`successors` of the state of ``key`` with the next states as
        keys: a :class:`Packed` state is stepped per pattern without building
        a tuple of ``k`` ids (:meth:`_pattern_successors`), another one per
        device and its next states keyed."""
        if key.__class__ is Packed:
            wanted = sum(1 << BIT[c] for c in collectives)
            if key.shift:
                return self._shifted_successors(key, collectives, wanted, lookahead)
            return self._pattern_successors(None, key.palette, collectives, wanted, lookahead, key.labels)
        return [(g, c, self.key(nxt), loads) for g, c, nxt, loads in self.successors(key, collectives, lookahead)]

    def key(self, state: tuple[int, ...]) -> StateKey:
        """The search's key of ``state``: its :class:`Packed` pattern and
        distinct ids where the pattern path takes it (device frame, fewer than
        ``tuning.numpy_profiles_from`` devices, at most ``tuning.pattern_ids_upto``
        distinct ids), else the state itself. One state has one key."""
        if self._encoded and self.k < self.tuning.numpy_profiles_from:
            palette = tuple(dict.fromkeys(state))
            if len(palette) <= self.tuning.pattern_ids_upto:
                return Packed(labels_of(state, palette), palette)
            return self._shifted_key(np.fromiter(state, np.int64, self.k)) or state
        return state

    def _key_of_ids(self, ids: np.ndarray) -> StateKey:
        """:meth:`key` of the state of ids ``ids`` (an array), found with numpy."""
        if self._encoded and self.k < self.tuning.numpy_profiles_from:
            # more distinct positions than a pattern holds (a count, cheaper than finding the distinct ids): no pattern
            positions = np.count_nonzero(np.bincount(ids % self._stride, minlength=self._stride))
            if positions <= self.tuning.pattern_ids_upto:
                found = pattern_of_array(ids, self.tuning.pattern_ids_upto)
                if found is not None:
                    return Packed(*found)
            shifted = self._shifted_key(ids)
            if shifted is not None:
                return shifted
        return tuple(ids.tolist())

    def devices(self, key: StateKey) -> tuple[int, ...]:
        """The state (each device's id) of a search key (:meth:`key`)."""
        if key.__class__ is Packed:
            if key.shift:
                return tuple(self._absolute_ids(key).tolist())
            return tuple(map(key.palette.__getitem__, key.labels))
        return key


def picker(groups: Sequence[Group], k: int):
    """A callable taking ``(new ids of the members, group-major) + state`` to
    the next state: members take their new ids, other devices keep theirs
    (when the groups hold every device, the members' new ids alone do)."""
    flat = np.fromiter(chain.from_iterable(groups), np.int64)
    where = len(flat) + np.arange(k)  # a device in no group keeps its own id (after the members' new ids)
    where[flat] = np.arange(len(flat))
    return itemgetter(*where.tolist())


@memoised(maxsize=32)
def state_space(sizes: tuple[int, ...], goal: Goal) -> StateSpace:
    """The (memoising) state space of a hierarchy's sizes and a goal, shared by
    searches of any length and by the tracer."""
    return StateSpace(sizes, goal)
