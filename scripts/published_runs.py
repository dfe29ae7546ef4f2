"""Recompute docs/planner.md's "Published runs, recomputed" table: each run's
planner command, its predicted step and throughput, and its error against the
published measurement.

    python scripts/published_runs.py            # the table's rows, recomputed
    python scripts/published_runs.py --check    # exit 1 if the doc's table states another prediction
                                                # (for Meta's rows, also another causal count)

``error`` is predicted over measured throughput less 1, or, for a run
published as a step time, measured over predicted step time less 1 (both:
positive = predicted faster than measured). The measurements are the
sources' own figures, as the table cites them. For Meta's Llama 3 rows the
throughput is also given with the attention core counted causally
(:func:`causal_share`): the sources Meta's figures rest on count it in full,
and docs/planner.md compares both counts.

Megatron-LM's README table (``data/megatron_lm_h100.jsonl``, nine runs) is one
row of the doc's table, a count: the range of the nine errors and how many are
within 10%. Each run is planned as the README ran it (:func:`readme_arguments`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from synth.planner.modelspec import load_model  # noqa: E402  (the repository's, wherever the script runs from)
DOC = REPO / "docs" / "planner.md"

LLAMA_405B = ("--topology dgx-h100 --scale node=2048 --model llama3-405b --global-batch 2048 "
              "--axes tp=8,dp=128,pp=16 --micro-batch 1 --stages uneven --sharding zero2")
LLAMA_128K = ("--topology dgx-h100 --scale node=2048 --model layers=126,hidden=16384,heads=128,kv_heads=8,ffn=53248,"
              "gated_mlp=true,tied_embeddings=false,seq=131072,vocab=128256 --global-batch 128 "
              "--axes tp=8,cp=16,dp=8,pp=16 --micro-batch 1 --stages uneven --sharding zero2 --schedule search "
              "--cp-comm allgather")
DEEPSEEK_V3 = (  # --schedule search picks DualPipe here (--framework deepseek runs it)
               "--topology dgx-h800 --model deepseek-v3 --global-batch 15360 --sharding zero1 "
               "--device memory_GiB=79.647,peak_TFLOPs=989.4 --compute-profile profiles/h100-sxm5-80gb.compute.json "
               "--axes tp=1,ep=64,dp=2,pp=16 --micro-batch 1 --constrain ep@gpu=8 --stages search --schedule search "
               "--recompute search --framework deepseek --ep-overlap")
MEGATRON_462B = ("--topology dgx-h100 --scale node=768 --model megatron-462b --global-batch 3072 "
                 "--axes tp=8,dp=48,pp=16 --micro-batch 1 --sharding zero1 --stages search --recompute search "
                 "--cross-entropy megatron")
TORCHTITAN_8B = ("--topology dgx-h100 --scale node=1 --model llama3-8b --global-batch 16 --axes tp=1,dp=8,pp=1 "
                 "--micro-batch 2 --sharding zero3 --recompute selective --framework torchtitan")
TORCHTITAN_TOKENS_PER_GPU = 16 * 8192 / 8  # sequences x tokens per step / GPUs
# the benchmark's H100: 96 GB of HBM2e at 2.4 TB/s (its Hardware section), profiled by scripts/bandwidth_profile.py
TORCHTITAN_DEVICE = " --device memory_GiB=89.407,peak_TFLOPs=989.4 --compute-profile h100-hbm2e-96gb-500w"
README_TABLE = REPO / "data" / "megatron_lm_h100.jsonl"
README_LABEL = "Megatron-LM README H100 table (9 runs)"


@dataclass(frozen=True)
class Run:
    """One published run: its label, planner arguments, the published figure
    and what it measures (``tflops``: TFLOP/s per GPU, ``step_s``: seconds per
    step, ``tokens``: tokens/s per GPU)."""

    label: str
    arguments: str
    measured: float
    measures: str
    causal_too: bool = False  # also the throughput with the attention core counted causally (causal_share)


RUNS = (
    Run("[1] Llama 3 405B, interleaved (Meta, Table 4)", LLAMA_405B + " --schedule search", 400, "tflops", True),
    Run("[2] the same, zero bubble", LLAMA_405B + " --schedule zero-bubble", 400, "tflops", True),
    Run("[3] Llama 3 405B, 128K stage (Meta, SC'24)", LLAMA_128K, 380, "tflops", True),
    Run("[4] DeepSeek-V3 (arXiv:2412.19437)", DEEPSEEK_V3, 19.9, "step_s"),
    Run("[4] the same in FP8", DEEPSEEK_V3 + " --dtype fp8", 19.9, "step_s"),
    Run("[5] Megatron-LM 462B, interleaved (README)", MEGATRON_462B + " --schedule search", 459.9, "tflops"),
    Run("[6] the same, plain 1F1B", MEGATRON_462B + " --schedule 1f1b", 459.9, "tflops"),
    Run("[7] the same with the README's overlaps, --tp-overlap --overlap-param-gather",
        MEGATRON_462B + " --schedule search --tp-overlap --overlap-param-gather", 459.9, "tflops"),
    Run("[8] torchtitan Llama 3.1 8B (benchmark, Table 1)", TORCHTITAN_8B, 5762, "tokens"),
    Run("[9] the same with Float8 (compiled)", TORCHTITAN_8B + " --dtype fp8", 8532, "tokens"),
    Run("[10] [8] at the benchmark's stated memory bandwidth", TORCHTITAN_8B + TORCHTITAN_DEVICE, 5762, "tokens"),
    Run("[10] the same with Float8 (compiled)", TORCHTITAN_8B + TORCHTITAN_DEVICE + " --dtype fp8", 8532, "tokens"),
)


def readme_arguments(row: dict) -> str:
    """The planner arguments of one row of Megatron-LM's README table, as the
    README ran it: the row's shape and degrees (untied embeddings, as
    models/megatron-462b.yaml infers from the table's parameter counts),
    Megatron-LM's defaults at f2e5db402c for what the README does not state
    (its hidden and attention dropouts, 0.1, and its unfused cross-entropy), the
    distributed optimizer (``--sharding zero1``) with its overlapped parameter
    all-gather, tp's overlap where tp > 1, and for pp > 1 the interleaved
    schedule (the README overlaps pipeline communication, which Megatron-LM
    does only when interleaving: ``megatron/training/arguments.py`` lines
    254-276 at f2e5db402c), its virtual stages the search's pick. Not stated
    by the README: the micro-batch, the search's pick (the fastest that fits),
    and recomputation, searched."""
    shape = (f"layers={row['layers']},hidden={row['hidden_size']},heads={row['attention_heads']},"
             f"seq={row['seq_length']},vocab={row['vocab_size']},tied_embeddings=false,dropout=0.1,attention_dropout=0.1")
    words = [f"--topology dgx-h100 --scale node={row['gpus'] // 8} --model {shape}",
             f"--global-batch {row['batch_size']} --axes tp={row['tp']},dp={row['dp']},pp={row['pp']}",
             "--sharding zero1 --overlap-param-gather --stages search --recompute search --cross-entropy megatron"]
    if row["tp"] > 1:
        words.append("--tp-overlap")
    if row["pp"] > 1:
        words.append("--schedule search")
    return " ".join(words)


def readme_runs() -> tuple[Run, ...]:
    """The nine runs of Megatron-LM's README table, in its order."""
    rows = [json.loads(line) for line in README_TABLE.read_text().splitlines() if line.strip()]
    return tuple(Run(f"Megatron-LM README {row['model_size']}", readme_arguments(row), row["tflops_per_gpu"], "tflops")
                 for row in rows)


