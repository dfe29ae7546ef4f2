"""Cluster topologies: a list of levels, outermost first, loaded from validated YAML.

A device is a leaf of the hierarchy; its id is its mixed-radix coordinate over the
level counts, the outermost level most significant. Each level also describes the
uplink from one element of that level to its parent's switch (the NIC of a node,
the NVLink port of a GPU). Units are in key names; GB = 1e9 bytes as in nccl-tests.

Required level keys: ``name``, ``count``, ``bandwidth_GBps`` (per direction and
port), ``latency_us``. Optional: ``ports`` (1), ``fabric`` (``switch`` or
``ring``), and what the NCCL model (:mod:`synth.cost.nccl`) needs to know about
the hardware the way NCCL's topology detection sees it:

* ``link``: the technology of the uplink, ``net`` (a NIC: an element of the
  innermost ``net`` level is what NCCL calls a node; ``ports`` = its NICs,
  ``bandwidth_GBps`` = per NIC), ``nvlink`` or ``pcie``. Default: ``net`` for every
  level but the innermost, ``nvlink`` for the innermost (:meth:`Topology.link`).
* ``nvlinks``: NVLinks per element (GPU), which NCCL multiplies by its per-link
  bandwidth for the GPU architecture; without it NCCL's view is ``bandwidth_GBps``.
  Only on an ``nvlink`` level.
* ``nvls``: ``true`` when the parent switch is an NVSwitch with NVLink SHARP
  (multicast and in-switch reduction: NCCL's NVLS algorithms). Only on an
  ``nvlink`` level with ``fabric: switch``. Default ``false``.
* ``compute_capability``: the devices' CUDA compute capability (8.0 A100, 9.0
  H100/H200, 10.0 B200/GB200), which selects NCCL's per-architecture tables.
  Only on the innermost level (the devices). Default 8.0.
* ``transport``: what carries a ``net`` level's traffic: ``ib`` (InfiniBand
  verbs), ``roce`` (RDMA over Converged Ethernet), ``efa``, ``efa2``, ``efa4`` (AWS's Elastic
  Fabric Adapter, SRD, by the generation AWS states per instance type: the
  first on p3dn, "EFAv1" on p4d and p4de, "EFAv2" on p5, "EFA v4" on
  p6-b200), ``tcp`` (NCCL's socket transport: data through host
  memory), ``tcpx`` (GCP's GPUDirect-TCPX: TCP whose payload the NIC writes to
  GPU memory, the receive path run by a host daemon) or ``tcpxo`` (GCP's
  GPUDirect-TCPXO, A3 Mega: the TCP path offloaded to the NIC). Only on
  a ``net`` level. The NCCL choice does not read it; the
  cost parameters shared across systems are per transport
  (:mod:`synth.cost.transfer`), since each network stack has its own latency.
  Not stated: priced as ``ib`` (:data:`DEFAULT_TRANSPORT`).
* ``gpus_per_nic``: how many GPUs share each NIC, i.e. the GPUs of one PCIe
  switch group (``nvidia-smi topo -m``: the GPUs ``PIX``/``PXB`` to a NIC); a
  group holds ``ports x gpus_per_nic / GPUs per node`` NICs, so 1 where every GPU
  has one NIC or more. Only on a ``net`` level. Not stated: the NICs spread
  evenly, ``max(1, GPUs per node // ports)``.
* ``pcie_gen`` and ``pcie_width``: the PCIe generation (1-6) and lane count
  (1, 2, 4, 8, 16) of each GPU's own link to its PCIe switch, which carries all
  of its GPUDirect RDMA traffic. Only on a ``net`` level. Not stated: Gen 5 x16.
  Per direction a lane carries (PCI-SIG's signalling rate and encoding): Gen 1
  2.5 GT/s 8b/10b = 0.25 GB/s, Gen 2 0.5, Gen 3 8 GT/s 128b/130b = 0.985, Gen 4
  1.969, Gen 5 3.938, Gen 6 64 GT/s FLIT 242/256 = 7.5625 (:data:`PCIE_LANE_GBPS`).
* ``nic_path``: the PCIe path between a GPU and its NIC, as ``nvidia-smi topo -m``
  and NCCL's topology name it: ``pix`` (one PCIe switch), ``pxb`` (several),
  ``p2c`` (through the CPU's C2C link: Grace), ``pxn`` (through another GPU over
  NVLink, NCCL's PXN), ``phb`` (the CPU's host bridge) or ``sys`` (across CPU
  sockets). Only on a ``net`` level; not stated: ``pxb`` or better, as in DGX
  nodes. NCCL turns LL128 off across nodes on paths worse than PXB (Hopper and
  newer: worse than PXN) (:func:`synth.cost.nccl.ll128_over_network`).
* ``graph``: the link graph among the GPUs of one node (:mod:`synth.linkgraph`):
  ``kind`` ``nvswitch``, ``mesh`` (point-to-point NVLinks: ``nvlinks`` maps GPU
  pairs ``A-B`` to their NVLink counts) or ``pcie``, and ``pcie_GBps``, what NCCL
  rates the path between two GPUs without NVLink. Only on the innermost level,
  directly below the node (``link: net``) level or alone; ``mesh`` and
  ``nvswitch`` need ``link: nvlink`` (``nvswitch`` also ``fabric: switch``),
  ``pcie`` needs ``link: pcie``. Without it a sub-group of a node gets the
  level's full bandwidth (today's model); with it a group sees only the links
  among its members, as NCCL's topology search does (:mod:`synth.cost.nccl`,
  :mod:`synth.cost.links`). Not part of :attr:`Topology.structure`.

:attr:`Topology.structure` is everything about a topology except the link
numbers (``bandwidth_GBps``, ``latency_us``), which a fitted profile replaces: a
profile is used only on a topology of the same structure.

An optional top-level ``device`` mapping describes one device (a leaf): its
``name``, usable ``memory_GiB`` (GiB = 2^30 bytes) and dense 16-bit tensor-core
``peak_TFLOPs``, with the ``source`` of the numbers. The job planner
(:mod:`synth.planner.configurations`) needs it; the reduction tools ignore it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from .documents import path_problem, read_yaml
from .errors import SynthError
from .linkgraph import NodeGraph, graph_from_dict
from .resources import topologies_dir
from .units import MAX_COUNT, bounded_int, shortened, shown_number

# the most devices a topology may have: twice the 131,072 GPUs the project is measured at (docs/performance.md);
# larger ones are refused at once with their count instead of running for minutes
MAX_DEVICES = 2**18
MAX_LEVELS = 64  # levels of a topology: real ones have 2-4

FABRICS = ("switch", "ring")
LINKS = ("net", "nvlink", "pcie")
TRANSPORTS = ("ib", "roce", "efa", "efa2", "efa4", "tcp", "tcpx", "tcpxo")  # of a net level (Level.transport)
DEFAULT_TRANSPORT = "ib"  # a net level that states none is priced as InfiniBand verbs
# GB/s per direction of one PCIe lane, by generation: signalling rate x encoding / 8 bits (PCI-SIG base specs:
# 8b/10b up to Gen 2, 128b/130b for Gen 3-5, Gen 6's FLIT mode carries 242 of every 256 bytes)
PCIE_LANE_GBPS = {1: 2.5 * 0.8 / 8, 2: 5.0 * 0.8 / 8, 3: 8.0 * 128 / 130 / 8, 4: 16.0 * 128 / 130 / 8,
                  5: 32.0 * 128 / 130 / 8, 6: 64.0 * 242 / 256 / 8}
PCIE_WIDTHS = (1, 2, 4, 8, 16)
DEFAULT_PCIE = (5, 16)  # Gen 5 x16: the GPU link of the H100, H200 and B200 generation
NIC_PATHS = ("pix", "pxb", "p2c", "pxn", "phb", "sys")  # of a net level (Level.nic_path), best first (NCCL's order)
DEFAULT_COMPUTE_CAPABILITY = 8.0
RESERVED_NAMES = ("root", "inside", "parallel", "master")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Level:
    """One level of the hierarchy and the uplink of each of its elements.

    ``fabric`` says how siblings of this level are connected under their parent:
    ``switch`` (any pair talks through the parent switch) or ``ring`` (a
    non-switched ring such as an NVLink ring, neighbours only).
    """

    name: str
    count: int
    bandwidth_GBps: float
    latency_us: float
    ports: int = 1
    fabric: str = "switch"
    link: str | None = None  # net, nvlink, pcie; None: the default for its position (Topology.link)
    nvlinks: int | None = None  # NVLinks per element, on an nvlink level
    nvls: bool = False  # the parent switch is an NVSwitch with NVLink SHARP
    compute_capability: float | None = None  # of the devices; innermost level only
    transport: str | None = None  # of a net level: one of TRANSPORTS (None: not stated)
    nic_path: str | None = None  # of a net level: the GPU-NIC path type (NIC_PATHS; None: not stated)
    gpus_per_nic: int | None = None  # of a net level: GPUs sharing each NIC (None: not stated)
    pcie_gen: int | None = None  # of a net level: PCIe generation of each GPU's link (None: not stated)
    pcie_width: int | None = None  # of a net level: PCIe lanes of each GPU's link (None: not stated)
    graph: NodeGraph | None = None  # the link graph among the GPUs of a node (innermost level only)


@dataclass(frozen=True)
class NetworkPath:
    """What a ``net`` level's traffic goes through from each GPU, with the
    documented defaults filled in (:meth:`Topology.network_path`): the
    ``transport``, the GPUs per PCIe switch group (``gpus_per_nic``), the NICs of
    such a group, and the GPU's own PCIe link (``pcie_GBps`` per direction).
    ``defaulted``: the keys the file did not state."""

    transport: str
    gpus_per_nic: int
    nics_per_group: float
    pcie_gen: int
    pcie_width: int
    defaulted: tuple[str, ...] = ()

    @property
    def pcie_GBps(self) -> float:
        return PCIE_LANE_GBPS[self.pcie_gen] * self.pcie_width


@dataclass(frozen=True)
class Device:
    """One device of the topology, for the job planner: usable memory in GiB
    (2^30 bytes) and dense 16-bit (bf16/fp16) tensor-core peak in TFLOP/s, not
    the sparsity figure; ``source`` says where the numbers come from.
    ``memory_bandwidth_GBps``: the datasheet's device-memory (HBM) bandwidth in
    GB/s (10^9 bytes), optional; only the efficiency curve's pricing of an
    unfused attention's score passes uses it (:mod:`synth.planner.scores`)."""

    name: str
    memory_GiB: float
    peak_TFLOPs: float
    source: str = ""
    memory_bandwidth_GBps: float | None = None

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * 2**30

    @property
    def peak_flops(self) -> float:
        """Peak in FLOP/s."""
        return self.peak_TFLOPs * 1e12

    @property
    def memory_bandwidth_Bps(self) -> float | None:
        """Device-memory bandwidth in bytes/s, None where not given."""
        return None if self.memory_bandwidth_GBps is None else self.memory_bandwidth_GBps * 1e9

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "memory_GiB": self.memory_GiB, "peak_TFLOPs": self.peak_TFLOPs}
        if self.memory_bandwidth_GBps is not None:
            out["memory_bandwidth_GBps"] = self.memory_bandwidth_GBps
        out["source"] = self.source
        return out


