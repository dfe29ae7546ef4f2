"""Shared fixture: run the synth-reduce CLI in-process."""

from __future__ import annotations

import pytest
from processes import time_scale

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


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Stretch a test's pytest-timeout limit (its marker, else the ini's) by how
    loaded the machine is when it starts (:func:`processes.time_scale`): the
    limit catches hangs, never a slow machine. Runs before pytest-timeout reads
    the limit (hookwrapper, tryfirst)."""
    scale = time_scale()
    if scale > 1:
        marker = item.get_closest_marker("timeout")
        base = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
        if base:
            item.add_marker(pytest.mark.timeout(float(base) * scale), append=False)
    yield
