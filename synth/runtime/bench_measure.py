"""The measurements of ``bench`` and ``tune``: each rank's data, the timing of
one candidate at one size, and the loop over a set's candidates and sizes.

Timing: a barrier, then each iteration timed with the world's clock on every
rank; an iteration's time is the maximum over ranks (:func:`measure`). Every
timed iteration starts from the same integer-valued input (:func:`rank_data`),
and its result is compared with the reduction computed from the reduction
groups alone: ``wrong`` counts wrong elements, summed over ranks and
iterations. For example, rank 2 of an all-reduce over ranks ``(0, 2)`` holds
``(i + 14) mod span - span/2`` at element ``i`` and expects the sum of that and
rank 0's ``i mod span - span/2``, exact in the dtype.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..cost.nccl_log import Capture, LoggedChoice, parse, summarize
from ..cost.records import Record
from ..errors import SynthError
from ..synthesis.lowering import LoweredProgram
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal
from .bench_setup import EXACT_INTEGERS, BenchCandidate
from .executor import Executor, World, piece_length


def bus_factor(goal: Goal, group_size: int) -> float:
    """busbw / algbw as in nccl-tests: 2(n-1)/n for all-reduce, (n-1)/n else."""
    n = group_size
    return (2 if goal is Goal.ALLREDUCE else 1) * (n - 1) / n


# ---------------------------------------------------------------- the data


@dataclass(frozen=True)
class RankData:
    """One rank's input, the expected result and the part of it the goal defines."""

    input: Any
    expected: Any
    checked: slice


