"""What NCCL runs: its choice of algorithm, protocol and channels for one call.

This follows NCCL 2.27.7 (tag ``v2.27.7-1`` of NVIDIA/nccl) by default, and the
rules of older releases where they differ (:mod:`synth.cost.nccl_rules`, chosen
by a communicator's ``version``): the cost table of
``src/graph/tuning.cc`` (``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``), the
choice of ``src/enqueue.cc`` (``topoGetAlgoInfo``: the (algorithm, protocol) of
least estimated time) and, in closed form, the channel counts and per-channel
speeds that ``src/graph/search.cc`` (``ncclTopoCompute``) finds on the kinds of
nodes a topology file describes. Every constant below is NCCL's, transcribed
with the name it has there; nothing here is fitted: NCCL decides with its own
model, whatever the link numbers of a fitted profile say.

What a communicator looks like to NCCL (:class:`Comm`, from a topology and the
members of a group, :func:`comm_of`): ``ranks``, ``nodes`` (distinct elements of
the innermost ``link: net`` level; one when there is none), the GPU architecture
(``compute_capability``), how GPUs inside a node are connected (NVLink through
an NVSwitch, NVLink without a switch, PCIe), the per-GPU intra-node bandwidth
NCCL assigns (``nvlinks`` x its per-link bandwidth for the architecture, from
``src/graph/topo.h``, else the level's ``bandwidth_GBps``), NVLS (NVLink SHARP:
``nvls: true`` on an NVSwitch level, compute capability >= 9.0, more than two
GPUs of the node in the group, as ``ncclNvlsInit`` requires), and the NICs the
group's GPUs use (rail-local: ``ceil(k x NICs / GPUs)`` of the node's NICs for
``k`` member GPUs in it) with their rate (the net level's ``bandwidth_GBps``).

Algorithms (``ncclAlgoStr``): ``ring``, ``tree``, ``nvls``, ``nvlstree``,
``pat``; CollNet needs a SHARP network plugin and ``NCCL_COLLNET_ENABLE``, off by
default, so it is not modelled. Protocols: ``LL``, ``LL128``, ``Simple``.

Simplifications of the topology search (documented in docs/simulator.md): the
search is reduced to channel capacities (how many channels of a given speed the
GPUs' NVLink bandwidth and the NICs carry; where the topology gives a node's
link graph, how many rings fit through the links among the group's GPUs,
:mod:`synth.cost.rings`, and the ring's path type there: ``Comm.local``);
GPU-to-NIC PCIe paths are assumed as fast as the NIC (GPUDirect RDMA through a PCIe switch); CPUs are assumed not
to be AMD (Intel/ARM rows of the LL table, 1 us network overhead); ring graphs
use the same channels on every node (``sameChannels``). No tuner plugin: cloud
images that install one (AWS's ``NCCL_TUNER_PLUGIN=ofi``) may choose otherwise.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..caches import memoised
from ..errors import SynthError
from ..synthesis.language import Collective
from ..topology import Topology
from .nccl_rules import NCCL_2_27_7, NCCL_VERSION, RULES, NcclRules, rules_for
from .rings import PATH_TYPES, Members, rings_with_type

ALGORITHMS = ("tree", "ring", "nvls", "nvlstree", "pat")  # the ones modelled (CollNet is off by default)
PROTOCOLS = ("LL", "LL128", "Simple")

# ---------------------------------------------------------------- NCCL's constants (v2.27.7)

# NCCL 2.27.7's tables (the default rule set; older releases: synth.cost.nccl_rules)
BASE_LAT_US = NCCL_2_27_7.base_lat_us  # src/graph/tuning.cc baseLat [algorithm][protocol], us
HW_LAT_US = NCCL_2_27_7.hw_lat_us  # tuning.cc hwLat [NVLINK, PCI, NET][algorithm][protocol], us
# ncclTopoGetAlgoTime's treeCorrectionFactor [protocol][log2(bytes / 64)], 64 B to 256 MiB
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
# src/graph/search.cc speed arrays (GB/s per channel) below sm90, the same in every transcribed release
SPEEDS_SM70 = {"intra": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
               "inter": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
                         0.24, 0.12)}
NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS' default (src/transport/nvls.cc); sm100 in 2.27: NcclRules
TREE_PATTERN_FACTOR = .85  # tuning.cc:284: a tree graph of pattern TREE (one GPU per node) runs slower
MAX_NVLS_ARITY = 32  # src/include/device.h
NET_OVERHEAD_US = 1.0  # getNetOverhead: Intel x86 and non-x86 CPUs (AMD: 2.0)


@dataclass(frozen=True)
class Comm:
    """A communicator as NCCL's tuning sees it (see the module docstring)."""

    ranks: int
    nodes: int
    sm: int  # compute capability x 10: 80, 90, 100
    intra: str | None  # "nvlink" or "pcie" between GPUs of a node; None with one GPU per node
    nvswitch: bool  # the node's GPUs meet in an NVSwitch
    nvls: bool  # NVLS usable (hardware, enabled, > 2 local GPUs)
    intra_GBps: float  # per-GPU intra-node bandwidth NCCL assigns
    nics: int  # NICs per node the group's GPUs use (0 on one node)
    nic_GBps: float
    version: str = NCCL_VERSION  # the NCCL release whose rules apply (a key of synth.cost.nccl_rules.RULES)
    local: tuple[Members, ...] = ()  # per node (distinct), the members on the node's link graph (synth.cost.rings)
    nic_path: str | None = None  # across nodes: the GPU-NIC path type (Level.nic_path; None: not stated)

    @property
    def rules(self) -> NcclRules:
        return RULES[self.version]


