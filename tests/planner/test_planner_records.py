"""Step records (round trip, bad input) and the compute-curve fit learned
from them: a known curve recovered, the shipped default is the fit of the
Megatron records."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from planner_cases import REPO, TINY

from synth.cli import main
from synth.errors import SynthError
from synth.planner.activations import Recompute
from synth.planner.compute import DEFAULT_COMPUTE, EfficiencyCurve, fit_curve, load_compute_profile
from synth.planner.modelspec import load_model
from synth.planner.stepfit import RecordCosts, fit_compute, predicted_step_s
from synth.planner.stepmodel import Configuration, Training
from synth.planner.steprecords import StepRecord, read_step_records, write_step_records
from synth.synthesis.placement import Axis, enumerate_placements
from synth.topology import load_topology


# ================================================================ step records and the fit


def test_step_records_round_trip_and_the_fit_recovers_a_known_curve(tmp_path):
    truth = EfficiencyCurve(0.5, 4e9, "truth")
    topology = load_topology("dgx-a100").scaled({"node": 2})
    costs = RecordCosts()
    records = []
    for tp, b in itertools.product((1, 2, 8), (1, 4)):
        axes = (Axis("tp", tp), Axis("dp", 16 // tp))
        placement = enumerate_placements(topology, axes)[0]
        record = StepRecord(load_model(TINY), Training(64), placement, Configuration(tp, 16 // tp, 1, b), 1.0)
        records.append(StepRecord(record.model, record.training, placement, record.config,
                                  predicted_step_s(record, truth, costs)))
    path = tmp_path / "steps.jsonl"
    write_step_records(path, records)
    again = read_step_records(path)
    assert [(r.config, r.placement.matrix, r.step_s) for r in again] == [
        (r.config, r.placement.matrix, r.step_s) for r in records]
    fit, points = fit_compute(again, costs)
    assert fit.profile.efficiency_max == pytest.approx(0.5, rel=1e-6)
    assert fit.profile.half_flops == pytest.approx(4e9, rel=1e-5)
    assert [p.efficiency for p in points] == pytest.approx([truth.efficiency(p.flops_per_layer) for p in points])
    # the command line: fit, then plan with the fitted curve
    assert main(["fit", str(path), "-o", str(tmp_path / "compute.json")]) == 0
    fitted = load_compute_profile(tmp_path / "compute.json")
    assert fitted.half_flops == pytest.approx(4e9, rel=1e-5)
    assert main(["plan", "--topology", "dgx-a100", "--scale", "node=2", "--model", TINY, "--global-batch", "64",
                 "--compute-profile", str(tmp_path / "compute.json"), "--no-verify"]) == 0


def test_fit_curve_keeps_efficiency_below_peak_and_never_rising_as_gemms_shrink():
    flat = fit_curve([1e12, 2e12, 4e12], [0.6, 0.5, 0.4])  # efficiency falling with x: no knee
    assert flat.profile.half_flops == 0 and 0.4 < flat.profile.efficiency_max < 0.6
    capped = fit_curve([1e9, 1e12], [0.99, 1.0])
    assert capped.profile.efficiency_max <= 1


def test_default_compute_is_the_fit_of_the_megatron_records():
    """Stale when the default communication model changes: regenerate with
    python scripts/megatron_sc21.py fit, then update synth/planner/compute.py."""
    fit, _ = fit_compute(read_step_records(REPO / "data" / "megatron_sc21_steps.jsonl"))
    assert fit.profile.efficiency_max == pytest.approx(DEFAULT_COMPUTE.efficiency_max, rel=1e-9)
    assert fit.profile.half_flops == pytest.approx(DEFAULT_COMPUTE.half_flops, abs=1.0)


def test_megatron_records_derive_from_table_1():
    """Each record: the table's configuration and step_s = the paper's FLOPs /
    (TFLOP/s x GPUs), computed here from the transcribed row."""
    rows = [json.loads(x) for x in (REPO / "data" / "megatron_sc21.jsonl").read_text().splitlines() if x]
    records = read_step_records(REPO / "data" / "megatron_sc21_steps.jsonl")
    assert len(records) == len(rows) == 10
    for row, r in zip(rows, records):
        B, s, L, h, V = row["batch_size"], row["seq_length"], row["layers"], row["hidden_size"], row["vocab_size"]
        flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        assert r.step_s == pytest.approx(flops / (row["tflops_per_gpu"] * 1e12 * row["gpus"]), rel=1e-12)
        assert (r.config.tp, r.config.pp, r.config.dp, r.config.micro_batch) == (
            row["tp"], row["pp"], row["dp"], row["micro_batch_size"])
        assert r.training.recompute is Recompute.FULL and r.training.global_batch == B
        assert r.training.overlap_dp == (row["script_ddp_impl"] == "torch")
        assert r.model.training_flops(B, Recompute.FULL).total == pytest.approx(flops, rel=1e-12)
        assert r.topology.num_devices == row["gpus"] and r.device.peak_TFLOPs == 312
        # Megatron's rank order: tensor parallel ranks are consecutive, then data, then pipeline
        mesh = r.placement.mesh
        names = r.placement.axis_names
        order = np.transpose(mesh, [names.index("pp"), names.index("dp"), names.index("tp")]).ravel()
        assert np.array_equal(order, np.arange(row["gpus"]))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(schema="x"), 'not a synth-reduce step record (expected "schema": "synth-reduce/step")'),
    (lambda d: d.update(version=9), "step record version 9 is not supported"),
    (lambda d: d.pop("step_s"), "missing field(s) step_s"),
    (lambda d: d.update(step_s=-1), "'step_s' must be a positive number"),
    (lambda d: d["model"].update(colour=1), "unknown model field 'colour'"),
    (lambda d: d["training"].update(recompute="some"), "training.recompute some: choose one of"),
    (lambda d: d["topology"].pop("device"), "the topology has no 'device'"),
    (lambda d: d.update(micro_batch=7), "--global-batch 64 is not divisible by dp x micro-batch"),
])
def test_bad_step_records(tmp_path, change, message):
    placement = enumerate_placements(load_topology("dgx-a100").scaled({"node": 2}),
                                     (Axis("tp", 2), Axis("dp", 8)))[0]
    record = StepRecord(load_model(TINY), Training(64), placement, Configuration(2, 8, 1, 1), 1.0)
    doc = record.to_dict()
    change(doc)
    path = tmp_path / "steps.jsonl"
    path.write_text("\n" + json.dumps(doc) + "\n")
    with pytest.raises(SynthError) as info:
        read_step_records(path)
    assert str(info.value).startswith(f"{path}:2: ") and message in str(info.value), str(info.value)


def test_step_records_carry_sequence_parallelism(tmp_path):
    placement = enumerate_placements(load_topology("dgx-a100").scaled({"node": 2}),
                                     (Axis("tp", 2), Axis("dp", 8)))[0]
    for flag in (True, False):
        record = StepRecord(load_model(TINY), Training(64, sequence_parallel=flag), placement,
                            Configuration(2, 8, 1, 1), 1.0)
        path = tmp_path / "steps.jsonl"
        write_step_records(path, [record])
        assert read_step_records(path)[0].training.sequence_parallel is flag
    doc = record.to_dict()
    del doc["training"]["sequence_parallel"]  # absent: the planner's default
    path.write_text(json.dumps(doc) + "\n")
    assert read_step_records(path)[0].training.sequence_parallel is True
    doc["training"]["sequence_parallel"] = "no"
    path.write_text(json.dumps(doc) + "\n")
    with pytest.raises(SynthError, match="'training.sequence_parallel' must be true or false"):
        read_step_records(path)
