"""The description of an emulated cluster (pure: creates nothing): its nodes and
racks, their addresses inside ``SUBNET``, and how their uplinks are shaped.

Rates: the uplink of a node (rack) carries ``bandwidth_GBps x ports`` of its
topology level times the rate scale. The default scale (``auto``) is 1 unless the
fastest shaped uplink would exceed ``AUTO_CAP_GBPS`` (1 Gbit/s), in which case all
uplinks are scaled down by the same factor (their ratios are kept). Latency is not
emulated (this kernel has no netem), nor the ranks' own level (shared memory).
"""

from __future__ import annotations

import ipaddress
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import SynthError
from ..topology import Topology
from .names import MAX_LINK_NAME, Names

SUBNET = ipaddress.IPv4Network("10.213.0.0/24")  # assigned only inside the cluster's own namespaces
AUTO_CAP_GBPS = 0.125  # the fastest shaped uplink under --rate-scale auto: 1 Gbit/s
MIN_RATE_BIT_S = 1_000_000  # below 1 Mbit/s a job would crawl: refused
TBF_LATENCY_MS = 50  # generous, or tbf drops packets under load (docs/testbed.md)
TBF_MIN_BURST_BYTES = 128 * 1024  # a 64 KiB GSO packet always fits
TBF_BURST_S = 0.002  # burst = 2 ms at the rate when that is larger
# the links' MTU: Linux's default; 9000 (jumbo frames, as datacenter Ethernet and RoCE fabrics run) makes
# TCP/IP headers 0.7% of a shaped link instead of 4.4% (docs/testbed.md)
DEFAULT_MTU_BYTES = 1500
MTU_RANGE_BYTES = (1280, 65535)  # IPv6's minimum; the largest a veth or bridge takes


@dataclass(frozen=True)
class Shaping:
    """One ``tc tbf`` qdisc, applied at both ends of an uplink."""

    rate_bit_s: int
    burst_bytes: int
    latency_ms: int = TBF_LATENCY_MS

    @property
    def rate_GBps(self) -> float:
        return self.rate_bit_s / 8e9

    def tc_args(self) -> tuple[str, ...]:
        return ("tbf", "rate", f"{self.rate_bit_s}bit", "burst", str(self.burst_bytes),
                "latency", f"{self.latency_ms}ms")


@dataclass(frozen=True)
class Node:
    """A node: a namespace (also its hostname) with ``ranks`` MPI ranks, joined
    to ``bridge`` in the switch namespace by the veth pair ``link``/``peer``."""

    index: int
    namespace: str
    address: str
    link: str  # the node's end, inside its namespace
    peer: str  # the switch's end, a port of ``bridge``
    bridge: str
    rack: int | None
    ranks: int
    tmpdir: Path


@dataclass(frozen=True)
class Rack:
    """A rack: a bridge in the switch namespace joined to the top bridge by the
    veth pair ``link`` (on the rack bridge) / ``peer`` (on the top bridge)."""

    index: int
    bridge: str
    link: str
    peer: str


@dataclass(frozen=True)
class Cluster:
    """Everything ``emulate`` creates for one run, named after ``owner_pid``."""

    topology: Topology
    owner_pid: int
    switch_namespace: str
    top_bridge: str
    launcher_address: str
    nodes: tuple[Node, ...]
    racks: tuple[Rack, ...]
    node_shaping: Shaping
    rack_shaping: Shaping | None
    rate_scale: float
    workdir: Path
    mtu_bytes: int = DEFAULT_MTU_BYTES

    @property
    def names(self) -> Names:
        return Names(self.owner_pid)

    @property
    def tag(self) -> str:
        return self.names.tag

    @property
    def ranks(self) -> int:
        return sum(n.ranks for n in self.nodes)

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.switch_namespace, *(n.namespace for n in self.nodes))

    @property
    def links(self) -> tuple[str, ...]:
        """Every link and bridge, in the switch or a node namespace."""
        names = [self.top_bridge]
        for r in self.racks:
            names += [r.bridge, r.link, r.peer]
        for n in self.nodes:
            names += [n.link, n.peer]
        return tuple(names)

    @property
    def launcher_tmpdir(self) -> Path:
        return self.workdir / "launcher"

    @property
    def agent_path(self) -> Path:
        return self.workdir / "agent"

    @property
    def hostfile_path(self) -> Path:
        return self.workdir / "hostfile"


def _uplink_GBps(topology: Topology, level: int) -> float:
    lv = topology.levels[level]
    return lv.bandwidth_GBps * lv.ports


def choose_rate_scale(topology: Topology, rate_scale: float | None, node_rate_gbit: float | None) -> float:
    """The factor applied to every shaped uplink: ``node_rate_gbit`` fixes the
    node uplink's rate, else ``rate_scale``, else (auto) 1 or less so that the
    fastest shaped uplink is at most ``AUTO_CAP_GBPS``."""
    if rate_scale is not None and node_rate_gbit is not None:
        raise SynthError("give --rate-scale or --node-rate-gbit, not both")
    node_level = len(topology.levels) - 2
    if node_rate_gbit is not None:
        if not node_rate_gbit > 0:
            raise SynthError(f"--node-rate-gbit {node_rate_gbit}: must be > 0")
        return node_rate_gbit / 8 / _uplink_GBps(topology, node_level)
    if rate_scale is not None:
        if not rate_scale > 0:
            raise SynthError(f"--rate-scale {rate_scale}: must be > 0")
        return rate_scale
    fastest = max(_uplink_GBps(topology, i) for i in range(node_level + 1))
    return min(1.0, AUTO_CAP_GBPS / fastest)


