"""The per-operation compute model: seconds of one GEMM, one flash-attention
call or one memory-bound elementwise pass on one GPU, from its shape.

Every operation is timed as eager PyTorch dispatches it: ``max(floor_s,
gpu_s)``, the GPU time of its kernels or the fixed cost of issuing them,
whichever is longer (a small kernel finishes before the next one is issued).
The floors are the profile's fixed costs per kernel launch; they are fitted per
operation family because a cuBLAS call, a flash-attention call and an
elementwise op do not cost the same to issue.

GEMM ``C[M, N] = A[M, K] @ B[K, N]`` (``gpu_s``): the library splits C into
tiles of ``tm x tn`` and runs them on ``units`` streaming multiprocessors in
waves; a tile costs ``2 tm tn K`` FLOPs at ``rate_flops / units`` per unit.
When there are fewer tiles than units, K is split (split-K) over up to
``units / tiles`` units, never into pieces of fewer than ``split_k_min``.
The library is taken to pick the fastest of ``tiles`` (tile and wave
quantisation), and no GEMM runs faster than its bytes
``bytes_per_value (MK + KN + MN)`` over ``bandwidth_Bps`` (the memory roofline).

Attention (causal or not, flash-style): queries and keys in blocks of
``block`` rows; a (query block, key block) pair costs ``4 block^2 d`` FLOPs
forward (``Q K^T`` and ``P V``) and 2.5 times that backward (five products
instead of two); each query row costs ``row_blocks`` pairs more. Query rows
are spread over ``units``; the critical path is the larger of the pairs per
unit and the longest row.

Elementwise: ``seconds_per_element`` and a floor per named pass over bf16
elements (``add``, ``gelu_tanh``, ``silu_mul``, ``layer_norm``), a
bandwidth-bound cost; passes the calibration grid does not measure are priced in bytes over
the bandwidth that ``add`` (6 bytes per element: two reads, one write)
reaches.

Host issue (``HostModel``): eager PyTorch issues every kernel from the host,
one Python-level operation at a time; the host's seconds per kernel, forward
and backward (the autograd engine costs more per kernel), are fitted on whole
layers that the host bounds (their eager time well above the same work
replayed as a CUDA graph). A layer's phase then lasts at least its kernels
times that cost (:func:`synth.planner.layercompute.layer_compute`). Zero
means not modelled (a profile without whole-layer records, or a framework
that replays CUDA graphs).

All functions accept numpy arrays (the fit evaluates whole grids at once) and
plain numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..caches import memoised
from ..errors import SynthError

# bytes per element the ``add`` pass moves (reads x and y, writes the sum, bf16)
ADD_BYTES_PER_ELEMENT = 6
ELEMENTWISE_OPS = ("add", "gelu_tanh", "silu_mul", "layer_norm")
# attention backward: five block products (dV, dP, dS->dQ, dK and the recomputed S) against two forward
ATTENTION_BACKWARD_FLOPS_RATIO = 2.5


def _positive(value: Any, where: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise SynthError(f"compute profile: {where} must be a number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


def tiled_flops(m, k, n, units: int, tiles: tuple[tuple[int, int], ...], split_k_min: int):
    """The FLOPs a GEMM costs at its critical path, counted as if every unit
    ran it: ``waves x tile FLOPs x units`` for the best of ``tiles`` (split-K
    when there are fewer tiles than units). ``2 m k n`` when tiles and waves
    divide evenly; seconds = this / the device's sustained FLOP/s."""
    if all(isinstance(x, (int, float)) for x in (m, k, n)):  # one shape: the planner asks for the same ones often
        return np.float64(_tiled_flops_one(float(m), float(k), float(n), units, tiles, split_k_min))
    m, k, n = (np.asarray(x, dtype=float) for x in (m, k, n))
    best = np.full(np.broadcast(m, k, n).shape, np.inf)
    for tm, tn in tiles:
        count = np.ceil(m / tm) * np.ceil(n / tn)
        split = np.clip(np.floor(units / count), 1, np.maximum(1, np.floor(k / split_k_min)))
        waves = np.ceil(count * split / units)
        best = np.minimum(best, waves * 2 * tm * tn * np.ceil(k / split) * units)
    return best


@memoised(maxsize=1 << 14)
def _tiled_flops_one(m: float, k: float, n: float, units: int, tiles: tuple[tuple[int, int], ...],
                     split_k_min: int) -> float:
    """:func:`tiled_flops` of one shape in Python floats: the same operations
    in the same order, hence the same value as the array path."""
    best = math.inf
    for tm, tn in tiles:
        count = math.ceil(m / tm) * math.ceil(n / tn)
        split = min(max(math.floor(units / count), 1), max(1, math.floor(k / split_k_min)))
        waves = math.ceil(count * split / units)
        best = min(best, float(waves) * 2 * tm * tn * float(math.ceil(k / split)) * units)  # in float, in order
    return best


