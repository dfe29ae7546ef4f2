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
so the runtime's moves are the proof's moves.
"""

from __future__ import annotations

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


def run_alltoall(world: Any, groups: Reduction, program: AllToAllProgram, buffer: Any) -> Any:
    """The all-to-all of ``buffer`` (this rank's ``k`` blocks, module docstring)
    over its group of ``groups``, run as ``program``; returns a new array (a
    numpy array on thread and MPI worlds, a torch tensor on the torch world).
    Every rank of the world must call it with the same program and a buffer of
    the same length, a multiple of ``k``: the ranks first agree on the program,
    the buffer's shape and dtype (one all-gather), so that a rank that differs
    gives every rank the same SynthError instead of a hang."""
    hierarchy = groups.hierarchy
    k = hierarchy.k
    # agree before any collective: every rank raises the same error, none waits in an all-to-all
    mine = (format_alltoall(program, " ; "), tuple(int(n) for n in buffer.shape), str(buffer.dtype))
    everyone = world.allgather(mine)
    differing = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
    if differing:
        r = differing[0]
        raise SynthError(f"all-to-all: rank {r} passed {everyone[r][0]!r} on a buffer of shape {everyone[r][1]} "
                         f"({everyone[r][2]}), rank 0 {everyone[0][0]!r} on {everyone[0][1]} ({everyone[0][2]}); "
                         "every rank must pass the same program and buffer shape and dtype")
    if len(buffer.shape) != 1 or buffer.shape[0] % k:
        raise SynthError(f"all-to-all buffer of shape {tuple(buffer.shape)}: give a flat buffer whose length is a "
                         f"multiple of the group size {k}")
    table = groups.synthesis_groups  # (groups, k) device ids by synthesis index
    rows, columns = np.nonzero(table == world.rank)
    if len(rows) != 1:
        raise SynthError(f"rank {world.rank} is not a device of the placement ({table.size} devices)")
    me = int(columns[0])
    sigma = np.asarray(groups.rank_to_synthesis_index)  # all-to-all rank -> synthesis index
    block = buffer.shape[0] // k
    # blocks held, in label order: entry j of the input is addressed to synthesis index sigma[j]
    data = _take(buffer.reshape(k, block), np.argsort(sigma))  # row e: the block for synthesis index e
    sources, destinations = initial_blocks(k)
    for step in program.steps:
        synthesis_groups = resolve_exchange(step, hierarchy).groups
        outcome = exchange_step(hierarchy, sources, destinations, synthesis_groups)
        if isinstance(outcome, str):
            raise SynthError(f"{step}: not valid: {outcome}")
        device_groups = [tuple(int(d) for d in table[r, list(g)]) for r in range(len(table)) for g in synthesis_groups]
        comm = world.split(device_groups)
        mine = next((g for g in synthesis_groups if me in g), None)
        if mine is not None:
            assert comm is not None
            members = np.asarray(mine)
            # what every member sends, in the reference's order: by receiver, destination, source
            new_sources, new_destinations = outcome
            targets = receivers(hierarchy, members, destinations[members])  # (m, k) receiving positions
            mine_at = int(np.flatnonzero(members == me)[0])
            order = np.lexsort((sources[me], destinations[me], targets[mine_at]))
            send = _take(data, order)
            recv = _empty_like(send)
            comm.alltoall(send.reshape(-1), recv.reshape(-1))
            # received: from each member in turn, its blocks for me in (destination, source) order
            to_me = targets == mine_at
            got_src, got_dst = [], []
            for position, d in enumerate(members):
                src, dst = sources[d][to_me[position]], destinations[d][to_me[position]]
                o = np.lexsort((src, dst))
                got_src.append(src[o])
                got_dst.append(dst[o])
            got_src, got_dst = np.concatenate(got_src), np.concatenate(got_dst)
            final = np.lexsort((got_src, got_dst))
            assert (got_src[final] == new_sources[me]).all() and (got_dst[final] == new_destinations[me]).all()
            data = _take(recv, final)
        sources, destinations = outcome
    # row i now holds the block from synthesis index i: back to all-to-all rank order
    return _take(data, sigma).reshape(-1)


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

