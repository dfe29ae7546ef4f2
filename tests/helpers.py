"""Assertion helpers shared by the CLI tests."""

from __future__ import annotations

PREFIX = "synth-reduce: error: "


def usage_error(cli, *argv) -> str:
    """Run the CLI (the ``cli`` fixture), expect exit code 2, empty stdout and
    exactly one error line with no traceback; return the message after the prefix."""
    code, out, err = cli(*argv)
    assert code == 2, (code, out, err)
    assert out == ""
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(PREFIX)
    return err[len(PREFIX) : -1]
