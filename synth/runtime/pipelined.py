"""Run a chunk-level schedule (the thread blocks of an MSCCL algorithm, see
:mod:`synth.export.msccl`) on one rank with non-blocking point-to-point:
the pipelined execution of a program, as the MSCCL executor would run it.

A :class:`Schedule` is one rank's thread blocks: each a sequential stream of
:class:`Op` with a send peer, a receive peer and a channel. The runner keeps
every stream moving at once on one thread: an operation starts when the
operations it depends on (same rank, other streams) are done; a receive posts
a non-blocking receive from its stream's peer with tag = channel (MPI and
gloo keep messages of one (source, tag) in order, as NCCL keeps one
connection per peer and channel: :class:`MpiLinks`, :class:`TorchLinks`) and
finishes when the data is in; a send posts a non-blocking send of its data
and finishes at once (the data is copied first, so later writes cannot change it; the
requests are completed at the end). Operation semantics are the executor's
step types (``s``: send src; ``r``: dst = received; ``rcs``: dst = received,
send it; ``rrs``: send received + src; ``rrc``: dst = received + src;
``rrcs``: dst = received + src, send it; ``cpy``: dst = src; ``re``: dst += src).

Buffers: ``i`` the input, ``o`` the output (the same array for an in-place
all-reduce), ``s`` scratch; chunk ``c`` of a buffer is elements ``[c q, (c+1)
q)`` with ``q`` = elements per chunk. Nothing here checks the schedule: it is
run only after the XML it comes from passed :mod:`synth.export.msccl_check`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import SynthError

SENDS = frozenset({"s", "rcs", "rrs", "rrcs"})
RECEIVES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})


@dataclass(frozen=True)
class Op:
    """One step of a stream: type, source and destination (buffer, first
    chunk), chunk count, and the (stream, step) pairs it waits for."""

    type: str
    src: tuple[str, int]
    dst: tuple[str, int]
    count: int
    waits: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Stream:
    """One thread block: its send and receive peers (gpu ids, -1: none), its
    channel (the message tag) and its operations in order."""

    send: int
    recv: int
    channel: int
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Schedule:
    """One rank's streams, and the chunks per loop of the algorithm (the
    buffer is cut into ``chunks`` equal chunks) and scratch chunks needed."""

    streams: tuple[Stream, ...]
    chunks: int
    scratch_chunks: int


class _Running:
    """One stream's progress."""

    __slots__ = ("stream", "pc", "request", "inbox")

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.pc = 0
        self.request: Any = None
        self.inbox: np.ndarray | None = None


