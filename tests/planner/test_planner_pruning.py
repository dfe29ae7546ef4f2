"""What the planner skips or computes once (synth.planner.pruning): the step
priced with each collective at its cheapest placement bounds every
placement's step from below, the variants it skips never hold the pick, and
a configuration's shape and compute do not depend on its schedule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.planner import pruning
from synth.planner.compute import DEFAULT_COMPUTE, shipped_profile_for
from synth.planner.configurations import _evaluate, _placements, _variants, plan_job
from synth.planner.modelspec import parse_inline_model
from synth.planner.request import JobRequest
from synth.planner.pruning import cheapest_step_bound_s
from synth.planner.schedules import Schedule
from synth.planner.stepmodel import (
    Configuration,
    Sharding,
    Training,
    compute_estimate,
    configuration_problem,
    step_shape,
    step_time,
)
from synth.synthesis.placement import parse_axis_ranges
from synth.topology import load_topology


def _request(model=None, **kw) -> JobRequest:
    topology = load_topology("dgx-h100").scaled({"node": 4})
    model = model or parse_inline_model("layers=30,hidden=1024,heads=8,kv_heads=2,seq=4096,vocab=1000,gated_mlp=true,"
                                        "ffn=2816")
    base = dict(axes=parse_axis_ranges("tp,cp,dp,pp"), stages="uneven", schedule="search", micro_batches=(1, 2))
    base.update(kw)
    return JobRequest(topology, topology.device, model, Training(64, sharding=Sharding.ZERO1), **base)


def test_the_cheapest_collectives_bound_every_placements_step_from_below():
    request = _request()
    solution = plan_job(request)
    checked = 0
    for kept in solution.candidates[:12]:
        base = replace(kept.config, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1, stage_layers=())
        placements = _placements(request.topology, kept.placement.axes, ())
        for variant in _variants(request, base):
            if configuration_problem(request.model, request.training, variant):
                continue
            shape = step_shape(request.model, request.training, variant)
            compute = compute_estimate(request.model, request.training, variant, request.device, request.compute,
                                       shape)
            on = [solution.costs.on(p) for p in placements]
            bound = cheapest_step_bound_s(request.model, request.training, variant, on, shape, compute)
            steps = [step_time(request.model, request.training, variant, c, compute.micro_batch_s,
                               compute.efficiency, shape, compute.optimizer_s, None, True,
                               compute.accumulate_s).total_s for c in on]
            assert bound <= min(steps)
            checked += 1
    assert checked >= 12


MOE = ("layers=8,hidden=512,heads=8,seq=1024,vocab=1000,gated_mlp=true,ffn=1408,experts=16,top_k=4,expert_ffn=256,"
       "max_nodes=2")


@pytest.mark.parametrize("moe", [False, True])
def test_variants_skipped_by_the_cheapest_bound_never_hold_the_pick(monkeypatch, moe):
    """With node-limited routing the all-to-all's size is the placement's (the
    nodes its expert-parallel group spans): no variant is skipped then."""
    request = _request(model=parse_inline_model(MOE), axes=parse_axis_ranges("tp,ep,dp,pp")) if moe else _request()
    skipped = []
    beaten = pruning.variant_beaten

    def counting(*args):
        out = beaten(*args)
        skipped.append((out, args[4].ep))  # (skipped, the variant's ep)
        return out

    monkeypatch.setattr("synth.planner.configurations.variant_beaten", counting)
    solution = plan_job(request)
    assert any(out for out, _ in skipped)  # the bound skips variants here
    if moe:  # but none whose step reads the placement: with ep > 1, node-limited routing's all-to-all size
        assert any(ep > 1 for _, ep in skipped) and not any(out and ep > 1 for out, ep in skipped)
    for kept in solution.candidates:
        config = replace(kept.config, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1, stage_layers=())
        placements = _placements(request.topology, kept.placement.axes, ())  # every variant on every placement
        every = [_evaluate(request, solution.costs, v, request.training, placements)
                 for v in _variants(request, config) if not configuration_problem(request.model, request.training, v)]
        assert (not kept.feasible, kept.predicted_step_s) == min((not c.feasible, c.predicted_step_s) for c in every)


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("compute", ["curve", "operations"])
def test_shape_and_compute_do_not_depend_on_the_schedule(compute, moe):
    """What lets every schedule of a stage layout share one estimate
    (pruning.LayoutEstimates)."""
    request = _request(model=parse_inline_model(MOE)) if moe else _request()
    model, training = request.model, request.training
    profile = DEFAULT_COMPUTE if compute == "curve" else shipped_profile_for("h100-sxm5-80gb")
    for layout in ((), (1, 3, 3, 1) if moe else (7, 8, 8, 7)):
        base = Configuration(2, 2, 4, 2, stage_layers=layout, ep=2) if moe else Configuration(
            2, 2, 4, 2, stage_layers=layout, cp=2)
        variants = [replace(base, schedule=Schedule.ZERO_BUBBLE), replace(base, virtual_stages=2)]
        want_shape = step_shape(model, training, base)
        want_compute = compute_estimate(model, training, base, request.device, profile, want_shape)
        for variant in variants:
            assert step_shape(model, training, variant) == want_shape
            assert compute_estimate(model, training, variant, request.device, profile, want_shape) == want_compute
