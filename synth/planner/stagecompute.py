"""One pipeline stage's micro-batch on one device, timed by a per-operation
profile (:mod:`synth.planner.operations`): its layers
(:mod:`synth.planner.layercompute`, whose symbols this module uses: T tokens
of a micro-batch, hidden size h, tensor-parallel size t; V is the
vocabulary), the embedding on the first stage, the head, loss and
multi-token prediction modules on the last, the micro-batch's fixed cost,
and the host's time issuing it.

* Embedding (first stage): a gather of T h values forward (``add``'s rate);
  backward the gradient's V h / t values zeroed and T h accumulated. GPT's
  learned positions add one more add over T h.
* Head (last stage): the final norm, the logits GEMM ``(T, h, V / t)`` with its
  two backward GEMMs, and the cross-entropy in fp32 over T V / t logits,
  priced in bytes at the bandwidth ``add`` reaches: forward 14 bytes per logit
  (read bf16, write fp32, read and write fp32 for the log-softmax), backward
  14 (the softmax gradient in fp32 and its bf16 copy); PyTorch's
  ``F.cross_entropy(logits.float())`` (``--cross-entropy eager``) moves 22
  backward: ``nll_loss``'s fp32 gradient written (4), the log-softmax
  backward reading it and the saved output and writing its own (12), and the
  cast's backward to bf16 (read 4, write 2); Megatron-LM's unfused
  vocabulary-parallel cross-entropy (``--cross-entropy megatron``) moves 38
  forward and 14 backward (:func:`megatron_loss_bytes`).
* Multi-token prediction (last stage, per module, :func:`mtp_compute`): its
  block as a layer, the embedding's lookup of the shifted tokens, the two
  input norms, their concatenation, the projection ``(T, 2h, h / t)`` and the
  head and loss again.
* Issue ahead: a stage's micro-batch runs without a synchronisation, so it
  lasts the larger of its operations' GPU time and the host's time issuing
  its layers' kernels (:func:`stage_host_s`, :func:`issued_ahead`).
* The optimizer step and the framework's passes outside the layers (weight
  casts, gradient accumulation): :mod:`synth.planner.frameworks`.
"""

from __future__ import annotations

from ..caches import memoised
from .activations import Recompute
from .layercompute import EAGER_LAUNCHES, EMBEDDING_DROPOUT_BYTES, layer_compute, layer_launches, recompute_ops
from .operations import OperationProfile
from .optimes import ComputeTime, OpTime, Shard, bytes_pass_ops, gemm_ops, pass_ops
from .torchtitanops import torchtitan_eager_ops, torchtitan_layer_launches, torchtitan_recompute_ops
from .transformer import Transformer

# bytes per logit the loss moves (forward, backward) per --cross-entropy (module docstring;
# megatron: megatron_loss_bytes)
def megatron_loss_bytes() -> tuple[int, int]:
    """Bytes per logit (forward, backward) of Megatron-LM's vocabulary-parallel
    cross-entropy without ``--cross-entropy-loss-fusion`` (off by default:
    ``megatron/training/arguments.py`` line 1134 at f2e5db402c; the GPT model
    then calls ``tensor_parallel.vocab_parallel_cross_entropy``,
    ``megatron/core/models/common/language_module/language_module.py`` line
    40), each of its passes over the logits as
    ``megatron/core/tensor_parallel/cross_entropy.py`` at f2e5db402c runs it
    (the per-token gathers and all-reduces aside). Forward: the bf16 logits
    cast to fp32 (``.float()``, line 27: read 2, write 4), their maximum (line
    29: read 4), the maximum subtracted in place (line 43: read 4, write 4),
    ``exp`` in place (line 62: read 4, write 4), its sum (line 63: read 4) and
    the division by it in place (line 75: read 4, write 4): 38. Backward: the
    softmax times the output gradient in place (line 112: read 4, write 4)
    and the cast's backward to bf16 (read 4, write 2): 14."""
    forward = (2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4)
    backward = (4 + 4) + (4 + 2)
    return forward, backward


