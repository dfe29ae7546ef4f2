"""Activation memory of a transformer layer, and activation recomputation.

What one layer stores for its backward pass, per micro-batch and device, in
16-bit values, under tensor parallelism (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
Section 4): ``s b h (10 + 24/t + 5 a s / (h t))`` for GPT without sequence
parallelism, ``s b h (34 + 5 a s / h) / t`` with it (the 10 replicated bytes
split too); generalised to grouped-query attention and other MLP widths by the
same counting; the MLP's wide tensors are ``MLP_WIDE_VALUES`` x ``s b f``
values per MLP; multi-head latent attention keeps its queries, keys, values and
output at their own widths and, on every tensor-parallel rank, its two latents
before and after their norms (``4 s b (r_q + r_kv)``). Selective recomputation drops the ``5 a s^2 b / t`` attention
core; full recomputation keeps only the layer's input, ``2 s b h`` (``/ t``
with sequence parallelism).

:class:`ActivationCounts` is a part of
:class:`~synth.planner.transformer.Transformer` (a mixin): its methods read the
model's fields and widths (``seq``, ``hidden``, ``heads``, ``ffn``, ``mlp``,
``moe``, ``vocab``, ``q_dim``, ``kv_dim``) and own no state.
"""

from __future__ import annotations

import enum

from ..errors import SynthError


class Recompute(enum.Enum):
    """Activation recomputation: none, selective (the attention core, Korthikanti
    et al. 2022) or full (every layer's forward again in the backward pass)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"

    @classmethod
    def from_text(cls, text: str, option: str = "--recompute") -> "Recompute":
        for r in cls:
            if r.value == text:
                return r
        raise SynthError(f"{option} {text}: choose one of {', '.join(r.value for r in cls)}")


# 16-bit values of s b f each MLP keeps for its backward (Korthikanti et al. count GeLU's input and output,
# 4 bytes): GeLU keeps its input, the down GEMM its output (2 tensors); SwiGLU the gate-and-up output (2),
# the product the down GEMM reads (1); ReLU keeps only its output, which is the down GEMM's input (1);
# squared ReLU its ReLU output (which the square's backward reads too) and the square (2).
MLP_WIDE_VALUES = {"gelu": 2, "swiglu": 3, "relu": 1, "squared_relu": 2}


class ActivationCounts:
    """The activation bytes of a :class:`~synth.planner.transformer.Transformer`
    (a mixin; see the module docstring)."""

    def activation_bytes_per_layer(self, micro_batch: int, tp: int, recompute: Recompute,
                                   bytes_per_value: int = 2, scores: bool = True,
                                   sequence_parallel: bool = False, moe: bool = False, cp: int = 1) -> float:
        """Activation bytes one layer stores for one micro-batch on one device
        (Korthikanti et al. 2022, tensor parallelism, with or without sequence
        parallelism; ``bytes_per_value`` scales the 16-bit figure).
        ``scores``: the attention stores its s x s scores, softmax, dropout mask
        and output (``5 a s^2 b``: an unfused attention); a flash attention
        keeps none of them. ``sequence_parallel``: the tensors the layer would
        replicate on every tensor-parallel rank are split along the sequence
        (their eq. 4: ``s b h (34 + 5 a s / h) / t`` for a 4h MLP). ``moe``: an
        MoE layer, whose MLP tensors are those of the experts each token passes
        (routed, padded, and shared, each of ``expert_ffn``), plus the routed
        copies of its input (``2 s b h`` per routed pass) and the router's fp32
        probabilities (``4 s b E``), all split over tp. ``cp``: context
        parallelism holds ``s / cp`` of the sequence (and its queries' rows of
        the scores)."""
        s, b, h, f, kv = self.seq // cp, micro_batch, self.hidden, self.ffn, self.kv_dim
        scale = bytes_per_value / 2
        replicas = tp if sequence_parallel else 1  # what the replicated tensors are divided by
        if recompute is Recompute.FULL:
            return scale * 2 * s * b * h / replicas  # the layer's input only
        # replicated on every tensor-parallel rank: both norms' inputs (4), the
        # QKV and MLP inputs (2 + 2) and the two dropout masks (1 + 1 bytes); with
        # latent attention its latents, each its norm's input and the up-projection's
        # (the norm's output), which the down-projections compute on every rank
        replicated = 10 * s * b * h + 4 * s * b * self.latent_width
        # split over tp: Q, K, V, the attention output projection's input, the MLP's
        # wide tensors (MLP_WIDE_VALUES: GeLU in and out; gate, up and product for SwiGLU)
        if moe and self.moe:
            routed = self.moe.routed_per_token
            mlp = (2 * MLP_WIDE_VALUES[self.mlp] * s * b * (routed + self.moe.shared_experts) * self.moe.expert_ffn
                   + 2 * s * b * h * routed + 4 * s * b * self.moe.experts)
        else:
            mlp = 2 * MLP_WIDE_VALUES[self.mlp] * s * b * f
        # Q, K, V and the attention's output, which the output projection reads
        q, value, out = self.q_dim, self.value_dim, self.attention_output_dim
        split = 2 * s * b * q + 2 * s * b * kv + 2 * s * b * value + 2 * s * b * out + mlp
        if recompute is Recompute.NONE and scores:  # scores, softmax, dropout mask and output: 5 a s^2 b
            split += 5 * self.heads * s * self.seq * b
        return scale * (replicated / replicas + split / tp)

    def logits_bytes(self, micro_batch: int, tp: int, cp: int = 1) -> float:
        """The output layer's fp32 logits for one micro-batch (4 s b V / (t cp))."""
        return 4.0 * self.seq * micro_batch * self.vocab / (tp * cp)
