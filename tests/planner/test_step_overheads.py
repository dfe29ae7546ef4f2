"""What a step spends outside the layers, per framework (``--framework``):
weight casts per micro-batch, gradient accumulation, the optimizer's bytes
per parameter, the eager loss's backward; and the measured single-GPU steps
of data/calibration/h100-layers.jsonl within 10% median, 20% worst, and
those of h200-layers.jsonl both with the H200's own profile and with the
H100's (the host's cost fitted on the H100's layers)."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from synth.cli import main
from synth.planner.activations import Recompute
from synth.planner.compute import load_compute_profile
from synth.planner.layercompute import layer_compute, layer_launches
from synth.planner.optimes import Shard
from synth.planner.stagecompute import head_compute, stage_compute
from synth.planner.modelspec import load_model
from synth.planner.operations import HostModel
from synth.planner.stepmodel import Configuration, Sharding, Training, compute_estimate
from synth.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
PROFILE = load_compute_profile(str(REPO / "profiles/h100-sxm5-80gb.compute.json"))
DEVICE = load_topology("dgx-h100").device


def moved_s(nbytes: float) -> float:
    return float(PROFILE.elementwise.bytes_seconds(nbytes))


def _estimate(framework: str, micro_batch: int, global_batch: int = 8, **kw):
    model = load_model("gpt3-350m")
    training = Training(global_batch, cross_entropy="eager", framework=framework, **kw)
    return model, compute_estimate(model, training, Configuration(1, 1, 1, micro_batch), DEVICE, PROFILE)


def test_autocast_casts_every_weight_each_micro_batch():
    model, eager = _estimate("eager", 2)
    _, master = _estimate("eager-master", 2)
    # per micro-batch: the fp32 weights cast to bf16 (read 4, write 2) and the bf16 gradients to fp32 (read 2, write 4)
    assert eager.micro_batch_s - master.micro_batch_s == pytest.approx(moved_s(12 * model.parameters), rel=1e-9)


@pytest.mark.parametrize("framework, accumulate, optimizer", [
    ("eager", 12, 28),  # fp32 gradients added (read 4 + 4, write 4); fused AdamW on fp32
    ("eager-master", 6, 6 + 28 + 6),  # bf16 gradients added; cast to fp32, Adam, master copied back
    # accumulation fused into the weight-gradient GEMM; Adam, copy, buffer zeroed, each bucket's NaN check (a norm)
    ("megatron", 0, 28 + 6 + 4 + 4),
])
def test_accumulation_and_optimizer_move_the_framework_bytes(framework, accumulate, optimizer):
    model, estimate = _estimate(framework, 2)  # four micro-batches: three accumulations
    p = model.parameters
    assert estimate.accumulate_s == pytest.approx(moved_s(3 * accumulate * p) if accumulate else 0.0)
    assert estimate.optimizer_s == pytest.approx(moved_s(optimizer * p))
    _, single = _estimate(framework, 8)
    assert single.accumulate_s == 0.0


@pytest.mark.parametrize("framework", ["megatron", "deepseek"])
def test_megatron_checks_and_scales_each_gradient_bucket_before_reducing_it(framework):
    """Megatron-LM's start_grad_sync (param_and_grad_buffer.py at f2e5db402c):
    a norm of each fp32 bucket for its NaN check (read 4 bytes a parameter),
    and with dp > 1 the bucket scaled by 1/dp (read 4, write 4), over the
    device's whole gradient buffer, not its ZeRO shard; DeepSeek-V3's passes
    outside the layers are Megatron-LM's."""
    model = load_model("gpt3-350m")
    p = model.parameters
    training = Training(16, sharding=Sharding.ZERO1, framework=framework, cross_entropy="fused")
    alone = compute_estimate(model, training, Configuration(1, 1, 1, 2), DEVICE, PROFILE)
    sharded = compute_estimate(model, training, Configuration(1, 8, 1, 2), DEVICE, PROFILE)
    adam = 28 - 2 * (8 - (4 if framework == "deepseek" else 8))  # DeepSeek-V3's BF16 moments
    # ZeRO-1 on 8: Adam and the master copy on an eighth; zeroing and the bucket passes on every parameter
    assert alone.optimizer_s == pytest.approx(moved_s((adam + 6) * p + (4 + 4) * p), rel=1e-9)
    assert sharded.optimizer_s == pytest.approx(moved_s((adam + 6) * p / 8 + (4 + 4 + 8) * p), rel=1e-9)
    # fp16 under dynamic loss scaling: Megatron-LM turns the NaN check off, the 1/dp scaling stays
    fp16 = compute_estimate(model, replace(training, dtype="fp16"), Configuration(1, 8, 1, 2), DEVICE, PROFILE)
    assert fp16.optimizer_s == pytest.approx(moved_s((adam + 6) * p / 8 + (4 + 8) * p), rel=1e-9)
    others = compute_estimate(model, replace(training, framework="eager-master", sharding=Sharding.NONE),
                              Configuration(1, 8, 1, 2), DEVICE, PROFILE)
    assert others.optimizer_s == pytest.approx(moved_s((6 + 28 + 6) * p), rel=1e-9)  # no bucket passes


