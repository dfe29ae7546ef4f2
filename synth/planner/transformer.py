"""Transformer models for the job planner: shape, parameters, FLOPs, activations.

A :class:`Transformer` is a decoder-only model as ``models/*.yaml`` describe it
(``data/README.md``): ``layers`` L, ``hidden`` h, ``heads`` a, ``seq`` s,
``vocab`` V, optionally ``ffn`` f (default 4h), ``kv_heads`` (grouped-query
attention; default a), ``mlp`` (``gelu``, ``swiglu``, ``relu`` or
``squared_relu``; ``gated_mlp: true`` is ``mlp: swiglu``), ``biases`` on the
linear layers, ``norm`` (``layernorm`` or ``rmsnorm``), ``positions``
(``learned`` or ``rotary``), ``tied_embeddings`` and ``mtp_depth`` (multi-token
prediction modules, default 0: :attr:`Transformer.mtp_depth`), ``dropout`` (the
training's dropout probability of the residual branches and the embedding, default
0; it changes the compute, not the FLOPs). It is loaded from a
shipped name (``gpt3-175b``), a YAML path, or inline text
(``layers=30,hidden=3072,heads=32,seq=2048,vocab=51200``).

The defaults follow two architecture families, told apart by the MLP:

* GPT (``mlp`` gelu, relu or squared_relu; gelu by default): biases on every
  linear layer, LayerNorm (weight and bias), learned position embeddings
  (s x h), an MLP of two matrices;
* Llama (``mlp: swiglu``): no biases, RMSNorm (weight only), rotary positions
  (no parameters), a SwiGLU MLP of three matrices (gate and up, then down).

Formulas (b = micro-batch, t = tensor-parallel size, kv = h x kv_heads / a):

* parameters per layer: ``h(h + 2kv) + h^2`` (q, k, v, o) ``+ m h f`` (MLP, m = 2
  or 3) + biases ``h + 2kv + h + (m - 1) f + h`` (with ``biases``) + norms
  ``4h`` (LayerNorm) or ``2h`` (RMSNorm); for GPT with f = 4h that is
  Megatron's ``12 h^2 + 13 h``;
* embeddings ``V h`` (+ ``s h`` learned positions), an untied output head
  ``V h``, a final norm ``2h`` (LayerNorm) or ``h`` (RMSNorm);
* a multi-token prediction module (``mtp_depth``, :class:`Transformer`):
  one layer of the model's kind, a ``2h x h`` projection and three norms
  (its two inputs', and the one before the shared head); forward FLOPs its
  layer's, ``2 T x 2h^2`` and the shared head's logits ``2 T h V``;
* forward FLOPs of one layer for T = b s tokens: ``2 T x (matrix parameters)``
  + ``4 T s h`` (attention scores and their product with V, counted over the
  full s x s as Megatron-LM does); logits ``2 T h V``. Training (forward and
  backward) is 3x the forward; full recomputation adds one forward of every
  layer, selective recomputation the attention core ``4 T s h`` per layer. For
  GPT with f = 4h and no recomputation this is Megatron-LM's
  ``72 B s L h^2 (1 + s/(6h)) + 6 B s h V`` (Narayanan et al. 2021), with full
  recomputation ``96 B s L h^2 (1 + s/(6h) + V/(16 L h))``;
* activations stored per layer and micro-batch, 16-bit, tensor parallelism
  (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", arXiv:2205.05198, Section 4):
  ``s b h (10 + 24/t + 5 a s / (h t))`` for GPT without sequence parallelism,
  ``s b h (34 + 5 a s / h) / t`` with it (the 10 replicated bytes split too);
  generalised below to GQA and other MLP widths by the same counting; the
  MLP's wide tensors are ``MLP_WIDE_VALUES`` x ``s b f`` values per MLP.
  Selective recomputation drops the ``5 a s^2 b / t`` attention core; full
  recomputation keeps only the layer's input, ``2 s b h`` (``/ t`` with
  sequence parallelism).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..documents import read_yaml
from ..errors import SynthError
from ..resources import models_dir
from ..units import MAX_COUNT, bounded_int, shown_number


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


# field -> (type, required); the files' other keys are informative
_INT_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "params", "head_dim",
               "core_head_dim", "train_batch_tokens")
_COUNT_FIELDS = ("mtp_depth",)  # integers that may be 0
_REQUIRED = ("layers", "hidden", "heads", "seq", "vocab")
_BOOL_FIELDS = ("gated_mlp", "biases", "tied_embeddings")
_TEXT_FIELDS = ("name", "description", "source", "source_inconsistency")
_FRACTION_FIELDS = ("dropout",)  # numbers from 0 to below 1
# architecture choices: field -> its values (the first of each is the GPT default, :func:`model_from_dict`)
_CHOICE_FIELDS = {"mlp": ("gelu", "swiglu", "relu", "squared_relu"), "norm": ("layernorm", "rmsnorm"),
                  "positions": ("learned", "rotary")}
# the moe: block's fields (inline: given flat, e.g. experts=8,top_k=2,expert_ffn=14336)
# the largest value of each model size: far above any model trained today (the largest have about 10^2 layers,
# 2.5 x 10^4 hidden, 10^2 heads, 2.6 x 10^5 vocabulary, 4 x 10^2 experts, 10^6-10^7 tokens of context), so that
# a typo of many digits is one error line, not a plan of "25 billion GiB per device"
MODEL_LIMITS = {"layers": 10_000, "hidden": 2**20, "heads": 2**16, "kv_heads": 2**16, "head_dim": 2**16,
                "core_head_dim": 2**16, "ffn": 2**22, "vocab": 2**24, "seq": 2**24, "params": 10**15,
                "train_batch_tokens": 10**15, "experts": 2**16, "top_k": 2**16, "expert_ffn": 2**22, "shared_experts": 2**16,
                "dense_layers": 10_000, "max_nodes": 2**16, "mtp_depth": 10_000}
MOE_FIELDS = ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "max_nodes", "capacity_factor")
INLINE_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "head_dim", "mlp", "gated_mlp",
                 "biases", "norm", "positions", "tied_embeddings", "mtp_depth", "dropout") + MOE_FIELDS
# 16-bit values of s b f each MLP keeps for its backward (Korthikanti et al. count GeLU's input and output,
# 4 bytes): GeLU keeps its input, the down GEMM its output (2 tensors); SwiGLU the gate-and-up output (2),
# the product the down GEMM reads (1); ReLU keeps only its output, which is the down GEMM's input (1);
# squared ReLU its ReLU output (which the square's backward reads too) and the square (2).
MLP_WIDE_VALUES = {"gelu": 2, "swiglu": 3, "relu": 1, "squared_relu": 2}


def family_defaults(mlp: str) -> dict[str, Any]:
    """The ``biases``, ``norm`` and ``positions`` a model with this MLP has
    unless its file says otherwise (module docstring): Llama's for SwiGLU,
    GPT's for the others."""
    gated = mlp == "swiglu"
    return {"biases": not gated, "norm": "rmsnorm" if gated else "layernorm",
            "positions": "rotary" if gated else "learned"}


