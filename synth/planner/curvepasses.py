"""The efficiency curve's bandwidth-bound passes: a layer's elementwise work.

The efficiency curve (:mod:`synth.planner.compute`) prices a layer from its
FLOPs; the passes that do no counted FLOPs move bytes that grow as ``tokens x
h`` while the GEMMs grow as ``tokens x h^2``, so their share of a step is
about ``1 / h``. An unfused attention's score passes are priced apart
(:mod:`synth.planner.scores`); this module counts the others, per micro-batch
on one device, as the code of Narayanan et al. 2021 (SC'21: NVIDIA/Megatron-LM
at commit 2babcaf6f5) runs them, in the training dtype's ``w`` bytes a value
(masks one byte), and prices them like the score passes: at the device's
datasheet memory bandwidth (``Device.memory_bandwidth_GBps``), a lower bound
(kernels reach a fraction of it; the fitted curve absorbs the rest).

Per layer (``megatron/model/transformer.py`` ``ParallelTransformerLayer.forward``,
lines 439-527), with ``T`` tokens of the micro-batch on the device (``b s /
cp``), ``R`` the tokens of the residual stream (``T``, or ``T / t`` under
sequence parallelism), ``t`` the tensor-parallel size, ``A = T (q + 2 kv) /
t`` the QKV outputs, ``C = T q / t`` the attention's context values and
``F = T f / t`` the MLP's activations (``m F`` inputs, ``m = 2`` for a gated
MLP), values of ``w`` bytes:

forward
  * two LayerNorms (lines 445 and 483; apex's fused mixed-precision kernel,
    ``megatron/model/fused_layer_norm.py`` lines 30-44): read ``R h``, write
    ``R h`` each (:data:`NORM_VALUES`);
  * the QKV GEMM's bias (``megatron/mpu/layers.py`` lines 283-284:
    ``F.linear`` on a 3-D input with its bias, which PyTorch of that era adds
    in place after the product): read and write ``A``; models without biases
    have none;
  * the context's layout copy back to ``[s, b, h]`` (line 338,
    ``.contiguous()`` after a permute): read and write ``C`` (an unfused
    attention's; a flash kernel writes that layout itself);
  * the activation with the up-projection's bias, fused (lines 91-98,
    ``megatron/model/fused_bias_gelu.py`` lines 31-34 and 50-52): read ``m F``,
    write ``F``;
  * the two residual branches' bias, dropout and add, fused by TorchScript
    (lines 357-379 and 466-522; the projections' biases are held back for it,
    ``skip_bias_add``): read the branch's and the residual's ``R h``, write
    ``R h`` and, with dropout, the 1-byte mask
    (:data:`~synth.planner.layercompute.RESIDUAL_DROPOUT_BYTES`);

backward
  * each LayerNorm (``fused_layer_norm.py`` lines 47-58; apex's backward reads
    the output gradient and the saved input once for the weight and bias
    gradients and once for the input gradient, and writes that): five values
    of ``R h``;
  * each residual branch: with dropout the mask applied to its gradient
    (``RESIDUAL_DROPOUT_BYTES``), with a bias the bias gradient's sum over the
    tokens (``expand_as``'s backward: read ``R h``), and the two gradients of
    the branch's input (the residual's and the LayerNorm's) added where they
    meet: read two, write one of ``R h``;
  * the activation's backward (``fused_bias_gelu.py`` lines 39-45 and 54-58):
    read the output gradient ``F`` and the saved inputs ``m F``, write their
    gradients ``m F``; with a bias, its gradient summed over the tokens (read
    ``m F``: autograd reduces the returned full-size gradient);
  * the QKV split's backward (``megatron/mpu/utils.py`` line 46,
    ``torch.split``, whose backward concatenates): read and write ``A``; with a
    bias, its gradient's sum (read ``A``);
  * rotary positions (not in that code; models that use them): one read and
    write of the ``T (q + kv) / t`` queries and keys each way.

An MoE layer's MLP (not in that code) has its activation over the shared
experts' and the routed token copies' widths and the routed copies'
permutation into expert order and back, a read and a write of ``T top_k h /
t`` each way, forward and backward.

Full recomputation (``--checkpoint-activations``, which every SC'21 row
used: ``transformer.py`` lines 596-620 and 660-664, ``megatron/mpu/random.py``
lines 279-301) runs each layer's forward passes again in the backward;
selective recomputation reruns the attention core only, whose passes
:mod:`synth.planner.scores` counts.

Outside the layers, once per micro-batch: the embedding (first stage,
``megatron/model/language_model.py`` lines 188-202: the word gather, read
and write ``T h``; learned positions, another gather and the add of the two
(read two, write one); with dropout ``torch.nn.Dropout``,
:data:`~synth.planner.layercompute.EMBEDDING_DROPOUT_BYTES`; backward, the
dropout's and each gather's gradient read once) and the head (last stage:
the final LayerNorm as a layer's, and the loss over ``T V / t`` logits as the
``--cross-entropy`` kind moves them,
:data:`~synth.planner.stagecompute.LOSS_BYTES_PER_LOGIT`; the SC'21 code's
``vocab_parallel_cross_entropy`` on ``output.float()``,
``megatron/model/gpt_model.py`` lines 52-56 and
``megatron/mpu/cross_entropy.py`` lines 25-105, moves the same passes as
``megatron``'s). The curve takes pipeline stages as balanced (it spreads the
logits' FLOPs over them), so these are spread too: ``1 / pp`` of them per
device.

Not counted: the per-token fp32 LayerNorm statistics (8 bytes a token), the
``[b, s, h]`` to ``[s, b, h]`` copies around the stack (``transformer.py``
lines 652 and 686: four values of ``T h`` a micro-batch, under 0.2% of these
passes), the heads and losses of multi-token prediction modules (their blocks
count as layers), and everything that scales with the parameters rather than the
tokens (weight gradients' accumulation, the embedding's weight gradient, the
optimizer step): the curve folds those into its fitted efficiency.

The term applies to every prediction of the curve, whatever
``--framework``: every transformer layer runs these passes, and the curve is
fitted on the SC'21 runs with them taken out. Frameworks differ in the
detail, which the fitted efficiency absorbs: torchtitan's eager RMSNorm moves
more (:mod:`synth.planner.eagerops`); newer Megatron-LM folds the QKV bias into
its GEMM (``24 h / t`` bytes a token and layer in fp16 with recomputation:
12% of these at tp 1, 3% at tp 8). The per-operation model prices its
own elementwise passes from a measured profile
(:mod:`synth.planner.layercompute`, :mod:`synth.planner.stagecompute`) and has no use for this one. A device
without a ``memory_bandwidth_GBps`` has the curve alone.
"""

