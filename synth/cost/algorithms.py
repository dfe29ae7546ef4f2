"""The collective library's algorithms, as patterns of rounds.

A collective over ``m`` members (in device-id order) is a sequence of rounds;
in a round every member sends its flows (:class:`Round`). ``S`` = bytes the
group's step moves:

* ``ring`` (NCCL's ring): AllReduce ``2(m-1)`` rounds of ``S/m`` to the next member
  on the ring; ReduceScatter and AllGather ``m-1`` such rounds; Reduce and
  Broadcast a pipelined chain: one round of ``S`` along the chain.
* NCCL's ``tree`` (AllReduce: a chain inside each node, double binary trees over
  the nodes), ``nvls``, ``nvlstree`` and ``pat``: :func:`nccl_rounds`; the NCCL
  models count latency per step (:func:`nccl_hops`), not per round.
* ``mpi`` (OpenMPI 5.0's ``coll/tuned`` decisions, :func:`mpi_algorithm`, see
  docs/simulator.md): per collective, group size and bytes one of recursive
  doubling (``ceil(log2 m)`` rounds of ``S``; AllGather: doubling pieces),
  Rabenseifner (recursive halving at distance 1, 2, 4, ... moving ``S/2, S/4,
  ...``, then the mirror image), ring, a pipelined chain, a binomial tree
  (``ceil(log2 m)`` rounds of ``S``) or linear (everyone to or from member 0 at
  once; the linear ReduceScatter reduces to member 0, then scatters ``S/m``).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from ..caches import memoised
from ..synthesis.language import Collective
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

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``src``, ``dst`` and ``fraction`` as arrays (indexing groups with them)."""
        return np.asarray(self.src, dtype=int), np.asarray(self.dst, dtype=int), np.asarray(self.fraction)


def uniform(src: tuple[int, ...], dst: tuple[int, ...], fraction: float, repeat: int = 1, extra: int = 0) -> Round:
    return Round(src, dst, (fraction,) * len(src), repeat, extra)


@memoised(maxsize=1024)
def tree_rounds(buckets: tuple[int, ...]) -> tuple[Round, ...]:
    """NCCL's tree AllReduce over members grouped in consecutive buckets (nodes)
    of the given sizes: a chain inside each bucket towards its first member, and a
    double binary tree over the buckets' first members (the second tree over them
    rotated by one), ``S/2`` per tree. Pipelined: the broadcast down runs while the
    reduce goes up, on the other direction of each link, so both are one round
    (its latency is counted by :func:`nccl_hops`)."""
    sizes = np.asarray(buckets, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))  # each bucket's first member
    # the chain: every member but its bucket's first sends to the member before it
    chain_dst = np.delete(np.arange(int(sizes.sum())), np.cumsum(sizes) - 1)
    tree_src, tree_dst = _double_binary_tree(starts) if len(starts) > 1 else (starts[:0], starts[:0])
    up_src, up_dst = np.concatenate((chain_dst + 1, tree_src)), np.concatenate((chain_dst, tree_dst))
    fractions = np.concatenate((np.full(len(chain_dst), 1.0), np.full(len(tree_src), 0.5)))
    # the broadcast down overlaps the reduce up
    return (_round_of(np.concatenate((up_src, up_dst)), np.concatenate((up_dst, up_src)),
                      np.concatenate((fractions, fractions))),)


def double_binary_tree(members: list[int]) -> list[tuple[int, int]]:
    """(child, parent) edges of two binary trees over ``members``: the heap-ordered
    tree and the same tree over the members rotated by one."""
    child, parent = _double_binary_tree(np.asarray(members, dtype=np.int64))
    return list(zip(child.tolist(), parent.tolist()))


