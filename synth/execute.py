"""In-place execution of lowered programs on numpy buffers: the reference backend.

This models what a collective library does with a contiguous buffer per device,
independently of the search's contributor-set semantics: every device always
has all ``k`` chunks, a collective reads and overwrites only the chunks it
covers, and whatever else is in a buffer (stale partial sums, garbage) stays.
If a program double counts or reads stale data, the sums come out wrong.

Buffers have shape ``(devices, chunks, chunk_len)``. Per step and group, with
``chunks`` its ordered chunk list and ``m`` members (root first):

* AllReduce: every member's ``chunks`` := the sum over members.
* ReduceScatter: ``chunks`` is cut into ``m`` equal parts; member ``i``'s part
  ``i`` := the sum over members of part ``i``.
* AllGather: member ``i``'s part ``i`` is copied to every member.
* Reduce: the root's ``chunks`` := the sum; Broadcast: the root's ``chunks`` are
  copied to every member.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import SynthError
from .language import Collective
from .lowering import LoweredProgram, LoweredStep, verification_scope
from .semantics import Goal


def execute(steps: Sequence[LoweredStep], buffers: np.ndarray) -> None:
    """Run ``steps`` in place on ``buffers`` (devices x chunks x chunk_len)."""
    for step in steps:
        for group, chunks in zip(step.groups, step.chunks):
            g = np.asarray(group)
            c = np.asarray(chunks)
            collective = step.collective
            if collective is Collective.ALLREDUCE:
                buffers[g[:, None], c] = buffers[g[:, None], c].sum(axis=0)
            elif collective is Collective.REDUCESCATTER:
                parts = c.reshape(len(g), -1)
                total = buffers[g[:, None], c].sum(axis=0).reshape(len(g), parts.shape[1], -1)
                buffers[g[:, None], parts] = total
            elif collective is Collective.ALLGATHER:
                parts = c.reshape(len(g), -1)
                own = buffers[g[:, None], parts]
                buffers[g[:, None, None], parts[None, :, :]] = own[None]
            elif collective is Collective.REDUCE:
                buffers[g[0], c] = buffers[g[:, None], c].sum(axis=0)
            else:  # Broadcast
                buffers[g[:, None], c] = buffers[g[0], c][None]


#: (device, chunk) slots the reference executes at once: the whole system if it
#: fits, else reduction group 0 alone (see ``verification_scope``)
LIMIT = 1 << 24


def check_numerically(lowered: LoweredProgram, length: int | None = None, seed: int = 0) -> int:
    """Run the program on random integer data and compare every output element
    with the direct reduction computed from the reduction groups alone.

    ``length`` is the per-device buffer length (AllReduce, ReduceScatter) or
    shard length (AllGather); the default ``2k+1`` is odd and, for ``k > 1``, not
    a multiple of ``k``, so padding is exercised. Returns the number of elements
    checked; raises SynthError on the first mismatch or if even one reduction
    group is too large to execute.
    """
    scoped = verification_scope(lowered, LIMIT)
    if scoped is None:
        raise SynthError(f"numpy reference: {lowered.num_chunks}^2 chunk slots exceed {LIMIT}")
    lowered = scoped[0]
    k, n = lowered.num_chunks, lowered.num_devices
    rng = np.random.default_rng(seed)
    groups = np.asarray(lowered.reduction_groups)  # (G, k), rank order
    where = np.asarray(lowered.chunk_of_rank)
    group_of = np.empty(n, dtype=np.int64)
    group_of[groups] = np.arange(len(groups))[:, None]
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[groups] = np.arange(k)[None, :]
    length = 2 * k + 1 if length is None else length
    if lowered.goal is Goal.ALLGATHER:
        shards = rng.integers(-1000, 1000, size=(n, length), dtype=np.int32)
        buffers = rng.integers(-10**6, 10**6, size=(n, k, length), dtype=np.int32)  # garbage
        buffers[np.arange(n), where[rank_of]] = shards
        execute(lowered.steps, buffers)
        got = buffers[:, where]                       # (n, k ranks, length)
        want = shards[groups[group_of]]               # owner of shard r in d's group
        valid = np.ones(k * length, dtype=bool).reshape(k, length)
    else:
        q = -(-length // k)
        data = rng.integers(-1000, 1000, size=(n, length), dtype=np.int32)  # sums fit: k < 2**21
        padded = np.zeros((n, k * q), dtype=np.int32)
        padded[:, :length] = data
        buffers = np.empty((n, k, q), dtype=np.int32)
        buffers[:, where] = padded.reshape(n, k, q)
        execute(lowered.steps, buffers)
        totals = padded[groups].sum(axis=1, dtype=np.int64).reshape(len(groups), k, q)
        if lowered.goal is Goal.REDUCESCATTER:  # each device: its own shard only
            got = buffers[np.arange(n), where[rank_of]][:, None]
            want = totals[group_of, rank_of][:, None]
            valid = (rank_of[:, None] * q + np.arange(q)[None, :] < length)[:, None, :]
        else:
            got = buffers[:, where]
            want = totals[group_of]
            valid = np.arange(k * q).reshape(k, q) < length
    wrong = (got != want) & valid
    if wrong.any():
        d, r, _ = np.argwhere(wrong)[0]
        shard = int(r if lowered.goal is not Goal.REDUCESCATTER else rank_of[d])
        raise SynthError(
            f"numpy reference: device {d} holds a wrong result for shard {shard} "
            f"(chunk {where[shard]}): expected {want[d, r][:3].tolist()}..., got {got[d, r][:3].tolist()}..."
        )
    return int(np.broadcast_to(valid, got.shape).sum())
