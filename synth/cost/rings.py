"""What NCCL's topology search finds on a node's link graph
(:class:`~synth.linkgraph.NodeGraph`) for the members of a group: their paths,
the best ring, and how many rings of a speed fit.

NCCL builds a communicator's system from its own GPUs only
(src/graph/topo.cc:1396, peers on the same host) and drops the NVLinks to
GPUs outside it (topo.cc:586-591, ``if (remote)``), so a group sees only the
links among its members (:class:`Members`). The paths between two members
(src/graph/paths.cc:42-111, a breadth-first search) are: ``nvl``, a direct
NVLink (links x the per-link bandwidth); ``nvb``, one hop through a third
member over two NVLinks (paths.cc:70-71, 99; the best of them); ``pci``, the
PCIe/CPU path. The ring search (src/graph/search.cc ``ncclTopoCompute``,
:967-1160) tries per-channel speeds from a table, and at each speed the path
types from ``nvl`` upwards until rings fit; each ring channel takes the speed
from every link it crosses (``followPath``, :79-118). :func:`rings_at` counts
how many rings fit, by a bounded exhaustive search like NCCL's own (which
stops at a time budget, ``NCCL_SEARCH_TIMEOUT``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

from ..caches import memoised
from ..linkgraph import NodeGraph

PATH_TYPES = ("nvl", "nvb", "pci")  # NCCL's PATH_NVL, PATH_NVB and the PCIe/CPU paths (PIX ... SYS), in its order
SEARCH_BUDGET = 20000  # nodes of the packing search per (members, speed, type) before it keeps its best (NCCL: a timeout)


# ---------------------------------------------------------------- a group's view (NCCL's system of its GPUs)


@dataclass(frozen=True)
class Members:
    """The members of a group inside one node (``local``: GPU indices within the
    node, sorted, distinct) on ``graph``, as NCCL sees them: NVLinks at
    ``nvlink_GBps`` each (NCCL's per-link bandwidth for the architecture), only
    among members; paths and capacities in GB/s per direction."""

    graph: NodeGraph
    local: tuple[int, ...]
    nvlink_GBps: float

    def direct_GBps(self, a: int, b: int) -> float:
        """The NVLink bandwidth between members ``a`` and ``b`` (0 if none)."""
        return self.graph.links_between(a, b) * self.nvlink_GBps

    @cached_property
    def _paths(self) -> dict[tuple[int, int], tuple[int, tuple, float]]:
        """(a, b) -> (path type index, resources used, bandwidth) for member pairs."""
        out = {}
        for a, b in itertools.permutations(self.local, 2):
            if self.graph.kind == "nvswitch":
                out[a, b] = (0, (("nv", a, b),), math.inf)
                continue
            direct = self.direct_GBps(a, b)
            if direct > 0:
                out[a, b] = (0, (("nv", a, b),), direct)
                continue
            via = [(min(self.direct_GBps(a, c), self.direct_GBps(c, b)), -c) for c in self.local if c not in (a, b)]
            best = max(via, default=(0.0, 0))
            if best[0] > 0:  # NVB: the best one-hop path through another member (the lowest index on ties)
                c = -best[1]
                out[a, b] = (1, (("nv", a, c), ("nv", c, b)), best[0])
            else:
                out[a, b] = (2, (("out", a), ("in", b)), self.graph.pcie_GBps)
        return out

    def path(self, a: int, b: int) -> tuple[str, float]:
        """(path type, bandwidth GB/s) from member ``a`` to member ``b``."""
        kind, _, bw = self._paths[a, b]
        return PATH_TYPES[kind], bw

    def capacity_GBps(self, resource: tuple) -> float:
        if resource[0] == "nv":
            return self.direct_GBps(resource[1], resource[2])
        return self.graph.pcie_GBps or 0.0

    @cached_property
    def max_path_GBps(self) -> float:
        """NCCL's ``maxBw`` of a node without a network: the fastest path from a
        member to another (search.cc:19-28, :47-50)."""
        return max((bw for _, _, bw in self._paths.values()), default=0.0)

    @cached_property
    def total_GBps(self) -> float:
        """NCCL's ``totalBw``: over the members, the largest of a GPU's NVLink
        bandwidth to the other members and its PCIe link (search.cc:29-37,
        :51); ``pcie_GBps`` stands for the PCIe link."""
        pcie = self.graph.pcie_GBps or 0.0
        return max(max(pcie, sum(self.direct_GBps(a, b) for b in self.local if b != a)) for a in self.local)

    @cached_property
    def split_nvlink(self) -> bool:
        """Two NVLink domains not joined by NVLink (src/graph/paths.cc:929-960,
        ``ncclTopoSplitNvLink``): the ring search then wants two channels at
        least (search.cc:1024-1031)."""
        domain = {g: g for g in self.local}
        for i, g in enumerate(self.local):  # paths.cc's loop: a later GPU joins the domain of an earlier one
            for p in self.local[i + 1:]:
                if self.direct_GBps(g, p) > 0:
                    domain[p] = domain[g]
        sizes = [list(domain.values()).count(d) for d in set(domain.values())]
        return sum(1 for s in sizes if s > 1) == 2


def best_ring(members: Members) -> tuple[float, tuple[int, ...]]:
    """The best single ring through the members and its bandwidth: the largest,
    over the orders of the members (the first fixed), of the smallest bandwidth
    between consecutive members (a direct NVLink's links x rate, else the PCIe
    path's; no path through a third GPU). One member: (inf, (it,))."""
    local = members.local
    if len(local) < 2:
        return math.inf, local
    if members.graph.kind != "mesh":  # every pair alike
        return (math.inf if members.graph.kind == "nvswitch" else members.graph.pcie_GBps or 0.0), local
    best: tuple[float, tuple[int, ...]] = (-1.0, local)
    for rest in itertools.permutations(local[1:]):
        order = (local[0],) + rest
        bw = min(members.direct_GBps(a, b) or (members.graph.pcie_GBps or 0.0)
                 for a, b in zip(order, order[1:] + order[:1]))
        if bw > best[0]:
            best = (bw, order)
    return best


@memoised(maxsize=4096)
def rings_at(members: Members, speed: float, path_type: str, max_channels: int) -> int:
    """How many ring channels of ``speed`` GB/s fit at once through all the
    members, each hop on its path (:meth:`Members.path`) of a type no worse than
    ``path_type``, each channel taking ``speed`` from every link its hops cross
    (NCCL subtracts it, search.cc ``followPath``); at most ``max_channels``.
    Exhaustive over multisets of rings, up to :data:`SEARCH_BUDGET` search nodes
    (then the best found, as NCCL keeps its best at its timeout)."""
    local = members.local
    if len(local) < 2:
        return max_channels
    if members.graph.kind == "nvswitch":
        raise ValueError("rings_at: an NVSwitch node has the closed form of synth.cost.nccl")
    limit = PATH_TYPES.index(path_type)
    if members.graph.kind == "pcie":  # every hop on PCIe: each channel takes speed from every GPU's PCIe link
        return min(max_channels, int(((members.graph.pcie_GBps or 0.0) + 1e-3) // speed)) if limit == 2 else 0
    units: dict[tuple, int] = {}
    cycles: list[tuple[tuple, ...]] = []
    for rest in itertools.permutations(local[1:]):
        order = (local[0],) + rest
        used: list[tuple] = []
        ok = True
        for a, b in zip(order, order[1:] + order[:1]):
            kind, resources, _ = members._paths[a, b]
            if kind > limit:
                ok = False
                break
            used.extend(resources)
        if not ok:
            continue
        for r in used:
            if r not in units:
                units[r] = int((members.capacity_GBps(r) + 1e-3) // speed)  # search.cc rounds to 1e-3
        if all(used.count(r) <= units[r] for r in set(used)):
            cycles.append(tuple(used))
    if not cycles:
        return 0
    keys = sorted(units)
    index = {r: i for i, r in enumerate(keys)}
    vectors = []
    for used in cycles:
        v = [0] * len(keys)
        for r in used:
            v[index[r]] += 1
        vectors.append(tuple(v))
    vectors = sorted(set(vectors))
    # every ring leaves each member once: a member's outgoing units bound the channels
    out_of = {a: [index[r] for r in keys if r[1] == a and r[0] in ("nv", "out")] for a in local}
    bound = min(max_channels, min(sum(units[keys[i]] for i in out_of[a]) for a in local))
    best = 0
    budget = [SEARCH_BUDGET]

    def search(start: int, left: list[int], count: int) -> None:
        nonlocal best
        best = max(best, count)
        if best >= bound or budget[0] <= 0:
            return
        budget[0] -= 1
        room = min(sum(left[i] for i in out_of[a]) for a in local)
        if count + room <= best:
            return
        for j in range(start, len(vectors)):
            v = vectors[j]
            if all(x <= y for x, y in zip(v, left)):
                search(j, [y - x for x, y in zip(v, left)], count + 1)
                if best >= bound or budget[0] <= 0:
                    return

    search(0, [units[r] for r in keys], 0)
    return best


def rings_with_type(members: Members, speed: float, max_channels: int) -> tuple[int, str]:
    """The ring channels of ``speed`` that fit, on the first path type (from
    ``nvl`` up) where any fits, and that type (search.cc:1100-1104 raises
    ``typeIntra`` only while no ring is found); (0, "pci") if none."""
    for path_type in PATH_TYPES:
        n = rings_at(members, speed, path_type, max_channels)
        if n > 0:
            return n, path_type
    return 0, PATH_TYPES[-1]
