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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_megatron_sc21_comparison_is_current():
    """docs/planner.md's generated comparison with Megatron-LM's SC'21 runs is
    what the planner predicts now (it had drifted once with the model)."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "megatron_sc21.py"), "compare", "--check"],
                          capture_output=True, text=True, timeout=limit_s(300), cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def _script():
    """scripts/published_runs.py as a module (scripts/ is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("published_runs", REPO / "scripts" / "published_runs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seq", [8192, 131072])
def test_causal_count_halves_the_attention_core_of_palms_count_by_hand(seq):
    """Meta's rows also give the throughput with the attention core counted
    causally: PaLM's count per token (Chowdhery et al., Appendix B) is
    6 x the matrix parameters + 12 L H Q T, the logits' 2 h V among the
    matrices; the causal count halves the 12 L H Q T."""
    script = _script()
    model = (f"layers=126,hidden=16384,heads=128,kv_heads=8,ffn=53248,gated_mlp=true,tied_embeddings=false,"
             f"seq={seq},vocab=128256")
    run = script.Run("by hand", f"--model {model} --global-batch 1", 400, "tflops", True)
    L, h, H, Q, kv, f, V = 126, 16384, 128, 128, 8 * 128, 53248, 128256
    matrices = L * (h * (H * Q + 2 * kv) + H * Q * h + 3 * h * f) + h * V
    attention = 12 * L * H * Q * seq
    full = 6 * matrices + attention
    assert script.causal_share(run) == pytest.approx((full - attention / 2) / full, rel=1e-12)
