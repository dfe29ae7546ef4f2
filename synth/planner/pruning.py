"""What :func:`~synth.planner.configurations.plan_job` skips, and what it
computes once, without changing what it picks.

* :func:`variant_beaten`: the step model never shortens a step when a
  collective costs more (every term is a sum, a maximum or a positive multiple
  of collective seconds; :func:`~synth.planner.stepmodel.step_lower_bound_s`
  relies on the same property). So the step priced with every collective at
  the cheapest of its placements' prices (:class:`CheapestCollectives`), less
  its data-parallel term (at least 0), is at most the variant's step on each
  placement: when it is above the best variant kept for the (sizes,
  micro-batch), no placement of this variant can rank first, and the planner
  does not evaluate it. Where the step model reads the placement itself (the
  nodes an expert-parallel group spans, which set its all-to-all's size;
  HSDP's group sizes) a least price is no bound, and no variant is skipped.
* :class:`LayoutEstimates`: a configuration's step shape and compute estimate
  depend on its stage layout, not on its pipeline schedule
  (``tests/planner/test_planner_pruning.py`` checks it), so the variants of
  one layout (every schedule and number of virtual stages) share one of each.
* :class:`Skipped`: why size assignments or micro-batches were not evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..synthesis.semantics import Goal
from ..topology import Device
from .collectives import Collectives
from .compute import ComputeModel
from .schedules import Schedule
from .stepmodel import (
    ComputeEstimate,
    Configuration,
    Sharding,
    StepShape,
    Training,
    compute_estimate,
    step_shape,
    step_without_dp_s,
)
from .transformer import Transformer


class PlacementDependent(Exception):
    """The step model asked :class:`CheapestCollectives` what only a placement says."""


class CheapestCollectives:
    """:class:`~synth.planner.collectives.Collectives` whose every price is the
    least of ``placements``' prices for it (each a placement's collectives).
    Its kernels hold no SMs (no placement's share is lower, and the step
    never shortens as a share grows: the bound holds). It stands for no one
    placement: asking for an axis's ``size`` or ``nodes`` raises
    :class:`PlacementDependent`."""

    def __init__(self, placements: Sequence[Collectives]) -> None:
        self.placements = placements

    def sm_share(self, axis: str, goal: Goal, size_bytes: int) -> float:
        return 0.0

    def size(self, axis: str) -> int:
        raise PlacementDependent

    def nodes(self, axis: str) -> int:
        raise PlacementDependent

    def reduce(self, axis: str, goal: Goal, size_bytes: int) -> float:
        return min(p.reduce(axis, goal, size_bytes) for p in self.placements)

    def send(self, axis: str, size_bytes: int) -> float:
        return min(p.send(axis, size_bytes) for p in self.placements)

    def alltoall(self, axis: str, size_bytes: int) -> float:
        return min(p.alltoall(axis, size_bytes) for p in self.placements)


def cheapest_step_bound_s(model: Transformer, training: Training, config: Configuration,
                          placements: Sequence[Collectives], shape: StepShape, compute: ComputeEstimate) -> float:
    """A lower bound of ``config``'s step on each of ``placements``: the step
    without its data-parallel term with every other collective at its
    cheapest over them (module docstring)."""
    return step_without_dp_s(model, training, config, CheapestCollectives(placements), shape, compute)


def variant_beaten(best: Any, infeasible: bool, model: Transformer, training: Training, config: Configuration,
                   costs: Any, placements: Sequence[Any], shape: StepShape, compute: ComputeEstimate) -> bool:
    """Whether no placement of the variant ``config`` can rank before
    ``best`` (a :class:`~synth.planner.configurations.Candidate`):
    ``(infeasible, cheapest_step_bound_s) > (not best.feasible,
    best.predicted_step_s)``, its collectives priced as
    :func:`~synth.planner.configurations._evaluate` would price them (the
    library's defaults when it fits nowhere). Never under HSDP, whose memory,
    and so feasibility and pricing, is the placement's."""
    if training.sharding is Sharding.HSDP:
        return False
    collectives = [costs.on(p, infeasible) for p in placements]
    try:
        bound = cheapest_step_bound_s(model, training, config, collectives, shape, compute)
    except PlacementDependent:  # the step depends on the placement beyond its prices: no bound
        return False
    return (infeasible, bound) > (not best.feasible, best.predicted_step_s)


class LayoutEstimates:
    """:func:`~synth.planner.stepmodel.step_shape` and
    :func:`~synth.planner.stepmodel.compute_estimate` of configurations, each
    computed once per (configuration less its schedule, training): one
    planning run's memo, dropped with the object."""

    def __init__(self, model: Transformer, device: Device, compute: ComputeModel) -> None:
        self.model, self.device, self.compute = model, device, compute
        self._found: dict[tuple[Configuration, Training], tuple[StepShape, ComputeEstimate]] = {}

    def of(self, training: Training, config: Configuration) -> tuple[StepShape, ComputeEstimate]:
        # the shape and compute are a schedule's only under DualPipe (its ranks pair stages)
        schedule = Schedule.DUALPIPE if config.schedule is Schedule.DUALPIPE else Schedule.ONE_F_ONE_B
        key = (replace(config, schedule=schedule, virtual_stages=1), training)
        found = self._found.get(key)
        if found is None:
            shape = step_shape(self.model, training, config)
            found = self._found[key] = (shape, compute_estimate(self.model, training, config, self.device,
                                                                 self.compute, shape))
        return found


class Skipped:
    """Reasons why size assignments or micro-batches were not evaluated: counted
    by kind (sizes left out: 'tp does not divide ...'), the first few kept whole."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: list[str] = []

    def add(self, reason: str) -> None:
        kind = re.sub(r"\b(tp|cp|ep|dp|pp)=\d+", r"\1", reason)
        kind = re.sub(r"= \d+( x \d+)+$", "", kind)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if len(self.first) < 3 and reason not in self.first:
            self.first.append(reason)

    def summary(self) -> tuple[tuple[str, int], ...]:
        return tuple(self.counts.items())

    def examples(self) -> str:
        return "; ".join(self.first) + ("; ..." if sum(self.counts.values()) > len(self.first) else "")
