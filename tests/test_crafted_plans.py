"""A plan whose fields disagree with its own sizes (a chunk run past its
chunk count, more chunks than a group holds) is refused by the field's name
before anything is expanded: in well under a second and without memory, on
every path that loads plans (the API, verify, every export, bench, launch, the
DDP hook; all go through :func:`synth.plan.load_plan`)."""

from __future__ import annotations

import json

import pytest
from helpers import usage_error

from synth.errors import SynthError
from synth.plan import load_plan

FORMATS = ["rank-map", "megatron", "torchtitan", "jax", "msccl", "nccl-tuner", "nccl-env"]


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory) -> dict:
    from synth.cli import main

    path = tmp_path_factory.mktemp("plan") / "p.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=8", "--out", str(path)]) == 0
    return json.loads(path.read_text())


def tampered(tmp_path, doc: dict, step: int, group: int, runs: list) -> str:
    doc = json.loads(json.dumps(doc))
    doc["reductions"][0]["programs"][0]["steps"][step]["chunks"][group] = runs
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(doc))
    return str(path)


HUGE_RUNS = {"10**12": [[0, 10**12]], "10**8": [[0, 10**8]], "one past": [[0, 9]]}


@pytest.mark.parametrize("runs", HUGE_RUNS.values(), ids=HUGE_RUNS)
def test_a_chunk_run_past_num_chunks_is_refused_by_name(tmp_path, plan_doc, runs):
    path = tampered(tmp_path, plan_doc, 0, 0, runs)
    message = (f"{path}: not a valid plan: 'reductions[0].programs[0].steps[0].chunks' holds the chunk run "
               f"{runs[0]} past the plan's num_chunks 8 (chunks are 0..7); re-create the plan with synth-reduce --out")
    with pytest.raises(SynthError) as error:
        load_plan(path)
    assert str(error.value) == message


def test_many_runs_within_num_chunks_are_refused_past_the_groups_chunks(tmp_path, plan_doc):
    # every run is within the chunk count, but together they hold far more chunks than the group has
    path = tampered(tmp_path, plan_doc, 1, 0, [[0, 8]] * 100_000)
    with pytest.raises(SynthError, match=r"steps\[1\]\.chunks' holds more chunks than the lowering of the program "
                                         r"gives this group \(2\)"):
        load_plan(path)


def test_more_chunk_lists_than_groups_are_refused(tmp_path, plan_doc):
    doc = json.loads(json.dumps(plan_doc))
    doc["reductions"][0]["programs"][0]["steps"][0]["chunks"].append([[0, 1]])
    path = tmp_path / "extra.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SynthError, match="step 1 .* stores groups or chunks that differ"):
        load_plan(path)


def test_every_cli_path_refuses_the_crafted_plan(cli, tmp_path, plan_doc):
    path = tampered(tmp_path, plan_doc, 2, 1, [[0, 10**12]])
    expected = (f"{path}: not a valid plan: 'reductions[0].programs[0].steps[2].chunks' holds the chunk run "
                f"[0, {10**12}] past the plan's num_chunks 8")
    assert usage_error(cli, "verify", path).startswith(expected)
    for fmt in FORMATS:
        out = tmp_path / fmt
        assert usage_error(cli, "export", "--format", fmt, path, "--out", out).startswith(expected), fmt
        assert not out.exists()
    assert usage_error(cli, "bench", path, "--sizes", "1K").startswith(expected)
    assert usage_error(cli, "launch", path, "--", "train.py").startswith(expected)


def test_the_api_and_the_ddp_hook_refuse_the_crafted_plan(tmp_path, plan_doc):
    import torch.distributed as dist

    import synth
    from synth.runtime.backends import MPIWorld
    from synth.torch import comm_hook

    path = tampered(tmp_path, plan_doc, 2, 1, [[0, 10**12]])
    with pytest.raises(SynthError, match=r"past the plan's num_chunks 8"):
        synth.load_plan(path)
    with pytest.raises(SynthError, match=r"past the plan's num_chunks 8"):
        synth.Executor(path, MPIWorld())
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        with pytest.raises(SynthError, match=r"past the plan's num_chunks 8"):
            comm_hook(path)
    finally:
        dist.destroy_process_group()


@pytest.mark.mpi
def test_a_bench_of_a_crafted_plan_under_mpi_ends_every_rank(tmp_path, plan_doc):
    """Every rank refuses the crafted plan with the same line, and no process
    of the job is left behind once mpiexec has returned."""
    import subprocess

    from test_runtime import mpirun

    path = tampered(tmp_path, plan_doc, 2, 1, [[0, 10**12]])
    done = mpirun(4, "-m", "synth.cli", "bench", path, "--sizes", "1K", timeout_s=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert done.returncode != 0 and len(errors) == 4 and len(set(errors)) == 1, done.stderr
    assert "past the plan's num_chunks 8" in errors[0]
    left = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert [line for line in left.splitlines() if path in line] == []


@pytest.mark.parametrize("change, message", [
    (lambda d: d["axes"][0].__setitem__("size", 10**300), "'axes' must be a list of {name, size} with an "
     "identifier as name (as --axes takes) and a size from 1 to 16,777,216"),
    (lambda d: d["axes"][0].__setitem__("name", "a\nb"), "'axes' must be a list of {name, size} with an identifier"),
    (lambda d: d["reductions"][0]["programs"][0].__setitem__("text", "AllReduce(root, inside)\n" * 100_000),
     "'reductions[0].programs[0].text' holds 100,001 lines; a program has at most 1,000 instructions"),
], ids=["huge axis", "axis name with a line break", "100,000-line program"])
def test_plan_fields_are_bounded_before_they_are_used(tmp_path, plan_doc, change, message):
    doc = json.loads(json.dumps(plan_doc))
    change(doc)
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SynthError) as error:
        load_plan(path)
    assert str(error.value).startswith(f"{path}: not a valid plan: {message}") and "\n" not in str(error.value)
