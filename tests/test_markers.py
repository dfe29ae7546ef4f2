"""The launch guard of tests/conftest.py: a test launches mpiexec or torchrun
only under its marker, so the fast loop never starts ranks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import launcher_marker


def test_the_launcher_of_a_command_names_its_marker():
    assert launcher_marker(["/venv/bin/mpiexec", "-n", "8", "python", "x.py"]) == "mpi"
    assert launcher_marker([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4"]) == "torchrun"
    assert launcher_marker("torchrun") == "torchrun"
    assert launcher_marker([sys.executable, "-m", "synth.cli", "emulate", "--topology", "t.yaml", "--", "true"]) == "mpi"
    assert launcher_marker([sys.executable, "-m", "synth.cli", "bench"]) is None


def test_an_unmarked_test_cannot_launch_ranks():
    with pytest.raises(AssertionError, match=r"launches mpi ranks: mark it @pytest.mark.mpi"):
        subprocess.run(["mpiexec", "-n", "1", "true"])
    with pytest.raises(AssertionError, match=r"launches torchrun ranks: mark it @pytest.mark.torchrun"):
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "x.py"])


@pytest.mark.mpi
def test_a_marked_test_may(tmp_path):
    """The guard lets a marked test through (a launcher that fails at once:
    the guard is all that is checked here)."""
    with pytest.raises(FileNotFoundError):
        subprocess.run([str(tmp_path / "mpiexec"), "-n", "1"])
