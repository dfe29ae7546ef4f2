"""Whole-job placement: rank placements by the total predicted time of a workload.

A workload is a list of reductions a training step performs, e.g.
``dp:allreduce:1GiB,mp:allreduce:64MiB*48`` (axes, goal, bytes per device,
repetitions; several reduction axes are joined with ``+``: ``dp+mp:allreduce:1M``).
A sparse all-reduce gives its density after the size:
``dp:sparse-allreduce:256MiB@0.01`` (the size is the dense gradient's, float32
values; its programs are the dense all-reduce's in sparse form,
:mod:`synth.synthesis.sparse`, priced by :mod:`synth.cost.sparse`).
For a placement, each reduction uses its best predicted program; the placement's
cost is the sum over items of ``repetitions x best time``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from ..cost import Model, Ranked, rank
from ..cost.sparse import SparseSpec, rank_sparse
from ..errors import SynthError
from ..synthesis.placement import Axis, Placement
from ..synthesis.reduction import Reduction
from ..synthesis.search import synthesize_reduction
from ..synthesis.semantics import Goal
from ..synthesis.sparse import SPARSE_ALLREDUCE, check_density
from ..units import MAX_REPEATS, bounded_int, parse_size, shortened


@dataclass(frozen=True)
class WorkloadItem:
    reduce_axes: tuple[str, ...]
    goal: Goal
    size_bytes: int
    repetitions: int = 1
    density: float | None = None  # a sparse all-reduce (goal ALLREDUCE: its programs, in sparse form)

    @property
    def sparse(self) -> bool:
        return self.density is not None

    @property
    def collective(self) -> str:
        """The item's collective as written: a goal's name or ``sparse-allreduce``."""
        return SPARSE_ALLREDUCE if self.sparse else self.goal.value

    def __str__(self) -> str:
        reps = f"*{self.repetitions}" if self.repetitions != 1 else ""
        density = f"@{self.density:g}" if self.sparse else ""
        return f"{'+'.join(self.reduce_axes)}:{self.collective}:{self.size_bytes}{density}{reps}"

    def on(self, placement: Placement) -> Reduction:
        """This item's reduction on ``placement``."""
        return Reduction(placement, self.reduce_axes, self.goal)


def parse_workload(spec: str, axes: Sequence[Axis]) -> tuple[WorkloadItem, ...]:
    """Parse ``AXES:GOAL:SIZE[@DENSITY][*REPS],...`` (a density for
    ``sparse-allreduce`` items only); errors name the item and the fix."""
    declared = [a.name for a in axes]
    items = []
    for item in (s.strip() for s in spec.split(",")):
        m = re.fullmatch(r"([\w+]+):([\w-]+):([^*@]+)(?:@([^*]*))?(?:\*(\d+))?", item)
        if not m:
            raise SynthError(
                f"--workload '{item}': expected AXES:GOAL:SIZE[*REPS], e.g. dp:allreduce:1GiB or mp:allreduce:64MiB*48 "
                f"(a sparse all-reduce: dp:{SPARSE_ALLREDUCE}:256MiB@0.01)"
            )
        names = m.group(1).split("+")
        for name in names:
            if name not in declared:
                raise SynthError(f"--workload '{item}': unknown axis '{name}'; declared axes are {', '.join(declared)}")
        collective, density_text = m.group(2).lower(), m.group(4)
        density = None
        if collective == SPARSE_ALLREDUCE:
            if not density_text:
                raise SynthError(f"--workload '{item}': give the sparse gradient's density after the size, e.g. "
                                 f"{m.group(1)}:{SPARSE_ALLREDUCE}:{m.group(3)}@0.01")
            try:
                density = float(density_text)
            except ValueError:
                raise SynthError(f"--workload '{item}': density '{shortened(density_text, 30)}' is not a number; "
                                 "give the fraction of non-zeros per rank in (0, 1], e.g. @0.01") from None
            check_density(density)
            goal = Goal.ALLREDUCE
        else:
            try:
                goal = Goal(collective)
            except ValueError:
                known = ", ".join([g.value for g in Goal] + [SPARSE_ALLREDUCE])
                raise SynthError(f"--workload '{item}': unknown collective '{m.group(2)}'; use one of {known}") from None
            if density_text is not None:
                raise SynthError(f"--workload '{item}': '@{shortened(density_text, 30)}' is the density of a "
                                 f"{SPARSE_ALLREDUCE} item; drop it, or write {m.group(1)}:{SPARSE_ALLREDUCE}:...")
        if m.group(5) is not None and not m.group(5).lstrip("0"):
            raise SynthError(f"--workload '{item}': repetitions must be >= 1")
        reps = bounded_int(m.group(5) or "1", f"--workload '{shortened(item, 50)}': repetitions", MAX_REPEATS)
        items.append(WorkloadItem(tuple(a for a in declared if a in names), goal, parse_size(m.group(3), "--workload"),
                                  reps, density))
    return tuple(items)


@dataclass(frozen=True)
class PlacementCost:
    placement: Placement
    index: int  # enumeration index of the placement
    items: tuple[Ranked, ...]  # aligned with the workload items

    def total_s(self, workload: Sequence[WorkloadItem]) -> float:
        return sum(item.repetitions * r.best_s for item, r in zip(workload, self.items))

    def default_total_s(self, workload: Sequence[WorkloadItem]) -> float:
        return sum(item.repetitions * r.default_s for item, r in zip(workload, self.items))


def placement_costs(
    placements: Sequence[Placement],
    workload: Sequence[WorkloadItem],
    max_steps: int = 5,
    model: Model | None = None,
) -> list[PlacementCost]:
    """Placements sorted by total predicted workload time, fastest first."""
    per_item = [[_ranked(item, p, max_steps, model) for p in placements] for item in workload]
    costs = [PlacementCost(p, i, tuple(ranks[i] for ranks in per_item)) for i, p in enumerate(placements)]
    costs.sort(key=lambda c: (c.total_s(workload) if all(r.order for r in c.items) else math.inf, c.index))
    return costs


def _ranked(item: WorkloadItem, placement: Placement, max_steps: int, model: Model | None) -> Ranked:
    """The item's programs on ``placement``, fastest first. A sparse item's are
    the dense all-reduce programs ranked by their sparse form's prediction
    (float32 values, coo indices), beside the dense default all-reduce."""
    result = synthesize_reduction(item.on(placement), max_steps)
    if not item.sparse:
        return rank(result, item.size_bytes, model)
    assert item.density is not None
    spec = SparseSpec(max(item.size_bytes // 4, 1), item.density)
    ranking = rank_sparse(result.reduction, result.programs, spec, model, crossover_candidates=0)
    index = {program: i for i, program in enumerate(result.programs)}
    return Ranked(result, tuple(index[p] for p in ranking.programs), ranking.predicted_s, ranking.dense_default_s,
                  None)
