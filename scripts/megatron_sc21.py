"""The job planner against Megatron-LM's published configurations (Narayanan et
al., SC'21, Table 1: data/megatron_sc21.jsonl).

    python scripts/megatron_sc21.py records   # data/megatron_sc21_steps.jsonl from the table
    python scripts/megatron_sc21.py fit       # the compute curve fitted on all ten rows (DEFAULT_COMPUTE)
    python scripts/megatron_sc21.py compare [--write | --check]

``records`` turns each Table 1 row into a step-time record: the model file, the
DGX A100 topology scaled to the row's GPUs, Megatron's rank order (tensor
parallelism fastest, then data, then pipeline: Megatron-LM's
``initialize_model_parallel``) as a placement, the authors' script's micro-batch,
interleaving and DDP implementation (local DDP all-reduces after the backward
pass: no overlap), fp16, full recomputation and the vocabulary-parallel loss on
fp32 logits (`--cross-entropy megatron`), and the step time DERIVED from
the printed throughput: ``step_s = F / (TFLOP/s x 1e12 x GPUs)`` with the
paper's FLOPs per iteration ``F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h))``.

``compare`` predicts, for every row, Megatron's own configuration and the
planner's best configuration (same model, batch, GPUs and training settings),
each with the compute curve fitted on the OTHER nine rows (leave-one-out), and
prints (or writes between the markers of docs/planner.md) the table of
docs/planner.md. TFLOP/s are counted as the paper counts them (F above, which
includes the recomputed forward).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import synth  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(ROOT))

from synth.planner.activations import Recompute  # noqa: E402
from synth.planner.compute import EfficiencyCurve  # noqa: E402
from synth.planner.configurations import plan_job  # noqa: E402
from synth.planner.modelspec import load_model  # noqa: E402
from synth.planner.request import JobRequest  # noqa: E402
from synth.planner.stepfit import RecordCosts, fit_compute, predicted_step_s  # noqa: E402
from synth.planner.stepmodel import Configuration, Sharding, Training  # noqa: E402
from synth.planner.steprecords import StepRecord, read_step_records, write_step_records  # noqa: E402
from synth.synthesis.placement import Axis, AxisRange, Placement  # noqa: E402
from synth.topology import load_topology  # noqa: E402

TABLE = ROOT / "data" / "megatron_sc21.jsonl"
RECORDS = ROOT / "data" / "megatron_sc21_steps.jsonl"
DOC = ROOT / "docs" / "planner.md"
BEGIN, END = "<!-- megatron-comparison:begin -->", "<!-- megatron-comparison:end -->"


def paper_flops(row: dict) -> float:
    """Narayanan et al. 2021's FLOPs per iteration (with full recomputation)."""
    b, s, L, h, V = row["batch_size"], row["seq_length"], row["layers"], row["hidden_size"], row["vocab_size"]
    return 96 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def table_rows() -> list[dict]:
    return [json.loads(line) for line in TABLE.read_text().splitlines() if line.strip()]


