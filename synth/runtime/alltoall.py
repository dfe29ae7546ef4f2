"""Run a proved all-to-all program (:mod:`synth.synthesis.alltoall`) on a world.

Layout. World rank ``d`` is device ``d`` of the placement. Every device of an
all-to-all group of ``k`` holds ``k`` equal blocks; on entry block ``j`` of a
device is addressed to the group's member of all-to-all rank ``j`` (the
``groups.reduction_groups`` column order, what ``MPI_Alltoall`` over the group's
ranks in that order would take); on return block ``i`` is the one that member
``i`` addressed to this device: the one-call all-to-all's result, whatever the
program.

Each step is one equal-split all-to-all on the step's sub-group (the world's
``split``), with a local permutation before (blocks ordered by receiving member,
then destination, then source) and after (received blocks in (destination,
source) order). Which block sits where is known on every device without
communication: the labelled-block reference (:func:`~synth.synthesis.alltoall.exchange_step`)
is run on (source, destination) labels, the same rule that proved the program,
so the runtime's moves are the proof's moves. :class:`AllToAllRunner` does
this once per (world, groups, program) and keeps the communicators and
permutations for every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SynthError
from ..synthesis.alltoall import (
    AllToAllProgram,
    exchange_step,
    format_alltoall,
    initial_blocks,
    receivers,
    resolve_exchange,
)
from ..synthesis.reduction import Reduction


@dataclass(frozen=True)
class _Step:
    """One step as this rank runs it: its sub-group's communicator and the rows
    to take, from the blocks as they arrived in the previous step (from the
    input, for the first), to make this step's send buffer (None: they are in
    order already)."""

    comm: Any
    take: np.ndarray | None


def _permutation(index: np.ndarray) -> np.ndarray | None:
    """``index``, or None when it is the identity (no copy needed)."""
    return None if np.array_equal(index, np.arange(len(index))) else index


class AllToAllRunner:
    """A program prepared on a world for repeated all-to-alls: the ranks agree
    on the program once, every step's sub-communicator is made once, and the
    block permutations (pure functions of the labels, not of the data) are
    computed once. Calls with ``check`` (the default) first agree on the
    buffer's shape and dtype: a rank that differs gives every rank the same
    SynthError, never a hang."""

    def __init__(self, world: Any, groups: Reduction, program: AllToAllProgram) -> None:
        self.world, self.groups, self.program = world, groups, program
        hierarchy = groups.hierarchy
        self.k = hierarchy.k
        table = groups.synthesis_groups  # (groups, k) device ids by synthesis index
        _, columns = np.nonzero(table == world.rank)
        everyone = world.allgather((format_alltoall(program, " ; "), len(columns) == 1))
        strangers = [r for r, (_, device) in enumerate(everyone) if not device]
        if strangers:
            raise SynthError(f"all-to-all: rank {strangers[0]} is not a device of the placement ({table.size} "
                             f"devices); launch {table.size} ranks")
        differing = [r for r, theirs in enumerate(everyone) if theirs[0] != everyone[0][0]]
        if differing:
            r = differing[0]
            raise SynthError(f"all-to-all: rank {r} runs {everyone[r][0]!r}, rank 0 {everyone[0][0]!r}; every rank "
                             "must run the same program")
        me = int(columns[0])
        self.sigma = np.asarray(groups.rank_to_synthesis_index)  # all-to-all rank -> synthesis index
        steps = []
        sources, destinations = initial_blocks(self.k)
        # rows of what this rank holds now (the input, then each step's received buffer) in label order
        to_labels = np.argsort(self.sigma)  # input row j is addressed to synthesis index sigma[j]
        for step in program.steps:
            synthesis_groups = resolve_exchange(step, hierarchy).groups
            outcome = exchange_step(hierarchy, sources, destinations, synthesis_groups)
            if isinstance(outcome, str):
                raise SynthError(f"{step}: not valid: {outcome}")
            comm = world.split([tuple(int(d) for d in table[r, list(g)]) for r in range(len(table))
                                for g in synthesis_groups])
            # inside and parallel groups cover every device: this rank is in one group of every step
            members = np.asarray(next(g for g in synthesis_groups if me in g))
            new_sources, new_destinations = outcome
            targets = receivers(hierarchy, members, destinations[members])  # (m, k) receiving positions
            at = int(np.flatnonzero(members == me)[0])
            # sent by receiver, destination, source (each member's part in the reference's order)
            send_order = np.lexsort((sources[me], destinations[me], targets[at]))
            steps.append(_Step(comm, _permutation(to_labels[send_order])))
            # received: from each member in turn, its blocks for me in (destination, source) order
            got_src, got_dst = [], []
            for position, d in enumerate(members):
                src, dst = sources[d][targets[position] == at], destinations[d][targets[position] == at]
                o = np.lexsort((src, dst))
                got_src.append(src[o])
                got_dst.append(dst[o])
            got_src, got_dst = np.concatenate(got_src), np.concatenate(got_dst)
            to_labels = np.lexsort((got_src, got_dst))
            assert (got_src[to_labels] == new_sources[me]).all() and (got_dst[to_labels] == new_destinations[me]).all()
            sources, destinations = outcome
        self.steps = tuple(steps)
        # at the end label row i holds the block from synthesis index i: out row r is label row sigma[r]
        self.final = _permutation(to_labels[self.sigma])

    def __call__(self, buffer: Any, check: bool = True) -> Any:
        """The all-to-all of ``buffer`` (this rank's ``k`` blocks, module
        docstring); returns a new array (numpy on thread and MPI worlds, a torch
        tensor on the torch world)."""
        if check:
            mine = (tuple(int(n) for n in buffer.shape), str(buffer.dtype))
            everyone = self.world.allgather(mine)
            differing = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
            if differing:
                r = differing[0]
                raise SynthError(f"all-to-all: rank {r} passed a buffer of shape {everyone[r][0]} ({everyone[r][1]}), "
                                 f"rank 0 {everyone[0][0]} ({everyone[0][1]}); every rank must pass the same shape "
                                 "and dtype")
        if len(buffer.shape) != 1 or buffer.shape[0] % self.k:
            raise SynthError(f"all-to-all buffer of shape {tuple(buffer.shape)}: give a flat buffer whose length is a "
                             f"multiple of the group size {self.k}")
        data = buffer.reshape(self.k, -1)
        for step in self.steps:
            send = data if step.take is None else _take(data, step.take)
            data = _empty_like(send)
            step.comm.alltoall(send.reshape(-1), data.reshape(-1))
        if self.final is not None:
            data = _take(data, self.final)
        elif not self.steps:
            data = _take(data, np.arange(self.k))  # a new array, as promised
        return data.reshape(-1)


def run_alltoall(world: Any, groups: Reduction, program: AllToAllProgram, buffer: Any) -> Any:
    """One all-to-all of ``buffer`` over its group of ``groups`` run as
    ``program`` (:class:`AllToAllRunner`, prepared and called once). Every rank
    of the world calls it with the same program and a buffer of the same shape
    and dtype, a multiple of ``k`` long."""
    return AllToAllRunner(world, groups, program)(buffer)


def _take(data: Any, index: np.ndarray) -> Any:
    """Rows ``index`` of a numpy array or torch tensor (a new, contiguous one)."""
    if isinstance(data, np.ndarray):
        return data[index]
    import torch

    return data[torch.as_tensor(index, device=data.device)]


def _empty_like(data: Any) -> Any:
    if isinstance(data, np.ndarray):
        return np.empty_like(data)
    import torch

    return torch.empty_like(data)

