"""Every export of the shipped models' job plans goes through the trainers' own
parsers: Megatron-LM's options and ``validate_args`` rules (tests/megatron_args.py,
each rule cited by file and line, as Megatron-LM's training arguments are in no
installable package) with megatron-core's own ``TransformerConfig`` and
micro-batch calculator from the installed wheel; torchtitan 0.3's own
``ConfigManager`` on the exported command line (tests/torchtitan_parse.py)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import megatron_args
import pytest
from processes import run

from synth.cli import main
from synth.errors import SynthError
from synth.export.megatron import megatron_export
from synth.export.torchtitan import torchtitan_export
from synth.plan import load_plan

REPO = Path(__file__).resolve().parents[2]
MODELS = sorted(p.stem for p in (REPO / "models").glob("*.yaml"))
# options beyond the defaults that reach the export's other arguments: (name, model, plan options)
VARIANTS = [("zero3", "llama3-8b", ["--sharding", "zero3", "--axes", "tp,dp"]),
            ("full-interleaved", "gpt3-1.3b", ["--recompute", "full", "--schedule", "interleaved",
                                               "--axes", "tp,dp,pp=4"]),
            ("fp8-tp-overlap", "llama2-7b", ["--dtype", "fp8", "--tp-overlap", "--axes", "tp=4,dp,pp"]),
            ("param-gather", "gpt3-6.7b", ["--sharding", "zero1", "--overlap-param-gather", "--axes", "tp=2,dp,pp=2"]),
            ("cp", "llama3-8b", ["--axes", "tp=2,cp=2,dp,pp"]),
            ("cp-allgather", "llama3-8b", ["--axes", "tp=2,cp=2,dp,pp", "--cp-comm", "allgather"]),
            ("selective", "gpt3-13b", ["--recompute", "selective", "--axes", "tp=2,dp,pp=2"])]
# the 405B fits on 1,024 GPUs with ZeRO-1 and full recomputation, in 16 uneven stages (126 layers)
SCALE = {"llama3-405b": ["--scale", "node=128", "--sharding", "zero1", "--recompute", "full", "--axes",
                         "tp=8,dp,pp=16", "--stages", "uneven"]}


def _plan(directory: Path, name: str, model: str, options: list[str]) -> Path:
    out = directory / f"{name}.json"
    scale = SCALE.get(model, ["--scale", "node=32"])
    argv = ["plan", "--topology", "dgx-h100", *scale, "--model", model, "--global-batch", "512", "--top", "1",
            *options, "--out", str(out)]
    assert main(argv) == 0, argv
    return out


@pytest.fixture(scope="module")
def shipped_plans(tmp_path_factory) -> list[Path]:
    """A job plan per shipped model (defaults) and per variant."""
    directory = tmp_path_factory.mktemp("plans")
    plans = [_plan(directory, m, m, []) for m in MODELS]
    return plans + [_plan(directory, name, model, options) for name, model, options in VARIANTS]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_megatron_lm_parses_and_validates_every_export(shipped_plans):
    warnings.filterwarnings("ignore")  # megatron-core warns about absent Transformer Engine / APEX
    exported = 0
    for path in shipped_plans:
        try:
            export = megatron_export(load_plan(path))
        except SynthError as e:  # a refusal names a setting Megatron-LM lacks
            assert path.stem == "zero3" and "--use-torch-fsdp2" in str(e), (path.stem, e)
            continue
        world = len(export.ranks.device_of_rank)
        args = megatron_args.parse(list(export.arguments))
        megatron_args.validate(args, world)
        megatron_args.core_checks(args, world)
        exported += 1
    assert exported >= len(MODELS) + len(VARIANTS) - 1


def test_gpt3_xl_gets_its_head_width_as_kv_channels(tmp_path):
    """GPT-3 XL's 24 heads do not divide its hidden 2048: Megatron-LM needs the
    head width the model file prints (d_head 128) as --kv-channels, and the
    planner's attention runs on that width."""
    path = _plan(tmp_path, "xl", "gpt3-1.3b", ["--axes", "tp=1,dp,pp=1"])
    args = list(megatron_export(load_plan(path)).arguments)
    assert args[args.index("--kv-channels") + 1] == "128"
    without = [a for i, a in enumerate(args) if a != "--kv-channels" and args[i - 1] != "--kv-channels"]
    with pytest.raises(AssertionError, match=r"arguments.py:1332"):
        megatron_args.validate(megatron_args.parse(without), 256)
    assert load_plan(path).job["model"]["head_dim"] == 128


