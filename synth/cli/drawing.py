"""Pictures of a plan (``synth-reduce draw``): where its axes' groups sit on
the hierarchy, and its programs as steps on sub-groups.

The figure has, top to bottom:

* one panel per axis: the hierarchy as nested boxes (the outer levels' elements
  as boxes, the devices as cells inside their innermost box), each device
  coloured by the group of that axis it belongs to (one colour per group;
  beyond :data:`COLOURS` groups the colours repeat, and the title says how
  many groups of how many devices there are and which levels they cross);
* for each reduction of the plan, its program for the plan's size (the
  largest size range's, at the size it was predicted for), one small
  hierarchy per step coloured by the step's sub-groups, titled with the
  collective, the groups, the bytes each member moves and the predicted time;
* for a job plan, a line with its sizes (tp, cp, ep, dp, pp, micro-batch) and
  the predicted step split into its terms as one stacked bar.

Readable from 8 to 1,024 devices: past :data:`MAX_DRAWN` devices only the
first outer elements are drawn, and the panel says how many more there are
(every outer element holds the same pattern of groups, up to their numbering).
The layout (:func:`layout`, :func:`axis_colouring`, :func:`step_rows`) is pure
numpy; matplotlib (the ``plots`` extra) draws it off-screen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..cost import Model
from ..cost.predict import Predictor, lowered_loads
from ..errors import SynthError
from ..plan import Plan, PlannedReduction
from ..synthesis.placement import Placement
from ..synthesis.language import format_program
from ..synthesis.reduction import Reduction
from ..topology import Topology
from ..units import format_seconds, format_size

MAX_DRAWN = 1024  # devices drawn at most; beyond, the first outer elements only
MAX_STEPS_DRAWN = 6  # steps drawn per program; the rest are listed in the title
COLOURS = 20  # distinct group colours (matplotlib's tab20) before they repeat
STEP_TERMS = ("compute", "bubble", "tp", "cp", "ep", "pp", "dp", "optimizer")
DEFAULT_SIZE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Box:
    """An element of an outer level: its level index and rectangle."""

    level: int
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Layout:
    """Where each drawn device's cell is (``cells[d]`` = (x, y) of its lower
    left corner, unit size), the outer levels' boxes, the whole size, and how
    many devices are drawn (the first ``drawn`` ids)."""

    cells: np.ndarray
    boxes: tuple[Box, ...]
    width: float
    height: float
    drawn: int


PAD = 0.35  # margin inside a box, and the gap between boxes
CELL_GAP = 0.15  # gap between device cells


def _grid(count: int, devices: bool) -> tuple[int, int]:
    """(columns, rows) for ``count`` children: devices in rows of at most 8,
    boxes in a near-square grid, wider than tall."""
    cols = min(count, 8) if devices else math.ceil(math.sqrt(count))
    return max(cols, 1), math.ceil(count / max(cols, 1))


def _size(counts: tuple[int, ...], level: int) -> tuple[float, float]:
    """Width and height of one element of ``level`` (a device: 1 x 1)."""
    if level == len(counts) - 1:
        return 1.0, 1.0
    w, h = _size(counts, level + 1)
    devices = level + 1 == len(counts) - 1
    gap = CELL_GAP if devices else PAD
    cols, rows = _grid(counts[level + 1], devices)
    return cols * w + (cols - 1) * gap + 2 * PAD, rows * h + (rows - 1) * gap + 2 * PAD


def layout(topology: Topology, max_devices: int = MAX_DRAWN) -> Layout:
    """Nested boxes of the hierarchy (module docstring): the first elements of
    the outermost level holding at most ``max_devices`` devices (at least one
    element; a one-level topology draws its first ``max_devices`` devices)."""
    counts = topology.counts
    n = len(counts)
    per = [math.prod(counts[l + 1:]) for l in range(n)]  # devices in one element of each level
    shown = counts[0] if n == 1 else max(1, min(counts[0], max_devices // per[0]))
    if n == 1:
        shown = min(shown, max_devices)
    drawn = shown * per[0]
    cells = np.zeros((drawn, 2))
    boxes: list[Box] = []

    def place(level: int, first: int, x: float, y: float) -> None:
        if level == n - 1:
            cells[first] = (x, y)
            return
        w, h = _size(counts, level)
        boxes.append(Box(level, x, y, w, h))
        cw, ch = _size(counts, level + 1)
        devices = level + 1 == n - 1
        gap = CELL_GAP if devices else PAD
        cols, rows = _grid(counts[level + 1], devices)
        for i in range(counts[level + 1]):
            place(level + 1, first + i * per[level + 1], x + PAD + (i % cols) * (cw + gap),
                  y + PAD + (rows - 1 - i // cols) * (ch + gap))

    w, h = _size(counts, 0)
    gap = CELL_GAP if n == 1 else PAD
    cols, rows = _grid(shown, n == 1)
    for i in range(shown):
        place(0, i * per[0], (i % cols) * (w + gap), (rows - 1 - i // cols) * (h + gap))
    return Layout(cells, tuple(boxes), cols * w + (cols - 1) * gap, rows * h + (rows - 1) * gap, drawn)


def group_of_device(groups: np.ndarray | list, devices: int) -> np.ndarray:
    """``g[d]``: the index of the group holding device ``d`` (-1: in none)."""
    out = np.full(devices, -1)
    for i, members in enumerate(groups):
        out[np.asarray(members, dtype=int)] = i
    return out


def crossing(topology: Topology, members: list[int] | np.ndarray) -> str:
    """The levels one group spans, as the main command says it: ``node x2 >
    gpu x4`` (levels where its members differ), or ``one device``."""
    ids = np.asarray(members, dtype=int)
    parts = []
    for level, name in enumerate(topology.level_names):
        per = math.prod(topology.counts[level + 1:])
        distinct = len(np.unique((ids // per) % topology.counts[level]))
        if distinct > 1:
            parts.append(f"{name} x{distinct}")
    return " > ".join(parts) or "one device"


@dataclass(frozen=True)
class AxisPanel:
    """One axis' groups: the title and each device's group."""

    title: str
    group: np.ndarray


def axis_panels(placement: Placement) -> list[AxisPanel]:
    """A panel per axis: ``AXIS=SIZE: G groups of SIZE, crossing LEVELS``."""
    panels = []
    for axis in placement.axes:
        groups = Reduction.of(placement, (axis.name,)).reduction_groups
        title = (f"{axis.name}={axis.size}: {len(groups)} group{'s' if len(groups) != 1 else ''} of {axis.size}, "
                 f"{crossing(placement.topology, groups[0])}")
        panels.append(AxisPanel(title, group_of_device(groups, placement.topology.num_devices)))
    return panels


@dataclass(frozen=True)
class StepRow:
    """One step of a program: its title and each device's sub-group."""

    title: str
    group: np.ndarray
    seconds: float


