"""One layer's operations on one device, forward and backward, timed by a
per-operation profile (:mod:`synth.planner.operations`; the values and the
pricing primitives: :mod:`synth.planner.optimes`).

Shapes per device, with T = b s tokens of a micro-batch, t = tensor-parallel
size, q = heads x head_dim and kv = kv_heads x head_dim (the query and
key/value widths: h and h x kv_heads / heads unless the model file gives a
head_dim that differs; Megatron-LM's layout; with sequence parallelism the
norms and residual adds, written below over T h, run over T h / t):

* GEMMs ``(M, K, N)``: qkv ``(T, h, (q + 2 kv) / t)``, attention output
  projection ``(T, q / t, h)``, MLP up ``(T, h, m f / t)`` (m = 2 for a gated
  MLP: gate and up in one GEMM, as Megatron-LM fuses them), MLP down
  ``(T, f / t, h)``. Backward: the input gradient ``(T, N, K)`` and the weight
  gradient ``(K, T, N)`` of each. Multi-head latent attention (``mla:``) runs
  its down-projections, the RMSNorms of its two latents and its up-projections
  in place of qkv (:func:`latent_gemms`, :func:`latent_attention_ops`), and its
  output projection reads ``a d_v / t``.
* Attention: batch b, heads / t heads, sequence s, head dim q / heads, causal;
  forward and backward (grouped-query attention computes like full heads;
  latent attention at the mean of its query-key and value heads' widths,
  :attr:`~synth.planner.transformer.Transformer.attention_head_dim`).
* Elementwise, forward: two norms (``layer_norm``'s rate for LayerNorm and
  RMSNorm) and two residual adds over T h (replicated on every tensor-parallel
  rank), the activation over T f / t (``silu_mul`` for a gated MLP, else
  ``gelu_tanh``'s rate: ReLU and squared ReLU are priced as GeLU, one
  bandwidth-bound pass) and, for rotary positions, one pass over the
  T (q + kv) / t query and key values at ``silu_mul``'s rate. Backward: twice
  each forward pass (it reads the input and the output gradient and writes the
  input gradient), and one add per residual (the gradients of the two branches
  meet). With the model's ``dropout``, each residual branch's dropout mask
  (written forward, applied backward) and the embedding's dropout
  (:data:`RESIDUAL_DROPOUT_BYTES`, :data:`EMBEDDING_DROPOUT_BYTES`); with its
  ``attention_dropout``, the attention's passes at
  :data:`ATTENTION_DROPOUT_SLOWDOWN` times their time. These backward
  factors are modelling choices: the calibration grid times forward passes
  only.
* Inside a backward pass kernels are issued by the autograd engine, one call
  per micro-batch: the attention backward there costs its GPU time with the
  forward's floor; the standalone backward call's extra fixed cost is part of
  the micro-batch's fixed cost
  (:func:`~synth.planner.stagecompute.micro_batch_fixed_s`).
* Host issue: eager PyTorch launches ``EAGER_LAUNCHES`` kernels per
  operation; each phase of a layer lasts at least its launches times the
  profile's host seconds per launch (``OperationProfile.host``), the excess
  over the GPU's time an operation ``host_issue``. Small layers (tp 8, one
  sequence) are host-bound in eager PyTorch on the measured machine.
* FP8 (``--dtype fp8``): the layers' GEMMs (not the router's nor the
  logits') at FP8's rate, row-wise scaled (``FP8_GEMM_SPEEDUP``) or, under
  DeepSeek-V3's framework, tile- and block-scaled with the online quantization
  passes around them (:func:`block_fp8_passes`, :mod:`synth.planner.fp8`).
* Beside the layer itself: what recomputation adds to its backward
  (:func:`recompute_ops`; DeepSeek-V3's, :func:`deepseek_recompute_s`), what
  Transformer Engine's chunked GEMMs add (:func:`tp_overlap_chunk_ops`) and
  the kernels it launches (:func:`layer_launches`).
"""

from __future__ import annotations

import math

from ..caches import memoised
from .activations import Recompute
from .fp8 import quantize_bytes, requantize_transposed_bytes
from .operations import OperationProfile
from .optimes import ComputeTime, OpTime, Shard, bytes_pass_ops, gemm_ops, gemm_rate, pass_ops
from .transformer import Transformer

