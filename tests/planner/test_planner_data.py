"""Checks on the planner's transcribed data: models/*.yaml, data/megatron_sc21.jsonl,
data/gpus.yaml.

The checks are there to catch transcription errors. When one fails, fix the
transcription from the source (see data/README.md); do not loosen the check.

Parameter-count tolerance. The counts below are computed independently from the
architecture fields and compared with the count the source states:

* GPT-style models (4h MLP): Megatron's count (Narayanan et al. 2021)
  P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)), which includes weights and biases of
  attention and MLP, both layer norms of every layer, learned position embeddings (s h)
  and one (tied) V x h embedding.
* Llama-style models (gated MLP, GQA): the matrices themselves, per layer
  h*h (q) + 2*h*(h*kv_heads/heads) (k, v) + h*h (o) + 3*h*ffn (gate, up, down) + 2*h
  (two RMSNorm weights), plus V*h input embeddings, V*h untied output head and the
  final norm (h).

What these formulas leave out is tiny: the final layer norm of GPT models (2h), any
padding of the vocabulary the source does not state, biases Llama does not have. All of
it is far below 1% for every model here, so 1% (IGNORED_REL) covers it. The rest of the
gap comes from the source rounding its figure: "7B" is a label for a model whose matrices
count 6.74B. That rounding is bounded by half a unit of the last significant digit of the
stated figure ("7B": 0.5B; "2.7B": 0.05B; "175.0B" is read as 175B: 0.5B). The allowed
relative error is IGNORED_REL plus that rounding bound, and never more than MAX_REL (4%).
The Megatron Table 1 counts are printed to 0.1B and come from the very formula above, so
those are checked exactly: the computed count must round to the printed figure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "models").glob("*.yaml"))
MEGATRON = ROOT / "data" / "megatron_sc21.jsonl"
GPUS = ROOT / "data" / "gpus.yaml"
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))

REQUIRED_INT = ("layers", "hidden", "heads", "seq", "vocab")
OPTIONAL_INT = ("ffn", "kv_heads", "params", "head_dim", "train_batch_tokens")
IGNORED_REL = 0.01
MAX_REL = 0.04

# A100 dense BF16/FP16 tensor-core peak, the figure Narayanan et al. divide by.
A100_PEAK_TFLOPS = 312


def _load(path: Path) -> dict:
    with path.open() as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), f"{path.name}: not a mapping"
    return data


def _megatron_rows() -> list[dict]:
    with MEGATRON.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def gpt_params(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Megatron's parameter count for a GPT model with a 4h MLP."""
    L, h = layers, hidden
    return 12 * L * h * h * (1 + 13 / (12 * h) + (vocab + seq) / (12 * L * h))


def gated_params(m: dict) -> int:
    """Parameter count of a Llama-style model, matrix by matrix."""
    h, L, V = m["hidden"], m["layers"], m["vocab"]
    heads = m["heads"]
    kv = m.get("kv_heads", heads)
    ffn = m["ffn"]
    assert (h * kv) % heads == 0
    kv_dim = h * kv // heads
    per_layer = h * h + 2 * h * kv_dim + h * h + 3 * h * ffn + 2 * h
    embeddings = V * h
    head = V * h if m.get("tied_embeddings") is False else 0
    return L * per_layer + embeddings + head + h


def moe_params(m: dict) -> int:
    """Parameter count of a Llama-style MoE model (a ``moe`` block): dense
    layers first, then layers whose MLP is a router, routed and shared experts."""
    h, L, V, moe = m["hidden"], m["layers"], m["vocab"], m["moe"]
    heads = m["heads"]
    kv_dim = h * m.get("kv_heads", heads) // heads
    attention = h * h + 2 * h * kv_dim + h * h + 2 * h  # q, k, v, o and the two RMSNorms
    if "mla" in m:  # latent attention: q down and up, kv down and up, o; the latents' norms; the layer's two
        r_q, r_kv, rope = m["mla"]["q_lora_rank"], m["mla"]["kv_lora_rank"], m["mla"]["qk_rope_head_dim"]
        nope, v = m["mla"]["qk_nope_head_dim"], m["mla"]["v_head_dim"]
        attention = (h * r_q + r_q * heads * (nope + rope) + h * (r_kv + rope) + r_kv * heads * (nope + v)
                     + heads * v * h + r_q + r_kv + 2 * h)
    expert = 3 * h * moe["expert_ffn"]
    dense_layers = moe.get("dense_layers", 0)
    moe_layer = attention + h * moe["experts"] + (moe["experts"] + moe.get("shared_experts", 0)) * expert
    layers = dense_layers * (attention + 3 * h * m["ffn"]) + (L - dense_layers) * moe_layer
    head = V * h if m.get("tied_embeddings") is False else 0
    return layers + V * h + head + h


def computed_params(m: dict) -> float:
    if "moe" in m:
        return moe_params(m)
    if m.get("gated_mlp"):
        return gated_params(m)
    assert "ffn" not in m or m["ffn"] == 4 * m["hidden"]
    return gpt_params(m["layers"], m["hidden"], m["vocab"], m["seq"])


