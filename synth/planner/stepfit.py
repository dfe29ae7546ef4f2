"""Learn the job planner's compute-efficiency curve from step-time records.

For each record (:mod:`synth.planner.steprecords`) the step model (:mod:`synth.planner.stepmodel`)
is inverted: with the record's communication predicted by the cost model on its
placement (each collective with its best program, as the planner does), the
compute time of one micro-batch that makes the predicted step equal the
measured one, less the passes priced apart at the device's memory bandwidth
(an unfused attention's softmax and dropout, :mod:`synth.planner.scores`; the
layers' other elementwise passes, the embedding's and the loss's,
:mod:`synth.planner.curvepasses`), gives the
efficiency the run implies, ``F_mb / (peak x t_mb)``, at its per-layer work
``x``. :func:`synth.planner.compute.fit_curve` then fits
``efficiency(x)`` to those points. The fit is as good as the communication
model: a fitted communication profile (``--profile``) makes it better.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..cost import Model, NetworkProfile
from ..errors import SynthError
from .collectivecosts import CollectiveCosts
from .compute import ComputeModel, CurveFit, fit_curve
from .curvepasses import bandwidth_passes_s
from .operations import OperationProfile
from .stagecompute import micro_batch_fixed_s
from .stepmodel import compute_estimate, micro_batch_seconds_for, step_shape, step_time
from .steprecords import StepRecord


@dataclass(frozen=True)
class Implied:
    """What a record implies: its per-layer work and sustained efficiency."""

    record: StepRecord
    flops_per_layer: float
    efficiency: float


class RecordCosts:
    """:class:`~synth.planner.collectivecosts.CollectiveCosts` per (topology, algorithm), shared by
    the records that ran there."""

    def __init__(self, profile: NetworkProfile | None = None, profile_path: str | None = None) -> None:
        self.profile = profile
        self.profile_path = profile_path
        self._costs: dict[tuple, CollectiveCosts] = {}

    def of(self, record: StepRecord) -> CollectiveCosts:
        key = (record.topology, record.algo)
        if key not in self._costs:
            model = Model.load(record.algo) if self.profile is None else Model(
                Model.load(record.algo).algorithm, self.profile, self.profile_path)
            self._costs[key] = CollectiveCosts(record.topology, model)
        return self._costs[key]


def implied(records: Sequence[StepRecord], costs: RecordCosts | None = None) -> list[Implied]:
    costs = costs or RecordCosts()
    out = []
    for r in records:
        where = f"step record (line {r.line})" if r.line else "step record"
        collectives = costs.of(r).on(r.placement)
        t = micro_batch_seconds_for(r.model, r.training, r.config, collectives, r.step_s, where)
        shape = step_shape(r.model, r.training, r.config)
        t -= bandwidth_passes_s(r.model, r.training, r.config, shape.layers_per_stage, r.device)  # priced apart
        if t <= 0:
            raise SynthError(f"{where}: the measured step is not longer than the predicted communication and "
                             "bandwidth-bound passes; check the record or the device's memory_bandwidth_GBps")
        out.append(Implied(r, shape.flops_per_layer, shape.flops_per_micro_batch / (r.device.peak_flops * t)))
    return out


def fit_compute(records: Sequence[StepRecord], costs: RecordCosts | None = None,
                source: str = "") -> tuple[CurveFit, list[Implied]]:
    """The efficiency curve fitted to ``records`` and the points it was fitted to."""
    points = implied(records, costs)
    fit = fit_curve([p.flops_per_layer for p in points], [p.efficiency for p in points], source)
    return fit, points


def predicted_step_s(record: StepRecord, compute: ComputeModel, costs: RecordCosts | None = None) -> float:
    """The step model's prediction for a record's configuration and placement."""
    costs = costs or RecordCosts()
    shape = step_shape(record.model, record.training, record.config)
    estimate = compute_estimate(record.model, record.training, record.config, record.device, compute, shape)
    return step_time(record.model, record.training, record.config, costs.of(record).on(record.placement),
                     estimate.micro_batch_s, estimate.efficiency, shape, estimate.optimizer_s,
                     accumulate_s=estimate.accumulate_s).total_s


def fit_micro_batch_cost(records: Sequence[StepRecord], profile: OperationProfile,
                         costs: RecordCosts | None = None) -> OperationProfile:
    """``profile`` with its fixed cost per micro-batch fitted to step records:
    the mean over records of the micro-batch time each implies (the step model
    inverted, its optimizer step and communication predicted) less the
    profile's operations, at least 0 (least squares for a constant)."""
    costs = costs or RecordCosts()
    fixed = micro_batch_fixed_s(profile)
    gaps = []
    for r in records:
        where = f"step record (line {r.line})" if r.line else "step record"
        estimate = compute_estimate(r.model, r.training, r.config, r.device, profile)
        implied_s = micro_batch_seconds_for(r.model, r.training, r.config, costs.of(r).on(r.placement), r.step_s,
                                            where, estimate.optimizer_s + estimate.accumulate_s)
        gaps.append(implied_s - (estimate.micro_batch_s - fixed))
    if not gaps:
        raise SynthError("fit: no step records to fit the fixed cost per micro-batch to")
    return replace(profile, micro_batch_s=max(0.0, sum(gaps) / len(gaps)))