def count_cell(errors: list[float], within: float = 0.10) -> str:
    """The table's cells for a count of runs: the errors' range and how many
    lie within ``within`` (in magnitude)."""
    inside = sum(abs(e) <= within for e in errors)
    return f"{min(errors):+.1%} to {max(errors):+.1%} | {inside} of {len(errors)}"


def predict(run: Run) -> dict:
    """The first configuration of the run's ``synth-reduce plan --json``."""
    done = subprocess.run([sys.executable, "-m", "synth.cli", "plan", *run.arguments.split(), "--no-verify",
                           "--top", "1", "--json"], capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"{run.label}: synth-reduce plan failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)["configurations"][0]


def causal_share(run: Run) -> float:
    """The run's model FLOPs with the attention core counted causally (half
    its ``s x s`` score pairs, as a causal kernel computes them) over the
    same FLOPs counted in full (the planner's count, Narayanan et al.'s and
    PaLM's): 1 less half the core's share."""
    words = run.arguments.split()
    model = load_model(words[words.index("--model") + 1])
    flops = model.training_flops(1)
    core = 3 * model.layers * model.attention_core_flops(model.seq)  # forward, and backward twice that
    return 1 - core / 2 / flops.total


def predicted_cell(run: Run, configuration: dict) -> tuple[str, float]:
    """The table's "predicted" text for the run, and its error."""
    step_s = configuration["predicted_step_s"]
    if run.measures == "step_s":
        return f"{step_s:.2f} s", run.measured / step_s - 1
    if run.measures == "tokens":
        tokens = TORCHTITAN_TOKENS_PER_GPU / step_s
        return f"{tokens:,.0f} tokens/s ({step_s:.3f} s)", tokens / run.measured - 1
    tflops = configuration["model_tflops_per_device"]
    return f"{tflops:.0f} TFLOP/s ({step_s:.2f} s)", tflops / run.measured - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/planner.md's table states another prediction")
    args = parser.parse_args()
    text = DOC.read_text()
    start = text.index("## Published runs, recomputed")
    doc = text[start:text.index("\nCommands (", start)]  # the table, not the sections after it
    stale = []
    print("| run | predicted | error |\n| --- | --- | --- |")
    for run in RUNS:
        configuration = predict(run)
        cell, error = predicted_cell(run, configuration)
        causal = ""
        if run.causal_too:
            counted = configuration["model_tflops_per_device"] * causal_share(run)
            causal = f" (counted causally: {counted:.0f} TFLOP/s, {counted / run.measured - 1:+.1%})"
        print(f"| {run.label} | {cell} | {error:+.1%}{causal} |", flush=True)
        if f"| {cell} |" not in doc and f"| {cell};" not in doc:
            stale.append(f"{run.label}: {cell}")
        if run.causal_too and f"| {cell}; {counted:.0f} counted causally |" not in doc:
            stale.append(f"{run.label}: {cell}; {counted:.0f} counted causally")
    errors = []
    for run in readme_runs():
        cell, error = predicted_cell(run, predict(run))
        errors.append(error)
        print(f"| {run.label} | {cell} | {error:+.1%} |", flush=True)
    readme_count = count_cell(errors)
    print(f"| {README_LABEL} | | {readme_count} |")
    if f"| {README_LABEL}" not in doc or f"| {readme_count} |" not in doc:
        stale.append(f"{README_LABEL}: {readme_count}")
    if args.check and stale:
        print("docs/planner.md does not state: " + "; ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
