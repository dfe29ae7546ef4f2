"""The links and their contention: how long one round of concurrent flows takes.

A flow from device ``s`` to device ``t`` that are in different elements of level
``l`` uses the uplink of ``s``'s level-``l`` element (up) and the downlink of
``t``'s (down), for every such level: it climbs to the lowest common ancestor
and back. Each uplink carries ``bandwidth_GBps x ports`` per direction, one flow
at most ``bandwidth_GBps`` (one port); flows crossing it at the same time share
it equally. A ``ring`` fabric level connects siblings in a ring: a flow between
siblings at ring distance ``h`` loads the ``h`` ring links on its shortest way,
and the busiest of them decides its share. A flow may spread over several
ports of an element (``lanes``: NCCL's channels through the NICs of the group's
GPUs), counting once per lane against them. Latency: the sum of ``latency_us``
of the levels a flow crosses. A round takes as long as its slowest flow:
``latency + bytes / (bandwidth x share x efficiency)``.

A level with a link graph (``graph``, :mod:`synth.linkgraph`, of kind ``mesh``
or ``pcie``) joins the GPUs of a node point to point: a group's flows between
siblings run at the level's bandwidth x the group's :func:`graph_scale` (the
ring bus bandwidth NCCL's search finds through the group's GPUs over the one it
finds through the whole node), and concurrent groups, which use disjoint
NVLinks, do not share them (each GPU's uplink is shared as on a switch). The
PCIe switches and CPU links that pairs without NVLink cross are not shared
between groups (not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..caches import memoised
from ..topology import Topology
from .profile import NetworkProfile
from .terms import Features


@dataclass(frozen=True)
class Links:
    """Per level: the element id of each device's ancestor, and the level data."""

    ancestors: tuple[np.ndarray, ...]  # (levels,) arrays of (devices,)
    stacked: np.ndarray  # (levels, devices): the same, one array (row l = ancestors[l])
    elements: tuple[int, ...]  # per level, how many elements it has (1 + the largest ancestor id)
    ports: tuple[int, ...]
    ring: tuple[bool, ...]
    counts: tuple[int, ...]
    net: np.ndarray  # (levels,) bool: the level's link is a network (NIC)
    nvlink: np.ndarray  # (levels,) bool: the level's link is NVLink
    rdma: bool  # both: flows that leave through a NIC bypass the NVLink levels (GPUDirect RDMA)
    net_levels: list[int]  # the levels whose link is a network, and NVLink (index lists)
    nvlink_levels: list[int]
    strides: tuple[int, ...]  # per level, devices per element: device d's level-l element is d // strides[l]
    graph_level: int | None = None  # the level with a mesh or pcie link graph (the innermost), if any
    # per net level (others: 1, 1, inf): the GPUs of one PCIe switch group, the NICs of such a group, and what
    # one GPU's PCIe link carries in NICs (its GB/s over the level's stated GB/s per NIC): the injection limit
    group_gpus: tuple[int, ...] = ()  # links_of sets all three
    group_nics: tuple[float, ...] = ()
    pcie_nics: tuple[float, ...] = ()