def step_rows(planned: PlannedReduction, model: Model, size_bytes: int | None) -> tuple[str, list[StepRow]]:
    """The program of ``planned`` for ``size_bytes`` per device (default: the
    largest range's program at the size it was predicted for, else 256 MiB):
    its heading, and per step the collective, its sub-groups, the bytes each
    member moves and the predicted seconds (``model``)."""
    program = planned.programs[-1] if size_bytes is None else planned.program_for(size_bytes)
    size = size_bytes or program.predicted_for_bytes or DEFAULT_SIZE_BYTES
    reduction, lowered = planned.reduction, program.lowered
    predictor = Predictor(reduction, model)
    loads = lowered_loads(lowered)
    chunk_bytes = size / lowered.num_chunks
    rows, total = [], 0.0
    texts = format_program(lowered.program).split("\n")
    for step, (instruction, load) in enumerate(zip(lowered.program.instructions, loads), start=1):
        lowered_step = lowered.steps[step - 1]
        seconds = predictor.step(instruction, load, size)[0]
        total += seconds
        members = len(lowered_step.groups[0])
        moved = max(len(c) for c in lowered_step.chunks) * chunk_bytes
        text = texts[step - 1]
        rows.append(StepRow(f"{step}. {text}\n{len(lowered_step.groups)} group{'s' if len(lowered_step.groups) > 1 else ''}"
                            f" of {members} ({crossing(reduction.topology, lowered_step.groups[0])})\n"
                            f"{format_size(int(moved))} per member, {format_seconds(seconds)}",
                            group_of_device(lowered_step.groups, reduction.topology.num_devices), seconds))
    heading = (f"{','.join(reduction.axes)} {reduction.goal.value} of {format_size(int(size))} per device: "
               f"{len(rows)} step{'s' if len(rows) != 1 else ''}, {format_seconds(total)} predicted")
    return heading, rows


