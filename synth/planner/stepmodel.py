"""The step model: predicted time and memory per device of one training step of
a transformer under tensor (tp), context (cp), expert (ep), data (dp) and
pipeline (pp) parallelism (cp, ep, MoE, HSDP and FP8: docs/planner.md).

Notation: B global batch, b micro-batch, m = B / (dp b) micro-batches per step,
L layers, L_s = L / pp layers per stage (with uneven stages,
``Configuration.stage_layers`` and :mod:`synth.planner.stages`: the stage with
the most layers for tp calls, the slowest stage for compute, every kind of stage
for memory), v virtual stages per device (1: plain
1F1B), s sequence, h hidden, P_s the parameters of a stage, bytes per value
``w`` (2 for bf16/fp16, 4 for fp32). Every term (docs/planner.md has the
sources):

* compute: ``m t_mb``, ``t_mb`` one micro-batch per device
  (:func:`compute_estimate`). With a per-operation profile it is the slowest
  stage's operations (:mod:`synth.planner.layercompute` and
  :mod:`synth.planner.stagecompute`: GEMMs, attention,
  elementwise passes, embedding on the first stage, logits and loss on the
  last, a fixed cost per micro-batch, an unfused attention's softmax and
  dropout passes at the elementwise rate), and the optimizer step is a term of its
  own; with the efficiency curve ``t_mb = F_mb / (peak x efficiency(x))``, F_mb
  the training FLOPs of one micro-batch per device (the model's,
  :mod:`synth.planner.flops`, divided by tp pp: stages are taken as
  balanced), ``x = F_mb / L_s`` (:mod:`synth.planner.compute`), the optimizer
  folded into the fitted efficiency, plus an unfused attention's softmax and
  dropout passes (:mod:`synth.planner.scores`) and the layers' other
  elementwise passes, the embedding's and the loss's
  (:mod:`synth.planner.curvepasses`), at the device's memory bandwidth;
* tensor parallelism (Megatron-LM): per micro-batch and layer two all-reduces of
  ``b s h w`` bytes forward and two backward, two more for the recomputed
  forward under full recomputation; on the critical path. With sequence
  parallelism (Korthikanti et al. 2022; on by default where tp > 1) the norms,
  residuals and dropouts run on ``s / tp`` of the sequence, and each
  all-reduce becomes the pair of an all-gather (before the tensor-parallel
  GEMMs) and a reduce-scatter (after them), the same bytes; with
  ``--tp-overlap`` each runs beside a GEMM as Transformer Engine's userbuffers
  run it, and what the GEMM does not hide, or loses to the kernels' SMs, shows
  (:func:`tp_overlap_exposed_s`; the backward's two extra all-gathers, of the
  normalised input, with them), and the per-operation model prices those GEMMs
  in its chunks (:func:`~synth.planner.layercompute.tp_overlap_chunk_ops`);
* pipeline parallelism: per micro-batch one send of the activations forward and
  one of their gradients backward between adjacent stages (``b s h w / tp`` per
  tensor-parallel rank: Megatron's scatter/gather), v times with interleaving;
  on the critical path;
* the pipeline bubble (:mod:`synth.planner.schedules`): ``(pp - 1) / v``
  micro-batch slots in 1F1B (v = 1) and interleaved 1F1B, a slot being
  ``t_mb`` plus its tp and pp communication (Narayanan et al. 2021);
  ``(pp - 1) (slot - 2 t_W)`` in zero-bubble ZB-H1 (Qi et al. 2024), ``t_W``
  the weight-gradient share of ``t_mb`` (by FLOPs: the weight GEMMs of the
  layers and of the output layer); ``(pp/2 - 1) (slot + t_B - 3 t_W)`` in
  DualPipe (DeepSeek-V3, Table 2), ``t_B`` the backward's share of the slot.
  Under DualPipe each rank runs stages ``i`` and ``pp - 1 - i``, half the
  micro-batches each: ``t_mb``, the layers behind the tp, cp and ep terms and
  the parameters behind the dp term are the slowest rank's (its two stages'
  mean; their parameters together);
* context parallelism, per layer and micro-batch, the keys and values of the
  device's ``s / cp`` tokens (``2 b (s / cp) kv w / tp`` bytes, ``kv`` the
  key/value width): Megatron-LM's ring (``--cp-comm ring``) sends them
  ``cp - 1`` times per pass, each send beside the attention it feeds
  (:func:`overlapped_s`), their gradients too in the backward; Llama 3's
  all-gather (``--cp-comm allgather``, Llama Team 2024, Section 3.3.2)
  gathers the whole sequence's before the attention of each forward, gathers
  them again for the backward (the gathered ones are not held: memory is the
  ring's) and reduce-scatters their gradients after it, all on the critical
  path;
* data parallelism: the gradients of a stage, ``P_s g / tp`` bytes (``g`` the
  bytes the framework reduces them in, :attr:`Training.gradient_reduce_bytes`:
  4 for Megatron-LM's fp32 main gradients under bf16), in buckets
  of ``bucket_bytes`` reduced while the last micro-batch's backward runs (DDP's
  bucketing, DisCo's tensor fusion: the planner picks the bucket size); exposed is
  what outlasts that backward (:func:`overlapped_s`), all of it without overlap;
  interleaved, each model chunk's gradients are reduced once its last backward
  has run (:func:`~synth.planner.overlaps.chunked_overlap_s`).
  ZeRO-1 reduce-scatters the gradients the same way and all-gathers the updated
  16-bit weights after the optimizer step (exposed; ``w / g`` of each bucket's bytes); ZeRO-2 does the same but,
  holding only its shard of the gradients, reduce-scatters after every
  micro-batch's backward (DeepSpeed's stage 2 under gradient accumulation);
  ZeRO-3 (FSDP) all-gathers
  each layer's weights before its forward and its backward and reduce-scatters
  its gradients after the backward, for every micro-batch, overlapped with that
  phase's compute. Every one of these collectives overlapped with compute
  also slows that compute while it runs: its NCCL kernel holds one SM per
  channel (:func:`~synth.planner.overlaps.sm_held_s`, the share from the
  collectives' :meth:`~synth.planner.collectives.Collectives.sm_share`).

Memory per device (:mod:`synth.planner.memory`) is the worst pipeline
stage's (under DualPipe the worst rank's, both its stages'; the first holds the activations of ``min(pp, m)`` micro-batches in
1F1B and ZB-H1, more with interleaving,
:func:`~synth.planner.schedules.in_flight_micro_batches`; the last one
micro-batch but also the output layer's logits): the weights, gradients, fp32
master weights and Adam's moments in the framework's bytes per parameter
(:mod:`synth.planner.frameworks`; Megatron-LM's by default: ``2 + 4 + 12``),
with ``P`` = the stage's parameters / tp (ZeRO-1 divides the optimizer states
by dp, ZeRO-2 also the gradients, ZeRO-3 all three and adds the gathered
weights and gradients of the layers in flight), plus activations
(:meth:`~synth.planner.transformer.Transformer.activation_bytes_per_layer`).
The framework's passes outside the layers (weight casts per micro-batch,
gradient accumulation, the optimizer step's bytes) join the per-operation
compute; the overlaps are in :mod:`synth.planner.overlaps`.

Communication is given as a :class:`~synth.planner.collectives.Collectives`
(seconds for a size in bytes), which :mod:`synth.planner.collectivecosts`
computes with the project's cost model on the configuration's placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import SynthError
from ..synthesis.semantics import Goal
from ..topology import Device
from .collectives import BareCollectives, Collectives
from .compute import ComputeModel, EfficiencyCurve
from .curvepasses import bandwidth_passes_s
from .layercompute import deepseek_recompute_s, layer_compute, recompute_ops, tp_overlap_chunk_ops
from .frameworks import step_overhead_bytes
from .fp8 import moe_alltoall_bytes
from .memory import Memory, memory_per_device
from .operations import OperationProfile
from .optimes import FP8_GEMM_SPEEDUP, Shard
from .overlaps import (
    EP_OVERLAP_SM_SHARE,
    chunked_overlap_s,
    ep_overlap_exposed_s,
    mean_share,
    overlapped_mixed_s,
    overlapped_s,
    sm_held_s,
    tp_overlap_exposed_s,
)
from .schedules import Schedule, bubble_s, rank_mean, rank_stage_kinds
from .scores import unfused_score_elementwise_s
from .stagecompute import embedding_compute, head_compute, mtp_compute, stage_compute
from .stages import StageCosts, kind_costs, slowest_stage
from .training import (
    ATTENTIONS,
    CROSS_ENTROPY_BYTES,
    DTYPE_BYTES,
    Configuration,
    Sharding,
    Training,
    configuration_problem,
    largest_layer_params,
    sequence_parallel,
    stage_kinds,
    stage_mix,
    stage_parameters,
    stage_routed_parameters,
)
from .activations import Recompute
from .transformer import Transformer

# the names of :mod:`synth.planner.training` and :mod:`synth.planner.memory` that callers import from here
__all__ = ["ATTENTIONS", "BUCKET_GRID_BYTES", "CROSS_ENTROPY_BYTES", "DTYPE_BYTES", "HSDP_REPLICATE", "HSDP_SHARD",
           "ComputeEstimate", "Configuration", "EP_OVERLAP_SM_SHARE", "Memory", "Sharding", "StepShape", "StepTime",
           "Training", "bucket_sizes", "compute_estimate", "configuration_problem", "largest_layer_params",
           "memory_per_device", "micro_batch_seconds_for", "overlapped_mixed_s", "overlapped_s", "sequence_parallel",
           "stage_costs", "stage_kinds", "stage_mix", "stage_parameters", "stage_routed_parameters", "step_shape",
           "step_lower_bound_s", "step_time", "step_without_dp_s", "tp_overlap_exposed_s"]

MiB = 2**20
# DP bucket sizes the planner tries: 1 MiB x 4^k up to 4 GiB (DDP's default is 25 MiB)
BUCKET_GRID_BYTES = tuple(MiB * 4**k for k in range(7))


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds of one step, split by term; ``bucket_bytes`` is the
    chosen DP bucket (None: no DP reduction or ZeRO-3's per-layer units)."""

    compute_s: float
    bubble_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    efficiency: float
    micro_batch_s: float  # compute of one micro-batch per device
    bucket_bytes: int | None
    reductions: tuple[tuple[str, Goal, int], ...]  # (axis, goal, size) the step reduces
    optimizer_s: float = 0.0  # the optimizer step (per-operation model; the curve folds it into compute)
    ep_s: float = 0.0  # expert parallelism's all-to-alls, on the critical path
    cp_s: float = 0.0  # context parallelism's ring of keys and values, what the attention does not hide
    alltoalls: tuple[tuple[str, int], ...] = ()  # (axis, bytes per device) of the step's all-to-alls
    accumulate_s: float = 0.0  # the framework's gradient accumulation passes (per-operation model)

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.bubble_s + self.tp_s + self.cp_s + self.ep_s + self.pp_s + self.dp_s
                + self.optimizer_s + self.accumulate_s)

    def breakdown(self) -> dict[str, float]:
        return {"compute": self.compute_s, "bubble": self.bubble_s, "tp": self.tp_s, "cp": self.cp_s,
                "ep": self.ep_s, "pp": self.pp_s, "dp": self.dp_s, "optimizer": self.optimizer_s,
                "accumulate": self.accumulate_s}


