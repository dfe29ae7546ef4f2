"""The link graph inside a node: which GPU pairs have NVLinks (a value of the
topology description; what NCCL's topology search finds on it is
:mod:`synth.cost.rings`).

A topology's innermost level may carry a ``graph`` (:class:`NodeGraph`): how the
GPUs of one node (the siblings of that level) are joined. Kinds:

* ``nvswitch``: every GPU reaches every other through an NVSwitch at its full
  NVLink rate, whatever the group (the model without a graph);
* ``mesh``: point-to-point NVLinks, ``nvlinks`` lists the pairs and their link
  counts (the DGX-1's hybrid cube-mesh, ABCI's 4-GPU full mesh); a pair without
  NVLink goes over PCIe (and the CPUs' interconnect) at ``pcie_GBps``;
* ``pcie``: no NVLink, every pair at ``pcie_GBps``.

``pcie_GBps`` is the bandwidth NCCL gives the path between two GPUs without
NVLink: the smallest link on it (src/graph/topo.h: ``PCI_BW`` 12 for PCIe
Gen3 x16, the CPU interconnects ``BDW_QPI_BW`` 6, ``SKL_QPI_BW`` 10, ...).
An NVLink's bandwidth is NCCL's for the GPU architecture (the caller's
``nvlink_GBps``), as for a level's ``nvlinks``."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .errors import SynthError

KINDS = ("nvswitch", "mesh", "pcie")
MAX_MESH_GPUS = 8  # synth.cost.rings enumerates the (k-1)! rings of k members: 5,040 for 8
_PAIR = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_FIELDS = ("kind", "nvlinks", "pcie_GBps")
_FIX = "write e.g. 'graph: {kind: mesh, pcie_GBps: 10.0, nvlinks: {0-1: 2, 0-2: 1}}'"


@dataclass(frozen=True)
class NodeGraph:
    """How the ``gpus`` GPUs of one node are joined (see the module docstring).
    ``nvlinks``: ``(a, b, links)`` with ``a < b``, sorted, ``links >= 1``, GPU
    indices within the node (``0 .. gpus-1``); only for ``mesh``.
    ``pcie_GBps``: a path without NVLink, per direction (GB/s), > 0; needed by
    ``mesh`` and ``pcie``."""

    kind: str
    gpus: int
    nvlinks: tuple[tuple[int, int, int], ...] = ()
    pcie_GBps: float | None = None

    @cached_property
    def _table(self) -> dict[tuple[int, int], int]:
        table = {}
        for a, b, n in self.nvlinks:
            table[a, b] = table[b, a] = n
        return table

    def links_between(self, a: int, b: int) -> int:
        """NVLinks between GPUs ``a`` and ``b`` of the node (0 if none)."""
        return self._table.get((a, b), 0)

    def links_of(self, gpu: int) -> int:
        """All NVLinks of ``gpu`` (to the node's other GPUs)."""
        return sum(n for a, b, n in self.nvlinks if gpu in (a, b))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.nvlinks:
            out["nvlinks"] = {f"{a}-{b}": n for a, b, n in self.nvlinks}
        if self.pcie_GBps is not None:
            out["pcie_GBps"] = self.pcie_GBps
        return out


def graph_from_dict(raw: Any, where: str, gpus: int, nvlinks_per_gpu: int | None) -> NodeGraph:
    """A :class:`NodeGraph` for ``gpus`` GPUs from a level's ``graph`` mapping;
    SynthError naming ``where``, the field and the fix. ``nvlinks_per_gpu``: the
    level's ``nvlinks`` (each GPU's links in the graph may not exceed it)."""
    where = f"{where}: graph"
    if not isinstance(raw, dict):
        raise SynthError(f"{where}: expected a mapping with keys {', '.join(_FIELDS)}; {_FIX}")
    for key in raw:
        if key not in _FIELDS:
            raise SynthError(f"{where}: unknown key '{key}'; allowed keys are {', '.join(_FIELDS)}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise SynthError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    pcie = raw.get("pcie_GBps")
    if pcie is not None:
        if isinstance(pcie, bool) or not isinstance(pcie, (int, float)) or not math.isfinite(pcie) or pcie <= 0:
            raise SynthError(f"{where}: 'pcie_GBps' must be a positive number (GB/s of a GPU-to-GPU path without "
                             f"NVLink), got {pcie!r}; write e.g. 'pcie_GBps: 12.0'")
        pcie = float(pcie)
    if kind in ("mesh", "pcie") and pcie is None:
        raise SynthError(f"{where}: kind {kind} needs 'pcie_GBps' (the path between GPUs without NVLink); "
                         f"write e.g. 'pcie_GBps: 12.0'")
    if kind == "nvswitch" and pcie is not None:
        raise SynthError(f"{where}: kind nvswitch joins every pair by NVLink; remove 'pcie_GBps'")
    if "nvlinks" in raw and kind != "mesh":
        raise SynthError(f"{where}: 'nvlinks' lists the pairs of a mesh; use kind: mesh or remove 'nvlinks'")
    pairs: dict[tuple[int, int], int] = {}
    if kind == "mesh":
        if gpus > MAX_MESH_GPUS:
            raise SynthError(f"{where}: a mesh describes at most {MAX_MESH_GPUS} GPUs per node, the level has {gpus}")
        given = raw.get("nvlinks")
        if not isinstance(given, dict) or not given:
            raise SynthError(f"{where}: kind mesh needs 'nvlinks', a mapping of GPU pairs to NVLink counts; "
                             f"write e.g. 'nvlinks: {{0-1: 2, 0-2: 1}}'")
        for key, count in given.items():
            match = _PAIR.match(str(key))
            if match is None:
                raise SynthError(f"{where}: nvlinks key {key!r} is not a GPU pair; write it as 'A-B', e.g. '0-1: 2'")
            a, b = int(match.group(1)), int(match.group(2))
            for gpu in (a, b):
                if gpu >= gpus:
                    raise SynthError(f"{where}: nvlinks pair {a}-{b}: GPU {gpu} is not in the node "
                                     f"(GPUs 0-{gpus - 1}, the level's count)")
            if a == b:
                raise SynthError(f"{where}: nvlinks pair {a}-{b} joins a GPU to itself; list pairs of two GPUs")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise SynthError(f"{where}: nvlinks pair {a}-{b} must have a whole number of NVLinks >= 1, "
                                 f"got {count!r}; leave out pairs without NVLink")
            pair = (min(a, b), max(a, b))
            if pair in pairs and pairs[pair] != count:
                raise SynthError(f"{where}: nvlinks pair {a}-{b} has {count} links but {b}-{a} has {pairs[pair]}; "
                                 f"NVLinks join both ways: give the pair once")
            pairs[pair] = count
    graph = NodeGraph(kind, gpus, tuple(sorted((a, b, n) for (a, b), n in pairs.items())), pcie)
    if nvlinks_per_gpu is not None:
        for gpu in range(gpus):
            if graph.links_of(gpu) > nvlinks_per_gpu:
                raise SynthError(f"{where}: GPU {gpu} has {graph.links_of(gpu)} NVLinks in 'nvlinks' but the level "
                                 f"says nvlinks: {nvlinks_per_gpu}; correct one of them")
    return graph
