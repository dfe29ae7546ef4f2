"""The planner's transformer arithmetic against formulas computed here by
hand: parameters, FLOPs, activations and memory per device (GPT, Llama,
gated MLPs, mixtures of experts), and the shipped and inline models."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import yaml
from helpers import usage_error
from planner_cases import MOE, gpt

from synth.errors import SynthError
from synth.planner.activations import Recompute
from synth.planner.modelspec import load_model, parse_inline_model
from synth.planner.stepmodel import (
    Configuration,
    Sharding,
    Training,
    memory_per_device,
    stage_mix,
    stage_parameters,
    stage_routed_parameters,
)


# ================================================================ the model's arithmetic


@pytest.mark.parametrize("L, h, a, s, V", [(2, 64, 4, 32, 100), (24, 2304, 24, 2048, 51200), (3, 48, 6, 7, 11)])
def test_gpt_parameters_are_megatrons_count(L, h, a, s, V):
    m = gpt(L, h, a, s, V)
    # per layer: QKV 3h^2 + 3h, projection h^2 + h, MLP 8h^2 + 5h, two LayerNorms 4h; embeddings V h + s h;
    # final LayerNorm 2h (Megatron's 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h)) plus the final norm)
    per_layer = 3 * h * h + 3 * h + h * h + h + 8 * h * h + 5 * h + 4 * h
    assert m.layer_params == per_layer == 12 * h * h + 13 * h
    assert m.parameters == L * per_layer + V * h + s * h + 2 * h
    assert math.isclose(m.parameters - 2 * h, 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h)))


def test_llama_parameters_are_the_matrices():
    m = load_model("llama2-70b")
    h, L, V, f, kv = 8192, 80, 32000, 28672, 1024  # from the model card's config (models/llama2-70b.yaml)
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h
    assert m.parameters == L * per_layer + V * h + V * h + h == 68_976_648_192


@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize("B, L, h, s, V", [(8, 2, 64, 32, 100), (512, 24, 2304, 2048, 51200)])
def test_gpt_flops_are_megatrons_formula(B, L, h, s, V, recompute):
    flops = gpt(L, h, 4, s, V).training_flops(B, recompute)
    base = 72 * B * s * L * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V
    extra = {Recompute.NONE: 0, Recompute.SELECTIVE: L * 4 * B * s * s * h,
             Recompute.FULL: 24 * B * s * L * h * h * (1 + s / (6 * h))}[recompute]
    assert math.isclose(flops.model, base, rel_tol=1e-12)
    assert math.isclose(flops.total, base + extra, rel_tol=1e-12)
    if recompute is Recompute.FULL:  # Narayanan et al. 2021, with recomputation
        assert math.isclose(flops.total, 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel_tol=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_activations_are_korthikantis_formula(tp):
    s, b, h, a = 32, 3, 64, 4
    m = gpt(4, h, a, s, 100)
    assert m.activation_bytes_per_layer(b, tp, Recompute.NONE) == pytest.approx(
        s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))
    assert m.activation_bytes_per_layer(b, tp, Recompute.SELECTIVE) == pytest.approx(s * b * h * (10 + 24 / tp))
    assert m.activation_bytes_per_layer(b, tp, Recompute.FULL) == 2 * s * b * h
    assert m.activation_bytes_per_layer(b, tp, Recompute.NONE, 4) == pytest.approx(
        2 * s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sequence_parallel_activations_are_korthikantis_equation_4(tp):
    """With sequence parallelism the 10 s b h bytes every rank replicated are
    split too: s b h (34 + 5 a s / h) / t (Korthikanti et al. 2022, eq. 4);
    selective recomputation 34 s b h / t (eq. 6); full recomputation keeps
    the layer's input split, 2 s b h / t."""
    s, b, h, a = 32, 3, 64, 4
    m = gpt(4, h, a, s, 100)
    assert m.activation_bytes_per_layer(b, tp, Recompute.NONE, sequence_parallel=True) == pytest.approx(
        s * b * h * (34 + 5 * a * s / h) / tp)
    assert m.activation_bytes_per_layer(b, tp, Recompute.SELECTIVE, sequence_parallel=True) == pytest.approx(
        34 * s * b * h / tp)
    assert m.activation_bytes_per_layer(b, tp, Recompute.FULL, sequence_parallel=True) == pytest.approx(
        2 * s * b * h / tp)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_memory_per_device_by_hand(attention, sp):
    """Korthikanti et al.'s count, with and without sequence parallelism; a
    flash attention stores no 5 a s^2 b of scores (not even in the layer full
    recomputation rebuilds)."""
    L, h, a, s, V = 4, 64, 4, 32, 128
    m = gpt(L, h, a, s, V)
    tp, dp, pp, b, B = 2, 2, 2, 2, 16  # m = 16 / (2 x 2) = 4 micro-batches, 2 layers per stage
    training = Training(B, attention=attention, sequence_parallel=sp)
    layer = 12 * h * h + 13 * h
    act = s * b * h * ((10 / tp if sp else 10) + 24 / tp + (5 * a * s / (h * tp) if attention == "unfused" else 0))
    full_input = 2 * s * b * h / (tp if sp else 1)
    first_p = (2 * layer + V * h + s * h) / tp
    first = 18 * first_p + 2 * min(pp, 4) * act  # Megatron-LM: bf16 weights 2 + fp32 grads 4 + Adam 12 bytes
    last_p = (2 * layer + 2 * h + V * h) / tp  # final LayerNorm, the tied embedding's copy
    last = 18 * last_p + 2 * 1 * act + 4 * s * b * V / tp
    memory = memory_per_device(m, training, Configuration(tp, dp, pp, b))
    assert memory.total == pytest.approx(max(first, last))
    assert memory.stage == ("first" if first > last else "last")
    zero1 = memory_per_device(m, Training(B, sharding=Sharding.ZERO1, attention=attention, sequence_parallel=sp),
                              Configuration(tp, dp, pp, b))
    assert zero1.optimizer == pytest.approx(12 * (first_p if first > last else last_p) / dp)
    assert zero1.weights == memory.weights and zero1.gradients == memory.gradients
    zero3 = memory_per_device(m, Training(B, sharding=Sharding.ZERO3, attention=attention, sequence_parallel=sp),
                              Configuration(tp, dp, pp, b))
    p = first_p if zero3.stage == "first" else last_p
    assert zero3.weights == pytest.approx(2 * p / dp + 2 * 2 * layer / tp)
    assert zero3.gradients == pytest.approx(4 * p / dp + 2 * layer / tp)
    full = memory_per_device(m, Training(B, recompute=Recompute.FULL, attention=attention, sequence_parallel=sp),
                             Configuration(tp, dp, pp, b))
    full_first = 18 * first_p + 2 * min(pp, 4) * full_input + act  # one layer rebuilt whole at a time
    full_last = 18 * last_p + 2 * full_input + act + 4 * s * b * V / tp
    assert full.total == pytest.approx(max(full_first, full_last))
    assert full.stage == ("first" if full_first > full_last else "last")


