"""Run sparse all-reduce programs: every rank holds (indices, values), every
rank ends with the dense sum's non-zeros over its reduction group.

The steps are those of :mod:`synth.synthesis.sparse` (the sparse form of a
proved dense all-reduce program), on this rank's sub-communicators:

* PartitionSum: one ``Alltoallv`` of encoded partitions (counts first, by an
  ``Alltoall`` of byte counts), then the owner sums what it received with its own;
* GatherPartitions, GatherSum: one ``Allgatherv`` (counts by ``Allgather``);
* GatherSumRoot: ``Gatherv`` to the group's first member; BroadcastSet:
  ``Bcast`` of the size, then of the bytes.

A rank keeps each partition as (indices increasing, values). A message is a
list of partitions, each a 16-byte header (partition id, format, entries,
payload bytes: int32 x 4) and its payload in the format
:func:`~synth.synthesis.hashing.choose_format` picks for its entry count (coo,
hash bitmap or dense, whichever is fewest bytes under the chosen encoding);
coo carries the int32 indices themselves, the bitmap and dense formats the
partition's slots (:meth:`SparseExecutor._encode`). Sums merge the
contributions' sorted runs by index (:func:`merge_runs`: a stable sort and a
segmented sum) while they hold at most a quarter of the partition's slots,
else go through a dense scratch of its slots and a mask of those touched
(:func:`sum_dense`).

Backends: ``mpi`` (mpi4py; :class:`~synth.runtime.backends.MPIWorld`) and the
in-process ``numpy`` threads (:class:`~synth.runtime.backends.LocalWorld`, for
the tests) and ``torch`` (torch.distributed: ``all_to_all_single`` with split
sizes, all_gather / gather / broadcast of padded messages;
:class:`~synth.runtime.torch_world.TorchSparseComm`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import SynthError
from ..synthesis.hashing import INDEX_BYTES, Encoding, Format, HashPartition, choose_format, decode, encode
from ..synthesis.language import Collective
from ..synthesis.lowering import LoweredProgram
from ..synthesis.semantics import Goal

_HEADER = 4  # int32s per partition header: partition, format, entries, payload bytes

Entries = tuple[np.ndarray, np.ndarray]  # (indices or slots increasing, values) of one partition


class _LocalSparseComm:
    """Byte-message collectives among threads (the numpy backend)."""

    def __init__(self, rendezvous: Any, member: int) -> None:
        self.r, self.member, self.size = rendezvous, member, len(rendezvous.slots)

    def _all(self, value: Any) -> list[Any]:
        values = self.r.exchange(self.member, value)
        self.r.done()
        return values

    def alltoallv(self, messages: list[np.ndarray]) -> list[np.ndarray]:
        return [row[self.member].copy() for row in self._all(messages)]

    def allgatherv(self, message: np.ndarray) -> list[np.ndarray]:
        return [m.copy() for m in self._all(message)]

    def gatherv(self, message: np.ndarray) -> list[np.ndarray] | None:
        values = self._all(message)
        return [m.copy() for m in values] if self.member == 0 else None

    def bcast(self, message: np.ndarray | None) -> np.ndarray:
        return self._all(message)[0].copy()


class _MPISparseComm:
    """Byte-message collectives on an MPI communicator (mpi4py buffers)."""

    def __init__(self, comm: Any, MPI: Any) -> None:
        self.comm, self.MPI = comm, MPI
        self.member, self.size = comm.Get_rank(), comm.Get_size()

    @staticmethod
    def _split(buffer: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
        return np.split(buffer, np.cumsum(counts)[:-1])

    @staticmethod
    def _layout(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(counts, displacements) of messages laid end to end (mpi4py's v-collective form)."""
        return counts, np.concatenate([[0], np.cumsum(counts)[:-1]])

    def alltoallv(self, messages: list[np.ndarray]) -> list[np.ndarray]:
        send_counts = np.array([len(m) for m in messages], dtype=np.int64)
        recv_counts = np.empty_like(send_counts)
        self.comm.Alltoall(send_counts, recv_counts)
        send = np.concatenate(messages) if messages else np.zeros(0, np.uint8)
        recv = np.empty(int(recv_counts.sum()), dtype=np.uint8)
        self.comm.Alltoallv([send, self._layout(send_counts), self.MPI.BYTE],
                            [recv, self._layout(recv_counts), self.MPI.BYTE])
        return self._split(recv, recv_counts)

    def allgatherv(self, message: np.ndarray) -> list[np.ndarray]:
        counts = np.empty(self.size, dtype=np.int64)
        self.comm.Allgather(np.array([len(message)], dtype=np.int64), counts)
        recv = np.empty(int(counts.sum()), dtype=np.uint8)
        self.comm.Allgatherv(message, [recv, self._layout(counts), self.MPI.BYTE])
        return self._split(recv, counts)

    def gatherv(self, message: np.ndarray) -> list[np.ndarray] | None:
        counts = np.empty(self.size, dtype=np.int64)
        self.comm.Allgather(np.array([len(message)], dtype=np.int64), counts)
        if self.member != 0:
            self.comm.Gatherv(message, None, root=0)
            return None
        recv = np.empty(int(counts.sum()), dtype=np.uint8)
        self.comm.Gatherv(message, [recv, self._layout(counts), self.MPI.BYTE], root=0)
        return self._split(recv, counts)

    def bcast(self, message: np.ndarray | None) -> np.ndarray:
        size = np.array([0 if message is None else len(message)], dtype=np.int64)
        self.comm.Bcast(size, root=0)
        buffer = message if self.member == 0 else np.empty(int(size[0]), dtype=np.uint8)
        self.comm.Bcast(buffer, root=0)
        return buffer


