"""Search keys: what the search stores per state.

A state of the space is a tuple of ``k`` device state ids. The search keeps
a state of few distinct ids as a :class:`Packed` key instead: its *labels*
(per device, the index of its id among the distinct ids, first occurrence
first, one byte each) and its *palette* (the distinct ids), ``k / 8`` times
smaller than the tuple and hashed once. Invariant: one state has one key,
and the key names one state. Example: the state ``(7, 9, 7, 9)`` is
``Packed(b"\\x00\\x01\\x00\\x01", (7, 9))``; ``labels_of((7, 9, 7, 9), (7,
9))`` gives those labels, and ``pattern_of_array`` finds both from an array
of ids with one sort.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Union

import numpy as np


class Packed(NamedTuple):
    """A state of a :class:`StateSpace` holding few distinct ids, as the
    search keeps it: which devices hold equal ids (each device's index into
    the distinct ids, first occurrence first, as bytes) and the distinct ids.
    ``k / 8`` times smaller than the tuple of ids, hashed once, and stepped
    without building that tuple (:meth:`StateSpace.expand`).

    With a ``shift`` (chunks per digit, one per level) the distinct ids are
    *relative*: device ``d`` holds its palette id moved by
    ``sum(shift[l] * digit_l(d))`` chunks (an id that holds nothing does not
    move). The search keys so a state of many distinct ids whose chunk
    positions follow its devices' digits (after ReduceScatters), where the
    ids it holds relative to those positions are few
    (:meth:`StateSpace.key`)."""

    labels: bytes
    palette: tuple[int, ...]
    shift: tuple[int, ...] = ()


#: what the search keeps per state: a :class:`Packed` state, or the tuple of its devices' ids (StateSpace.key)
StateKey = Union[Packed, tuple[int, ...]]


def labels_of(state: tuple[int, ...], palette: tuple[int, ...]) -> bytes:
    """Each device's index into ``palette`` (the state's distinct ids), as bytes."""
    index = {i: n for n, i in enumerate(palette)}
    return bytes(map(index.__getitem__, state))


def class_array(group_class: bytes | Sequence[int]) -> np.ndarray:
    """Each group's class (:meth:`Pattern.classes`: bytes below 256 classes) as an array."""
    return np.frombuffer(group_class, np.uint8) if group_class.__class__ is bytes else np.array(group_class)


def pattern_of_array(values: np.ndarray, upto: int) -> tuple[bytes, tuple[int, ...]] | None:
    """:func:`_labels` and the distinct values (first occurrence first) of an
    array of ids, with one sort; None for more than ``tuning.pattern_ids_upto``
    distinct values (2.8x faster than a dict over 4,096 ids)."""
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    if len(distinct) > upto:
        return None
    order = np.argsort(first)
    rank = np.empty(len(order), dtype=np.uint8)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()].tobytes(), tuple(distinct[order].tolist())