@memoised(maxsize=64)
def links_of(topology: Topology) -> Links:
    counts = topology.counts
    devices = np.arange(topology.num_devices)
    strides = tuple(math.prod(counts[l + 1 :]) for l in range(len(counts)))
    ancestors = tuple(devices // stride for stride in strides)
    net = np.array([topology.link(i) == "net" for i in range(len(counts))])
    nvlink = np.array([topology.link(i) == "nvlink" for i in range(len(counts))])
    stacked = np.stack(ancestors)
    graph = topology.levels[-1].graph
    paths = [topology.network_path(i) for i in range(len(counts))]
    return Links(
        ancestors,
        stacked,
        tuple(math.prod(counts[: l + 1]) for l in range(len(counts))),
        tuple(lv.ports for lv in topology.levels),
        tuple(lv.fabric == "ring" for lv in topology.levels),
        counts,
        net,
        nvlink,
        bool(net.any() and nvlink.any()),
        np.flatnonzero(net).tolist(),
        np.flatnonzero(nvlink).tolist(),
        strides,
        len(counts) - 1 if graph is not None and graph.kind != "nvswitch" else None,
        tuple(1 if p is None else p.gpus_per_nic for p in paths),
        tuple(1.0 if p is None else p.nics_per_group for p in paths),
        tuple(math.inf if p is None else p.pcie_GBps / lv.bandwidth_GBps for p, lv in zip(paths, topology.levels)),
    )


@memoised(maxsize=65536)
def graph_scale(topology: Topology, locals_: tuple[tuple[int, ...], ...]) -> float:
    """The share of the link-graph level's bandwidth a group gets: the smallest,
    over its nodes' member sets ``locals_`` (GPU indices within a node, sorted;
    sets of one GPU are skipped), of NCCL's ring bus bandwidth through those
    GPUs (channels x speed, :func:`synth.cost.nccl.ring_graph` under the default
    rules) over that through all the node's GPUs, at most 1. 1 without a
    ``mesh`` or ``pcie`` graph or without a set of two GPUs or more."""
    from .nccl import comm_of, ring_graph

    graph = topology.levels[-1].graph
    sets = [s for s in locals_ if len(s) > 1]
    if graph is None or graph.kind == "nvswitch" or not sets:
        return 1.0

    def bus(local: tuple[int, ...]) -> float:
        ring = ring_graph(comm_of(topology, local))  # devices of node 0 = the node-local indices
        return ring.channels * ring.bw_intra

    full = bus(tuple(range(topology.counts[-1])))
    return min(1.0, min(bus(s) for s in sets) / full) if full > 0 else 1.0


def group_scales(topology: Topology, groups: np.ndarray) -> np.ndarray:
    """Per group (a row of ``groups``, device ids), its :func:`graph_scale`: a
    new float array (groups,)."""
    count = topology.counts[-1]
    out = np.empty(len(groups))
    for i, row in enumerate(groups.tolist()):
        by_node: dict[int, list[int]] = {}
        for d in row:
            by_node.setdefault(d // count, []).append(d % count)
        out[i] = graph_scale(topology, tuple(sorted({tuple(sorted(v)) for v in by_node.values()})))
    return out


def canonical_devices(links: Links, devices: np.ndarray) -> np.ndarray:
    """``devices`` (an integer array of device ids, any shape) mapped by a
    symmetry of the topology chosen from the array alone: a new int64 array of
    the same shape. The symmetry permutes the children of elements at every
    level whose fabric is a switch (every element of a level has the same
    children, ports and links) and keeps the positions on ``ring`` levels: an
    element's children get the ranks 0, 1, ... in the order they first appear
    in ``devices`` (row-major). So two arrays with equal images are images of
    each other, position by position, under a symmetry: they agree on which
    positions share an element of each level and on the ring positions, which is
    all that contention (:func:`round_geometry`), crossings, latency steps,
    lanes and NCCL's view of a group read, and everything computed from them
    is the same, to the bit, for both."""
    flat = np.asarray(devices, dtype=np.int64).ravel()
    positions = np.arange(len(flat))
    image = np.zeros(len(flat), dtype=np.int64)  # canonical element of the level above (the root: 0)
    for level, (stride, count) in enumerate(zip(links.strides, links.counts)):
        element = flat // stride
        if links.ring[level] or level == links.graph_level:  # positions matter
            rank = element % count
        else:  # siblings are the elements of one row (parent): rank them by first appearance
            first_seen = np.full(links.elements[level], len(flat))
            np.minimum.at(first_seen, element, positions)
            rank = first_seen.reshape(-1, count).argsort(axis=1).argsort(axis=1).ravel()[element]
        image = image * count + rank
    return image.reshape(np.shape(devices))


@dataclass(frozen=True)
class RoundGeometry:
    """Where the flows of a round go and how fast, whatever they carry: per flow
    its ``rate`` (B/s: the smallest bandwidth x share over the levels it
    crosses; inf if it crosses none), its ``bottleneck`` level, its ``share``
    there (1 if it crosses nothing), and which levels it crosses (``crossing``,
    (levels, flows)). An array whose flows are all alike may be a read-only
    broadcast of one column (:func:`_kept`): read them, do not write them."""

    rate: np.ndarray
    bottleneck: np.ndarray
    share: np.ndarray
    crossing: np.ndarray


def round_geometry(
    links: Links,
    bandwidth_Bps: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    lanes: np.ndarray | None = None,
    rdma: bool = False,
    scale: np.ndarray | None = None,
) -> RoundGeometry:
    """The :class:`RoundGeometry` of flows ``src[i] -> dst[i]`` that run at once
    (``lanes``, ``rdma``: as :func:`round_cost` says; ``scale``, per flow, its
    group's :func:`graph_scale` on the link-graph level, default 1)."""
    a_srcs = np.take(links.stacked, src, axis=1)  # (levels, flows); take: several times faster than [:, src]
    a_dsts = np.take(links.stacked, dst, axis=1)
    crossing = a_srcs != a_dsts
    if rdma and links.rdma:
        through_nic = crossing[links.net_levels].any(axis=0)
        for l in links.nvlink_levels:
            crossing[l] &= ~through_nic
    # per flow, the level of its smallest rate (bandwidth x share of a level it crosses; inf elsewhere), the
    # first one on ties (argmin's choice), kept level by level instead of (levels, flows) tables
    rate = np.full(len(src), np.inf)
    bottleneck = np.zeros(len(src), dtype=np.int8)  # a level index (few levels): a byte per flow, not eight
    share = np.ones(len(src))  # the share at the bottleneck, where it is crossed
    for l in np.flatnonzero(crossing.any(axis=1)).tolist():
        lane = 1.0 if lanes is None else lanes[l]
        if links.ring[l] and l != links.graph_level:
            level_share = _ring_share(links, l, a_srcs, a_dsts, crossing[l], lane)
        else:  # every crossing flow goes out through the uplink and in through the downlink
            level_share = _port_share(links, l, a_srcs[l], a_dsts[l], crossing[l], lane)
        bandwidth = bandwidth_Bps[l] * (scale if l == links.graph_level and scale is not None else 1.0)
        level_rate = np.where(crossing[l], bandwidth * level_share, np.inf)
        if l == 0:
            rate, share = level_rate, np.where(crossing[0], level_share, 1.0)
            continue
        lower = level_rate < rate
        rate = np.where(lower, level_rate, rate)
        bottleneck[lower] = l
        share = np.where(lower, level_share, share)  # crossed wherever its rate is finite, hence lower
    # a flow that crosses no level (src == dst) has share 1 and no bottleneck (level 0)
    return RoundGeometry(_kept(rate), _kept(bottleneck), _kept(share), _kept(crossing))


def _kept(values: np.ndarray) -> np.ndarray:
    """``values`` (per flow along its last axis) as the geometry keeps it: a
    read-only view of one column when every flow has the same column (most
    rounds: every flow of a ring is alike), so that memoised geometries of
    131,072 flows do not hold megabytes of copies of one number."""
    if values.shape[-1] > 1 and (values == values[..., :1]).all():
        return np.broadcast_to(values[..., :1].copy(), values.shape)
    return values


def round_cost(
    links: Links,
    profile: NetworkProfile,
    key: str,
    src: np.ndarray | None,
    dst: np.ndarray | None,
    nbytes: np.ndarray,
    lanes: np.ndarray | None = None,
    latency: bool = True,
    rdma: bool = False,
    geometry: RoundGeometry | None = None,
) -> tuple[float, Features]:
    """Time of one round of concurrent flows and the features of its slowest flow.

    ``key`` is the efficiency key of the transfers (a collective's name, or
    ``algorithm.protocol``). ``lanes[l]`` (default 1) is how many of a level-``l``
    element's ports one flow spreads over (NCCL's channels through the rail NICs
    of the group's GPUs): the flow counts ``lanes`` times against the ports and
    gets ``lanes x bandwidth x share``. Without ``latency`` the round is its
    transfer time only (the NCCL models count their latency per step instead).
    With ``rdma`` (NCCL: GPUDirect RDMA) a flow that leaves through a network
    level goes from the GPU to its NIC over PCIe, not over the GPU's NVLink: it
    does not load the ``nvlink`` levels. ``geometry``: the flows'
    :func:`round_geometry` (with ``profile``'s bandwidths), if known (then
    ``src`` and ``dst`` are not read and may be None); ``nbytes``: per flow."""
    levels = len(links.counts)
    if len(nbytes) == 0:
        return 0.0, Features.zero(levels)
    if geometry is None:
        geometry = round_geometry(links, profile.bandwidth_Bps, src, dst, lanes, rdma)
    seconds = nbytes / (geometry.rate * profile.efficiency_of(key))
    if latency:
        # a contiguous copy of a broadcast crossing: the product sums in the same order as on a full array
        seconds = seconds + profile.latency_s @ np.ascontiguousarray(geometry.crossing)
    worst = int(seconds.argmax())
    load = np.zeros(levels)
    load[int(geometry.bottleneck[worst])] = nbytes[worst] / geometry.share[worst]
    latency_count = geometry.crossing[:, worst].astype(float) if latency else np.zeros(levels)
    return float(seconds[worst]), Features(latency_count, {key: load})


def _port_share(links: Links, level: int, a_src: np.ndarray, a_dst: np.ndarray, outward: np.ndarray,
                lane: float) -> np.ndarray:
    """Per flow, its share of a port of level ``level`` when the ``outward`` flows
    leave through their source element's uplink and enter through their
    destination element's downlink (``a_src``, ``a_dst``: the elements), each
    spread over ``lane`` ports: ``lane x min(1, ports / (flows on the busier of
    its two links x lane))``. Meaningful for ``outward`` flows only."""
    up = np.bincount(a_src[outward], minlength=links.elements[level])
    down = np.bincount(a_dst[outward], minlength=links.elements[level])
    busiest = np.maximum(up[a_src], down[a_dst]) * lane
    return lane * np.minimum(1.0, links.ports[level] / np.maximum(busiest, 1))


def _ring_share(links: Links, level: int, a_srcs: np.ndarray, a_dsts: np.ndarray, cross: np.ndarray,
                lane: float) -> np.ndarray:
    """Per flow crossing ``level``, a ``ring`` fabric level, its share: siblings
    (same parent element) share the busiest ring link of their shortest way, the
    others the ports (:func:`_port_share`); 1 for flows that do not cross it."""
    a_src, a_dst = a_srcs[level], a_dsts[level]
    siblings = cross & (a_srcs[level - 1] == a_dsts[level - 1]) if level else cross
    share = np.ones(len(a_src))
    load = _ring_load(a_src, a_dst, siblings, links.counts[level])
    share = np.where(siblings, 1.0 / np.maximum(load, 1), share)
    outward = cross & ~siblings
    if outward.any():
        share = np.where(outward, _port_share(links, level, a_src, a_dst, outward, lane), share)
    return share


def _ring_load(a_src: np.ndarray, a_dst: np.ndarray, siblings: np.ndarray, count: int) -> np.ndarray:
    """Per flow, the number of sibling flows on the busiest ring link of its path."""
    pos_s, pos_d = a_src % count, a_dst % count
    parent = a_src // count
    forward = (pos_d - pos_s) % count
    clockwise = forward <= count - forward
    hops = np.where(clockwise, forward, count - forward)
    step = np.where(clockwise, 1, -1)
    # link (parent, position, direction) ids; count flows on each
    load: dict[tuple[int, int, int], int] = {}
    paths = []
    for f in np.flatnonzero(siblings):
        path = [(int(parent[f]), int((pos_s[f] + step[f] * h + (0 if step[f] > 0 else -1)) % count), int(step[f]))
                for h in range(int(hops[f]))]
        paths.append((f, path))
        for link in path:
            load[link] = load.get(link, 0) + 1
    out = np.ones(len(a_src))
    for f, path in paths:
        out[f] = max(load[link] for link in path)
    return out
