"""Vector steps: groupings of many groups stepped with numpy.

In the device frame a grouping of at least ``tuning.vector_groups_from``
groups is stepped with numpy (:meth:`VectorSteps._vector_successors`): each
group's members are moved down by its first held chunk (one subtraction per
encoded id, see :mod:`.interning`), so groups that are chunk shifts of one
another fall into one class; the checks, the lookahead and the outcomes are
looked up once per class, and each group's results are moved back up.

Invariant: the same steps, in the same order, as the per-group path (tests
compare both). Example, ``k = 4``, stride 5, the grouping of two groups
``(0, 1), (2, 3)``: rows ``[[6, 7], [8, 9]]`` (one base 1 at chunks 0, 1 and
2, 3) move down by 0 and 2 to ``[[6, 7], [6, 7]]``: one class, one look-up,
and the second group's new ids move back up by 2.

Test hooks: the tests (tests/synthesis/test_semantics.py, test_search.py) read or call
these members of this part directly, to check its invariants against an independent
reference: ``_member_array``, ``_vector_successors``, ``_whole_members``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..language import Collective
from ..semantics import Loads
from .bits import BIT


class VectorSteps:
    """Vector steps, a part of :class:`~synth.synthesis.statespace.StateSpace`
    (a mixin): it owns the member arrays and the arrays grown from the
    interning tables (``_base_profile_array``, ``_base_whole_array``)."""

    def _init_vectors(self) -> None:
        self._member_arrays: dict[int, np.ndarray] = {}  # see _member_array
        self._base_profile_array = np.zeros(0, dtype=np.int64)  # _base_profile as an array (_profile_ids_of)
        self._base_profile_store, self._base_profile_capacity = self._base_profile_array, 0  # its room to grow
        self._base_whole_array = np.zeros(0, dtype=bool)

    def _vector_successors(self, g: int, ids: np.ndarray, profiles: np.ndarray, collectives: Sequence[Collective],
                           wanted: int, totals: int,
                           lookahead: str | None) -> list[tuple[int, Collective, tuple[int, ...], Loads]]:
        """:meth:`successors` on grouping ``g`` (device frame, many groups), with
        numpy: each group's members are moved down by its first held chunk
        (:meth:`_moved_down`, one subtraction per id), so groups that are chunk
        shifts of one another fall into one class; the profile checks, the
        lookahead and the outcomes are looked up once per class (the same
        memos as the per-group path), and each group's results are moved back
        up. ``ids``, ``profiles``: the state's and its profiles' ids; ``lookahead``:
        the one the packed counts decide (None where :meth:`_hopeful` did)."""
        members = self._member_array(g)
        profile_rows = profiles[members]
        ok = self._passing_all(list(map(tuple, self._classes(profile_rows, self._whole_members(profile_rows))[1])),
                               wanted)
        if not ok:
            return []
        if lookahead is not None:  # the lookahead counts the groups per class of profiles, whole members moved too
            _, class_rows, profile_class = self._classes(profile_rows)
            profile_keys = [tuple(row) for row in class_rows]
            per_class = np.bincount(profile_class).tolist()
        out: list[tuple[int, Collective, tuple[int, ...], Loads]] = []
        id_rows = None
        chosen = self._chosen.get(tuple(collectives), {})
        for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
            if lookahead is not None and not self._ahead_by_class(totals, c, zip(profile_keys, per_class),
                                                                  len(members), lookahead):
                continue
            if id_rows is None:
                base, id_rows, id_class = self._classes(ids[members])
                id_keys = [tuple(row) for row in id_rows]
            memo = self._memos[BIT[c]][g]
            results, loads = [], []
            for key in id_keys:
                outcome = memo.get(key)
                if outcome is None:
                    outcome = memo[key] = self._compute(g, c, key, True)
                if outcome.__class__ is str:
                    break
                results.append(outcome[0])
                loads.append(outcome[1])
            else:
                moved = np.array(results, dtype=np.int64)[id_class]
                moved += base[:, None] * (moved % self._stride > 0)  # back up by each group's first chunk
                nxt = ids.copy()
                nxt[members] = moved
                if not np.array_equal(nxt, ids):
                    out.append((g, c, tuple(nxt.tolist()), tuple(np.array(loads)[id_class].tolist())))
        return out

    def _profile_ids_of(self, ids: np.ndarray) -> np.ndarray:
        """The profile ids of encoded device state ids (``_profile``, with numpy):
        the base state's profile moved to the state's first chunk."""
        n = len(self._base_profile)
        if len(self._base_profile_array) != n:  # grown by the new entries (doubling), not rebuilt
            array = self._base_profile_array
            if self._base_profile_capacity < n:
                grown = np.zeros(max(n, 2 * self._base_profile_capacity), dtype=np.int64)
                grown[:len(array)] = array
                self._base_profile_store = grown
                self._base_profile_capacity = len(grown)
            self._base_profile_store[len(array):n] = self._base_profile[len(array):n]
            self._base_profile_array = self._base_profile_store[:n]
        return self._base_profile_array[ids // self._stride] + np.maximum(ids % self._stride - 1, 0)

    def _member_array(self, g: int) -> np.ndarray:
        """Grouping ``g``'s groups as a (groups, members) array, memoised."""
        found = self._member_arrays.get(g)
        if found is None:
            found = self._member_arrays[g] = np.array(self.groupings[g].groups, dtype=np.int64)
        return found

    def _classes(self, rows: np.ndarray, still: np.ndarray | None = None
                 ) -> tuple[np.ndarray, list[list[int]], np.ndarray]:
        """Per row (a group's members' encoded ids): its base, the first chunk
        any member holds (0 if none holds any), and its class: the distinct rows
        once moved down by their base (:meth:`_moved_down`), as lists, and each
        row's index among them. Members marked in ``still`` (same shape) are
        neither moved nor looked at for the base (:meth:`_whole_members`)."""
        position = rows % self._stride  # first held chunk + 1; 0: holds nothing
        moved = position > 0
        if still is not None:
            moved &= ~still
        first = np.where(moved, position, np.iinfo(np.int64).max).min(axis=1)
        base = np.where(moved.any(axis=1), first - 1, 0)
        down = np.ascontiguousarray(rows - base[:, None] * moved)
        flat = down.view(np.dtype((np.void, down.dtype.itemsize * down.shape[1]))).ravel()
        _, index, inverse = np.unique(flat, return_index=True, return_inverse=True)
        return base, down[index].tolist(), inverse.ravel()

    def _whole_members(self, rows: np.ndarray) -> np.ndarray:
        """Which of the encoded profile ids ``rows`` hold one run over every
        chunk. The profile checks compare members chunk by chunk and split held
        chunks in order; such a member holds every chunk with one count, the
        same at every position, so moving the other members of its group
        together keeps every comparison: the groups' checks are looked up per
        class with these members kept still (:meth:`_classes`), and a group of
        one whole member and one part at each of 8,192 positions is one check,
        not 8,192 (tests compare both on every reachable group)."""
        if len(self._base_whole_array) != len(self._base_whole):
            self._base_whole_array = np.array(self._base_whole, dtype=bool)
        return self._base_whole_array[rows // self._stride]