@dataclass(frozen=True)
class Graph:
    """One of NCCL's graphs: channels and per-channel speeds (GB/s)."""

    channels: int
    bw_intra: float
    bw_inter: float
    path_type: str = "nvl"  # the worst path type inside a node the rings take (a node's link graph; synth.linkgraph)


@dataclass(frozen=True)
class PredictedChoice:
    """NCCL's choice for one call as this model predicts it from NCCL's cost
    table: algorithm, protocol, channels of its graph, and its own time estimate
    (us). (What a run's NCCL log says it chose: :class:`synth.cost.nccl_log.LoggedChoice`.)"""

    algorithm: str
    protocol: str
    channels: int
    estimate_us: float

    @property
    def key(self) -> str:
        """``ring.LL``: the efficiency and base-latency key of the pair."""
        return f"{self.algorithm}.{self.protocol}"


# ---------------------------------------------------------------- the communicator


def nvlink_GBps(sm: int, rules: NcclRules = NCCL_2_27_7) -> float:
    """NCCL's bandwidth of one NVLink for a compute capability (x10)."""
    for least, GBps in rules.nvlink_GBps:  # the first row that matches: sm86 (GA10x) only by equality
        matches = sm == 86 if least == 86 else sm >= least
        if matches:
            return GBps
    return dict(rules.nvlink_GBps)[80]  # below sm60: NCCL's default row


def node_level(topology: Topology) -> int | None:
    """Index of the innermost ``net`` level (its elements are NCCL's nodes), or None."""
    nets = [i for i in range(len(topology.levels)) if topology.link(i) == "net"]
    return max(nets) if nets else None


@memoised(maxsize=8192)
def comm_of(topology: Topology, members: tuple[int, ...], nvls_enabled: bool = True,
            version: str | None = None) -> Comm:
    """NCCL's view of a communicator over ``members`` (device ids) of
    ``topology``, under the rules of NCCL ``version`` (default: the newest
    transcribed; :func:`synth.cost.nccl_rules.rules_for`)."""
    return _comm_of(topology, communicator_shape(topology, members), nvls_enabled, rules_for(version).version)