@dataclass(frozen=True)
class StepShape:
    """What the step model derives from a configuration before any timing."""

    micro_batches: int
    layers_per_stage: int
    flops_per_micro_batch: float  # per device, with recomputation
    backward_fraction: float  # of a micro-batch's compute: backward and recomputation
    weight_gradient_fraction: float  # of a micro-batch's compute: the weight GEMMs of the backward
    activation_bytes: int  # b s h w: one tp all-reduce, one pipeline send (before / tp)
    gemm_flops: tuple[float, ...]  # per device: one forward of each tensor-parallel GEMM of a layer (QKV, proj, up, down)
    gradient_bytes: int  # per device: the worst stage's dense parameters / tp, in the reduction's bytes (over dp x ep)
    layer_bytes: int  # one layer's parameters per device, in w bytes
    expert_gradient_bytes: int = 0  # per device: its routed experts of that stage, in the reduction's bytes (over dp)
    weight_value_bytes: int = 2  # w, of the weights ZeRO-1/2 all-gather after the step
    gradient_value_bytes: int = 2  # of the reduced gradients (Training.gradient_reduce_bytes)
    moe_layers_per_stage: int = 0  # the most MoE layers a stage holds
    alltoall_bytes: int = 0  # per device: one all-to-all of expert parallelism (the routed token copies)
    kv_bytes: int = 0  # per device: one ring step of context parallelism (its chunk's keys and values)
    attention_fraction: float = 0.0  # of a micro-batch's compute: the attention core (forward and backward)
    outer_params: int = 0  # per device: the worst stage's parameters outside its layers (embedding, output layer)

    @property
    def flops_per_layer(self) -> float:
        return self.flops_per_micro_batch / self.layers_per_stage


