"""``synth-reduce bench --density D``: time sparse all-reduce programs against
the dense default all-reduce of the same placement, and check every result.

Per placement: the dense all-reduce programs are synthesized, their sparse
forms ranked by the cost model (:func:`synth.cost.sparse.rank_sparse`), and
the ``top`` predicted fastest are timed beside the dense default (one
AllReduce of the dense ``n``-value buffer, the same gradient scattered into
it). Each rank draws its own sparse gradient (density ``D``, uniform or
Zipf-skewed indices, integer values, seeded by rank); the ranks all-gather the
inputs once and compute the expected dense sum with numpy, independently of
any program. ``#wrong`` counts positions where a result differs from it (summed
over ranks and iterations, checked after the timed loop). A sparse program is timed from (indices, values)
in to (indices, values) out (grouped by partition, not sorted), its partitioning and merging included; times are
the max over ranks per iteration; median, min and max are printed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..cost.model import Model
from ..cost.predict import default_program
from ..cost.sparse import SparseSpec, rank_sparse
from ..errors import SynthError
from ..synthesis.hashing import Encoding, HashPartition
from ..synthesis.lowering import lower
from ..synthesis.problem import ProblemSpec
from ..synthesis.search import synthesize_reduction
from ..synthesis.semantics import Goal
from ..synthesis.sparse import Skew, check_density, format_sparse, sparse_indices, sparse_values
from ..units import format_seconds, format_size
from .executor import Executor


@dataclass(frozen=True)
class SparseBenchRequest:
    problem: ProblemSpec
    density: float
    skew: Skew
    encoding: Encoding
    sizes: tuple[int, ...]
    placement: int | None = None
    top: int = 3
    iters: int = 5
    warmup: int = 1
    dtype: str = "float32"
    algo: str = "mpi"


@dataclass(frozen=True)
class SparseRow:
    placement: int
    program: str  # sparse text, or "dense default"
    size_bytes: int
    predicted_s: float
    times_s: tuple[float, ...]
    wrong: int
    sent_bytes: int = 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


def _timed(world: Any, fn: Callable[[], Any], wrong: Callable[[Any], int], iters: int,
           warmup: int) -> tuple[tuple[float, ...], int]:
    """Per-iteration times (max over ranks) and ``wrong`` of each timed result,
    computed after its iteration's clock stopped (summed over ranks and iterations)."""
    times, wrongs = [], 0
    for iteration in range(warmup + iters):
        world.barrier()
        start = world.wtime()
        out = fn()
        elapsed = world.wtime() - start
        if iteration >= warmup:
            times.append(elapsed)
            wrongs += wrong(out)
    everyone = world.allgather((times, wrongs))
    return tuple(max(t[i] for t, _ in everyone) for i in range(iters)), sum(w for _, w in everyone)


