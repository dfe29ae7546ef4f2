"""The price of a program run pipelined: its buffer cut into ``pieces``, each
piece entering step ``i + 1`` as soon as step ``i`` has produced it (the
MSCCL schedules of :mod:`synth.export.msccl`).

Each step ``i`` of one piece costs ``t_i``, the step's predicted time at
``size / pieces`` (so every piece pays the step's latency again). Steps that
cross the same level (their groups' outermost differing level: the links they
load) cannot overlap one another and form one stage of the pipeline, of time
``T_r = sum of t_i over its steps``; stages on different levels overlap.
The program then takes ``sum_i t_i + (pieces - 1) x max_r T_r``: the first
piece goes through every step, and each further piece adds the busiest
stage's time. With one step per level this is the textbook pipeline
(``sum t + (P - 1) max t``); with one piece it is the step-by-step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..synthesis.lowering import LoweredProgram
from ..synthesis.reduction import Reduction
from ..topology import Topology
from .model import Algorithm, Model
from .predict import Predictor, lowered_loads


def pipelined_seconds(piece_step_s: Sequence[float], step_levels: Sequence[int], pieces: int) -> float:
    """``sum t + (pieces - 1) x`` the largest per-level sum of ``t`` (module
    docstring); ``piece_step_s`` are the steps' times for one piece."""
    if pieces < 1:
        raise ValueError("pieces must be >= 1")
    stages: dict[int, float] = {}
    for t, level in zip(piece_step_s, step_levels):
        stages[level] = stages.get(level, 0.0) + t
    return sum(piece_step_s) + (pieces - 1) * max(stages.values(), default=0.0)


def crossed_level(topology: Topology, group: Sequence[int]) -> int:
    """The outermost level at which ``group``'s devices sit in different
    elements (its members talk over that level's links); the innermost level
    for a group of one device."""
    counts = topology.counts
    for level in range(len(counts)):
        below = math.prod(counts[level + 1:])  # devices per element of this level
        if len({d // below for d in group}) > 1:
            return level
    return len(counts) - 1


@dataclass(frozen=True)
class PipelinedPrediction:
    """Both prices of one program at one size, and what the pipelined one is
    made of: each step's time for one piece and the level it loads."""

    step_by_step_s: float
    pipelined_s: float
    pieces: int
    piece_step_s: tuple[float, ...]
    step_levels: tuple[int, ...]


def predict_pipelined(lowered: LoweredProgram, reduction: Reduction, size_bytes: float, pieces: int,
                      model: Model | None = None) -> PipelinedPrediction:
    """The program's step-by-step time and its time pipelined over ``pieces``
    (its steps as rings, as the MSCCL schedules run them: the model forced to
    NCCL's ring, with the given model's parameters)."""
    model = model or Model()
    ring = model.with_algorithm(Algorithm.RING)
    predictor = Predictor(reduction, ring)
    loads = lowered_loads(lowered)
    whole = predictor.program(lowered.program, loads, float(size_bytes))
    per_piece = tuple(predictor.step(instruction, load, float(size_bytes) / pieces)[0]
                      for instruction, load in zip(lowered.program.instructions, loads))
    first = set(lowered.reduction_groups[0])  # one reduction group's groups: every group is placed alike
    levels = tuple(min((crossed_level(reduction.topology, g) for g in step.groups if g[0] in first), default=0)
                   for step in lowered.steps)
    return PipelinedPrediction(whole, pipelined_seconds(per_piece, levels, pieces), pieces, per_piece, levels)