def _empty(parts: Sequence[Entries], dtype: np.dtype) -> Entries:
    row = parts[0][1].shape[1:] if parts else ()  # () for one value per entry, (width,) for rows
    keys = parts[0][0].dtype if parts else np.int64
    return np.zeros(0, dtype=keys), np.zeros((0,) + row, dtype=dtype)


def _nonzero(values: np.ndarray) -> np.ndarray:
    return values != 0 if values.ndim == 1 else (values != 0).any(axis=1)


def merge_runs(parts: Sequence[Entries], dtype: np.dtype) -> Entries:
    """The sum of sparse contributions keyed by any increasing unique integers
    (slots or the indices themselves): their runs concatenated in the order
    given, merged by a stable sort (timsort: O(entries log runs)) and summed per
    key in that order, so every rank that merges the same contributions in the
    same order gets the same bits; zero sums dropped."""
    nonempty = [p for p in parts if len(p[0])]
    if not nonempty:
        return _empty(parts, dtype)
    if len(nonempty) == 1:
        keys, values = nonempty[0]
        keep = _nonzero(values)
        return keys[keep], values[keep].astype(dtype, copy=False)
    keys = np.concatenate([p[0] for p in nonempty])
    values = np.concatenate([p[1] for p in nonempty]).astype(dtype, copy=False)
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    keys, sums = keys[starts], np.add.reduceat(values, starts, axis=0)
    keep = _nonzero(sums)
    return keys[keep], sums[keep]


def sum_dense(parts: Sequence[Entries], size: int, dtype: np.dtype) -> Entries:
    """The sum of sparse contributions to one partition of ``size`` slots
    (each: slots increasing and unique, ``< size``; values: one per slot, or a
    row per slot) through a dense scratch of the slots and a mask of those
    touched, O(slots), contributions added in the order given: (slots
    increasing, sums), zero sums (rows) dropped."""
    nonempty = [p for p in parts if len(p[0])]
    if not nonempty:
        return _empty(parts, dtype)
    scratch = np.zeros((size,) + nonempty[0][1].shape[1:], dtype=dtype)
    touched = np.zeros(size, dtype=bool)
    for part_slots, part_values in nonempty:
        scratch[part_slots] += part_values
        touched[part_slots] = True
    slots = np.flatnonzero(touched)
    sums = scratch[slots]
    keep = _nonzero(sums)
    return slots[keep], sums[keep]


