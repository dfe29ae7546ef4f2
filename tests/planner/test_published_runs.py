"""docs/planner.md's table of published runs states what the planner predicts
for each run now (``scripts/published_runs.py --check``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from planner_cases import REPO
from processes import limit_s


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_published_runs_table_is_current():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "published_runs.py"), "--check"],
                          capture_output=True, text=True, timeout=limit_s(300), cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