def rounding_bound(stated: int) -> float:
    """Half a unit of the last significant digit of a stated count, relative to it."""
    digits = str(stated)
    significant = digits.rstrip("0")
    unit = 10 ** (len(digits) - len(significant))
    return 0.5 * unit / stated


# ---------------------------------------------------------------- model files


def test_model_files_exist():
    names = {p.stem for p in MODELS}
    for want in ("gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b",
                 "llama2-7b", "llama2-13b", "llama2-70b"):
        assert want in names
    megatron = {r["model"] for r in _megatron_rows()}
    assert megatron <= names, megatron - names


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_model_fields(path: Path):
    m = _load(path)
    assert m.get("name") == path.stem
    for key in ("description", "source"):
        assert isinstance(m.get(key), str) and m[key].strip(), f"{path.name}: {key}"
    for key in REQUIRED_INT:
        value = m.get(key)
        assert isinstance(value, int) and not isinstance(value, bool), f"{path.name}: {key}={value!r}"
        assert value > 0, f"{path.name}: {key}"
    for key in OPTIONAL_INT:
        if key in m:
            value = m[key]
            assert isinstance(value, int) and not isinstance(value, bool), f"{path.name}: {key}={value!r}"
            assert value > 0, f"{path.name}: {key}"
    if "gated_mlp" in m:
        assert m["gated_mlp"] is True  # omit the field otherwise
        assert "ffn" in m, f"{path.name}: a gated MLP needs its ffn size"
    if "ffn" in m and not m.get("gated_mlp"):
        assert m["ffn"] != 4 * m["hidden"], f"{path.name}: omit ffn when it is 4 x hidden"
    if "kv_heads" in m:
        assert m["kv_heads"] < m["heads"], f"{path.name}: omit kv_heads when equal to heads"
        assert m["heads"] % m["kv_heads"] == 0
    if "tied_embeddings" in m:
        assert isinstance(m["tied_embeddings"], bool)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_model_heads_divide_hidden(path: Path):
    """hidden = heads x head size, unless the file records that its source disagrees."""
    m = _load(path)
    consistent = m["hidden"] % m["heads"] == 0
    if "head_dim" in m:  # the projections' heads
        consistent = consistent and m["heads"] * m["head_dim"] == m["hidden"]
    if not consistent:
        assert isinstance(m.get("source_inconsistency"), str), (
            f"{path.name}: hidden {m['hidden']} does not match heads {m['heads']}"
            f" x head_dim {m.get('head_dim')}; fix it or document the source's inconsistency")
    else:
        assert "source_inconsistency" not in m


@pytest.mark.parametrize("path", [p for p in MODELS if "params" in _load(p)], ids=lambda p: p.name)
def test_model_params_match_stated(path: Path):
    m = _load(path)
    stated = m["params"]
    computed = computed_params(m)
    allowed = min(MAX_REL, IGNORED_REL + rounding_bound(stated))
    rel = abs(computed - stated) / stated
    assert rel <= allowed, (
        f"{path.name}: computed {computed:,.0f} vs stated {stated:,} ({rel:.2%} > {allowed:.2%})")


def test_llama_matrix_counts_pinned():
    """The Llama 2 matrix counts, pinned when the files were transcribed (the stated
    "7B"/"70B" labels are too coarse to catch a mistyped ffn or kv_heads on their own)."""
    expected = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320,
                "llama2-70b": 68_976_648_192}
    for name, count in expected.items():
        assert gated_params(_load(ROOT / "models" / f"{name}.yaml")) == count


# ------------------------------------------------------- Megatron SC'21 Table 1


def test_megatron_table_shape():
    rows = _megatron_rows()
    assert [r["row"] for r in rows] == list(range(1, 11))
    for r in rows:
        assert isinstance(r["source"], str) and "2104.04473" in r["source"]
        for key in ("attention_heads", "hidden_size", "layers", "tp", "pp", "gpus",
                    "batch_size", "tflops_per_gpu", "percent_of_peak", "dp"):
            assert isinstance(r[key], int) and r[key] > 0, (r["row"], key)
        assert r["seq_length"] == 2048 and r["vocab_size"] == 51200


