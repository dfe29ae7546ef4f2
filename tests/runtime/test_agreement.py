"""The API agrees across ranks when it is built: a wrong argument or a
refusal on one rank is the same one-line SynthError on every rank, never one
rank raising while the others wait in their first collective; a DDP hook
built before ``init_process_group`` is refused on every rank of a torchrun
job (no rank is ended by torchrun before it says why)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import messages_on_every_rank
from processes import limit_s

from synth.runtime.agreement import agree_on_digest, call_digest
from synth.runtime.executor import Executor

REPO = Path(__file__).resolve().parents[2]




@pytest.fixture(scope="module")
def plan8(tmp_path_factory):
    from synth.cli import main

    path = tmp_path_factory.mktemp("plan") / "p.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=8", "--out", str(path)]) == 0
    return path


def test_a_wrong_argument_on_one_rank_is_one_error_on_every_rank(plan8):
    messages = messages_on_every_rank(8, lambda w: Executor(plan8, w, reduce=5 if w.rank == 3 else None))
    assert len(set(messages)) == 1 and messages[0] is not None, messages
    assert messages[0].startswith("rank 3: Executor(PosixPath, reduce=5, goal=None): TypeError: ")


def test_ranks_given_different_arguments_disagree_together():
    messages = messages_on_every_rank(4, lambda w: agree_on_digest(
        w, "arguments to f (x)", call_digest("x", 2 if w.rank in (1, 2) else 1)))
    assert messages == ["the arguments to f (x) differ across ranks (ranks 1,2 differ from rank 0); give every "
                        "rank the same"] * 4
    assert messages_on_every_rank(4, lambda w: agree_on_digest(w, "y", call_digest("same"))) == [None] * 4


BEFORE_INIT = textwrap.dedent("""
    import os, sys, time
    import synth.torch
    from synth.errors import SynthError

    if os.environ["RANK"] == "3":
        time.sleep(3)  # a slow rank: the others must not leave (and have torchrun end it) before it refuses
    try:
        synth.torch.comm_hook(sys.argv[1])
    except SynthError as exc:  # like a training script's own handler: say why and leave at once
        os.write(1, (f"rank {os.environ['RANK']}: {exc}" + "\\n").encode())  # one write: lines of ranks never mix
        sys.exit(2)
""")

ARGUMENTS = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    import synth.torch
    from synth.errors import SynthError

    rank = int(os.environ["RANK"])
    synth.torch.init_process_group()
    try:
        synth.torch.comm_hook(sys.argv[1], sparse=rank == 1)
    except SynthError as exc:
        os.write(1, (f"rank {rank}: {exc}" + "\\n").encode())  # one write: lines of ranks never mix
    try:
        synth.torch.Executor(sys.argv[1], reduce=5 if rank == 2 else None)
    except SynthError as exc:
        os.write(1, (f"executor, rank {rank}: {exc}" + "\\n").encode())  # one write: lines of ranks never mix
    dist.destroy_process_group()
""")


def torchrun4(tmp_path, script: str, start: str = "rank") -> tuple[list[str], str]:
    """The lines starting with ``start`` that 4 ranks of ``script`` printed
    (given a 4-rank plan), sorted, and the whole output for messages."""
    from synth.cli import main

    plan = tmp_path / "p4.json"
    if not plan.exists():
        assert main(["--topology", "testbed-2x4", "--scale", "node=1", "--axes", "dp=2,mp=2", "--reduce", "dp",
                     "--out", str(plan)]) == 0
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           str(worker), str(plan)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=limit_s(240))
    return sorted(line for line in done.stdout.splitlines() if line.startswith(start)), done.stdout + done.stderr


@pytest.mark.torchrun
def test_a_ddp_hook_before_init_process_group_is_refused_on_every_rank(tmp_path):
    lines, output = torchrun4(tmp_path, BEFORE_INIT)
    assert lines == [f"rank {r}: torch.distributed is not initialized: call torch.distributed.init_process_group() "
                     "(or synth.torch.init_process_group()) before building the hook, on every rank"
                     for r in range(4)], output


@pytest.mark.torchrun
def test_ddp_hooks_and_executors_given_different_arguments_are_refused_on_every_rank(tmp_path):
    lines, output = torchrun4(tmp_path, ARGUMENTS)
    assert lines == [f"rank {r}: the arguments to comm_hook (reduce, process_group, sparse) differ across ranks "
                     "(rank 1 differs from rank 0); give every rank the same" for r in range(4)], output
    executors = [line for line in output.splitlines() if line.startswith("executor")]
    assert len(executors) == 4 and len({line.split(": ", 1)[1] for line in executors}) == 1, output
    assert executors[0].split(": ", 1)[1].startswith("rank 2: TypeError: "), output


@pytest.mark.torchrun
def test_torchrun_reports_the_ranks_one_line_as_the_cause(tmp_path):
    """A refusal under torchrun: torchrun's own failure report names the
    rank's one line (written to its error file), not its traceback hint."""
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "synth.cli", "launch", str(bad), "--", "train.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=limit_s(240))
    line = f'synth-reduce: error: {bad}: not a synth-reduce plan (expected "schema": "synth-reduce/plan")'
    assert done.stderr.count(line + "\n") >= 2, done.stderr
    assert f"traceback : {line}" in done.stderr and "To enable traceback" not in done.stderr, done.stderr
