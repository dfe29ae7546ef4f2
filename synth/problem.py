"""The problem a command solves, from its command-line arguments: a topology,
parallelism axes, the reduction (axes and goal), placement constraints and the
step limit. Shared by the main command, bench, tune and emulate.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .errors import SynthError
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
from .semantics import Goal
from .topology import Topology, load_topology, parse_scale


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are SynthErrors (one line, exit 2)."""

    def error(self, message: str) -> None:  # one line, exit 2, like SynthError
        raise SynthError(f"{message} (see '{self.prog} --help')")


def add_problem_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, help="topology YAML file, or a shipped name (e.g. dgx-a100)")
    p.add_argument("--axes", required=True, help="parallelism axes with sizes, e.g. dp=16,mp=8")
    p.add_argument("--reduce", help="reduction axes, e.g. dp or dp,mp (default: the first axis)")
    p.add_argument(
        "--collective",
        choices=[g.value for g in Goal],
        help="the reduction to implement (default: allreduce)",
    )
    p.add_argument(
        "--constrain",
        action="append",
        default=[],
        metavar="AXIS@LEVEL{=,>=,<=}N",
        help="constrain a matrix entry, e.g. mp@node=1 (mp stays inside a node); repeatable",
    )
    p.add_argument("--scale", default="", metavar="LEVEL=COUNT", help="override level counts, e.g. node=2")
    p.add_argument("--max-steps", type=int, default=5, help="longest program to search (default: 5)")


@dataclass(frozen=True)
class Problem:
    topology: Topology
    axes: tuple[Axis, ...]
    reduce_axes: tuple[str, ...]
    goal: Goal
    constraints: tuple[Constraint, ...]
    max_steps: int

    def describe(self) -> str:
        axes = " ".join(f"{a.name}={a.size}" for a in self.axes)
        levels = " > ".join(f"{lv.name} x{lv.count}" for lv in self.topology.levels)
        return (
            f"topology {self.topology.name}: {levels} ({self.topology.num_devices} devices); "
            f"axes {axes}; {self.goal.value} over {','.join(self.reduce_axes)}"
        )


def problem_from_args(args: argparse.Namespace) -> Problem:
    topology = load_topology(args.topology)
    if args.scale:
        topology = topology.scaled(parse_scale(args.scale))
    axes = parse_axes(args.axes)
    check_axes_fit(axes, topology)
    if args.max_steps < 1:
        raise SynthError(f"--max-steps {args.max_steps}: must be >= 1")
    return Problem(
        topology=topology,
        axes=axes,
        reduce_axes=parse_reduce(args.reduce, axes),
        goal=Goal(args.collective or "allreduce"),
        constraints=tuple(parse_constraint(c, axes, topology) for c in args.constrain),
        max_steps=args.max_steps,
    )


def placements_of(problem: Problem) -> list[Placement]:
    placements = enumerate_placements(problem.topology, problem.axes, problem.constraints)
    if not placements:
        given = ", ".join(str(c) for c in problem.constraints)
        raise SynthError(
            f"no placement satisfies the constraints ({given}); relax or remove a --constrain"
        )
    return placements
