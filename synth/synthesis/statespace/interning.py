"""Interning: device states and profiles named by small ids.

A device state is stored once and named by a small id; a state of the search
is the tuple of its devices' ids, so looking it up hashes ``k`` small
integers, not ``k`` masks of ``k`` bits. Profiles (a state's contributor
counts, :func:`~synth.synthesis.semantics.profile_of`) are interned likewise,
with what the profile checks and the lookahead read of them.

**Positions** (device frame). An id names a device state as its shape moved
to start at chunk 0 (a *base* state, interned once) and where it starts::

    id = base * (k + 1) + first + 1        # first = -1: holds nothing

Invariant: moving a state by ``x`` chunks adds ``x`` to its id, and whatever
does not depend on where the chunks lie (masks, counts, the lookahead's
flags) is read from the base. Example, ``k = 4``: the base state "chunk 0
from devices {0, 1}" is ``((1, 4), (0b11, 0))``; interned as base 0 it is id
``0 * 5 + 0 + 1 = 1``, and the same shape at chunk 2, ``((2, 3, 4), (0,
0b11, 0))``, is id 3, with no new base. The ``k`` states one ReduceScatter
leaves at ``k`` positions are one base state. Tables per id are filled on
first look-up (:class:`Derived`). The chunk and absolute frames number their
states densely (``id = base``).

**Masks.** From ``tuning.device_frame_from`` devices states are interned by
mask ids: each mask object of a stored state is looked up by identity (hashing
a mask reads all its ``k`` bits), with its contributor count, and a
translated state is interned through its masks' ids, each mask id's
translation memoised per offset (:meth:`InternedStates._translated_base`).
Below, states are keyed by value.

Test hooks: the tests (tests/synthesis/test_semantics.py, test_search.py) read or call
these members of this part directly, to check its invariants against an independent
reference: ``_base_mask_ids``, ``_base_profile``, ``_base_states``, ``_base_whole``,
``_intern_profile``, ``_moved_mask_ids``, ``_profile``, ``_stride``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..semantics import (
    DeviceState,
    Goal,
    HeldRuns,
    StateProfile,
    Run,
    State,
    chunk_count,
    held_runs,
    make_state,
    profile_of,
    runs_of,
)
from .bits import FIELD
from .positions import first_held, moved_down, moved_runs, moved_to

#: what InternedStates._intern_base finds for a mask object it has not stored
_UNSTORED = (None, None)


class Derived(dict):
    """A table over the device frame's encoded ids (:class:`StateSpace`,
    "Positions"): a value is computed by ``fill`` on its first look-up and kept,
    so later look-ups (``map(table.__getitem__, ...)`` too) run at dict speed."""

    __slots__ = ("fill",)

    def __init__(self, fill: Callable[[int], object]) -> None:
        super().__init__()
        self.fill = fill

    def __missing__(self, key: int):
        value = self[key] = self.fill(key)
        return value


class InternedStates:
    """The interning part of :class:`~synth.synthesis.statespace.StateSpace`
    (a mixin): it owns the tables of base states, masks and profiles, and
    the per-id views of them (``device_states``, ``_profile``, ``_profiles``,
    ``_held``, ``_held_count``, ``_packed``)."""

    def _init_interning(self, by_value: bool | None) -> None:
        """The empty tables; ``by_value``: key device states by value (None:
        below ``tuning.device_frame_from`` devices, where masks are short)."""
        # device state ids by (stops, mask ids), or by value (_by_value); mask
        # ids by value, and by the identity of mask objects held in stored states
        self._ids: dict[tuple[tuple[int, ...], tuple[int, ...]] | DeviceState, int] = {}
        self._by_value = self.k < self.tuning.device_frame_from if by_value is None else by_value
        self._mask_values: dict[int, int] = {}
        self._mask_ids: dict[int, tuple[int, int]] = {}
        self._mask_counts: list[int] = []  # per mask id: its number of contributors
        self._mask_list: list[int] = []  # per mask id: the mask (the first object met with its value)
        self._base_mask_ids: list[tuple[int, ...]] = []  # per base state (by mask ids): its masks' ids
        self._moved_mask_ids: dict[int, int] = {}  # mask id * k + offset index -> id, see _translated_base
        # base states (see "Positions"; every state where ids are dense) and their profile ids
        self._base_states: list[DeviceState] = []
        self._base_profile: list[int] = []
        # profiles (profile_of) of the device states, interned likewise: base profiles,
        # their held runs, held chunk counts and lookahead flags (see Lookahead._delta)
        self._profile_ids: dict[StateProfile, int] = {}
        self._base_profiles: list[StateProfile] = []
        self._base_held: list[HeldRuns] = []
        self._base_held_count: list[int] = []
        self._base_whole: list[bool] = []  # per base profile: one run over every chunk (see _whole_members)
        self._base_packed: list[int] = []
        self._encoded = self._device_frame  # ids encode positions ("Positions")
        self._stride = self.k + 1
        if self._encoded:
            stride = self._stride
            base_states, base_profile = self._base_states, self._base_profile
            base_profiles, base_held = self._base_profiles, self._base_held
            base_held_count, base_packed = self._base_held_count, self._base_packed
            self.device_states: Sequence[DeviceState] = Derived(
                lambda i: moved_to(base_states[i // stride], i % stride - 1, self.k))
            self._profile: Sequence[int] = Derived(lambda i: base_profile[i // stride] + max(i % stride - 1, 0))
            self._profiles: Sequence[StateProfile] = Derived(
                lambda p: moved_to(base_profiles[p // stride], p % stride - 1, self.k))
            self._held: Sequence[HeldRuns] = Derived(lambda p: moved_runs(base_held[p // stride], p % stride - 1))
            self._held_count: Sequence[int] = Derived(lambda p: base_held_count[p // stride])
            self._packed: Sequence[int] = Derived(lambda p: base_packed[p // stride])
        else:
            self.device_states = self._base_states
            self._profile = self._base_profile  # device state id -> profile id
            self._profiles = self._base_profiles
            self._held = self._base_held  # profile id -> held_runs
            self._held_count = self._base_held_count  # profile id -> number of held chunks
            self._packed = self._base_packed  # per profile: holds all, complete, done, final, packed (see _delta)
        # per device state id: its held runs (first, stop), each run of one mask (chunk_runs); encoded
        # ids move their base's runs (one per base) to their first chunk
        self._base_run_bounds: dict[int, tuple[tuple[int, int], ...]] = Derived(
            lambda b: tuple((a, e) for a, e, _ in runs_of(self._base_states[b])))
        self._held_runs: dict[int, tuple[tuple[int, int], ...]] = Derived(self._run_bounds)

    def intern(self, s: DeviceState) -> int:
        """The id of device state ``s`` (see "Positions")."""
        if not self._encoded:
            return self._intern_base(s)
        first = first_held(s)
        return self._intern_base(moved_down(s, first, self.k) if first > 0 else s) * self._stride + first + 1

    def _intern_base(self, s: DeviceState) -> int:
        """The dense id of ``s`` among the base states."""
        states = self._base_states
        if self._by_value:
            i = self._ids.get(s)
            if i is None:
                i = self._ids[s] = len(states)
                states.append(s)
                self._base_profile.append(self._intern_profile(profile_of(s)))
            return i
        masks = self._mask_ids
        get = masks.get  # a stored mask object: one look-up by identity (a mask id is never None)
        mask_ids = tuple([found[1] if (found := get(id(m), _UNSTORED))[0] is m else self._mask_id(m) for m in s[1]])
        return self._interned_by_masks(s, mask_ids)

    def _interned_by_masks(self, s: DeviceState, mask_ids: tuple[int, ...], profile: int | None = None) -> int:
        """The id of base state ``s``, whose masks have ids ``mask_ids``,
        stored if new with its profile id: ``profile``, or found from the
        masks' contributor counts when None."""
        states = self._base_states
        i = self._ids.setdefault((s[0], mask_ids), len(states))
        if i == len(states):
            states.append(s)
            self._base_mask_ids.append(mask_ids)
            known = self._mask_ids
            for m, mask_id in zip(s[1], mask_ids):  # stored for good: later states sharing these objects skip hashing
                known[id(m)] = (m, mask_id)
            if profile is None:
                counts = self._mask_counts
                profile = self._intern_profile(make_state(s[0], [counts[m] for m in mask_ids]))
            self._base_profile.append(profile)
        return i

    def _translated_base(self, base: int, offset: int) -> int:
        """The id of base state ``base`` with every mask translated by the
        digits of device ``offset`` (:meth:`Translations.state`), found through
        mask ids: each mask id's translation is memoised per offset (capped at
        ``tuning.moved_masks_upto``), so a translated state is looked up by its
        stops and mask ids without hashing or building a mask it has met
        before. A translation permutes each mask's bits, so the contributor
        counts, hence the profile, are the base's: a new translated state
        takes its profile id. States interned by value translate their state."""
        if not offset:
            return base
        if self._by_value:
            return self._intern_base(self.translations.state(self._base_states[base],
                                                             self.translations.digits(offset)))
        moved, k = self._moved_mask_ids, self.k
        if len(moved) > self.tuning.moved_masks_upto:
            moved.clear()
        mask_ids = []
        for mask_id in self._base_mask_ids[base]:
            found = moved.get(mask_id * k + offset)
            if found is None:
                mask = self.translations.mask(self._mask_list[mask_id], self.translations.digits(offset))
                found = moved[mask_id * k + offset] = self._mask_id(mask)
            mask_ids.append(found)
        mask_ids = tuple(mask_ids)
        stops = self._base_states[base][0]
        i = self._ids.get((stops, mask_ids))
        if i is None:
            masks = self._mask_list
            i = self._interned_by_masks((stops, tuple([masks[m] for m in mask_ids])), mask_ids,
                                        self._base_profile[base])
        return i

    def _masks(self, i: int) -> tuple[int, ...]:
        """The contributor masks of device state ``i`` (where its chunks lie
        does not change them)."""
        return self._base_states[i // self._stride][1] if self._encoded else self.device_states[i][1]

    def runs(self, i: int) -> list[Run]:
        """:func:`runs_of` device state ``i``, without building the state."""
        if not self._encoded:
            return runs_of(self.device_states[i])
        x = max(i % self._stride - 1, 0)
        return [(a + x, b + x, m) for a, b, m in runs_of(self._base_states[i // self._stride])]

    def _run_bounds(self, i: int) -> tuple[tuple[int, int], ...]:
        """The ``(first, stop)`` of each of :meth:`runs` ``(i)``."""
        if not self._encoded:
            return tuple((a, b) for a, b, _ in self.runs(i))
        bounds, x = self._base_run_bounds[i // self._stride], i % self._stride - 1
        return tuple([(a + x, b + x) for a, b in bounds]) if x > 0 else bounds

    def _mask_id(self, mask: int) -> int:
        """A small id per distinct mask value (hashing a mask of ``k`` bits
        reads all of them; :meth:`intern` looks stored mask objects up by
        identity first), and its number of contributors."""
        out = self._mask_values.setdefault(mask, len(self._mask_values))
        if out == len(self._mask_counts):
            self._mask_counts.append(mask.bit_count())
            self._mask_list.append(mask)
        return out

    def _intern_profile(self, profile: StateProfile) -> int:
        """The id of a profile (encoded like device states, "Positions")."""
        if not self._encoded:
            return self._intern_base_profile(profile)
        first = first_held(profile)
        base = self._intern_base_profile(moved_down(profile, first, self.k) if first > 0 else profile)
        return base * self._stride + first + 1

    def _intern_base_profile(self, profile: StateProfile) -> int:
        p = self._profile_ids.get(profile)
        if p is None:
            k = self.k
            p = self._profile_ids[profile] = len(self._base_profiles)
            self._base_profiles.append(profile)
            held = held_runs(profile)
            self._base_held.append(held)
            self._base_held_count.append(chunk_count(profile))
            self._base_whole.append(len(profile[0]) == 1 and profile[1][0] > 0)
            runs = runs_of(profile)
            holds_all = held == ((0, k),)
            complete = all(count in (0, k) for count in profile[1])
            done = profile == ((k,), (k,))
            if self.goal is Goal.REDUCESCATTER:
                final = len(runs) == 1 and runs[0][1] - runs[0][0] == 1 and runs[0][2] == k
            else:
                final = profile == ((k,), (1 if self.goal is Goal.ALLGATHER else k,))
            mass = sum((stop - first) * count for first, stop, count in runs)  # contributors over the chunks
            # the four flags and the mass do not depend on where the chunks lie (the same for every position)
            self._base_packed.append(sum(int(value) << (FIELD * i)
                                         for i, value in enumerate((holds_all, complete, done, final, mass))))
        return p

    def absolute(self, state: tuple[int, ...]) -> State:
        """The absolute state (:func:`initial_state`'s representation) of ``state``."""
        t = self.translations
        out = []
        for d, i in enumerate(state):
            s = self.device_states[i]
            if self.frame == "absolute":
                out.append(s)
            elif self._device_frame:
                out.append(t.state(s, t.digits(d)))
            else:
                first, masks = 0, []
                for stop, mask in zip(*s):  # runs of one mask span several chunks: split them
                    masks.extend(t.mask(mask, t.digits(x)) for x in range(first, stop))
                    first = stop
                out.append(make_state(range(1, self.k + 1), masks))
        return tuple(out)