@dataclass(frozen=True)
class GemmModel:
    """Tile-and-wave GEMM timing (module docstring). ``rate_flops``: sustained
    FLOP/s of a full wave; ``floor_s``: the fixed cost of one GEMM call."""

    rate_flops: float
    units: int
    tiles: tuple[tuple[int, int], ...]
    split_k_min: int
    bandwidth_Bps: float
    floor_s: float
    bytes_per_value: int = 2

    def __post_init__(self) -> None:
        _positive(self.rate_flops, "gemm.rate_flops")
        _positive(self.bandwidth_Bps, "gemm.bandwidth_Bps")
        _positive(self.floor_s, "gemm.floor_s", allow_zero=True)
        for name in ("units", "split_k_min", "bytes_per_value"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SynthError(f"compute profile: gemm.{name} must be an integer >= 1, got {value!r}")
        if not self.tiles or any(len(t) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1
                                                    for x in t) for t in self.tiles):
            raise SynthError("compute profile: gemm.tiles must be a non-empty list of [rows, columns] integers >= 1")

    def gpu_s(self, m, k, n, rate_scale: float = 1.0, operand_bytes: int | None = None):
        """GPU seconds of ``C[m, n] = A[m, k] @ B[k, n]`` (no floor). FP8:
        the tiles run at ``rate_scale`` x ``rate_flops`` (its own sustained
        rate) and A and B take ``operand_bytes`` per value (1), C the
        profile's ``bytes_per_value``."""
        work = tiled_flops(m, k, n, self.units, self.tiles, self.split_k_min)
        m, k, n = (np.asarray(x, dtype=float) for x in (m, k, n))
        operand = self.bytes_per_value if operand_bytes is None else operand_bytes
        memory = (operand * (m * k + k * n) + self.bytes_per_value * m * n) / self.bandwidth_Bps
        return np.maximum(work / (self.rate_flops * rate_scale), memory)

    def seconds(self, m, k, n, rate_scale: float = 1.0, operand_bytes: int | None = None):
        """Seconds of one GEMM call: ``max(floor_s, gpu_s)``."""
        return np.maximum(self.floor_s, self.gpu_s(m, k, n, rate_scale, operand_bytes))

    def to_dict(self) -> dict[str, Any]:
        return {"rate_flops": self.rate_flops, "units": self.units, "tiles": [list(t) for t in self.tiles],
                "split_k_min": self.split_k_min, "bandwidth_Bps": self.bandwidth_Bps, "floor_s": self.floor_s,
                "bytes_per_value": self.bytes_per_value}


