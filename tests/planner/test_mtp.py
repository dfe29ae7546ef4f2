"""Multi-token prediction (``mtp_depth``; DeepSeek-V3, arXiv:2412.19437
Section 2.2): its parameters, FLOPs, time and memory on the last pipeline
stage, each counted by hand, the stage layout moving layers off that stage,
DeepSeek-V3's module against the count its release states, the field's
errors, and nothing changed for a model without it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import usage_error

from synth.errors import SynthError
from synth.planner.activations import Recompute
from synth.planner.compute import shipped_profile_for
from synth.planner.layercompute import layer_compute, recompute_ops
from synth.planner.optimes import Shard
from synth.planner.stagecompute import mtp_compute, stage_compute
from synth.planner.modelspec import load_model, model_from_dict, parse_inline_model
from synth.planner.stepmodel import (Configuration, Training, memory_per_device, stage_costs, stage_mix,
                                     stage_parameters, step_shape)

# h 64, kv 32 (2 of 4 heads), SwiGLU; 8 routed experts of 48, top 2, 1 shared; RMSNorm, no biases
SMALL_MOE = ("layers=4,hidden=64,heads=4,kv_heads=2,ffn=96,mlp=swiglu,seq=32,vocab=100,"
             "experts=8,top_k=2,expert_ffn=48,shared_experts=1")


def test_one_module_holds_a_block_of_the_models_kind_a_projection_and_three_norms_by_hand():
    """Per module: the MoE block (attention h(h + 2kv) + h^2, two RMSNorms,
    the router h E, 8 routed and 1 shared SwiGLU expert of 3 h f_e), the
    projection 2h x h and three RMSNorms (its two inputs, the shared head's
    input); the embedding and the head are shared. Active: the block with
    top_k + shared experts."""
    h, kv, e, fe = 64, 32, 8, 48
    plain = parse_inline_model(SMALL_MOE)
    with_mtp = parse_inline_model(SMALL_MOE + ",mtp_depth=1")
    block = h * (h + 2 * kv) + h * h + 2 * h + h * e + (e + 1) * 3 * h * fe
    extra = 2 * h * h + 3 * h
    assert block + extra == 104_256
    assert with_mtp.parameters - plain.parameters == block + extra
    active = block - (e - 2) * 3 * h * fe + extra
    assert with_mtp.active_parameters - plain.active_parameters == active
    dense = parse_inline_model("layers=2,hidden=64,heads=4,seq=32,vocab=100,mtp_depth=2")  # GPT: biases, LayerNorm
    layer = 12 * h * h + 13 * h
    assert dense.parameters - replace(dense, mtp_depth=0).parameters == 2 * (layer + 2 * h * h + h + 3 * 2 * h)


def test_deepseek_v3s_module_against_its_stated_size():
    """README_WEIGHTS.md of deepseek-ai/DeepSeek-V3: the MTP module has 11.5B
    unique parameters (the shared 0.9B embedding and 0.9B head excluded). The
    count here differs by MLA's attention approximated as multi-head attention
    (205.5M parameters against 187.1M, models/deepseek-v3.yaml)."""
    m = load_model("deepseek-v3")
    assert m.mtp_depth == 1
    assert m.mtp_params == pytest.approx(11.5e9, rel=0.015)
    assert m.parameters - m.mtp_params == pytest.approx(671e9, rel=0.002)  # the main model, as stated
    # the 14B of the released checkpoint store the embedding and the head once more
    assert m.mtp_params + 2 * m.vocab * m.hidden == pytest.approx(14e9, rel=0.05)


def test_the_modules_training_flops_by_hand():
    """Forward per module: its layer (GPT: 2 T 12 h^2 + 4 T s h), the
    projection 2 T 2h h and the shared head's logits 2 T h V; training 3x;
    full recomputation adds the block's forward, selective its attention core."""
    h, s, v, samples = 64, 32, 100, 3
    tokens = samples * s
    plain = parse_inline_model(f"layers=2,hidden={h},heads=4,seq={s},vocab={v}")
    with_mtp = replace(plain, mtp_depth=1)
    block = 2 * tokens * 12 * h * h + 4 * tokens * s * h
    forward = block + 2 * tokens * 2 * h * h + 2 * tokens * h * v
    for recompute, again in ((Recompute.NONE, 0), (Recompute.FULL, block), (Recompute.SELECTIVE, 4 * tokens * s * h)):
        more = with_mtp.training_flops(samples, recompute).total - plain.training_flops(samples, recompute).total
        assert more == pytest.approx(3 * forward + again)
        assert with_mtp.mtp_training_flops(samples, recompute) == pytest.approx(3 * forward + again)


