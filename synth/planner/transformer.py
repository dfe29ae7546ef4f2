"""Transformer models for the job planner: shape and parameters.

A :class:`Transformer` is a decoder-only model as ``models/*.yaml`` describe it
(``data/README.md``): ``layers`` L, ``hidden`` h, ``heads`` a, ``seq`` s,
``vocab`` V, optionally ``ffn`` f (default 4h), ``kv_heads`` (grouped-query
attention; default a), ``mlp`` (``gelu``, ``swiglu``, ``relu`` or
``squared_relu``; ``gated_mlp: true`` is ``mlp: swiglu``), ``biases`` on the
linear layers, ``norm`` (``layernorm`` or ``rmsnorm``), ``positions``
(``learned`` or ``rotary``), ``tied_embeddings`` and ``mtp_depth`` (multi-token
prediction modules, default 0: :attr:`Transformer.mtp_depth`), ``dropout`` (the
training's dropout probability of the residual branches and the embedding, default
0; it changes the compute, not the FLOPs), ``attention_dropout`` (the dropout of the
attention's probabilities inside its kernel, default 0; the compute too). :mod:`synth.planner.modelspec` loads
it from a shipped name (``gpt3-175b``), a YAML path, or inline text
(``layers=30,hidden=3072,heads=32,seq=2048,vocab=51200``). Its FLOPs
(:mod:`synth.planner.flops`) and activation memory
(:mod:`synth.planner.activations`) are parts of the class, mixins in their own
modules.

The defaults follow two architecture families, told apart by the MLP:

* GPT (``mlp`` gelu, relu or squared_relu; gelu by default): biases on every
  linear layer, LayerNorm (weight and bias), learned position embeddings
  (s x h), an MLP of two matrices;
* Llama (``mlp: swiglu``): no biases, RMSNorm (weight only), rotary positions
  (no parameters), a SwiGLU MLP of three matrices (gate and up, then down).

Parameters (kv = h x kv_heads / a):

* per layer: ``h(h + 2kv) + h^2`` (q, k, v, o) ``+ m h f`` (MLP, m = 2
  or 3) + biases ``h + 2kv + h + (m - 1) f + h`` (with ``biases``) + norms
  ``4h`` (LayerNorm) or ``2h`` (RMSNorm); for GPT with f = 4h that is
  Megatron's ``12 h^2 + 13 h``; with multi-head latent attention (``mla:``,
  :class:`MLA`, a heads, latents r_q and r_kv, rotary width d_r, head widths
  d_n and d_v) the attention is ``h r_q + r_q a (d_n + d_r) + h (r_kv + d_r) +
  r_kv a (d_n + d_v) + a d_v h`` and its latents' norms ``r_q + r_kv``;
* embeddings ``V h`` (+ ``s h`` learned positions), an untied output head
  ``V h``, a final norm ``2h`` (LayerNorm) or ``h`` (RMSNorm);
* a multi-token prediction module (``mtp_depth``, :class:`Transformer`):
  one layer of the model's kind, a ``2h x h`` projection and three norms
  (its two inputs', and the one before the shared head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .activations import ActivationCounts
from .flops import FlopCounts


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
class MLA:
    """Multi-head latent attention (DeepSeek-AI 2024, arXiv:2412.19437 Section
    2.1.1; ``mla:`` in a model file), in place of the query, key and value
    projections of ordinary heads. The layer's input (hidden h) is projected
    down to two latents, the query's (``q_lora_rank``) and the keys' and values'
    (``kv_lora_rank``, with the decoupled rotary key of ``qk_rope_head_dim``,
    one head shared by all), each RMS-normed; the latents are projected up to
    ``heads`` query heads of ``qk_nope_head_dim + qk_rope_head_dim`` and to the
    heads' keys (``qk_nope_head_dim``, joined by the shared rotary key) and
    values (``v_head_dim``); the output projection reads ``heads x
    v_head_dim``. Five matrices, no biases (:meth:`projections`)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        """One query (and key) head's width in the scores: the part without
        positions and the rotary part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def projections(self, hidden: int, heads: int) -> tuple[tuple[str, int, int], ...]:
        """The attention's matrices as ``(name, inputs, outputs)``, in the
        order the layer runs them: the query's down- and up-projection, the
        keys' and values' down-projection (latent and rotary key) and
        up-projection (each head's key part without positions and its value),
        the output projection."""
        q, kv, rope = self.q_lora_rank, self.kv_lora_rank, self.qk_rope_head_dim
        return (("q_down", hidden, q), ("q_up", q, heads * self.qk_head_dim),
                ("kv_down", hidden, kv + rope), ("kv_up", kv, heads * (self.qk_nope_head_dim + self.v_head_dim)),
                ("attention_projection", heads * self.v_head_dim, hidden))

    def to_dict(self) -> dict[str, Any]:
        return {"q_lora_rank": self.q_lora_rank, "kv_lora_rank": self.kv_lora_rank,
                "qk_rope_head_dim": self.qk_rope_head_dim, "qk_nope_head_dim": self.qk_nope_head_dim,
                "v_head_dim": self.v_head_dim}


@dataclass(frozen=True)
class Transformer(FlopCounts, ActivationCounts):
    """A decoder-only transformer (see the module docstring). Its FLOP counts
    are :class:`~synth.planner.flops.FlopCounts`' methods and its activation
    bytes :class:`~synth.planner.activations.ActivationCounts`'.

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
    mla: MLA | None = None  # multi-head latent attention in place of the q, k, v projections (None: ordinary heads)
    params_stated: int | None = None  # the count the source states (informative)
    mtp_depth: int = 0  # multi-token prediction modules on the last stage (:attr:`mtp_module_params`)
    dropout: float = 0.0  # training's dropout of the residual branches and the embedding (Megatron's --hidden-dropout)
    attention_dropout: float = 0.0  # dropout of the attention probabilities, in its kernel (--attention-dropout)
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
    def attention_head_dim(self) -> float:
        """The head width the attention core is timed at: :attr:`head_dimension`;
        with latent attention the mean of the query-key and the value heads'
        widths, ``(qk + v) / 2`` (its scores run over qk, its product with the
        values over v: ``2 s^2 (qk + v)`` FLOPs per head, those of heads that
        wide, :meth:`~synth.planner.flops.FlopCounts.attention_core_flops`)."""
        if self.mla:
            width = self.mla.qk_head_dim + self.mla.v_head_dim
            return width // 2 if width % 2 == 0 else width / 2
        return self.head_dimension

    @property
    def q_dim(self) -> int:
        """Width of the queries: heads x head_dim (the hidden width unless the
        model file gives a head_dim that differs; Megatron-LM's
        ``--kv-channels``); with latent attention heads x (qk_nope_head_dim +
        qk_rope_head_dim)."""
        if self.mla:
            return self.heads * self.mla.qk_head_dim
        return self.heads * self.head_dimension

    @property
    def kv_dim(self) -> int:
        """Width of the keys: kv_heads x head_dim (the values' too, :attr:`value_dim`);
        with latent attention as wide as the queries (:attr:`q_dim`)."""
        if self.mla:
            return self.q_dim
        return self.kv_heads * self.head_dimension

    @property
    def value_dim(self) -> int:
        """Width of the values: :attr:`kv_dim`; with latent attention heads x v_head_dim."""
        return self.heads * self.mla.v_head_dim if self.mla else self.kv_dim

    @property
    def attention_output_dim(self) -> int:
        """Width of the attention core's output, which the output projection
        reads: :attr:`q_dim`; with latent attention heads x v_head_dim."""
        return self.heads * self.mla.v_head_dim if self.mla else self.q_dim

    @property
    def latent_width(self) -> int:
        """Latent attention's two latents per token, q_lora_rank + kv_lora_rank
        (each RMS-normed; 0 without latent attention)."""
        return self.mla.q_lora_rank + self.mla.kv_lora_rank if self.mla else 0

    @property
    def attention_norm_params(self) -> int:
        """The norms inside the attention: latent attention's two latents'
        (a weight per value with RMSNorm, weight and bias with LayerNorm); 0
        without."""
        return (2 if self.norm == "layernorm" else 1) * self.latent_width

    @property
    def mlp_matrices(self) -> int:
        """Matrices of one MLP: 3 for SwiGLU (gate, up, down), else 2."""
        return 3 if self.gated_mlp else 2

    @property
    def attention_matrix_params(self) -> int:
        """Q, K, V (hidden to q_dim + 2 kv_dim) and the output projection
        (q_dim to hidden); with latent attention its five matrices
        (:meth:`MLA.projections`)."""
        return sum(self.layer_gemm_params[:2])

    @property
    def attention_gemm_params(self) -> tuple[int, int]:
        """The attention's matrices as two tensor-parallel GEMMs: what reads
        the layer's input (QKV, hidden to q_dim + 2 kv_dim; with latent
        attention the down- and up-projections) and the output projection."""
        if self.mla:
            sizes = [k * n for _, k, n in self.mla.projections(self.hidden, self.heads)]
            return sum(sizes[:-1]), sizes[-1]
        h, q = self.hidden, self.q_dim
        return h * (q + 2 * self.kv_dim), q * h

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
                + self.attention_norm_params + self.hidden * self.moe.experts + self.moe_layer_routed_params
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
        h, f = self.hidden, self.ffn
        return (*self.attention_gemm_params, (self.mlp_matrices - 1) * h * f, h * f)

    @property
    def moe_layer_gemm_params(self) -> tuple[float, float, float, float]:
        """:attr:`layer_gemm_params` of an MoE layer per token: the experts a
        token passes (routed, padded, and shared) in place of the MLP."""
        assert self.moe is not None
        h, f = self.hidden, self.moe.expert_ffn
        experts = self.moe.routed_per_token + self.moe.shared_experts
        return (*self.attention_gemm_params, experts * (self.mlp_matrices - 1) * h * f, experts * h * f)

    @property
    def layer_params(self) -> int:
        """One dense layer: matrices, biases and norms."""
        return (self.attention_matrix_params + self.attention_bias_params + self.mlp_params(self.ffn)
                + 2 * self.norm_params + self.attention_norm_params)

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
        if self.mla:
            m = self.mla
            extra.append(f"latent attention (q {m.q_lora_rank}, kv {m.kv_lora_rank}, heads qk {m.qk_head_dim} = "
                         f"{m.qk_nope_head_dim} + rotary {m.qk_rope_head_dim}, v {m.v_head_dim})")
        elif self.q_dim != self.hidden:
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
        if self.attention_dropout:
            extra.append(f"attention dropout {self.attention_dropout:g}")
        if self.mtp_depth:
            extra.append(f"multi-token prediction depth {self.mtp_depth} ({_count(self.mtp_params)} parameters)")
        more = ", " + ", ".join(extra) if extra else ""
        return (f"model {self.name}: {self.layers} layers, hidden {self.hidden}, {self.heads} heads{more}, "
                f"seq {self.seq}, vocab {self.vocab} ({_count(self.parameters)} parameters"
                + (f", {_count(self.active_parameters)} active)" if self.moe else ")"))

    def architecture_fields(self) -> dict[str, Any]:
        """The architecture fields (``gated_mlp``, ``mlp``, ``biases``,
        ``norm``, ``positions``, ``tied_embeddings``) a model file needs to
        give for :func:`~synth.planner.modelspec.model_from_dict` to build this model: those whose
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
        if self.attention_dropout:
            out["attention_dropout"] = self.attention_dropout
        if self.mla:
            out["mla"] = self.mla.to_dict()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "seq": self.seq, "vocab": self.vocab, "ffn": self.ffn, "kv_heads": self.kv_heads,
                "mlp": self.mlp, "gated_mlp": self.gated_mlp, "biases": self.biases, "norm": self.norm,
                "positions": self.positions, "tied_embeddings": self.tied_embeddings, "head_dim": self.head_dimension,
                **({"mla": self.mla.to_dict()} if self.mla else {}),
                **({"mtp_depth": self.mtp_depth, "mtp_parameters": self.mtp_params} if self.mtp_depth else {}),
                **({"dropout": self.dropout} if self.dropout else {}),
                **({"attention_dropout": self.attention_dropout} if self.attention_dropout else {}),
                "parameters": self.parameters,
                **({"moe": self.moe.to_dict(), "active_parameters": self.active_parameters} if self.moe else {})}


def _count(n: int) -> str:
    for unit, factor in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= factor:
            return f"{n / factor:.2f} {unit}"
    return str(n)
