"""The time of an unfused attention's score passes in the compute
models (synth/planner/scores.py): bytes counted by hand from Megatron-LM's
passes (SC'21-era ParallelAttention: causal fused softmax, PyTorch's fused
dropout with a uint8 mask), flash attention adding nothing, recomputation
running the forward's passes again, the fit subtracting the term, the error
for a device without a memory bandwidth, and the per-operation model's
pricing of the same passes at its elementwise rate."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from helpers import usage_error
from planner_cases import TINY

from synth.errors import SynthError
from synth.planner.compute import EfficiencyCurve, shipped_profile_for
from synth.planner.request import JobRequest
from synth.planner.scores import unfused_score_bytes, unfused_score_s
from synth.planner.stepfit import RecordCosts, fit_compute, predicted_step_s
from synth.planner.stepmodel import Configuration, Training, compute_estimate
from synth.planner.steprecords import StepRecord
from synth.planner.activations import Recompute
from synth.planner.modelspec import load_model, parse_inline_model
from synth.synthesis.placement import Axis, AxisRange, enumerate_placements
from synth.topology import Device, load_topology

CURVE = EfficiencyCurve(0.5, 1e9, "test")
DEVICE = Device("test GPU", 80.0, 312.0, memory_bandwidth_GBps=2000.0)


def kernels_by_hand(b: int, heads: int, s: int, w: int = 2) -> tuple[int, int, int, int]:
    """Bytes of the softmax forward, dropout forward, dropout backward and
    softmax backward over one layer's ``b x heads`` score matrices of ``s x s``
    values of ``w`` bytes: the causal softmax reads row r's first r + 1 values
    and writes all s of them; dropout reads a value and writes a value plus a
    1-byte mask, its backward reads the gradient and the mask and writes the
    gradient; the softmax backward reads the gradient and the saved output in
    the causal part and writes the whole row. The GEMMs' reads and writes are
    not counted."""
    matrices = b * heads
    causal = sum(r + 1 for r in range(s))  # values per matrix the causal kernels read
    full = s * s
    softmax_forward = w * causal + w * full
    dropout_forward = w * full + w * full + 1 * full
    dropout_backward = w * full + 1 * full + w * full
    softmax_backward = w * causal + w * causal + w * full
    return tuple(matrices * k for k in (softmax_forward, dropout_forward, dropout_backward, softmax_backward))


def passes_by_hand(b: int, heads: int, s: int, w: int = 2) -> tuple[int, int]:
    """(forward, backward) bytes of :func:`kernels_by_hand`."""
    kernels = kernels_by_hand(b, heads, s, w)
    return kernels[0] + kernels[1], kernels[2] + kernels[3]


def test_the_score_passes_by_hand_for_a_small_configuration():
    model = parse_inline_model("layers=3,hidden=64,heads=4,seq=8,vocab=100")
    config = Configuration(tp=2, dp=1, pp=1, micro_batch=2)
    forward, backward = passes_by_hand(2, 4 // 2, 8)  # two heads per tensor-parallel rank
    plain = Training(4, "fp16", attention="unfused")
    assert unfused_score_bytes(model, plain, config, 3) == pytest.approx(3 * (forward + backward), rel=1e-12)
    assert unfused_score_s(model, plain, config, 3, DEVICE) == pytest.approx(3 * (forward + backward) / 2000e9)
    # full recomputation runs the forward's passes once more; selective recomputes the attention core: the same
    for recompute in (Recompute.FULL, Recompute.SELECTIVE):
        again = replace(plain, recompute=recompute)
        assert unfused_score_bytes(model, again, config, 3) == pytest.approx(3 * (2 * forward + backward), rel=1e-12)
    # fp32 values: four bytes a value, the mask still one byte
    forward32, backward32 = passes_by_hand(2, 2, 8, w=4)
    fp32 = replace(plain, dtype="fp32")
    assert unfused_score_bytes(model, fp32, config, 3) == pytest.approx(3 * (forward32 + backward32), rel=1e-12)


def test_flash_attention_adds_nothing_and_needs_no_bandwidth():
    model = load_model(TINY)
    config = Configuration(tp=1, dp=8, pp=1, micro_batch=2)
    no_bandwidth = Device("bare", 80.0, 312.0)
    flash = Training(64, "fp16")
    assert unfused_score_bytes(model, flash, config, model.layers) == 0
    compute_estimate(model, flash, config, no_bandwidth, CURVE)  # no error: the curve alone
    base = compute_estimate(model, flash, config, DEVICE, CURVE).micro_batch_s
    unfused = compute_estimate(model, replace(flash, attention="unfused"), config, DEVICE, CURVE)
    expected = model.layers * sum(passes_by_hand(2, model.heads, model.seq))  # no recomputation: once each
    # and the context's layout copy the unfused attention makes (synth/planner/curvepasses.py): read, write
    expected += model.layers * 2 * 2 * (2 * model.seq * model.hidden)
    assert unfused.micro_batch_s - base == pytest.approx(expected / 2000e9, rel=1e-9)


def test_the_fit_subtracts_the_passes_and_recovers_a_known_curve():
    """Records made by the step model with a known curve and unfused attention:
    the fit recovers the curve only if it prices the passes apart."""
    truth = EfficiencyCurve(0.5, 4e9, "truth")
    topology = load_topology("dgx-a100").scaled({"node": 2})
    costs = RecordCosts()
    training = Training(64, "fp16", recompute=Recompute.FULL, attention="unfused", sequence_parallel=False)
    records = []
    for tp, b in itertools.product((1, 2, 8), (1, 4)):
        placement = enumerate_placements(topology, (Axis("tp", tp), Axis("dp", 16 // tp)))[0]
        record = StepRecord(load_model(TINY), training, placement, Configuration(tp, 16 // tp, 1, b), 1.0)
        records.append(replace(record, step_s=predicted_step_s(record, truth, costs)))
    fit, _ = fit_compute(records, costs)
    assert fit.profile.efficiency_max == pytest.approx(0.5, rel=1e-6)
    assert fit.profile.half_flops == pytest.approx(4e9, rel=1e-5)


def test_a_device_without_bandwidth_is_refused_for_unfused_attention_on_the_curve(cli):
    topology = load_topology("dgx-a100")
    bare = replace(topology.device, memory_bandwidth_GBps=None)
    unfused = Training(64, "fp16", attention="unfused")
    axes = (AxisRange("tp"), AxisRange("dp"))
    with pytest.raises(SynthError, match="has no memory_bandwidth_GBps"):
        JobRequest(topology, bare, load_model(TINY), unfused, axes, compute=CURVE)
    # a flash attention, or the per-operation model (its elementwise rate prices the passes), needs none
    JobRequest(topology, bare, load_model(TINY), replace(unfused, attention="flash"), axes, compute=CURVE)
    JobRequest(topology, bare, load_model(TINY), unfused, axes, compute=shipped_profile_for("h100-sxm5-80gb"))
    message = usage_error(cli, "plan", "--topology", "dgx-a100", "--model", TINY, "--global-batch", "64",
                          "--attention", "unfused", "--device", "memory_GiB=80,peak_TFLOPs=312")
    assert message.startswith("--attention unfused: device 'device' has no memory_bandwidth_GBps")
    assert "--device (...,memory_bandwidth_GBps=2039)" in message


def test_the_per_operation_model_prices_each_pass_at_its_elementwise_rate():
    """With a per-operation profile each pass is one kernel at the profile's
    ``add`` bandwidth, above its floor; no datasheet bandwidth is needed."""
    profile = shipped_profile_for("h100-sxm5-80gb")
    model = parse_inline_model("layers=4,hidden=512,heads=8,seq=1024,vocab=1000")
    config = Configuration(tp=2, dp=1, pp=1, micro_batch=2)
    bare = Device("bare", 80.0, 989.4)
    flash = Training(8, "bf16", recompute=Recompute.FULL)
    base = compute_estimate(model, flash, config, bare, profile).micro_batch_s
    unfused = compute_estimate(model, replace(flash, attention="unfused"), config, bare, profile).micro_batch_s
    softmax_f, dropout_f, dropout_b, softmax_b = kernels_by_hand(2, 8 // 2, 1024)
    add = profile.elementwise.of("add")
    kernels = (softmax_f, dropout_f, dropout_b, softmax_b, softmax_f, dropout_f)  # the forward's again (full)
    expected = 4 * sum(max(add.floor_s, k / profile.elementwise.bandwidth_Bps) for k in kernels)
    assert all(k / profile.elementwise.bandwidth_Bps > add.floor_s for k in kernels)  # the bytes decide
    assert unfused - base == pytest.approx(expected, rel=1e-9)