def _seconds(profile, shard: Shard, h: int, v: int) -> float:
    """One module beside its block, from the profile's own rates: the
    embedding's gather and its accumulated gradient (T h each at ``add``), the
    two input norms (forward, and twice the values backward), their
    concatenation (2 T h at ``add``, forward only), the projection (T, 2h, h)
    with its two backward GEMMs, the head's norm, the logits GEMM (T, h, V)
    with its two, and the fused loss's 14 + 14 bytes per logit."""
    g, e, t = profile.gemm, profile.elementwise, shard.tokens

    def gemms(m, k, n):
        return g.seconds(m, k, n) + g.seconds(m, n, k) + g.seconds(k, m, n)

    def norm(values):
        return e.seconds("layer_norm", values) + e.seconds("layer_norm", 2 * values)

    return float(2 * e.seconds("add", t * h) + 2 * norm(t * h) + e.seconds("add", 2 * t * h) + gemms(t, 2 * h, h)
                 + norm(t * h) + gemms(t, h, v) + 2 * e.bytes_seconds(14 * t * v))


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.FULL])
def test_the_last_stage_runs_one_more_block_and_the_module_by_hand(recompute):
    """The last stage of a model with one module, against the same stage
    without: one more MoE block (a layer, recomputed as the layers are) and
    the module's operations (:func:`_seconds`); no other stage changes."""
    profile = shipped_profile_for("h100-sxm5-80gb")
    h, v = 4096, 32000
    plain = parse_inline_model(f"layers=4,hidden={h},heads=32,ffn=14336,mlp=swiglu,seq=4096,vocab={v},"
                               "experts=8,top_k=2,expert_ffn=14336")
    with_mtp = replace(plain, mtp_depth=1)
    shard = Shard(1, 1, 4096, ep=2)
    layer = layer_compute(profile, plain, shard, True)
    block = layer.total_s + recompute_ops(profile, plain, shard, recompute, layer).total_s
    assert mtp_compute(profile, with_mtp, shard).total_s == pytest.approx(_seconds(profile, shard, h, v))
    last = stage_compute(profile, with_mtp, shard, 3, recompute, False, True, 3)
    assert "host_issue" not in {op.name for op in last.ops}  # GPU-bound: the sums below are the stage
    assert last.total_s - stage_compute(profile, plain, shard, 2, recompute, False, True, 2).total_s == \
        pytest.approx(block + _seconds(profile, shard, h, v))
    assert stage_compute(profile, with_mtp, shard, 2, recompute, False, False, 2) == \
        stage_compute(profile, plain, shard, 2, recompute, False, False, 2)
    costs = [stage_costs(m, Training(8, recompute=recompute), Configuration(1, 1, 2, 1, ep=2), profile)
             for m in (plain, with_mtp)]
    assert costs[1].layer == costs[0].layer and costs[1].first_extra == costs[0].first_extra
    assert costs[1].last_extra - costs[0].last_extra == pytest.approx(block + _seconds(profile, shard, h, v))


def test_uneven_stages_move_layers_off_the_heavier_last_stage(cli):
    """The module makes the last stage the heavier: the balanced layout gives
    it fewer layers than the model without (its block is one of that stage's
    blocks)."""
    model = "layers=16,hidden=4096,heads=32,ffn=14336,mlp=swiglu,seq=4096,vocab=32000,tied_embeddings=false"
    layouts = []
    for spec in (model, model + ",mtp_depth=1"):
        code, out, err = cli("plan", "--topology", "dgx-h100", "--scale", "node=1", "--model", spec, "--global-batch",
                             "64", "--axes", "tp=1,dp=2,pp=4", "--micro-batch", "1", "--stages", "uneven",
                             "--no-verify", "--top", "1", "--json")
        assert code == 0, err
        layouts.append(tuple(json.loads(out)["configurations"][0]["stage_layers"]))
    before, after = layouts
    assert sum(after) == 16 and after[-1] < before[-1]
    assert stage_mix(parse_inline_model(model + ",mtp_depth=1"), after)["last"] == (after[-1] + 1, 0)