def shaping(GBps: float, where: str) -> Shaping:
    rate_bit_s = round(GBps * 8e9)
    if rate_bit_s < MIN_RATE_BIT_S:
        raise SynthError(f"the {where} uplink would be shaped to {rate_bit_s} bit/s, below 1 Mbit/s; "
                         "raise --rate-scale or --node-rate-gbit")
    return Shaping(rate_bit_s, max(TBF_MIN_BURST_BYTES, round(rate_bit_s / 8 * TBF_BURST_S)))


def describe_cluster(topology: Topology, owner_pid: int, ranks_per_node: int | None = None,
                     rate_scale: float | None = None, node_rate_gbit: float | None = None,
                     workroot: Path | None = None, mtu_bytes: int = DEFAULT_MTU_BYTES) -> Cluster:
    """The cluster that emulates ``topology``: levels ``[node, rank]`` or
    ``[rack, node, rank]``; ``ranks_per_node`` defaults to the rank level's count.
    Pure: creates nothing. Raises SynthError for a topology it cannot emulate."""
    levels = topology.levels
    if not 2 <= len(levels) <= 3:
        raise SynthError(
            f"topology {topology.name} has {len(levels)} level(s); the emulator takes [node, rank] or "
            "[rack, node, rank] (the innermost level is the ranks of a node)")
    if ranks_per_node is not None and ranks_per_node < 1:
        raise SynthError(f"--ranks-per-node {ranks_per_node}: must be >= 1")
    if owner_pid < 1:
        raise SynthError(f"owner pid {owner_pid}: must be >= 1")
    low, high = MTU_RANGE_BYTES
    if not low <= mtu_bytes <= high:
        raise SynthError(f"--mtu {mtu_bytes}: must be between {low} and {high} bytes (9000: jumbo frames)")
    ranks = levels[-1].count if ranks_per_node is None else ranks_per_node
    node_level = len(levels) - 2
    per_rack = levels[node_level].count
    racks_count = levels[0].count if node_level == 1 else 0
    count = per_rack * max(racks_count, 1)
    hosts = list(SUBNET.hosts())
    if count + 1 > len(hosts):
        raise SynthError(f"topology {topology.name} has {count} nodes; the emulator's /24 holds at most "
                         f"{len(hosts) - 1}")
    scale = choose_rate_scale(topology, rate_scale, node_rate_gbit)
    node_shaping = shaping(_uplink_GBps(topology, node_level) * scale, levels[node_level].name)
    rack_shaping = shaping(_uplink_GBps(topology, 0) * scale, levels[0].name) if racks_count else None

    names = Names(owner_pid)
    workdir = names.workdir(Path(workroot or tempfile.gettempdir()))
    top = names.top_bridge
    racks = tuple(Rack(r, names.rack_bridge(r), names.rack_link(r), names.rack_peer(r))
                  for r in range(racks_count))
    nodes = tuple(
        Node(index=i, namespace=names.node_namespace(i), address=str(hosts[i + 1]),
             link=names.node_link(i), peer=names.node_peer(i),
             bridge=racks[i // per_rack].bridge if racks else top,
             rack=i // per_rack if racks else None, ranks=ranks, tmpdir=workdir / f"n{i}")
        for i in range(count)
    )
    cluster = Cluster(topology, owner_pid, names.switch_namespace, top, str(hosts[0]), nodes, racks,
                      node_shaping, rack_shaping, scale, workdir, mtu_bytes)
    too_long = [name for name in cluster.links if len(name) > MAX_LINK_NAME]
    if too_long:  # cannot happen for pids < 10^8 and < 1000 nodes; say so if it does
        raise SynthError(f"link name {too_long[0]} is longer than {MAX_LINK_NAME} characters")
    return cluster


def describe_text(c: Cluster) -> str:
    """What the cluster is and how it is shaped, for people."""
    top = c.topology.levels
    node_lv, rank_lv = top[-2], top[-1]
    lines = [
        f"cluster {c.tag} emulating {c.topology.name}: {len(c.nodes)} {node_lv.name}s x {c.nodes[0].ranks} "
        f"{rank_lv.name}s = {c.ranks} MPI ranks"
        + (f" in {len(c.racks)} {top[0].name}s" if c.racks else ""),
        f"subnet {SUBNET} inside the cluster's namespaces only; launcher (mpiexec) in {c.switch_namespace} "
        f"at {c.launcher_address}",
    ]
    shaped = [(node_lv, c.node_shaping)] + ([(top[0], c.rack_shaping)] if c.rack_shaping else [])
    for lv, s in shaped:
        lines.append(
            f"{lv.name} uplink shaped to {s.rate_bit_s / 1e9:g} Gbit/s per direction (topology "
            f"{lv.bandwidth_GBps:g} GB/s x {lv.ports} port(s) x rate scale {c.rate_scale:g} = {s.rate_GBps:g} GB/s); "
            f"tc tbf burst {s.burst_bytes} B, latency {s.latency_ms} ms")
    lines.append(f"links: MTU {c.mtu_bytes} bytes" + (" (Linux's default; --mtu 9000 for jumbo frames)"
                                                      if c.mtu_bytes == DEFAULT_MTU_BYTES else ""))
    lines.append(f"not emulated: latency_us (no netem), the {rank_lv.name} level's bandwidth (shared memory)")
    return "\n".join(lines)
