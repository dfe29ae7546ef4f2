"""``plan --plot FILE.png``: the listed configurations' predicted step time,
split into its terms, beside their memory per device against the device's
capacity, so that the trade-off between speed and memory shows at a glance.

Needs matplotlib (the ``plots`` extra); drawn off-screen (the Agg backend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import SynthError
from ..planner.configurations import Candidate, JobSolution

# the step's terms, in StepTime.breakdown()'s names, and the memory's, in Memory.to_dict()'s
STEP_TERMS = ("compute", "bubble", "tp", "cp", "ep", "pp", "dp", "optimizer")
MEMORY_TERMS = ("weights", "gradients", "optimizer", "activations")
GiB = 2**30


def pyplot():
    """matplotlib's pyplot on the off-screen backend; SynthError naming the
    extra to install when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise SynthError("plan --plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _stack(axis, listed: Sequence[Candidate], series: dict[str, list[float]]) -> list[float]:
    """One horizontal bar per configuration, stacked by term (terms that are
    zero everywhere left out of the legend), hatched where it does not fit;
    returns the bars' totals."""
    left = [0.0] * len(listed)
    for term, values in series.items():
        if not any(values):
            continue
        for bar, c in zip(axis.barh(range(len(listed)), values, left=left, label=term), listed):
            if not c.feasible:
                bar.set_hatch("//")
        left = [a + b for a, b in zip(left, values)]
    return left


def plot_plan(solution: JobSolution, listed: Sequence[Candidate], path: str | Path) -> None:
    """Draw ``listed`` (fastest at the top) to ``path`` (PNG, or any format
    matplotlib takes by the file's suffix). Configurations that do not fit
    are hatched; the memory panel marks the device's capacity and, with a
    margin, the memory left to the job."""
    if not listed:
        raise SynthError("plan --plot: no configuration to draw (--top 0)")
    plt = pyplot()
    request = solution.request
    names = [c.config.describe() + ("" if c.feasible else " (does not fit)") for c in listed]
    rows = range(len(listed))
    figure, (steps, memory) = plt.subplots(1, 2, figsize=(13, 2.2 + 0.45 * len(listed)), sharey=True,
                                           gridspec_kw={"width_ratios": [3, 2]})
    _stack(steps, listed, {term: [c.step.breakdown()[term] for c in listed] for term in STEP_TERMS})
    steps.set_yticks(list(rows), names)
    steps.invert_yaxis()
    steps.set_xlabel("predicted seconds per step")
    steps.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=6, fontsize="small", frameon=False)
    left = _stack(memory, listed, {term: [getattr(c.memory, term) / GiB for c in listed] for term in MEMORY_TERMS})
    capacity = request.device.memory_GiB
    memory.axvline(capacity, color="black", linewidth=1, label=f"{capacity:g} GiB per device")
    if request.memory_margin_GiB:
        memory.axvline(capacity - request.memory_margin_GiB, color="black", linestyle="--", linewidth=1,
                       label=f"less {request.memory_margin_GiB:g} GiB margin")
    limit = 2 * capacity  # configurations far beyond the device would flatten the others: clipped, total written
    if max(left) > limit:
        memory.set_xlim(0, limit)
        for row, total in zip(rows, left):
            if total > limit:
                memory.text(limit * 0.98, row, f"{total:.0f} GiB", ha="right", va="center", fontsize="small",
                            backgroundcolor="white")
    memory.set_xlabel("GiB per device (worst stage)")
    memory.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize="small", frameon=False)
    model, topology = request.model, request.topology
    figure.suptitle(f"{model.name} on {topology.name} ({topology.num_devices} x {request.device.name}): "
                    f"the {len(listed)} best configurations")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
