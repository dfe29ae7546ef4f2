"""Multi-head latent attention (``mla:``): parameters, GEMM shapes, FLOPs,
activations and DeepSeek-V3's recomputation of its up-projections, each
against arithmetic done here from the configuration's numbers."""

from __future__ import annotations

import pytest
import yaml

from helpers import usage_error
from synth.planner.activations import Recompute
from synth.planner.compute import shipped_profile_for
from synth.planner.fp8 import block_scaled_speedup
from synth.planner.frameworks import deepseek_activation_bytes
from synth.planner.layercompute import deepseek_recompute_s, layer_compute
from synth.planner.optimes import Shard
from synth.planner.modelspec import load_model, parse_inline_model

# a small latent-attention model: hidden 256, 4 heads; latents 96 (query) and 32 (keys and values), rotary 16,
# query-key heads 32 + 16, value heads 24
SMALL = ("layers=2,hidden=256,heads=4,ffn=512,gated_mlp=true,tied_embeddings=false,seq=128,vocab=1000,"
         "q_lora_rank=96,kv_lora_rank=32,qk_rope_head_dim=16,qk_nope_head_dim=32,v_head_dim=24")


@pytest.fixture(scope="module")
def profile():
    return shipped_profile_for("h100-sxm5-80gb")


def test_deepseek_v3_parameters_by_hand_from_its_config():
    """DeepSeek-V3's counts from config_671B.json's numbers (hidden 7168, 128
    heads, q_lora_rank 1536, kv_lora_rank 512, rotary 64, nope 128, v 128,
    FFN 18432, 256 + 1 experts of 2048, 3 dense layers of 61, vocabulary
    129280, untied head): MLA's 187.1M a layer, the main model's 671.0B (the
    report: 671B), one MTP module's block, projection and three norms."""
    m = load_model("deepseek-v3")
    h, a, V = 7168, 128, 129280
    attention = (7168 * 1536 + 1536 * 128 * (128 + 64) + 7168 * (512 + 64) + 512 * 128 * (128 + 128)
                 + 128 * 128 * 7168 + 1536 + 512)
    assert attention == 187_107_328
    assert m.attention_matrix_params + m.attention_norm_params == attention
    dense = attention + 3 * h * 18432 + 2 * h
    moe = attention + 2 * h + h * 256 + (256 + 1) * 3 * h * 2048
    main = 3 * dense + 58 * moe + V * h + V * h + h
    assert m.parameters - m.mtp_params == main
    assert abs(main - 671e9) / 671e9 < 0.001
    assert m.mtp_params == moe + 2 * h * h + 3 * h
    active_moe = attention + 2 * h + h * 256 + (8 + 1) * 3 * h * 2048
    assert m.active_parameters == 3 * dense + 58 * active_moe + 2 * V * h + h + active_moe + 2 * h * h + 3 * h
    assert "q_lora_rank" in m.to_dict()["mla"] and "core_head_dim" not in m.to_dict()