def test_torchtitan_updates_its_shard_and_casts_it_before_each_gather():
    """gpt3-350m (LayerNorm, learned positions, a key head per query head: no
    eager chain of torchtitan's Llama applies, only its kernel launches) under
    FSDP2 on 8 GPUs."""
    model = load_model("gpt3-350m")
    training = Training(16, sharding=Sharding.ZERO3, framework="torchtitan", cross_entropy="eager")
    sharded = compute_estimate(model, training, Configuration(1, 8, 1, 2), DEVICE, PROFILE)
    # the layers, embedding and loss as torchtitan runs them (its kernel launches: this stage is host-bound)
    stage = stage_compute(PROFILE, model, Shard(1, 2, model.seq), model.layers, Recompute.NONE, True, True,
                          loss="eager", torchtitan=True)
    p = model.parameters
    # foreach AdamW on the fp32 shard: weight decay 8, lerp 12, mul 8, addcmul 12, sqrt 8, div 8, add 8, addcdiv 16;
    # gradient clipping: the norm reads each gradient (4), the scaling reads and writes it (8)
    assert sharded.optimizer_s == pytest.approx(moved_s((8 + 12 + 8 + 12 + 8 + 8 + 8 + 16 + 4 + 8) * p / 8))
    # per gather (forward and backward): the fp32 shard cast to bf16 (4 + 2) and copied into the all-gather's
    # input (2 + 2), and every gathered bf16 weight copied out of its output (2 + 2); the bf16 gradients cast to
    # fp32 for the reduce-scatter (2 + 4)
    expected = moved_s(2 * (6 + 4) * p / 8 + 2 * 4 * p + 6 * p)
    assert sharded.micro_batch_s - stage.total_s == pytest.approx(expected, rel=1e-9)


def test_the_eager_loss_backward_moves_22_bytes_a_logit():
    model = load_model("gpt3-350m")
    shard = Shard(1, 2, model.seq)
    logits = 2 * model.seq * model.vocab

    def backward(loss: str) -> float:
        return next(op.seconds for op in head_compute(PROFILE, model, shard, loss).ops if op.name == "loss.backward")

    assert backward("eager") == pytest.approx(moved_s(22 * logits))
    assert backward("fused") == pytest.approx(moved_s(14 * logits))


@pytest.mark.parametrize("recompute", list(Recompute))
def test_a_micro_batch_lasts_the_larger_of_the_gpus_time_and_the_hosts_launches(recompute):
    """The host issues a stage's micro-batch ahead of the GPU (no
    synchronisation inside it): the stage lasts max(GPU operations, launches x
    seconds per launch), not each layer phase's larger one. megatron-1.7b at one
    sequence of 2048 on the H100 profile: each layer's backward is host-bound
    alone, its forward GPU-bound."""
    model, shard = load_model("megatron-1.7b"), Shard(1, 1, 2048)
    forward, backward = layer_launches(model)
    again = {Recompute.NONE: 0, Recompute.FULL: forward, Recompute.SELECTIVE: 2}[recompute]  # attention: 2 kernels
    host = PROFILE.host
    host_s = 24 * ((forward + again) * host.forward_launch_s + backward * host.backward_launch_s)
    gpu_s = stage_compute(replace(PROFILE, host=HostModel()), model, shard, 24, recompute, True, True).total_s
    stage = stage_compute(PROFILE, model, shard, 24, recompute, True, True)
    assert stage.total_s == pytest.approx(max(gpu_s, host_s), rel=1e-12)
    layer = layer_compute(PROFILE, model, shard)
    assert [op.phase for op in layer.ops if op.name == "host_issue"] == ["backward"]  # per phase: bound alone
    assert host_s > gpu_s  # and this stage is host-bound as a whole
    assert [op.name for op in stage.ops].count("host_issue") == 1


