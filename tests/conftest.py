"""What every test shares: the ``cli`` fixture (the synth-reduce CLI run
in-process), the launch guard (a test that launches ranks with mpiexec or
torchrun carries the ``mpi`` or ``torchrun`` marker, so that the fast loop,
``pytest -m "not mpi and not torchrun and not slow"``, leaves it out) and
timeouts stretched by the machine's load.

The tests mirror the packages (tests/synthesis/, tests/cost/, ...; the top-level
modules' tests here). This folder and every subfolder are on ``sys.path``, so a
test module anywhere imports ``processes``, ``helpers`` and the helpers of any
other test module by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# every folder of tests/ on sys.path (this one is there already: pytest puts a
# rootdir conftest's folder there), so that a test module imports the helpers of
# another folder's module by its name (tests/synthesis/test_sparse.py:
# ``from test_runtime import mpirun``), also when that file runs alone
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if _folder.is_dir() and not _folder.name.startswith((".", "_")) and str(_folder) not in sys.path:
        sys.path.append(str(_folder))

import pytest  # noqa: E402
from processes import time_scale  # noqa: E402

from synth.cli import main


@pytest.fixture
def cli(capsys):
    """Run ``synth-reduce ARGS`` in-process; return (exit code, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()  # drop anything captured before this call
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


#: the markers that allow a test (its fixtures included) to launch ranks
LAUNCH_MARKERS = {"mpiexec": "mpi", "mpirun": "mpi", "torchrun": "torchrun", "torch.distributed.run": "torchrun"}
_allowed: set[str] = set()


def launcher_marker(argv) -> str | None:
    """The marker a command needs: ``mpi`` for mpiexec/mpirun or ``synth-reduce
    emulate`` (mpiexec across emulated nodes), ``torchrun`` for torchrun or
    ``python -m torch.distributed.run``; None for anything else."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    words = [os.path.basename(os.fsdecode(a)) for a in argv]
    if "emulate" in words and ("synth.cli" in words or "synth-reduce" in words):
        return "mpi"
    return next((LAUNCH_MARKERS[w] for w in words if w in LAUNCH_MARKERS), None)


_popen_init = subprocess.Popen.__init__


def _checked_popen_init(self, args, *rest, **kwargs):
    needed = launcher_marker(args)
    if needed is not None and needed not in _allowed:
        raise AssertionError(f"this test launches {needed} ranks: mark it @pytest.mark.{needed} (pyproject.toml's "
                             "markers; the fast loop leaves such tests out)")
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _checked_popen_init


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Stretch a test's pytest-timeout limit (its marker, else the ini's) by how
    loaded the machine is when it starts (:func:`processes.time_scale`): the
    limit catches hangs, never a slow machine. Runs before pytest-timeout reads
    the limit (hookwrapper, tryfirst)."""
    _allowed.clear()
    _allowed.update(m.name for m in item.iter_markers() if m.name in ("mpi", "torchrun"))
    scale = time_scale()
    if scale > 1:
        marker = item.get_closest_marker("timeout")
        base = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
        if base:
            item.add_marker(pytest.mark.timeout(float(base) * scale), append=False)
    yield


#: the markers of tests that take seconds each: a launch of ranks, a large search or cross-check
COSTLY_MARKERS = ("slow", "mpi", "torchrun")


def pytest_configure(config):
    """Under pytest-xdist (``--dist loadfile``), run the test files in the
    order :func:`pytest_collection_modifyitems` gives them: xdist's own
    reordering, by how many tests a file holds, leaves a file of a few long
    launches for the end, where one worker runs it while the other idles."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def costly_files_first(items: list) -> list:
    """``items`` grouped by test file, the files holding the most tests marked
    :data:`COSTLY_MARKERS` first, then those holding the most tests (stable:
    files alike keep their collection order, each file its tests' order).
    Longest first is how two workers finish together."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def weight(tests: list) -> tuple[int, int]:
        costly = sum(1 for t in tests if any(t.get_closest_marker(m) for m in COSTLY_MARKERS))
        return -costly, -len(tests)

    return [item for tests in sorted(files.values(), key=weight) for item in tests]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker, the order of :func:`costly_files_first` over
    the tests left after ``-m`` and ``-k`` (trylast: after their deselection);
    every worker collects alike, so the controller hands out the files in
    that order. One process (``-n 0``) keeps the collection order."""
    if hasattr(config, "workerinput"):
        items[:] = costly_files_first(items)