def record_of(row: dict) -> StepRecord:
    gpus, tp, pp, dp = row["gpus"], row["tp"], row["pp"], row["dp"]
    topology = load_topology("dgx-a100").scaled({"node": gpus // 8})
    axes = (Axis("pp", pp), Axis("dp", dp), Axis("tp", tp))
    per_node = 8 // tp  # data-parallel ranks inside a node (tp fills the node first)
    matrix = ((pp, 1), (dp // per_node, per_node), (1, tp))
    placement = Placement(topology, axes, matrix)
    layers_per_stage = row["layers"] // pp
    lpvs = row["layers_per_virtual_stage"]
    config = Configuration(tp, dp, pp, row["micro_batch_size"], layers_per_stage // lpvs if lpvs else 1)
    training = Training(row["batch_size"], "fp16", Sharding.NONE, Recompute.FULL,
                        overlap_dp=row["script_ddp_impl"] == "torch",
                        attention="unfused",  # 2021: Megatron-LM's attention stored its scores (no flash attention)
                        sequence_parallel=False,  # and had no sequence parallelism (Korthikanti et al. 2022)
                        cross_entropy="megatron")  # the vocabulary-parallel loss on fp32 logits (gpt_model.py 52-56)
    step_s = paper_flops(row) / (row["tflops_per_gpu"] * 1e12 * gpus)
    source = (f"derived from Narayanan et al. 2021 (SC'21) Table 1 row {row['row']}: step_s = paper FLOPs / "
              f"({row['tflops_per_gpu']} TFLOP/s x {gpus} GPUs); micro-batch, interleaving and DDP from "
              "NVIDIA/Megatron-LM examples/sc21/run_table_1.sh (data/megatron_sc21.jsonl)")
    return StepRecord(load_model(row["model"]), training, placement, config, step_s, "ring", source)


def tflops(row: dict, step_s: float) -> float:
    return paper_flops(row) / (step_s * row["gpus"]) / 1e12


def cmd_records(_: argparse.Namespace) -> None:
    write_step_records(RECORDS, [record_of(row) for row in table_rows()])
    print(f"wrote {RECORDS.relative_to(ROOT)}")


def cmd_fit(_: argparse.Namespace) -> None:
    fit, points = fit_compute(read_step_records(RECORDS))
    for p in points:
        print(f"{p.record.config.describe():<28} x = {p.flops_per_layer:.4g} FLOP  implied efficiency "
              f"{p.efficiency:.4f}")
    print(f"efficiency_max={fit.profile.efficiency_max!r}, half_flops={fit.profile.half_flops!r}")
    print(f"residuals of 1/efficiency: median {fit.median_rel_error:.2%}, max {fit.max_rel_error:.2%}")


def _breakdown_delta(mine: dict, theirs: dict) -> str:
    """The terms where the planner's choice and Megatron's differ most."""
    deltas = sorted(((mine[k] - theirs[k], k) for k in mine), key=lambda d: -abs(d[0]))
    return ", ".join(f"{k} {d:+.2f} s" for d, k in deltas[:3] if abs(d) >= 0.005) or "same"


def comparison(progress: bool = True) -> tuple[str, float]:
    rows = table_rows()
    records = read_step_records(RECORDS)
    costs = RecordCosts()
    started = time.perf_counter()
    lines = [
        "| row | model | GPUs | batch | Megatron tp/pp/dp, mb (v) | achieved | predicted for Megatron's config "
        "(error) | planner's choice tp/pp/dp, mb | predicted for the planner's choice | planner's choice - Megatron's "
        "config, predicted seconds per step | rank of Megatron's sizes and micro-batch (1F1B) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (row, record) in enumerate(zip(rows, records)):
        others = [r for j, r in enumerate(records) if j != i]
        fit, _ = fit_compute(others, costs, source=f"leave-one-out fit without row {row['row']}")
        compute: EfficiencyCurve = fit.profile
        theirs_s = predicted_step_s(record, compute, costs)
        topology = record.topology
        request = JobRequest(topology, topology.device, record.model, record.training,
                             (AxisRange("tp"), AxisRange("dp"), AxisRange("pp")), compute=compute)
        solution = plan_job(request)
        best = solution.best
        theirs = _megatron_breakdown(record, compute, costs)
        c = record.config
        v = f" (v={c.virtual_stages})" if c.virtual_stages > 1 else ""
        mine = best.config
        lines.append(
            f"| {row['row']} | {row['model']} | {row['gpus']} | {row['batch_size']} | {c.tp}/{c.pp}/{c.dp}, "
            f"{c.micro_batch}{v} | {row['tflops_per_gpu']} | {tflops(row, theirs_s):.0f} "
            f"({tflops(row, theirs_s) / row['tflops_per_gpu'] - 1:+.0%}) | "
            f"{mine.tp}/{mine.pp}/{mine.dp}, {mine.micro_batch}{_tp_where(best)} | "
            f"{tflops(row, best.predicted_step_s):.0f} | "
            f"{_breakdown_delta(best.step.breakdown(), theirs)} | {_rank_of(solution, c)} |")
        if progress:
            print(f"row {row['row']}: {solution.evaluated} configurations in {solution.elapsed_s:.1f} s",
                  file=sys.stderr)
    return "\n".join(lines), time.perf_counter() - started


def _tp_where(candidate) -> str:
    """Whether the planner's tensor-parallel groups stay inside a node."""
    if candidate.config.tp == 1:
        return ""
    row = candidate.placement.matrix[candidate.placement.axis_names.index("tp")]
    return " (tp in a node)" if all(v == 1 for v in row[:-1]) else " (tp across nodes)"


def _rank_of(solution, config: Configuration) -> str:
    """Where Megatron's sizes and micro-batch (plain 1F1B) stand in the planner's list."""
    for n, candidate in enumerate(solution.candidates, 1):
        k = candidate.config
        if (k.tp, k.dp, k.pp, k.micro_batch) == (config.tp, config.dp, config.pp, config.micro_batch):
            return f"{n} of {len(solution.candidates)}" + ("" if candidate.feasible else " (does not fit)")
    return "not evaluated"


def _megatron_breakdown(record: StepRecord, compute: EfficiencyCurve, costs: RecordCosts) -> dict:
    from synth.planner.stepmodel import compute_estimate, step_shape, step_time

    shape = step_shape(record.model, record.training, record.config)
    estimate = compute_estimate(record.model, record.training, record.config, record.device, compute, shape)
    return step_time(record.model, record.training, record.config, costs.of(record).on(record.placement),
                     estimate.micro_batch_s, estimate.efficiency, shape, estimate.optimizer_s).breakdown()


def cmd_compare(args: argparse.Namespace) -> None:
    table, elapsed = comparison()
    if not (args.write or args.check):
        print(table)
        return
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: the markers {BEGIN} and {END} are missing")
    head, rest = text.split(BEGIN, 1)
    stated, tail = rest.split(END, 1)
    if args.check:
        if stated.strip() != table.strip():
            print(table)
            raise SystemExit(f"{DOC.relative_to(ROOT)}: the comparison between its markers is not what the planner "
                             "predicts now (above); regenerate it with: python scripts/megatron_sc21.py compare --write")
        print(f"{DOC.relative_to(ROOT)}: the comparison is current ({elapsed:.0f} s)")
        return
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    print(f"wrote the comparison into {DOC.relative_to(ROOT)} ({elapsed:.0f} s)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("records", help="write data/megatron_sc21_steps.jsonl").set_defaults(run=cmd_records)
    sub.add_parser("fit", help="fit the compute curve on all rows").set_defaults(run=cmd_fit)
    compare = sub.add_parser("compare", help="the comparison table")
    compare.add_argument("--write", action="store_true", help="write it into docs/planner.md")
    compare.add_argument("--check", action="store_true", help="exit 1 unless docs/planner.md states it as it is now")
    compare.set_defaults(run=cmd_compare)
    args = p.parse_args()
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
