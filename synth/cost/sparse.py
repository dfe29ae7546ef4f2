"""Predicted seconds of sparse all-reduce programs, and the crossover density.

Bytes. A partition (chunk) of ``s = n / k`` slots whose entries sum the sets
of ``c`` ranks, each of density ``D`` with independent uniform indices, holds
``s (1 - (1 - D)^c)`` entries in expectation (an index is absent only if it is
absent from all ``c`` sets). It travels in the format
:func:`~synth.synthesis.hashing.choose_format` picks for that expectation:
``entries x (4 + value bytes)`` (coo), ``ceil(s / 8) + entries x value bytes``
(hash bitmap) or ``s x value bytes`` (dense). Contributor counts per device and
partition come from running the program's trace (the dense semantics: the same
chunk lists, summed where the dense step sums).

Time. Each sparse step is priced with the per-link machinery of the dense
steps (:mod:`synth.cost.predict`), every group of the step at once:

* PartitionSum (alltoallv): the dense ReduceScatter step of the largest
  member's bytes (both move ``(m - 1) / m`` of a member's data to the others;
  at density 1, where every partition falls back to dense, the two are the
  same step and cost the same);
* GatherPartitions, GatherSum (allgatherv): the dense AllGather step of
  ``members x`` the largest member's bytes (a ring all-gather is paced by its
  largest block);
* GatherSumRoot (gatherv): the dense Reduce step of ``members x`` the largest
  member's bytes (an upper bound: the root receives ``members - 1`` of them);
* BroadcastSet: the dense Broadcast step of the root's bytes;

plus ``merge_s_per_byte`` per byte a member receives (decoding and summing;
0 by default: communication only, see docs/sparse.md).

Skewed indices overlap more than independent uniform ones, so their unions
are smaller: the expectation above is an upper bound for them.

The dense default is the one-call all-reduce of the dense ``n x value
bytes`` buffer (:func:`~synth.cost.predict.default_program`); the crossover
density is where the best sparse program's prediction meets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import SynthError
from ..synthesis.hashing import Encoding, choose_format, format_bytes
from ..synthesis.language import Collective, Program
from ..synthesis.lowering import trace
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal
from ..synthesis.sparse import check_density
from .model import Model
from .predict import Predictor, group_members, shared_step_cost


def expected_entries(slots: float, density: float, contributors: int) -> float:
    """Entries of a partition of ``slots`` slots summing ``contributors``
    independent sets of ``density``: ``slots (1 - (1 - D)^c)``."""
    return slots * -math.expm1(contributors * math.log1p(-density)) if density < 1 else float(slots)


@dataclass(frozen=True)
class SparseSpec:
    """What a sparse all-reduce moves: ``n`` positions per rank (the dense
    buffer has ``n x value_bytes``), ``density`` per rank, the index encoding,
    and the receive-side cost per byte (seconds)."""

    n: int
    density: float
    value_bytes: int = 4
    encoding: Encoding = Encoding.COO
    merge_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        check_density(self.density)
        if self.n < 1:
            raise SynthError(f"--size: a sparse all-reduce needs at least one {self.value_bytes}-byte value per rank")

    @property
    def dense_bytes(self) -> int:
        return self.n * self.value_bytes

    def partition_bytes(self, k: int, contributors: int) -> float:
        """Expected wire bytes of one of ``k`` partitions summing ``contributors`` sets."""
        slots = self.n / k
        entries = expected_entries(slots, self.density, contributors)
        fmt = choose_format(self.encoding, entries, slots, self.value_bytes)
        return format_bytes(fmt, entries, slots, self.value_bytes)

    def at(self, density: float) -> "SparseSpec":
        return SparseSpec(self.n, density, self.value_bytes, self.encoding, self.merge_s_per_byte)


@dataclass(frozen=True)
class SparseStepBytes:
    """One step of a sparse program on one reduction group: the sparse step's
    collective and, per synthesis group, the largest member's bytes in the step
    (``send_bytes``: for PartitionSum, GatherSum and GatherSumRoot all it holds
    of the group's partitions, its own part included, as a dense step's buffer;
    for GatherPartitions its part; for BroadcastSet the root's) and the bytes
    the busiest member receives."""

    collective: Collective
    send_bytes: tuple[float, ...]
    receive_bytes: tuple[float, ...]


def step_bytes(program: Program, reduction: Reduction, spec: SparseSpec) -> list[SparseStepBytes]:
    """Per step, the expected bytes of the program's sparse form (module docstring)."""
    traced = trace(program, reduction.hierarchy, Goal.ALLREDUCE)
    k = traced.k
    count = np.ones((k, k), dtype=np.int64)  # [device, partition] contributors summed in it
    by_count = {c: spec.partition_bytes(k, c) for c in range(1, k + 1)}
    out = []
    for t in traced.steps:
        collective = t.instruction.collective
        sends, receives = [], []
        updates = []
        for members, runs in zip(t.groups, t.runs):
            chunks = [c for a, b in runs for c in range(a, b)]
            m = len(members)
            if not chunks:
                sends.append(0.0)
                receives.append(0.0)
                continue
            part = max(len(chunks) // m, 1)
            owner = [p // part for p in range(len(chunks))]
            cols = np.asarray(chunks)
            held = count[np.ix_(members, cols)]  # (members, chunks)
            size = np.vectorize(by_count.get, otypes=[float])(held)
            if collective is Collective.REDUCESCATTER:
                mine = np.asarray(owner)[None, :] == np.arange(m)[:, None]
                send = float(size.sum(axis=1).max())  # what it holds of the list, its own part included
                receive = float(max(size[:, mine[i]].sum() - size[i, mine[i]].sum() for i in range(m)))
                total = held.sum(axis=0)
                for position, c in enumerate(chunks):
                    updates.append(((members[owner[position]],), c, int(total[position])))
            elif collective is Collective.ALLGATHER:
                per_member = [float(size[i, [p for p in range(len(chunks)) if owner[p] == i]].sum()) for i in range(m)]
                send = max(per_member)
                receive = sum(per_member) - min(per_member)
                for position, c in enumerate(chunks):
                    updates.append((members, c, int(held[owner[position], position])))
            elif collective is Collective.BROADCAST:
                send = receive = float(size[0].sum())
                for position, c in enumerate(chunks):
                    updates.append((members, c, int(held[0, position])))
            else:  # AllReduce, Reduce: every member's whole list, summed where it lands
                per_member = size.sum(axis=1)
                send = float(per_member.max())
                receive = float(per_member.sum() - per_member.min())
                total = held.sum(axis=0)
                targets = members if collective is Collective.ALLREDUCE else members[:1]
                for position, c in enumerate(chunks):
                    updates.append((targets, c, int(total[position])))
            sends.append(send)
            receives.append(receive)
        for targets, c, value in updates:
            count[list(targets), c] = value
        out.append(SparseStepBytes(collective, tuple(sends), tuple(receives)))
    return out


@dataclass
class SparsePredictor:
    """Predictions of sparse programs of one reduction under one model; step
    costs memoised on (instruction, bytes)."""

    reduction: Reduction
    model: Model = field(default_factory=Model)

    def __post_init__(self) -> None:
        self._dense = Predictor(self.reduction, self.model)
        self._memo: dict[tuple, float] = {}

    def _step_s(self, instruction, collective: Collective, send: tuple[float, ...], members: int) -> float:
        key = (instruction, send)
        seconds = self._memo.get(key)
        if seconds is not None:
            return seconds
        groups = self._dense.global_groups(instruction)
        repeat = len(self.reduction.synthesis_groups)
        per_row = np.repeat(np.asarray(send, dtype=float), repeat)
        keep = per_row > 0
        groups, per_row = groups[keep], per_row[keep]
        if not len(groups):
            seconds = 0.0
        else:
            dense = {Collective.BROADCAST: Collective.BROADCAST, Collective.REDUCE: Collective.REDUCE,
                     Collective.REDUCESCATTER: Collective.REDUCESCATTER}.get(collective, Collective.ALLGATHER)
            nbytes = per_row if dense in (Collective.BROADCAST, Collective.REDUCESCATTER) else per_row * members
            seconds = shared_step_cost(self.reduction.topology, self._dense.profile, self.model.algorithm, dense,
                                        groups, nbytes, self.model.rules_version)[0]
        self._memo[key] = seconds
        return seconds

    def program(self, program: Program, spec: SparseSpec) -> float:
        """Predicted seconds of ``program``'s sparse form under ``spec``."""
        total = 0.0
        for instruction, b in zip(program.instructions, step_bytes(program, self.reduction, spec)):
            members = group_members(instruction, self.reduction.hierarchy)
            total += self._step_s(instruction, b.collective, tuple(round(x) for x in b.send_bytes), members)
            total += spec.merge_s_per_byte * max(b.receive_bytes, default=0.0)
        return total

    def dense_default_s(self, spec: SparseSpec) -> float:
        """The dense default all-reduce of ``n x value_bytes`` per rank."""
        return self._dense.default(Goal.ALLREDUCE, spec.dense_bytes)


@dataclass(frozen=True)
class SparseRanking:
    """Sparse programs of a reduction, fastest predicted first, beside the
    dense default all-reduce and (when given) the best dense program, with the
    crossover densities against each: the density where the best sparse
    program's prediction meets theirs (None: sparse is predicted faster even at
    density 1; 1e-7, the lowest density tried: never faster)."""

    reduction: Reduction
    spec: SparseSpec
    programs: tuple[Program, ...]
    predicted_s: tuple[float, ...]
    dense_default_s: float
    crossover_density: float | None
    dense_best_s: float | None = None
    crossover_best_density: float | None = None

    @property
    def best_s(self) -> float:
        return self.predicted_s[0] if self.programs else math.inf

    @property
    def speedup(self) -> float:
        """Dense default over the best sparse program."""
        return self.dense_default_s / self.best_s if self.best_s > 0 else 1.0


def rank_sparse(reduction: Reduction, programs: Sequence[Program], spec: SparseSpec, model: Model | None = None,
                dense_best_s: float | None = None, crossover_candidates: int = 8) -> SparseRanking:
    """Predict the sparse form of every dense all-reduce program and sort them
    (ties keep the given order); the crossover densities are found by bisection
    (on log D) for the best of the ``crossover_candidates`` fastest programs at
    each density."""
    predictor = SparsePredictor(reduction, model or Model())
    times = [predictor.program(p, spec) for p in programs]
    order = sorted(range(len(programs)), key=lambda i: (times[i], i))
    dense_s = predictor.dense_default_s(spec)
    candidates = [programs[i] for i in order[:crossover_candidates]]
    crossover = crossover_density(predictor, candidates, spec, dense_s) if candidates else None
    best = None
    if dense_best_s is not None and candidates:
        best = crossover_density(predictor, candidates, spec, dense_best_s)
    return SparseRanking(reduction, spec, tuple(programs[i] for i in order), tuple(times[i] for i in order), dense_s,
                         crossover, dense_best_s, best)


def crossover_density(predictor: SparsePredictor, programs: Sequence[Program], spec: SparseSpec,
                      target_s: float, iterations: int = 24) -> float | None:
    """The density at which the best of ``programs`` is predicted as fast as
    ``target_s`` (bisection on log D over [1e-7, 1]; predictions grow with D);
    None if it is faster even at D = 1, 1e-7 if it is never faster."""
    def best(d: float) -> float:
        return min(predictor.program(p, spec.at(d)) for p in programs)

    target_s *= 1 - 1e-9  # equal at density 1 (every partition dense) up to rounding: not faster
    lo, hi = 1e-7, 1.0
    if best(hi) < target_s:
        return None
    if best(lo) >= target_s:
        return lo
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        if best(mid) < target_s:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)
