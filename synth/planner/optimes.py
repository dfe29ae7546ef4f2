"""The operations one device runs for a transformer, timed by a per-operation
profile (:mod:`synth.planner.operations`): one layer
(:mod:`synth.planner.layercompute`) and one pipeline stage's micro-batch
(:mod:`synth.planner.stagecompute`). This module holds the values they are
made of and the primitives that price them: one operation's seconds
(:class:`OpTime`), operations and their totals by phase
(:class:`ComputeTime`), what one device runs of a model (:class:`Shard`), a
GEMM with its two backward GEMMs (:func:`gemm_ops`, in FP8 at
:data:`FP8_GEMM_SPEEDUP` or DeepSeek-V3's block-scaled rate), an elementwise
pass at the profile's measured rate (:func:`pass_ops`) and one priced by the
bytes its kernels move (:func:`bytes_pass_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .fp8 import block_scaled_speedup
from .operations import GemmModel, OperationProfile

# FP8 GEMMs (``--dtype fp8``): FP8's sustained tile rate over BF16's on an H100, row-wise scaling
# included: the median of the three shapes of data/fp8_gemm_h100.jsonl (FBGEMM pull request #2546,
# H100 at 500 W: 585.23 -> 931.80, 575.12 -> 1024.09, 546.31 -> 876.66 TFLOP/s), large compute-bound
# shapes, so the ratio of their times is the ratio of the rates. That is FP8's own efficiency: 0.80
# of BF16's at its 2x peak (NVIDIA's H100 SXM datasheet: 3,958 FP8 TFLOP/s with sparsity, 1,979 dense,
# against 989.4 BF16). The per-operation model runs the tiles at this rate and reads the operands at
# one byte a value; a GEMM bound by the call's fixed cost gains nothing.
FP8_GEMM_SPEEDUP = 876.66 / 546.31
FP8_OPERAND_BYTES = 1  # an FP8 GEMM reads its two operands in FP8 (E4M3 or E5M2); it writes 16 bits


@dataclass(frozen=True)
class OpTime:
    """One operation of a layer or stage: its name, phase (``forward`` or
    ``backward``), the shape it runs at, how many times it runs (``count``,
    e.g. once per layer of a stage) and the seconds of all of them."""

    name: str
    phase: str
    shape: tuple[int, ...]
    seconds: float
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "phase": self.phase, "shape": list(self.shape), "count": self.count,
                "seconds": self.seconds}


@dataclass(frozen=True)
class ComputeTime:
    """Operations and their totals by phase."""

    ops: tuple[OpTime, ...]

    def phase_s(self, phase: str) -> float:
        return sum(op.seconds for op in self.ops if op.phase == phase)

    @property
    def forward_s(self) -> float:
        return self.phase_s("forward")

    @property
    def backward_s(self) -> float:
        return self.phase_s("backward")

    @cached_property  # asked for once per stage kind and schedule variant of every configuration
    def total_s(self) -> float:
        return sum(op.seconds for op in self.ops)

    def __add__(self, other: "ComputeTime") -> "ComputeTime":
        return ComputeTime(self.ops + other.ops)

    def times(self, count: int) -> "ComputeTime":
        """The same operations run ``count`` times each."""
        return ComputeTime(tuple(OpTime(op.name, op.phase, op.shape, op.seconds * count, op.count * count)
                                 for op in self.ops))


@dataclass(frozen=True)
class Shard:
    """What one device runs of a model: tensor-parallel size, micro-batch,
    sequence length, and whether the sequence is split over the
    tensor-parallel group outside its GEMMs and attention (sequence
    parallelism: norms and residual adds on ``s / tp`` of it)."""

    tp: int
    micro_batch: int
    seq: int
    sequence_parallel: bool = False
    ep: int = 1  # expert-parallel size: the device holds experts / ep of each MoE layer's routed experts
    fp8: bool = False  # the layers' GEMMs run in FP8 (FP8_GEMM_SPEEDUP); router and logits stay 16-bit
    cp: int = 1  # context-parallel size: the device holds seq / cp of each sequence
    fp8_blocks: bool = False  # with fp8: DeepSeek-V3's tile- and block-scaled GEMMs (synth.planner.fp8)

    @property
    def fp8_gemms(self) -> str:
        """How the layers' GEMMs run: ``""`` (16-bit), ``"rowwise"``
        (FP8_GEMM_SPEEDUP) or ``"blocks"`` (DeepSeek-V3's scaling,
        :func:`~synth.planner.fp8.block_scaled_speedup`, with its quantization
        passes, :func:`~synth.planner.layercompute.block_fp8_passes`)."""
        if not self.fp8:
            return ""
        return "blocks" if self.fp8_blocks else "rowwise"

    @property
    def replicated_tokens(self) -> int:
        """Tokens of the tensors every tensor-parallel rank holds whole
        without sequence parallelism (the norms' and residuals')."""
        return self.tokens // self.tp if self.sequence_parallel else self.tokens

    @property
    def tokens(self) -> int:
        """Tokens of a micro-batch on the device: ``b s / cp``."""
        return self.micro_batch * self.seq // self.cp


def gemm_rate(gemm: GemmModel, fp8: str) -> tuple[float, int | None]:
    """The rate multiplier over the profile's 16-bit GEMMs and the operand
    bytes per value (None: the profile's) of GEMMs run as ``fp8`` says
    (:attr:`Shard.fp8_gemms`)."""
    if not fp8:
        return 1.0, None
    return (block_scaled_speedup(gemm) if fp8 == "blocks" else FP8_GEMM_SPEEDUP), FP8_OPERAND_BYTES


def gemm_ops(profile: OperationProfile, name: str, m: int, k: int, n: int, fp8: str = "") -> list[OpTime]:
    """A GEMM ``(m, k, n)`` forward and its two backward GEMMs; ``fp8``
    (:attr:`Shard.fp8_gemms`): their tiles at FP8's sustained rate (``rowwise``:
    FP8_GEMM_SPEEDUP, ``blocks``: DeepSeek-V3's, x the profile's 16-bit rate,
    the same tiles and waves) and their operands one byte a value (the product
    stays 16-bit); a GEMM bound by the call's fixed cost gains nothing."""
    g = profile.gemm
    rate, operand = gemm_rate(g, fp8)
    return [OpTime(name, "forward", (m, k, n), float(g.seconds(m, k, n, rate, operand))),
            OpTime(f"{name}.dgrad", "backward", (m, n, k), float(g.seconds(m, n, k, rate, operand))),
            OpTime(f"{name}.wgrad", "backward", (k, m, n), float(g.seconds(k, m, n, rate, operand)))]


def pass_ops(profile: OperationProfile, name: str, op: str, elements: int, backward_factor: float) -> list[OpTime]:
    e = profile.elementwise
    forward = float(e.seconds(op, elements))
    ops = [OpTime(name, "forward", (elements,), forward)]
    if backward_factor:
        ops.append(OpTime(f"{name}.backward", "backward", (elements,),
                          float(e.seconds(op, backward_factor * elements))))
    return ops


def bytes_pass_ops(profile: OperationProfile, name: str, elements: int, per_element: tuple[int, int]) -> list[OpTime]:
    """An operation of ``elements`` values priced by the bytes its eager
    kernels move per value, (forward, backward), at the profile's ``add``
    bandwidth."""
    moved = profile.elementwise.bytes_seconds
    return [OpTime(name, "forward", (elements,), float(moved(per_element[0] * elements))),
            OpTime(f"{name}.backward", "backward", (elements,), float(moved(per_element[1] * elements)))]