def job_lines(job: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """A job plan's sizes as one line, and its predicted step split (seconds
    per term, terms that are zero left out)."""
    sizes = job.get("sizes", {})
    text = " ".join(f"{a}={sizes[a]}" for a in ("tp", "cp", "ep", "dp", "pp") if a in sizes)
    text += f" mb={job.get('micro_batch')}"
    stages = job.get("stage_layers") or []
    if len(set(stages)) > 1:
        text += f", stages of {stages[0]}, {stages[1]} .. {stages[-1]} layers"
    step = job.get("predicted_step_s")
    if isinstance(step, (int, float)):
        text += f"; step {format_seconds(float(step))} predicted"
    split = {k: float(v) for k, v in (job.get("breakdown_s") or {}).items()
             if k in STEP_TERMS and isinstance(v, (int, float)) and v > 0}
    return text, split


# ---------------------------------------------------------------- matplotlib


def pyplot():
    """matplotlib's pyplot on the off-screen backend; SynthError naming what
    to install when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise SynthError("draw needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.fonttype"] = "none"  # SVG text stays text (searchable, smaller)
    return plt


def _hierarchy(ax, topology: Topology, where: Layout, group: np.ndarray, title: str, plt) -> int:
    """One hierarchy on ``ax``, devices coloured by ``group`` (-1: grey);
    returns how many distinct colours it used."""
    from matplotlib.patches import Rectangle

    cmap = plt.get_cmap("tab20")
    shades = {0: "#f4f4f4", 1: "#e6e6e6", 2: "#d8d8d8"}
    for box in where.boxes:
        ax.add_patch(Rectangle((box.x, box.y), box.width, box.height, facecolor=shades.get(box.level, "#cccccc"),
                               edgecolor="#777777", linewidth=0.6))
    used = set()
    for d in range(where.drawn):
        g = int(group[d])
        colour = "#bbbbbb" if g < 0 else cmap(g % COLOURS)
        if g >= 0:
            used.add(g % COLOURS)
        x, y = where.cells[d]
        ax.add_patch(Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, facecolor=colour, edgecolor="white", linewidth=0.3))
    if where.drawn < topology.num_devices:
        title += f"\n(first {where.drawn} of {topology.num_devices} devices drawn; the rest alike)"
    ax.set_title(title, fontsize="small")
    ax.set_xlim(-0.2, where.width + 0.2)
    ax.set_ylim(-0.2, where.height + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    return len(used)


def draw_plan(plan: Plan, path: str | Path, model: Model, size_bytes: int | None = None,
              title: str | None = None) -> dict[str, int]:
    """Draw ``plan`` to ``path`` (SVG, PNG, PDF: by the suffix) as the module
    docstring says; returns the colours used per panel title (what a test
    checks against the plan's groups)."""
    plt = pyplot()
    placement, topology = plan.placement, plan.placement.topology
    where = layout(topology)
    axes = axis_panels(placement)
    programs = [step_rows(r, model, size_bytes) for r in plan.reductions]
    step_panels = max((min(len(rows), MAX_STEPS_DRAWN) for _, rows in programs), default=0)
    columns = max(len(axes), step_panels, 1)
    job = plan.job if isinstance(plan.job, dict) else None
    aspect = where.height / max(where.width, 1e-9)
    panel_w = min(9.0, max(3.6, 3.6 * math.sqrt(where.drawn / 64)))
    panel_h = max(1.2, min(4.0, panel_w * aspect)) + 0.9
    rows = 1 + len(programs) + (1 if job else 0)
    heights = [panel_h] + [panel_h + 0.3] * len(programs) + ([1.8] if job else [])
    figure = plt.figure(figsize=(panel_w * columns, sum(heights) + 0.8), layout="constrained")
    rows_of = figure.subfigures(rows, 1, height_ratios=heights) if rows > 1 else [figure.subfigures(1, 1)]
    used: dict[str, int] = {}
    top = rows_of[0].subplots(1, columns, squeeze=False)[0]
    for i, ax in enumerate(top):
        if i < len(axes):
            used[axes[i].title] = _hierarchy(ax, topology, where, axes[i].group, axes[i].title, plt)
        else:
            ax.axis("off")
    rows_of[0].suptitle("the axes' groups (one colour per group)", fontsize="medium", fontweight="bold")
    for r, (heading, steps) in enumerate(programs, start=1):
        panels = rows_of[r].subplots(1, columns, squeeze=False)[0]
        for i, ax in enumerate(panels):
            if i < min(len(steps), MAX_STEPS_DRAWN):
                used[steps[i].title] = _hierarchy(ax, topology, where, steps[i].group, steps[i].title, plt)
            else:
                ax.axis("off")
        more = f" (steps {MAX_STEPS_DRAWN + 1}..{len(steps)} not drawn)" if len(steps) > MAX_STEPS_DRAWN else ""
        rows_of[r].suptitle(heading + more, fontsize="medium", fontweight="bold")
    if job:
        text, split = job_lines(job)
        ax = rows_of[rows - 1].subplots(1, 1)
        left = 0.0
        cmap = plt.get_cmap("tab10")
        for i, (term, seconds) in enumerate(split.items()):
            ax.barh([0], [seconds], left=left, color=cmap(i % 10), label=f"{term} {format_seconds(seconds)}")
            left += seconds
        ax.set_yticks([])
        ax.set_xlabel("predicted seconds per step")
        rows_of[rows - 1].suptitle("job: " + text, fontsize="medium", fontweight="bold")
        if split:
            ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", frameon=False)
    levels = " > ".join(f"{name} x{count}" for name, count in zip(topology.level_names, topology.counts))
    figure.suptitle(title or f"{topology.name}: {levels} ({topology.num_devices} devices); "
                    f"{placement.matrix_text()}", fontsize="large")
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return used