def run_sparse_bench(world: Any, request: SparseBenchRequest, out: Callable[[str], None] = print) -> list[SparseRow]:
    """The benchmark (module docstring), collective over the world; rank 0 prints."""
    check_density(request.density)
    problem = request.problem.build()
    if world.size != problem.topology.num_devices:
        raise SynthError(f"the topology has {problem.topology.num_devices} devices but {world.size} ranks run; "
                         f"start {problem.topology.num_devices} ranks (mpiexec -n {problem.topology.num_devices})")
    model = Model.load(request.algo)
    dtype = np.dtype(request.dtype)
    placements = problem.placements()
    chosen = range(len(placements)) if request.placement is None else [request.placement]
    say = out if world.rank == 0 else (lambda _: None)
    say(f"sparse-allreduce bench: density {request.density:g}, indices {request.skew}, encoding "
        f"{request.encoding.value}, {dtype.name}, {world.size} ranks, {request.iters} iterations (median of max over "
        f"ranks); #wrong = positions differing from the numpy dense sum")
    header = f"{'#':>3} {'size':>9} {'median':>11} {'min':>11} {'max':>11} {'predicted':>11} {'vs dense':>8} " \
             f"{'#wrong':>7}  program"
    say(header)
    say("-" * len(header))
    rows: list[SparseRow] = []
    for index in chosen:
        reduction = problem.reduction(placements[index])
        result = synthesize_reduction(reduction, problem.max_steps)
        default = lower(default_program(Goal.ALLREDUCE), reduction)
        for size in request.sizes:
            n = max(size // dtype.itemsize, 1)
            spec = SparseSpec(n, request.density, dtype.itemsize, request.encoding)
            ranking = rank_sparse(reduction, result.programs, spec, model)
            rng = np.random.default_rng((7, world.rank, size))
            idx = sparse_indices(n, request.density, request.skew, rng)
            val = sparse_values(len(idx), rng, dtype)
            inputs = world.allgather((idx, val))
            expected = np.zeros(n, dtype=np.float64)
            for d in next(g for g in default.reduction_groups if world.rank in g):
                expected[inputs[d][0]] += inputs[d][1]
            # the dense default
            host_in = np.zeros(n, dtype=dtype)
            host_in[idx] = val
            dense_in = world.xp.asarray(host_in)  # the world's buffers (torch tensors under --backend torch)
            executor = Executor(default, world)
            buffer = world.xp.empty_like(dense_in)
            buffer[...] = dense_in
            executor(buffer, check=True)

            def dense() -> Any:
                buffer[...] = dense_in
                executor(buffer, check=False)
                world.synchronize()
                return buffer

            times, wrong = _timed(world, dense, lambda b: int((_host(b) != expected).sum()), request.iters,
                                  request.warmup)
            rows.append(SparseRow(index, "dense default (AllReduce(root, inside))", size, ranking.dense_default_s,
                                  times, wrong))
            dense_median = rows[-1].median_s
            say(_row(index, rows[-1], dense_median))
            partition = HashPartition(n, reduction.hierarchy.sizes)
            for program, predicted in list(zip(ranking.programs, ranking.predicted_s))[:request.top]:
                sparse = _SparseRun(lower(program, reduction), world, partition, request.encoding, idx, val, expected)
                times, wrong = _timed(world, sparse, sparse.wrong, request.iters, request.warmup)
                rows.append(SparseRow(index, format_sparse(program, " ; "), size, predicted, times, wrong,
                                      sparse.executor.sent_bytes))
                say(_row(index, rows[-1], dense_median))
            say(f"{'':>3} placement {index} at {format_size(size)}: predicted crossover density "
                f"{'> 1' if ranking.crossover_density is None else f'{ranking.crossover_density:.3g}'} against the "
                f"dense default")
    return rows


def _host(buffer: Any) -> np.ndarray:
    """A world's buffer as a numpy array (torch tensors are copied to the host)."""
    return buffer.cpu().numpy() if hasattr(buffer, "cpu") else np.asarray(buffer)


class _SparseRun:
    def __init__(self, lowered, world, partition, encoding, idx, val, expected) -> None:
        from .sparse import SparseExecutor

        self.executor = SparseExecutor(lowered, world, partition, encoding)
        self.idx, self.val, self.expected = idx, val, expected

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        return self.executor.run(self.idx, self.val, ordered=False)

    def wrong(self, result: tuple[np.ndarray, np.ndarray]) -> int:
        """Positions where ``result`` differs from the dense sum."""
        got_idx, got_val = result
        got = np.zeros(len(self.expected), dtype=np.float64)
        got[got_idx] = got_val
        return int((got != self.expected).sum())


def _row(index: int, row: SparseRow, dense_median_s: float) -> str:
    ratio = dense_median_s / row.median_s if row.median_s > 0 else float("inf")
    return (f"{index:>3} {format_size(row.size_bytes):>9} {format_seconds(row.median_s):>11} "
            f"{format_seconds(min(row.times_s)):>11} {format_seconds(max(row.times_s)):>11} "
            f"{format_seconds(row.predicted_s):>11} {ratio:>7.2f}x {row.wrong:>7}  {row.program}")