@dataclass(frozen=True)
class MoE:
    """The mixture of experts of a model's MoE layers (``moe:`` in a model
    file): ``experts`` routed experts of which each token goes to ``top_k``,
    each an MLP of width ``expert_ffn`` (the model's ``mlp`` kind);
    ``shared_experts`` more of that width that every token goes through; the
    first ``dense_layers`` layers are dense (the model's ``ffn``);
    ``capacity_factor`` (None: dropless) pads every expert to ``capacity_factor
    x`` its even share of the tokens, which the experts then compute and the
    all-to-alls carry; ``max_nodes`` (0: not limited) is node-limited routing
    (DeepSeek-V3, arXiv:2412.19437 Sections 2.1.2 and 3.2.2): each token goes
    to experts on at most that many nodes, and is sent once to each node it
    reaches, then forwarded inside the node (:meth:`node_copies_per_token`)."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None
    max_nodes: int = 0

    @property
    def routed_per_token(self) -> float:
        """Expert passes per token: top_k, padded by the capacity factor."""
        return self.top_k * (self.capacity_factor or 1.0)

    def node_copies_per_token(self, nodes: int) -> float:
        """Copies of a token an expert-parallel group spanning ``nodes`` nodes
        sends in one all-to-all: without node-limited routing (or inside one
        node) one per routed expert (:attr:`routed_per_token`); with it, one
        per node reached, ``nodes (1 - (1 - 1 / nodes)^top_k)`` when the
        ``top_k`` experts fall on the nodes evenly, at most ``max_nodes``."""
        if not self.max_nodes or nodes <= 1:
            return self.routed_per_token
        return min(float(self.max_nodes), nodes * (1 - (1 - 1 / nodes) ** self.top_k))

    def to_dict(self) -> dict[str, Any]:
        return {"experts": self.experts, "top_k": self.top_k, "expert_ffn": self.expert_ffn,
                "shared_experts": self.shared_experts, "dense_layers": self.dense_layers,
                "capacity_factor": self.capacity_factor, **({"max_nodes": self.max_nodes} if self.max_nodes else {})}


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer (see the module docstring).

    ``mtp_depth`` D: D multi-token prediction modules (DeepSeek-AI 2024,
    arXiv:2412.19437 Section 2.2), the k-th predicting the token k + 1 ahead:
    the shared embedding of the shifted tokens and the previous depth's output,
    each RMS-normed, concatenated and projected from 2h to h, one transformer
    block of the model's kind (an MoE layer where the model has experts), and
    the shared output head with a loss of its own. They run on the last
    pipeline stage (Section 3.2.1: DeepSeek-V3 keeps the embedding and the
    output head on the same rank for them; Megatron-LM's ``mtp_on_this_rank``
    puts them on the last stage): their blocks count with that stage's layers
    (:func:`~synth.planner.training.stage_mix`), the rest with its head."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int
    kv_heads: int
    mlp: str = "gelu"
    biases: bool = True
    norm: str = "layernorm"
    positions: str = "learned"
    tied_embeddings: bool = True
    moe: MoE | None = None  # None: every layer dense
    head_dim: int | None = None  # the model file's head_dim where it gives one (None: hidden / heads)
    core_head_dim: int | None = None  # the attention core's head width where not head_dim's (latent attention)
    params_stated: int | None = None  # the count the source states (informative)
    mtp_depth: int = 0  # multi-token prediction modules on the last stage (:attr:`mtp_module_params`)
    dropout: float = 0.0  # training's dropout of the residual branches and the embedding (Megatron's --hidden-dropout)
    source: str = ""
    source_inconsistency: str | None = None

    # ------------------------------------------------------------ parameters

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU: a gated MLP of three matrices."""
        return self.mlp == "swiglu"

    @property
    def norm_params(self) -> int:
        """One norm's parameters: weight and bias (LayerNorm) or weight (RMSNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    @property
    def head_dimension(self) -> int:
        """One attention head's width: the model file's ``head_dim``, else
        hidden / heads."""
        return self.head_dim or self.hidden // self.heads

    @property
    def attention_head_dim(self) -> int:
        """The head width the attention core computes over: the model file's
        ``core_head_dim`` where its core differs from its projections (DeepSeek-V3's
        multi-head latent attention, approximated as ordinary heads whose
        projections are :attr:`head_dimension` wide), else :attr:`head_dimension`."""
        return self.core_head_dim or self.head_dimension

    @property
    def q_dim(self) -> int:
        """Width of the query projection, and of the attention output the
        output projection reads: heads x head_dim (the hidden width unless the
        model file gives a head_dim that differs; Megatron-LM's
        ``--kv-channels``)."""
        return self.heads * self.head_dimension

    @property
    def kv_dim(self) -> int:
        """Width of the key (and value) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dimension

    @property
    def mlp_matrices(self) -> int:
        """Matrices of one MLP: 3 for SwiGLU (gate, up, down), else 2."""
        return 3 if self.gated_mlp else 2

    @property
    def attention_matrix_params(self) -> int:
        """Q, K, V (hidden to q_dim + 2 kv_dim) and the output projection
        (q_dim to hidden)."""
        return sum(self.layer_gemm_params[:2])

    @property
    def attention_bias_params(self) -> int:
        """The biases of Q, K, V and of the output projection (0 without ``biases``)."""
        return (self.q_dim + 2 * self.kv_dim + self.hidden) if self.biases else 0

    def mlp_params(self, width: int) -> int:
        """One MLP of ``width``: its matrices and (with ``biases``) their biases."""
        h = self.hidden
        return self.mlp_matrices * h * width + (((self.mlp_matrices - 1) * width + h) if self.biases else 0)

    @property
    def layer_matrix_params(self) -> int:
        """The matrices of one dense layer (what its GEMMs multiply by)."""
        return self.attention_matrix_params + self.mlp_matrices * self.hidden * self.ffn

    # -------------------------------------------------- mixture of experts

    @property
    def moe_layers(self) -> int:
        """Layers with experts: all but the first ``dense_layers`` (0 without ``moe``)."""
        return self.layers - self.moe.dense_layers if self.moe else 0

    def layer_mix(self, start: int, count: int) -> tuple[int, int]:
        """``(dense, moe)``: how many of the layers ``start .. start + count - 1``
        (0 is the first) are dense and how many have experts."""
        dense_end = self.layers - self.moe_layers
        dense = max(0, min(start + count, dense_end) - start)
        return dense, count - dense

    @property
    def dense_layers(self) -> int:
        """The leading dense layers of an MoE model (0 without ``moe``: its layers are all alike)."""
        return self.moe.dense_layers if self.moe else 0

    @property
    def expert_params(self) -> int:
        """One expert (routed or shared)."""
        assert self.moe is not None
        return self.mlp_params(self.moe.expert_ffn)

    @property
    def moe_layer_routed_params(self) -> int:
        """The routed experts of one MoE layer: what expert parallelism shards."""
        return self.moe.experts * self.expert_params if self.moe else 0

    @property
    def moe_layer_params(self) -> int:
        """One MoE layer: attention, norms, router (h x experts), routed and
        shared experts."""
        assert self.moe is not None
        return (self.attention_matrix_params + self.attention_bias_params + 2 * self.norm_params
                + self.hidden * self.moe.experts + self.moe_layer_routed_params
                + self.moe.shared_experts * self.expert_params)

    @property
    def moe_layer_matrix_params(self) -> float:
        """The matrices one token's pass through an MoE layer multiplies by:
        attention, router, and ``top_k`` (padded by the capacity factor) plus
        ``shared_experts`` experts."""
        assert self.moe is not None
        experts = self.moe.routed_per_token + self.moe.shared_experts
        return (self.attention_matrix_params + self.hidden * self.moe.experts
                + experts * self.mlp_matrices * self.hidden * self.moe.expert_ffn)

    @property
    def layer_gemm_params(self) -> tuple[int, int, int, int]:
        """The matrices of a layer's four tensor-parallel GEMMs, in order:
        QKV, attention output projection, MLP up (with the gate when gated),
        MLP down. Their sum is :attr:`layer_matrix_params`."""
        h, f, q = self.hidden, self.ffn, self.q_dim
        return h * (q + 2 * self.kv_dim), q * h, (self.mlp_matrices - 1) * h * f, h * f

    @property
    def moe_layer_gemm_params(self) -> tuple[float, float, float, float]:
        """:attr:`layer_gemm_params` of an MoE layer per token: the experts a
        token passes (routed, padded, and shared) in place of the MLP."""
        assert self.moe is not None
        h, f, q = self.hidden, self.moe.expert_ffn, self.q_dim
        experts = self.moe.routed_per_token + self.moe.shared_experts
        return h * (q + 2 * self.kv_dim), q * h, experts * (self.mlp_matrices - 1) * h * f, experts * h * f

    @property
    def layer_params(self) -> int:
        """One dense layer: matrices, biases and norms."""
        return (self.attention_matrix_params + self.attention_bias_params + self.mlp_params(self.ffn)
                + 2 * self.norm_params)

    def layers_params(self, dense: int, moe: int) -> int:
        """``dense`` dense layers and ``moe`` MoE layers."""
        return dense * self.layer_params + (moe * self.moe_layer_params if moe else 0)

    @property
    def embedding_params(self) -> int:
        """Input embeddings (plus learned positions)."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.positions == "learned" else 0)

    @property
    def head_params(self) -> int:
        """Output head and final norm (the head is the embedding when tied)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def parameters(self) -> int:
        """Every parameter trained: the layers, embeddings, head and the
        multi-token prediction modules (:attr:`mtp_params`)."""
        return (self.layers_params(self.layers - self.moe_layers, self.moe_layers) + self.embedding_params
                + self.head_params + self.mtp_params)

    @property
    def active_parameters(self) -> int:
        """Parameters one token passes through (``top_k`` of the routed experts;
        the same as :attr:`parameters` for a dense model)."""
        if not self.moe:
            return self.parameters
        unused = (self.moe.experts - self.moe.top_k) * self.expert_params
        return self.parameters - (self.moe_layers + self.mtp_depth) * unused

    # ------------------------------------------------ multi-token prediction

    @property
    def mtp_block_params(self) -> int:
        """The transformer block of one multi-token prediction module: a
        layer of the model's kind (an MoE layer when the model has experts)."""
        return self.moe_layer_params if self.moe else self.layer_params

    @property
    def mtp_extra_params(self) -> int:
        """What one MTP module holds beside its block: the projection of the
        two normalised inputs, concatenated, from 2h to h (DeepSeek-V3's
        matrix M; a bias of h with ``biases``), the norms of its two inputs
        and the norm before the shared output head (Megatron-LM's
        ``final_layernorm`` of an MTP layer). The embedding and the output
        head are the model's own, shared: not counted again."""
        h = self.hidden
        return 2 * h * h + (h if self.biases else 0) + 3 * self.norm_params

    @property
    def mtp_params(self) -> int:
        """The parameters of all ``mtp_depth`` MTP modules (0 without)."""
        return self.mtp_depth * (self.mtp_block_params + self.mtp_extra_params)

    # ------------------------------------------------------------ FLOPs

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
        (q = heads x head_dim, :attr:`q_dim`)."""
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

    def training_flops(self, samples: int, recompute: Recompute = Recompute.NONE) -> "Flops":
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

    # ------------------------------------------------------------ activations

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
        # QKV and MLP inputs (2 + 2) and the two dropout masks (1 + 1 bytes)
        replicated = 10 * s * b * h
        # split over tp: Q, K, V, the attention output projection's input, the MLP's
        # wide tensors (MLP_WIDE_VALUES: GeLU in and out; gate, up and product for SwiGLU)
        if moe and self.moe:
            routed = self.moe.routed_per_token
            mlp = (2 * MLP_WIDE_VALUES[self.mlp] * s * b * (routed + self.moe.shared_experts) * self.moe.expert_ffn
                   + 2 * s * b * h * routed + 4 * s * b * self.moe.experts)
        else:
            mlp = 2 * MLP_WIDE_VALUES[self.mlp] * s * b * f
        q = self.q_dim  # Q and the attention output are heads x head_dim wide
        split = 2 * s * b * q + 4 * s * b * kv + 2 * s * b * q + mlp
        if recompute is Recompute.NONE and scores:  # scores, softmax, dropout mask and output: 5 a s^2 b
            split += 5 * self.heads * s * self.seq * b
        return scale * (replicated / replicas + split / tp)

    def logits_bytes(self, micro_batch: int, tp: int, cp: int = 1) -> float:
        """The output layer's fp32 logits for one micro-batch (4 s b V / (t cp))."""
        return 4.0 * self.seq * micro_batch * self.vocab / (tp * cp)

    # ------------------------------------------------------------ checks

    def parallelism_problem(self, tp: int, pp: int, ep: int = 1, cp: int = 1) -> str | None:
        """Why ``tp``, ``pp``, ``ep`` or ``cp`` cannot split this model (None if
        they can): tensor parallelism splits heads, key/value heads, hidden, ffn
        and the experts' width; pipeline parallelism splits the layers into
        equal stages; expert parallelism splits the routed experts; context
        parallelism splits the sequence into 2 cp chunks (Megatron-LM's
        load-balanced causal split: rank i holds chunks i and 2 cp - 1 - i)."""
        if cp > 1 and self.seq % (2 * cp):
            return f"cp={cp} does not split the model's seq ({self.seq}) into 2 x cp equal chunks"
        fields = [("heads", self.heads), ("kv_heads", self.kv_heads), ("hidden", self.hidden), ("ffn", self.ffn)]
        if self.moe:
            fields.append(("moe.expert_ffn", self.moe.expert_ffn))
        for field, value in fields:
            if value % tp:
                return f"tp={tp} does not divide the model's {field} ({value})"
        if ep > 1 and not self.moe:
            return f"ep={ep}: the model has no experts to split (give it a moe: block)"
        if self.moe and self.moe.experts % ep:
            return f"ep={ep} does not divide the model's moe.experts ({self.moe.experts})"
        if self.layers % pp:
            return f"pp={pp} does not divide the model's layers ({self.layers})"
        return None

    def describe(self) -> str:
        extra = []
        if self.q_dim != self.hidden:
            extra.append(f"head_dim {self.head_dimension}")
        if self.ffn != 4 * self.hidden:
            extra.append(f"ffn {self.ffn}")
        if self.kv_heads != self.heads:
            extra.append(f"{self.kv_heads} kv heads")
        if self.mlp != "gelu":
            extra.append({"swiglu": "SwiGLU", "relu": "ReLU", "squared_relu": "squared ReLU"}[self.mlp])
        defaults = family_defaults(self.mlp)
        if self.biases != defaults["biases"]:
            extra.append("biases" if self.biases else "no biases")
        if self.norm != defaults["norm"]:
            extra.append({"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[self.norm])
        if self.positions != defaults["positions"]:
            extra.append(f"{self.positions} positions")
        if self.moe:
            moe = self.moe
            shared = f" + {moe.shared_experts} shared" if moe.shared_experts else ""
            dense = f", {moe.dense_layers} dense layers first" if moe.dense_layers else ""
            extra.append(f"MoE {moe.experts} experts{shared} of {moe.expert_ffn}, top-{moe.top_k}{dense}")
        if self.dropout:
            extra.append(f"dropout {self.dropout:g}")
        if self.mtp_depth:
            extra.append(f"multi-token prediction depth {self.mtp_depth} ({_count(self.mtp_params)} parameters)")
        more = ", " + ", ".join(extra) if extra else ""
        return (f"model {self.name}: {self.layers} layers, hidden {self.hidden}, {self.heads} heads{more}, "
                f"seq {self.seq}, vocab {self.vocab} ({_count(self.parameters)} parameters"
                + (f", {_count(self.active_parameters)} active)" if self.moe else ")"))

    def architecture_fields(self) -> dict[str, Any]:
        """The architecture fields (``gated_mlp``, ``mlp``, ``biases``,
        ``norm``, ``positions``, ``tied_embeddings``) a model file needs to
        give for :func:`model_from_dict` to build this model: those whose
        value is not the default."""
        gated = self.gated_mlp
        out: dict[str, Any] = {"gated_mlp": True} if gated else {}
        if self.mlp not in ("gelu", "swiglu"):
            out["mlp"] = self.mlp
        defaults = {**family_defaults(self.mlp), "tied_embeddings": True}
        out.update({key: getattr(self, key) for key, default in defaults.items() if getattr(self, key) != default})
        if self.moe:
            out["moe"] = self.moe.to_dict()
        if self.mtp_depth:
            out["mtp_depth"] = self.mtp_depth
        if self.dropout:
            out["dropout"] = self.dropout
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "seq": self.seq, "vocab": self.vocab, "ffn": self.ffn, "kv_heads": self.kv_heads,
                "mlp": self.mlp, "gated_mlp": self.gated_mlp, "biases": self.biases, "norm": self.norm,
                "positions": self.positions, "tied_embeddings": self.tied_embeddings, "head_dim": self.head_dimension,
                **({"core_head_dim": self.core_head_dim} if self.core_head_dim else {}),
                **({"mtp_depth": self.mtp_depth, "mtp_parameters": self.mtp_params} if self.mtp_depth else {}),
                **({"dropout": self.dropout} if self.dropout else {}),
                "parameters": self.parameters,
                **({"moe": self.moe.to_dict(), "active_parameters": self.active_parameters} if self.moe else {})}


def _count(n: int) -> str:
    for unit, factor in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return str(n)


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


# ---------------------------------------------------------------- loading


def model_from_dict(data: Any, source: str) -> Transformer:
    """Build and check a model; errors name ``source`` and the field."""
    if not isinstance(data, dict):
        raise SynthError(f"{source}: expected a mapping with keys {', '.join(_REQUIRED)}")
    allowed = (_INT_FIELDS + _COUNT_FIELDS + _BOOL_FIELDS + _TEXT_FIELDS + _FRACTION_FIELDS + tuple(_CHOICE_FIELDS)
               + ("moe",))
    for key in data:
        if key not in allowed:
            raise SynthError(f"{source}: unknown model field '{key}'; known fields are {', '.join(allowed)}")
    for key in _REQUIRED:
        if key not in data:
            raise SynthError(f"{source}: missing model field '{key}', e.g. {key}=2048")
    for key in _INT_FIELDS:
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SynthError(f"{source}: model field '{key}' must be an integer >= 1, got {value!r}")
            if value > MODEL_LIMITS.get(key, value):
                raise SynthError(f"{source}: model field '{key}' is {shown_number(str(value))}; at most "
                                 f"{MODEL_LIMITS[key]:,} (far above any model trained today)")
    for key in _COUNT_FIELDS:
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SynthError(f"{source}: model field '{key}' must be an integer >= 0 (0: none), got {value!r}")
            if value > data["layers"]:
                raise SynthError(f"{source}: model field '{key}' is {shown_number(str(value))}; at most the model's "
                                 f"layers ({data['layers']}): each depth is one more transformer block")
    for key in _BOOL_FIELDS:
        if key in data and not isinstance(data[key], bool):
            raise SynthError(f"{source}: model field '{key}' must be true or false, got {data[key]!r}")
    for key in _FRACTION_FIELDS:
        value = data.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise SynthError(f"{source}: model field '{key}' must be a number from 0 to below 1 (0: none), "
                             f"got {value!r}")
    for key in _TEXT_FIELDS:
        if key in data and not isinstance(data[key], str):
            raise SynthError(f"{source}: model field '{key}' must be text, got {data[key]!r}")
    for key, values in _CHOICE_FIELDS.items():
        if key in data and data[key] not in values:
            raise SynthError(f"{source}: model field '{key}' must be one of {', '.join(values)}, got {data[key]!r}")
    mlp = data.get("mlp", "swiglu" if data.get("gated_mlp") else "gelu")
    if "gated_mlp" in data and data["gated_mlp"] != (mlp == "swiglu"):
        raise SynthError(f"{source}: model fields 'gated_mlp' ({str(data['gated_mlp']).lower()}) and 'mlp' ({mlp}) "
                         "disagree: gated_mlp true is mlp swiglu; give one of them")
    gated, defaults = mlp == "swiglu", family_defaults(mlp)
    heads, hidden = data["heads"], data["hidden"]
    if hidden % heads and "head_dim" not in data:
        raise SynthError(f"{source}: model field 'heads' ({heads}) must divide hidden ({hidden}): every head has "
                         "hidden / heads dimensions (or give head_dim, as a source prints it)")
    kv_heads = data.get("kv_heads", heads)
    if heads % kv_heads:
        raise SynthError(f"{source}: model field 'kv_heads' ({kv_heads}) must divide heads ({heads})")
    if (hidden * kv_heads) % heads:
        raise SynthError(f"{source}: model field 'kv_heads': hidden x kv_heads / heads = {hidden} x {kv_heads} / "
                         f"{heads} is not an integer")
    if gated and "ffn" not in data:
        raise SynthError(f"{source}: model field 'ffn' is required with a SwiGLU MLP (its width)")
    moe = _moe_from(data["moe"], data["layers"], source) if data.get("moe") is not None else None
    return Transformer(
        name=str(data.get("name", Path(source).stem)),
        layers=data["layers"], hidden=hidden, heads=heads, seq=data["seq"], vocab=data["vocab"],
        ffn=data.get("ffn", 4 * hidden), kv_heads=kv_heads, mlp=mlp,
        biases=bool(data.get("biases", defaults["biases"])),
        norm=str(data.get("norm", defaults["norm"])),
        positions=str(data.get("positions", defaults["positions"])),
        tied_embeddings=bool(data.get("tied_embeddings", True)), moe=moe, head_dim=data.get("head_dim"),
        core_head_dim=data.get("core_head_dim"),
        params_stated=data.get("params"), source=str(data.get("source", "")),
        source_inconsistency=data.get("source_inconsistency"), mtp_depth=data.get("mtp_depth", 0),
        dropout=float(data.get("dropout", 0.0)),
    )


def _moe_from(block: Any, layers: int, source: str) -> MoE:
    """The ``moe:`` block; errors name the field."""
    if not isinstance(block, dict):
        raise SynthError(f"{source}: model field 'moe' must be a mapping with experts, top_k and expert_ffn")
    for key in block:
        if key not in MOE_FIELDS:
            raise SynthError(f"{source}: unknown field 'moe.{key}'; known fields are {', '.join(MOE_FIELDS)}")
    for key in ("experts", "top_k", "expert_ffn"):
        if key not in block:
            raise SynthError(f"{source}: missing field 'moe.{key}'")
    for key in MOE_FIELDS[:6]:
        value = block.get(key, 0)
        least = 1 if key in ("experts", "top_k", "expert_ffn") else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise SynthError(f"{source}: field 'moe.{key}' must be an integer >= {least}, got {value!r}")
        if value > MODEL_LIMITS.get(key, value):
            raise SynthError(f"{source}: field 'moe.{key}' is {shown_number(str(value))}; at most "
                             f"{MODEL_LIMITS[key]:,} (far above any model trained today)")
    if block["top_k"] > block["experts"]:
        raise SynthError(f"{source}: field 'moe.top_k' ({block['top_k']}) is more than moe.experts "
                         f"({block['experts']})")
    if block.get("dense_layers", 0) >= layers:
        raise SynthError(f"{source}: field 'moe.dense_layers' ({block['dense_layers']}) leaves no MoE layer of the "
                         f"{layers}")
    capacity = block.get("capacity_factor")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, float))
                                 or not 1 <= capacity <= 64):
        raise SynthError(f"{source}: field 'moe.capacity_factor' must be a number from 1 to 64 or null (dropless), "
                         f"got {capacity!r}")
    return MoE(block["experts"], block["top_k"], block["expert_ffn"], block.get("shared_experts", 0),
               block.get("dense_layers", 0), None if capacity is None else float(capacity), block.get("max_nodes", 0))