def communicator_shape(topology: Topology, members: tuple[int, ...]) -> tuple:
    """What :func:`comm_of` depends on: per level, the number of distinct elements
    of that level among the members and the most members in one of them."""
    counts = topology.counts
    shape = []
    # many members: counted with numpy (from algorithms.NUMPY_MEMBERS_FROM on; algorithms imports links, which
    # imports this module, so the value is repeated here)
    ids = np.asarray(members) if len(members) >= 256 else None
    for l in range(len(counts)):
        stride = math.prod(counts[l + 1:])
        if ids is not None:
            per_element = np.unique(ids // stride, return_counts=True)[1]
            shape.append((len(per_element), int(per_element.max())))
        else:
            per = Counter(d // stride for d in members)
            shape.append((len(per), max(per.values())))
    graph = topology.levels[-1].graph
    if graph is None or graph.kind == "nvswitch":
        return (len(members), tuple(shape))
    # a link graph: which GPUs of each node, too (the distinct sets of node-local indices)
    by_node: dict[int, list[int]] = {}
    for d in members:
        by_node.setdefault(d // counts[-1], []).append(d % counts[-1])
    return (len(members), tuple(shape), tuple(sorted({tuple(sorted(v)) for v in by_node.values()})))


@memoised(maxsize=4096)
def _comm_of(topology: Topology, shape: tuple, nvls_enabled: bool, version: str) -> Comm:
    ranks, per_level, *graph_locals = shape
    net = node_level(topology)
    nodes, per_node = per_level[net] if net is not None else (1, ranks)
    sm = int(round(topology.compute_capability * 10))
    inside = range(net + 1 if net is not None else 0, len(topology.levels))
    # intra-node levels the group spans: an element of the level above holds several members' elements
    spanned = [l for l in inside if (per_level[l][0] > (per_level[l - 1][0] if l else 1))]
    intra = None
    nvswitch = False
    intra_GBps = math.inf
    for l in spanned:
        level = topology.levels[l]
        link = topology.link(l)
        intra = "pcie" if link == "pcie" or intra == "pcie" else "nvlink"
        bw = level.nvlinks * nvlink_GBps(sm, RULES[version]) if link == "nvlink" and level.nvlinks else (
            level.bandwidth_GBps)
        intra_GBps = min(intra_GBps, bw)
    local: tuple[Members, ...] = ()
    graph = topology.levels[-1].graph
    if graph_locals and len(topology.levels) - 1 in spanned:  # the GPUs see only the links among them
        unit = nvlink_GBps(sm, RULES[version])
        local = tuple(Members(graph, sub, unit) for sub in graph_locals[0] if len(sub) > 1)
        intra = "pcie" if graph.kind == "pcie" else intra
        intra_GBps = min(m.total_GBps for m in local)
    if spanned:
        last = topology.levels[spanned[-1]]
        nvswitch = intra == "nvlink" and all(topology.levels[l].fabric == "switch" for l in spanned)
        nvls = nvswitch and last.nvls and sm >= 90 and per_node > 2 and nvls_enabled and RULES[version].nvls
    else:
        nvls = False
    nics, nic_GBps = 0, 0.0
    if nodes > 1:
        level = topology.levels[net]
        gpus = math.prod(topology.counts[net + 1:])
        nics = min(level.ports, max(1, math.ceil(per_node * level.ports / gpus)))
        nic_GBps = level.bandwidth_GBps
    nic_path = topology.levels[net].nic_path if nodes > 1 else None
    return Comm(ranks, nodes, sm, intra, nvswitch, nvls, intra_GBps if spanned else 0.0, nics, nic_GBps, version,
                local, nic_path)


def ll128_over_network(comm: Comm) -> bool:
    """Whether NCCL allows LL128 across nodes on ``comm``'s GPU-NIC path
    (``graphs[a]->typeInter``; the same for every graph here). src/graph/tuning.cc:
    ``typeInter <= PATH_PXB``, or on compute capability 9.0 and newer
    ``<= PATH_PXN`` (2.18.5:285, 2.21.5:308, 2.23.4:327; 2.27.7:457-464, where
    ``NCCL_LL128_C2C``, default 1, also admits ``PATH_P2C``, a path NCCL has
    since 2.27); 2.8.4:194 has only ``<= PATH_PXB`` (and no sm90 LL128). A path
    not stated counts as PXB or better (DGX nodes)."""
    path = comm.nic_path
    if path is None or path in ("pix", "pxb"):
        return True
    if comm.sm < 90 or path not in ("pxn", "p2c"):
        return False
    major, minor = (int(v) for v in comm.version.split(".")[:2])
    return path == "pxn" and (major, minor) >= (2, 18) or path == "p2c" and (major, minor) >= (2, 27)


# ---------------------------------------------------------------- the graphs (ncclTopoCompute, in closed form)


def _speeds(comm: Comm) -> tuple[float, ...]:
    rules = comm.rules
    if rules.speeds_all:
        return rules.speeds_all
    if comm.sm < 90:
        return SPEEDS_SM70["inter" if comm.nodes > 1 else "intra"]
    pair = rules.speeds_sm100 if comm.sm >= 100 and rules.speeds_sm100 else rules.speeds_sm90
    return pair[1 if comm.nodes > 1 else 0]


def _fits(load: float, capacity: float) -> bool:
    return load <= capacity + 1e-3  # search.cc rounds bandwidths to 1e-3 (SUB_ROUND)


def _ring_capacity(comm: Comm, speed: float) -> int:
    """Channels of ``speed`` the GPUs' links (and the NICs) carry: each ring
    channel takes ``speed`` of every GPU's intra-node bandwidth and of one NIC."""
    n = comm.rules.max_graph_channels
    if comm.nodes > 1:
        n = min(n, comm.nics * int((comm.nic_GBps + 1e-3) // speed))
    if comm.local:
        n = _graph_rings(comm, speed, n)
    elif comm.intra is not None:
        n = min(n, int((comm.intra_GBps + 1e-3) // speed))
    return n


def _graph_rings(comm: Comm, speed: float, most: int) -> int:
    """The ring channels of ``speed`` (at most ``most``) that fit through each
    node's members on its link graph (:func:`synth.linkgraph.rings_with_type`),
    the fewest over the nodes (init.cc:1007 takes the minimum over ranks)."""
    return min([most] + [rings_with_type(m, speed, most)[0] for m in comm.local if most > 0])


@memoised(maxsize=4096)
def ring_graph(comm: Comm) -> Graph:
    """The ring graph: pass 1 from the fastest speed the paths allow down while
    the next speed is above 0.49 of the best found; channels doubled (halving the
    speed) when the speed is >= 25 GB/s, except on sm > 80 below 50 GB/s with more
    than 4 channels; pass 2 raises the speed while the channels still fit (from
    NCCL 2.21; before, pass 2 raises only the tree's speed)."""
    speeds = _speeds(comm)
    max_bw = comm.nic_GBps if comm.nodes > 1 else (
        min(m.max_path_GBps for m in comm.local) if comm.local else comm.intra_GBps)
    total = comm.intra_GBps if comm.intra is not None else comm.nic_GBps * comm.nics
    # search.cc:1024-1031: two NVLink domains joined by a slower link want two ring channels at least
    least = 2 if any(m.split_nvlink for m in comm.local) else 1
    i = next((j for j, s in enumerate(speeds) if s <= max_bw + 1e-3 and s * least <= total + 1e-3), len(speeds) - 1)
    best: tuple[int, float] | None = None
    while True:
        n = _ring_capacity(comm, speeds[i])
        if n >= least and (best is None or n * speeds[i] > best[0] * best[1]):
            best = (n, speeds[i])
        if best is not None and (best[0] * best[1] >= total - 1e-3 or best[0] == comm.rules.max_graph_channels):
            break
        if i + 1 < len(speeds) and (best is None or speeds[i + 1] / best[1] > .49):
            i += 1
            continue
        break
    if best is None:
        return Graph(1, 0.1, 0.1, PATH_TYPES[-1] if comm.local else "nvl")  # a simple order at 0.1 GB/s, SYS
    n, bw = best
    path_type = "nvl"
    if comm.local:  # the worst over the nodes of the path type their rings of this speed need
        path_type = max((rings_with_type(m, bw, comm.rules.max_graph_channels)[1] for m in comm.local),
                        key=PATH_TYPES.index)
    if bw >= 25.0 and not (comm.rules.dup_sm_exception and comm.sm > 80 and bw < 50.0 and n > 4):  # DupChannels
        doubled = min(2 * n, comm.rules.max_graph_channels)
        bw, n = (bw / 2, doubled) if doubled > n else (bw, n)
    for s in speeds if comm.rules.ring_pass2 else ():  # pass 2: a higher speed with at least as many channels
        if s > bw and _ring_capacity(comm, s) >= n and _ring_capacity(comm, s) * s > n * bw:
            n, bw = _ring_capacity(comm, s), s
    return Graph(n, bw, bw, path_type)


@memoised(maxsize=4096)
def tree_graph(comm: Comm, ring: Graph) -> Graph:
    """The tree graph: as many channels as the ring; pass 2 raises the intra-node
    speed (up to twice the inter-node one) while the GPUs' links carry it."""
    n, inter = ring.channels, ring.bw_inter
    intra = inter
    if comm.intra is not None:
        for s in sorted(_speeds(comm)):
            if not inter < s < 2 * inter:
                continue
            if (_graph_rings(comm, s, n) >= n) if comm.local else _fits(n * s, comm.intra_GBps):
                intra = s
    return Graph(n, intra, inter, ring.path_type)


@memoised(maxsize=4096)
def nvls_graph(comm: Comm) -> Graph:
    """The NVLS graph: one channel per head GPU (every GPU of the node alone;
    GPUs with a NIC with a network), each head taking twice and every other GPU
    once the channel's speed of its NVLink bandwidth; with a network the
    inter-node speed is raised up to twice the intra one within the NIC rate."""
    if not comm.nvls:
        return Graph(0, 0.0, 0.0)
    local = comm.ranks // comm.nodes
    heads = min(local, MAX_NVLS_ARITY) if comm.nodes == 1 else min(local, comm.nics)
    cap = comm.nic_GBps if comm.nodes > 1 else math.inf
    fitting = [s for s in _speeds(comm) if _fits((heads + 1) * s, comm.intra_GBps) and s <= cap + 1e-3]
    if not fitting:
        return Graph(0, 0.0, 0.0)
    intra = fitting[0]
    inter = max([s for s in _speeds(comm) if intra <= s < 2 * intra and s <= cap + 1e-3], default=intra)
    return Graph(heads, intra, inter)


@memoised(maxsize=4096)
def runtime_channels(comm: Comm) -> int:
    """The communicator's channels (``comm->nChannels``, src/graph/connect.cc),
    which the ring's plateau threshold divides by: the graphs' channels doubled
    (up to MAXCHANNELS, :452), doubled again on compute capability >= 9.0 across
    nodes with a ring faster than 45 GB/s per channel below 16 channels (:466),
    and raised to NVLS's channels where NVLS is usable (:493; 16 on sm90, 32 on
    sm100 across nodes, 24 on one node: src/transport/nvls.cc). Older releases
    per their :class:`~synth.cost.nccl_rules.NcclRules`."""
    rules = comm.rules
    most = 2 * rules.max_graph_channels  # MAXCHANNELS
    ring = ring_graph(comm)
    nc = min(most, 2 * ring.channels)
    hopper = comm.sm >= 90 if rules.hopper_double == "ge90<16" else comm.sm == 90 and rules.hopper_double != "none"
    fits = 2 * nc <= most if rules.hopper_double == "eq90fits" else nc < 16
    if hopper and fits and comm.nodes > 1 and ring.bw_intra > 45.0:
        nc = min(most, 2 * nc)
    if comm.nvls and rules.nvls_channel_raise:
        nc = max(nc, nvls_channels(comm))
    return nc


def nvls_channels(comm: Comm) -> int:
    """NVLS's channels on a communicator where NVLS is usable
    (``comm->nvlsChannels``, src/transport/nvls.cc:147-149, 193-198 at
    v2.27.7-1): 16 on sm90, on sm100 32 across nodes and 24 on one node."""
    if comm.sm >= 100 and comm.rules.nvls_channels_sm100:
        return comm.rules.nvls_channels_sm100[0 if comm.nodes > 1 else 1]
    return NVLS_CHANNELS


# ---------------------------------------------------------------- the cost table (ncclTopoTuneModel)


def _log2i(n: int) -> int:
    return n.bit_length() - 1


def _sm_index(sm: int) -> int:
    return 3 if sm >= 100 else 2 if sm >= 90 else 1 if sm >= 80 else 0


@memoised(maxsize=4096)
def cost_table(comm: Comm, collective: Collective) -> dict[tuple[str, str], tuple[float, float]]:
    """(algorithm, protocol) -> (latency us, bandwidth GB/s) as NCCL computes them
    for ``collective`` on ``comm``; pairs NCCL disables are left out."""
    if comm.ranks <= 1:
        return {}
    graphs = {"ring": ring_graph(comm)}
    graphs["tree"] = tree_graph(comm, graphs["ring"])
    graphs["nvls"] = graphs["nvlstree"] = nvls_graph(comm)
    graphs["pat"] = graphs["tree"]
    rules = comm.rules
    nodes, ranks = comm.nodes, comm.ranks
    ppn = ranks / nodes
    index2 = nodes - 1 if nodes <= 2 else 2
    sm_i = _sm_index(comm.sm)

    def cap(table: tuple, row: int) -> float:  # a release without the row uses its last one (minCompCap >= 90)
        return table[min(row, len(table) - 1)][index2]

    if rules.compcap80_rows:  # before 2.18: the Ampere row only when every GPU is sm80, else Volta's
        sm_i = 1 if comm.sm == 80 else 0
    ll_max = cap(rules.ll_max_bws, sm_i if nodes == 1 else 0) if rules.ll_max_bws else math.inf  # 2.6: no cap
    ll128_coll_cap = None
    if rules.ll128_per_coll_caps:  # ll128MaxBwPerCh[coll]: Broadcast, Reduce, AllGather, ReduceScatter, AllReduce
        ll128_coll_cap = rules.ll128_per_coll_caps[(Collective.BROADCAST, Collective.REDUCE, Collective.ALLGATHER,
                                                    Collective.REDUCESCATTER, Collective.ALLREDUCE).index(collective)]
    nsteps = {Collective.ALLREDUCE: 2 * (ranks - 1), Collective.REDUCESCATTER: ranks - 1,
              Collective.ALLGATHER: ranks - 1}.get(collective, ranks)
    intra_hw = "nvlink" if comm.intra == "nvlink" else "pcie"  # tuning.cc: NVLink only for PATH_NVL; one GPU per node (PATH_LOC) and PCIe take the PCI row
    if comm.local and graphs["ring"].path_type != "nvl":  # tuning.cc:246: a ring through NVB or PCIe paths
        intra_hw = "pcie"
    pat = rules.pat_factor is not None and nodes == ranks and (comm.sm >= 60 or not rules.pat_needs_sm60)
    # search.cc:1017: a node with one GPU of the communicator makes every non-ring graph a plain TREE, and
    # maxTreePattern (init.cc:1015) is the largest over the ranks. (The sm >= 90 fallback from a balanced tree to a
    # plain one, search.cc:1093, depends on the recursive search and is not modelled.)
    tree_pattern_is_tree = nodes > 1 and ranks == nodes
    ll128 = comm.intra != "pcie" and (comm.sm >= 70 if rules.ll128_archs is None else comm.sm in rules.ll128_archs)
    ll128 = ll128 and graphs["ring"].path_type != "pci"  # tuning.cc:468: LL128 only up to PATH_NVB inside a node
    ll128 = ll128 and (nodes == 1 or ll128_over_network(comm))
    if rules.ll128_pix_nvl:  # 2.6: NVLink between the node's GPUs (not one GPU per node), the NIC at PIX
        ll128 = ll128 and comm.intra == "nvlink" and graphs["ring"].path_type == "nvl" and (
            nodes == 1 or comm.nic_path in (None, "pix"))
    out = {}
    for a in ALGORITHMS:
        if collective in (Collective.BROADCAST, Collective.REDUCE) and a != "ring":
            continue
        if collective in (Collective.REDUCESCATTER, Collective.ALLGATHER) and a != "ring" and (
                a not in rules.reduce_scatter_allgather):
            continue
        if collective is Collective.ALLREDUCE and a == "pat":
            continue
        if a in ("nvls", "nvlstree") and not comm.nvls:
            continue
        if a == "nvlstree" and nodes == 1:
            continue  # NVLS Tree is disabled on a single node
        if a == "nvls" and nodes > 1:
            continue  # multi-node NVLS needs CollNet
        if a == "pat" and not pat:
            continue
        g = graphs[a]
        for pi, p in enumerate(PROTOCOLS):
            if a in ("nvls", "nvlstree", "pat") and p != "Simple":
                continue
            if p == "LL128" and not ll128:
                continue
            bw = g.bw_intra if nodes <= 2 else g.bw_inter
            if a == "nvls" and rules.nvls_min_bw:
                bw = min(g.bw_intra, g.bw_inter)
                if rules.nvls_split_rs_ag_bw and collective is not Collective.ALLREDUCE:
                    bw = min(g.bw_intra * (ppn - 1) / ppn, g.bw_inter * 0.9)
            if a == "nvlstree" and rules.nvls_min_bw:
                bw = min(g.bw_intra, g.bw_inter if nodes <= 2 else g.bw_inter / 2)
            bus = g.channels * bw
            if rules.cc80_bus_cap is not None and comm.sm == 80:
                bus = min(bus, rules.cc80_bus_cap)
            if a == "ring" and p == "LL":
                third = nodes == 1 and collective not in (Collective.ALLREDUCE, Collective.REDUCE) and (
                    rules.ring_ll_one_node_third)
                bus = min(ll_max, bus * ((1.0 / 3.0 if third else .25) if rules.ring_ll_quarter else .5))
            if a == "ring" and p == "LL128":
                factor = rules.ring_ll128_ppn1 if rules.ring_ll128_ppn1 is not None and ppn < 2 else (
                    rules.ring_ll128_factor)
                bus = min(bus * factor, _ring_ll128_cap(rules, collective, g.channels, ll128_coll_cap, cap, sm_i))
            if a == "tree" and rules.tree_bus_caps is not None:  # before 2.8: an absolute cap, every protocol
                factor, *caps = rules.tree_bus_caps
                bus = min(bus * factor, caps[(nodes > 2) + 2 * (p == "LL128" and comm.sm == 80)])
            elif a == "tree" and collective is Collective.ALLREDUCE:
                bus = min(bus * .92, g.channels * cap(rules.per_ch_max_tree_bws, sm_i))
            if a == "tree" and p == "LL":
                bus = min(bus / rules.tree_ll_divisor, ll_max)
            if a == "tree" and p == "LL128" and rules.ll128_total_caps is not None:
                bus *= rules.tree_ll128_internode  # 2.6: x 7/9, no cap
            elif a == "tree" and p == "LL128":
                bus = min(bus * (7.0 / 9.0 if nodes == 1 else rules.tree_ll128_internode), g.channels * (
                    ll128_coll_cap if ll128_coll_cap is not None else cap(rules.per_ch_max_tree_ll128_bws, sm_i))
                    * rules.tree_ll128_cap_factor)
            if a == "tree" and tree_pattern_is_tree and rules.tree_pattern_085:
                bus *= TREE_PATTERN_FACTOR
            if a == "pat":
                bus *= rules.pat_factor
            if rules.ratio_on_nonring_rs_ag or not (
                    a != "ring" and collective in (Collective.ALLGATHER, Collective.REDUCESCATTER)):
                if a == "nvlstree" and rules.nvlstree_ratio_070:
                    bus *= .70 * nodes / (2 * (nodes - 1))
                else:
                    bus *= ranks / nsteps if a == "ring" else 5.0 / 6.0 if a in ("nvls", "nvlstree") else .5
            if bus <= 0:
                continue
            out[(a, p)] = (_latency_us(comm, collective, a, pi, intra_hw, nsteps), bus)
    return out


def _ring_ll128_cap(rules: NcclRules, collective: Collective, channels: int, per_coll: float | None, cap,
                    sm_i: int) -> float:
    """The ring LL128 bandwidth cap: 2.6's absolute one per collective
    (``ll128MaxBw``), else a per-channel cap x the graph's channels."""
    if rules.ll128_total_caps is not None:
        return rules.ll128_total_caps[(Collective.BROADCAST, Collective.REDUCE, Collective.ALLGATHER,
                                       Collective.REDUCESCATTER, Collective.ALLREDUCE).index(collective)]
    return channels * (per_coll if per_coll is not None else cap(rules.per_ch_max_ring_ll128_bws, sm_i))


def _latency_us(comm: Comm, collective: Collective, a: str, p: int, intra_hw: str, nsteps: int) -> float:
    rules = comm.rules
    nodes, ranks = comm.nodes, comm.ranks
    base, hw = rules.base_lat_us, rules.hw_lat_us
    lat = base[a][p]
    intra = hw[intra_hw].get(a, (0.0, 0.0, 0.0))[p]
    if rules.ll_intra_x18 and nodes > 1 and p == 0:
        intra *= 1.8
    ppn1_tree = (ranks == nodes and rules.ppn1_tree_net_latency) or a == "pat"  # ppn 1: the tree's network row
    inter = hw["net"]["tree" if ppn1_tree else a][p]
    if a == "ring":
        if collective in (Collective.REDUCE, Collective.BROADCAST):
            return lat + hw["net" if nodes > 1 else intra_hw]["ring"][p]  # same channels on every node
        overhead = NET_OVERHEAD_US * (3 if p == 2 else 1) if nodes > 1 and rules.net_overhead else 0.0
        intra = max(intra, overhead)
        if nodes == 1:
            inter_steps = 0
        elif rules.ring_steps_all_net:  # 2.6: every step at the network's hwLat
            inter_steps = nsteps
        elif collective is Collective.ALLREDUCE:
            inter_steps = 2 * nodes if rules.ring_inter_steps_all_nodes else 2 * (nodes - 1)
        else:
            inter_steps = nodes - 1
        return lat + (nsteps - inter_steps) * intra + inter_steps * inter
    if a == "tree":
        return lat + 2 * ((ranks // nodes - 1) * intra + _log2i(nodes) * inter)
    if a == "nvls":
        if rules.nvls_latency_base:
            return lat + (hw["net"]["nvls"][p] if nodes > 1 else 0.0)
        return intra + (inter if nodes > 1 else 0.0)
    if a == "nvlstree":
        if rules.nvls_latency_base:
            return lat + 2 * (nodes - 1) * hw["net"]["nvlstree"][p]
        return lat + intra + 2 * _log2i(nodes) * inter
    return 8 + _log2i(nodes) * (inter / 3.5) + ranks * 2.8  # pat


def algo_time_us(comm: Comm, collective: Collective, algorithm: str, protocol: str, nbytes: float) -> float | None:
    """NCCL's estimated time of one (algorithm, protocol) for ``nbytes`` (the
    whole buffer; for ReduceScatter/AllGather the full one), None if unavailable."""
    entry = cost_table(comm, collective).get((algorithm, protocol))
    if entry is None:
        return None
    return _entry_time_us(comm, collective, algorithm, protocol, entry, runtime_channels(comm), nbytes)


def _entry_time_us(comm: Comm, collective: Collective, algorithm: str, protocol: str, entry: tuple[float, float],
                   runtime_channels: int, nbytes: float) -> float:
    """:func:`algo_time_us` given the pair's ``(latency us, bandwidth GB/s)``
    entry of :func:`cost_table` and the communicator's channels
    (:func:`runtime_channels`)."""
    lat, bw = entry
    log_size = _log2i(int(nbytes) >> 6)
    if log_size < 0 and comm.rules.log2_of_zero_is_zero:
        log_size = 0
    rules = comm.rules
    correction = (rules.tree_correction or TREE_CORRECTION)[PROTOCOLS.index(protocol)]
    if algorithm == "tree" and collective is Collective.ALLREDUCE and 0 <= log_size < len(correction):
        bw *= correction[log_size]
    if algorithm == "ring" and protocol == "Simple" and comm.nodes > 1 and collective is Collective.ALLREDUCE and (
            rules.ring_plateau):
        if rules.plateau_bytes_per_rank is not None:  # before 2.18: x1.9 from nRanks / 16 x 65536 bytes
            if nbytes >= comm.ranks * rules.plateau_bytes_per_rank:
                lat *= 1.9
        elif int(nbytes) // (runtime_channels * comm.ranks) >= 64:
            lat *= 1.4 if comm.sm >= 80 else 1.9  # plateau effect of the ring (tuning.cc:570, comm->nChannels)
    return lat + nbytes / (1000 * bw)


# NCCL's data types (ncclDataType_t names, and the synonyms nccl-tests and the runtime print) and reductions
DTYPES = {"int8": "int8", "char": "int8", "uint8": "uint8", "int32": "int32", "int": "int32", "uint32": "uint32",
          "int64": "int64", "uint64": "uint64", "float16": "float16", "half": "float16", "float32": "float32",
          "float": "float32", "float64": "float64", "double": "float64", "bfloat16": "bfloat16",
          "float8e4m3": "float8e4m3", "float8e5m2": "float8e5m2"}
REDUCTIONS = ("sum", "prod", "max", "min", "avg")


def nvls_supported(dtype: str, op: str) -> bool:
    """src/include/device.h ``ncclNvlsSupported``: NVLink SHARP reduces sums and
    min/max of 16-, 32- and 64-bit integers and 16-bit floats, and sums of 32-
    and 64-bit floats; nothing of 8-bit types, and no average (NCCL runs it as a
    pre-multiplied sum or a sum divided after)."""
    if dtype in ("int32", "uint32", "int64", "uint64", "float16", "bfloat16"):
        return op in ("sum", "max", "min")
    return dtype in ("float32", "float64") and op == "sum"


@memoised(maxsize=65536)
def choose(comm: Comm, collective: Collective, nbytes: float, allowed: tuple[str, ...] | None = None,
           dtype: str = "float32", op: str = "sum", protocols: tuple[str, ...] | None = None) -> PredictedChoice:
    """The (algorithm, protocol) of least estimated time, as ``topoGetAlgoInfo``
    picks it (table order on ties). ``allowed`` restricts the algorithms like
    ``NCCL_ALGO``; if none of them exists for this collective and communicator,
    the ring runs (a forced tree for ReduceScatter, NVLS on a PCIe node).
    ``protocols`` restricts the protocols like ``NCCL_PROTO`` (None: all).
    ``dtype`` and ``op`` (:data:`DTYPES`, :data:`REDUCTIONS`) take NVLS out
    where it cannot reduce them (:func:`nvls_supported`; an all-gather reduces
    nothing), PAT out of an averaging reduce-scatter, and, from NCCL 2.24 (2.27.7
    here), make rings the last resort for fp8 over more than 8 ranks
    (src/enqueue.cc: their estimates x 1024, "precision loss")."""
    dtype, op = call_type(dtype, op)
    best: PredictedChoice | None = None
    table = cost_table(comm, collective)
    channels = runtime_channels(comm) if table else 0
    nvls_ok = nvls_supported(dtype, op) or collective is Collective.ALLGATHER
    for (a, p), entry in table.items():
        if allowed is not None and a not in allowed:
            continue
        if protocols is not None and p not in protocols:
            continue
        if a in ("nvls", "nvlstree") and not nvls_ok:
            continue
        if a == "pat" and collective is Collective.REDUCESCATTER and op == "avg":
            continue
        t = _entry_time_us(comm, collective, a, p, entry, channels, nbytes)
        if (a == "ring" and dtype.startswith("float8") and comm.ranks > 8 and comm.rules.fp8_ring_penalty
                and t >= 0):
            t *= 1024.0
        if t >= 0 and (best is None or t < best.estimate_us):
            best = PredictedChoice(a, p, _graph_channels(comm, a), t)
    if best is None:
        if allowed is not None and allowed != ("ring",):
            return choose(comm, collective, nbytes, ("ring",), dtype, op, protocols)
        return PredictedChoice("ring", "Simple", 1, 0.0)  # one rank: nothing to do
    return best


def call_type(dtype: str, op: str) -> tuple[str, str]:
    """NCCL's names of a data type (any spelling of :data:`DTYPES`) and a
    reduction (:data:`REDUCTIONS`); SynthError naming the one NCCL lacks."""
    name = DTYPES.get(str(dtype).lower())
    op = str(op).lower()
    if name is None:
        raise SynthError(f"data type {dtype!r} is not one NCCL reduces; use one of {', '.join(sorted(set(DTYPES)))}")
    if op not in REDUCTIONS:
        raise SynthError(f"reduction {op!r} is not one of NCCL's: {', '.join(REDUCTIONS)}")
    return name, op


# src/include/comm.h: bytes per thread before NCCL adds threads and channels (LL, LL128, Simple); the ring's LL
# threshold is x ranks (tuning.cc); src/include/device.h: threads per channel
THREAD_THRESHOLDS = {"LL": 8, "LL128": 8, "Simple": 64}
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
PCI_BW = 12.0  # topo.h: a ring no faster than this (channels x speed) runs 256 Simple threads, not 512
WARP_SIZE = 32


@memoised(maxsize=65536)
def call_channels(comm: Comm, algorithm: str, protocol: str, nbytes: float) -> tuple[int, int]:
    """(channels the call runs on, the most it could): ``topoGetAlgoInfo``
    (src/enqueue.cc) starts from the communicator's channels
    (:func:`runtime_channels`; NVLS and NVLS Tree: the NVLS channels, never
    fewer) and, for the ring, the tree and PAT, drops one channel while
    ``nbytes < channels x threads x threshold`` (threads per channel:
    ``MAX_THREADS``, 256 for a ring Simple graph slower than PCI_BW;
    threshold: ``THREAD_THRESHOLDS``, the ring LL's x ranks), down to one. The
    same loop in every transcribed release."""
    full = runtime_channels(comm)
    if algorithm in ("nvls", "nvlstree"):
        nvls = nvls_graph(comm).channels or full
        return nvls, nvls
    threads = MAX_THREADS[protocol]
    if algorithm == "ring" and protocol == "Simple":
        ring = ring_graph(comm)
        threads = 256 if ring.bw_intra * ring.channels <= PCI_BW else 512
    threshold = THREAD_THRESHOLDS[protocol] * (comm.ranks if algorithm == "ring" and protocol == "LL" else 1)
    nc = full
    while nc >= 2 and nbytes < nc * threads * threshold:
        nc -= 1
    return nc, full


# SMs per GPU by compute capability x 10, each architecture's data-centre SXM part: V100 80 (NVIDIA Tesla V100 GPU
# Architecture whitepaper), A100 108 (NVIDIA A100 Tensor Core GPU Architecture whitepaper), H100 SXM5 132 (NVIDIA H100
# Tensor Core GPU Architecture whitepaper; the H800 the same: DeepSeek-V3, arXiv:2412.19437, Section 3.2.2)
SMS_BY_ARCH = {70: 80, 80: 108, 90: 132}
ASSUMED_SMS = 132  # any other compute capability: taken as Hopper's (no figure transcribed)


def kernel_ctas(comm: Comm, algorithm: str, protocol: str, nbytes: float) -> int:
    """The thread blocks (CTAs) of one call's kernel on each rank: one per
    channel it runs on (``grid = {nChannels}``, src/enqueue.cc:1539-1541 at
    v2.27.7-1). ``topoGetAlgoInfo`` (enqueue.cc:1831-1853) sets the channels:
    the communicator's NVLS channels for NVLS and NVLS Tree
    (:func:`nvls_channels`; enqueue.cc:1847), else :func:`call_channels`'s."""
    if algorithm in ("nvls", "nvlstree") and comm.nvls:
        return nvls_channels(comm)
    return call_channels(comm, algorithm, protocol, nbytes)[0]


def streaming_multiprocessors(topology: Topology) -> int:
    """The SMs of each of ``topology``'s devices, by their compute capability
    (:data:`SMS_BY_ARCH`; :data:`ASSUMED_SMS` for one not listed)."""
    return SMS_BY_ARCH.get(int(round(topology.compute_capability * 10)), ASSUMED_SMS)


def _graph_channels(comm: Comm, algorithm: str) -> int:
    ring = ring_graph(comm)
    if algorithm in ("nvls", "nvlstree"):
        return nvls_graph(comm).channels
    return ring.channels


# every (algorithm, protocol) pair the table can hold, in a fixed order (profiles list their keys in it)
NCCL_KEYS = tuple(f"{a}.{p}" for a in ("ring", "tree") for p in PROTOCOLS) + ("nvls.Simple", "nvlstree.Simple", "pat.Simple")
