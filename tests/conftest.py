"""Shared fixture: run the synth-reduce CLI in-process."""

from __future__ import annotations

import pytest

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