@dataclass(frozen=True)
class AttentionModel:
    """Block-level flash-attention timing (module docstring)."""

    forward_rate_flops: float
    backward_rate_flops: float
    units: int
    block: int
    row_blocks: float
    forward_floor_s: float
    backward_floor_s: float

    def __post_init__(self) -> None:
        _positive(self.row_blocks, "attention.row_blocks", allow_zero=True)
        _positive(self.forward_rate_flops, "attention.forward_rate_flops")
        _positive(self.backward_rate_flops, "attention.backward_rate_flops")
        _positive(self.forward_floor_s, "attention.forward_floor_s", allow_zero=True)
        _positive(self.backward_floor_s, "attention.backward_floor_s", allow_zero=True)
        for name in ("units", "block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SynthError(f"compute profile: attention.{name} must be an integer >= 1, got {value!r}")

    def critical_flops(self, batch, heads, seq, head_dim, causal: bool = True, keys=None):
        """Forward FLOPs on the critical path of one unit: the larger of the
        block pairs per unit and the longest query row, each query row costing
        ``row_blocks`` pairs more (loading Q, the softmax statistics, writing
        the output). ``keys``: a block of ``seq`` queries against ``keys``
        keys, every pair computed (a ring attention step between two chunks;
        ``causal`` does not apply); None: self-attention over ``seq``."""
        batch, heads, seq, head_dim = (np.asarray(x, dtype=float) for x in (batch, heads, seq, head_dim))
        blocks = np.ceil(seq / self.block)
        if keys is None:
            key_blocks = blocks
            pairs = (blocks * (blocks + 1) / 2 if causal else blocks * blocks) + self.row_blocks * blocks
        else:
            key_blocks = np.ceil(np.asarray(keys, dtype=float) / self.block)
            pairs = blocks * key_blocks + self.row_blocks * blocks
        critical = np.maximum(np.ceil(batch * heads * pairs / self.units), key_blocks + self.row_blocks)
        return critical * 4 * self.block * self.block * head_dim

    def forward_gpu_s(self, batch, heads, seq, head_dim, causal: bool = True, keys=None):
        return self.critical_flops(batch, heads, seq, head_dim, causal, keys) * self.units / self.forward_rate_flops

    def backward_gpu_s(self, batch, heads, seq, head_dim, causal: bool = True, keys=None):
        flops = self.critical_flops(batch, heads, seq, head_dim, causal, keys) * ATTENTION_BACKWARD_FLOPS_RATIO
        return flops * self.units / self.backward_rate_flops

    def forward_s(self, batch, heads, seq, head_dim, causal: bool = True):
        return np.maximum(self.forward_floor_s, self.forward_gpu_s(batch, heads, seq, head_dim, causal))

    def backward_s(self, batch, heads, seq, head_dim, causal: bool = True):
        return np.maximum(self.backward_floor_s, self.backward_gpu_s(batch, heads, seq, head_dim, causal))

    def to_dict(self) -> dict[str, Any]:
        return {"forward_rate_flops": self.forward_rate_flops, "backward_rate_flops": self.backward_rate_flops,
                "units": self.units, "block": self.block, "row_blocks": self.row_blocks, "forward_floor_s": self.forward_floor_s,
                "backward_floor_s": self.backward_floor_s}


@dataclass(frozen=True)
class ElementwisePass:
    """One measured bandwidth-bound pass: seconds per bf16 element and the
    fixed cost of issuing it (``silu_mul`` is two kernels in eager PyTorch)."""

    name: str
    seconds_per_element: float
    floor_s: float

    def __post_init__(self) -> None:
        _positive(self.seconds_per_element, f"elementwise.{self.name}.seconds_per_element")
        _positive(self.floor_s, f"elementwise.{self.name}.floor_s", allow_zero=True)

    def seconds(self, elements) -> Any:
        return np.maximum(self.floor_s, np.asarray(elements, dtype=float) * self.seconds_per_element)


@dataclass(frozen=True)
class ElementwiseModel:
    """The measured passes (each of ``ELEMENTWISE_OPS``), by name."""

    passes: tuple[ElementwisePass, ...]  # kept sorted by name: equal models compare equal

    def __post_init__(self) -> None:
        object.__setattr__(self, "passes", tuple(sorted(self.passes, key=lambda p: p.name)))
        names = [p.name for p in self.passes]
        for name in ELEMENTWISE_OPS:
            if name not in names:
                raise SynthError(f"compute profile: elementwise has no '{name}' pass "
                                 f"(needs {', '.join(ELEMENTWISE_OPS)})")

    def of(self, op: str) -> ElementwisePass:
        for p in self.passes:
            if p.name == op:
                return p
        raise SynthError(f"compute profile: no elementwise pass '{op}' (known: {', '.join(ELEMENTWISE_OPS)})")

    @property
    def bandwidth_Bps(self) -> float:
        """The memory bandwidth ``add`` reaches: 6 bytes per element."""
        return ADD_BYTES_PER_ELEMENT / self.of("add").seconds_per_element

    def seconds(self, op: str, elements) -> Any:
        return self.of(op).seconds(elements)

    def bytes_seconds(self, nbytes) -> Any:
        """One kernel moving ``nbytes`` at the ``add`` bandwidth, with ``add``'s floor."""
        return np.maximum(self.of("add").floor_s, np.asarray(nbytes, dtype=float) / self.bandwidth_Bps)

    def to_dict(self) -> dict[str, Any]:
        return {p.name: {"seconds_per_element": p.seconds_per_element, "floor_s": p.floor_s}
                for p in self.passes}


@dataclass(frozen=True)
class HostModel:
    """Seconds the host spends issuing one kernel of a layer in eager
    PyTorch, in the forward and in the backward (0: not modelled)."""

    forward_launch_s: float = 0.0
    backward_launch_s: float = 0.0

    def __post_init__(self) -> None:
        _positive(self.forward_launch_s, "host.forward_launch_s", allow_zero=True)
        _positive(self.backward_launch_s, "host.backward_launch_s", allow_zero=True)

    def launch_s(self, phase: str) -> float:
        return self.forward_launch_s if phase == "forward" else self.backward_launch_s

    def to_dict(self) -> dict[str, Any]:
        return {"forward_launch_s": self.forward_launch_s, "backward_launch_s": self.backward_launch_s}


@dataclass(frozen=True)
class OperationProfile:
    """A GPU's per-operation compute model (``synth-reduce/compute-profile``
    version 2). ``devices``: the device names it applies to (a topology's
    ``device.name``, nvidia-smi's name); ``micro_batch_s``: the fixed cost of
    one micro-batch (the backward call, the loss, the framework), 0 unless
    fitted on step records; ``host``: the host's cost of issuing a kernel
    (zero unless fitted on whole-layer records); ``fit``: how well it
    reproduces its own data."""

    name: str
    devices: tuple[str, ...]
    gemm: GemmModel
    attention: AttentionModel
    elementwise: ElementwiseModel
    micro_batch_s: float = 0.0
    source: str = ""
    fit: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    host: HostModel = HostModel()

    def __post_init__(self) -> None:
        _positive(self.micro_batch_s, "micro_batch_s", allow_zero=True)

    def applies_to(self, device_name: str) -> bool:
        return device_name.casefold() in (d.casefold() for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "devices": list(self.devices), "gemm": self.gemm.to_dict(),
                "attention": self.attention.to_dict(), "elementwise": self.elementwise.to_dict(),
                "micro_batch_s": self.micro_batch_s, "host": self.host.to_dict(), "source": self.source,
                "fit": self.fit}


def _section(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name)
    if not isinstance(value, dict):
        raise SynthError(f"compute profile: missing or malformed '{name}' object")
    return value


def _fields(section: dict[str, Any], where: str, names: tuple[str, ...]) -> dict[str, Any]:
    missing = [n for n in names if n not in section]
    if missing:
        raise SynthError(f"compute profile: '{where}' lacks {', '.join(missing)}")
    unknown = [n for n in section if n not in names]
    if unknown:
        raise SynthError(f"compute profile: '{where}' has unknown field(s) {', '.join(unknown)}")
    return {n: section[n] for n in names}


def operation_profile_from_dict(doc: dict[str, Any]) -> OperationProfile:
    """The profile a version-2 document holds; every field checked (SynthError
    naming the field otherwise)."""
    gemm = _fields(_section(doc, "gemm"), "gemm", ("rate_flops", "units", "tiles", "split_k_min", "bandwidth_Bps",
                                                   "floor_s", "bytes_per_value"))
    attention = _fields(_section(doc, "attention"), "attention",
                        ("forward_rate_flops", "backward_rate_flops", "units", "block", "row_blocks", "forward_floor_s",
                         "backward_floor_s"))
    passes = []
    for name, section in sorted(_section(doc, "elementwise").items()):
        if not isinstance(section, dict):
            raise SynthError(f"compute profile: elementwise.{name} must be an object")
        passes.append(ElementwisePass(name, **_fields(section, f"elementwise.{name}",
                                                      ("seconds_per_element", "floor_s"))))
    tiles = gemm["tiles"]
    if not isinstance(tiles, list) or not all(isinstance(t, list) for t in tiles):
        raise SynthError("compute profile: gemm.tiles must be a non-empty list of [rows, columns] integers >= 1")
    host = doc.get("host", {})  # optional: profiles written before it lack it
    if not isinstance(host, dict):
        raise SynthError("compute profile: 'host' must be an object (forward_launch_s, backward_launch_s)")
    host = _fields(host, "host", ("forward_launch_s", "backward_launch_s")) if host else {}
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices or not all(isinstance(d, str) and d for d in devices):
        raise SynthError("compute profile: 'devices' must be a non-empty list of device names")
    return OperationProfile(
        name=str(doc.get("name") or ""),
        devices=tuple(devices),
        gemm=GemmModel(gemm["rate_flops"], gemm["units"], tuple(tuple(t) for t in tiles), gemm["split_k_min"],
                       gemm["bandwidth_Bps"], gemm["floor_s"], gemm["bytes_per_value"]),
        attention=AttentionModel(**attention),
        elementwise=ElementwiseModel(tuple(passes)),
        micro_batch_s=doc.get("micro_batch_s", 0.0),
        source=str(doc.get("source") or ""),
        fit=dict(doc.get("fit") or {}),
        host=HostModel(**host),
    )


def at_memory_bandwidth(profile: OperationProfile, ratio: float, name: str, devices: tuple[str, ...],
                        source: str) -> OperationProfile:
    """``profile`` moved to a device whose memory bandwidth is ``ratio`` times
    its own (the ratio of the two devices' stated peaks, the measured device
    reaching the same fraction of its peak): every elementwise pass takes
    ``1 / ratio`` times its seconds per element, and the GEMM reads its
    operands at ``ratio`` times its bandwidth; the GEMM and attention rates,
    every floor and the host's cost are kept (a compute rate does not follow
    from a bandwidth). The fit statistics are dropped: they belong to the
    measured device."""
    if not ratio > 0:
        raise SynthError(f"bandwidth ratio {ratio}: give a positive number")
    passes = tuple(replace(p, seconds_per_element=p.seconds_per_element / ratio) for p in profile.elementwise.passes)
    return replace(profile, name=name, devices=devices, source=source, fit={},
                   gemm=replace(profile.gemm, bandwidth_Bps=profile.gemm.bandwidth_Bps * ratio),
                   elementwise=ElementwiseModel(passes))
