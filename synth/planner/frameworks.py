"""What a training framework adds to a step outside the layers, and how it
holds its states (``--framework``).

Each :class:`Framework` says, per parameter, how many bytes the weights, the
gradients, the fp32 master copy and Adam's moments take, and how many bytes
the step moves outside the layers' operations:

* ``megatron`` (Megatron-LM with bf16): bf16 weights, fp32 main gradients
  (Megatron-LM forces ``--accumulate-allreduce-grads-in-fp32`` for bf16), fp32
  master weights and moments: 18 bytes per parameter, ``6 + 12 / d`` with the
  distributed optimizer (the Megatron Core user guide, "Distributed
  Optimizer": bf16 parameters, fp32 gradients). The weight-gradient GEMM
  accumulates into the fp32 main gradient in its epilogue (gradient
  accumulation fusion), so accumulation costs no pass of its own; the step
  zeroes the gradient buffer (4 bytes per parameter), runs Adam on the fp32
  master weights (28 bytes: read weight, gradient and two moments, write three)
  and copies the master weights to the bf16 ones (read 4, write 2). Before
  each gradient bucket's data-parallel reduction it takes the bucket's norm to
  check it for NaN (read 4; ``check_for_nan_in_grad``, on by default except
  under fp16's dynamic loss scaling) and, with dp > 1, scales it by ``1 / dp`` (read 4, write 4;
  ``average_in_collective`` is off by default): ``start_grad_sync`` in
  megatron/core/distributed/param_and_grad_buffer.py, lines 109-123 at
  Megatron-LM f2e5db402c (:attr:`Framework.bucket_check_bytes`).
* ``torchtitan`` (FSDP2 with ``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)``, torchtitan's defaults): the sharded parameters,
  gradients and moments in fp32 (16 bytes per parameter, all over the shard
  group); before each all-gather (forward and backward) FSDP2 casts the
  local shard to bf16 (read 4, write 2) and copies it into the all-gather's
  input (``_foreach_copy_``, read 2, write 2), and after it copies the
  gathered bf16 weights out of the all-gather's output into the layer's
  parameters (``split_with_sizes_copy``, read 2, write 2 per gathered
  weight; ``foreach_all_gather`` and ``foreach_all_gather_copy_out`` in
  PyTorch's torch/distributed/_composable/fsdp/_fsdp_collectives.py; two
  gathers are counted for every weight, though the root unit and the last
  layer are gathered once: for Llama 3 8B on 8 GPUs 2 ms of a 2 s step); the
  unsharded bf16 gradients are cast to fp32 for the reduce-scatter (read 2,
  write 4), which runs in fp32 (``reduce_dtype``: parallelize_llama.py line
  320, ``--training.mixed_precision_reduce`` float32 in config_manager.py
  lines 389-392; :attr:`Framework.zero3_reduce_bytes`); foreach AdamW on the shard (80 bytes,
  :data:`~synth.planner.eagerops.FOREACH_ADAMW_BYTES`) after gradient
  clipping (12, :data:`~synth.planner.eagerops.CLIP_GRAD_NORM_BYTES`);
  ``zero_grad`` sets the gradients to None; torchtitan wraps each layer and
  then the whole model with ``fully_shard`` (torchtitan/parallelisms/
  parallelize_llama.py lines 324-339 at 9dec370), so the embedding, the
  final norm and the output layer are one unit whose gather opens the step
  and whose reduce-scatter, after the embedding's backward, closes it
  (:attr:`Framework.root_unit`); the training step deletes the
  bf16 logits before the backward (``del pred`` in torchtitan's train.py), so
  the eager loss holds 12 bytes per logit. Its ``--recompute selective`` is
  torchtitan's operator-level selective checkpointing (:func:`sac_activation_bytes`).
* ``eager`` (a plain PyTorch loop: fp32 weights under bf16 autocast, fused
  AdamW, ``zero_grad(set_to_none=True)``; ``scripts/memory_check.py``'s recipe):
  16 bytes per parameter of fp32 weights, gradients and moments, plus
  autocast's bf16 copy of every weight a GEMM uses (2 bytes, held until the
  backward is done). Per micro-batch autocast casts each weight (read 4, write
  2) and the backward casts each bf16 weight gradient to fp32 (read 2, write 4);
  from the second micro-batch on, autograd adds it to the held fp32 gradient
  (read 4 and 4, write 4). Fused AdamW moves 28 bytes.
* ``eager-master`` (a plain loop on bf16 weights with an fp32 master copy,
  ``scripts/layer_accuracy.py``'s steps): 16 bytes per parameter held (bf16
  weights and gradients, fp32 master and moments); from the second
  micro-batch on, autograd adds each bf16 weight gradient into the held one
  (read 2 and 2, write 2); the step casts the gradients to fp32 (read 2, write
  4), runs fused Adam (28) and copies the master weights back (read 4, write 2).

* ``deepseek`` (DeepSeek-V3's framework as its report states it, arXiv:2412.19437
  Sections 3.2.3 and 3.3.3): bf16 weights, fp32 master weights and gradients
  ("used for batch size accumulation"), AdamW's two moments in BF16 (4 bytes,
  so Adam moves 20 bytes, not 28); the passes outside the layers, which the
  report does not describe, are Megatron-LM's. Without other recomputation it
  stores a layer's activations as :func:`deepseek_activation_bytes` counts
  (RMSNorm and latent attention's up-projections recomputed, FP8 and E5M6
  caches) and recomputes both RMSNorms, and with latent attention its
  latents' norms and up-projections, in the backward
  (:attr:`Framework.recomputes_norms`,
  :func:`~synth.planner.layercompute.deepseek_recompute_s`). Under ``--dtype fp8`` its
  GEMMs are DeepSeek-V3's tile- and block-scaled ones, with their online
  quantization passes and FP8 dispatch (:attr:`Framework.fp8_blocks`,
  :mod:`synth.planner.fp8`); the other frameworks' FP8 is row-wise scaled
  (``FP8_GEMM_SPEEDUP``, quantization inside its rate).

All these passes are priced at the profile's ``add`` bandwidth
(:meth:`~synth.planner.operations.ElementwiseModel.bytes_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SynthError
from .activations import MLP_WIDE_VALUES, Recompute
from .eagerops import CLIP_GRAD_NORM_BYTES, FOREACH_ADAMW_BYTES
from .transformer import Transformer

ADAM_BYTES = 28  # fused Adam(W) on fp32: read weight, gradient, two moments; write weight and moments
# Megatron-LM's per-bucket passes over its fp32 gradients before each data-parallel reduction: the norm of the
# NaN check (read 4) always, the scaling by 1 / dp (read 4, write 4) with dp > 1
MEGATRON_BUCKET_CHECK_BYTES = (4, 8)


@dataclass(frozen=True)
class Framework:
    """One framework's states (bytes per parameter held) and the bytes per
    parameter its step moves outside the layers (module docstring)."""

    name: str
    source: str
    weight_bytes: int  # the training weights as held (sharded by ZeRO-3 / FSDP)
    gradient_bytes: int  # the gradients as held, accumulated and reduced
    master_bytes: int  # an fp32 master copy beside 16-bit weights (0: the weights are fp32)
    moment_bytes: int = 8  # Adam's two fp32 moments
    default_cross_entropy: str = "eager"  # the loss the framework computes (CROSS_ENTROPY_BYTES)
    cast_copy_bytes: int = 0  # a 16-bit copy of each weight made for the GEMMs and held through the backward
    forward_cast_bytes: int = 0  # moved per parameter and micro-batch before the layers use the weights
    forward_cast_on_shard: bool = False  # ... on the device's shard only (FSDP2 casts before gathering)
    gather_copy_bytes: int = 0  # moved per gathered weight and micro-batch copying ZeRO-3's all-gather outputs out
    gradient_cast_bytes: int = 0  # moved per parameter and micro-batch as the backward makes the gradients
    accumulate_bytes: int = 0  # moved per parameter and micro-batch after the first (adding into held gradients)
    optimizer_cast_bytes: int = 0  # per updated parameter: the gradients cast to fp32 before the optimizer
    copy_back_bytes: int = 0  # per updated parameter: the fp32 master weights copied to the 16-bit ones
    zero_bytes: int = 0  # moved per parameter (unsharded) to clear the gradients each step
    bucket_check_bytes: tuple[int, int] = (0, 0)  # moved per parameter (unsharded) and step before the
    # data-parallel reduction: (always, with dp > 1): Megatron-LM's NaN check of each bucket, its 1/dp scaling
    gradients_freed: bool = False  # the gradients are set to None each step and made anew by the first backward
    logits_freed: bool = False  # the training loop drops its bf16 logits before the backward (eager loss: 12, not 14)
    recomputes_norms: bool = False  # DeepSeek-V3's storage without recomputation: deepseek_activation_bytes (and
    # its recomputation: layercompute.deepseek_recompute_s)
    fp8_blocks: bool = False  # under --dtype fp8: DeepSeek-V3's tile- and block-scaled FP8 (synth.planner.fp8)
    adam_bytes: int = ADAM_BYTES  # Adam(W) with fp32 moments, per updated parameter (fused: 28)
    clip_bytes: int = 0  # per updated parameter: the gradients' norm and their scaling before the optimizer
    zero3_reduce_bytes: int = 0  # bytes per value ZeRO-3 reduce-scatters a layer's gradients in (0: the weights')
    root_unit: bool = False  # ZeRO-3 gathers the embedding and output layer as one unit before the first layer
    # and reduce-scatters its gradients after the last (FSDP2's root module), both outside any overlap

    @property
    def state_bytes(self) -> int:
        """Bytes per parameter held between steps (weights, gradients, optimizer)."""
        return self.weight_bytes + self.gradient_bytes + self.master_bytes + self.moment_bytes

    @property
    def optimizer_bytes(self) -> int:
        """Bytes the optimizer step moves per updated parameter."""
        adam = self.adam_bytes - 2 * (8 - self.moment_bytes)  # the moments read and written at their own width
        return self.optimizer_cast_bytes + self.clip_bytes + adam + self.copy_back_bytes


FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("megatron", "Megatron Core user guide, Distributed Optimizer: bf16 parameters, fp32 gradients, 18 bytes "
              "per parameter, 6 + 12/d distributed", 2, 4, 4, default_cross_entropy="fused", copy_back_bytes=6,
              zero_bytes=4, bucket_check_bytes=MEGATRON_BUCKET_CHECK_BYTES),
    Framework("torchtitan", "torchtitan: FSDP2 MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), "
              "foreach AdamW after foreach gradient clipping, cross_entropy on logits.float(), del pred before the "
              "backward", 4, 4, 0, forward_cast_bytes=2 * (6 + 4), forward_cast_on_shard=True, gather_copy_bytes=2 * 4,
              gradient_cast_bytes=6, gradients_freed=True, logits_freed=True, adam_bytes=FOREACH_ADAMW_BYTES,
              clip_bytes=CLIP_GRAD_NORM_BYTES, zero3_reduce_bytes=4, root_unit=True),
    Framework("eager", "fp32 weights under torch.autocast(bfloat16), fused AdamW, zero_grad(set_to_none=True)", 4, 4, 0,
              cast_copy_bytes=2, forward_cast_bytes=6, gradient_cast_bytes=6, accumulate_bytes=12, gradients_freed=True),
    Framework("eager-master", "bf16 weights, fp32 master copy, fused Adam, gradients set to None each step", 2, 2, 4,
              accumulate_bytes=6, optimizer_cast_bytes=6, copy_back_bytes=6, gradients_freed=True),
    Framework("deepseek", "DeepSeek-V3 technical report (arXiv:2412.19437), Sections 3.2.3 and 3.3.3: fp32 master "
              "weights and gradients, BF16 AdamW moments, RMSNorm recomputed, FP8 activation caches", 2, 4, 4,
              moment_bytes=4, default_cross_entropy="fused", copy_back_bytes=6, zero_bytes=4, recomputes_norms=True,
              fp8_blocks=True, bucket_check_bytes=MEGATRON_BUCKET_CHECK_BYTES),
)}
FRAMEWORK_CHOICES = tuple(FRAMEWORKS)


def at_dtype(framework: Framework, value_bytes: int) -> Framework:
    """``framework`` when training in values of ``value_bytes``: with fp32
    weights (``--dtype fp32``) there is no 16-bit copy to keep, so no master
    copy, no cast before the optimizer and no copy back after it
    (Megatron-LM's table: fp32 parameters and gradients, 16 bytes per
    parameter)."""
    if value_bytes != 4 or not framework.master_bytes:
        return framework
    return replace(framework, weight_bytes=4, gradient_bytes=4, master_bytes=0, optimizer_cast_bytes=0,
                   copy_back_bytes=0)


def framework_of(name: str) -> Framework:
    """The framework called ``name``; SynthError naming the choices."""
    if name not in FRAMEWORKS:
        raise SynthError(f"--framework {name}: choose one of {', '.join(FRAMEWORKS)}")
    return FRAMEWORKS[name]


def torchtitan_gemm_outputs(model: Transformer, tp: int) -> tuple[int, ...]:
    """Widths per token of one dense layer's GEMM outputs on one device, in
    the order torchtitan's Llama runs them: wq, wk, wv, wo, then w1, w3, w2
    (gated MLP) or up, down. The outputs of wo and w2 are the full hidden
    width (partial sums before tensor parallelism's reduction)."""
    h, kv, f = model.hidden, model.kv_dim, model.ffn
    mlp = (f // tp, f // tp, h) if model.gated_mlp else (f // tp, h)
    return (model.q_dim // tp, kv // tp, kv // tp, h) + mlp


def sac_activation_bytes(model: Transformer, micro_batch: int, tp: int, cp: int = 1,
                         sequence_parallel: bool = False) -> float:
    """Bytes one dense layer keeps for one micro-batch under torchtitan's
    operator-level selective activation checkpointing
    (``activation_checkpoint.mode = "selective"``, ``selective_ac_option =
    "op"``, torchtitan/distributed/activation_checkpoint.py): every compute
    operation's output in its save list is kept except every second GEMM
    (counted from one within the layer: the 2nd, 4th, ... are recomputed);
    what is not saved is recomputed from the layer's input. Kept: the layer's
    input, the attention's output, and the 1st, 3rd, ... GEMM outputs
    (:func:`torchtitan_gemm_outputs`), 16-bit values; ``s / cp`` tokens; the
    layer input split over tp with sequence parallelism."""
    tokens = micro_batch * model.seq // cp
    kept = sum(torchtitan_gemm_outputs(model, tp)[0::2])
    layer_input = model.hidden // tp if sequence_parallel else model.hidden
    return 2.0 * tokens * (layer_input + model.q_dim // tp + kept)  # the attention's output: heads x head_dim


def step_overhead_bytes(framework: Framework, parameters: float, updated: float,
                        micro_batches: int, gathered: bool = False, dp: int = 1,
                        loss_scaled: bool = False) -> tuple[float, float, float]:
    """(bytes per micro-batch, bytes of the accumulation over the step, bytes
    of the optimizer step) one device moves outside the layers: ``parameters``
    the weights it computes with, ``updated`` those its optimizer updates (its
    ZeRO shard, which FSDP2 also casts before each all-gather); ``gathered``:
    ZeRO-3 gathers the weights it computes with (``gather_copy_bytes`` each);
    ``dp`` the data-parallel size the gradients are reduced over (the
    bucket checks' scaling runs only above 1); ``loss_scaled``: fp16 training
    under dynamic loss scaling, where Megatron-LM turns the NaN check off
    (NaNs are the loss scaler's signal: ``megatron/training/arguments.py``
    lines 292-298 at Megatron-LM f2e5db402c). The optimizer step's bytes
    include the once-a-step passes over the whole gradient buffer (zeroing,
    the bucket checks)."""
    cast_on = updated if framework.forward_cast_on_shard else parameters
    per_micro_batch = framework.forward_cast_bytes * cast_on + framework.gradient_cast_bytes * parameters
    if gathered:
        per_micro_batch += framework.gather_copy_bytes * parameters
    accumulate = framework.accumulate_bytes * parameters * max(0, micro_batches - 1)
    always, scaled = framework.bucket_check_bytes
    whole_buffer = framework.zero_bytes + (0 if loss_scaled else always) + (scaled if dp > 1 else 0)
    optimizer = framework.optimizer_bytes * updated + whole_buffer * parameters
    return per_micro_batch, accumulate, optimizer


def deepseek_activation_bytes(model: Transformer, micro_batch: int, tp: int, moe: bool, cp: int = 1,
                              sequence_parallel: bool = False) -> float:
    """Bytes one layer keeps for one micro-batch as DeepSeek-V3 stores them
    (arXiv:2412.19437), from the planner's count without recomputation
    (:meth:`~synth.planner.transformer.Transformer.activation_bytes_per_layer`,
    flash attention), each difference a statement of the report:

    * both RMSNorms are recomputed in the backward (Section 3.2.3): their
      outputs, the QKV and MLP inputs (``2 s b h`` each), are not kept;
    * with multi-head latent attention, its up-projections and its latents'
      RMSNorms are recomputed too (Section 3.2.3): the norms' outputs (``2 s
      b (r_q + r_kv)``, on every tensor-parallel rank) and the
      up-projections' outputs, the attention core's queries, keys and values
      (``2 s b a (2 (d_n + d_r) + d_v) / t``), are not kept; the latents
      (the norms' inputs) are, and the rotary key they are recomputed with
      (``2 s b d_r``);
    * the input of the linear after the attention is cached in E5M6, 12 bits
      (Section 3.3.3 (1)): ``1.5 s b h`` for ``2 s b h`` (with latent
      attention ``1.5 s b a d_v / t`` for ``2 s b a d_v / t``);
    * an MoE layer caches its experts' inputs in FP8, as the dispatch sends
      them (Section 3.3.3, "Low-Precision Communication"): ``s b h`` per routed
      copy for ``2 s b h``; and of each expert's SwiGLU it caches the inputs in
      FP8 and recomputes the output (Section 3.3.3 (2)): ``2 s b f_e`` per
      expert pass (routed and shared) for ``6 s b f_e`` (SwiGLU experts).

    The recomputation's time is
    :func:`~synth.planner.layercompute.deepseek_recompute_s`."""
    baseline = model.activation_bytes_per_layer(micro_batch, tp, Recompute.NONE, 2, False, sequence_parallel, moe, cp)
    s, b, h = model.seq // cp, micro_batch, model.hidden
    replicas = tp if sequence_parallel else 1
    projection_input = model.attention_output_dim if model.mla else h  # (ordinary heads: counted hidden wide)
    saved = 2 * 2 * s * b * h / replicas + 0.5 * s * b * projection_input / tp  # the norms' outputs; E5M6
    if model.mla:  # the latents' norms' outputs; Q, K, V; less the rotary key kept for the recomputation
        saved += (2 * s * b * (model.latent_width - model.mla.qk_rope_head_dim) / replicas
                  + 2 * s * b * (model.q_dim + model.kv_dim + model.value_dim) / tp)
    if moe and model.moe and model.mlp == "swiglu":
        expert_passes = model.moe.routed_per_token + model.moe.shared_experts
        saved += (s * b * h * model.moe.routed_per_token  # FP8 for bf16 routed copies
                  + (2 * MLP_WIDE_VALUES[model.mlp] - 2) * s * b * expert_passes * model.moe.expert_ffn) / tp
    return baseline - saved
