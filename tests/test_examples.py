"""The README's `check` example runs on the shipped program file
examples/blueconnect.txt (the trainer examples are run by tests/test_torch.py
and tests/test_jax.py)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_check_example_proves_the_shipped_program(cli):
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^synth-reduce check (examples/blueconnect\.txt .*)$", readme, re.M)
    assert command, "the README's check example names examples/blueconnect.txt"
    args = re.findall(r'"[^"]*"|\S+', command[1])
    code, out, err = cli("check", *[str(REPO / a) if a.endswith(".txt") else a.strip('"') for a in args])
    assert code == 0, err
    assert re.search(r"dp:2,2 / mp:2,8: valid \(numpy: \d+ elements exact; z3: proved", out)
