"""Predicted seconds of a step and of a program, for one reduction and model.

A step runs all its groups at once, so a step's cost is the rounds of its
collective's algorithm (:mod:`synth.cost.algorithms`) with every group's flows
in each round contending for the links (:mod:`synth.cost.links`), plus the
profile's per-call overhead. A program's cost is the sum of its steps'.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..language import Collective, Form, Instruction, Program
from ..lowering import LoweredProgram
from ..reduction import Reduction
from ..semantics import Goal, Loads, resolve
from ..topology import Topology
from .algorithms import mpi_algorithm, node_buckets, rounds_of, tree_rounds
from .links import links_of, round_cost
from .model import Algorithm, Model
from .profile import Profile
from .terms import Features


def step_cost(
    topology: Topology,
    profile: Profile,
    algorithm: Algorithm,
    collective: Collective,
    groups: np.ndarray,
    nbytes: np.ndarray,
) -> tuple[float, Features]:
    """Seconds of one step and its critical-path features. ``groups`` is an
    (n, m) array of device ids (n groups of m members, all at once) and
    ``nbytes`` the bytes each group's collective moves."""
    links = links_of(topology)
    groups = np.sort(np.asarray(groups), axis=1)  # ring and tree order: device ids
    nbytes = np.asarray(nbytes, dtype=float)
    total, features = 0.0, Features.zero(len(topology.levels))
    if algorithm is Algorithm.TREE and collective is Collective.ALLREDUCE:
        pattern = tree_rounds(node_buckets(links, groups[0]))
    else:
        m = groups.shape[1]
        name = mpi_algorithm(collective, m, float(nbytes.max())) if algorithm is Algorithm.MPI else algorithm.value
        pattern = rounds_of(name, collective, m)
    for rnd in pattern:
        if not rnd.src:
            continue
        src = groups[:, list(rnd.src)].ravel()
        dst = groups[:, list(rnd.dst)].ravel()
        flow_bytes = (nbytes[:, None] * np.asarray(rnd.fraction)[None, :]).ravel()
        seconds, f = round_cost(links, profile, collective, src, dst, flow_bytes)
        total += rnd.repeat * seconds
        features.add(f, rnd.repeat)
        if rnd.extra:
            hop = f.latency_count
            total += rnd.extra * float(profile.latency_s @ hop)
            features.latency_count = features.latency_count + rnd.extra * hop
    features.calls = 1.0
    return total + profile.call_overhead_us * 1e-6, features


def default_program(goal: Goal) -> Program:
    """The library's one-call collective over each whole reduction group."""
    collective = {
        Goal.ALLREDUCE: Collective.ALLREDUCE,
        Goal.REDUCESCATTER: Collective.REDUCESCATTER,
        Goal.ALLGATHER: Collective.ALLGATHER,
    }[goal]
    return Program((Instruction(collective, "root", Form.INSIDE),))


class Predictor:
    """Predictions for the programs of one reduction under one model.

    Step costs are memoised on (instruction, loads, size), so predicting every
    program of a search costs one evaluation per distinct step."""

    def __init__(self, reduction: Reduction, model: Model | None = None) -> None:
        self.reduction = reduction
        self.model = model or Model()
        self.profile = self.model.profile_for(reduction.topology)
        self._memo: dict[tuple[Instruction, Loads, float], tuple[float, Features]] = {}
        self._groups: dict[Instruction, np.ndarray] = {}

    def _global_groups(self, instruction: Instruction) -> np.ndarray:
        """(synthesis groups x reduction groups, members) global device ids."""
        if instruction not in self._groups:
            table = self.reduction.synthesis_groups
            synthesis = np.asarray(resolve(instruction, self.reduction.hierarchy).groups)  # (s, m)
            self._groups[instruction] = table[:, synthesis].transpose(1, 0, 2).reshape(-1, synthesis.shape[1])
        return self._groups[instruction]

    def step(self, instruction: Instruction, loads: Loads, size_bytes: float) -> tuple[float, Features]:
        key = (instruction, loads, size_bytes)
        if key not in self._memo:
            groups = self._global_groups(instruction)
            chunk_bytes = size_bytes / self.reduction.k
            nbytes = np.repeat(np.asarray(loads, dtype=float) * chunk_bytes, len(self.reduction.synthesis_groups))
            if not nbytes.all():  # groups that move nothing (an AllGather of empty members) are idle
                groups, nbytes = groups[nbytes > 0], nbytes[nbytes > 0]
            self._memo[key] = step_cost(
                self.reduction.topology, self.profile, self.model.algorithm, instruction.collective, groups, nbytes
            )
        return self._memo[key]

    def program(self, program: Program, loads: Sequence[Loads], size_bytes: float) -> float:
        """Predicted seconds of ``program`` whose steps move ``loads`` chunks."""
        return sum(self.step(i, l, size_bytes)[0] for i, l in zip(program.instructions, loads))

    def features(self, program: Program, loads: Sequence[Loads], size_bytes: float) -> Features:
        total = Features.zero(len(self.reduction.topology.levels))
        for i, l in zip(program.instructions, loads):
            total.add(self.step(i, l, size_bytes)[1])
        return total


def lowered_loads(lowered: LoweredProgram) -> list[Loads]:
    """Per step, the chunks each group moves, from a lowered program (one value
    per synthesis group, taken from reduction group 0's groups)."""
    first = set(lowered.reduction_groups[0])
    return [tuple(len(c) for g, c in zip(s.groups, s.chunks) if g[0] in first) for s in lowered.steps]


def predict_program(
    lowered: LoweredProgram, reduction: Reduction, size_bytes: float, model: Model | None = None
) -> float:
    """Predicted seconds of a lowered program at ``size_bytes`` per device."""
    return Predictor(reduction, model).program(lowered.program, lowered_loads(lowered), size_bytes)
