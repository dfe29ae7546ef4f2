"""DeepSeek-V3's FP8 training (``--dtype fp8 --framework deepseek``): what
its report (DeepSeek-AI 2024, arXiv:2412.19437) states about its FP8 GEMMs,
the passes around them and its FP8 communication, each a small term.

* **Which GEMMs** (Section 3.3.1): the three GEMMs of every linear layer,
  Fprop, Dgrad and Wgrad, run in FP8; the embedding, the output head, the MoE
  gating, the normalizations and the attention core keep BF16 or FP32. That
  is the split the planner already makes for ``--dtype fp8`` (the router and
  the logits GEMM stay 16-bit; :mod:`synth.planner.layercompute`,
  :mod:`synth.planner.stagecompute`).
* **Their rate** (Sections 3.3.2 and 3.5.2): the scaling is fine-grained, one
  scale per 1x128 tile of an activation (per token and 128 channels) and per
  128x128 block of a weight, and the tensor cores' partial sums are promoted to
  FP32 on the CUDA cores every N_C = 128 elements, multiplied there by the
  scales. The report says one warpgroup's promotion overlaps another's MMA,
  and (Section 3.5.2) that the data moving between tensor and CUDA cores still
  costs efficiency; it gives no rate. DeepSeek's FP8 GEMM library, DeepGEMM,
  states one: its first README (deepseek-ai/DeepGEMM, commit a6d97a1,
  2025-02-25, "Performance") times the FP8 GEMMs of DeepSeek-V3's (inference)
  shapes on an H800 with this scaling and promotion, and each row's speed-up
  over "our internally and carefully optimized implementation based on CUTLASS
  3.6", the kernels of that time (the report, December 2024, predates
  DeepGEMM). :data:`DEEPGEMM_H800` transcribes the rows of 4,096 tokens (a
  one-sequence micro-batch's) and the grouped GEMMs of the contiguous layout,
  which that README names for training forward passes; the earlier kernels'
  rate is each row's TFLOP/s over its speed-up.
  :func:`block_scaled_speedup` is the median over those rows of the profile's
  own BF16 time at the shape over that FP8 time: the same kind of ratio, at
  the same shapes, as the row-wise ``FP8_GEMM_SPEEDUP``.
* **Online quantization** (Section 3.5.2, "Support for Online Quantization"):
  before an FP8 GEMM its BF16 activation is read from memory,
  quantized and written back in FP8 with its scales (:func:`quantize_bytes`),
  then read again by the GEMM; and ("Support for Transposed GEMM Operations")
  the activations cached in 1x128 tiles are read back in the backward,
  dequantized, transposed, quantized again into 128x1 tiles and stored
  (:func:`requantize_transposed_bytes`) for the weight gradient, whose
  reduction runs over tokens. The output gradient feeds Dgrad in 1x128 tiles
  and Wgrad in 128x1 tiles: two quantizations of it. The weights' 128x128
  blocks serve their transpose too (Dgrad) without another pass; when the
  weights are quantized the report does not say (once per step, a few
  milliseconds of DeepSeek-V3's step), so that is not counted. The input of
  the linear after the attention is cached in E5M6, not FP8 (Section 3.3.3):
  counted as FP8, half a byte a value less.
* **FP8 communication** (Section 3.3.3, "Low-Precision Communication"): the
  activations before the MoE up-projections are quantized into FP8 before
  the dispatch, and so is the activation gradient before the MoE
  down-projections (the combine's backward); the forward combine and the
  dispatch's backward stay BF16 (:func:`moe_alltoall_bytes`). The dispatched
  tokens reach the experts already in FP8: their up-projection needs no
  quantization pass of its own, the sender quantizes each token once.

Scales are FP32 (DeepGEMM's Hopper kernels take FP32 scaling factors), one
per 128 values.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..caches import memoised
from .operations import GemmModel

SCALE_GROUP = 128  # values per scale: a 1x128 tile or a 128x128 block's row (Section 3.3.2)
SCALE_BYTES = 4  # one FP32 scale per group
BF16_BYTES, FP8_BYTES = 2, 1


@dataclass(frozen=True)
class DeepGemmRow:
    """One row of DeepGEMM's first performance table (H800, NVCC 12.8):
    ``groups`` GEMMs ``D[M, N] = A[M, K] @ B[N, K]^T`` in FP8 with DeepSeek-V3's
    scaling, at ``tflops``, ``speedup`` times the earlier CUTLASS-3.6-based
    kernels."""

    groups: int
    m: int
    n: int
    k: int
    tflops: float
    speedup: float

    @property
    def earlier_s(self) -> float:
        """Seconds of the row's GEMMs at the earlier kernels' rate (TFLOP/s
        over the speed-up)."""
        return 2 * self.groups * self.m * self.n * self.k / (self.tflops / self.speedup * 1e12)


# deepseek-ai/DeepGEMM README at a6d97a1 ("Performance", H800): the six "Normal GEMMs for dense models"
# rows at M = 4096 and the four "Grouped GEMMs for MoE models (contiguous layout)" rows (M per group)
DEEPGEMM_H800 = (
    DeepGemmRow(1, 4096, 2112, 7168, 1058, 1.1),
    DeepGemmRow(1, 4096, 24576, 1536, 990, 1.0),
    DeepGemmRow(1, 4096, 32768, 512, 590, 1.0),
    DeepGemmRow(1, 4096, 7168, 16384, 1358, 1.2),
    DeepGemmRow(1, 4096, 4096, 7168, 1304, 1.1),
    DeepGemmRow(1, 4096, 7168, 2048, 1025, 1.1),
    DeepGemmRow(4, 8192, 4096, 7168, 1297, 1.2),
    DeepGemmRow(4, 8192, 7168, 2048, 1099, 1.2),
    DeepGemmRow(8, 4096, 4096, 7168, 1288, 1.2),
    DeepGemmRow(8, 4096, 7168, 2048, 1093, 1.1),
)


@memoised(maxsize=64)
def block_scaled_speedup(gemm: GemmModel) -> float:
    """DeepSeek-V3's FP8 GEMMs' speed-up over ``gemm``'s BF16 ones: the
    median over :data:`DEEPGEMM_H800` of ``gemm``'s BF16 seconds at the row's
    shape (one call per group) over the row's seconds at the earlier kernels'
    rate (module docstring)."""
    return statistics.median(
        row.groups * float(gemm.gpu_s(row.m, row.k, row.n)) / row.earlier_s for row in DEEPGEMM_H800)


def scale_bytes(values: int) -> float:
    """Bytes of the FP32 scales of ``values`` values, one per 128."""
    return math.ceil(values / SCALE_GROUP) * SCALE_BYTES


def quantize_bytes(values: int) -> float:
    """Bytes one online quantization moves (Section 3.5.2): ``values`` BF16
    values read, written back in FP8 with their scales."""
    return values * (BF16_BYTES + FP8_BYTES) + scale_bytes(values)


def requantize_transposed_bytes(values: int) -> float:
    """Bytes of the backward's pass over a cached FP8 activation (Section
    3.5.2): read with its 1x128 scales, written transposed in 128x1 tiles with
    theirs."""
    return 2 * (values * FP8_BYTES + scale_bytes(values))


def moe_alltoall_bytes(bf16_bytes: int) -> tuple[float, float]:
    """An MoE layer's all-to-all payload per device in each pass, (FP8,
    BF16), for ``bf16_bytes`` sent in 16 bits: forward, the dispatch carries
    FP8 values and their scales and the combine BF16; backward, the combine's
    gradient FP8 and the dispatch's BF16 (Section 3.3.3). Each pass runs one
    all-to-all of each."""
    values = bf16_bytes // BF16_BYTES
    return values * FP8_BYTES + scale_bytes(values), float(bf16_bytes)
