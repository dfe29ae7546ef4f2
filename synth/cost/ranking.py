"""Rank the programs of a reduction by predicted time."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..synthesis.search import ReductionPrograms
from ..synthesis.semantics import Loads
from .model import Model
from .predict import Predictor, default_program


@dataclass(frozen=True)
class Ranked:
    """A reduction's programs sorted fastest first, with the default all-reduce."""

    result: ReductionPrograms
    order: tuple[int, ...]  # program indices, fastest first
    predicted_s: tuple[float, ...]  # aligned with ``order``
    default_s: float
    default_index: int | None  # index of the default program among the programs

    @property
    def best_s(self) -> float:
        return self.predicted_s[0] if self.order else math.inf

    @property
    def speedup(self) -> float:
        """Default time over best time; 1 when there is nothing to do (k = 1)."""
        if not self.order:
            return 0.0
        return self.default_s / self.best_s if self.best_s > 0 else 1.0


def rank(result: ReductionPrograms, size_bytes: float, model: Model | None = None) -> Ranked:
    """Predict every program of a reduction and sort them, fastest first (ties
    keep the search's order)."""
    predictor = Predictor(result.reduction, model)
    instructions = result.instructions
    # a step's seconds per (instruction index, loads): Predictor.program's sum, over keys that hash in C
    step_s: dict[tuple[int, Loads], float] = {}
    times = []
    for indices, loads in result.search.indices:
        seconds = []
        for key in zip(indices, loads):
            s = step_s.get(key)
            if s is None:
                s = step_s[key] = predictor.step(instructions[key[0]], key[1], size_bytes)[0]
            seconds.append(s)
        times.append(sum(seconds))  # as Predictor.program: the sum in program order
    order = tuple(sorted(range(len(times)), key=lambda i: (times[i], i)))
    default = default_program(result.reduction.goal)
    default_index = next((i for i, p in enumerate(result.programs) if p == default), None)
    default_s = times[default_index] if default_index is not None else 0.0  # k = 1: nothing to do
    return Ranked(result, order, tuple(times[i] for i in order), default_s, default_index)
