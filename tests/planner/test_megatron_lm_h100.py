"""Megatron-LM's README H100 table (data/megatron_lm_h100.jsonl): the
transcription checked against itself, the planner's FLOP count against
Megatron-LM's own formula, and the runs scripts/published_runs.py plans from it."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from planner_cases import REPO

from synth.errors import SynthError
from synth.planner.compute import load_compute_profile
from synth.planner.layercompute import layer_compute
from synth.planner.optimes import Shard
from synth.planner.stagecompute import embedding_compute, head_compute
from synth.planner.modelspec import load_model

ROWS = [json.loads(line) for line in (REPO / "data" / "megatron_lm_h100.jsonl").read_text().splitlines() if line]
# The peak the table's MFU column rounds with: 989 TFLOP/s (462B: 459.9 / 989 = 46.50%, printed 47%; over
# data/gpus.yaml's 989.4 it would be 46.48%, printed 46%).
MFU_PEAK_TFLOPS = 989


def _script():
    """scripts/published_runs.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("published_runs", REPO / "scripts" / "published_runs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def megatron_flops(row: dict) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py
    lines 73-108 at f2e5db402c) for a GPT row: no GQA, no MoE, no SwiGLU,
    ffn = 4h, kv_channels = h / heads, padded vocabulary = the vocabulary
    (131,072 is a multiple of 128 x tp)."""
    b, s, l, h, v = row["batch_size"], row["seq_length"], row["layers"], row["hidden_size"], row["vocab_size"]
    return 12 * b * s * l * h * h * ((1 + 1 + s / h) * 1 + 4 * 1 * 1 + v / (2 * l * h))


def test_table_has_nine_rows_in_order():
    assert [r["model_size"] for r in ROWS] == ["1.7B", "7.1B", "16B", "32B", "70B", "119B", "177B", "314B", "462B"]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["model_size"])
def test_row_is_consistent_with_itself(row):
    """GPUs = tp x pp x dp; the aggregate and MFU columns follow from the
    per-GPU throughput as printed (one decimal, whole percent)."""
    assert row["tp"] * row["pp"] * row["dp"] == row["gpus"]
    assert round(row["tflops_per_gpu"] * row["gpus"] / 1000, 1) == row["aggregate_pflops"]
    assert int(100 * row["tflops_per_gpu"] / MFU_PEAK_TFLOPS + 0.5) == row["mfu_percent"]
    assert row["batch_size"] % row["dp"] == 0 and row["layers"] % row["pp"] == 0


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["model_size"])
def test_planner_counts_megatrons_flops(row):
    """The table's TFLOP/s are Megatron-LM's count; the planner's model FLOPs
    (what model_tflops_per_device divides) must be the same count."""
    model = load_model(f"layers={row['layers']},hidden={row['hidden_size']},heads={row['attention_heads']},"
                       f"seq={row['seq_length']},vocab={row['vocab_size']},tied_embeddings=false")
    assert model.training_flops(row["batch_size"]).total == pytest.approx(megatron_flops(row), rel=1e-12)


def test_readme_arguments_as_the_readme_ran_them():
    script = _script()
    runs = script.readme_runs()
    assert [r.measured for r in runs] == [r["tflops_per_gpu"] for r in ROWS]
    small, large = runs[0].arguments.split(), runs[-1].arguments.split()
    assert "--tp-overlap" not in small and "--schedule" not in small  # tp 1, pp 1
    assert "--overlap-param-gather" in small and small[small.index("--sharding") + 1] == "zero1"
    assert "--tp-overlap" in large and large[large.index("--schedule") + 1] == "search"
    assert large[large.index("--axes") + 1] == "tp=8,dp=48,pp=16"
    assert large[large.index("--scale") + 1] == "node=768"
    for words in (small, large):  # Megatron-LM's defaults at f2e5db402c: unfused loss, dropouts 0.1
        assert words[words.index("--cross-entropy") + 1] == "megatron"
        model = load_model(words[words.index("--model") + 1])
        assert model.dropout == 0.1 and model.attention_dropout == 0.1


def test_count_cell_counts_runs_within_ten_percent():
    script = _script()
    assert script.count_cell([0.05, -0.10, 0.101, 0.40]) == "-10.0% to +40.0% | 2 of 4"


# ---------------------------------------------------------------- what Megatron-LM's step runs beside the layers

H100 = load_compute_profile(str(REPO / "profiles" / "h100-sxm5-80gb.compute.json"))
GPT = "layers=2,hidden=2048,heads=16,seq=4096,vocab=131072,tied_embeddings=false"


def test_megatron_loss_moves_its_unfused_passes_by_hand():
    """Megatron-LM's unfused vocabulary-parallel cross-entropy
    (megatron/core/tensor_parallel/cross_entropy.py at f2e5db402c), bytes per
    logit: forward .float() 2+4, max 4, -= max 4+4, exp 4+4, sum 4, div_ 4+4;
    backward mul_ 4+4 and the cast back 4+2."""
    model, shard = load_model(GPT), Shard(2, 1, 4096)
    head = head_compute(H100, model, shard, "megatron")
    loss = {op.name: op.seconds for op in head.ops if op.name.startswith("loss")}
    logits = 4096 * 131072 // 2
    assert loss["loss"] == pytest.approx(float(H100.elementwise.bytes_seconds(38 * logits)))
    assert loss["loss.backward"] == pytest.approx(float(H100.elementwise.bytes_seconds(14 * logits)))
    fused = {op.name: op.seconds for op in head_compute(H100, model, shard, "fused").ops}
    assert loss["loss"] > fused["loss"] and loss["loss.backward"] == pytest.approx(fused["loss.backward"])


def test_dropout_adds_its_masks_by_hand():
    """A model with dropout adds, per layer, two residual branches' masks
    (1 byte forward, 5 backward per value) and, on the first stage, the
    embedding's dropout (5 and 5): the rest of the layer is unchanged."""
    plain, dropped = load_model(GPT), load_model(GPT + ",dropout=0.1")
    shard = Shard(1, 2, 4096)
    values = 2 * 4096 * 2048
    moved = H100.elementwise.bytes_seconds
    layer = layer_compute(H100, dropped, shard).total_s - layer_compute(H100, plain, shard).total_s
    assert layer == pytest.approx(2 * float(moved(1 * values) + moved(5 * values)))
    first = embedding_compute(H100, dropped, shard).total_s - embedding_compute(H100, plain, shard).total_s
    assert first == pytest.approx(2 * float(moved(5 * values)))
    assert dropped.training_flops(4) == plain.training_flops(4)


@pytest.mark.parametrize("value, message", [("1.5", "must be a number from 0 to below 1"), ("x", "must be a number")])
def test_dropout_field_errors_name_it(value, message):
    with pytest.raises(SynthError, match=f"dropout.*{message}"):
        load_model(GPT + f",dropout={value}")