# Dropout of a model with ``dropout`` (Megatron-LM's --hidden-dropout, 0.1 by default: arguments.py line 949 at
# f2e5db402c), bytes per value (forward, backward) beyond the passes priced without it:
# * on each residual branch, inside Megatron-LM's fused bias-dropout-add (megatron/core/fusions/
#   fused_bias_dropout.py lines 30-33; transformer_layer.py lines 189-190 and 229-230): forward, the boolean mask
#   written beside the sum (1); backward, the branch's gradient times the mask (read 2 and 1, write 2: 5);
# * after the embedding, torch.nn.Dropout (language_model_embedding.py lines 77 and 133): forward, read 2, write 2
#   and the mask 1; backward, read 2 and 1, write 2.
RESIDUAL_DROPOUT_BYTES = (1, 2 + 1 + 2)
EMBEDDING_DROPOUT_BYTES = (2 + 2 + 1, 2 + 1 + 2)
# Dropout of the attention's probabilities inside its kernel (a model's ``attention_dropout``; Megatron-LM's
# --attention-dropout, 0.1 by default: arguments.py line 947 at f2e5db402c): the attention's forward and backward
# each at this multiple of their time without it. A measured ratio on Hopper (data/attention_dropout.jsonl, its
# first row): Transformer Engine's fused (cuDNN) attention on an H200, bf16, sbhd, head_dim 128, 4 sequences of
# 1,024 tokens, forward and backward together 0.594 ms without dropout and 0.614 ms with 0.1
# (NVIDIA/TransformerEngine issue 3312). Stated only for the two passes together, it is taken for each alike.
ATTENTION_DROPOUT_SLOWDOWN = 0.614 / 0.594
# Kernels eager PyTorch launches per operation of a layer, (forward, backward). The totals per
# layer agree with the PyTorch profiler's counts at the host-bound shapes of
# data/calibration/h100-layers.jsonl (GPT 11 and 28, Llama 22 and 42-46); the split by operation
# follows what each operation's autograd formula launches.
EAGER_LAUNCHES: dict[str, tuple[int, int]] = {
    "gemm": (1, 2),  # the product; backward: input and weight gradients
    "gemm_bias": (1, 3),  # the bias rides in the product's epilogue; backward adds its gradient's reduction
    "attention": (2, 7),  # the flash kernel and the output's layout copy; backward: preprocessing, the main
    # kernel, the query-gradient conversion, and the layout copies joining q, k, v gradients into one
    "layer_norm": (1, 3),  # backward: the input gradient and the weight and bias reductions
    "rms_norm": (1, 2),  # backward: the input gradient and the weight reduction
    "residual": (1, 1),  # backward: the two branches' gradients summed
    "gelu_tanh": (1, 1),
    "relu": (1, 1),
    "squared_relu": (2, 3),  # relu, the square; backward: the square's gradient (two products), relu's mask
    "silu_mul": (2, 4),  # silu, the product; backward: two products, silu's derivative, gate/up joined
    "rotary": (10, 18),  # q and k each: x cos + cat(-x2, x1) sin, five kernels; backward each: two
    # products, the negation, the two halves' zero-padded slices (two kernels each) and two sums
}
_ACTIVATION_LAUNCHES = {"gelu": "gelu_tanh", "swiglu": "silu_mul", "relu": "relu", "squared_relu": "squared_relu"}


def layer_compute(profile: OperationProfile, model: Transformer, shard: Shard, moe: bool = False) -> ComputeTime:
    """One layer's operations on one device, forward and backward (no
    recomputation; see the module docstring for every shape); ``moe``: an
    MoE layer (:func:`_expert_ops` in place of the MLP; a dense model's
    layers are dense whatever ``moe`` says). Memoised as one entry per
    layer, however the call is spelled."""
    return _layer_compute(profile, model, shard, bool(moe) and model.moe is not None)


