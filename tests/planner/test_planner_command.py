"""``synth-reduce plan``'s options and bad input: one-line errors, the
memory margin, sequence parallelism, the schedule, recomputation search,
experts, context parallelism and HSDP written to JSON and plans."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import usage_error
from planner_cases import MOE, TINY

from synth.errors import SynthError
from synth.plan import load_plan


BASE = ("plan", "--topology", "dgx-a100", "--scale", "node=2", "--model", TINY, "--global-batch", "16")


@pytest.mark.parametrize("extra, expected", [
    (("--model", TINY + ",depth=3"), "--model: unknown model field 'depth'; inline fields are layers, hidden"),
    (("--model", "layers=4,hidden=256,heads=8,seq=128"), "--model: missing model field 'vocab'"),
    (("--model", "layers=4,hidden=256,heads=8,seq=128,vocab=x"), "--model vocab=x: must be an integer >= 1"),
    (("--scale", "node=3", "--axes", "tp=3,dp,pp"), "tp=3 does not divide the model's heads (8)"),
    (("--axes", "tp,dp,pp=8"), "pp=8 does not divide the model's layers (4)"),
    (("--axes", "tp=2,dp=8,pp", "--micro-batch", "3"), "--global-batch 16 is not divisible by dp x micro-batch = "
                                                         "8 x 3"),
    (("--axes", "tp>=32,dp,pp"), "--axes 'tp>=32,dp,pp': no sizes within the bounds multiply to the 16 devices"),
    (("--axes", "8<=tp<=4,dp"), "--axes '8<=tp<=4': the lower bound 8 is above the upper bound 4"),
    (("--axes", "tp,mp"), "--axes: unknown axis 'mp'; the planner's axes are tp, cp, ep, dp and pp"),
    (("--axes", "tp,ep=2,dp"), "ep=2: the model has no experts to split (give it a moe: block)"),
    (("--global-batch", "0"), "--global-batch 0: must be >= 1"),
    (("--micro-batch", "2,x"), "--micro-batch 'x': give micro-batch sizes as integers >= 1"),
    (("--sharding", "zero4"), "--sharding zero4: choose one of none, zero1, zero2, zero3 (fsdp), hsdp"),
    (("--recompute", "most"), "--recompute most: choose one of none, selective, full"),
    (("--virtual-stages", "2"), "--virtual-stages 2: only the interleaved schedule runs virtual stages; add "
                                "--schedule interleaved (or search)"),
    (("--virtual-stages", "1", "--schedule", "interleaved"), "--virtual-stages 1: virtual stages per device, an "
                                                             "integer >= 2"),
    (("--schedule", "gpipe"), "argument --schedule: invalid choice: 'gpipe'"),
    (("--device", "memory_GiB=lots"), "--device memory_GiB=lots: must be a number"),
    (("--constrain", "tp@rack=1"), "unknown level 'rack'"),
    (("--model", "no-such-model"), "--model 'no-such-model': not a file, a shipped model (deepseek-v3, gpt3-1.3b"),
])
def test_bad_plan_input(cli, extra, expected):
    argv = list(BASE)
    for option, value in zip(extra[::2], extra[1::2]):
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    assert expected in usage_error(cli, *argv)


def test_a_topology_without_a_device_needs_one(cli):
    msg = usage_error(cli, "plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "8")
    assert msg == ("topology 'testbed-2x4' has no 'device' (memory_GiB, peak_TFLOPs): add one to the topology file "
                   "or pass --device memory_GiB=M,peak_TFLOPs=P")
    code, out, _ = cli("plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "8", "--device",
                       "memory_GiB=2,peak_TFLOPs=0.1", "--json", "--no-verify")
    assert code == 0 and json.loads(out)["device"]["memory_GiB"] == 2


def test_a_memory_margin_keeps_room_free(cli):
    """GPT-2.7B at micro-batch 4 on one H100 counts 62.3 GiB: it fits in 79.6
    GiB less the default margin (5% of the device: 3.982 GiB), and not once 20
    GiB are kept free; the margin is in the reason and the JSON, and a margin
    that leaves nothing is refused."""
    common = ["plan", "--topology", "dgx-h100", "--scale", "node=1,gpu=1", "--model", "gpt3-2.7b", "--global-batch",
              "8", "--axes", "tp=1,dp=1,pp=1", "--micro-batch", "4", "--no-verify", "--json"]
    fits = json.loads(cli(*common)[1])
    assert fits["memory_margin_GiB"] == round(0.05 * 79.647, 3) and fits["configurations"][0]["feasible"]
    assert json.loads(cli(*common, "--memory-margin", "0")[1])["memory_margin_GiB"] == 0
    memory = fits["configurations"][0]["memory_bytes_per_device"]
    assert 60 * 2**30 < memory < 79.647 * 2**30 - 12 * 2**30
    tight = json.loads(cli(*common, "--memory-margin", "20")[1])
    assert tight["memory_margin_GiB"] == 20 and not tight["configurations"][0]["feasible"]
    assert tight["configurations"][0]["reason"].endswith("> 79.647 GiB - 20 GiB margin")
    assert json.loads(cli(*common, "--memory-margin", "12")[1])["configurations"][0]["feasible"]
    # the boundary, from the counted memory (which no margin changes): fits up to capacity - memory
    room_GiB = 79.647 - memory / 2**30
    for margin, fits_then in ((room_GiB - 0.01, True), (room_GiB + 0.01, False)):
        c = json.loads(cli(*common, "--memory-margin", f"{margin:.3f}")[1])["configurations"][0]
        assert c["feasible"] is fits_then and c["memory_bytes_per_device"] == memory
    assert "--memory-margin 80: GiB kept free per device, >= 0 and below the device's 79.647 GiB" in usage_error(
        cli, *common, "--memory-margin", "80")
    assert "--memory-margin 'lots': a number of GiB" in usage_error(cli, *common, "--memory-margin", "lots")


def test_plan_sequence_parallel_option_and_json(cli):
    """--sequence-parallel on (the default) applies where tp > 1, per
    configuration in --json; off keeps every tp all-reduce and the replicated
    activations: the same configuration needs more memory."""
    common = ["plan", "--topology", "dgx-h100", "--scale", "node=1", "--model", "gpt3-2.7b", "--global-batch", "8",
              "--axes", "tp,dp", "--micro-batch", "1", "--no-verify", "--json"]
    on = json.loads(cli(*common)[1])
    assert on["training"]["sequence_parallel"] is True
    by_tp = {c["axes"]["tp"]: c for c in on["configurations"]}
    assert by_tp[1]["sequence_parallel"] is False and by_tp[8]["sequence_parallel"] is True
    off = json.loads(cli(*common, "--sequence-parallel", "off")[1])
    assert off["training"]["sequence_parallel"] is False
    off_by_tp = {c["axes"]["tp"]: c for c in off["configurations"]}
    assert off_by_tp[8]["sequence_parallel"] is False
    assert off_by_tp[8]["memory"]["activations"] > by_tp[8]["memory"]["activations"]
    assert off_by_tp[1]["memory"] == by_tp[1]["memory"]
    assert "argument --sequence-parallel: invalid choice: 'maybe'" in usage_error(
        cli, *common, "--sequence-parallel", "maybe")
    code, text, _ = cli(*common[:-1])
    assert code == 0 and "sequence parallel on where tp > 1" in text


def test_plan_plot_draws_the_listed_configurations(cli, tmp_path, monkeypatch):
    """--plot writes a picture of the listed configurations (one bar per
    configuration in each panel); without matplotlib it says which extra to
    install before planning; --top 0 leaves nothing to draw."""
    import matplotlib.image

    from synth.cli import plan_plot

    path = tmp_path / "plan.png"
    drawn = []
    real = plan_plot.plot_plan
    monkeypatch.setattr("synth.cli.plan.plot_plan", lambda s, listed, p: (drawn.append(listed), real(s, listed, p)))
    code, text, _ = cli(*BASE, "--no-verify", "--top", "3", "--plot", path)
    assert code == 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(drawn[0]) == 3 and matplotlib.image.imread(path).ndim == 3
    assert usage_error(cli, *BASE, "--no-verify", "--top", "0", "--plot", tmp_path / "none.png") == (
        "plan --plot: no configuration to draw (--top 0)")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # restored when the test ends
    assert usage_error(cli, *BASE, "--plot", tmp_path / "again.png") == (
        "plan --plot needs matplotlib: pip install matplotlib")
    assert not (tmp_path / "again.png").exists()


def _plan_json(cli, *extra):
    common = ["plan", "--topology", "dgx-a100", "--scale", "node=1", "--model", "layers=8,hidden=256,heads=8,seq=128,"
              "vocab=1000", "--global-batch", "32", "--axes", "tp=2,dp=1,pp=4", "--no-verify", "--json"]
    return json.loads(cli(*common, *extra)[1])


def test_plan_schedule_option_and_json(cli):
    """--schedule names the schedule of every configuration in --json;
    interleaved tries every virtual-stage count that divides a stage's layers
    (or the one --virtual-stages fixes); search keeps the fastest per (sizes,
    micro-batch), never slower than any single schedule it tries (DualPipe
    only under DeepSeek's framework); too few micro-batches for DualPipe are
    skipped with dualpipe.py's rule."""
    choices = ("1f1b", "interleaved", "zero-bubble", "dualpipe", "search")
    by = {choice: _plan_json(cli, "--schedule", choice) for choice in choices}
    for choice in ("1f1b", "interleaved", "zero-bubble", "dualpipe"):
        assert {c["schedule"] for c in by[choice]["configurations"]} == {choice}
        assert by[choice]["schedule"] == choice
    assert {c["virtual_stages"] for c in by["interleaved"]["configurations"]} <= {2}  # 2 layers per stage
    assert {c["virtual_stages"] for c in by["1f1b"]["configurations"]} == {1}
    fixed = _plan_json(cli, "--schedule", "interleaved", "--virtual-stages", "2")
    assert fixed["virtual_stages"] == 2 and {c["virtual_stages"] for c in fixed["configurations"]} == {2}
    for c in by["search"]["configurations"]:
        for choice in ("1f1b", "interleaved", "zero-bubble"):
            same = [o for o in by[choice]["configurations"] if o["micro_batch"] == c["micro_batch"]]
            assert all(c["predicted_step_s"] <= o["predicted_step_s"] * (1 + 1e-12) for o in same)
    zb = {c["micro_batch"]: c for c in by["zero-bubble"]["configurations"]}
    for c in by["1f1b"]["configurations"]:
        assert zb[c["micro_batch"]]["breakdown"]["bubble"] < c["breakdown"]["bubble"]
    assert any("interleaved schedule needs the micro-batches per step" in r["reason"]
               for r in by["interleaved"]["skipped"])  # mb 2 gives 16, mb 16 gives 2 micro-batches: not a multiple
    assert any("dualpipe schedule needs an even number of micro-batches per step, at least 2 x pp = 8" in r["reason"]
               for r in by["dualpipe"]["skipped"])  # mb 8 gives 4 micro-batches
    assert "dualpipe" not in {c["schedule"] for c in by["search"]["configurations"]}  # Megatron-LM does not run it


def test_plan_json_names_each_option_per_configuration(cli):
    """The options of a plan are named the same way in the request's
    training and in every configuration of --json."""
    out = json.loads(cli("plan", "--topology", "dgx-h100", "--scale", "node=1", "--model", TINY, "--global-batch",
                         "16", "--axes", "tp,dp", "--sharding", "zero2", "--dtype", "fp8", "--recompute", "selective",
                         "--schedule", "1f1b", "--no-verify", "--json")[1])
    assert {"sharding": "zero2", "dtype": "fp8", "recompute": "selective"}.items() <= out["training"].items()
    assert out["configurations"]
    for c in out["configurations"]:
        assert (c["sharding"], c["dtype"], c["recompute"], c["schedule"]) == ("zero2", "fp8", "selective", "1f1b")
        assert c["sequence_parallel"] is (c["axes"]["tp"] > 1) and c["tp_overlap"] is False


def test_recompute_search_picks_the_least_recomputation_that_fits(cli):
    """--recompute search: per configuration the cheapest recomputation whose
    memory fits (none where everything fits; full where only it fits), named
    in --json; its time is the fixed mode's time."""
    common = ["plan", "--topology", "dgx-h100", "--scale", "node=1,gpu=1", "--model", "gpt3-2.7b",
              "--global-batch", "16", "--axes", "tp=1,dp=1,pp=1", "--no-verify", "--json"]
    search = json.loads(cli(*common, "--recompute", "search")[1])
    assert search["recompute"] == "search" and search["training"]["recompute"] == "none"
    by_mode = {mode: {c["micro_batch"]: c for c in json.loads(cli(*common, "--recompute", mode)[1])["configurations"]}
               for mode in ("none", "selective", "full")}
    chosen = set()
    for c in search["configurations"]:
        mode = c["recompute"]
        chosen.add(mode)
        same = by_mode[mode][c["micro_batch"]]
        assert c["predicted_step_s"] == same["predicted_step_s"] and c["feasible"] == same["feasible"]
        cheaper = ("none", "selective", "full")[: ("none", "selective", "full").index(mode)]
        assert not any(by_mode[m][c["micro_batch"]]["feasible"] for m in cheaper)
    assert {"none", "full"} <= chosen  # small micro-batches fit without; 16 sequences of 2048 need full


def test_plan_with_experts_runs_and_exports(cli, tmp_path):
    """A model with experts plans over tp, ep, dp and pp by default; ep keeps
    its all-to-alls inside a node where it can, the job plan holds the
    dp x ep and dp reductions, proved, and the Megatron export gives the
    expert-parallel size and the MoE arguments; ep must divide the experts
    and needs a model with experts."""
    out = tmp_path / "moe.json"
    common = ["plan", "--topology", "dgx-h100", "--scale", "node=2", "--model", MOE + ",tied_embeddings=false",
              "--global-batch", "64", "--no-verify"]
    doc = json.loads(cli(*common, "--json")[1])
    assert doc["axes"] == ["tp", "ep", "dp", "pp"]
    with_ep = [c for c in doc["configurations"] if c["axes"].get("ep", 1) > 1]
    assert with_ep and all(c["breakdown"]["ep"] > 0 for c in with_ep)
    assert all("ep" not in c["axes"] and c["breakdown"]["ep"] == 0 for c in doc["configurations"]
               if c not in with_ep)
    code, _, _ = cli(*common[:-1], "--axes", "tp=1,ep=8,dp,pp=1", "--micro-batch", "1", "--out", str(out))
    assert code == 0
    plan = load_plan(out)
    reduced = {r.reduction.axes for r in plan.reductions}
    assert reduced == {("ep", "dp"), ("dp",)}
    ep_row = plan.placement.matrix[plan.placement.axis_names.index("ep")]
    assert ep_row == (1, 8)  # the all-to-alls stay inside a node
    from synth.export.megatron import megatron_export

    args = list(megatron_export(plan).arguments)
    assert args[args.index("--expert-model-parallel-size") + 1] == "8"
    assert args[args.index("--num-experts") + 1] == "8" and args[args.index("--moe-router-topk") + 1] == "2"
    assert args[args.index("--moe-shared-expert-intermediate-size") + 1] == "48"
    assert "ep=3 does not divide the model's moe.experts (8)" in usage_error(
        cli, *common, "--axes", "tp=1,ep=3,dp,pp=1", "--scale", "node=3")
    assert "ZeRO-3 with expert parallelism is not modelled" in usage_error(
        cli, *common, "--axes", "tp=1,ep=8,dp,pp=1", "--sharding", "zero3")


def test_plan_with_context_parallelism_runs_and_exports(cli, tmp_path):
    """--axes with cp plans it, names it per configuration, proves the dp x cp
    reductions of the job plan, and the trainers get its size."""
    out = tmp_path / "cp.json"
    common = ["plan", "--topology", "dgx-h100", "--scale", "node=1", "--model", TINY, "--global-batch", "8",
              "--no-verify"]
    doc = json.loads(cli(*common, "--axes", "tp,cp,dp,pp", "--json")[1])
    assert doc["axes"] == ["tp", "cp", "dp", "pp"]
    assert any(c["axes"].get("cp", 1) > 1 and c["breakdown"]["cp"] > 0 for c in doc["configurations"])
    code, _, _ = cli(*common[:-1], "--axes", "tp=2,cp=2,dp=2,pp=1", "--micro-batch", "1", "--out", str(out))
    assert code == 0
    plan = load_plan(out)
    assert {r.reduction.axes for r in plan.reductions if "tp" not in r.reduction.axes} == {("cp", "dp")}
    from synth.export.megatron import megatron_export
    from synth.export.torchtitan import torchtitan_export

    args = list(megatron_export(plan).arguments)
    assert args[args.index("--context-parallel-size") + 1] == "2"
    assert torchtitan_export(plan).parallelism["context_parallel_degree"] == 2


def test_plan_with_hsdp(cli, tmp_path):
    """--sharding hsdp: the shard group is each placement's dp split inside a
    node, its memory per placement; the job says the sizes, the plan holds only
    whole-axis reductions (FSDP runs HSDP's own), torchtitan shards inside the
    node and Megatron-LM refuses it; a configuration with only HSDP's
    collectives cannot be written as a plan."""
    common = ["plan", "--topology", "dgx-h100", "--scale", "node=2", "--model", TINY, "--global-batch", "16",
              "--sharding", "hsdp", "--no-verify"]
    doc = json.loads(cli(*common, "--axes", "tp=1,dp=16,pp=1", "--json")[1])
    best = doc["configurations"][0]
    assert set(best["programs"]) == {"dp_shard/allgather", "dp_shard/reducescatter", "dp_replicate"}
    msg = usage_error(cli, *common[:-1], "--axes", "tp=1,dp=16,pp=1", "--out", str(tmp_path / "x.json"))
    assert "its only collectives are HSDP's over sub-groups of dp" in msg
    out = tmp_path / "hsdp.json"
    code, _, _ = cli(*common[:-1], "--axes", "tp=2,dp=8,pp=1", "--micro-batch", "1", "--out", str(out))
    assert code == 0
    plan = load_plan(out)
    assert {r.reduction.axes for r in plan.reductions} == {("tp",)}
    dp_row = plan.placement.matrix[plan.placement.axis_names.index("dp")]
    assert plan.job["hsdp"] == {"shard": dp_row[-1], "replicate": 8 // dp_row[-1]}
    from synth.export.megatron import megatron_export
    from synth.export.torchtitan import torchtitan_export

    assert torchtitan_export(plan).parallelism["data_parallel_shard_degree"] == plan.job["hsdp"]["shard"]
    with pytest.raises(SynthError, match="the plan shards with HSDP"):
        megatron_export(plan)