def _double_binary_tree(members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`double_binary_tree` as two arrays (children, parents), in its order."""
    n = len(members)
    i = np.arange(1, n)
    child = np.concatenate([members[(i + shift) % n] for shift in (0, 1)])
    parent = np.concatenate([members[((i - 1) // 2 + shift) % n] for shift in (0, 1)])
    return child, parent


def _round_of(src: np.ndarray, dst: np.ndarray, fraction: np.ndarray, repeat: int = 1, extra: int = 0) -> Round:
    """A :class:`Round` built from integer arrays (many members: one pass in
    numpy instead of a Python loop per flow), its :attr:`Round.arrays` set."""
    src, dst = src.astype(int), dst.astype(int)
    fraction = np.asarray(fraction, dtype=float)
    out = Round(tuple(src.tolist()), tuple(dst.tolist()), tuple(fraction.tolist()), repeat, extra)
    out.__dict__["arrays"] = (src, dst, fraction)  # what the cached property computes from the tuples
    return out


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


@memoised(maxsize=1024)
def rounds_of(name: str, collective: Collective, m: int) -> tuple[Round, ...]:
    """The rounds of ``collective`` over ``m`` members by algorithm ``name``
    (see the module docstring; NCCL's tree and NVLS: :func:`nccl_rounds`)."""
    ring = tuple(range(m))
    nxt = ring[1:] + ring[:1]
    steps = range(math.ceil(math.log2(m)))
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
    members = np.arange(m)
    for i in steps:
        d = 1 << i
        if collective in (Collective.ALLREDUCE, Collective.ALLGATHER):
            a = members[(members ^ d) < m]
            b = a ^ d
            fraction = 1.0 if collective is Collective.ALLREDUCE else d / m
        else:
            a = np.arange(0, m - d, 2 * d)
            b = a + d
            fraction = 1.0
            if collective is Collective.REDUCE:  # children send partial sums to rank 0
                a, b = b, a
        rounds.append(_round_of(a, b, np.full(len(a), fraction)))
    if collective is Collective.REDUCE:
        rounds.reverse()
    return tuple(rounds)


# ---------------------------------------------------------------- NCCL's algorithms (synth.cost.nccl)


@memoised(maxsize=1024)
def nccl_rounds(algorithm: str, collective: Collective, m: int, buckets: tuple[int, ...]) -> tuple[Round, ...]:
    """The transfers of NCCL's ``algorithm`` (:mod:`synth.cost.nccl`) for
    ``collective`` over ``m`` members grouped in consecutive ``buckets`` (their
    NCCL nodes). All are pipelined, so each is one round (or a ring's rounds)
    whose time is its slowest flow's bytes over its rate; the latency is counted
    per step by :func:`nccl_hops`.

    * ``ring``: :func:`rounds_of` ``ring``; ``tree``: :func:`tree_rounds`
      (AllReduce; other collectives as ``ring``);
    * ``nvls`` (one node; the NVSwitch reduces and multicasts): every GPU sends
      and receives ``S (m+1)/m`` for an AllReduce (its data up, the reduced shard
      down; the shard up, everyone's shards down), ``S`` for ReduceScatter and
      AllGather; as a flow to the next member;
    * ``nvlstree``: NVLS inside each node plus, for every local index, a double
      binary tree over the nodes' GPUs of that index carrying ``S/(2b)`` per tree
      (``b`` GPUs per node, each with its own NIC), reduce up and broadcast down;
    * ``pat`` (one GPU per node): recursive doubling for AllGather (pieces
      ``S d/m`` at distance ``d``), its mirror image for ReduceScatter."""
    if algorithm == "tree" and collective is Collective.ALLREDUCE:
        return tree_rounds(buckets)
    if algorithm == "nvls":
        ring = tuple(range(m))
        fraction = (m + 1) / m if collective is Collective.ALLREDUCE else 1.0
        return (uniform(ring, ring[1:] + ring[:1], fraction),)
    if algorithm == "nvlstree":
        b = min(buckets)
        starts = np.concatenate(([0], np.cumsum(np.asarray(buckets, dtype=np.int64))[:-1]))  # first members
        j = np.arange(b)
        if b > 1:  # per bucket, its first b members in a ring
            intra_src, intra_dst = (starts[:, None] + j).ravel(), (starts[:, None] + (j + 1) % b).ravel()
        else:
            intra_src = intra_dst = starts[:0]
        trees = [_double_binary_tree(starts + x) for x in range(b)]  # per local index, over the buckets
        up_src = np.concatenate([c for c, _ in trees])
        up_dst = np.concatenate([p for _, p in trees])
        src = np.concatenate((intra_src, up_src, up_dst))
        dst = np.concatenate((intra_dst, up_dst, up_src))
        fractions = np.concatenate((np.full(len(intra_src), (b + 1) / b), np.full(2 * len(up_src), 1 / (2 * b))))
        return (_round_of(src, dst, fractions),)
    if algorithm == "pat":
        doubling = rounds_of("recursive_doubling", Collective.ALLGATHER, m)
        return doubling if collective is Collective.ALLGATHER else tuple(reversed(doubling))
    return rounds_of("ring", collective, m)


def hop_level(links: Links, a: int, b: int) -> int:
    """The outermost level where devices ``a`` and ``b`` differ (the level whose
    link a step between them crosses last and slowest); the innermost level when
    ``a == b``. Pure Python: most groups NCCL's tuning looks at are small."""
    for level, stride in enumerate(links.strides):
        if a // stride != b // stride:
            return level
    return len(links.strides) - 1


#: from this many members on, a group's hop levels, buckets and lanes are counted with numpy (one pass
#: over arrays instead of a Python loop per member; below it the Python loop is the cheaper)
NUMPY_MEMBERS_FROM = 256


def _hop_levels(links: Links, a: Sequence[int], b: Sequence[int]) -> list[int]:
    """:func:`hop_level` of each pair ``(a[i], b[i])``."""
    if len(a) < NUMPY_MEMBERS_FROM:
        return [hop_level(links, x, y) for x, y in zip(a, b)]
    return _hop_level_array(links, np.asarray(a), np.asarray(b)).tolist()


def _hop_level_array(links: Links, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`hop_level` of each pair ``(a[i], b[i])`` of device-id arrays
    (``a`` of length 1 pairs its device with every one of ``b``)."""
    differ = links.stacked[:, a] != links.stacked[:, b]
    return np.where(differ.any(axis=0), differ.argmax(axis=0), len(links.strides) - 1)


def nccl_hops(links: Links, members: Sequence[int], algorithm: str, collective: Collective,
              buckets: tuple[int, ...]) -> np.ndarray:
    """Per level, the steps of NCCL's ``algorithm`` whose latency a call pays,
    counted the way NCCL's tuning counts them: a ring AllReduce ``2(m-1)`` steps
    along the ring (ReduceScatter, AllGather ``m-1``), the two it does not take
    being network steps (NCCL: ``2(nodes-1)`` of them cross nodes; charging
    every step of a ring that crosses nodes at the network's step cost instead
    predicts the corpus worse, docs/simulator.md); a chain
    (Reduce, Broadcast) its ``m-1`` hops; a tree twice its node chain plus twice
    ``log2(nodes)`` network steps; NVLS none beyond its base latency; NVLS Tree
    twice ``log2(nodes)`` network steps; PAT ``ceil(log2 m)`` steps.
    ``members``: device ids in device-id order; the result is a new float array
    (levels,) of whole numbers."""
    levels = len(links.counts)
    m = len(members)
    counts = [0] * levels
    if m < 2:
        return np.zeros(levels)

    def add_chain(chain: Sequence[int], times: int, closed: bool = False) -> None:
        """Add ``times`` per hop between consecutive members (and last to first if ``closed``)."""
        if len(chain) >= NUMPY_MEMBERS_FROM:
            ids = np.asarray(chain)
            per_level = np.bincount(_hop_level_array(links, ids[:-1], ids[1:]), minlength=levels).tolist()
            for level, hops in enumerate(per_level):
                counts[level] += hops * times
        else:
            for level, hops in Counter(_hop_levels(links, chain[:-1], chain[1:])).items():
                counts[level] += hops * times
        if closed:
            counts[hop_level(links, chain[-1], chain[0])] += times

    if m >= NUMPY_MEMBERS_FROM:
        ids = np.asarray(members)
        outermost = int(_hop_level_array(links, ids[:1], ids[1:]).min())
    else:
        outermost = min(_hop_levels(links, [members[0]] * (m - 1), members[1:]))
    if algorithm == "ring" or (algorithm == "tree" and collective is not Collective.ALLREDUCE):
        if collective in (Collective.REDUCE, Collective.BROADCAST):
            add_chain(members, 1)
            return np.array(counts, dtype=float)
        add_chain(members, 1, closed=True)
        skip = 1
        if collective is Collective.ALLREDUCE:
            counts, skip = [2 * c for c in counts], 2
        counts[outermost] -= skip
        return np.array(counts, dtype=float)
    nodes = len(buckets)
    if algorithm == "tree":
        largest = buckets.index(max(buckets))  # the first of the largest, like np.argmax
        start = sum(buckets[:largest])
        add_chain(members[start:start + buckets[largest]], 2)
    if algorithm in ("tree", "nvlstree") and nodes > 1:
        counts[outermost] += 2 * (nodes.bit_length() - 1)
    if algorithm == "pat":
        counts[outermost] += math.ceil(math.log2(m))
    return np.array(counts, dtype=float)


def buckets_at(links: Links, members: Sequence[int], level: int | None) -> tuple[int, ...]:
    """Sizes of the runs of consecutive (sorted) members in the same element of
    ``level`` (one bucket when ``level`` is None)."""
    if level is None:
        return (len(members),)
    stride = links.strides[level]
    if len(members) >= NUMPY_MEMBERS_FROM:
        cuts = np.flatnonzero(np.diff(np.asarray(members) // stride)) + 1
        return tuple(np.diff(np.concatenate(([0], cuts, [len(members)]))).tolist())
    return tuple(len(list(run)) for _, run in itertools.groupby(d // stride for d in members))


def rail_lanes(links: Links, members: Sequence[int], rails: bool = True) -> np.ndarray:
    """Per level, the ports of an element that one flow of this group spreads
    over (NCCL's channels through the NICs near the group's GPUs), a new float
    array (levels,), at most ``ports``:

    * the NICs near the members: ``k`` members in the element (consecutive
      device ids, as NCCL's GPUs and their PCIe switches are numbered) touch
      ``ceil(k / gpus_per_nic)`` PCIe switch groups, each with its own NICs
      (:attr:`~synth.topology.NetworkPath.nics_per_group`); at least 1;
      ``rails`` False (NVLS Tree, PAT: one NIC per GPU and tree) counts 1;
    * the injection limit on a ``net`` level: the ``k`` GPUs' own PCIe links
      carry at most ``k x pcie_GBps`` together, i.e. ``k x pcie_GBps /
      bandwidth_GBps`` NICs' worth (fractional: below 1 a lone GPU's PCIe link is
      slower than its NIC)."""
    lanes = np.ones(len(links.counts))
    ids = np.asarray(members) if len(members) >= NUMPY_MEMBERS_FROM else None  # converted once for every level
    for l, ports in enumerate(links.ports):
        cap = links.pcie_nics[l]
        if ports == 1 and math.isinf(cap):
            continue
        if ids is not None:
            k = int(np.unique(ids // links.strides[l], return_counts=True)[1].max())
        else:
            k = max(Counter(d // links.strides[l] for d in members).values())
        near = 1.0
        if rails and ports > 1:
            near = min(float(ports), max(1.0, math.ceil(k / links.group_gpus[l]) * links.group_nics[l]))
        lanes[l] = min(near, k * cap)
    return lanes