def _step_errors(records: str, profile) -> list[float]:
    sys.path.insert(0, str(REPO / "scripts"))
    from layer_accuracy import predict_step

    rows = [json.loads(line) for line in (REPO / "data/calibration" / records).read_text().splitlines()]
    errors = []
    for r in (r for r in rows if r["kind"] == "step"):
        model = replace(load_model(r["model"]), layers=r["layers"], seq=r["seq"])  # as measured
        predicted, _ = predict_step(profile, model, r["micro_batch"], r["global_batch"])
        errors.append(abs(predicted - r["step_s"]) / r["step_s"])
    assert len(errors) == 7
    return errors


def test_the_measured_single_gpu_steps_are_within_10_percent_median_and_20_percent_worst():
    errors = _step_errors("h100-layers.jsonl", PROFILE)
    assert statistics.median(errors) < 0.10 and max(errors) < 0.20


def test_the_h200_steps_held_out_with_the_host_cost_fitted_on_the_h100():
    """The H200 machine's steps, none of them in the H100 profile's fit (its
    host seconds per launch come from the H100 machine's layers): within 10%
    median and 20% worst, the host-bound micro-batch 1 included."""
    errors = _step_errors("h200-layers.jsonl", PROFILE)
    assert statistics.median(errors) < 0.10 and max(errors) < 0.20


def test_the_h200_steps_held_out_of_the_h200_profile():
    """The H200 machine's steps against the profile fitted on that machine's
    operations and layers (the steps are not in its fit): within 10% median
    and 20% worst, the host-bound-looking micro-batch 1 included."""
    errors = _step_errors("h200-layers.jsonl", load_compute_profile(str(REPO / "profiles/h200-sxm-141gb.compute.json")))
    assert statistics.median(errors) < 0.10 and max(errors) < 0.20


