"""DeepSeek-V3's FP8 (``--dtype fp8 --framework deepseek``): its GEMMs' rate
from DeepGEMM's H800 table, the online quantization passes around each FP8
GEMM and the FP8 dispatch, each against a count by hand (synth/planner/fp8.py);
the other frameworks' row-wise FP8 unchanged."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from planner_cases import AlltoallsByBytes

from synth.planner.fp8 import DEEPGEMM_H800, block_scaled_speedup, moe_alltoall_bytes
from synth.planner.layercompute import layer_compute
from synth.planner.optimes import FP8_GEMM_SPEEDUP, Shard
from synth.planner.operations import (
    AttentionModel,
    ElementwiseModel,
    ElementwisePass,
    GemmModel,
    OperationProfile,
)
from synth.planner.modelspec import parse_inline_model
from synth.planner.stepmodel import Configuration, Training, layer_shard, step_shape, step_time

REPO = Path(__file__).resolve().parents[2]
ADD_BANDWIDTH_Bps = 6 / 3e-12  # the profile's add: 6 bytes an element in 3e-12 s
ADD_FLOOR_s = 8e-6


def _profile(gemm: GemmModel | None = None) -> OperationProfile:
    """Round parameters, fitted to nothing."""
    return OperationProfile(
        "known", ("Known GPU",),
        gemm or GemmModel(5e14, 100, ((128, 256), (128, 128), (64, 64)), 256, 2e12, 2e-5),
        AttentionModel(4e14, 3e14, 100, 128, 2.0, 3e-5, 1e-4),
        ElementwiseModel((ElementwisePass("add", 3e-12, ADD_FLOOR_s), ElementwisePass("gelu_tanh", 2e-12, 8e-6),
                          ElementwisePass("silu_mul", 5e-12, 1.6e-5), ElementwisePass("layer_norm", 3e-12, 1.5e-5))),
        0.0, "test")


def test_the_deepgemm_rows_are_the_data_files():
    """The module's rows are data/deepgemm_h800.jsonl's, transcribed from
    DeepGEMM's first README: the six dense rows at M = 4096 and the four
    grouped rows of the contiguous layout."""
    rows = [json.loads(line) for line in (REPO / "data" / "deepgemm_h800.jsonl").read_text().splitlines()]
    assert all("DeepGEMM README.md at commit a6d97a1" in r["source"] for r in rows)
    assert [(r["groups"], r["m"], r["n"], r["k"], r["tflops"], r["speedup"]) for r in rows] == [
        (row.groups, row.m, row.n, row.k, row.tflops, row.speedup) for row in DEEPGEMM_H800]
    assert [r["table"] for r in rows] == ["normal"] * 6 + ["grouped_contiguous"] * 4


def test_block_scaled_speedup_by_hand():
    """On a GEMM model whose tiles divide every row's shape and that no
    bandwidth bounds, a row's BF16 time is 2 g M N K / rate: the speed-up is
    the median of the earlier kernels' TFLOP/s (each row's over its speed-up)
    over the BF16 rate."""
    exact = GemmModel(1e15, 1, ((64, 64),), 256, 1e30, 0.0)
    earlier = [1058 / 1.1, 990, 590, 1358 / 1.2, 1304 / 1.1, 1025 / 1.1, 1297 / 1.2, 1099 / 1.2, 1288 / 1.2, 1093 / 1.1]
    assert block_scaled_speedup(exact) == pytest.approx(statistics.median(earlier) / 1000)
    assert statistics.median(earlier) == pytest.approx((990 + 1093 / 1.1) / 2)  # 991.8 TFLOP/s
    halved = replace(exact, rate_flops=5e14)  # a BF16 rate half as fast: FP8 twice the speed-up
    assert block_scaled_speedup(halved) == pytest.approx(2 * block_scaled_speedup(exact))


def test_the_h100_profile_prices_deepseeks_fp8_below_the_rowwise_speedup():
    """With the H100 profile (the H800's GH100) the block-scaled speed-up is
    1.46x, under row-wise FBGEMM's 1.605x: the earlier kernels ran 916-1186
    TFLOP/s at the shapes DeepSeek-V3 trains with (590 at K = 512)."""
    from synth.planner.operations import operation_profile_from_dict

    h100 = operation_profile_from_dict(json.loads((REPO / "profiles" / "h100-sxm5-80gb.compute.json").read_text()))
    assert block_scaled_speedup(h100.gemm) == pytest.approx(1.458, abs=0.001)
    assert block_scaled_speedup(h100.gemm) < FP8_GEMM_SPEEDUP


def _bytes_s(nbytes: float) -> float:
    return max(ADD_FLOOR_s, nbytes / ADD_BANDWIDTH_Bps)


def _quantize(values: int) -> float:  # read bf16, write fp8 and one fp32 scale per 128
    return _bytes_s(3 * values + 4 * math.ceil(values / 128))


def _transpose(values: int) -> float:  # read fp8 and scales, write both transposed
    return _bytes_s(2 * values + 8 * math.ceil(values / 128))


def _quantize_ops(layer) -> dict[tuple[str, str], float]:
    return {(op.name, op.phase): op.seconds for op in layer.ops if ".quantize" in op.name}


def test_quantization_passes_of_a_dense_layer_by_hand():
    """A GELU layer, h 4096, f 16384, 8,192 tokens on one device: per GEMM
    the input quantized forward; backward its FP8 copy re-quantized transposed
    and the output gradient quantized twice; every pass one kernel at the
    add bandwidth (none at the floor at these sizes)."""
    p = _profile()
    model = parse_inline_model("layers=2,hidden=4096,heads=32,ffn=16384,seq=4096,vocab=1000")
    t, h, f = 4096 * 2, 4096, 16384
    gemms = {"qkv": (t * h, t * 3 * h), "attention_projection": (t * h, t * h), "mlp_up": (t * h, t * f),
             "mlp_down": (t * f, t * h)}
    expected = {}
    for name, (inputs, outputs) in gemms.items():
        expected[f"{name}.quantize", "forward"] = _quantize(inputs)
        expected[f"{name}.quantize.backward", "backward"] = _transpose(inputs) + 2 * _quantize(outputs)
    layer = layer_compute(p, model, Shard(1, 2, 4096, fp8=True, fp8_blocks=True))
    assert _quantize_ops(layer) == pytest.approx(expected)
    assert min(expected.values()) > 4 * ADD_FLOOR_s
    rowwise = layer_compute(p, model, Shard(1, 2, 4096, fp8=True))
    assert not _quantize_ops(rowwise)  # row-wise FP8: quantization is inside FP8_GEMM_SPEEDUP's rate
    assert not _quantize_ops(layer_compute(p, model, Shard(1, 2, 4096, fp8_blocks=True)))  # bf16: none


def test_quantization_passes_of_an_moe_layer_by_hand():
    """An MoE layer (8 experts, top 2, one shared expert; ep 2): the tokens
    are quantized once before the dispatch, which the shared and routed
    up-projections read in FP8 (no forward pass of their own); the MoE
    output's gradient once before the combine's backward, which the shared
    down-projection's Dgrad reads (one more quantization for its Wgrad) and the
    routed down-projection receives in FP8 (re-quantized transposed for its
    Wgrad). Small enough that each pass is one kernel at the floor: counted by
    kernels."""
    p = _profile()
    model = parse_inline_model("layers=2,hidden=64,heads=4,ffn=96,mlp=swiglu,seq=32,vocab=100,experts=8,top_k=2,"
                               "expert_ffn=48,shared_experts=1")
    layer = layer_compute(p, model, Shard(1, 1, 32, ep=2, fp8=True, fp8_blocks=True), moe=True)
    kernels = {key: round(s / ADD_FLOOR_s, 9) for key, s in _quantize_ops(layer).items()}
    assert kernels == {
        ("qkv.quantize", "forward"): 1, ("qkv.quantize.backward", "backward"): 3,
        ("attention_projection.quantize", "forward"): 1, ("attention_projection.quantize.backward", "backward"): 3,
        ("dispatch.quantize", "forward"): 1, ("combine.quantize.backward", "backward"): 1,
        ("shared_up.quantize.backward", "backward"): 3,
        ("shared_down.quantize", "forward"): 1, ("shared_down.quantize.backward", "backward"): 2,
        ("expert_up.quantize.backward", "backward"): 3,
        ("expert_down.quantize", "forward"): 1, ("expert_down.quantize.backward", "backward"): 2,
    }


def test_deepseeks_gemms_run_at_the_block_scaled_rate_and_the_rest_as_rowwise():
    """Under block scaling each layer GEMM is the row-wise FP8 one with the
    tiles at block_scaled_speedup in place of FP8_GEMM_SPEEDUP (a GEMM bound by
    its tiles: times in the ratio of the two); everything but the
    quantization passes is unchanged."""
    p = _profile()
    model = parse_inline_model("layers=2,hidden=4096,heads=32,seq=2048,vocab=1000")
    shard = Shard(1, 4, 2048, fp8=True)
    rowwise, blocks = layer_compute(p, model, shard), layer_compute(p, model, replace(shard, fp8_blocks=True))
    kept = [op for op in blocks.ops if ".quantize" not in op.name]
    assert [op.name for op in kept] == [op.name for op in rowwise.ops]
    ratio = FP8_GEMM_SPEEDUP / block_scaled_speedup(p.gemm)
    for a, b in zip(rowwise.ops, kept):
        gemm = a.name.split(".")[0] in ("qkv", "attention_projection", "mlp_up", "mlp_down")
        assert b.seconds == pytest.approx(a.seconds * ratio if gemm else a.seconds)


@pytest.mark.parametrize("framework, dtype, kind", [
    ("deepseek", "fp8", "blocks"), ("deepseek", "bf16", ""), ("torchtitan", "fp8", "rowwise"),
    ("megatron", "fp8", "rowwise")])
def test_only_deepseeks_framework_scales_fp8_by_blocks(framework, dtype, kind):
    """The shard the planner times: DeepSeek-V3's block scaling under its own
    framework, row-wise FP8 (torchtitan's Float8, Transformer Engine) under
    the others."""
    model = parse_inline_model("layers=2,hidden=64,heads=4,seq=32,vocab=100")
    shard = layer_shard(Training(8, dtype, framework=framework), Configuration(1, 1, 1, 1), model)
    assert shard.fp8_gemms == kind


@pytest.mark.parametrize("recompute, passes", [("none", 2), ("full", 3)])
def test_deepseeks_fp8_dispatch_by_hand(recompute, passes):
    """Section 3.3.3: per pass, one of the two all-to-alls of an MoE layer
    carries FP8 values and their scales (the dispatch forward, the combine's
    gradient backward), the other BF16; row-wise FP8 frameworks send both in
    BF16."""
    from synth.planner.activations import Recompute

    model = parse_inline_model("layers=4,hidden=256,heads=4,ffn=512,mlp=swiglu,seq=64,vocab=100,experts=8,top_k=2,"
                               "expert_ffn=128")
    config = Configuration(1, 1, 1, 1, ep=4)
    bf16_bytes = 64 * 2 * 256 * 2  # tokens x routed copies x hidden x 2 bytes
    fp8_bytes = bf16_bytes // 2 + 4 * math.ceil(bf16_bytes / 2 / 128)
    assert moe_alltoall_bytes(bf16_bytes) == (fp8_bytes, bf16_bytes)
    steps = {}
    for framework in ("deepseek", "megatron"):
        collectives = AlltoallsByBytes(1)
        training = Training(8, "fp8", recompute=Recompute(recompute), framework=framework)
        steps[framework] = step_time(model, training, config, collectives, 1.0)
        expected = {"deepseek": {fp8_bytes, bf16_bytes}, "megatron": {bf16_bytes}}[framework]
        assert set(collectives.sizes) == expected
    layers, micro_batches = model.moe_layers, step_shape(model, training, config).micro_batches
    assert micro_batches == 2  # 8 sequences over the expert-parallel group of 4, one a micro-batch
    assert steps["deepseek"].ep_s == pytest.approx(micro_batches * layers * passes * (fp8_bytes + bf16_bytes) / 1e9)
    assert steps["megatron"].ep_s == pytest.approx(micro_batches * layers * passes * 2 * bf16_bytes / 1e9)
    assert steps["deepseek"].alltoalls == (("ep", fp8_bytes), ("ep", bf16_bytes))