@pytest.mark.parametrize("row", _megatron_rows(), ids=lambda r: r["model"])
def test_megatron_parallelism(row: dict):
    tp, pp, gpus = row["tp"], row["pp"], row["gpus"]
    assert gpus % (tp * pp) == 0
    assert row["dp"] == gpus // (tp * pp)
    assert tp * pp * row["dp"] == gpus
    assert row["attention_heads"] % tp == 0
    assert row["hidden_size"] % row["attention_heads"] == 0
    assert row["layers"] % pp == 0
    # the authors' reproduction script runs NNODES nodes of 8 GPUs
    assert row["script_nnodes"] * 8 == gpus
    mbs = row["micro_batch_size"]
    assert row["batch_size"] % (row["dp"] * mbs) == 0
    vstage = row["layers_per_virtual_stage"]
    if vstage is not None:
        assert (row["layers"] // pp) % vstage == 0


@pytest.mark.parametrize("row", _megatron_rows(), ids=lambda r: r["model"])
def test_megatron_aggregate_throughput(row: dict):
    """aggregate PFLOP/s = per-GPU TFLOP/s x GPUs / 1000, within the printed rounding:
    per-GPU figures are printed to 1 TFLOP/s (+-0.5 each), aggregates to 0.1 PFLOP/s."""
    product = row["tflops_per_gpu"] * row["gpus"] / 1000
    slack = 0.5 * row["gpus"] / 1000 + 0.05
    assert abs(row["aggregate_pflops"] - product) <= slack, (product, row["aggregate_pflops"])


@pytest.mark.parametrize("row", _megatron_rows(), ids=lambda r: r["model"])
def test_megatron_percent_of_peak(row: dict):
    """percentage of peak = per-GPU TFLOP/s / 312, within the printed rounding
    (percent to 1%, +-0.5; per-GPU TFLOP/s to 1, +-0.5/312 = 0.16%)."""
    pct = 100 * row["tflops_per_gpu"] / A100_PEAK_TFLOPS
    assert abs(row["percent_of_peak"] - pct) <= 0.5 + 100 * 0.5 / A100_PEAK_TFLOPS, pct
    # and consistent with the aggregate figure as well
    pct_agg = 100 * row["aggregate_pflops"] * 1000 / row["gpus"] / A100_PEAK_TFLOPS
    slack = 0.5 + 100 * (0.05 * 1000 / row["gpus"]) / A100_PEAK_TFLOPS
    assert abs(row["percent_of_peak"] - pct_agg) <= slack, pct_agg


@pytest.mark.parametrize("row", _megatron_rows(), ids=lambda r: r["model"])
def test_megatron_params_round_to_table(row: dict):
    computed = gpt_params(row["layers"], row["hidden_size"], row["vocab_size"], row["seq_length"])
    assert round(computed / 1e9, 1) == row["params_billion"], computed


@pytest.mark.parametrize("row", _megatron_rows(), ids=lambda r: r["model"])
def test_megatron_rows_match_model_files(row: dict):
    m = _load(ROOT / "models" / f"{row['model']}.yaml")
    assert (m["layers"], m["hidden"], m["heads"]) == (row["layers"], row["hidden_size"], row["attention_heads"])
    assert (m["seq"], m["vocab"]) == (row["seq_length"], row["vocab_size"])
    assert m["params"] == round(row["params_billion"] * 1e9)


def test_megatron_peak_matches_gpu_table():
    gpus = _load(GPUS)["gpus"]
    for r in _megatron_rows():
        assert gpus[r["gpu"]]["peak_TFLOPs"] == A100_PEAK_TFLOPS


# ---------------------------------------------------------------------- GPUs


def test_gpu_entries():
    data = _load(GPUS)
    for key, g in data["gpus"].items():
        assert isinstance(g["memory_GB"], int) and g["memory_GB"] > 0, key
        assert isinstance(g["peak_TFLOPs"], (int, float)) and g["peak_TFLOPs"] > 0, key
        assert isinstance(g["sources"], dict) and g["sources"], key
        if "nvidia_smi_total_MiB" in g:
            assert isinstance(g["nvidia_smi_total_MiB"], int)
            assert math.isclose(g["memory_GiB"], g["nvidia_smi_total_MiB"] / 1024, abs_tol=0.001), key
            # nvidia-smi's total is within a few percent of the marketed size read as GiB
            assert 0.95 <= g["memory_GiB"] / g["memory_GB"] <= 1.0, key
        elif "memory_GiB_from" in g:  # assumed: another board's measured total, named
            source = data["gpus"][g["memory_GiB_from"]]
            assert g["memory_GiB"] == source["memory_GiB"] and "nvidia_smi_total_MiB" in source, key
            assert g["memory_GB"] == source["memory_GB"], key
        else:
            assert "memory_GiB" not in g, key
        sparse = g.get("peak_TFLOPs_sparse")
        if sparse is not None:
            assert math.isclose(sparse, 2 * g["peak_TFLOPs"], rel_tol=0.001), key
        # the datasheet's HBM bandwidth, with its source
        assert isinstance(g["memory_bandwidth_GBps"], int) and g["memory_bandwidth_GBps"] > 0, key
        assert g["sources"]["memory_bandwidth"], key
    gpus = data["gpus"]  # faster memory of the same family: HBM2e over HBM2, HBM3e over HBM3
    assert gpus["a100-sxm4-80gb"]["memory_bandwidth_GBps"] > gpus["a100-sxm4-40gb"]["memory_bandwidth_GBps"]
    assert gpus["h200-sxm-141gb"]["memory_bandwidth_GBps"] > gpus["h100-sxm5-80gb"]["memory_bandwidth_GBps"]


def test_every_topology_has_a_gpu_entry():
    data = _load(GPUS)
    shipped = {p.stem for p in TOPOLOGIES}
    assert shipped == set(data["topologies"])
    for name, t in data["topologies"].items():
        gpu = t["gpu"]
        assert gpu is None or gpu in data["gpus"], name
        for c in t.get("candidates", []):
            assert c in data["gpus"], (name, c)
        if name.startswith("testbed-") or name == "rack":
            assert gpu is None