from __future__ import annotations

from ..topology import Device
from .activations import Recompute
from .layercompute import EMBEDDING_DROPOUT_BYTES, RESIDUAL_DROPOUT_BYTES
from .scores import unfused_score_s
from .stagecompute import LOSS_BYTES_PER_LOGIT
from .training import Configuration, Training, sequence_parallel
from .transformer import Transformer

# values (of the training dtype) per element each pass moves (module docstring), (forward, backward)
NORM_VALUES = (2, 5)  # fused LayerNorm: read and write; read the gradient and the input twice, write the gradient
RESIDUAL_ADD_VALUES = (3, 3)  # read the branch and the residual, write the sum; the two gradients meet
BIAS_VALUES = (2, 1)  # a bias added in place (read, write); its gradient summed over the tokens (read)
COPY_VALUES = 2  # a layout copy or a concatenation: read and write


def _layer_values(model: Transformer, training: Training, config: Configuration,
                  moe: bool) -> tuple[float, float, float, float]:
    """One layer's passes on one device per micro-batch: (forward values,
    forward dropout bytes, backward values, backward dropout bytes)."""
    t, h, q, kv = config.tp, model.hidden, model.q_dim, model.kv_dim
    tokens = config.micro_batch * model.seq / config.cp
    stream = (tokens / t if sequence_parallel(training, config) else tokens) * h  # R h
    qkv, context = tokens * (q + 2 * kv) / t, tokens * q / t
    m = model.mlp_matrices - 1
    if moe and model.moe is not None:
        copies = tokens * model.moe.routed_per_token
        activations = (model.moe.shared_experts * tokens + copies) * model.moe.expert_ffn / t
        permuted = 2 * copies * h / t  # into expert order and back
    else:
        activations, permuted = tokens * model.ffn / t, 0.0
    forward = 2 * NORM_VALUES[0] * stream + 2 * RESIDUAL_ADD_VALUES[0] * stream + (m + 1) * activations
    backward = 2 * NORM_VALUES[1] * stream + 2 * RESIDUAL_ADD_VALUES[1] * stream + (1 + 2 * m) * activations
    backward += COPY_VALUES * qkv  # the QKV split's backward
    forward, backward = forward + COPY_VALUES * permuted, backward + COPY_VALUES * permuted
    if training.attention == "unfused":
        forward += COPY_VALUES * context
    if model.biases:
        forward += BIAS_VALUES[0] * qkv
        backward += BIAS_VALUES[1] * (qkv + m * activations + 2 * stream)
    if model.positions == "rotary":
        rotated = tokens * (q + kv) / t
        forward, backward = forward + COPY_VALUES * rotated, backward + COPY_VALUES * rotated
    dropout = (0.0, 0.0)
    if model.dropout:  # RESIDUAL_DROPOUT_BYTES per value of each branch: bytes, not values
        dropout = (2 * RESIDUAL_DROPOUT_BYTES[0] * stream, 2 * RESIDUAL_DROPOUT_BYTES[1] * stream)
    return forward, dropout[0], backward, dropout[1]