def step_shape(model: Transformer, training: Training, config: Configuration) -> StepShape:
    w = training.value_bytes
    flops = model.training_flops(config.micro_batch, training.recompute)
    layout = config.layers_of_stages(model)
    dualpipe = config.schedule is Schedule.DUALPIPE
    if dualpipe and config.stage_layers:  # the slowest rank's mean of its two stages' FLOPs (schedules.rank_mean)
        per_device = rank_mean(config.schedule, config.pp, kind_costs(layout, _flops_stage_costs(model, training, config)))
        per_device /= config.tp * config.cp
    elif config.stage_layers:  # the slowest stage's FLOPs: its layers' share, and the output layer on the last
        per_device = slowest_stage(layout, _flops_stage_costs(model, training, config)) / (config.tp * config.cp)
    else:
        per_device = flops.total / (config.tp * config.pp * config.cp)
    params, routed, kind = rank_parameters(model, config.schedule, layout)
    mix = stage_mix(model, layout)
    blocks = {k: dense + moe_layers for k, (dense, moe_layers) in mix.items()}
    moe = model.moe
    alltoall = 0
    if moe and config.ep > 1:  # each device sends its sequence-parallel share of the routed token copies
        alltoall = math.ceil(config.micro_batch * model.seq * moe.routed_per_token * model.hidden * w
                             / (config.tp * config.cp))
    return StepShape(
        micro_batches=config.micro_batches(training),
        # blocks (the MTP ones on the last): the stage with the most; DualPipe: the largest mean of a rank's two
        layers_per_stage=(rank_mean(config.schedule, config.pp, blocks) if dualpipe
                          else max(layout[:-1] + (layout[-1] + model.mtp_depth,))),
        flops_per_micro_batch=per_device,
        backward_fraction=(flops.backward + flops.recompute) / flops.total,
        weight_gradient_fraction=flops.weight_gradient / flops.total,
        activation_bytes=config.micro_batch * model.seq // config.cp * model.hidden * w,
        gemm_flops=tuple(2.0 * config.micro_batch * model.seq * p / (config.tp * config.cp)
                         for p in (model.moe_layer_gemm_params if moe else model.layer_gemm_params)),
        kv_bytes=config.micro_batch * model.seq // config.cp * (model.kv_dim + model.value_dim) * w // config.tp,
        attention_fraction=((model.layers + model.mtp_depth) * 3 * model.attention_core_flops(config.micro_batch * model.seq)
                            / flops.total),
        gradient_bytes=math.ceil((params - routed) / config.tp) * training.gradient_reduce_bytes,
        layer_bytes=math.ceil(largest_layer_params(model) / config.tp) * w,
        expert_gradient_bytes=math.ceil(routed / (config.tp * config.ep)) * training.gradient_reduce_bytes,
        weight_value_bytes=w,
        gradient_value_bytes=training.gradient_reduce_bytes,
        moe_layers_per_stage=(rank_mean(config.schedule, config.pp, {k: moe for k, (_, moe) in mix.items()})
                              if dualpipe else max(moe_layers for _, moe_layers in mix.values())),
        alltoall_bytes=alltoall,
        outer_params=math.ceil((params - sum(model.layers_params(*mix[k]) for k in kind)) / config.tp),
    )


