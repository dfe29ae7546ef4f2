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
    assert len(commands) == 4, commands  # the main job, headline workload, plan, axes without sizes
    assert commands[0].startswith("synth-reduce --topology topologies/p2-a100.yaml")
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


def test_the_runnable_blocks_are_found():
    """The DDP example is a runnable block: a job plan for 8 ranks, then the
    example trained on it."""
    blocks = _module().runnable_blocks((REPO / "README.md").read_text().split("\n"))
    ddp = [b for b in blocks if any("examples/torch_ddp.py" in c for c in b)]
    assert len(ddp) == 1 and ddp[0][0].startswith("synth-reduce plan ") and "--nproc-per-node 8" in ddp[0][1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readmes_runnable_blocks_run_as_written():
    """Each runnable block (the DDP example among them) runs as written, on
    its own outputs (scripts/readme_examples.py --run-blocks)."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(SCRIPT), "--run-blocks"], capture_output=True, text=True,
                          timeout=limit_s(900))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