def layer_pass_bytes(model: Transformer, training: Training, config: Configuration,
                     moe: bool = False) -> tuple[float, float]:
    """Bytes of one layer's passes (module docstring) on one device per
    micro-batch, (forward, backward); the backward's includes the forward's
    again under full recomputation. ``moe``: an MoE layer."""
    w = training.value_bytes
    forward, forward_dropout, backward, backward_dropout = _layer_values(model, training, config, moe)
    forward_bytes, backward_bytes = w * forward + forward_dropout, w * backward + backward_dropout
    if training.recompute is Recompute.FULL:
        backward_bytes += forward_bytes
    return forward_bytes, backward_bytes


def outer_pass_bytes(model: Transformer, training: Training, config: Configuration) -> tuple[float, float]:
    """Bytes of the embedding's and the head's passes (module docstring) per
    micro-batch on the devices that run them, (forward, backward)."""
    w, h = training.value_bytes, model.hidden
    tokens = config.micro_batch * model.seq / config.cp
    stream = (tokens / config.tp if sequence_parallel(training, config) else tokens) * h
    tables = 2 if model.positions == "learned" else 1
    forward = w * (COPY_VALUES * tables + (RESIDUAL_ADD_VALUES[0] if tables == 2 else 0)) * tokens * h
    backward = w * tables * tokens * h
    if model.dropout:
        forward += EMBEDDING_DROPOUT_BYTES[0] * tokens * h
        backward += EMBEDDING_DROPOUT_BYTES[1] * tokens * h
    logits = tokens * model.vocab / config.tp
    loss = LOSS_BYTES_PER_LOGIT[training.cross_entropy]
    forward += w * NORM_VALUES[0] * stream + loss[0] * logits
    backward += w * NORM_VALUES[1] * stream + loss[1] * logits
    return forward, backward


def curve_pass_bytes(model: Transformer, training: Training, config: Configuration, layers: float) -> float:
    """Bytes one device moves in these passes for one micro-batch of
    ``layers`` layers (dense and MoE in the model's proportion) and its
    ``1 / pp`` share of the embedding's and the head's."""
    dense = sum(layer_pass_bytes(model, training, config))
    per_layer = dense
    if model.moe is not None and model.moe_layers:
        moe = sum(layer_pass_bytes(model, training, config, True))
        per_layer = (model.dense_layers * dense + model.moe_layers * moe) / model.layers
    return layers * per_layer + sum(outer_pass_bytes(model, training, config)) / config.pp


def curve_pass_s(model: Transformer, training: Training, config: Configuration, layers: float,
                 device: Device) -> float:
    """Seconds of :func:`curve_pass_bytes` at the device's datasheet memory
    bandwidth (a lower bound); 0 for a device without one."""
    bandwidth = device.memory_bandwidth_Bps
    return curve_pass_bytes(model, training, config, layers) / bandwidth if bandwidth else 0.0


def bandwidth_passes_s(model: Transformer, training: Training, config: Configuration, layers: float,
                       device: Device) -> float:
    """Everything the efficiency curve prices apart from its FLOPs, for one
    micro-batch of ``layers`` layers at the device's datasheet memory
    bandwidth: an unfused attention's score passes
    (:func:`~synth.planner.scores.unfused_score_s`) and the passes of this
    module (:func:`curve_pass_s`). The one sum that the curve's prediction adds
    (:func:`synth.planner.stepmodel.compute_estimate`) and its fit takes out of
    each record (:func:`synth.planner.stepfit.implied`), so the two agree."""
    return (unfused_score_s(model, training, config, layers, device)
            + curve_pass_s(model, training, config, layers, device))