def test_small_mla_gemm_shapes_follow_megatron_cores_split(profile):
    """tp 2: the down-projections on every rank (duplicated) over the rank's
    tokens, the up-projections column-parallel, the output projection
    row-parallel; the latents' norms over the down-projections' tokens; the
    core at (48 + 24) / 2 = 36 wide; rotary over 4 x 16 / 2 query values and
    one 16-wide key per token."""
    m = parse_inline_model(SMALL)
    for sp, replicated in ((False, 256), (True, 128)):  # tokens: micro-batch 2 x seq 128
        ops = {op.name: op.shape for op in layer_compute(profile, m, Shard(2, 2, 128, sp)).ops}
        assert ops["q_down"] == (replicated, 256, 96)
        assert ops["q_up"] == (256, 96, 4 * 48 // 2)
        assert ops["kv_down"] == (replicated, 256, 32 + 16)
        assert ops["kv_up"] == (256, 32, 4 * (32 + 24) // 2)
        assert ops["attention_projection"] == (256, 4 * 24 // 2, 256)
        assert ops["q_up.dgrad"] == (256, 96, 96) and ops["q_up.wgrad"] == (96, 256, 96)
        assert ops["attention"] == (2, 2, 128, 36)
        assert ops["q_norm"] == (replicated * 96,) and ops["kv_norm"] == (replicated * 32,)
        assert ops["rotary"] == (256 * (4 * 16 // 2 + 16),)
        assert "qkv" not in ops


def test_small_mla_flops_by_hand():
    """The five projections' FLOPs and the core's: scores over 4 x 48, the
    product with the values over 4 x 24, over the full s x s."""
    m = parse_inline_model(SMALL)
    T, s, h = 128, 128, 256
    matrices = 256 * 96 + 96 * 4 * 48 + 256 * 48 + 32 * 4 * 56 + 4 * 24 * 256 + 3 * 256 * 512
    core = 2 * T * s * 4 * 48 + 2 * T * s * 4 * 24
    assert m.attention_core_flops(T) == core
    assert m.layer_forward_flops(T) == 2 * T * matrices + core
    assert m.layer_gemm_params == (256 * 96 + 96 * 192 + 256 * 48 + 32 * 224, 96 * 256, 2 * h * 512, h * 512)


def test_small_mla_activations_by_hand():
    """Per token, tp 1, flash attention: the layer's norms' inputs and outputs
    and masks (10h), the two latents before and after their norms (4 x (96 +
    32)), Q (2 x 192), K (2 x 192), V (2 x 96), the attention output (2 x 96),
    SwiGLU 6f. DeepSeek-V3 keeps neither norm's output, nor the latents' normed
    copies, nor Q, K, V (the up-projections are recomputed), keeps the rotary
    key (2 x 16), and caches the output projection's input in E5M6."""
    m = parse_inline_model(SMALL)
    h, f = 256, 512
    planner = 10 * h + 4 * (96 + 32) + 2 * 192 + 2 * 192 + 2 * 96 + 2 * 96 + 6 * f
    deepseek = 6 * h + 2 * (96 + 32) + 2 * 16 + 1.5 * 96 + 6 * f
    tokens = 2 * 128
    assert m.activation_bytes_per_layer(2, 1, Recompute.NONE, 2, False) == pytest.approx(tokens * planner)
    assert deepseek_activation_bytes(m, 2, 1, False) == pytest.approx(tokens * deepseek)


@pytest.mark.parametrize("fp8", [False, True])
def test_deepseek_recomputes_exactly_the_up_projections_and_the_norms(profile, fp8):
    """One more forward of the up-projections (at their own shapes) and of
    the four RMSNorms (the layer's two and the latents'), and in FP8 the
    quantization of the up-projections' inputs; nothing else."""
    m = parse_inline_model(SMALL)
    shard = Shard(2, 2, 128, fp8=fp8, fp8_blocks=fp8)
    g, e = profile.gemm, profile.elementwise
    rate, operand = (block_scaled_speedup(g), 1) if fp8 else (1.0, None)  # DeepSeek's FP8: operands one byte
    gemms = float(g.seconds(256, 96, 96, rate, operand)) + float(g.seconds(256, 32, 112, rate, operand))
    norms = 2 * float(e.seconds("layer_norm", 256 * 256)) + float(e.seconds("layer_norm", 256 * 96)) + float(
        e.seconds("layer_norm", 256 * 32))
    quantize = 0.0
    if fp8:
        ops = {op.name: op.seconds for op in layer_compute(profile, m, shard).ops}
        quantize = ops["q_up.quantize"] + ops["kv_up.quantize"]
        assert quantize > 0
    assert deepseek_recompute_s(profile, m, shard) == pytest.approx(gemms + norms + quantize, rel=1e-12)
    plain = parse_inline_model(SMALL.split(",q_lora_rank")[0])  # ordinary heads: the two norms only
    assert deepseek_recompute_s(profile, plain, Shard(2, 2, 128)) == pytest.approx(
        2 * float(e.seconds("layer_norm", 256 * 256)), rel=1e-12)


def test_deepseek_runs_every_mla_gemm_in_fp8(profile):
    """Section 3.3: every Linear's GEMMs in FP8, so each of the five
    projections quantizes its input forward and its output gradient backward."""
    m = parse_inline_model(SMALL)
    names = {op.name for op in layer_compute(profile, m, Shard(1, 2, 128, fp8=True, fp8_blocks=True)).ops}
    for gemm in ("q_down", "q_up", "kv_down", "kv_up", "attention_projection"):
        assert {f"{gemm}.quantize", f"{gemm}.quantize.backward"} <= names


@pytest.mark.parametrize("block, message", [
    ({"q_lora_rank": 0}, "field 'mla.q_lora_rank' must be an integer >= 1, got 0"),
    ({"v_head_dim": "128"}, "field 'mla.v_head_dim' must be an integer >= 1, got '128'"),
    ({"rank": 4}, "unknown field 'mla.rank'; known fields are q_lora_rank, kv_lora_rank, qk_rope_head_dim, "
                  "qk_nope_head_dim, v_head_dim"),
    ({"kv_lora_rank": None}, "missing field 'mla.kv_lora_rank' (latent attention needs all of q_lora_rank, "
                             "kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim; DeepSeek-V3's "
                             "kv_lora_rank is 512)"),
])
def test_a_bad_mla_field_is_one_line_naming_it(cli, tmp_path, block, message):
    fields = {"q_lora_rank": 96, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 24}
    fields.update(block)
    fields = {k: v for k, v in fields.items() if v is not None}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"layers": 2, "hidden": 256, "heads": 4, "seq": 128, "vocab": 1000, "ffn": 512,
                                    "gated_mlp": True, "mla": fields}))
    msg = usage_error(cli, "plan", "--topology", "dgx-a100", "--model", path, "--global-batch", "8")
    assert msg == f"{path}: {message}"


def test_mla_conflicts_are_one_line(cli):
    msg = usage_error(cli, "plan", "--topology", "dgx-a100", "--model", SMALL + ",kv_heads=2", "--global-batch", "8")
    assert msg == ("--model: model field 'kv_heads' (2) must equal heads (4) with an mla: block: latent attention "
                   "projects every head's keys and values (drop kv_heads)")
    gpt = SMALL.replace("ffn=512,gated_mlp=true,", "")
    msg = usage_error(cli, "plan", "--topology", "dgx-a100", "--model", gpt, "--global-batch", "8")
    assert msg.startswith("--model: model field 'biases' must be false with an mla: block")


def test_tp_overlap_chunks_the_up_projections_not_the_down_projections(profile):
    """With sequence parallelism Megatron-core's duplicated down-projections run
    on the rank's own tokens, and the column-parallel up-projections are the
    GEMMs that read gathered tokens: Transformer Engine's ring exchange chunks
    them (tp chunks of T / tp tokens), and the output projection is pipelined
    as any attention's."""
    from synth.planner.layercompute import tp_overlap_chunk_ops

    m = parse_inline_model(SMALL)
    ops = {op.name: op for op in tp_overlap_chunk_ops(profile, m, Shard(2, 2, 128, True)).ops}
    assert set(ops) == {"q_up.chunks", "kv_up.chunks", "attention_projection.chunks",
                        "attention_projection.dgrad.chunks", "mlp_up.chunks", "mlp_down.chunks", "mlp_down.dgrad.chunks"}
    g = profile.gemm
    assert ops["q_up.chunks"].shape == (128, 96, 96)
    assert ops["q_up.chunks"].seconds == pytest.approx(2 * float(g.seconds(128, 96, 96)) - float(g.seconds(256, 96, 96)))
    assert ops["attention_projection.chunks"].shape == (256, 48, 64)


def test_the_megatron_export_runs_latent_attention(cli, tmp_path):
    """A plan of a latent-attention model exports Megatron-LM's
    --multi-latent-attention with its ranks and head widths (--qk-head-dim:
    the part without positions) and --qk-layernorm (its latents' norms, which
    the planner counts); the transcribed parser, validate_args and
    megatron-core's MLATransformerConfig take them."""
    import megatron_args

    from synth.export.megatron import megatron_export
    from synth.plan import load_plan

    path = tmp_path / "mla.json"
    code, _, err = cli("plan", "--topology", "dgx-h100", "--scale", "node=1", "--model", SMALL, "--global-batch",
                       "16", "--axes", "tp=2,dp=4,pp=1", "--micro-batch", "1", "--no-verify", "--out", str(path))
    assert code == 0, err
    export = megatron_export(load_plan(path))
    args = list(export.arguments)
    for option, value in (("--q-lora-rank", "96"), ("--kv-lora-rank", "32"), ("--qk-head-dim", "32"),
                          ("--qk-pos-emb-head-dim", "16"), ("--v-head-dim", "24")):
        assert args[args.index(option) + 1] == value
    assert {"--multi-latent-attention", "--qk-layernorm"} <= set(args) and "--group-query-attention" not in args
    parsed = megatron_args.parse(args)
    megatron_args.validate(parsed, len(export.ranks.device_of_rank))
    megatron_args.core_checks(parsed, len(export.ranks.device_of_rank))
    with pytest.raises(AssertionError, match="arguments.py:1974"):
        megatron_args.validate(megatron_args.parse(args + ["--group-query-attention"]), 8)
    msg = usage_error(cli, "export", str(path), "--format", "torchtitan")
    assert msg == ("torchtitan export: the plan's model has multi-head latent attention, and the export writes "
                   "torchtitan's Llama; export --format megatron (--multi-latent-attention)")