def rank_parameters(model: Transformer, schedule: Schedule, layout: tuple[int, ...]) -> tuple[int, int, tuple[str, ...]]:
    """The parameters of the rank holding the most, its routed experts' among
    them, and the kinds of stage it holds: one stage, or under DualPipe two
    (:func:`~synth.planner.schedules.rank_stage_kinds`), whose parameters it
    holds both of. Ties go to the kinds named last (``middle`` first)."""
    params, routed = stage_parameters(model, layout), stage_routed_parameters(model, layout)
    found = max((sum(params[k] for k, _ in stages), tuple(k for k, _ in stages))
                for stages in rank_stage_kinds(schedule, len(layout)).values())
    return found[0], sum(routed[k] for k in found[1]), found[1]


@dataclass(frozen=True)
class ComputeEstimate:
    """A configuration's compute per device: one micro-batch of the slowest
    pipeline stage (with the framework's weight and gradient casts,
    :func:`~synth.planner.frameworks.step_overhead_bytes`), the fraction of
    peak that is, the optimizer step (with the framework's gradient zeroing,
    casts and copies) and the gradient accumulation over the step's
    micro-batches."""

    micro_batch_s: float
    efficiency: float
    optimizer_s: float = 0.0
    accumulate_s: float = 0.0  # adding each micro-batch's gradients into the held ones, over the step


def compute_estimate(model: Transformer, training: Training, config: Configuration, device: Device,
                     compute: ComputeModel, shape: StepShape | None = None) -> ComputeEstimate:
    """The compute of ``config`` by either model: the efficiency curve (FLOPs
    over a fraction of peak, stages balanced, the optimizer inside the fitted
    efficiency) or the per-operation model (each stage's operations, the
    slowest stage setting the pace, the optimizer step apart)."""
    shape = shape or step_shape(model, training, config)
    if isinstance(compute, EfficiencyCurve):
        efficiency = compute.efficiency(shape.flops_per_layer)
        seconds = shape.flops_per_micro_batch / (device.peak_flops * efficiency)
        if training.fp8:  # the layers' GEMMs at the FP8 speed-up, the rest as before
            gemms = _gemm_flops_fraction(model, training, config)
            seconds *= 1 - gemms + gemms / FP8_GEMM_SPEEDUP
            efficiency = shape.flops_per_micro_batch / (device.peak_flops * seconds)
        passes_s = bandwidth_passes_s(model, training, config, shape.layers_per_stage, device)
        if passes_s:
            seconds += passes_s
            efficiency = shape.flops_per_micro_batch / (device.peak_flops * seconds)
        return ComputeEstimate(seconds, efficiency)
    return _operations_estimate(model, training, config, device, compute, shape)


def _gemm_flops_fraction(model: Transformer, training: Training, config: Configuration) -> float:
    """The share of a micro-batch's training FLOPs in the layers' GEMMs
    (recomputed ones included, the MTP modules' too; not the attention core
    nor the logits)."""
    flops = model.training_flops(config.micro_batch, training.recompute)
    heads = 1 + model.mtp_depth  # the output head and each MTP module's pass through it
    layers_gemm = flops.weight_gradient - heads * model.logits_forward_flops(config.micro_batch * model.seq)
    recomputed = layers_gemm if training.recompute is Recompute.FULL else 0.0
    return (3 * layers_gemm + recomputed) / flops.total


def layer_shard(training: Training, config: Configuration, model: Transformer) -> Shard:
    """What one device runs of each layer under ``config``: the shard the
    per-operation model times (FP8 block-scaled where the framework's FP8 is,
    :attr:`~synth.planner.frameworks.Framework.fp8_blocks`)."""
    return Shard(config.tp, config.micro_batch, model.seq, sequence_parallel(training, config), config.ep,
                 training.fp8, config.cp, training.fp8_blocks)


def kernel_model(model: Transformer, training: Training) -> Transformer:
    """The model as the per-operation model times its layers: under
    ``--attention unfused`` the score passes (:mod:`synth.planner.scores`)
    price the attention's dropout as kernels of their own, so the attention
    core runs without the model's ``attention_dropout`` (not counted twice)."""
    if training.attention == "unfused" and model.attention_dropout:
        return replace(model, attention_dropout=0.0)
    return model