@dataclass(frozen=True)
class Topology:
    name: str
    levels: tuple[Level, ...]
    description: str = ""
    device: Device | None = None

    def __hash__(self) -> int:  # computed once: topologies key the cost model's caches
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.name, self.levels, self.description))

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(level.count for level in self.levels)

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(level.name for level in self.levels)

    @property
    def num_devices(self) -> int:
        return math.prod(self.counts)

    def link(self, level: int) -> str:
        """The uplink technology of ``level`` (its ``link``, else ``net`` above the
        innermost level and ``nvlink`` for the innermost)."""
        given = self.levels[level].link
        if given is not None:
            return given
        return "nvlink" if level == len(self.levels) - 1 else "net"

    def network_path(self, level: int) -> NetworkPath | None:
        """The GPU-to-network path of ``level`` (None unless its link is ``net``),
        defaults filled in: transport :data:`DEFAULT_TRANSPORT`, ``gpus_per_nic``
        ``max(1, GPUs per element // ports)``, PCIe :data:`DEFAULT_PCIE`."""
        if self.link(level) != "net":
            return None
        lv = self.levels[level]
        gpus = math.prod(self.counts[level + 1:])
        per_nic = lv.gpus_per_nic if lv.gpus_per_nic is not None else max(1, gpus // lv.ports)
        per_nic = min(per_nic, gpus)
        gen, width = (lv.pcie_gen or DEFAULT_PCIE[0]), (lv.pcie_width or DEFAULT_PCIE[1])
        defaulted = tuple(k for k in ("transport", "gpus_per_nic", "pcie_gen", "pcie_width") if getattr(lv, k) is None)
        return NetworkPath(lv.transport or DEFAULT_TRANSPORT, per_nic, lv.ports * per_nic / gpus, gen, width, defaulted)

    @property
    def notes(self) -> tuple[str, ...]:
        """One line per ``net`` level that leaves part of its GPU-to-network path
        unstated: which defaults price it (docs/model.md)."""
        out = []
        for i, lv in enumerate(self.levels):
            path = self.network_path(i)
            if path is not None and path.defaulted:
                shown = ", ".join(f"{k} {getattr(path, k)}" for k in path.defaulted)
                out.append(f"level {lv.name} states no {', '.join(path.defaulted)}: priced with {shown} "
                           f"(the defaults of docs/model.md)")
        return tuple(out)

    @property
    def compute_capability(self) -> float:
        """The devices' CUDA compute capability (default 8.0)."""
        given = self.levels[-1].compute_capability
        return DEFAULT_COMPUTE_CAPABILITY if given is None else given

    @property
    def structure(self) -> tuple:
        """Everything but the link numbers: per level its name, count, ports,
        fabric, link, nvlinks, nvls, and the devices' compute capability. A fitted
        profile applies only to a topology of the same structure."""
        return tuple(
            (lv.name, lv.count, lv.ports, lv.fabric, self.link(i), lv.nvlinks, lv.nvls) for i, lv in enumerate(self.levels)
        ) + (("compute_capability", self.compute_capability),)

    def describe_structure(self) -> str:
        """The structure in words (:func:`describe_structure`)."""
        return describe_structure(self.structure)

    def level_index(self, name: str) -> int:
        try:
            return self.level_names.index(name)
        except ValueError:
            raise SynthError(
                f"unknown level '{name}'; topology '{self.name}' has levels "
                f"{', '.join(self.level_names)}"
            ) from None

    def scaled(self, counts: Mapping[str, int]) -> "Topology":
        """A copy with some level counts overridden (``--scale node=2``)."""
        levels = list(self.levels)
        for name, count in counts.items():
            i = self.level_index(name)
            if count < 1:
                raise SynthError(f"--scale {name}={count}: a level count must be >= 1")
            levels[i] = replace(levels[i], count=count)
        scaled = replace(self, levels=tuple(levels))
        check_device_count(scaled, "--scale")
        return scaled

    def to_dict(self) -> dict[str, Any]:
        """The topology as its file states it (optional NCCL keys only when given)."""
        doc = {
            "name": self.name,
            "description": self.description,
            "levels": [_level_dict(lv) for lv in self.levels],
        }
        if self.device is not None:
            doc["device"] = self.device.to_dict()
        if self.notes:
            doc["notes"] = list(self.notes)  # derived; a loader reads past them
        return doc


def describe_structure(structure: tuple) -> str:
    """A :attr:`Topology.structure` in words: ``node x2 (net) > rank x4 (nvlink),
    compute capability 8``, with ports, fabric, nvlinks and nvls where they matter."""
    parts = []
    for name, count, ports, fabric, link, nvlinks, nvls in structure[:-1]:
        extra = [f"ports {ports}"] if ports != 1 else []
        extra += [] if fabric == "switch" else [fabric]
        extra += [link] + ([f"{nvlinks} nvlinks"] if nvlinks else []) + (["nvls"] if nvls else [])
        parts.append(f"{name} x{count} ({', '.join(extra)})")
    return " > ".join(parts) + f", compute capability {structure[-1][1]:g}"


def _level_dict(lv: Level) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": lv.name,
        "count": lv.count,
        "bandwidth_GBps": lv.bandwidth_GBps,
        "latency_us": lv.latency_us,
        "ports": lv.ports,
        "fabric": lv.fabric,
    }
    for key in ("link", "nvlinks", "compute_capability", "transport", "nic_path", "gpus_per_nic", "pcie_gen",
                "pcie_width"):
        if getattr(lv, key) is not None:
            out[key] = getattr(lv, key)
    if lv.graph is not None:
        out["graph"] = lv.graph.to_dict()
    if lv.nvls:
        out["nvls"] = True
    return out


