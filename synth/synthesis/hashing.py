"""Zen's hierarchical hashing: which partition (chunk) owns an index, and the
hash-bitmap encoding of a partition's entries.

A hash partition is to an index space what a chunk is to a dense buffer. The
``k`` partitions of ``n`` positions are numbered like the chunks of the dense
semantics (mixed radix over the synthesis hierarchy's sizes, outermost level
most significant): the digit of level ``l`` of the partition of index ``i`` is
``h_l(i) mod sizes[l]``, ``h_l`` a seeded 64-bit mix (splitmix64's finaliser)
with its own seed per level. So a partition is the set of indices whose hashes
agree on every level, and the partitions a ReduceScatter over an outer level
leaves to each member are those with its digit at that level.

Invariant (what makes a sparse program correct whenever the dense program it
is lowered from is proved): the partition of an index is a function of the
index, ``n``, the hierarchy's sizes and the seed only, identical on every rank
and never of the data. Skewed indices therefore spread over the partitions like
uniform ones: a partition's load is the number of distinct indices that hash to
it (binomial around ``nnz / k``), whatever the indices' popularity.

Slots. The indices of partition ``j``, in increasing order, are its slots
``0..size_j-1``; :func:`encode` writes an entry as (int32 slot, value) and the
receiver maps the slot back to the index (the runtime's coo sends the index
itself instead, the same 4 bytes below 2^31 positions, and so needs no table
lookup at either end). The hash-bitmap encoding sends, for a partition, a bitmap of
``ceil(size_j / 8)`` bytes over its slots (bit set = entry present) and the
values in slot order, instead of 4 bytes of index per entry: cheaper once more
than one slot in 32 holds an entry.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from ..errors import SynthError

#: bytes of one index on the wire (int32: a slot within its partition, or the index itself in the runtime)
INDEX_BYTES = 4

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x: np.ndarray, seed: int) -> np.ndarray:
    """A 64-bit hash of each element of ``x`` (non-negative integers) under
    ``seed``: splitmix64's finaliser of ``x + seed * golden``; deterministic,
    the same on every machine."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & _MASK