# ================================================================ models and bad input


def test_shipped_models_load_and_inconsistent_sources_keep_the_printed_hidden(cli):
    assert load_model("gpt3-175b").parameters == pytest.approx(175e9, rel=0.01)
    m = load_model("gpt3-1.3b")
    assert (m.hidden, m.heads) == (2048, 24) and m.source_inconsistency
    code, out, err = cli("plan", "--topology", "dgx-a100", "--scale", "node=1", "--model", "gpt3-1.3b",
                         "--global-batch", "8", "--micro-batch", "1", "--json", "--no-verify")
    assert code == 0 and "uses hidden=2048 as printed" in err
    assert {c["axes"]["tp"] for c in json.loads(out)["configurations"]} == {1, 2, 4, 8}  # divide 24 and 2048


def test_model_yaml_with_an_unknown_field(cli, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 100, "colour": 1}))
    msg = usage_error(cli, "plan", "--topology", "dgx-a100", "--model", path, "--global-batch", "8")
    assert msg == (f"{path}: unknown model field 'colour'; known fields are layers, hidden, heads, seq, vocab, ffn, "
                   "kv_heads, params, head_dim, train_batch_tokens, mtp_depth, gated_mlp, biases, tied_embeddings, "
                   "name, description, source, source_inconsistency, dropout, attention_dropout, mlp, norm, positions, moe, mla")


