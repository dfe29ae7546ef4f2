"""The thresholds that switch the state space between alternative paths.

Every threshold chooses between two implementations that give the same
steps, keys and outcomes (tests compare both sides of each on every reachable
state); they trade time against memory on systems of different size. So a
search's programs and digests do not depend on them, only its time and
memory do. One frozen :class:`SearchTuning` holds all of them;
:class:`~synth.synthesis.statespace.StateSpace` takes one (default
:data:`DEFAULT_TUNING`).

Worked example: at five levels of 4 (``k = 1024`` devices, AllReduce), with
the defaults, ``k >= device_frame_from`` (512) puts the space in the device
frame; ``k < numpy_profiles_from`` (8192) steps a state of at most
``pattern_ids_upto`` (255) distinct ids per pattern; ``k >= whole_keys_from``
(1024) leaves a group of every device unmemoised. Lowering
``pattern_ids_upto`` to 0 sends every state down the per-device path: the
same programs, more time::

    StateSpace((4,) * 5, Goal.ALLREDUCE, tuning=SearchTuning(pattern_ids_upto=0))

**Test hook.** Tests pass a lowered :class:`SearchTuning` to the
constructor, or set ``space.tuning = dataclasses.replace(space.tuning, ...)``
between calls to compare both sides of a threshold on one space (its memos
stay valid: both sides give the same results). ``device_frame_from`` and
``whole_keys_from`` are read when the space is built, and
``moved_masks_upto`` by its :class:`Translations` then too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchTuning:
    """The state space's thresholds (``*_from``: the path changes at this
    value and above; ``*_upto``: at most this value takes the first path).

    * ``device_frame_from`` (devices): allreduce and reducescatter spaces of
      at least this many devices use the device frame; smaller ones are
      many-state searches in which translating costs more than the orbits
      save, and store absolute states (and key device states by value).
    * ``vector_groups_from`` (groups): in the device frame, groupings of at
      least this many groups are stepped with numpy
      (:mod:`.vectors`): their groups fall into a few classes up to chunk
      shifts, and per-group Python would cost more.
    * ``numpy_profiles_from`` (devices): device-frame spaces of at least this
      many devices compute a state's profile ids with numpy (a new state there
      often holds ``k`` new ids); below, the memoised per-id table is cheaper,
      and it keeps one int object per id that the memo keys share (new ints
      per state cost 1.6x the time and memory at 1,024 devices). Below it,
      states are stepped per pattern (:mod:`.patterns`).
    * ``whole_keys_from`` (devices): from this many devices a group of every
      device is checked and stepped without being memoised: its key is a
      whole state, which the search meets about once, and each entry would
      keep ``k`` integers (six levels of 4: 3.7 GiB instead of 3.0 GiB, in the
      same time).
    * ``numpy_counts_from`` (members): groups of at least this many members
      have their members' profiles counted with numpy; below, a Counter is
      cheaper.
    * ``numpy_runs_from`` (positions): an AllGather of one base state at this
      many positions or more builds its result with numpy; below, the loop
      over runs is cheaper.
    * ``pattern_ids_upto`` (distinct ids): device-frame states of fewer than
      ``numpy_profiles_from`` devices that hold at most this many distinct
      ids are stepped per pattern (:mod:`.patterns`); states with more (after
      a ReduceScatter every device holds other chunks) have as many classes
      as groups, and the per-device path shares them across chunk shifts
      (five levels of 4, every state per pattern with 16-bit labels: 10%
      slower). A pattern is one byte per device, hence 255 at most.
    * ``shifted_groups_upto`` (members): groups of at most this many members
      are shared across chunk shifts (:mod:`.outcomes`); larger groups are
      few per step, and normalising them costs more than sharing saves.
    * ``moved_masks_upto`` (entries): entries a memo of translations keeps
      before it starts over: masks in :class:`.Translations` (a mask is ``k``
      bits), mask ids and translated base states in the space.
    * ``tokens_upto`` (tokens): the most tokens a next state of a pattern is
      found from (:mod:`.patterns`): a token is a byte.
    * ``getter_members_upto`` (members): a pattern's class of at most this
      many members takes its values with an itemgetter (fast), a larger one
      through its indices as bytes (small), and is checked on its members'
      counted profiles.
    * ``few_profiles_upto`` (members, distinct profiles): a group of at most
      this many members is counted with a loop (more: a Counter), and one of
      at most this many distinct profiles has its shape check memoised on
      their held chunks (more: checked from the base states' runs at their
      positions where ids encode positions, else checked unmemoised, as
      hashing would cost more).
    * ``numpy_classes_from`` (members): a pattern's grouping whose groups hold
      at least this many members in all finds its classes with numpy (one
      sort of the groups' rows: 1.1-1.4x faster for 4,096 members); below, a
      dict over the rows is cheaper (1,024 members: the same for 256 groups
      of 4, 1.1-1.3x slower for fewer, larger groups).
    """

    device_frame_from: int = 512
    vector_groups_from: int = 1024
    numpy_profiles_from: int = 8192
    whole_keys_from: int = 1024
    numpy_counts_from: int = 2048
    numpy_runs_from: int = 64
    pattern_ids_upto: int = 255
    shifted_groups_upto: int = 64
    moved_masks_upto: int = 1 << 20
    tokens_upto: int = 256
    getter_members_upto: int = 64
    numpy_classes_from: int = 2048
    few_profiles_upto: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.pattern_ids_upto <= 255:
            raise ValueError(f"pattern_ids_upto {self.pattern_ids_upto}: a pattern label is one byte (0..255)")
        if not 0 <= self.tokens_upto <= 256:
            raise ValueError(f"tokens_upto {self.tokens_upto}: a token is one byte (0..256)")


#: the thresholds every space uses unless told otherwise
DEFAULT_TUNING = SearchTuning()