_LEVEL_FIELDS: dict[str, tuple[type, bool, str]] = {
    # key: (type, required, example for the fix)
    "name": (str, True, "name: node"),
    "count": (int, True, "count: 4"),
    "bandwidth_GBps": (float, True, "bandwidth_GBps: 25.0"),
    "latency_us": (float, True, "latency_us: 5.0"),
    "ports": (int, False, "ports: 1"),
    "fabric": (str, False, "fabric: switch"),
    "link": (str, False, "link: nvlink"),
    "nvlinks": (int, False, "nvlinks: 18"),
    "nvls": (bool, False, "nvls: true"),
    "compute_capability": (float, False, "compute_capability: 9.0"),
    "transport": (str, False, "transport: ib"),
    "nic_path": (str, False, "nic_path: pxb"),
    "gpus_per_nic": (int, False, "gpus_per_nic: 2"),
    "pcie_gen": (int, False, "pcie_gen: 5"),
    "pcie_width": (int, False, "pcie_width: 16"),
    "graph": (dict, False, "graph: {kind: mesh, pcie_GBps: 10.0, nvlinks: {0-1: 2}}"),
}
_TOP_FIELDS = ("name", "description", "levels", "device", "notes")  # notes: Topology.notes, derived (not read)
_DEVICE_FIELDS: dict[str, tuple[type, bool, str]] = {
    "name": (str, True, "name: NVIDIA A100 80GB SXM4"),
    "memory_GiB": (float, True, "memory_GiB: 80.0"),
    "peak_TFLOPs": (float, True, "peak_TFLOPs: 312"),
    "memory_bandwidth_GBps": (float, False, "memory_bandwidth_GBps: 2039"),
    "source": (str, False, "source: NVIDIA A100 datasheet"),
}


