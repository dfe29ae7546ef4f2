"""The collectives of a training step on placements, priced by the
project's cost model (:mod:`synth.cost`): :class:`CollectiveCosts` for one
topology and cost model, :class:`PlacementCollectives` its
:class:`~synth.planner.collectives.Collectives` on one placement, which the
step model (:mod:`synth.planner.stepmodel`) prices a step with.

Every collective is costed with the best synthesized program for its axis,
placement and size: placement and programs change the step time. A reduction
is synthesized once per (axis rows of the matrix, goal) and ranked once per
size, and reused across micro-batches, size assignments and placements. On a
topology whose levels are all switched, the predicted cost of a reduction over
an axis depends on the matrix only through that axis's row: two placements
with the same row have reduction groups that map onto each other by permuting
siblings inside their parents, which keeps every link's load and every group's
device-id order (within a level an axis's digits are laid out with positive
strides), and the cost model sees the topology only through those (tests check
the equality). Pipeline sends are costed as a Broadcast over each pair of
adjacent stages, all pairs at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..cost import AllToAll, Model, Predictor, default_program, step_cost
from ..cost.alltoall import peer_seconds, program_alltoalls, program_seconds
from ..synthesis.alltoall import AllToAllProgram, synthesize_alltoall
from ..synthesis.language import Collective, Program
from ..synthesis.lowering import LoweredProgram, lower
from ..synthesis.placement import Placement, split_at_innermost_level
from ..synthesis.reduction import Reduction
from ..synthesis.search import ReductionPrograms, synthesize_reduction
from ..synthesis.semantics import Goal
from ..synthesis.verify import verify_lowered
from ..topology import Topology
from .stepmodel import HSDP_REPLICATE, HSDP_SHARD


@dataclass(frozen=True)
class BestProgram:
    """The fastest predicted program of a reduction at one size."""

    seconds: float
    program: Program | None  # None: no program within the step limit
    sm_share: float = 0.0  # of each device's SMs its kernels hold while it runs (Predictor.sm_share)


class CollectiveCosts:
    """Predicted seconds of reductions and pipeline sends on placements of one
    topology under one cost model, each computed once (module docstring)."""

    def __init__(self, topology: Topology, model: Model | None = None, max_steps: int = 5) -> None:
        self.topology = topology
        self.model = model or Model()
        self.profile = self.model.profile_for(topology)
        self.max_steps = max_steps
        self.symmetric = all(level.fabric == "switch" for level in topology.levels)
        self._reductions: dict[tuple, tuple[ReductionPrograms, Predictor]] = {}
        self._best: dict[tuple, BestProgram] = {}
        self._sends: dict[tuple, float] = {}
        self._alltoalls: dict[tuple, tuple[tuple[AllToAllProgram, tuple[AllToAll, ...]], ...]] = {}
        self._best_alltoalls: dict[tuple, tuple[float, AllToAllProgram]] = {}
        self._on: dict[tuple[int, bool], PlacementCollectives] = {}  # by (placement's id, default only)
        self._defaults: dict[tuple, Predictor] = {}
        self._default_best: dict[tuple, BestProgram] = {}
        self._hsdp: dict[tuple, Placement] = {}
        self._proved: dict[tuple, LoweredProgram] = {}
        self._reduction_keys: dict[tuple[int, str], tuple] = {}  # by (placement's id, axis): _reduction_key's

    def _key(self, placement: Placement, axes: tuple[str, ...]) -> tuple:
        rows = tuple(placement.matrix[placement.axis_names.index(a)] for a in axes)
        return rows if self.symmetric else (placement.matrix, placement.axis_names, axes)

    def _reduction_key(self, placement: Placement, axis: str) -> tuple[Placement, tuple[str, ...], tuple]:
        """The placement a collective over ``axis`` runs on (:meth:`placement_for`), its axes
        (:func:`reduce_axes`) and their :meth:`_key`, each once per (placement, axis)."""
        found = self._reduction_keys.get((id(placement), axis))
        if found is None or found[0] is not placement:  # the placement is kept: its id is not reused
            on = self.placement_for(placement, axis)
            axes = reduce_axes(on, axis)
            found = self._reduction_keys[(id(placement), axis)] = (placement, on, axes, self._key(on, axes))
        return found[1:]

    @property
    def reductions_synthesized(self) -> int:
        return len(self._reductions)

    @property
    def rankings(self) -> int:
        return len(self._best)

    def hsdp(self, placement: Placement) -> Placement:
        """``placement`` with dp split into HSDP's replicate and shard axes
        (:func:`~synth.synthesis.placement.split_at_innermost_level`), the
        same devices in the same positions; each once."""
        key = ("hsdp", placement.matrix, placement.axis_names)
        found = self._hsdp.get(key)
        if found is None:
            found = self._hsdp[key] = split_at_innermost_level(placement, "dp", HSDP_REPLICATE, HSDP_SHARD)
        return found

    def placement_for(self, placement: Placement, axis: str) -> Placement:
        """The placement a reduction over ``axis`` is synthesized on: HSDP's
        sub-axes of dp live on :meth:`hsdp`'s."""
        return self.hsdp(placement) if axis in (HSDP_SHARD, HSDP_REPLICATE) else placement

    def best(self, placement: Placement, axis: str, goal: Goal, size_bytes: int) -> BestProgram:
        """The fastest program of a reduction over ``axis`` (``dp+ep``: over
        both; ``dp_shard``, ``dp_replicate``: HSDP's sub-axes of dp) on
        ``placement``."""
        placement, axes, rows = self._reduction_key(placement, axis)
        key = (rows, goal)
        found = self._reductions.get(key)
        if found is None:
            programs = synthesize_reduction(Reduction(placement, axes, goal), self.max_steps)
            found = self._reductions[key] = (programs, Predictor(programs.reduction, self.model))
        programs, predictor = found
        at = (key, size_bytes)
        best = self._best.get(at)
        if best is None:
            best = self._best[at] = _fastest(programs, predictor, size_bytes)
        return best

    def default(self, placement: Placement, axis: str, goal: Goal, size_bytes: int) -> BestProgram:
        """The library's one-call collective for the reduction over ``axis``
        (:func:`~synth.cost.predict.default_program`), priced without any
        program search: what a configuration that does not fit is priced with."""
        placement, axes, rows = self._reduction_key(placement, axis)
        key = (rows, goal)
        at = (key, size_bytes)
        found = self._default_best.get(at)  # placements of the same reduction shape share it
        if found is None:
            predictor = self._defaults.get(key)
            if predictor is None:
                predictor = self._defaults[key] = Predictor(Reduction(placement, axes, goal), self.model)
            program, loads = default_program(goal), ((predictor.reduction.k,),)
            found = self._default_best[at] = BestProgram(predictor.default(goal, size_bytes), program,
                                                         predictor.sm_share(program, loads, size_bytes))
        return found

    def send(self, placement: Placement, axis: str, size_bytes: int) -> float:
        """Every device sends ``size_bytes`` to the device of the next ``axis``
        rank (same other coordinates), all pairs at once: a Broadcast over each
        pair."""
        key = (self._reduction_key(placement, axis)[2], size_bytes)  # the rows of (axis,)
        if key not in self._sends:
            mesh = np.moveaxis(placement.mesh, placement.axis_names.index(axis), -1)
            pairs = np.stack([mesh[..., :-1], mesh[..., 1:]], axis=-1).reshape(-1, 2)
            nbytes = np.full(len(pairs), float(size_bytes))
            self._sends[key] = step_cost(self.topology, self.profile, self.model.algorithm, Collective.BROADCAST,
                                         pairs, nbytes)[0]
        return self._sends[key]

    def alltoall_programs(self, placement: Placement, axis: str) -> tuple[tuple[AllToAllProgram, tuple[AllToAll, ...]], ...]:
        """The all-to-all programs of the ``axis`` groups of ``placement``
        (:func:`~synth.synthesis.alltoall.synthesize_alltoall` on their
        hierarchy: the one-call all-to-all first, then the hierarchical ones),
        each with its priced steps (:func:`synth.cost.alltoall.program_alltoalls`)."""
        key = self._key(placement, (axis,))
        found = self._alltoalls.get(key)
        if found is None:
            groups = Reduction.of(placement, (axis,))
            peer_s = peer_seconds(self.model.algorithm)
            found = self._alltoalls[key] = tuple(
                (program, program_alltoalls(self.topology, self.profile, groups, program, peer_s))
                for program in synthesize_alltoall(groups.hierarchy, self.max_steps).programs)
        return found

    def best_alltoall(self, placement: Placement, axis: str, size_bytes: int) -> tuple[float, AllToAllProgram]:
        """The fastest predicted all-to-all program of ``size_bytes`` per device
        in every ``axis`` group at once, and its seconds (ties: the earlier,
        shorter program)."""
        key = (self._key(placement, (axis,)), size_bytes)
        found = self._best_alltoalls.get(key)
        if found is None:
            found = self._best_alltoalls[key] = min(
                ((program_seconds(steps, size_bytes), program) for program, steps in
                 self.alltoall_programs(placement, axis)), key=lambda sp: sp[0])
        return found

    def alltoall(self, placement: Placement, axis: str, size_bytes: int) -> float:
        """Seconds of :meth:`best_alltoall`."""
        return self.best_alltoall(placement, axis, size_bytes)[0]

    def default_alltoall(self, placement: Placement, axis: str, size_bytes: int) -> tuple[float, AllToAllProgram]:
        """The library's one-call all-to-all over the ``axis`` groups (the first
        synthesized program), and its seconds: what a configuration that fits on
        no placement is priced with, like its reductions (:meth:`default`)."""
        program, steps = self.alltoall_programs(placement, axis)[0]
        return program_seconds(steps, size_bytes), program

    def on(self, placement: Placement, default_only: bool = False) -> "PlacementCollectives":
        """The collectives of ``placement``, one object per placement (it
        memoises the step model's many calls at the same sizes); with
        ``default_only`` its reductions are the library's default collectives
        (:meth:`default`), not the best synthesized programs."""
        key = (id(placement), default_only)
        found = self._on.get(key)
        if found is None or found.placement is not placement:
            found = self._on[key] = PlacementCollectives(self, placement, default_only=default_only)
        return found

    def proved(self, placement: Placement, axis: str, goal: Goal, program: Program) -> LoweredProgram:
        """``program`` lowered on ``placement``'s reduction over ``axis``, proved
        (numpy reference + z3; SynthError if it fails), each once."""
        placement = self.placement_for(placement, axis)
        key = (placement.matrix, placement.axis_names, axis, goal, program)
        if key not in self._proved:
            lowered = lower(program, Reduction(placement, reduce_axes(placement, axis), goal))
            verify_lowered(lowered)
            self._proved[key] = lowered
        return self._proved[key]

    def is_proved(self, placement: Placement, axis: str, goal: Goal, program: Program) -> bool:
        placement = self.placement_for(placement, axis)
        return (placement.matrix, placement.axis_names, axis, goal, program) in self._proved