def test_the_last_stage_holds_the_modules_states_and_activations_by_hand():
    """pp 1, micro-batch 2, Megatron-LM's 18 bytes a parameter (bf16 weights,
    fp32 gradients, fp32 master weights and moments): the module's parameters
    (above); its block's activations as an MoE layer's (per token 10h + 2h +
    4kv + 2h + 6 (k + 1) f_e + 2 h k + 4 E bytes), its two inputs and their
    concatenation (4h values, 2 bytes) and its own fp32 logits (4 V bytes per
    token, the fused loss)."""
    h, kv, e, fe, k, v = 64, 32, 8, 48, 2, 100
    plain = parse_inline_model(SMALL_MOE)
    with_mtp = replace(plain, mtp_depth=1)
    tokens = 2 * 32
    memory = [memory_per_device(m, Training(2), Configuration(1, 1, 1, 2)) for m in (plain, with_mtp)]
    states = [x.weights + x.gradients + x.optimizer for x in memory]
    assert states[1] - states[0] == pytest.approx(18 * 104_256)
    block = 10 * h + 2 * h + 4 * kv + 2 * h + 6 * (k + 1) * fe + 2 * h * k + 4 * e
    assert memory[1].activations - memory[0].activations == pytest.approx(tokens * (block + 2 * 4 * h + 4 * v))


def test_the_modules_block_sends_its_all_to_alls_with_the_last_stages_layers():
    config = Configuration(1, 1, 2, 1, ep=2)
    plain = parse_inline_model(SMALL_MOE)
    shapes = [step_shape(m, Training(8), config) for m in (plain, replace(plain, mtp_depth=1))]
    assert (shapes[0].moe_layers_per_stage, shapes[1].moe_layers_per_stage) == (2, 3)
    layout = (2, 2)
    params = [stage_parameters(m, layout) for m in (plain, replace(plain, mtp_depth=1))]
    assert params[1]["first"] == params[0]["first"] and params[1]["last"] - params[0]["last"] == 104_256


def test_a_model_without_the_field_is_the_model_with_depth_zero():
    """``mtp_depth: 0`` (or no field) is the model as it was: the same value,
    whose every count and time is then the same."""
    data = {"layers": 4, "hidden": 64, "heads": 4, "seq": 32, "vocab": 100}
    assert model_from_dict(data, "m.yaml") == model_from_dict({**data, "mtp_depth": 0}, "m.yaml")
    for name in ("llama3-8b", "mixtral-8x7b", "gpt3-175b"):
        model = load_model(name)
        assert model.mtp_depth == 0 and model.mtp_params == 0 and model.mtp_forward_flops(4096) == 0
        layout = (model.layers // 4,) * 4
        assert stage_mix(model, layout) == {"first": model.layer_mix(0, layout[0]),
                                             "last": model.layer_mix(sum(layout[:-1]), layout[-1]),
                                             "middle": model.layer_mix(layout[0], layout[1])}
    assert "mtp_depth" not in load_model("llama3-8b").to_dict()


@pytest.mark.parametrize("value, message", [
    (-1, "model field 'mtp_depth' must be an integer >= 0 (0: none), got -1"),
    (True, "model field 'mtp_depth' must be an integer >= 0 (0: none), got True"),
    ("1", "model field 'mtp_depth' must be an integer >= 0 (0: none), got '1'"),
    (5, "model field 'mtp_depth' is 5; at most the model's layers (4): each depth is one more transformer block"),
])
def test_a_bad_depth_is_refused_naming_the_field(value, message):
    data = {"layers": 4, "hidden": 64, "heads": 4, "seq": 32, "vocab": 100, "mtp_depth": value}
    with pytest.raises(SynthError) as raised:
        model_from_dict(data, "m.yaml")
    assert str(raised.value) == f"m.yaml: {message}"


def test_a_bad_inline_depth_is_one_error_line(cli):
    message = usage_error(cli, "plan", "--topology", "dgx-h100", "--model",
                          "layers=4,hidden=64,heads=4,seq=32,vocab=100,mtp_depth=5", "--global-batch", "8")
    assert message == ("--model: model field 'mtp_depth' is 5; at most the model's layers (4): each depth is one "
                       "more transformer block")


def test_the_depth_travels_with_the_architecture_a_step_record_keeps():
    """Step records write a model's shape and :meth:`architecture_fields`;
    read back, the model has its modules again."""
    m = parse_inline_model(SMALL_MOE + ",mtp_depth=1")
    data = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "seq": m.seq, "vocab": m.vocab,
            "ffn": m.ffn, "kv_heads": m.kv_heads, **m.architecture_fields()}
    assert m.architecture_fields()["mtp_depth"] == 1
    assert model_from_dict(data, "record").mtp_params == m.mtp_params
