"""A per-operation profile moved to a device of another stated memory
bandwidth (``at_memory_bandwidth``), and the shipped profile of the H100 that
torchtitan's December 2024 benchmark ran on (scripts/bandwidth_profile.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from synth.errors import SynthError
from synth.planner.compute import load_compute_profile
from synth.planner.operations import at_memory_bandwidth

REPO = Path(__file__).resolve().parents[2]
H100 = load_compute_profile(str(REPO / "profiles" / "h100-sxm5-80gb.compute.json"))


def test_half_the_bandwidth_doubles_the_memory_bound_passes_and_keeps_the_compute_rates():
    slow = at_memory_bandwidth(H100, 0.5, "slow", ("a GPU",), "a test")
    elements = 1 << 28  # far above every pass's floor
    for p in H100.elementwise.passes:
        assert slow.elementwise.seconds(p.name, elements) == pytest.approx(2 * H100.elementwise.seconds(p.name, elements))
    assert slow.elementwise.bandwidth_Bps == pytest.approx(H100.elementwise.bandwidth_Bps / 2)
    assert slow.gemm.bandwidth_Bps == pytest.approx(H100.gemm.bandwidth_Bps / 2)
    assert slow.gemm.rate_flops == H100.gemm.rate_flops and slow.attention == H100.attention
    assert slow.host == H100.host and slow.devices == ("a GPU",)
    # a large square GEMM is compute-bound: its time does not move
    assert float(slow.gemm.seconds(8192, 8192, 8192)) == pytest.approx(float(H100.gemm.seconds(8192, 8192, 8192)))


def test_a_ratio_that_is_not_positive_is_refused():
    with pytest.raises(SynthError, match="bandwidth ratio 0"):
        at_memory_bandwidth(H100, 0.0, "x", ("x",), "x")


def test_the_shipped_benchmark_h100_profile_is_the_script_output(tmp_path):
    """2.4 TB/s (the benchmark's H100) over 3.35 (the H100 SXM5 datasheet)."""
    out = tmp_path / "p.compute.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bandwidth_profile.py"), "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    shipped = load_compute_profile(str(REPO / "profiles" / "h100-hbm2e-96gb-500w.compute.json"))
    assert load_compute_profile(str(out)) == shipped
    assert shipped.elementwise.bandwidth_Bps == pytest.approx(H100.elementwise.bandwidth_Bps * 2.4 / 3.35)