@dataclass(frozen=True)
class HashPartition:
    """The partitions of ``n`` positions over a hierarchy of ``sizes`` (outermost
    first; ``k = prod(sizes)`` partitions), by hierarchical hashing with ``seed``
    (module docstring). Read-only tables are computed once per value."""

    n: int
    sizes: tuple[int, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise SynthError(f"sparse buffer of {self.n} positions: give at least one position")
        if any(s < 1 for s in self.sizes):
            raise SynthError(f"hierarchy sizes {list(self.sizes)}: every level needs at least one member")

    @property
    def k(self) -> int:
        return math.prod(self.sizes)

    def of(self, indices: np.ndarray) -> np.ndarray:
        """The partition (chunk id, int64) of each index."""
        indices = np.asarray(indices, dtype=np.int64)
        part = np.zeros(indices.shape, dtype=np.int64)
        for level, size in enumerate(self.sizes):
            digit = (mix64(indices, self.seed * 1009 + level) % np.uint64(size)).astype(np.int64)
            part = part * size + digit
        return part

    @cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        part = self.of(np.arange(self.n, dtype=np.int64))
        order = np.argsort(part, kind="stable")  # indices grouped by partition, increasing within
        counts = np.bincount(part, minlength=self.k)
        starts = np.concatenate([[0], np.cumsum(counts)])
        slot = np.empty(self.n, dtype=np.int64)
        slot[order] = np.arange(self.n) - starts[part[order]]
        # one lookup gives both: code = slot x k + partition (< n + k, so int64 only past 2^31 positions)
        code = (slot * self.k + part).astype(np.int32 if self.n + self.k < 2**31 else np.int64)
        order = order.astype(np.int32 if self.n < 2**31 else np.int64)
        for a in (order, code, starts):
            a.setflags(write=False)
        return code, order, starts, counts

    @property
    def partition_of_index(self) -> np.ndarray:
        """``(n,)``: the partition of every index."""
        return self._tables[0] % self.k

    @property
    def slot_of_index(self) -> np.ndarray:
        """``(n,)``: every index's slot within its partition."""
        return self._tables[0] // self.k

    @property
    def partition_sizes(self) -> np.ndarray:
        """``(k,)``: slots per partition."""
        return self._tables[3]

    @property
    def key_dtype(self) -> type:
        """The dtype of an index as the runtime carries it (int32 below 2^31 positions)."""
        return np.int32 if self.n < 2**31 else np.int64

    @cached_property
    def _partition_table(self) -> np.ndarray:
        """``(n,)``: the partition of every index in the smallest unsigned type
        that holds ``k`` (one byte for up to 256 partitions: a quarter of the
        code table's cache footprint)."""
        small = np.uint8 if self.k <= 1 << 8 else np.uint16 if self.k <= 1 << 16 else np.int32
        table = (self._tables[0] % self.k).astype(small)
        table.setflags(write=False)
        return table

    def slots_of(self, indices: np.ndarray) -> np.ndarray:
        """The slot of each index within its own partition."""
        return self._tables[0][indices] // self.k

    def members(self, partition: int) -> np.ndarray:
        """The indices of ``partition``, increasing (slot ``s`` is element ``s``)."""
        _, order, starts, _ = self._tables
        return order[starts[partition]:starts[partition + 1]]

    def split(self, indices: np.ndarray, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """A sparse tensor (unique indices, values) cut into its ``k``
        partitions: per partition (slots increasing, values):
        :meth:`split_indices` with each index replaced by its slot (slots
        increase with the index inside a partition)."""
        return [(self.slots_of(keys), part_values) for keys, part_values in self.split_indices(indices, values)]

    def split_indices(self, indices: np.ndarray, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """A sparse tensor (unique indices, values) cut into its ``k``
        partitions by index: per partition (indices increasing, as
        :attr:`key_dtype`; values). Within a partition slots and indices
        increase together, so the order is the slots' too. The runtime keeps
        partitions in this form: no slot lookup on the way in, none on the way
        out."""
        keys = np.asarray(indices).astype(self.key_dtype, copy=False)
        part = self._partition_table[keys]
        if len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1])):
            order = np.argsort(part, kind="stable")  # increasing indices: a radix sort on the small partition ids
        else:
            order = np.lexsort((keys, part))  # other orders: by (partition, index)
        bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=self.k))])
        keys, values = keys[order], np.asarray(values)[order]
        return [(keys[a:b], values[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def join(self, parts: Sequence[tuple[np.ndarray, np.ndarray]] | dict,
             ordered: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of :meth:`split`: (indices increasing, values); with
        ``ordered=False`` the indices come partition by partition (increasing
        within each), which saves a sort."""
        items = parts.items() if isinstance(parts, dict) else enumerate(parts)
        idx, val = [], []
        for j, (slots, values) in items:
            idx.append(self.members(j)[slots])
            val.append(values)
        if not idx:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        indices, values = np.concatenate(idx), np.concatenate(val)
        if not ordered:
            return indices, values
        order = np.argsort(indices, kind="stable")
        return indices[order], values[order]


def range_partition(n: int, k: int, indices: np.ndarray) -> np.ndarray:
    """The contiguous-range partition (chunk ``j`` = positions ``[j n/k, (j+1)
    n/k)``) of each index: what a dense chunking would do, for comparison."""
    return np.minimum(np.asarray(indices, dtype=np.int64) * k // n, k - 1)


def imbalance(partitions: np.ndarray, k: int) -> float:
    """Busiest partition's entries over the mean (1 = perfectly balanced)."""
    counts = np.bincount(np.asarray(partitions, dtype=np.int64), minlength=k)
    mean = counts.sum() / k
    return float(counts.max() / mean) if mean else 1.0


# ---------------------------------------------------------------- encodings


class Encoding(enum.Enum):
    """How a partition's entries travel. Every choice falls back to dense (the
    partition's values at every slot) when that is fewer bytes."""

    COO = "coo"  # (int32 slot, value) pairs
    BITMAP = "bitmap"  # Zen's hash bitmap over the partition's slots + values in slot order
    AUTO = "auto"  # whichever of coo, bitmap, dense is fewest bytes

    @classmethod
    def of(cls, text: "str | Encoding") -> "Encoding":
        if isinstance(text, Encoding):
            return text
        for e in cls:
            if e.value == text:
                return e
        raise SynthError(f"--encoding {text}: use one of {', '.join(e.value for e in cls)}")


class Format(enum.IntEnum):
    """The wire format one partition was sent in (chosen per message)."""

    COO = 0
    BITMAP = 1
    DENSE = 2


def format_bytes(fmt: Format, entries: float, slots: float, value_bytes: int) -> float:
    """Bytes of a partition of ``slots`` slots holding ``entries`` entries in ``fmt``."""
    if fmt is Format.COO:
        return entries * (INDEX_BYTES + value_bytes)
    if fmt is Format.BITMAP:
        return math.ceil(slots / 8) + entries * value_bytes
    return slots * value_bytes


def choose_format(encoding: Encoding, entries: float, slots: float, value_bytes: int) -> Format:
    """The fewest-bytes format ``encoding`` allows (ties: coo, bitmap, dense)."""
    allowed = {Encoding.COO: (Format.COO, Format.DENSE), Encoding.BITMAP: (Format.BITMAP, Format.DENSE),
               Encoding.AUTO: (Format.COO, Format.BITMAP, Format.DENSE)}[encoding]
    return min(allowed, key=lambda f: (format_bytes(f, entries, slots, value_bytes), f))


def encode(slots: np.ndarray, values: np.ndarray, size: int, encoding: Encoding) -> tuple[Format, np.ndarray]:
    """One partition's entries (``slots`` increasing, unique, ``< size``) as
    bytes (uint8) in the format :func:`choose_format` picks. ``values`` is one
    value per entry, or a row per entry (2-D: an embedding gradient's rows,
    each entry then carries ``width`` values)."""
    values = np.ascontiguousarray(values)
    width = values.shape[1] if values.ndim == 2 else 1
    fmt = choose_format(encoding, len(slots), size, values.dtype.itemsize * width)
    flat = values.reshape(-1).view(np.uint8)
    if fmt is Format.COO:
        payload = [np.asarray(slots, dtype=np.int32).view(np.uint8), flat]
    elif fmt is Format.BITMAP:
        bits = np.zeros(size, dtype=bool)
        bits[slots] = True
        payload = [np.packbits(bits), flat]
    else:
        dense = np.zeros((size,) + values.shape[1:], dtype=values.dtype)
        dense[slots] = values
        payload = [dense.reshape(-1).view(np.uint8)]
    return fmt, np.concatenate(payload) if len(payload) > 1 else payload[0]


def decode(fmt: Format, count: int, blob: np.ndarray, size: int, dtype: np.dtype,
           width: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`encode`: (slots increasing, values), the values a
    row of ``width`` per entry when ``width`` > 1; a dense partition gives its
    non-zero slots (rows of zeros are not entries)."""
    dtype = np.dtype(dtype)
    blob = np.ascontiguousarray(blob)

    def rows(flat: np.ndarray) -> np.ndarray:
        return flat if width == 1 else flat.reshape(-1, width)

    # (flatnonzero of a boolean array takes numpy's fast path: several times a float scan's speed)
    if fmt is Format.COO:
        slots = blob[:count * INDEX_BYTES].view(np.int32)
        return slots, rows(blob[count * INDEX_BYTES:].view(dtype))
    if fmt is Format.BITMAP:
        head = math.ceil(size / 8)
        slots = np.flatnonzero(np.unpackbits(blob[:head], count=size).view(bool))
        return slots, rows(blob[head:].view(dtype))
    dense = rows(blob.view(dtype))
    slots = np.flatnonzero(dense != 0 if width == 1 else (dense != 0).any(axis=1))
    return slots, dense[slots]


def wire_bytes(fmt: Format, count: int, size: int, itemsize: int) -> int:
    """Exact bytes :func:`encode` produces for ``count`` entries of a partition of ``size`` slots."""
    return int(format_bytes(Format(fmt), count, size, itemsize))
