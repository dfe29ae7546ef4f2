"""Whole-job placement: rank placements by the total predicted time of a workload.

A workload is a list of reductions a training step performs, e.g.
``dp:allreduce:1GiB,mp:allreduce:64MiB*48`` (axes, goal, bytes per device,
repetitions; several reduction axes are joined with ``+``: ``dp+mp:allreduce:1M``).
For a placement, each reduction uses its best predicted program; the placement's
cost is the sum over items of ``repetitions x best time``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from ..cost import Model, Ranked, rank
from ..errors import SynthError
from ..synthesis.placement import Axis, Placement
from ..synthesis.reduction import Reduction
from ..synthesis.search import synthesize_reduction
from ..synthesis.semantics import Goal
from ..units import MAX_REPEATS, bounded_int, parse_size, shortened


@dataclass(frozen=True)
class WorkloadItem:
    reduce_axes: tuple[str, ...]
    goal: Goal
    size_bytes: int
    repetitions: int = 1

    def __str__(self) -> str:
        reps = f"*{self.repetitions}" if self.repetitions != 1 else ""
        return f"{'+'.join(self.reduce_axes)}:{self.goal.value}:{self.size_bytes}{reps}"

    def on(self, placement: Placement) -> Reduction:
        """This item's reduction on ``placement``."""
        return Reduction(placement, self.reduce_axes, self.goal)


def parse_workload(spec: str, axes: Sequence[Axis]) -> tuple[WorkloadItem, ...]:
    """Parse ``AXES:GOAL:SIZE[*REPS],...``; errors name the item and the fix."""
    declared = [a.name for a in axes]
    items = []
    for item in (s.strip() for s in spec.split(",")):
        m = re.fullmatch(r"([\w+]+):(\w+):([^*]+)(?:\*(\d+))?", item)
        if not m:
            raise SynthError(
                f"--workload '{item}': expected AXES:GOAL:SIZE[*REPS], e.g. dp:allreduce:1GiB or mp:allreduce:64MiB*48"
            )
        names = m.group(1).split("+")
        for name in names:
            if name not in declared:
                raise SynthError(f"--workload '{item}': unknown axis '{name}'; declared axes are {', '.join(declared)}")
        try:
            goal = Goal(m.group(2).lower())
        except ValueError:
            raise SynthError(
                f"--workload '{item}': unknown collective '{m.group(2)}'; use one of {', '.join(g.value for g in Goal)}"
            ) from None
        if m.group(4) is not None and not m.group(4).lstrip("0"):
            raise SynthError(f"--workload '{item}': repetitions must be >= 1")
        reps = bounded_int(m.group(4) or "1", f"--workload '{shortened(item, 50)}': repetitions", MAX_REPEATS)
        items.append(WorkloadItem(tuple(a for a in declared if a in names), goal, parse_size(m.group(3), "--workload"), reps))
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
    per_item = [
        [rank(synthesize_reduction(item.on(p), max_steps), item.size_bytes, model) for p in placements]
        for item in workload
    ]
    costs = [PlacementCost(p, i, tuple(ranks[i] for ranks in per_item)) for i, p in enumerate(placements)]
    costs.sort(key=lambda c: (c.total_s(workload) if all(r.order for r in c.items) else math.inf, c.index))
    return costs