@memoised(maxsize=4096)  # the planner asks for each (tp, micro-batch) once per stage kind and size assignment
def _layer_compute(profile: OperationProfile, model: Transformer, shard: Shard, moe: bool) -> ComputeTime:
    """:func:`layer_compute`, its arguments in one spelling (``moe`` only for a model with experts)."""
    t, tokens, h, f, kv, q = shard.tp, shard.tokens, model.hidden, model.ffn, model.kv_dim, model.q_dim
    ops: list[OpTime] = []
    fp8 = shard.fp8_gemms
    if model.mla:
        ops += latent_attention_ops(profile, model, shard)
    else:
        ops += gemm_ops(profile, "qkv", tokens, h, (q + 2 * kv) // t, fp8)
    ops += attention_ops(profile, model, shard)
    ops += gemm_ops(profile, "attention_projection", tokens, model.attention_output_dim // t, h, fp8)
    if moe:
        ops += _expert_ops(profile, model, shard)
    else:
        ops += gemm_ops(profile, "mlp_up", tokens, h, (model.mlp_matrices - 1) * f // t, fp8)
        ops += gemm_ops(profile, "mlp_down", tokens, f // t, h, fp8)
        ops += pass_ops(profile, "activation", _activation_rate(model), tokens * f // t, 2)
    for i in (1, 2):
        ops += pass_ops(profile, f"norm{i}", "layer_norm", shard.replicated_tokens * h, 2)
        ops += pass_ops(profile, f"residual{i}", "add", shard.replicated_tokens * h, 1)
        if model.dropout:
            ops += bytes_pass_ops(profile, f"dropout{i}", shard.replicated_tokens * h, RESIDUAL_DROPOUT_BYTES)
    if model.positions == "rotary":
        ops += pass_ops(profile, "rotary", "silu_mul", rotary_values(model, shard), 2)
    if fp8 == "blocks":
        ops += block_fp8_passes(profile, model, shard, moe)
    launches = layer_launches(model)
    for phase, count in zip(("forward", "backward"), launches):
        host_s = count * profile.host.launch_s(phase)
        gpu_s = sum(op.seconds for op in ops if op.phase == phase)
        if host_s > gpu_s:
            ops.append(OpTime("host_issue", phase, (count,), host_s - gpu_s))
    return ComputeTime(tuple(ops))


def latent_gemms(model: Transformer, shard: Shard) -> tuple[tuple[str, int, int, int], ...]:
    """Multi-head latent attention's GEMMs ``(name, M, K, N)`` on one device
    before the attention core, as Megatron-core's ``MLASelfAttention`` splits
    them over tensor parallelism (megatron/core/transformer/
    multi_latent_attention.py: the down-projections ``duplicated``, the
    up-projections column-parallel): the down-projections ``(T', h, r_q)``
    and ``(T', h, r_kv + d_r)`` on every rank over its replicated tokens T'
    (T, or T / t with sequence parallelism, where Megatron-core computes them
    on the rank's share of the sequence), the up-projections ``(T, r_q, a
    (d_n + d_r) / t)`` and ``(T, r_kv, a (d_n + d_v) / t)``. The output
    projection, row-parallel, is the layer's ``attention_projection``."""
    assert model.mla is not None
    t, tokens, replicated = shard.tp, shard.tokens, shard.replicated_tokens
    (_, h, q_lora), (_, _, q_up), (_, _, kv_down), (_, kv_lora, kv_up), _ = model.mla.projections(model.hidden,
                                                                                                   model.heads)
    return (("q_down", replicated, h, q_lora), ("q_up", tokens, q_lora, q_up // t),
            ("kv_down", replicated, h, kv_down), ("kv_up", tokens, kv_lora, kv_up // t))


def latent_attention_ops(profile: OperationProfile, model: Transformer, shard: Shard) -> list[OpTime]:
    """Latent attention's projections before the core (:func:`latent_gemms`)
    and the RMSNorms of its two latents (``q_norm`` over T' r_q, ``kv_norm``
    over T' r_kv values, at ``layer_norm``'s rate, backward twice the
    forward as the layer's norms)."""
    assert model.mla is not None
    ops: list[OpTime] = []
    for name, m, k, n in latent_gemms(model, shard):
        ops += gemm_ops(profile, name, m, k, n, shard.fp8_gemms)
    for name, width in (("q_norm", model.mla.q_lora_rank), ("kv_norm", model.mla.kv_lora_rank)):
        ops += pass_ops(profile, name, "layer_norm", shard.replicated_tokens * width, 2)
    return ops


# the forward operations of a latent-attention layer DeepSeek-V3 runs again in the backward (arXiv:2412.19437
# Section 3.2.3: "we recompute all RMSNorm operations and MLA up-projections during back-propagation"): the
# layer's two norms, the latents' norms, the up-projections and, in FP8, the quantization of the up-projections'
# inputs (their forward ``.quantize`` passes, block_fp8_passes)
DEEPSEEK_RECOMPUTED = ("norm1", "norm2", "q_norm", "kv_norm", "q_up", "kv_up", "q_up.quantize", "kv_up.quantize")


def deepseek_recompute_s(profile: OperationProfile, model: Transformer, shard: Shard) -> float:
    """Seconds one layer's backward spends recomputing what DeepSeek-V3 does
    not save (``--framework deepseek`` without other recomputation;
    :func:`~synth.planner.frameworks.deepseek_activation_bytes`): one more
    forward of each operation of :data:`DEEPSEEK_RECOMPUTED` the layer runs
    (both RMSNorms for any model; with latent attention also its latents'
    norms and up-projections). The same in a dense and an MoE layer."""
    return sum(op.seconds for op in layer_compute(profile, model, shard).ops
               if op.phase == "forward" and op.name in DEEPSEEK_RECOMPUTED)


def rotary_values(model: Transformer, shard: Shard) -> int:
    """Values one device rotates per micro-batch: the queries and keys,
    ``T (q + kv) / t``; with latent attention each query head's rotary part
    and the one rotary key all heads share, ``T (a d_r / t + d_r)``."""
    if model.mla:
        rope = model.mla.qk_rope_head_dim
        return shard.tokens * (model.heads * rope // shard.tp + rope)
    return shard.tokens * (model.q_dim + model.kv_dim) // shard.tp


# Transformer Engine's userbuffers (NVIDIA/TransformerEngine at 4e7caa1c3, v1.7; synth.planner.overlaps): the ring
# exchange runs its GEMM in tp chunks of the gathered tokens (comm_gemm_overlap.h:769-939), the pipeline in 4 chunks of
# the weight's rows, i.e. of the output features (comm_gemm_overlap.h:333-336, A the weight: module/linear.py:302-304)
TP_OVERLAP_PIPELINE_CHUNKS = 4


def tp_overlap_chunk_ops(profile: OperationProfile, model: Transformer, shard: Shard, moe: bool = False) -> ComputeTime:
    """What running a layer's GEMMs in Transformer Engine's chunks adds to
    them (Megatron-LM's ``--tp-comm-overlap``; with sequence parallelism and
    tp > 1, else nothing): the ring exchange's GEMMs (QKV and MLP-up forward,
    the projection's and MLP-down's input gradients) as ``tp`` GEMMs of ``T /
    tp`` tokens, the pipelined ones (projection and MLP-down forward) as
    :data:`TP_OVERLAP_PIPELINE_CHUNKS` GEMMs of that share of the output
    features; each an operation of the chunks' seconds less the whole GEMM's.
    ``moe``: an MoE layer, whose MLP is its experts' (not chunked). The bulk
    overlaps run their GEMMs whole."""
    t, tokens, h, f, kv, q = shard.tp, shard.tokens, model.hidden, model.ffn, model.kv_dim, model.q_dim
    if t < 2 or not shard.sequence_parallel:
        return ComputeTime(())
    g, p = profile.gemm, TP_OVERLAP_PIPELINE_CHUNKS
    rate, operand = gemm_rate(g, shard.fp8_gemms)

    def extra(name: str, phase: str, m: int, k: int, n: int, chunks: int, rows: bool) -> OpTime:
        whole = float(g.seconds(m, k, n, rate, operand))
        part = (m // chunks, k, n) if rows else (m, k, n // chunks)
        return OpTime(f"{name}.chunks", phase, part, chunks * float(g.seconds(*part, rate, operand)) - whole)

    out = model.attention_output_dim
    if model.mla:  # the up-projections gather the latents (the down-projections run on the rank's tokens)
        ops = [extra(name, "forward", m, k, n, t, True) for name, m, k, n in latent_gemms(model, shard)[1::2]]
    else:
        ops = [extra("qkv", "forward", tokens, h, (q + 2 * kv) // t, t, True)]
    ops += [extra("attention_projection", "forward", tokens, out // t, h, p, False),
            extra("attention_projection.dgrad", "backward", tokens, h, out // t, t, True)]
    if not (moe and model.moe is not None):
        up = (model.mlp_matrices - 1) * f // t
        ops += [extra("mlp_up", "forward", tokens, h, up, t, True),
                extra("mlp_down", "forward", tokens, f // t, h, p, False),
                extra("mlp_down.dgrad", "backward", tokens, h, f // t, t, True)]
    return ComputeTime(tuple(ops))


def _activation_rate(model: Transformer) -> str:
    """The measured elementwise pass an MLP's activation is priced at:
    ``silu_mul`` for SwiGLU, ``gelu_tanh`` for the others (module docstring)."""
    return "silu_mul" if model.gated_mlp else "gelu_tanh"


def _expert_ops(profile: OperationProfile, model: Transformer, shard: Shard) -> list[OpTime]:
    """The MLP of an MoE layer on one device: the router GEMM ``(T, h, E)``;
    the shared experts as one MLP of ``shared x expert_ffn``; the device's
    ``experts / ep`` routed experts, each an MLP over its even share of the
    routed tokens, ``ceil(T x top_k x capacity x ep / experts)`` (the device
    receives ``T top_k`` token copies from its expert-parallel group), its
    GEMMs priced one expert at a time (no grouped-GEMM gain is assumed); the
    activation over every expert pass; the permutation of the routed copies
    into expert order and back (one pass each way over ``T top_k h`` values,
    twice that backward, at ``add``'s rate)."""
    assert model.moe is not None
    moe, t, tokens, h = model.moe, shard.tp, shard.tokens, model.hidden
    f, up = moe.expert_ffn, model.mlp_matrices - 1
    activation = _activation_rate(model)
    ops = gemm_ops(profile, "router", tokens, h, moe.experts)
    if moe.shared_experts:
        width = moe.shared_experts * f
        ops += gemm_ops(profile, "shared_up", tokens, h, up * width // t, shard.fp8_gemms)
        ops += gemm_ops(profile, "shared_down", tokens, width // t, h, shard.fp8_gemms)
        ops += pass_ops(profile, "shared_activation", activation, tokens * width // t, 2)
    local = moe.experts // shard.ep
    routed = tokens * moe.routed_per_token  # token copies the device's experts receive
    per_expert = max(1, math.ceil(routed * shard.ep / moe.experts))
    experts = (gemm_ops(profile, "expert_up", per_expert, h, up * f // t, shard.fp8_gemms)
               + gemm_ops(profile, "expert_down", per_expert, f // t, h, shard.fp8_gemms))
    for op in experts:
        ops.append(OpTime(op.name, op.phase, op.shape, local * op.seconds, local))
    ops += pass_ops(profile, "expert_activation", activation, int(routed) * f // t, 2)
    ops += pass_ops(profile, "permute", "add", 2 * int(routed) * h // t, 2)
    return ops


def block_fp8_passes(profile: OperationProfile, model: Transformer, shard: Shard, moe: bool) -> list[OpTime]:
    """DeepSeek-V3's online quantization around one layer's FP8 GEMMs
    (:mod:`synth.planner.fp8`), each pass one kernel at the profile's ``add``
    bandwidth. Per GEMM with input X (M x K) and output Y (M x N): forward, X
    quantized into 1x128 tiles (:func:`~synth.planner.fp8.quantize_bytes`);
    backward, X's cached tiles re-quantized transposed for the weight gradient
    (:func:`~synth.planner.fp8.requantize_transposed_bytes`) and Y's gradient
    quantized twice, 1x128 for Dgrad and 128x1 for Wgrad. In an MoE layer each
    token is quantized once, before the dispatch (T h values; the shared
    expert's up-projection reads the same FP8 values), and the routed copies
    reach the experts in FP8, so the routed up-projection has no forward pass
    of its own; the MoE output's gradient is quantized once, before the
    combine's backward (the shared down-projection's Dgrad operand too), and
    reaches the routed down-projection in FP8, which re-quantizes it
    transposed for its Wgrad. Named ``<gemm>.quantize`` per phase."""
    t, tokens, h, f, kv, q = shard.tp, shard.tokens, model.hidden, model.ffn, model.kv_dim, model.q_dim
    up = model.mlp_matrices - 1
    passes: list[tuple[str, str, float]] = []  # (GEMM, phase, bytes) of each kernel

    def linear(name: str, inputs: int, outputs: int, quantized_input: bool = False, gradients: int = 2) -> None:
        if not quantized_input:
            passes.append((name, "forward", quantize_bytes(inputs)))
        passes.append((name, "backward", requantize_transposed_bytes(inputs)))
        passes.extend([(name, "backward", quantize_bytes(outputs))] * gradients)

    if model.mla:  # each of latent attention's Linear layers quantizes its own input
        for name, m, k, n in latent_gemms(model, shard):
            linear(name, m * k, m * n)
    else:
        linear("qkv", tokens * h, tokens * (q + 2 * kv) // t)
    linear("attention_projection", tokens * model.attention_output_dim // t, tokens * h)
    if not moe:
        linear("mlp_up", tokens * h, tokens * up * f // t)
        linear("mlp_down", tokens * f // t, tokens * h)
    else:
        assert model.moe is not None
        routed, expert_ffn = int(tokens * model.moe.routed_per_token), model.moe.expert_ffn
        passes += [("dispatch", "forward", quantize_bytes(tokens * h)),
                   ("combine", "backward", quantize_bytes(tokens * h))]
        if model.moe.shared_experts:
            width = model.moe.shared_experts * expert_ffn
            linear("shared_up", tokens * h, tokens * up * width // t, quantized_input=True)
            linear("shared_down", tokens * width // t, tokens * h, gradients=1)
        linear("expert_up", routed * h, routed * up * expert_ffn // t, quantized_input=True)
        linear("expert_down", routed * expert_ffn // t, routed * h, gradients=0)
        passes.append(("expert_down", "backward", requantize_transposed_bytes(routed * h)))
    seconds: dict[tuple[str, str], float] = {}
    for name, phase, nbytes in passes:
        seconds[name, phase] = seconds.get((name, phase), 0.0) + float(profile.elementwise.bytes_seconds(nbytes))
    return [OpTime(f"{name}.quantize" + (".backward" if phase == "backward" else ""), phase, (), s)
            for (name, phase), s in seconds.items()]


def layer_launches(model: Transformer) -> tuple[int, int]:
    """Kernels one layer of ``model`` launches in eager PyTorch, (forward,
    backward): ``EAGER_LAUNCHES`` over its operations (GPT: biased GEMMs,
    LayerNorm, GELU; Llama: unbiased GEMMs, RMSNorm, SwiGLU, rotary; latent
    attention: four GEMMs and two norms in place of QKV)."""
    gemms, norms = (7, 4) if model.mla else (4, 2)  # latent attention: four projections for QKV, the latents' norms
    names = [("gemm_bias" if model.biases else "gemm")] * gemms + ["attention"]
    names += [("rms_norm" if model.norm == "rmsnorm" else "layer_norm")] * norms + ["residual"] * 2
    names += [_ACTIVATION_LAUNCHES[model.mlp]] + (["rotary"] if model.positions == "rotary" else [])
    return (sum(EAGER_LAUNCHES[n][0] for n in names), sum(EAGER_LAUNCHES[n][1] for n in names))


def attention_ops(profile: OperationProfile, model: Transformer, shard: Shard) -> list[OpTime]:
    """The attention core forward and backward, each call above the floor.
    With context parallelism (Megatron-LM's ring attention, Transformer
    Engine's load-balanced split: each device holds two chunks of ``s / (2 cp)``
    tokens, one from each end of the sequence) each pass runs ``cp`` calls: the
    causal attention of the device's own ``s / cp`` queries and keys, then per
    ring step the ``s / cp`` queries against half a step's keys (``s / (2 cp)``,
    every pair: the steps whose queries are the second chunk against both key
    chunks do as much work and are priced alike). Together they are ``1 / cp``
    of the whole sequence's causal attention, in shorter kernels. With the
    model's ``attention_dropout`` every call's time is
    :data:`ATTENTION_DROPOUT_SLOWDOWN` times the profile's (before the floor)."""
    a = profile.attention
    b, heads, head_dim = shard.micro_batch, model.heads // shard.tp, model.attention_head_dim
    shape = (b, heads, shard.seq, head_dim)
    local = shard.seq // shard.cp
    slowdown = ATTENTION_DROPOUT_SLOWDOWN if model.attention_dropout else 1.0

    def calls_s(gpu_s) -> float:
        """The pass's calls, each above the floor (one call without cp)."""
        own = max(a.forward_floor_s, slowdown * float(gpu_s(b, heads, local, head_dim)))
        if shard.cp == 1:
            return own
        ring = slowdown * float(gpu_s(b, heads, local, head_dim, False, local // 2))
        return own + (shard.cp - 1) * max(a.forward_floor_s, ring)

    return [OpTime("attention", "forward", shape, calls_s(a.forward_gpu_s)),
            OpTime("attention.backward", "backward", shape, calls_s(a.backward_gpu_s))]


def recompute_ops(profile: OperationProfile, model: Transformer, shard: Shard, recompute: Recompute,
                  layer: ComputeTime) -> ComputeTime:
    """What recomputation adds to one layer's backward: its whole forward
    (full) or the attention core's forward (selective)."""
    if recompute is Recompute.NONE:
        return ComputeTime(())
    if recompute is Recompute.FULL:
        chosen = [op for op in layer.ops if op.phase == "forward"]
    else:
        chosen = [op for op in attention_ops(profile, model, shard) if op.phase == "forward"]
    return ComputeTime(tuple(OpTime(f"{op.name}.recompute", "backward", op.shape, op.seconds) for op in chosen))