LOSS_BYTES_PER_LOGIT = {"fused": (14, 14), "eager": (14, 22), "megatron": megatron_loss_bytes()}


@memoised(maxsize=4096)  # stage_costs and stage_compute ask for the same shards
def embedding_compute(profile: OperationProfile, model: Transformer, shard: Shard) -> ComputeTime:
    tokens, h = shard.tokens, model.hidden
    e = profile.elementwise
    ops = [OpTime("embedding", "forward", (tokens, h), float(e.seconds("add", tokens * h))),
           OpTime("embedding.backward", "backward", (model.vocab // shard.tp, h),
                  float(e.seconds("add", model.vocab * h // shard.tp)) + float(e.seconds("add", tokens * h)))]
    if model.positions == "learned":
        ops += pass_ops(profile, "positions", "add", tokens * h, 1)
    if model.dropout:
        ops += bytes_pass_ops(profile, "embedding_dropout", tokens * h, EMBEDDING_DROPOUT_BYTES)
    return ComputeTime(tuple(ops))


@memoised(maxsize=4096)  # stage_costs and stage_compute ask for the same shards
def head_compute(profile: OperationProfile, model: Transformer, shard: Shard, loss: str = "fused") -> ComputeTime:
    """The final norm, the logits GEMM and the loss (``loss``: the
    ``--cross-entropy`` kind, :data:`LOSS_BYTES_PER_LOGIT`)."""
    tokens, h = shard.tokens, model.hidden
    logits = tokens * model.vocab // shard.tp
    forward_s, backward_s = (float(profile.elementwise.bytes_seconds(n * logits)) for n in LOSS_BYTES_PER_LOGIT[loss])
    ops = pass_ops(profile, "final_norm", "layer_norm", shard.replicated_tokens * h, 2)
    ops += gemm_ops(profile, "logits", tokens, h, model.vocab // shard.tp)
    ops += [OpTime("loss", "forward", (logits,), forward_s), OpTime("loss.backward", "backward", (logits,), backward_s)]
    return ComputeTime(tuple(ops))


@memoised(maxsize=4096)  # stage_costs and stage_compute ask for the same shards
def mtp_compute(profile: OperationProfile, model: Transformer, shard: Shard, loss: str = "fused") -> ComputeTime:
    """One multi-token prediction module beside its block (which runs as a
    layer, :func:`~synth.planner.layercompute.layer_compute`), on the last stage: the shared embedding's
    lookup of the shifted tokens (as :func:`embedding_compute` gathers, its
    T h gradient accumulated backward), the norms of the two inputs (as a
    layer's norms), their concatenation (one pass over 2 T h values at
    ``add``'s rate; its backward is views), the projection GEMM ``(T, 2h,
    h / t)`` (FP8 where the layers' GEMMs are) and the shared output head
    with its own loss (:func:`head_compute`). Named ``mtp.<operation>``."""
    tokens, h, e = shard.tokens, model.hidden, profile.elementwise
    ops = [OpTime("embedding", "forward", (tokens, h), float(e.seconds("add", tokens * h))),
           OpTime("embedding.backward", "backward", (tokens, h), float(e.seconds("add", tokens * h)))]
    for name in ("embedding_norm", "hidden_norm"):
        ops += pass_ops(profile, name, "layer_norm", shard.replicated_tokens * h, 2)
    ops += pass_ops(profile, "concat", "add", 2 * shard.replicated_tokens * h, 0)
    ops += gemm_ops(profile, "projection", tokens, 2 * h, h // shard.tp, shard.fp8_gemms)
    ops += head_compute(profile, model, shard, loss).ops
    return ComputeTime(tuple(OpTime(f"mtp.{op.name}", op.phase, op.shape, op.seconds) for op in ops))


def micro_batch_fixed_s(profile: OperationProfile) -> float:
    """The fixed cost of one micro-batch: the profile's own (fitted on step
    records) or, without one, a standalone attention backward call's fixed
    cost beyond the forward kernel's (the autograd call, from the smallest
    attention records)."""
    if profile.micro_batch_s:
        return profile.micro_batch_s
    return max(0.0, profile.attention.backward_floor_s - profile.attention.forward_floor_s)


@memoised(maxsize=8192)  # every schedule and recomputation search variant of a configuration asks again
def stage_compute(profile: OperationProfile, model: Transformer, shard: Shard, layers: int, recompute: Recompute,
                  first: bool, last: bool, moe_layers: int = 0, loss: str = "fused",
                  torchtitan: bool = False) -> ComputeTime:
    """One micro-batch of one pipeline stage of ``layers`` layers, of which
    ``moe_layers`` have experts: forward, backward and recomputation, the
    embedding on the first stage, the head and loss (``loss``: its
    ``--cross-entropy`` kind) on the last, with the rest of the model's
    multi-token prediction modules (:func:`mtp_compute`; their blocks are
    among ``layers``, :func:`~synth.planner.training.stage_mix`), and the
    micro-batch's fixed cost. ``torchtitan``: the layers and the head as
    torchtitan's Llama runs them eagerly
    (:func:`~synth.planner.torchtitanops.torchtitan_eager_ops`), and selective
    recomputation its operator-level one
    (:func:`~synth.planner.torchtitanops.torchtitan_recompute_ops`)."""

    def eager(ops: ComputeTime) -> ComputeTime:
        return torchtitan_eager_ops(profile, model, shard, ops) if torchtitan else ops

    def again(layer: ComputeTime) -> ComputeTime:
        if torchtitan and recompute is Recompute.SELECTIVE:
            return torchtitan_recompute_ops(profile, model, shard, layer)
        return recompute_ops(profile, model, shard, recompute, layer)

    layer = eager(layer_compute(profile, model, shard))
    one = layer + again(layer)
    total = one.times(layers - moe_layers)
    if moe_layers:
        expert_layer = eager(layer_compute(profile, model, shard, True))
        total = total + (expert_layer + again(expert_layer)).times(moe_layers)
    if first:
        total = total + embedding_compute(profile, model, shard)
    if last:
        total = total + eager(head_compute(profile, model, shard, loss))
        if model.mtp_depth:
            total = total + mtp_compute(profile, model, shard, loss).times(model.mtp_depth)
    total = total + ComputeTime((OpTime("micro_batch_fixed", "backward", (), micro_batch_fixed_s(profile)),))
    return issued_ahead(total, layers * stage_host_s(profile, model, recompute, torchtitan))


def stage_host_s(profile: OperationProfile, model: Transformer, recompute: Recompute,
                 torchtitan: bool = False) -> float:
    """The host's seconds issuing one layer's kernels in a micro-batch: its
    forward and backward launches
    (:func:`~synth.planner.layercompute.layer_launches`) at the profile's
    seconds per launch, and the forward's again under full recomputation (the
    attention core's two under selective), at the forward's rate;
    ``torchtitan``: torchtitan's eager Llama and its selective checkpointing
    (:func:`~synth.planner.torchtitanops.torchtitan_layer_launches`)."""
    forward, backward = layer_launches(model)
    selective = EAGER_LAUNCHES["attention"][0]
    if torchtitan:
        forward, backward, selective = torchtitan_layer_launches(model)
    again = {Recompute.NONE: 0, Recompute.FULL: forward, Recompute.SELECTIVE: selective}
    return (forward + again[recompute]) * profile.host.forward_launch_s + backward * profile.host.backward_launch_s


def issued_ahead(stretch: ComputeTime, host_s: float) -> ComputeTime:
    """A stretch of work issued without a synchronisation (a stage's
    micro-batch: its forward, loss and backward): the host queues kernels
    ahead of the GPU, so the stretch lasts the larger of the GPU's time (its
    operations without the per-phase ``host_issue``, which bounds a layer
    timed alone) and the host's ``host_s``; the excess, if any, is one
    ``host_issue`` operation."""
    gpu = tuple(op for op in stretch.ops if op.name not in ("host_issue", "host_issue.recompute"))
    gpu_s = sum(op.seconds for op in gpu)
    if host_s <= gpu_s:
        return ComputeTime(gpu)
    return ComputeTime(gpu + (OpTime("host_issue", "backward", (), host_s - gpu_s),))