def _operations_estimate(model: Transformer, training: Training, config: Configuration, device: Device,
                         compute: OperationProfile, shape: StepShape) -> ComputeEstimate:
    model = kernel_model(model, training)
    shard = layer_shard(training, config, model)
    layout = config.layers_of_stages(model)
    mix = stage_mix(model, layout)
    again_s = 0.0  # per layer: what DeepSeek-V3 recomputes in the backward (frameworks.deepseek_activation_bytes)
    if training.recipe.recomputes_norms and training.recompute is Recompute.NONE:
        again_s = deepseek_recompute_s(compute, model, shard)
    chunks_s = (0.0, 0.0)  # per dense and MoE layer: its GEMMs in Transformer Engine's chunks (--tp-overlap)
    if training.tp_overlap:
        again = 1 if training.recompute is Recompute.FULL else 0  # the recomputed forward runs them so too
        chunks_s = tuple(c.total_s + again * c.forward_s
                         for c in (tp_overlap_chunk_ops(compute, model, shard, moe) for moe in (False, True)))
    scores_s = unfused_score_elementwise_s(model, training, config, 1, compute.elementwise)  # per layer; 0 for flash
    # each kind of stage's transformer blocks: its layers, and the MTP modules' on the last (stage_mix); the
    # slowest stage sets the pace, under DualPipe the slowest rank's mean of its two (schedules.rank_mean)
    per_kind = {kind: stage_compute(compute, model, shard, dense + moe, training.recompute, kind in ("first", "only"),
                                    kind in ("last", "only"), moe, training.cross_entropy,
                                    torchtitan=training.recipe.name == "torchtitan").total_s
                + (dense + moe) * (again_s + scores_s) + dense * chunks_s[0] + moe * chunks_s[1]
                for kind, (dense, moe) in mix.items()}
    micro_batch_s = rank_mean(config.schedule, config.pp, per_kind)
    params, routed, _ = rank_parameters(model, config.schedule, layout)
    dense, experts = (params - routed) / config.tp, routed / (config.tp * config.ep)
    held = dense + experts  # the parameters the device computes with
    updated = held
    if training.sharding is not Sharding.NONE:  # ZeRO updates its shard only
        updated = dense / config.dense_shards + experts / config.expert_shards
    per_micro_batch, accumulate, optimizer = step_overhead_bytes(training.recipe, held, updated, shape.micro_batches,
                                                                training.sharding in (Sharding.ZERO3, Sharding.HSDP),
                                                                config.dense_shards, training.dtype == "fp16")
    moved_s = compute.elementwise.bytes_seconds
    micro_batch_s += float(moved_s(per_micro_batch)) if per_micro_batch else 0.0
    efficiency = shape.flops_per_micro_batch / (device.peak_flops * micro_batch_s)
    return ComputeEstimate(micro_batch_s, efficiency, float(moved_s(optimizer)),
                           float(moved_s(accumulate)) if accumulate else 0.0)


def _flops_stage_costs(model: Transformer, training: Training, config: Configuration) -> StageCosts:
    """One micro-batch's training FLOPs (recomputation included) per layer and
    of the output layer with the multi-token prediction modules; the
    embedding does none."""
    flops = model.training_flops(config.micro_batch, training.recompute)
    last = 3 * model.logits_forward_flops(config.micro_batch * model.seq)
    last += model.mtp_training_flops(config.micro_batch, training.recompute)
    return StageCosts((flops.total - last) / model.layers, 0.0, last)


def stage_costs(model: Transformer, training: Training, config: Configuration, compute: ComputeModel) -> StageCosts:
    """One micro-batch's cost per layer, embedding and output layer (with the
    multi-token prediction modules, each a layer and :func:`mtp_compute`) on
    one device, for balancing the stages (:func:`~synth.planner.stages.balanced_layers`):
    seconds by the per-operation model, FLOPs by the efficiency curve (which
    prices them all at one rate)."""
    if isinstance(compute, EfficiencyCurve):
        return _flops_stage_costs(model, training, config)
    model = kernel_model(model, training)
    shard = layer_shard(training, config, model)
    layer = layer_compute(compute, model, shard, model.moe_layers > 0)  # an MoE model's layers: as its MoE layers
    layer = layer + recompute_ops(compute, model, shard, training.recompute, layer)
    last_s = head_compute(compute, model, shard, training.cross_entropy).total_s
    if model.mtp_depth:
        last_s += model.mtp_depth * (layer.total_s + mtp_compute(compute, model, shard, training.cross_entropy).total_s)
    return StageCosts(layer.total_s, embedding_compute(compute, model, shard).total_s, last_s)


