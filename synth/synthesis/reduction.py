"""A reduction: a placement, the axes reduced over, and the goal.

``Reduction(placement, axes, goal)`` is the value that travels from search to
lowering, cost, plans, the benchmark and the fit. It derives, once, the tables
every later stage needs:

* :attr:`hierarchy`: the synthesis hierarchy (docs/model.md): for each
  level where the reduction axes are split (product of ``X[a][l]`` over them >
  1), its name and that product, outermost first. Every reduction group has this
  shape, so a program is synthesized once on it.
* :attr:`reduction_groups`: ``(G, k)`` device ids; row ``g`` is one reduction
  group, column ``r`` the device with reduction rank ``r`` (mixed radix over the
  reduction axes in declared order, last fastest; within an axis, its digits
  outermost level first).
* :attr:`synthesis_groups`: the same rows, columns ordered by synthesis index
  (the mixed-radix number of the reduction axes' digits level by level, outermost
  level most significant, within a level the axes in declared order, last
  fastest): what :mod:`synth.synthesis.semantics` numbers devices by.
* :attr:`rank_to_synthesis_index`: ``sigma[r]``, the synthesis index of the
  device with reduction rank ``r``, the same in every reduction group.

Invariants: both tables hold every device exactly once; row ``g`` of both holds
the same devices; ``synthesis_groups[:, sigma[r]] == reduction_groups[:, r]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

import numpy as np

from ..errors import SynthError
from ..topology import Topology
from .placement import Placement
from .semantics import Goal, Hierarchy


@dataclass(frozen=True)
class Reduction:
    """Reduce over ``axes`` (declared-order names of the placement's axes) toward
    ``goal``. Build one with :meth:`of` to accept axes in any order."""

    placement: Placement
    axes: tuple[str, ...]
    goal: Goal = Goal.ALLREDUCE

    def __post_init__(self) -> None:
        declared = self.placement.axis_names
        unknown = [a for a in self.axes if a not in declared]
        if unknown or not self.axes:
            raise SynthError(
                f"reduction axes {list(self.axes)}: name at least one of the declared axes "
                f"({', '.join(declared)})"
            )
        if tuple(a for a in declared if a in self.axes) != self.axes:
            raise SynthError(
                f"reduction axes {list(self.axes)}: give each axis once, in declared order ({', '.join(declared)})"
            )

    @classmethod
    def of(cls, placement: Placement, axes: str | Iterable[str], goal: Goal = Goal.ALLREDUCE) -> "Reduction":
        """A reduction over ``axes`` (names in any order, each once, or ``"dp,mp"``)."""
        axes = tuple(a.strip() for a in axes.split(",") if a.strip()) if isinstance(axes, str) else tuple(axes)
        if len(set(axes)) != len(axes):
            raise SynthError(f"reduction axes {list(axes)}: an axis is named twice")
        ordered = tuple(a for a in placement.axis_names if a in axes)
        return cls(placement, ordered if len(ordered) == len(axes) else tuple(axes), goal)

    @property
    def topology(self) -> Topology:
        return self.placement.topology

    @cached_property
    def _axis_indices(self) -> tuple[int, ...]:
        return tuple(self.placement.axis_names.index(a) for a in self.axes)

    @cached_property
    def hierarchy(self) -> Hierarchy:
        names, sizes = [], []
        for l, level in enumerate(self.topology.levels):
            size = math.prod(self.placement.matrix[a][l] for a in self._axis_indices)
            if size > 1:
                names.append(level.name)
                sizes.append(size)
        return Hierarchy(tuple(names), tuple(sizes))

    @property
    def k(self) -> int:
        """Devices per reduction group (= chunks a buffer is cut into)."""
        return self.hierarchy.k

    def _table(self, level_major: bool) -> np.ndarray:
        placement = self.placement
        red = self._axis_indices
        rest = [a for a in range(len(placement.axes)) if a not in red]
        levels = range(len(self.topology.levels))
        outer = [placement.digit_dim(a, l) for a in rest for l in levels]
        if level_major:
            inner = [placement.digit_dim(a, l) for l in levels for a in red]
        else:
            inner = [placement.digit_dim(a, l) for a in red for l in levels]
        table = placement.digits.transpose(outer + inner).reshape(-1, self.k)
        table.setflags(write=False)
        return table

    @cached_property
    def reduction_groups(self) -> np.ndarray:
        return self._table(level_major=False)

    @cached_property
    def synthesis_groups(self) -> np.ndarray:
        return self._table(level_major=True)

    @cached_property
    def rank_to_synthesis_index(self) -> tuple[int, ...]:
        by_rank = self.reduction_groups[0]
        position = {int(d): i for i, d in enumerate(self.synthesis_groups[0])}
        return tuple(position[int(d)] for d in by_rank)

    def with_goal(self, goal: Goal) -> "Reduction":
        """The same placement and axes toward another goal."""
        return Reduction(self.placement, self.axes, goal)

    def describe(self) -> str:
        """``allreduce over dp``."""
        return f"{self.goal.value} over {','.join(self.axes)}"
