"""The README's example outputs are what the commands print today (measured
durations aside): scripts/readme_examples.py --check runs each example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from processes import limit_s

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "readme_examples.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import readme_examples
    finally:
        sys.path.pop(0)
    return readme_examples


def test_every_example_of_the_readme_is_found():
    examples = _module().examples((REPO / "README.md").read_text().split("\n"))
    commands = [e.command for e in examples]
    assert len(commands) == 4, commands  # headline workload, plan, axes without sizes, the main job
    assert commands[-1].startswith("synth-reduce --topology topologies/p2-a100.yaml")
    assert any(c.startswith("synth-reduce plan ") for c in commands)


def test_durations_are_the_only_thing_ignored():
    m = _module()
    a = "3 placement(s), 106 program(s); synthesized in 58 ms, predicted in 27 ms\nranked in 5.356 s"
    b = "3 placement(s), 106 program(s); synthesized in 1436 ms, predicted in 9 ms\nranked in 0.1 s"
    assert m.without_durations(a) == m.without_durations(b)
    assert m.without_durations(a) != m.without_durations(a.replace("106", "107"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_readme_outputs_are_current():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=limit_s(300))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
