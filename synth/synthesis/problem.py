"""The question a command or an API call asks: a topology, parallelism axes, the
reduction (axes and goal), placement constraints and the step limit.

:func:`make_problem` builds one from the loose values users write (a shipped
topology name or a path, ``{"dp": 4}`` or ``"dp=4,mp=16"``, ``"mp@node=1"``),
with the same one-line errors as the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence, Union

from ..errors import SynthError
from ..topology import Topology, load_topology, parse_scale
from .placement import (
    Axis,
    Constraint,
    Placement,
    check_axes_fit,
    enumerate_placements,
    parse_axes,
    parse_constraint,
    parse_reduce,
)
from .reduction import Reduction
from .semantics import Goal

MAX_STEPS_DEFAULT = 5
#: the longest programs searched: the state graph and the program count grow
#: several times per step (rack: 871 844 programs at 8 steps)
MAX_STEPS_LIMIT = 10

TopologySpec = Union[str, Path, Topology]
AxesSpec = Union[str, Mapping[str, int], Sequence[Axis]]


@dataclass(frozen=True)
class Problem:
    topology: Topology
    axes: tuple[Axis, ...]
    reduce_axes: tuple[str, ...]
    goal: Goal = Goal.ALLREDUCE
    constraints: tuple[Constraint, ...] = ()
    max_steps: int = MAX_STEPS_DEFAULT

    def describe(self) -> str:
        axes = " ".join(f"{a.name}={a.size}" for a in self.axes)
        levels = " > ".join(f"{lv.name} x{lv.count}" for lv in self.topology.levels)
        return (
            f"topology {self.topology.name}: {levels} ({self.topology.num_devices} devices); "
            f"axes {axes}; {self.goal.value} over {','.join(self.reduce_axes)}"
        )

    def placements(self) -> list[Placement]:
        """Every placement satisfying the constraints, in enumeration order (the
        ``#`` column); SynthError if none does."""
        placements = enumerate_placements(self.topology, self.axes, self.constraints)
        if not placements:
            given = ", ".join(str(c) for c in self.constraints)
            raise SynthError(f"no placement satisfies the constraints ({given}); relax or remove a --constrain")
        return placements

    def reduction(self, placement: Placement) -> Reduction:
        return Reduction(placement, self.reduce_axes, self.goal)


def resolve_topology(topology: TopologySpec) -> Topology:
    """A :class:`Topology` as given, or loaded from a path or shipped name."""
    return topology if isinstance(topology, Topology) else load_topology(str(topology))


def resolve_axes(axes: AxesSpec) -> tuple[Axis, ...]:
    """Axes from ``"dp=4,mp=16"``, ``{"dp": 4, "mp": 16}`` or a sequence of :class:`Axis`."""
    if isinstance(axes, str):
        return parse_axes(axes)
    if isinstance(axes, Mapping):
        return parse_axes(",".join(f"{name}={size}" for name, size in axes.items()))
    if all(isinstance(a, Axis) for a in axes):
        return parse_axes(",".join(f"{a.name}={a.size}" for a in axes))
    raise SynthError("axes: give a mapping name -> size, e.g. {'dp': 4, 'mp': 16}, or text 'dp=4,mp=16'")


def resolve_goal(goal: Goal | str) -> Goal:
    if isinstance(goal, Goal):
        return goal
    try:
        return Goal(goal.lower())
    except (ValueError, AttributeError):
        raise SynthError(f"goal {goal!r}: use one of {', '.join(g.value for g in Goal)}") from None


def make_problem(
    topology: TopologySpec,
    axes: AxesSpec,
    reduce: str | Sequence[str] | None = None,
    goal: Goal | str = Goal.ALLREDUCE,
    constraints: Sequence[Constraint | str] = (),
    max_steps: int = MAX_STEPS_DEFAULT,
) -> Problem:
    """A checked problem from loose values; SynthError names the bad one."""
    topology = resolve_topology(topology)
    axes = resolve_axes(axes)
    check_axes_fit(axes, topology)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        raise SynthError(f"--max-steps {max_steps!r}: must be an integer >= 1")
    if max_steps < 1:
        raise SynthError(f"--max-steps {max_steps}: must be >= 1")
    if max_steps > MAX_STEPS_LIMIT:
        raise SynthError(f"--max-steps {max_steps}: must be 1..{MAX_STEPS_LIMIT}")
    if reduce is not None and not isinstance(reduce, str):
        reduce = ",".join(reduce)
    checked = tuple(parse_constraint(str(c), axes, topology) for c in constraints)
    return Problem(topology, axes, parse_reduce(reduce, axes), resolve_goal(goal), checked, max_steps)


@dataclass(frozen=True)
class ProblemSpec:
    """A problem as the command line writes it (text values); :meth:`build`
    loads and checks it. Commands that run under mpiexec build it on every rank
    and agree on the outcome before any collective."""

    topology: str
    axes: str
    reduce: str | None = None
    goal: str | None = None
    constraints: tuple[str, ...] = ()
    scale: tuple[str, ...] = ()  # "node=2" or "node=2,gpu=4" items, applied in order
    max_steps: int = MAX_STEPS_DEFAULT

    def load_topology(self) -> Topology:
        """The topology, with the ``scale`` overrides applied."""
        topology = load_topology(self.topology)
        for item in self.scale:
            topology = topology.scaled(parse_scale(item))
        return topology

    def build(self) -> Problem:
        return make_problem(self.load_topology(), self.axes, self.reduce, self.goal or Goal.ALLREDUCE,
                            self.constraints, self.max_steps)