def test_plan_takes_the_framework_and_refuses_an_unknown_one(capsys):
    argv = ["plan", "--topology", "dgx-h100", "--scale", "node=1,gpu=1", "--model", "gpt3-350m", "--global-batch",
            "8", "--axes", "tp=1,dp=1,pp=1", "--micro-batch", "8", "--no-verify", "--json"]
    assert main(argv + ["--framework", "eager"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["training"]["framework"] == "eager" and plan["training"]["cross_entropy"] == "eager"
    assert main(argv + ["--framework", "nemo"]) == 2
    assert "synth-reduce: error: argument --framework: invalid choice: 'nemo'" in capsys.readouterr().err


def test_deepseek_recomputes_both_rmsnorms_of_every_layer_in_the_backward():
    """DeepSeek-V3 recomputes all RMSNorm operations during back-propagation
    (arXiv:2412.19437 Section 3.2.3): each layer's two norms' forward again,
    over T h values at the profile's layer_norm rate; with full recomputation
    the whole forward is already recomputed and nothing more is added."""
    model = load_model("llama2-7b")
    config = Configuration(1, 1, 1, 1)

    def micro_batch_s(framework: str, recompute=Recompute.NONE) -> float:
        training = Training(8, cross_entropy="fused", framework=framework, recompute=recompute)
        return compute_estimate(model, training, config, DEVICE, PROFILE).micro_batch_s

    norm_s = float(PROFILE.elementwise.seconds("layer_norm", model.seq * model.hidden))
    assert micro_batch_s("deepseek") - micro_batch_s("megatron") == pytest.approx(model.layers * 2 * norm_s)
    assert micro_batch_s("deepseek", Recompute.FULL) == pytest.approx(micro_batch_s("megatron", Recompute.FULL))


def test_torchtitan_selective_checkpointing_recomputes_every_second_gemm_and_the_elementwise_ops():
    """torchtitan's operator-level selective checkpointing saves the attention
    core and every first, third, ... GEMM output (wq, wv, w1, w2 of wq, wk, wv,
    wo, w1, w3, w2) and recomputes the rest in the backward: wk, wo and w3 at
    their own shapes, the norms, residual adds, SwiGLU and rotary positions; not
    the attention core, which Megatron-LM's selective recomputation repeats."""
    model = load_model("llama3-8b")
    shard = Shard(1, 2, model.seq)
    tokens, h, kv, f = 2 * model.seq, model.hidden, model.kv_dim, model.ffn
    plain = stage_compute(PROFILE, model, shard, 4, Recompute.NONE, False, False, torchtitan=True)
    sac = stage_compute(PROFILE, model, shard, 4, Recompute.SELECTIVE, False, False, torchtitan=True)
    gemm = PROFILE.gemm
    gemms_s = float(gemm.seconds(tokens, h, kv) + gemm.seconds(tokens, h, h) + gemm.seconds(tokens, h, f))
    e = PROFILE.elementwise
    # the eager RMSNorm's forward (36 bytes a value), rotary's (20), the keys' and values' copies for 32 query
    # heads over 8 key heads (read 2, write 4 x 2 a key value), residual adds and SwiGLU at the profile's rates
    passes_s = float(2 * moved_s(36 * tokens * h) + 2 * e.seconds("add", tokens * h)
                     + e.seconds("silu_mul", tokens * f) + moved_s(20 * tokens * (h + kv))
                     + moved_s(10 * 2 * tokens * kv))
    assert sac.total_s - plain.total_s == pytest.approx(4 * (gemms_s + passes_s), rel=1e-9)
    megatron = stage_compute(PROFILE, model, shard, 4, Recompute.SELECTIVE, False, False)
    assert [op for op in megatron.ops if op.name == "attention.recompute"]
    assert not [op for op in sac.ops if op.name.startswith("attention") and op.name.endswith(".recompute")]


def test_torchtitan_runs_rmsnorm_rotary_and_grouped_keys_as_eager_kernel_chains():
    """torchtitan's Llama (pytorch/torchtitan at 9dec370) without
    torch.compile: RMSNorm in fp32 (norms.py lines 96-101: cast 2+4, pow 4+4,
    mean 4, product 4+4, cast back 4+2, weight 2+2 = 36 bytes a value
    forward; its autograd backward 92), rotary positions through complex64
    (model.py lines 108-113: cast 2+4, product 4+4, cast back 4+2 = 20 each
    way) and repeat_kv's copies of the keys and values for 32 query heads
    over 8 (model.py lines 116-125: read 2, write 2 x 4 per key value;
    backward the sum, read 8, write 2), in place of the profile's fused
    rates; the rest of the layer as it is."""
    model = load_model("llama3-8b")
    shard = Shard(1, 1, model.seq)
    tokens, h, kv = model.seq, model.hidden, model.kv_dim
    plain = stage_compute(PROFILE, model, shard, 1, Recompute.NONE, False, True)
    titan = stage_compute(PROFILE, model, shard, 1, Recompute.NONE, False, True, torchtitan=True)
    e = PROFILE.elementwise

    def profile_rates(op: str, elements: int) -> float:  # forward and backward (twice the forward's values)
        return float(e.seconds(op, elements) + e.seconds(op, 2 * elements))

    fused_s = 3 * profile_rates("layer_norm", tokens * h) + profile_rates("silu_mul", tokens * (h + kv))
    eager_s = (3 * (moved_s(36 * tokens * h) + moved_s(92 * tokens * h))  # two layer norms and the final one
               + 2 * moved_s(20 * tokens * (h + kv)) + 2 * moved_s(10 * 2 * tokens * kv))
    assert titan.total_s - plain.total_s == pytest.approx(eager_s - fused_s, rel=1e-9)
    names = {op.name for op in titan.ops}
    assert {"repeat_kv", "repeat_kv.backward", "final_norm.backward"} <= names


def test_torchtitan_issues_its_eager_kernels_and_its_recomputation_from_the_host():
    """A host-bound stage (one Llama 3 8B layer over 16 tokens) lasts the
    host's launches as torchtitan issues them: per layer forward 4 + 3 more
    GEMMs (wq, wk, wv, wo, w1, w3, w2), attention 2, two RMSNorms of 8 kernels
    (cast, pow, mean, + eps, rsqrt, product, cast back, weight), residuals 2,
    SwiGLU 2, rotary 6 (cast, complex product, cast back, for q and k),
    repeat_kv 2 = 37; backward 14 + 7 + 2 x 16 + 2 + 4 + 8 + 2 = 69; the
    selective checkpointing runs the forward again but for the four saved
    GEMMs and the attention core's two kernels: 31."""
    model = load_model("llama3-8b")
    shard = Shard(1, 1, 16)
    titan = stage_compute(PROFILE, model, shard, 1, Recompute.SELECTIVE, False, False, torchtitan=True)
    host = PROFILE.host
    expected = (37 + 31) * host.forward_launch_s + 69 * host.backward_launch_s
    assert any(op.name == "host_issue" for op in titan.ops)
    assert titan.total_s == pytest.approx(expected, rel=1e-9)