def step_time(
    model: Transformer,
    training: Training,
    config: Configuration,
    collectives: Collectives,
    micro_batch_s: float,
    efficiency: float = float("nan"),
    shape: StepShape | None = None,
    optimizer_s: float = 0.0,
    memo: dict | None = None,
    data_parallel: bool = True,
    accumulate_s: float = 0.0,
) -> StepTime:
    """The step's predicted seconds, given one micro-batch's compute time per
    device (:func:`compute_estimate`, or a measured or fitted one) and the
    optimizer step's. ``memo``: a dict kept with ``collectives`` (one
    placement) in which the data-parallel term, the same for every schedule of
    a configuration with the same virtual stages, is reused. ``data_parallel=False`` leaves that term out
    (0): the step is then a lower bound of the full one."""
    shape = shape or step_shape(model, training, config)
    m, v = shape.micro_batches, config.virtual_stages
    reductions: list[tuple[str, Goal, int]] = []
    tp_mb = 0.0
    if config.tp > 1:
        passes = 3 if training.recompute is Recompute.FULL else 2  # forward, backward, recomputed forward
        calls = shape.layers_per_stage * 2 * passes  # all-reduces: two per layer and pass
        if sequence_parallel(training, config):  # each all-reduce becomes an all-gather and a reduce-scatter
            gather = collectives.reduce("tp", Goal.ALLGATHER, shape.activation_bytes)
            scatter = collectives.reduce("tp", Goal.REDUCESCATTER, shape.activation_bytes)
            if training.tp_overlap:
                gemms_s = [micro_batch_s * flops / shape.flops_per_micro_batch for flops in shape.gemm_flops]
                forward, backward = tp_overlap_exposed_s(gather, scatter, gemms_s, config.tp)
                tp_mb = shape.layers_per_stage * ((passes - 1) * forward + backward)
            else:
                tp_mb = calls * (gather + scatter)
            reductions += [("tp", Goal.ALLGATHER, shape.activation_bytes),
                           ("tp", Goal.REDUCESCATTER, shape.activation_bytes)]
        else:
            tp_mb = calls * collectives.reduce("tp", Goal.ALLREDUCE, shape.activation_bytes)
            reductions.append(("tp", Goal.ALLREDUCE, shape.activation_bytes))
    ep_mb = 0.0
    if shape.alltoall_bytes:  # per MoE layer and pass: the dispatch to the experts and the combine back
        passes = 3 if training.recompute is Recompute.FULL else 2
        size = shape.alltoall_bytes
        if model.moe and model.moe.max_nodes:  # node-limited routing: one copy per node reached
            copies = model.moe.node_copies_per_token(collectives.nodes("ep"))
            size = math.ceil(size * copies / model.moe.routed_per_token)
        if training.fp8_blocks:  # each pass: one all-to-all in FP8, one in BF16
            fp8_size, bf16_size = moe_alltoall_bytes(size)
            layer_alltoalls_s = passes * (collectives.alltoall("ep", math.ceil(fp8_size))
                                          + collectives.alltoall("ep", math.ceil(bf16_size)))
        else:
            layer_alltoalls_s = 2 * passes * collectives.alltoall("ep", size)
        if training.ep_overlap:  # beside another micro-batch's computation of the layer
            layer_alltoalls_s = ep_overlap_exposed_s(layer_alltoalls_s, micro_batch_s / shape.layers_per_stage)
        ep_mb = shape.moe_layers_per_stage * layer_alltoalls_s
    cp_mb = 0.0
    if config.cp > 1 and training.cp_comm == "allgather":  # gathered before the attention, exposed (docstring)
        passes = 3 if training.recompute is Recompute.FULL else 2
        gathered = config.cp * shape.kv_bytes
        gather_s = collectives.reduce("cp", Goal.ALLGATHER, gathered)
        scatter_s = collectives.reduce("cp", Goal.REDUCESCATTER, gathered)
        cp_mb = shape.layers_per_stage * (passes * gather_s + scatter_s)
        reductions += [("cp", Goal.ALLGATHER, gathered), ("cp", Goal.REDUCESCATTER, gathered)]
    elif config.cp > 1:  # ring attention: cp - 1 steps per layer and pass, beside the attention they feed
        passes = 3 if training.recompute is Recompute.FULL else 2
        ring_step_s = collectives.send("cp", shape.kv_bytes)
        attention_s = micro_batch_s * shape.attention_fraction / shape.layers_per_stage  # forward and backward
        forward = overlapped_s(config.cp - 1, ring_step_s, attention_s / 3)
        backward = overlapped_s(config.cp - 1, 2 * ring_step_s, attention_s * 2 / 3)  # their gradients too
        cp_mb = shape.layers_per_stage * ((passes - 1) * forward + backward)
    pp_mb = 0.0
    if config.pp > 1:
        pp_mb = 2 * v * collectives.send("pp", max(1, shape.activation_bytes // config.tp))
    slot = micro_batch_s + tp_mb + ep_mb + cp_mb + pp_mb
    key = (training.sharding, training.overlap_dp, training.overlap_param_gather, config.dense_axes, config.expert_axes,
           config.pp, v, shape.gradient_bytes,
           shape.expert_gradient_bytes, shape.micro_batches, shape.layer_bytes, shape.layers_per_stage,
           shape.backward_fraction, micro_batch_s)
    found = memo.get(key) if memo is not None else None
    if not data_parallel:
        found = (0.0, None, [])
    elif found is None:
        found = _data_parallel(training, config, collectives, shape, micro_batch_s)
        if memo is not None:
            memo[key] = found
    dp_s, bucket, dp_reductions = found
    reductions.extend(dp_reductions)
    return StepTime(
        compute_s=m * micro_batch_s,
        bubble_s=bubble_s(config.schedule, config.pp, v, slot, micro_batch_s * shape.weight_gradient_fraction,
                          slot * shape.backward_fraction),
        tp_s=m * tp_mb,
        pp_s=m * pp_mb,
        dp_s=dp_s,
        efficiency=efficiency,
        micro_batch_s=micro_batch_s,
        bucket_bytes=bucket,
        reductions=tuple(reductions),
        optimizer_s=optimizer_s,
        accumulate_s=accumulate_s,
        ep_s=m * ep_mb,
        cp_s=m * cp_mb,
        alltoalls=_alltoall_sizes(training, shape.alltoall_bytes),
    )


def _alltoall_sizes(training: Training, alltoall_bytes: int) -> tuple[tuple[str, int], ...]:
    """The step's all-to-alls, (axis, bytes per device): the MoE payload in
    16 bits, and in FP8 too where the framework dispatches in FP8
    (:func:`~synth.planner.fp8.moe_alltoall_bytes`)."""
    if not alltoall_bytes:
        return ()
    if training.fp8_blocks:
        return ("ep", math.ceil(moe_alltoall_bytes(alltoall_bytes)[0])), ("ep", alltoall_bytes)
    return (("ep", alltoall_bytes),)


class _FreeCollectives(BareCollectives):
    """Collectives that cost nothing (:func:`step_lower_bound_s`)."""

    def reduce(self, axis: str, goal: Goal, size_bytes: int) -> float:
        return 0.0

    def send(self, axis: str, size_bytes: int) -> float:
        return 0.0

    def alltoall(self, axis: str, size_bytes: int) -> float:
        return 0.0


def step_without_dp_s(model: Transformer, training: Training, config: Configuration, collectives: Collectives,
                      shape: StepShape, compute: ComputeEstimate) -> float:
    """The step on ``collectives`` less its data-parallel term (at least 0):
    no step whose every collective costs at least these ``collectives``' is
    shorter (no term decreases as a collective's cost grows)."""
    return step_time(model, training, config, collectives, compute.micro_batch_s, compute.efficiency, shape,
                     compute.optimizer_s, None, False, compute.accumulate_s).total_s


def step_lower_bound_s(model: Transformer, training: Training, config: Configuration, shape: StepShape,
                       compute: ComputeEstimate) -> float:
    """The step with free communication: no placement's step is shorter
    (:func:`step_without_dp_s`)."""
    return step_without_dp_s(model, training, config, _FreeCollectives(), shape, compute)


def _data_parallel(training: Training, config: Configuration, collectives: Collectives, shape: StepShape,
                   micro_batch_s: float) -> tuple[float, int | None, list[tuple[str, Goal, int]]]:
    """Exposed DP seconds, the chosen bucket size and the reductions used: the
    dense weights' gradients over dp x cp x ep (:attr:`Configuration.dense_axes`),
    the routed experts' over dp x cp, in buckets of one size."""
    dense_axes = config.dense_axes
    if not dense_axes:
        return 0.0, None, []
    backward_s = micro_batch_s * shape.backward_fraction
    if training.sharding is Sharding.ZERO3:  # not with ep > 1 (configuration_problem); over dp x cp with cp
        size = shape.layer_bytes
        # the gradients reduce-scattered as the weights are gathered, or wider (torchtitan: reduce_dtype fp32)
        reduce_bytes = training.recipe.zero3_reduce_bytes or shape.weight_value_bytes
        scattered = size // shape.weight_value_bytes * reduce_bytes
        gather = collectives.reduce(dense_axes, Goal.ALLGATHER, size)
        scatter = collectives.reduce(dense_axes, Goal.REDUCESCATTER, scattered)
        n = shape.layers_per_stage
        gather_share = collectives.sm_share(dense_axes, Goal.ALLGATHER, size)
        both_share = mean_share([(gather, gather_share),
                                 (scatter, collectives.sm_share(dense_axes, Goal.REDUCESCATTER, scattered))])
        per_micro_batch = (sm_held_s(n * gather, overlapped_s(n, gather, micro_batch_s - backward_s), gather_share)
                           + sm_held_s(n * (gather + scatter), overlapped_s(n, gather + scatter, backward_s),
                                       both_share))
        exposed = shape.micro_batches * per_micro_batch
        if training.recipe.root_unit and shape.outer_params:  # once a step, before the first layer and after the last
            exposed += (collectives.reduce(dense_axes, Goal.ALLGATHER, shape.outer_params * shape.weight_value_bytes)
                        + collectives.reduce(dense_axes, Goal.REDUCESCATTER, shape.outer_params * reduce_bytes))
        return (exposed, None, [(dense_axes, Goal.ALLGATHER, size), (dense_axes, Goal.REDUCESCATTER, scattered)])
    if training.sharding is Sharding.HSDP:
        return _hsdp(collectives, shape, micro_batch_s, backward_s)
    sharded = training.sharding in (Sharding.ZERO1, Sharding.ZERO2)
    goal = Goal.REDUCESCATTER if sharded else Goal.ALLREDUCE
    # ZeRO-2 keeps no full gradients to accumulate in: every micro-batch's backward reduce-scatters its own
    reductions = shape.micro_batches if training.sharding is Sharding.ZERO2 else 1
    sets = [(dense_axes, shape.gradient_bytes)]  # (axes, bytes per device) of each set of gradients
    if shape.expert_gradient_bytes and config.expert_axes:
        sets.append((config.expert_axes, shape.expert_gradient_bytes))
    best: tuple[float, int] | None = None
    chunks = config.virtual_stages if config.pp > 1 else 1
    for bucket in bucket_sizes(sum(size for _, size in sets)):
        transfers = [(math.ceil(size / bucket), collectives.reduce(axes, goal, bucket)) for axes, size in sets]
        total = sum(n * each for n, each in transfers)
        # overlapped, each costs the computation beside it the SMs its kernels hold (sm_held_s)
        if not training.overlap_dp:
            exposed = reductions * total
        elif chunks > 1 and reductions == 1:  # interleaved: each model chunk's reduction after its last backward
            exposed = sm_held_s(total, chunked_overlap_s(total, chunks, config.pp * backward_s),
                                _sets_share(collectives, transfers, sets, goal, bucket))
        else:
            exposed = reductions * sm_held_s(total, overlapped_mixed_s(transfers, backward_s),
                                             _sets_share(collectives, transfers, sets, goal, bucket))
        if sharded:  # the updated 16-bit weights of each bucket's gradients
            weights = _weights_of(bucket, shape)
            gathers = [(n, collectives.reduce(axes, Goal.ALLGATHER, weights))
                       for (n, _), (axes, _) in zip(transfers, sets)]
            gathered = sum(n * each for n, each in gathers)
            if training.overlap_param_gather and chunks > 1:  # each model chunk's before its first forward
                exposed += sm_held_s(gathered, chunked_overlap_s(gathered, chunks,
                                                                 config.pp * (micro_batch_s - backward_s)),
                                     _sets_share(collectives, gathers, sets, Goal.ALLGATHER, weights))
            elif training.overlap_param_gather:  # beside the next step's first forward, bucket by bucket
                exposed += sm_held_s(gathered, overlapped_mixed_s(gathers, micro_batch_s - backward_s),
                                     _sets_share(collectives, gathers, sets, Goal.ALLGATHER, weights))
            else:
                exposed += gathered
        if best is None or exposed < best[0]:
            best = (exposed, bucket)
    assert best is not None
    used = [(axes, goal, best[1]) for axes, _ in sets]
    if sharded:
        used += [(axes, Goal.ALLGATHER, _weights_of(best[1], shape)) for axes, _ in sets]
    return best[0], best[1], used


def _sets_share(collectives: Collectives, transfers: list[tuple[int, float]], sets: list[tuple[str, int]],
                goal: Goal, size_bytes: int) -> float:
    """The SM share of the buckets of each set of gradients (``transfers``:
    their count and seconds each, ``sets``: their axes), one set after
    another (:func:`~synth.planner.overlaps.mean_share`)."""
    if len(sets) == 1:
        return collectives.sm_share(sets[0][0], goal, size_bytes)
    return mean_share([(n * each, collectives.sm_share(axes, goal, size_bytes))
                       for (n, each), (axes, _) in zip(transfers, sets)])


def _weights_of(bucket_bytes: int, shape: StepShape) -> int:
    """The bytes of the weights whose gradients fill a bucket of
    ``bucket_bytes``: the gradients may be reduced in wider values than
    the weights are gathered in (Megatron-LM: fp32 gradients, bf16
    weights)."""
    return max(1, bucket_bytes * shape.weight_value_bytes // shape.gradient_value_bytes)


HSDP_SHARD, HSDP_REPLICATE = "dp_shard", "dp_replicate"  # the sub-axes of dp an HSDP step reduces over


def _hsdp(collectives: Collectives, shape: StepShape, micro_batch_s: float,
          backward_s: float) -> tuple[float, int | None, list[tuple[str, Goal, int]]]:
    """HSDP's exposed seconds: ZeRO-3's per-layer all-gathers (before the
    forward and the backward) and reduce-scatter (after the backward) over the
    shard group, and the all-reduce of the reduce-scattered shard over the
    replicate group after it (FSDP2's HSDP), each phase's transfers overlapped
    with that phase's compute; every micro-batch. ``collectives`` prices the
    sub-axes ``dp_shard`` and ``dp_replicate`` (and says their sizes)."""
    size = shape.layer_bytes
    shard, replicate = collectives.size(HSDP_SHARD), collectives.size(HSDP_REPLICATE)
    gather = collectives.reduce(HSDP_SHARD, Goal.ALLGATHER, size)
    scatter = collectives.reduce(HSDP_SHARD, Goal.REDUCESCATTER, size)
    used = [(HSDP_SHARD, Goal.ALLGATHER, size), (HSDP_SHARD, Goal.REDUCESCATTER, size)]
    across = 0.0
    if replicate > 1:
        shard_bytes = max(1, size // shard)
        across = collectives.reduce(HSDP_REPLICATE, Goal.ALLREDUCE, shard_bytes)
        used.append((HSDP_REPLICATE, Goal.ALLREDUCE, shard_bytes))
    n = shape.layers_per_stage
    gather_share = collectives.sm_share(HSDP_SHARD, Goal.ALLGATHER, size)
    backward_share = mean_share([(gather, gather_share),
                                 (scatter, collectives.sm_share(HSDP_SHARD, Goal.REDUCESCATTER, size))]
                                + ([(across, collectives.sm_share(HSDP_REPLICATE, Goal.ALLREDUCE, shard_bytes))]
                                   if replicate > 1 else []))
    per_micro_batch = (sm_held_s(n * gather, overlapped_s(n, gather, micro_batch_s - backward_s), gather_share)
                       + sm_held_s(n * (gather + scatter + across),
                                   overlapped_s(n, gather + scatter + across, backward_s), backward_share))
    return shape.micro_batches * per_micro_batch, None, used


def bucket_sizes(gradient_bytes: int) -> tuple[int, ...]:
    """The grid sizes a DP bucket may take for ``gradient_bytes`` of gradients:
    those not above it (at least the smallest). Each of the ``ceil(G / bucket)``
    buckets is costed at the full bucket size (the last one as if padded)."""
    fitting = tuple(b for b in BUCKET_GRID_BYTES if b <= gradient_bytes)
    return fitting or BUCKET_GRID_BYTES[:1]


def micro_batch_seconds_for(
    model: Transformer,
    training: Training,
    config: Configuration,
    collectives: Collectives,
    measured_step_s: float,
    where: str = "record",
    optimizer_s: float = 0.0,
) -> float:
    """The compute time of one micro-batch per device that makes the step model
    predict ``measured_step_s`` (bisection: the step time grows with it)."""
    shape = step_shape(model, training, config)

    def total(t: float) -> float:
        return step_time(model, training, config, collectives, t, shape=shape, optimizer_s=optimizer_s).total_s

    floor = total(0.0)
    if measured_step_s <= floor:
        raise SynthError(f"{where}: the measured step ({measured_step_s:.4g} s) is not longer than the predicted "
                         f"communication alone ({floor:.4g} s); check the record or the communication profile")
    low, high = 0.0, measured_step_s
    while total(high) < measured_step_s:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        if total(mid) < measured_step_s:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2

