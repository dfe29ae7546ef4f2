"""scripts/gpu_check.sh without a GPU: its arguments, its refusal when no GPU
is visible, and the hand-over to scripts/gpu_check.py when nvidia-smi lists
one (a stand-in nvidia-smi and a stand-in Python record what they were given;
the checks themselves need a GPU)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from processes import limit_s

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def run(*argv: str, path_prefix: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, timeout=limit_s(60), env=env)


def stand_in(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_help_and_bad_arguments():
    done = run("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: scripts/gpu_check.sh [--python PY] [--report FILE]")
    done = run("--frobnicate")
    assert done.returncode == 2 and "gpu_check: unknown argument '--frobnicate'" in done.stderr
    done = run("--report")
    assert done.returncode == 2 and "gpu_check: --report needs a value" in done.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_refuses_without_nvidia_smi():
    done = run()
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr == ("gpu_check: no NVIDIA GPU here (nvidia-smi not found): nothing checked; run it on a "
                           "machine with one\n")


def test_refuses_when_nvidia_smi_lists_no_gpu(tmp_path):
    # what nvidia-smi does on a machine without a working driver
    stand_in(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI has failed because it couldn'\\''t communicate with the "
                                     "NVIDIA driver.' >&2\nexit 9\n")
    done = run(path_prefix=tmp_path)
    assert done.returncode == 3 and "nvidia-smi lists none): nothing checked" in done.stderr


def test_hands_the_gpu_count_to_the_checks_and_writes_the_report(tmp_path):
    stand_in(tmp_path, "nvidia-smi", "echo 'GPU 0: Stand-in (UUID: GPU-0)'\necho 'GPU 1: Stand-in (UUID: GPU-1)'\n")
    python = stand_in(tmp_path, "python", 'echo "checks run as: $*"\necho "PASS x: y"\nexit 1\n')
    report = tmp_path / "report.txt"
    done = run("--python", str(python), "--report", str(report), path_prefix=tmp_path)
    assert done.returncode == 1  # the checks' exit code
    assert done.stdout == "checks run as: scripts/gpu_check.py --gpus 2\nPASS x: y\n"
    assert report.read_text() == done.stdout


def test_the_single_rank_checks_pass_on_a_cpu_world(monkeypatch):
    """The same identity checks the script runs on NCCL, on a one-rank gloo
    world with CPU tensors: they pass where the collectives are right, and
    catch a collective that changes the data."""
    import importlib.util

    import torch
    import torch.distributed as dist

    import synth.torch

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(gpu_check.free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        world = synth.torch.world()
        try:
            comm = world.split([(0,)])
            checks = (lambda a: world.xp.asarray(a), lambda t: t.float().numpy().astype("float64"),
                      lambda a, n: torch.empty(n, dtype=a.dtype))
            assert gpu_check.identity_checks(comm, *checks) == []
            monkeypatch.setattr(comm, "bcast", lambda a: a.add_(1))
            assert gpu_check.identity_checks(comm, *checks) == [f"bcast {name}" for name in gpu_check.DTYPES]
        finally:
            world.close()  # forgets the world; the process group is this test's, destroyed below
    finally:
        dist.destroy_process_group()


def test_the_msccl_check_says_what_it_needs(monkeypatch, tmp_path):
    """Without the MSCCL executor build the check is skipped with its reason; a
    library path that is not a file fails it (no GPU is needed for either)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.delenv("MSCCL_NCCL_LIB", raising=False)
    verdict, detail = gpu_check.check_msccl(2)
    assert verdict == "SKIP" and "set MSCCL_NCCL_LIB" in detail
    monkeypatch.setenv("MSCCL_NCCL_LIB", str(tmp_path / "missing.so"))
    assert gpu_check.check_msccl(2) == ("FAIL", f"MSCCL_NCCL_LIB={tmp_path / 'missing.so'}: no such file")