# ================================================================ architecture fields


@pytest.mark.parametrize("mlp, matrices, wide", [("gelu", 2, 2), ("relu", 2, 1), ("squared_relu", 2, 2),
                                                 ("swiglu", 3, 3)])
@pytest.mark.parametrize("biases", [True, False])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_architecture_fields_count_parameters_and_activations_by_hand(mlp, matrices, wide, biases, norm, positions):
    """mlp, biases, norm and positions each change what is counted: the MLP's
    matrices and the tensors it keeps (GeLU its input and output, ReLU only
    its output, squared ReLU two, SwiGLU three), the biases (a gated up GEMM
    has 2 f of them), 2 or 1 parameters per norm width, learned positions
    s h; and a model file that gives them builds the same model again."""
    L, h, a, kv_heads, f, s, V = 3, 64, 4, 2, 96, 32, 100
    spec = (f"layers={L},hidden={h},heads={a},kv_heads={kv_heads},ffn={f},seq={s},vocab={V},mlp={mlp},"
            f"biases={str(biases).lower()},norm={norm},positions={positions}")
    m = parse_inline_model(spec)
    kv = h * kv_heads // a
    norm_params = (2 if norm == "layernorm" else 1) * h
    bias_params = (h + 2 * kv) + h + (matrices - 1) * f + h if biases else 0
    layer = h * (h + 2 * kv) + h * h + matrices * h * f + bias_params + 2 * norm_params
    assert m.layer_params == layer
    assert m.parameters == L * layer + V * h + (s * h if positions == "learned" else 0) + norm_params
    b, tp = 2, 2
    act = s * b * h * 10 + (2 * s * b * h + 4 * s * b * kv + 2 * s * b * h + 2 * wide * s * b * f) / tp
    assert m.activation_bytes_per_layer(b, tp, Recompute.NONE, scores=False) == pytest.approx(act)
    again = parse_inline_model(",".join(f"{k}={str(v).lower()}" for k, v in {
        "layers": L, "hidden": h, "heads": a, "kv_heads": kv_heads, "ffn": f, "seq": s, "vocab": V,
        **m.architecture_fields()}.items()))
    assert again == replace(m, name="inline")


def test_gated_mlp_is_swiglu_and_the_family_defaults():
    """gated_mlp: true is mlp: swiglu with Llama's defaults (no biases,
    RMSNorm, rotary); other MLPs default to GPT's; contradicting fields and
    unknown values are refused naming the field."""
    llama = parse_inline_model("layers=2,hidden=64,heads=4,ffn=96,gated_mlp=true,seq=8,vocab=10")
    assert llama == parse_inline_model("layers=2,hidden=64,heads=4,ffn=96,mlp=swiglu,seq=8,vocab=10")
    assert (llama.mlp, llama.biases, llama.norm, llama.positions) == ("swiglu", False, "rmsnorm", "rotary")
    relu = parse_inline_model("layers=2,hidden=64,heads=4,mlp=relu,seq=8,vocab=10")
    assert (relu.gated_mlp, relu.biases, relu.norm, relu.positions) == (False, True, "layernorm", "learned")
    with pytest.raises(SynthError, match=r"model fields 'gated_mlp' \(true\) and 'mlp' \(gelu\) disagree"):
        parse_inline_model("layers=2,hidden=64,heads=4,ffn=96,gated_mlp=true,mlp=gelu,seq=8,vocab=10")
    with pytest.raises(SynthError, match="model field 'mlp' must be one of gelu, swiglu, relu, squared_relu, "
                                         "got 'geglu'"):
        parse_inline_model("layers=2,hidden=64,heads=4,mlp=geglu,seq=8,vocab=10")
    with pytest.raises(SynthError, match="model field 'ffn' is required with a SwiGLU MLP"):
        parse_inline_model("layers=2,hidden=64,heads=4,mlp=swiglu,seq=8,vocab=10")