def sparse_comm(world: Any, groups: Sequence[tuple[int, ...]]) -> Any:
    """This rank's byte-message communicator among ``groups`` (collective over
    the world), or None if it is in none of them."""
    if world.name == "mpi":
        comm = world.mpi_split(groups)
        return None if comm is None else _MPISparseComm(comm, world.MPI)
    if world.name == "numpy":
        mine = [g for g in groups if world.rank in g]
        return _LocalSparseComm(world.shared.group(mine[0]), mine[0].index(world.rank)) if mine else None
    if world.name == "torch":
        from .torch_world import TorchSparseComm

        comm = world.split(groups)
        return None if comm is None else TorchSparseComm(comm, world.device)
    raise SynthError(f"sparse-allreduce runs on --backend mpi or torch (or the in-process numpy reference), not "
                     f"{world.name}; use --backend mpi or torch")


@dataclass(frozen=True)
class _Step:
    collective: Collective
    comm: Any  # None: this rank is idle
    chunks: tuple[int, ...]
    owner: tuple[int, ...]  # per position in chunks, the member whose part holds it


class SparseExecutor:
    """The sparse form of an all-reduce program on this rank; build it on every
    rank at once (sub-communicators are created collectively), then call
    :meth:`run` on every rank."""

    def __init__(self, lowered: LoweredProgram, world: Any, partition: HashPartition,
                 encoding: Encoding = Encoding.COO) -> None:
        if lowered.goal is not Goal.ALLREDUCE:
            raise SynthError(f"sparse-allreduce lowers all-reduce programs, not {lowered.goal.value}")
        if partition.k != lowered.num_chunks:
            raise SynthError(f"the partition has {partition.k} partitions, the program {lowered.num_chunks} chunks")
        self.partition, self.encoding, self.rank = partition, encoding, world.rank
        self.sizes = partition.partition_sizes
        self.sent_bytes = 0
        self._width = 1  # values per entry of the run in progress (rows of an embedding gradient: its width)
        steps = []
        for step in lowered.steps:
            comm = sparse_comm(world, step.groups)
            chunks: tuple[int, ...] = ()
            owner: tuple[int, ...] = ()
            for members, c in zip(step.groups, step.chunks):
                if world.rank in members and c:
                    part = max(len(c) // len(members), 1)
                    chunks, owner = tuple(c), tuple(p // part for p in range(len(c)))
            steps.append(_Step(step.collective, comm, chunks, owner))
        self.steps = tuple(steps)

    def for_positions(self, n: int) -> "SparseExecutor":
        """This executor (the same communicators: nothing collective) over an
        index space of ``n`` positions, hashed like this one's (same hierarchy
        sizes and seed)."""
        other = copy.copy(self)
        other.partition = HashPartition(n, self.partition.sizes, self.partition.seed)
        other.sizes = other.partition.partition_sizes
        other.sent_bytes = 0
        return other

    # ------------------------------------------------------------ messages

    def _encode(self, j: int, keys: np.ndarray, values: np.ndarray) -> tuple[Format, np.ndarray]:
        """Partition ``j``'s entries (indices increasing) as bytes: coo sends
        each index itself as its int32 (the slot past 2^31 positions), the
        hash bitmap and dense formats go through the partition's slots."""
        size = int(self.sizes[j])
        values = np.ascontiguousarray(values)
        fmt = choose_format(self.encoding, len(keys), size, values.dtype.itemsize * self._width)
        if fmt is Format.COO and self.partition.key_dtype is np.int32:
            return fmt, np.concatenate([np.asarray(keys, dtype=np.int32).view(np.uint8),
                                        values.reshape(-1).view(np.uint8)])
        return encode(self.partition.slots_of(keys), values, size, self.encoding)

    def _decode(self, j: int, fmt: Format, count: int, blob: np.ndarray, dtype: np.dtype) -> Entries:
        """The inverse of :meth:`_encode`: (indices increasing, values)."""
        if fmt is Format.COO and self.partition.key_dtype is np.int32:
            values = blob[count * INDEX_BYTES:].view(dtype)
            return blob[:count * INDEX_BYTES].view(np.int32), values if self._width == 1 else \
                values.reshape(-1, self._width)
        slots, values = decode(fmt, count, blob, int(self.sizes[j]), dtype, self._width)
        return self.partition.members(j)[slots], values

    def _pack(self, state: list[Entries], chunks: Sequence[int]) -> np.ndarray:
        headers, payloads = [], []
        for j in chunks:
            keys, values = state[j]
            fmt, blob = self._encode(j, keys, values)
            headers.append((j, int(fmt), len(keys), len(blob)))
            payloads.append(blob)
        head = np.asarray(headers, dtype=np.int32).reshape(-1, _HEADER).view(np.uint8).ravel()
        message = np.concatenate([head, *payloads]) if payloads else head
        self.sent_bytes += len(message)
        return message

    def _unpack(self, message: np.ndarray, count: int, dtype: np.dtype) -> list[tuple[int, Entries]]:
        message = np.ascontiguousarray(message)
        head = message[:count * _HEADER * 4].view(np.int32).reshape(count, _HEADER)
        offset, out = count * _HEADER * 4, []
        for j, fmt, entries, nbytes in head.tolist():
            out.append((j, self._decode(j, Format(fmt), entries, message[offset:offset + nbytes], dtype)))
            offset += nbytes
        return out

    def _sum(self, j: int, parts: Sequence[Entries], dtype: np.dtype) -> Entries:
        """The sum of partition ``j``'s contributions (indices increasing):
        merged by index while they are few (a quarter of the partition's
        slots), else summed over the partition's slots."""
        size = int(self.sizes[j])
        if sum(len(p[0]) for p in parts) * 4 <= size:
            return merge_runs(parts, dtype)
        slots, sums = sum_dense([(self.partition.slots_of(keys), values) for keys, values in parts], size, dtype)
        return self.partition.members(j)[slots], sums

    # ------------------------------------------------------------ running

    def run(self, indices: np.ndarray, values: np.ndarray, ordered: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """This rank's sparse tensor (unique indices, values: one per index, or
        a row per index) -> the reduction group's sum (unique indices, values
        of the same dtype and row width, no zero values or rows); the indices
        increase, or with ``ordered=False`` come partition by partition
        (increasing within each; no final sort). Collective over the program's
        groups."""
        values = np.asarray(values)
        dtype = values.dtype
        self._width = values.shape[1] if values.ndim == 2 else 1
        state = self.partition.split_indices(indices, values)
        for step in self.steps:
            if step.comm is None or not step.chunks:
                continue
            self._step(step, state, dtype)
        out_indices = np.concatenate([keys for keys, _ in state])
        out_values = np.concatenate([v for _, v in state])
        if ordered:
            order = np.argsort(out_indices, kind="stable")
            out_indices, out_values = out_indices[order], out_values[order]
        return out_indices, out_values

    def _step(self, step: _Step, state: list[Entries], dtype: np.dtype) -> None:
        c, comm, chunks, owner = step.collective, step.comm, step.chunks, step.owner
        me = comm.member
        if c is Collective.REDUCESCATTER:
            by_member = [[j for j, o in zip(chunks, owner) if o == t] for t in range(comm.size)]
            received = comm.alltoallv([self._pack(state, by_member[t]) if t != me else np.zeros(0, np.uint8)
                                       for t in range(comm.size)])
            mine = by_member[me]
            parts: dict[int, list[Entries]] = {j: [state[j]] for j in mine}
            for t, message in enumerate(received):
                if t != me:
                    for j, entries in self._unpack(message, len(mine), dtype):
                        parts[j].append(entries)
            for j in mine:
                state[j] = self._sum(j, parts[j], dtype)
        elif c is Collective.ALLGATHER:
            own = [j for j, o in zip(chunks, owner) if o == me]
            for t, message in enumerate(comm.allgatherv(self._pack(state, own))):
                if t != me:
                    count = sum(1 for o in owner if o == t)
                    for j, entries in self._unpack(message, count, dtype):
                        state[j] = entries
        elif c is Collective.BROADCAST:
            message = comm.bcast(self._pack(state, chunks) if me == 0 else None)
            if me != 0:
                for j, entries in self._unpack(message, len(chunks), dtype):
                    state[j] = entries
        else:  # AllReduce (GatherSum), Reduce (GatherSumRoot)
            message = self._pack(state, chunks)
            received = comm.allgatherv(message) if c is Collective.ALLREDUCE else comm.gatherv(message)
            if received is None:
                return
            parts = {j: [] for j in chunks}
            for t, m in enumerate(received):
                for j, entries in (self._unpack(m, len(chunks), dtype) if t != me else
                                   [(j, state[j]) for j in chunks]):
                    parts[j].append(entries)
            for j in chunks:
                state[j] = self._sum(j, parts[j], dtype)
