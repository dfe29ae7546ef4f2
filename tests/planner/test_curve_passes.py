"""The efficiency curve's bandwidth-bound passes (synth/planner/curvepasses.py):
bytes counted by hand, kernel by kernel, from the SC'21-era Megatron-LM layer
(fused LayerNorms, the QKV bias added after its GEMM, the context's layout
copy, the fused bias-GeLU and bias-dropout-add, the split's backward), the
embedding and the vocabulary-parallel loss; full recomputation running the
forward's again; the curve's prediction adding them at the datasheet
bandwidth, the per-operation model not (it prices its own); the fit
subtracting them."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from synth.planner.activations import Recompute
from synth.planner.compute import EfficiencyCurve, shipped_profile_for
from synth.planner.curvepasses import curve_pass_bytes, layer_pass_bytes
from synth.planner.modelspec import parse_inline_model
from synth.planner.stepfit import RecordCosts, fit_compute, predicted_step_s
from synth.planner.stepmodel import Configuration, Training, compute_estimate
from synth.planner.steprecords import StepRecord
from synth.synthesis.placement import Axis, enumerate_placements
from synth.topology import Device, load_topology

GPT = "layers=2,hidden=64,heads=4,seq=32,vocab=100,dropout=0.1"  # 4h GeLU MLP, biases, LayerNorm, learned positions
DEVICE = Device("test GPU", 80.0, 312.0, memory_bandwidth_GBps=2000.0)
BARE = Device("test GPU", 80.0, 312.0)


def sc21_layer_by_hand(T: int, h: int, t: int) -> tuple[int, int]:
    """Bytes of one layer's kernels, (forward, backward without
    recomputation), fp16, T tokens on the device, hidden h, 4h MLP, tensor
    parallel t, dropout on, unfused attention."""
    f = 4 * h
    forward = [
        2 * T * h + 2 * T * h,  # input LayerNorm: read, write
        2 * (3 * T * h // t) * 2,  # QKV output += bias: read, write
        2 * (T * h // t) * 2,  # context permute(...).contiguous(): read, write
        (2 + 2 + 2 + 1) * T * h,  # bias-dropout-add: read x and residual, write out and the uint8 mask
        2 * T * h + 2 * T * h,  # post-attention LayerNorm
        2 * (T * f // t) * 2,  # bias-GeLU: read, write
        (2 + 2 + 2 + 1) * T * h,  # bias-dropout-add after the MLP
    ]
    backward = [
        (2 + 1 + 2) * T * h + 2 * T * h,  # MLP branch: grad x mask, then the bias's sum
        (2 + 2 + 2) * (T * f // t) + 2 * (T * f // t),  # bias-GeLU backward; the bias's sum
        (2 + 2) * 2 * T * h + 2 * T * h,  # post-attention LayerNorm: dout and input read twice, grad written
        (2 + 2 + 2) * T * h,  # the two gradients of the residual stream added
        (2 + 1 + 2) * T * h + 2 * T * h,  # attention branch
        2 * 2 * (3 * T * h // t) + 2 * (3 * T * h // t),  # split's backward (cat), the QKV bias's sum
        (2 + 2) * 2 * T * h + 2 * T * h,  # input LayerNorm
        (2 + 2 + 2) * T * h,  # the layer input's two gradients added
    ]
    return sum(forward), sum(backward)


def sc21_outer_by_hand(T: int, h: int, V: int, t: int) -> int:
    """Embedding (word and position gathers, their add, torch.nn.Dropout),
    final LayerNorm and Megatron's loss on fp32 logits, forward and backward."""
    embedding = 4 * T * h + 4 * T * h + 6 * T * h + 5 * T * h + (5 * T * h + 2 * T * h + 2 * T * h)
    norm = 4 * T * h + 10 * T * h
    logits = T * V // t
    loss = (2 + 4 + 4 + 8 + 8 + 4 + 8) * logits + (8 + 6) * logits  # cast, max, sub_, exp_, sum, div_; mul_, cast
    return embedding + norm + loss


def test_the_sc21_layer_and_model_by_hand():
    model = parse_inline_model(GPT)
    config = Configuration(tp=2, dp=1, pp=1, micro_batch=2)
    training = Training(2, "fp16", recompute=Recompute.FULL, attention="unfused", sequence_parallel=False,
                        cross_entropy="megatron")
    forward, backward = sc21_layer_by_hand(2 * 32, 64, 2)
    assert layer_pass_bytes(model, training, config) == (forward, backward + forward)  # recomputed forward
    plain = replace(training, recompute=Recompute.NONE)
    assert layer_pass_bytes(model, plain, config) == (forward, backward)
    assert layer_pass_bytes(model, replace(training, recompute=Recompute.SELECTIVE), config) == (forward, backward)
    outer = sc21_outer_by_hand(64, 64, 100, 2)
    assert curve_pass_bytes(model, training, config, 2) == 2 * (2 * forward + backward) + outer
    # with pipeline stages the embedding's and the head's passes are spread over them, as the curve's FLOPs are
    staged = replace(config, pp=2)
    assert curve_pass_bytes(model, training, staged, 1) == pytest.approx(2 * forward + backward + outer / 2)


def test_the_curve_adds_the_passes_at_the_datasheet_bandwidth_and_the_operation_model_does_not():
    model = parse_inline_model(GPT)
    config = Configuration(tp=2, dp=1, pp=1, micro_batch=2)
    training = Training(2, "fp16", recompute=Recompute.FULL, sequence_parallel=False)  # flash: no score passes
    curve = EfficiencyCurve(0.5, 1e9, "test")
    with_bandwidth = compute_estimate(model, training, config, DEVICE, curve).micro_batch_s
    without = compute_estimate(model, training, config, BARE, curve).micro_batch_s
    assert with_bandwidth - without == pytest.approx(curve_pass_bytes(model, training, config, 2) / 2000e9, rel=1e-9)
    profile = shipped_profile_for("h100-sxm5-80gb")  # prices its own elementwise passes: not twice
    assert (compute_estimate(model, training, config, DEVICE, profile).micro_batch_s
            == compute_estimate(model, training, config, BARE, profile).micro_batch_s)


def test_the_fit_subtracts_the_passes_and_recovers_a_known_curve():
    """Records made by the step model with a known curve: the fit recovers
    it only if it takes these passes out before fitting."""
    truth = EfficiencyCurve(0.5, 4e9, "truth")
    topology = load_topology("dgx-a100").scaled({"node": 2})
    assert topology.device.memory_bandwidth_GBps  # the passes are priced on it
    costs = RecordCosts()
    training = Training(64, "fp16", recompute=Recompute.FULL, sequence_parallel=False)
    model = parse_inline_model("layers=4,hidden=256,heads=8,seq=128,vocab=1000,dropout=0.1")
    records = []
    for tp, b in itertools.product((1, 2, 8), (1, 4)):
        placement = enumerate_placements(topology, (Axis("tp", tp), Axis("dp", 16 // tp)))[0]
        record = StepRecord(model, training, placement, Configuration(tp, 16 // tp, 1, b), 1.0)
        records.append(replace(record, step_s=predicted_step_s(record, truth, costs)))
    fit, _ = fit_compute(records, costs)
    assert fit.profile.efficiency_max == pytest.approx(0.5, rel=1e-6)
    assert fit.profile.half_flops == pytest.approx(4e9, rel=1e-5)