def parse_inline_model(spec: str, option: str = "--model") -> Transformer:
    """A model from ``layers=30,hidden=3072,heads=32,seq=2048,vocab=51200``."""
    data: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        m = re.fullmatch(r"([a-z_]+)=(\S+)", item)  # no spaces in a key or around '='; ASCII names
        if not m:
            raise SynthError(f"{option} '{item}': expected FIELD=VALUE, e.g. {option} layers=30,hidden=3072,"
                             "heads=32,seq=2048,vocab=51200")
        key, value = m.group(1), m.group(2)
        if key not in INLINE_FIELDS:
            raise SynthError(f"{option}: unknown model field '{key}'; inline fields are {', '.join(INLINE_FIELDS)}")
        if key in data:
            raise SynthError(f"{option}: model field '{key}' is given twice")
        if key in _BOOL_FIELDS:
            if value not in ("true", "false"):
                raise SynthError(f"{option} {key}={value}: must be true or false")
            data[key] = value == "true"
        elif key in _CHOICE_FIELDS:
            data[key] = value  # model_from_dict names the values
        elif key in ("capacity_factor",) + _FRACTION_FIELDS:
            try:
                data[key] = float(value)
            except ValueError:
                raise SynthError(f"{option} {key}={value}: must be a number") from None
        elif not (value.isascii() and value.isdigit()):  # str.isdigit alone is true of superscripts
            raise SynthError(f"{option} {key}={value}: must be an integer >= 1")
        else:
            data[key] = bounded_int(value, f"{option} {key}=", MODEL_LIMITS.get(key, MAX_COUNT),
                                    low=0 if key in ("shared_experts", "dense_layers", "max_nodes", "mtp_depth") else 1)
    moe = {key: data.pop(key) for key in MOE_FIELDS if key in data}
    if moe:
        data["moe"] = moe
    data["name"] = "inline"
    return model_from_dict(data, option)


def load_model(spec: str) -> Transformer:
    """A shipped model name (``gpt3-175b``), a YAML path, or inline fields."""
    if "=" in spec:
        return parse_inline_model(spec)
    path = Path(spec)
    if not path.is_file():
        shipped = models_dir() / (spec if spec.endswith(".yaml") else spec + ".yaml")
        if not shipped.is_file():
            known = ", ".join(sorted(p.stem for p in models_dir().glob("*.yaml")))
            raise SynthError(f"--model '{spec}': not a file, a shipped model ({known}) or inline fields "
                             "like layers=30,hidden=3072,heads=32,seq=2048,vocab=51200")
        path = shipped
    return model_from_dict(read_yaml(path, "model"), str(path))
