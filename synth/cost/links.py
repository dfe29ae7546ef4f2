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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..topology import Topology
from .profile import Profile
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


@lru_cache(maxsize=64)
def links_of(topology: Topology) -> Links:
    counts = topology.counts
    devices = np.arange(topology.num_devices)
    ancestors = tuple(devices // math.prod(counts[l + 1 :]) for l in range(len(counts)))
    net = np.array([topology.link(i) == "net" for i in range(len(counts))])
    nvlink = np.array([topology.link(i) == "nvlink" for i in range(len(counts))])
    stacked = np.stack(ancestors)
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
    )


def round_cost(
    links: Links,
    profile: Profile,
    key: str,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: np.ndarray,
    lanes: np.ndarray | None = None,
    latency: bool = True,
    rdma: bool = False,
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
    does not load the ``nvlink`` levels."""
    levels = len(links.counts)
    if len(src) == 0:
        return 0.0, Features.zero(levels)
    eff = profile.efficiency_of(key)
    lat, bw = profile.latency_s, profile.bandwidth_Bps
    share = np.ones((levels, len(src)))
    a_srcs = links.stacked[:, src]  # (levels, flows)
    a_dsts = links.stacked[:, dst]
    crossing = a_srcs != a_dsts
    if rdma and links.rdma:
        crossing[links.nvlink] &= ~crossing[links.net].any(axis=0)
    for l in np.flatnonzero(crossing.any(axis=1)).tolist():
        a_src, a_dst, cross = a_srcs[l], a_dsts[l], crossing[l]
        siblings = cross & (a_srcs[l - 1] == a_dsts[l - 1]) if l else cross
        if links.ring[l]:
            load = _ring_load(a_src, a_dst, siblings, links.counts[l])
            share[l] = np.where(siblings, 1.0 / np.maximum(load, 1), share[l])
            outward = cross & ~siblings
        else:
            outward = cross
        if outward.any():
            up = np.bincount(a_src[outward], minlength=links.elements[l])
            down = np.bincount(a_dst[outward], minlength=links.elements[l])
            lane = 1.0 if lanes is None else lanes[l]
            busiest = np.maximum(up[a_src], down[a_dst]) * lane
            share[l] = np.where(outward, lane * np.minimum(1.0, links.ports[l] / np.maximum(busiest, 1)), share[l])
    # bottleneck level of each flow: smallest bandwidth x share among crossed levels
    rate = np.where(crossing, bw[:, None] * share, np.inf)
    bottleneck = rate.argmin(axis=0)
    seconds = nbytes / (rate.min(axis=0) * eff)
    if latency:
        seconds = seconds + lat @ crossing
    worst = int(seconds.argmax())
    features = Features.zero(levels)
    if latency:
        features.latency_count = crossing[:, worst].astype(float)
    load = np.zeros(levels)
    load[bottleneck[worst]] = nbytes[worst] / share[bottleneck[worst], worst]
    features.load[key] = load
    return float(seconds[worst]), features


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