def _check_type(where: str, key: str, value: Any, kind: type, example: str) -> Any:
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        what = {float: "a number", int: "an integer", bool: "true or false"}.get(kind, "a string")
        raise SynthError(f"{where}: field '{key}' must be {what}, got {value!r}; write e.g. '{example}'")
    return value


def topology_from_dict(data: Any, source: str) -> Topology:
    """Build and validate a topology; errors name ``source``, the field and the fix."""
    if not isinstance(data, dict):
        raise SynthError(f"{source}: expected a mapping with keys {', '.join(_TOP_FIELDS)}")
    for key in data:
        if key not in _TOP_FIELDS:
            raise SynthError(
                f"{source}: unknown key '{key}' at top level; allowed keys are {', '.join(_TOP_FIELDS)}"
            )
    raw_levels = data.get("levels")
    if not isinstance(raw_levels, list) or not raw_levels:
        raise SynthError(f"{source}: 'levels' must be a non-empty list of levels, outermost first")
    if len(raw_levels) > MAX_LEVELS:  # before each level is checked: a list of 500,000 is refused at once
        raise SynthError(f"{source}: 'levels' holds {len(raw_levels):,} levels; at most {MAX_LEVELS} (real topologies "
                         "have 2 to 4)")
    levels = []
    for i, raw in enumerate(raw_levels):
        where = f"{source}: levels[{i}]"
        if not isinstance(raw, dict):
            raise SynthError(f"{where}: expected a mapping with keys {', '.join(_LEVEL_FIELDS)}")
        if isinstance(raw.get("name"), str):
            where += f" ({raw['name']})"
        fields = {}
        for key, value in raw.items():
            if key not in _LEVEL_FIELDS:
                raise SynthError(
                    f"{where}: unknown key '{key}'; allowed keys are {', '.join(_LEVEL_FIELDS)}"
                )
            kind, _, example = _LEVEL_FIELDS[key]
            fields[key] = value if key == "graph" else _check_type(where, key, value, kind, example)
        for key, (_, required, example) in _LEVEL_FIELDS.items():
            if required and key not in fields:
                raise SynthError(f"{where}: missing field '{key}'; add e.g. '{example}'")
        name = fields["name"]
        if not _NAME.match(name) or name in RESERVED_NAMES:
            raise SynthError(
                f"{where}: level name '{name}' must be an identifier other than "
                f"{', '.join(RESERVED_NAMES)}"
            )
        if fields["count"] < 1:
            raise SynthError(f"{where}: 'count' must be >= 1, got {fields['count']}")
        if fields["count"] > MAX_COUNT:
            raise SynthError(f"{where}: 'count' must be at most {MAX_COUNT:,}, got {shown_number(str(fields['count']))}")
        for key in ("bandwidth_GBps", "latency_us"):
            if not math.isfinite(fields[key]):
                raise SynthError(f"{where}: '{key}' must be a finite number, got {fields[key]}")
        if fields["bandwidth_GBps"] <= 0:
            raise SynthError(f"{where}: 'bandwidth_GBps' must be > 0, got {fields['bandwidth_GBps']}")
        if fields["latency_us"] < 0:
            raise SynthError(f"{where}: 'latency_us' must be >= 0, got {fields['latency_us']}")
        if fields.get("ports", 1) < 1:
            raise SynthError(f"{where}: 'ports' must be >= 1, got {fields['ports']}")
        if fields.get("fabric", "switch") not in FABRICS:
            raise SynthError(
                f"{where}: 'fabric' must be one of {', '.join(FABRICS)}, got {fields['fabric']!r}"
            )
        _check_nccl_keys(where, fields, innermost=i == len(raw_levels) - 1)
        if "graph" in fields:
            if i != len(raw_levels) - 1:
                raise SynthError(f"{where}: 'graph' joins the GPUs of one node: give it on the innermost level")
            _check_graph_place(where, fields, levels)
            fields["graph"] = graph_from_dict(fields["graph"], where, fields["count"], fields.get("nvlinks"))
        levels.append(Level(**fields))
    names = [lv.name for lv in levels]
    for name in names:
        if names.count(name) > 1:
            raise SynthError(f"{source}: duplicate level name '{name}'; level names must be unique")
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise SynthError(f"{source}: 'name' must be a string")
    if not name.strip() or not name.isprintable() or len(name) > 200:
        raise SynthError(f"{source}: 'name' must be non-empty printable text of at most 200 characters (no line "
                         f"breaks or control characters), got {shortened(ascii(name))}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SynthError(f"{source}: 'description' must be a string")
    device = _device_from_dict(data["device"], f"{source}: device") if "device" in data else None
    topology = Topology(name=name, levels=tuple(levels), description=description, device=device)
    check_device_count(topology, source)
    return topology


def check_device_count(topology: Topology, where: str) -> None:
    """SynthError unless ``topology`` has at most :data:`MAX_DEVICES` devices."""
    if topology.num_devices > MAX_DEVICES:
        raise SynthError(f"{where}: topology '{topology.name}' would have {topology.num_devices:,} devices "
                         f"({' x '.join(map(str, topology.counts))}); at most {MAX_DEVICES:,} are supported")


def _device_from_dict(raw: Any, where: str) -> Device:
    if not isinstance(raw, dict):
        raise SynthError(f"{where}: expected a mapping with keys {', '.join(_DEVICE_FIELDS)}")
    fields = {}
    for key, value in raw.items():
        if key not in _DEVICE_FIELDS:
            raise SynthError(f"{where}: unknown key '{key}'; allowed keys are {', '.join(_DEVICE_FIELDS)}")
        kind, _, example = _DEVICE_FIELDS[key]
        fields[key] = _check_type(where, key, value, kind, example)
    for key, (_, required, example) in _DEVICE_FIELDS.items():
        if required and key not in fields:
            raise SynthError(f"{where}: missing field '{key}'; add e.g. '{example}'")
    for key in ("memory_GiB", "peak_TFLOPs", "memory_bandwidth_GBps"):
        if key in fields and not (math.isfinite(fields[key]) and fields[key] > 0):
            raise SynthError(f"{where}: '{key}' must be a positive number, got {fields[key]}")
    return Device(**fields)


def _check_nccl_keys(where: str, fields: dict[str, Any], innermost: bool) -> None:
    """The optional keys of the NCCL model: values and where they may appear."""
    link = fields.get("link", "nvlink" if innermost else "net")
    if link not in LINKS:
        raise SynthError(f"{where}: 'link' must be one of {', '.join(LINKS)}, got {link!r}")
    if "nvlinks" in fields and (link != "nvlink" or fields["nvlinks"] < 1):
        raise SynthError(f"{where}: 'nvlinks' must be >= 1 and only on a level with link: nvlink")
    if fields.get("nvls") and (link != "nvlink" or fields.get("fabric", "switch") != "switch"):
        raise SynthError(f"{where}: 'nvls: true' needs link: nvlink and fabric: switch (an NVSwitch with NVLink SHARP)")
    if "transport" in fields and (link != "net" or fields["transport"] not in TRANSPORTS):
        raise SynthError(f"{where}: 'transport' must be one of {', '.join(TRANSPORTS)}, on a level with link: net; "
                         f"got {fields['transport']!r} on link: {link}")
    if "nic_path" in fields and (link != "net" or fields["nic_path"] not in NIC_PATHS):
        raise SynthError(f"{where}: 'nic_path' must be one of {', '.join(NIC_PATHS)} (the GPU-NIC path as nvidia-smi "
                         f"topo -m names it), on a level with link: net; got {fields['nic_path']!r} on link: {link}")
    for key, ok, allowed in (("gpus_per_nic", lambda v: v >= 1, "an integer >= 1"),
                             ("pcie_gen", lambda v: v in PCIE_LANE_GBPS, "a PCIe generation 1-6"),
                             ("pcie_width", lambda v: v in PCIE_WIDTHS, "a lane count 1, 2, 4, 8 or 16")):
        if key in fields and (link != "net" or not ok(fields[key])):
            raise SynthError(f"{where}: '{key}' must be {allowed}, on a level with link: net (the GPU's path to its "
                             f"NICs); got {fields[key]!r} on link: {link}")
    if "compute_capability" in fields:
        cc = fields["compute_capability"]
        if not innermost:
            raise SynthError(f"{where}: 'compute_capability' describes the devices: give it on the innermost level")
        if not (math.isfinite(cc) and 1.0 <= cc < 100.0):
            raise SynthError(f"{where}: 'compute_capability' must be a CUDA compute capability such as 9.0, got {cc}")


def _check_graph_place(where: str, fields: dict[str, Any], above: list[Level]) -> None:
    """Where a ``graph`` may be: the innermost level (checked by the caller's
    order: a later level makes this one not innermost), right below the
    innermost ``net`` level, with a link that matches its kind."""
    raw = fields["graph"]
    kind = raw.get("kind") if isinstance(raw, dict) else None
    link = fields.get("link", "nvlink")
    if above and (above[-1].link or "net") != "net":
        raise SynthError(f"{where}: 'graph' joins the GPUs of one node: give it on the level right below "
                         f"the node (link: net) level, not below '{above[-1].name}'")
    if kind in ("mesh", "nvswitch") and link != "nvlink":
        raise SynthError(f"{where}: graph kind {kind} joins GPUs by NVLink: it needs link: nvlink, got link: {link}")
    if kind == "pcie" and link != "pcie":
        raise SynthError(f"{where}: graph kind pcie joins GPUs by PCIe: it needs link: pcie, got link: {link}")
    if kind == "nvswitch" and fields.get("fabric", "switch") != "switch":
        raise SynthError(f"{where}: graph kind nvswitch needs fabric: switch, got fabric: {fields['fabric']}")


def resolve_topology_path(spec: str) -> Path:
    """A path, or the name of a shipped topology (``dgx-a100`` or ``dgx-a100.yaml``)."""
    path = Path(spec)
    if path.is_file():
        return path
    problem = path_problem(spec, "topology", "a topology YAML file (a path or a shipped name)")
    if problem:
        raise SynthError(problem)
    shipped = topologies_dir() / (spec if spec.endswith(".yaml") else spec + ".yaml")
    if shipped.is_file():
        return shipped
    known = ", ".join(sorted(p.stem for p in topologies_dir().glob("*.yaml")))
    raise SynthError(f"topology file '{spec}' not found; give a path or one of: {known}")


def load_topology(spec: str) -> Topology:
    """Load and validate a topology file (path or shipped name)."""
    path = resolve_topology_path(spec)
    data = read_yaml(path, "topology")
    return topology_from_dict(data, str(path))


def parse_device(spec: str, option: str = "--device") -> Device:
    """A device from ``name=H100,memory_GiB=80,peak_TFLOPs=989.4[,source=...]``
    (numbers as numbers, the rest as text); errors name the option and field."""
    raw: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SynthError(f"{option} '{item}': expected KEY=VALUE, e.g. {option} memory_GiB=80,peak_TFLOPs=312")
        key, value = key.strip(), value.strip()
        kind = _DEVICE_FIELDS.get(key, (str,))[0]
        if kind is float:
            try:
                raw[key] = float(value)
            except ValueError:
                raise SynthError(f"{option} {key}={value}: must be a number") from None
        else:
            raw[key] = value
    raw.setdefault("name", "device")
    raw.setdefault("source", f"given with {option}")
    return _device_from_dict(raw, option)


def parse_scale(spec: str) -> dict[str, int]:
    """Parse ``node=2,gpu=4`` into level-count overrides."""
    out: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise SynthError(f"--scale '{item}': expected LEVEL=COUNT, e.g. --scale node=2")
        if value.strip().startswith("-"):
            raise SynthError(f"--scale {item}: a level count must be >= 1")
        out[name.strip()] = bounded_int(value, f"--scale {name.strip()}=", MAX_COUNT, low=0)
    return out
