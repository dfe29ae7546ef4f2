"""The planner's search: interleaving tried on uneven stages under
``--schedule search``, the variants of a (sizes, micro-batch) skipped by their
bound without changing the pick, and the ``--stages uneven`` advice when pp
divides no layer count asked for."""

from __future__ import annotations

from dataclasses import replace

from synth.cli import main
from synth.planner.schedules import Schedule
from synth.planner.configurations import _evaluate, _placements, _schedules, _variants, plan_job
from synth.planner.request import JobRequest
from synth.planner.stepmodel import Configuration, Training, configuration_problem
from synth.planner.modelspec import parse_inline_model
from synth.synthesis.placement import parse_axis_ranges
from synth.topology import load_topology


def _request(**kw) -> JobRequest:
    topology = load_topology("dgx-h100").scaled({"node": 2})
    model = parse_inline_model("layers=30,hidden=1024,heads=8,seq=512,vocab=1000")
    base = dict(axes=parse_axis_ranges("tp,dp,pp"), stages="uneven", schedule="search")
    base.update(kw)
    return JobRequest(topology, topology.device, model, Training(64), **base)


def test_schedule_search_interleaves_uneven_stages():
    request = _request()
    config = Configuration(1, 4, 4, 1, stage_layers=(7, 8, 8, 7))
    schedules = {(c.schedule, c.virtual_stages) for c in _schedules(request, config)}
    # the virtual stages dividing the 8 layers of the middle stages, at most the 7 of the smallest stage
    assert {(Schedule.INTERLEAVED, 2), (Schedule.INTERLEAVED, 4)} <= schedules
    assert (Schedule.INTERLEAVED, 8) not in schedules
    assert {(Schedule.ONE_F_ONE_B, 1), (Schedule.ZERO_BUBBLE, 1)} <= schedules


def test_skipping_variants_by_their_bound_keeps_the_pick_of_every_sizes_and_micro_batch():
    request = _request(micro_batches=(1, 2))
    solution = plan_job(request)
    assert solution.candidates
    for kept in solution.candidates:
        config = replace(kept.config, schedule=Schedule.ONE_F_ONE_B, virtual_stages=1, stage_layers=())
        placements = _placements(request.topology, kept.placement.axes, ())  # every variant on every placement
        every = [_evaluate(request, solution.costs, v, request.training, placements)
                 for v in _variants(request, config) if not configuration_problem(request.model, request.training, v)]
        best = min((not c.feasible, c.predicted_step_s) for c in every)
        assert (not kept.feasible, kept.predicted_step_s) == best


def test_sizes_refused_because_pp_does_not_divide_the_layers_suggest_uneven_stages(capsys):
    argv = ["plan", "--topology", "dgx-h100", "--scale", "node=4", "--model", "llama3-405b", "--global-batch", "16",
            "--axes", "tp=8,dp=1,pp=4", "--no-verify"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "pp=4 does not divide the model's layers (126); --stages uneven lets pp not divide the layers" in err
    assert main(argv + ["--stages", "uneven"]) == 2  # it plans, and nothing fits in 32 GPUs
    err = capsys.readouterr().err
    assert err.startswith("synth-reduce: error: no configuration fits in ") and "--stages uneven" not in err