def rank_data(lowered: LoweredProgram, rank: int, count: int, dtype: np.dtype) -> RankData:
    """Integer-valued data whose sums are exact in ``dtype``: rank ``d`` holds
    ``(i + 7d) mod span - span/2`` at element ``i``. For allgather only the
    rank's own shard holds data (the rest is the out-of-range value ``span``)."""
    k = lowered.num_chunks
    group = next(g for g in lowered.reduction_groups if rank in g)
    r = group.index(rank)
    span = max(2, min(1000, EXACT_INTEGERS[dtype.name] // k))
    index_type = np.int32 if count + 7 * max(group) + span < 2**31 else np.int64
    base = np.arange(count, dtype=index_type) % span

    def values(device: int) -> np.ndarray:
        return (base + 7 * device) % span - span // 2

    q = piece_length(count, k)
    shard = [slice(s * q, min((s + 1) * q, count)) for s in range(k)]
    if lowered.goal is Goal.ALLGATHER:
        data = np.full(count, span, dtype=index_type)
        data[shard[r]] = values(rank)[shard[r]]
        expected = np.empty(count, dtype=index_type)
        for s, device in enumerate(group):
            expected[shard[s]] = values(device)[shard[s]]
        checked = slice(0, count)
    else:
        data = values(rank)
        expected = sum(values(device) for device in group)
        checked = shard[r] if lowered.goal is Goal.REDUCESCATTER else slice(0, count)
    return RankData(data.astype(dtype), expected.astype(dtype), checked)


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Timing:
    """One candidate timed at one size."""

    candidate: BenchCandidate
    size_bytes: int
    count: int
    times_s: tuple[float, ...]  # per iteration, the slowest rank
    wrong: int
    nccl_choices: tuple[LoggedChoice, ...] = ()  # what rank 0's NCCL log said it ran (NCCL only)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def algbw_GBps(self) -> float:
        return self.size_bytes / self.median_s / 1e9 if self.median_s > 0 else float("inf")

    def record(self, backend: str, dtype: str, ranks: int, nccl_version: str | None = None) -> Record:
        """The measurement record ``fit`` and ``validate`` read."""
        c = self.candidate
        return Record(c.reduction, c.lowered.program, self.size_bytes, self.median_s, is_default=c.is_default,
                      backend=backend, algo=None, dtype=dtype, ranks=ranks, times_s=self.times_s,
                      min_s=min(self.times_s), max_s=max(self.times_s), wrong=self.wrong,
                      nccl_version=nccl_version, nccl_choices=self.nccl_choices)


def measure(world: World, executor: Executor, data: RankData, iters: int, warmup: int) -> tuple[tuple[float, ...], int]:
    """Per-iteration times (max over ranks) and wrong elements (sum over ranks
    and iterations). Collective over the world."""
    xp = world.xp
    buffer = xp.empty_like(data.input)
    buffer[...] = data.input
    executor(buffer, check=True)  # once, collectively checked
    times, wrong = [], 0
    for iteration in range(warmup + iters):
        buffer[...] = data.input
        world.synchronize()
        world.barrier()
        start = world.wtime()
        executor(buffer, check=False)
        world.synchronize()
        elapsed = world.wtime() - start
        if iteration >= warmup:
            times.append(elapsed)
            wrong += int((buffer[data.checked] != data.expected[data.checked]).sum())
    everyone = world.allgather((times, wrong))
    return tuple(max(t[i] for t, _ in everyone) for i in range(iters)), sum(w for _, w in everyone)


def nccl_log_of(world: World, capture: Capture | None) -> Capture | None:
    """The capture of NCCL's tuning log that this rank reads after each
    timing: rank 0's, on a world that runs on NCCL; None elsewhere."""
    on_nccl = getattr(world, "nccl_version", None) is not None
    return capture if capture is not None and world.rank == 0 and on_nccl else None


def time_set(world: World, candidates: Sequence[BenchCandidate], sizes: Sequence[int], dtype: np.dtype,
             iters: int, warmup: int, log: Capture | None = None,
             executors: Sequence[Any] | None = None) -> Iterator[Timing]:
    """Collective: every candidate of one set (:func:`~synth.runtime.bench_setup.candidate_sets`:
    one placement and reduction, so one data layout) timed at every size, size
    by size, each :class:`Timing` as soon as it is measured. ``executors``
    (default: an :class:`Executor` per candidate) run the candidates; ``log``
    (:func:`nccl_log_of`) is read after each timing."""
    executors = [Executor(c.lowered, world) for c in candidates] if executors is None else executors
    first = candidates[0].lowered
    for size in sizes:
        count = size // dtype.itemsize
        data = rank_data(first, world.rank, count, dtype)
        data = RankData(world.xp.asarray(data.input), world.xp.asarray(data.expected), data.checked)
        for c, executor in zip(candidates, executors):
            times, wrong = measure(world, executor, data, iters, warmup)
            lines = log.read() if log is not None else []
            yield Timing(c, size, count, times, wrong, summarize(parse(lines)))


# ---------------------------------------------------------------- pipelined schedules


PIPELINED_MARK = "~p"  # label suffix of a candidate timed as its pipelined schedule
Pipeliner = Callable[[Reduction, LoweredProgram, int], Any]


class _PipelinedRun:
    """A candidate's pipelined schedule, called like an Executor."""

    def __init__(self, schedule: Any, comm: Any) -> None:
        self.schedule, self.comm = schedule, comm

    def __call__(self, buffer: Any, check: bool = False) -> None:
        from .pipelined import allreduce

        allreduce(self.schedule, self.comm, buffer)


def with_pipelined(candidates: Sequence[BenchCandidate], world: World,
                   pipeliner: Pipeliner) -> tuple[list[BenchCandidate], list[Any]]:
    """The candidates and their executors (collectively built, in order), each
    non-default all-reduce followed by itself run as its pipelined schedule
    (label + PIPELINED_MARK)."""
    executors = [Executor(c.lowered, world) for c in candidates]
    out_c, out_e = [], []
    for c, executor in zip(candidates, executors):
        out_c.append(c)
        out_e.append(executor)
        if c.is_default or c.reduction.goal is not Goal.ALLREDUCE:
            continue
        groups = [tuple(int(d) for d in g) for g in c.reduction.reduction_groups]
        member = next(g.index(world.rank) for g in groups if world.rank in g)
        try:  # the same file on every rank: every rank gets the same schedule or the same refusal
            schedule = pipeliner(c.reduction, c.lowered, member)
        except SynthError as exc:
            print(f"# {c.label}: no pipelined schedule ({exc})", flush=True)
            continue
        out_c.append(dataclasses.replace(c, label=c.label + PIPELINED_MARK))
        out_e.append(_PipelinedRun(schedule, world.mpi_split(groups)))
    return out_c, out_e