def test_mixtral_counts_are_mistrals():
    """Mixtral 8x7B: 46.7B parameters, 12.9B active per token (Mistral AI's
    figures), counted matrix by matrix here."""
    m = load_model("mixtral-8x7b")
    h, L, V, f, kv = 4096, 32, 32000, 14336, 1024
    attention = h * h + 2 * h * kv + h * h + 2 * h  # q, k, v, o, two RMSNorms
    layer = attention + h * 8 + 8 * 3 * h * f  # router and 8 SwiGLU experts
    assert m.parameters == L * layer + 2 * V * h + h == 46_702_792_704
    assert m.active_parameters == m.parameters - L * 6 * 3 * h * f == 12_879_925_248
    assert round(m.parameters / 1e9, 1) == 46.7 and round(m.active_parameters / 1e9, 1) == 12.9


def test_moe_flops_memory_and_dense_layers_by_hand():
    """An MoE layer computes its attention, router and the top_k routed plus
    the shared experts per token; the first dense_layers layers are dense.
    Memory: the routed experts split over tp x ep, the rest over tp; ZeRO-1
    shards the dense states over dp x ep and the experts' over dp; the MoE
    layers keep the experts' wide tensors, the routed copies of their input
    and the router's probabilities."""
    m = parse_inline_model(MOE + ",dense_layers=1")
    h, f, fe, s, V, E = 64, 96, 48, 32, 100, 8
    T = 2 * s  # micro-batch 2
    attention_matrices = 4 * h * h
    dense_forward = 2 * T * (attention_matrices + 3 * h * f) + 4 * T * s * h
    moe_forward = 2 * T * (attention_matrices + h * E + (2 + 1) * 3 * h * fe) + 4 * T * s * h
    flops = m.training_flops(2)
    assert flops.forward == pytest.approx(dense_forward + 3 * moe_forward + 2 * T * h * V)
    assert flops.model == pytest.approx(3 * flops.forward)
    # memory of tp=2 ep=2 dp=2 pp=2 (2 layers per stage: the first holds the dense layer), zero1
    config = Configuration(2, 2, 2, 2, ep=2)
    training = Training(16, sharding=Sharding.ZERO1, sequence_parallel=False)
    assert config.replicas == 4 and config.micro_batches(training) == 2 and config.devices == 16
    expert = 3 * h * fe
    moe_layer = attention_matrices + 2 * h + h * E + (E + 1) * expert
    dense_layer = attention_matrices + 2 * h + 3 * h * f
    first_dense = (dense_layer + moe_layer - E * expert + V * h) / 2  # / tp
    first_routed = E * expert / (2 * 2)  # / (tp ep)
    layout = (2, 2)
    assert stage_mix(m, layout) == {"first": (1, 1), "last": (0, 2)}
    assert stage_parameters(m, layout)["first"] == 2 * first_dense + 4 * first_routed
    assert stage_routed_parameters(m, layout) == {"first": E * expert, "last": 2 * E * expert}
    b, kv = 2, h
    moe_act = 10 * s * b * h + (2 * s * b * h + 4 * s * b * kv + 2 * s * b * h + 2 * 3 * s * b * 3 * fe
                                + 2 * s * b * h * 2 + 4 * s * b * E) / 2
    assert m.activation_bytes_per_layer(b, 2, Recompute.NONE, scores=False, moe=True) == pytest.approx(moe_act)
    memory = memory_per_device(m, training, config)  # the last stage, two MoE layers and the head, is the worst
    last_dense = (2 * (moe_layer - E * expert) + V * h + h) / 2
    last_routed = 2 * E * expert / 4
    assert memory.stage == "last"
    assert memory.weights == pytest.approx(2 * (last_dense + last_routed))
    assert memory.gradients == pytest.approx(4 * (last_dense + last_routed))  # Megatron-LM's fp32 main gradients
    assert memory.optimizer == pytest.approx(12 * (last_dense / 4 + last_routed / 2))
    assert memory.activations == pytest.approx(2 * moe_act + 4 * s * b * V / 2)