class MpiLinks:
    """Point-to-point on an mpi4py communicator whose ranks are the schedule's gpu ids."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.comm, self.MPI = comm, MPI

    def irecv(self, array: np.ndarray, peer: int, tag: int) -> Any:
        return self.comm.Irecv(array, source=peer, tag=tag)

    def isend(self, array: np.ndarray, peer: int, tag: int) -> Any:
        return self.comm.Isend(array, dest=peer, tag=tag)

    def done(self, request: Any) -> bool:
        return bool(request.Test())

    def wait_any(self, requests: list[Any]) -> None:
        self.MPI.Request.Waitany(requests)

    def wait_all(self, requests: list[Any]) -> None:
        self.MPI.Request.Waitall(requests)


class TorchLinks:
    """Point-to-point with torch.distributed (gloo, CPU tensors sharing the
    numpy arrays' memory) among ``group``: gpu id ``g`` is global rank
    ``group[g]``."""

    def __init__(self, group: Sequence[int]) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.group = torch, dist, tuple(group)

    def irecv(self, array: np.ndarray, peer: int, tag: int) -> Any:
        return self.dist.irecv(self.torch.from_numpy(array), src=self.group[peer], tag=tag)

    def isend(self, array: np.ndarray, peer: int, tag: int) -> Any:
        return self.dist.isend(self.torch.from_numpy(array), dst=self.group[peer], tag=tag)

    def done(self, request: Any) -> bool:
        return bool(request.is_completed())

    def wait_any(self, requests: list[Any]) -> None:
        requests[0].wait()  # torch has no wait-any: the oldest pending receive

    def wait_all(self, requests: list[Any]) -> None:
        for request in requests:
            request.wait()


def run(schedule: Schedule, links: Any, input_: np.ndarray, output: np.ndarray, scratch: np.ndarray | None = None,
        chunk_len: int | None = None) -> None:
    """Run ``schedule`` on this rank over ``links`` (:class:`MpiLinks`,
    :class:`TorchLinks`, or an mpi4py communicator). ``input_``/``output``:
    contiguous 1-d arrays (the same object in place); ``chunk_len``: elements
    per chunk (default: the larger buffer over ``schedule.chunks``)."""
    if not hasattr(links, "wait_any"):  # an mpi4py communicator
        links = MpiLinks(links)
    if chunk_len is None:
        chunk_len = max(input_.size, output.size) // schedule.chunks
    if scratch is None and schedule.scratch_chunks:
        scratch = np.empty(schedule.scratch_chunks * chunk_len, dtype=output.dtype)
    buffers = {"i": input_, "o": output, "s": scratch}

    def view(place: tuple[str, int], count: int) -> np.ndarray:
        buf, first = place
        return buffers[buf][first * chunk_len:(first + count) * chunk_len]

    running = [_Running(s) for s in schedule.streams]
    sends: list[Any] = []
    kept: list[np.ndarray] = []  # what the sends read, alive until they complete
    left = sum(len(s.ops) for s in schedule.streams)
    while left:
        moved = False
        for r in running:
            while r.pc < len(r.stream.ops):
                op = r.stream.ops[r.pc]
                if any(running[t].pc <= step for t, step in op.waits):
                    break
                received = None
                if op.type in RECEIVES:
                    if r.request is None:
                        r.inbox = np.empty(op.count * chunk_len, dtype=output.dtype)
                        r.request = links.irecv(r.inbox, r.stream.recv, r.stream.channel)
                    if not links.done(r.request):
                        break
                    r.request, received = None, r.inbox
                data = _apply(op, received, view)
                if op.type in SENDS:  # a view of a buffer is copied: later steps may overwrite it
                    message = data.copy() if op.type in ("s", "rrcs") else data
                    kept.append(message)
                    sends.append(links.isend(message, r.stream.send, r.stream.channel))
                r.pc += 1
                left -= 1
                moved = True
        if not moved:
            pending = [r.request for r in running if r.request is not None]
            if not pending:
                raise SynthError("pipelined schedule: no stream can move and none waits for data (dependencies "
                                 "form a cycle); the schedule was not checked")
            links.wait_any(pending)  # block until a receive lands, then give it its turn
    links.wait_all(sends)


def _apply(op: Op, received: np.ndarray | None, view) -> np.ndarray | None:
    """Do ``op``'s local work; return what it sends (None if nothing)."""
    kind = op.type
    if kind == "s":
        return view(op.src, op.count)
    if kind == "r":
        view(op.dst, op.count)[...] = received
        return None
    if kind == "rcs":
        view(op.dst, op.count)[...] = received
        return received
    if kind == "rrs":
        return received + view(op.src, op.count)
    if kind in ("rrc", "rrcs"):
        dst = view(op.dst, op.count)
        np.add(received, view(op.src, op.count), out=dst)
        return dst if kind == "rrcs" else None
    if kind == "cpy":
        view(op.dst, op.count)[...] = view(op.src, op.count)
        return None
    if kind == "re":
        dst = view(op.dst, op.count)
        dst += view(op.src, op.count)
        return None
    if kind == "nop":
        return None
    raise SynthError(f"pipelined schedule: unknown operation type '{kind}'")


def pad_to(length: int, chunks: int) -> int:
    """The smallest multiple of ``chunks`` at least ``length``."""
    return -(-length // chunks) * chunks


def allreduce(schedule: Schedule, links: Any, buffer: np.ndarray) -> None:
    """An in-place all-reduce of ``buffer`` over ``links`` (see :func:`run`;
    any length: run on a zero-padded copy when ``schedule.chunks`` does not
    divide it)."""
    n = buffer.size
    padded = pad_to(n, schedule.chunks)
    if padded == n and buffer.flags.c_contiguous:
        run(schedule, links, buffer, buffer)
        return
    work = np.zeros(padded, dtype=buffer.dtype)
    work[:n] = buffer.reshape(-1)
    run(schedule, links, work, work)
    buffer.reshape(-1)[...] = work[:n]