def reduce_axes(placement: Placement, axis: str) -> tuple[str, ...]:
    """The axes of a step's reduction text (``dp``, ``dp+ep``) in the
    placement's order."""
    named = axis.split("+")
    return tuple(a for a in placement.axis_names if a in named)


def _fastest(programs: ReductionPrograms, predictor: Predictor, size_bytes: int) -> BestProgram:
    """The first of the fastest programs (as :func:`synth.cost.rank` orders them:
    ties to the shorter program, then instruction order), found by a shortest
    path over the search's graph without listing the programs."""
    found = programs.best(lambda instruction, loads: predictor.step(instruction, loads, size_bytes)[0], 1)
    if not found:
        return BestProgram(math.inf, None)
    seconds, program, loads = found[0]
    return BestProgram(seconds, program, predictor.sm_share(program, loads, size_bytes))


@dataclass(frozen=True)
class PlacementCollectives:
    """:class:`~synth.planner.collectives.Collectives` of one placement, each
    reduction's program and each send's seconds looked up once per (axis,
    goal, size) or (axis, size)."""

    costs: CollectiveCosts
    placement: Placement
    default_only: bool = False  # reductions priced as the library's default collective (CollectiveCosts.default)
    _programs: dict[tuple[str, Goal, int], BestProgram] = field(default_factory=dict, compare=False, repr=False)
    _sends_s: dict[tuple[str, int], float] = field(default_factory=dict, compare=False, repr=False)
    step_memo: dict = field(default_factory=dict, compare=False, repr=False)  # step_time's memo for this placement

    def program(self, axis: str, goal: Goal, size_bytes: int) -> BestProgram:
        """The program a reduction over ``axis`` toward ``goal`` of
        ``size_bytes`` runs: :meth:`CollectiveCosts.default` with
        ``default_only``, else :meth:`CollectiveCosts.best`."""
        key = (axis, goal, size_bytes)
        found = self._programs.get(key)
        if found is None:
            price = self.costs.default if self.default_only else self.costs.best
            found = self._programs[key] = price(self.placement, axis, goal, size_bytes)
        return found

    def reduce(self, axis: str, goal: Goal, size_bytes: int) -> float:
        """Seconds of :meth:`program`."""
        return self.program(axis, goal, size_bytes).seconds

    def sm_share(self, axis: str, goal: Goal, size_bytes: int) -> float:
        """The share of each device's SMs :meth:`program` holds while it runs (:attr:`BestProgram.sm_share`)."""
        return self.program(axis, goal, size_bytes).sm_share

    def send(self, axis: str, size_bytes: int) -> float:
        """:meth:`CollectiveCosts.send` on this placement."""
        key = (axis, size_bytes)
        found = self._sends_s.get(key)
        if found is None:
            found = self._sends_s[key] = self.costs.send(self.placement, axis, size_bytes)
        return found

    def alltoall(self, axis: str, size_bytes: int) -> float:
        price = self.costs.default_alltoall if self.default_only else self.costs.best_alltoall
        return price(self.placement, axis, size_bytes)[0]

    def size(self, axis: str) -> int:
        """The size of ``axis`` (HSDP's sub-axes of dp included)."""
        placement = self.costs.placement_for(self.placement, axis)
        return placement.axes[placement.axis_names.index(axis)].size

    def nodes(self, axis: str) -> int:
        """The product of ``axis``'s row of the matrix over the levels above
        the innermost (HSDP's sub-axes of dp included); 1 where ``axis`` is
        not placed."""
        placement = self.costs.placement_for(self.placement, axis)
        if axis not in placement.axis_names:
            return 1
        return math.prod(placement.matrix[placement.axis_names.index(axis)][:-1])
