"""Training FLOPs of a transformer: forward, backward and recomputation.

Formulas (T = b s tokens; the matrices are the model's parameter counts,
:mod:`synth.planner.transformer`):

* forward FLOPs of one layer: ``2 T x (matrix parameters)`` + ``4 T s h``
  (attention scores and their product with V, counted over the full s x s as
  Megatron-LM does; with multi-head latent attention ``2 T s a (qk + v)``, its
  query-key and value heads' widths, and its five projections among the
  matrices); logits ``2 T h V``. An MoE layer multiplies by the
  matrices one token passes (its attention, the router and the experts it is
  routed to, padded by the capacity factor, plus the shared ones);
* a multi-token prediction module (``mtp_depth``): its block's, ``2 T x 2h^2``
  (the projection from 2h to h) and the shared head's logits ``2 T h V``;
* training (forward and backward) is 3x the forward; full recomputation adds
  one forward of every layer, selective recomputation the attention core
  ``4 T s h`` per layer. For GPT with f = 4h and no recomputation this is
  Megatron-LM's ``72 B s L h^2 (1 + s/(6h)) + 6 B s h V`` (Narayanan et al.
  2021), with full recomputation ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))``.

:class:`FlopCounts` is a part of
:class:`~synth.planner.transformer.Transformer` (a mixin): its methods read the
model's fields and parameter counts (``seq``, ``hidden``, ``vocab``,
``layers``, ``moe``, ``mtp_depth``, ``q_dim``, ``layer_matrix_params``,
``moe_layer_matrix_params``, ``moe_layers``) and own no state.
"""

from __future__ import annotations

from dataclasses import dataclass

from .activations import Recompute


@dataclass(frozen=True)
class Flops:
    """Training FLOPs of some samples: forward, backward (2x forward) and the
    forward work recomputation adds; ``weight_gradient`` is the part of the
    backward that computes weight gradients (one GEMM per forward GEMM, the
    same FLOPs; the attention core has no weights), what a zero-bubble
    schedule defers."""

    forward: float
    backward: float
    recompute: float
    weight_gradient: float = 0.0

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute

    @property
    def model(self) -> float:
        """The model's FLOPs without recomputation (3x the forward)."""
        return self.forward + self.backward


class FlopCounts:
    """The FLOPs of a :class:`~synth.planner.transformer.Transformer` (a mixin;
    see the module docstring)."""

    def layer_forward_flops(self, tokens: int) -> float:
        """Forward FLOPs of one dense layer for ``tokens`` = b s tokens."""
        return 2.0 * tokens * self.layer_matrix_params + self.attention_core_flops(tokens)

    def moe_layer_forward_flops(self, tokens: int) -> float:
        """Forward FLOPs of one MoE layer: its attention, router and the
        experts each token passes (:attr:`moe_layer_matrix_params`)."""
        return 2.0 * tokens * self.moe_layer_matrix_params + self.attention_core_flops(tokens)

    def layers_forward_flops(self, tokens: int, dense: int, moe: int) -> float:
        """Forward FLOPs of ``dense`` dense and ``moe`` MoE layers."""
        return dense * self.layer_forward_flops(tokens) + (moe * self.moe_layer_forward_flops(tokens) if moe else 0.0)

    def attention_core_flops(self, tokens: int) -> float:
        """Forward FLOPs of QK^T and (scores)V for ``tokens`` tokens: 4 T s q
        (q = heads x head_dim, :attr:`q_dim`); with latent attention ``2 T s
        (q + v)``, the scores over the queries' width q = heads x (qk_nope +
        qk_rope) and the product with the values over v = heads x v_head_dim
        (:attr:`value_dim`)."""
        if self.mla:
            return 2.0 * tokens * self.seq * (self.q_dim + self.value_dim)
        return 4.0 * tokens * self.seq * self.q_dim

    def logits_forward_flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.hidden * self.vocab

    def mtp_block_forward_flops(self, tokens: int) -> float:
        """Forward FLOPs of one MTP module's block (:attr:`mtp_block_params`)."""
        return self.moe_layer_forward_flops(tokens) if self.moe else self.layer_forward_flops(tokens)

    def mtp_forward_flops(self, tokens: int) -> float:
        """Forward FLOPs of the ``mtp_depth`` MTP modules: per module its
        block, its projection (``2 T x 2h x h``) and the shared head's logits
        (``2 T h V``); 0 without."""
        if not self.mtp_depth:
            return 0.0
        projection = 2.0 * tokens * 2 * self.hidden * self.hidden
        return self.mtp_depth * (self.mtp_block_forward_flops(tokens) + projection + self.logits_forward_flops(tokens))

    def training_flops(self, samples: int, recompute: Recompute = Recompute.NONE) -> Flops:
        """FLOPs of forward, backward and recomputation for ``samples``
        sequences, the MTP modules included (recomputation redoes their blocks
        as it does the layers)."""
        tokens = samples * self.seq
        layers = self.layers_forward_flops(tokens, self.layers - self.moe_layers, self.moe_layers)
        forward = layers + self.logits_forward_flops(tokens) + self.mtp_forward_flops(tokens)
        blocks = self.layers + self.mtp_depth  # the layers and the MTP modules' blocks
        extra = {Recompute.NONE: 0.0,
                 Recompute.FULL: layers + self.mtp_depth * self.mtp_block_forward_flops(tokens),
                 Recompute.SELECTIVE: blocks * self.attention_core_flops(tokens)}[recompute]
        weight_gradient = forward - blocks * self.attention_core_flops(tokens)  # every GEMM's weight gradient
        return Flops(forward, 2.0 * forward, extra, weight_gradient)

    def mtp_training_flops(self, samples: int, recompute: Recompute = Recompute.NONE) -> float:
        """Of :meth:`training_flops`' total, the MTP modules' (0 without)."""
        if not self.mtp_depth:
            return 0.0
        tokens = samples * self.seq
        block = self.mtp_depth * self.mtp_block_forward_flops(tokens)
        again = {Recompute.NONE: 0.0, Recompute.FULL: block,
                 Recompute.SELECTIVE: self.mtp_depth * self.attention_core_flops(tokens)}[recompute]
        return 3 * self.mtp_forward_flops(tokens) + again