def test_the_rules_refuse_what_megatron_lm_refuses():
    """The transcribed parser and rules fail where Megatron-LM fails."""
    base = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "8"]
    megatron_args.validate(megatron_args.parse(base), 8)
    with pytest.raises(AssertionError, match="no option --activation-checkpoint"):
        megatron_args.parse(base + ["--activation-checkpoint"])
    with pytest.raises(AssertionError, match="arguments.py:997"):
        megatron_args.validate(megatron_args.parse(base + ["--pipeline-model-parallel-size", "5"]), 10)
    with pytest.raises(AssertionError, match="arguments.py:1044"):
        megatron_args.validate(megatron_args.parse(base + ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]),
                               8)
    with pytest.raises(AssertionError, match="arguments.py:1442"):
        megatron_args.validate(megatron_args.parse(base + ["--tp-comm-overlap"]), 8)


# the pre-0.3 spelling of settings the exports write: torchtitan 0.3 must refuse each line
OLD_SPELLINGS = [["--activation_checkpoint.mode", "full"], ["--parallelism.enable_async_tensor_parallel"],
                 ["--parallelism.pipeline_parallel_degree", "2"]]


@pytest.fixture(scope="module")
def torchtitan_parsed(shipped_plans, tmp_path_factory):
    """One run of tests/torchtitan_parse.py (torchtitan's import costs most of
    a run) on every torchtitan export of the shipped plans, then on
    :data:`OLD_SPELLINGS`: ``(exports, parsed exports, parsed old spellings,
    the run)``; each parse is one JSON record, in the order given."""
    pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed (.ci/run installs it)")
    pytest.importorskip("tyro")
    exports = []
    for path in shipped_plans:
        try:
            exports.append(torchtitan_export(load_plan(path)))
        except SynthError as e:  # expert axes, uneven stages, zero-bubble: refused with the reason
            assert "torchtitan export:" in str(e)
    directory = tmp_path_factory.mktemp("torchtitan")
    lines = directory / "lines.json"
    lines.write_text(json.dumps([e.overrides() for e in exports] + OLD_SPELLINGS))
    done = run([sys.executable, str(REPO / "tests" / "torchtitan_parse.py"), str(lines)], 600, cwd=directory)
    parsed = [json.loads(line) for line in done.stdout.splitlines()]
    return exports, parsed[:len(exports)], parsed[len(exports):], done


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_torchtitans_config_manager_parses_every_export(torchtitan_parsed):
    """torchtitan 0.3's ConfigManager parses each exported command line and
    reads back the degrees, schedule, activation checkpointing, async tensor
    parallelism and the CUDA graph switch the export meant."""
    exports, parsed, old, done = torchtitan_parsed
    assert len(exports) >= len(MODELS) // 2
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(parsed) == len(exports) and len(old) == len(OLD_SPELLINGS), done.stdout[-3000:]
    modes = {"none": "NoneType", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}
    for export, got in zip(exports, parsed):
        assert "error" not in got, (export.overrides(), got["error"])
        for key, value in export.parallelism.items():
            if key != "enable_async_tensor_parallel":
                assert got["parallelism"][key] == value, key
        assert got["async_tp"] == bool(export.parallelism.get("enable_async_tensor_parallel"))
        assert got["disable_cuda_graphs"] == (export.parallelism["pipeline_parallel_degree"] > 1)
        assert got["activation_checkpoint"] == modes[export.activation_checkpoint]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_torchtitans_config_manager_refuses_the_old_spelling(torchtitan_parsed):
    """The parse is real: the pre-0.3 spelling of the same settings fails
    (parsed in the same run as the exports, after them)."""
    _, _, old, done = torchtitan_parsed
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(old) == len(OLD_SPELLINGS), done.stdout[-3000:]
    for line, got in zip(OLD_SPELLINGS, old):
        assert "error" in got, (line, got)
