"""The collective library's algorithms, as patterns of rounds.

A collective over ``m`` members (in device-id order) is a sequence of rounds;
in a round every member sends its flows (:class:`Round`). ``S`` = bytes the
group's step moves:

* ``ring`` (NCCL ring): AllReduce ``2(m-1)`` rounds of ``S/m`` to the next member
  on the ring; ReduceScatter and AllGather ``m-1`` such rounds; Reduce and
  Broadcast a pipelined chain: one round of ``S`` along the chain plus ``m-2``
  extra latencies.
* ``tree`` (NCCL tree, AllReduce only; other collectives use ``ring`` as NCCL
  does): members are bucketed by their element at the outermost level where
  they differ (their nodes); a chain inside each bucket carries ``S`` to its
  first member, and a double binary tree over those first members (the second
  tree over them rotated by one) carries ``S/2`` per tree; the reduce up and the
  broadcast down are pipelined on opposite link directions: one round plus
  ``2 depth - 1`` extra latencies.
* ``mpi`` (OpenMPI 5.0's ``coll/tuned`` decisions, :func:`mpi_algorithm`, see
  docs/simulator.md): per collective, group size and bytes one of recursive
  doubling (``ceil(log2 m)`` rounds of ``S``; AllGather: doubling pieces),
  Rabenseifner (recursive halving at distance 1, 2, 4, ... moving ``S/2, S/4,
  ...``, then the mirror image), ring, a pipelined chain, a binomial tree
  (``ceil(log2 m)`` rounds of ``S``) or linear (everyone to or from member 0 at
  once; the linear ReduceScatter reduces to member 0, then scatters ``S/m``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..language import Collective
from .links import Links


@dataclass(frozen=True)
class Round:
    """One round of a collective over ``m`` members in device-id order: member
    ``src[i]`` sends ``fraction[i] x S`` bytes to member ``dst[i]``; the round runs
    ``repeat`` times and a pipeline adds ``extra`` latencies of its slowest flow."""

    src: tuple[int, ...]
    dst: tuple[int, ...]
    fraction: tuple[float, ...]
    repeat: int = 1
    extra: int = 0


def uniform(src: tuple[int, ...], dst: tuple[int, ...], fraction: float, repeat: int = 1, extra: int = 0) -> Round:
    return Round(src, dst, (fraction,) * len(src), repeat, extra)


@lru_cache(maxsize=1024)
def tree_rounds(buckets: tuple[int, ...]) -> tuple[Round, ...]:
    """NCCL's tree AllReduce over members grouped in consecutive buckets (nodes)
    of the given sizes: a chain inside each bucket towards its first member, and a
    double binary tree over the buckets' first members (the second tree over them
    rotated by one), ``S/2`` per tree. Pipelined: the broadcast down runs while the
    reduce goes up, on the other direction of each link, so both are one round
    plus ``2 x depth - 1`` latencies."""
    starts = [sum(buckets[:i]) for i in range(len(buckets))]
    chain = [(s + j + 1, s + j) for s, size in zip(starts, buckets) for j in range(size - 1)]
    n = len(starts)
    tree = [
        (starts[(i + shift) % n], starts[((i - 1) // 2 + shift) % n]) for shift in (0, 1) for i in range(1, n)
    ] if n > 1 else []
    up = chain + tree
    both = up + [(b, a) for a, b in up]  # the broadcast down overlaps the reduce up
    fractions = ((1.0,) * len(chain) + (0.5,) * len(tree)) * 2
    depth = max(buckets) - 1 + (max(1, math.ceil(math.log2(n + 1)) - 1) if n > 1 else 0)
    return (Round(tuple(a for a, _ in both), tuple(b for _, b in both), fractions, 1, max(0, 2 * depth - 1)),)


def mpi_algorithm(collective: Collective, m: int, nbytes: float) -> str:
    """The algorithm OpenMPI 5.0's ``coll/tuned`` fixed decision picks for a sum
    over ``m`` ranks of ``nbytes`` (the whole buffer), reduced to the families the
    model has: ``recursive_doubling``, ``rabenseifner``, ``ring``, ``linear``,
    ``chain``, ``binomial``. Thresholds are tuned's (ompi/mca/coll/tuned/
    coll_tuned_decision_fixed.c, v5.0) with its many small-size alternations
    merged; algorithms that need a power of two fall back to ``ring`` on other
    sizes (tuned folds the extra ranks instead)."""
    power_of_two = m & (m - 1) == 0
    if collective is Collective.ALLREDUCE:
        small = 16384 if m < 4 else 8192 if m < 16 else 4096
        if nbytes < small:
            return "recursive_doubling"
        if m < 4 and nbytes < 262144:
            return "ring"  # ring and segmented ring
        return "rabenseifner" if power_of_two else "ring"
    if collective is Collective.ALLGATHER:  # two_proc for m = 2 is one exchange: doubling
        return "recursive_doubling" if m < 32 and power_of_two else "ring"
    if collective is Collective.REDUCESCATTER:  # Reduce_scatter_block: by the block size
        block = nbytes / m
        linear = ((m < 4 and block >= 131072) or (4 <= m < 8 and block >= 1048576)
                  or (8 <= m < 16 and 524288 <= block < 4194304) or (16 <= m < 32 and 524288 <= block < 2097152))
        return "linear" if linear else "ring"  # recursive halving and butterfly as ring
    if collective is Collective.REDUCE:
        if m < 4:
            return "linear" if nbytes < 262144 else "chain"  # pipeline and chain
        if m < 8:
            if nbytes < 65536:
                return "chain"
            return "linear" if nbytes >= 1048576 or 262144 <= nbytes < 524288 else "binomial"
        return "binomial"
    # Broadcast
    if m < 8:
        return "chain" if 4 <= m and nbytes >= 1048576 else "linear" if nbytes >= 8192 else "binomial"
    return "linear" if m < 16 and nbytes >= 32768 else "binomial"


@lru_cache(maxsize=1024)
def rounds_of(name: str, collective: Collective, m: int) -> tuple[Round, ...]:
    """The rounds of ``collective`` over ``m`` members by algorithm ``name``
    (see the module docstring). The tree AllReduce depends on the node
    structure: see :func:`tree_rounds`."""
    ring = tuple(range(m))
    nxt = tuple((i + 1) % m for i in range(m))
    steps = range(math.ceil(math.log2(m)))
    if name == "tree":
        name = "ring"  # NCCL runs all but AllReduce as rings
    if name == "linear":  # everyone <-> member 0 at once
        others = ring[1:]
        if collective is Collective.REDUCE:
            return (uniform(others, (0,) * (m - 1), 1.0),)
        if collective is Collective.REDUCESCATTER:  # reduce to member 0, then scatter the pieces
            return (uniform(others, (0,) * (m - 1), 1.0), uniform((0,) * (m - 1), others, 1.0 / m))
        return (uniform((0,) * (m - 1), others, 1.0),)  # Broadcast
    if name in ("ring", "chain"):
        if collective in (Collective.REDUCE, Collective.BROADCAST):  # pipelined chain
            a, b = ring[:-1], ring[1:]
            src, dst = (b, a) if collective is Collective.REDUCE else (a, b)
            return (uniform(src, dst, 1.0, 1, m - 2),)
        repeat = 2 * (m - 1) if collective is Collective.ALLREDUCE else m - 1
        return (uniform(ring, nxt, 1.0 / m, repeat),)
    if name == "rabenseifner":  # recursive halving, distance doubling; then the mirror image
        halving = [uniform(ring, tuple(r ^ (1 << i) for r in ring), 1.0 / (2 << i)) for i in steps]
        return tuple(halving + halving[::-1])
    rounds = []  # recursive doubling and binomial trees, ceil(log2 m) rounds
    for i in steps:
        d = 1 << i
        if collective in (Collective.ALLREDUCE, Collective.ALLGATHER):
            pairs = [(r, r ^ d) for r in range(m) if (r ^ d) < m]
            fraction = 1.0 if collective is Collective.ALLREDUCE else d / m
        else:
            pairs = [(r, r + d) for r in range(0, m, 2 * d) if r + d < m]
            fraction = 1.0
            if collective is Collective.REDUCE:  # children send partial sums to rank 0
                pairs = [(b, a) for a, b in pairs]
        rounds.append(uniform(tuple(a for a, _ in pairs), tuple(b for _, b in pairs), fraction))
    if collective is Collective.REDUCE:
        rounds.reverse()
    return tuple(rounds)


def node_buckets(links: Links, members: np.ndarray) -> tuple[int, ...]:
    """Sizes of the runs of consecutive (sorted) members that share their element
    at the outermost level where the members differ; one bucket if they differ
    only at the leaf level (a group inside one node is a single chain)."""
    for l in range(len(links.counts) - 1):
        ancestors = links.ancestors[l][members]
        if (ancestors != ancestors[0]).any():
            cuts = np.flatnonzero(np.diff(ancestors)) + 1
            return tuple(np.diff(np.concatenate([[0], cuts, [len(members)]])).tolist())
    return (len(members),)
