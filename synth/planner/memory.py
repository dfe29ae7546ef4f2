"""Memory per device of one training step: the worst pipeline stage's
(under DualPipe the worst rank's, its two stages' together)
weights, gradients, optimizer states and activations (the accounting is in
:mod:`synth.planner.stepmodel`'s docstring and docs/planner.md), the states
in the bytes per parameter of the training's framework
(:mod:`synth.planner.frameworks`: e.g. Megatron-LM's fp32 main gradients,
autocast's bf16 weight copies of a plain PyTorch loop)."""

from __future__ import annotations

from dataclasses import dataclass

from .frameworks import deepseek_activation_bytes, sac_activation_bytes
from .schedules import in_flight_micro_batches, rank_stage_kinds
from .training import (CROSS_ENTROPY_BYTES, Configuration, Sharding, Training, largest_layer_params, sequence_parallel,
                       stage_mix, stage_parameters, stage_routed_parameters)
from .activations import Recompute
from .transformer import Transformer


# What PyTorch's caching allocator reserves over the bytes allocated at the peak, as a fraction of that peak:
# the median of reserved_bytes / peak_bytes - 1 over the 11 single-GPU steps of
# data/calibration/h100-memory.jsonl (spread 1.6-14.4%). A measured property of the allocator under these
# workloads, not a bound; `Memory.reserved` applies it, feasibility keeps using `--memory-margin`.
ALLOCATOR_RESERVE_FRACTION = 0.0447


@dataclass(frozen=True)
class Memory:
    """Bytes per device of the worst pipeline stage."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    stage: str  # "first", "middle", "last" or "only"; under DualPipe the rank's: "first+last" or "middle"

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations

    @property
    def reserved(self) -> float:
        """What the caching allocator is expected to reserve for this peak
        (:data:`ALLOCATOR_RESERVE_FRACTION`): what ``max_memory_reserved``, and
        torchtitan's logged memory, read."""
        return self.total * (1 + ALLOCATOR_RESERVE_FRACTION)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "total": self.total, "reserved": self.reserved,
                "stage": self.stage}


def memory_per_device(model: Transformer, training: Training, config: Configuration,
                      hsdp_shard: int | None = None) -> Memory:
    """Memory per device of the worst stage (module docstring); under HSDP
    the states are sharded over ``hsdp_shard`` devices (the placement's shard
    group; default dp, which is ZeRO-3)."""
    w = training.value_bytes
    recipe = training.recipe  # bytes per parameter of each state (synth.planner.frameworks)
    optimizer_bytes = recipe.master_bytes + recipe.moment_bytes
    weight_bytes, gradient_bytes = recipe.weight_bytes, recipe.gradient_bytes
    m = config.micro_batches(training)
    scores = training.attention == "unfused"
    sp = sequence_parallel(training, config)
    per_layer, per_moe_layer = (model.activation_bytes_per_layer(config.micro_batch, config.tp, training.recompute, w,
                                                                 scores, sp, moe, config.cp) for moe in (False, True))
    sac = recipe.name == "torchtitan" and training.recompute is Recompute.SELECTIVE
    if sac:  # torchtitan's operator-level selective checkpointing of the dense layers
        per_layer = sac_activation_bytes(model, config.micro_batch, config.tp, config.cp, sp) * w / 2
    if recipe.recomputes_norms and training.recompute is Recompute.NONE:  # DeepSeek-V3's own storage
        per_layer, per_moe_layer = (deepseek_activation_bytes(model, config.micro_batch, config.tp, moe, config.cp, sp)
                                    for moe in (False, True))
    working = 0.0  # full (or torchtitan's selective) recomputation rebuilds one layer's activations at a time
    if training.recompute is Recompute.FULL or sac:
        working = max(model.activation_bytes_per_layer(config.micro_batch, config.tp, Recompute.NONE, w, scores, sp,
                                                       moe, config.cp) for moe in (False, model.moe_layers > 0))
    layout = config.layers_of_stages(model)
    mix = stage_mix(model, layout)
    routed = stage_routed_parameters(model, layout)
    params_of = stage_parameters(model, layout)

    def stage_memory(stage: str, index: int, gathered: bool) -> Memory:
        """One stage's share: ``stage``'s kind, ``index`` its place in the
        pipeline (its micro-batches in flight), ``gathered`` whether ZeRO-3's
        gathered layers are counted with it (once per device)."""
        params = params_of[stage]
        # dense weights split over tp and replicated over dp x ep; routed experts split over tp x ep
        dense, experts = (params - routed[stage]) / config.tp, routed[stage] / (config.tp * config.ep)
        held = dense + experts
        weights = (weight_bytes + recipe.cast_copy_bytes) * held
        gradients, optimizer = gradient_bytes * held, optimizer_bytes * held
        sharded = dense / config.dense_shards + experts / config.expert_shards  # one device's ZeRO shard
        if training.sharding is Sharding.ZERO1:
            optimizer = optimizer_bytes * sharded
        elif training.sharding is Sharding.ZERO2:
            gradients, optimizer = gradient_bytes * sharded, optimizer_bytes * sharded
        elif training.sharding in (Sharding.ZERO3, Sharding.HSDP):
            if training.sharding is Sharding.HSDP:  # ep = cp = 1 (configuration_problem)
                sharded = held / (hsdp_shard or config.dp)
            weights, gradients, optimizer = weight_bytes * sharded, gradient_bytes * sharded, optimizer_bytes * sharded
            if gathered:
                layer = largest_layer_params(model) / config.tp
                weights += 2 * w * layer  # the layer computing and the one prefetched, gathered
                gradients += w * layer  # one layer's full gradients before the reduce-scatter
        in_flight = in_flight_micro_batches(config.schedule, config.pp, index, m, config.virtual_stages)
        dense_layers, moe_layers = mix[stage]
        activations = in_flight * (dense_layers * per_layer + moe_layers * per_moe_layer)
        if stage in ("last", "only"):
            loss_bytes = CROSS_ENTROPY_BYTES[training.cross_entropy]
            if recipe.logits_freed and training.cross_entropy == "eager":
                loss_bytes -= 2  # the bf16 logits are gone before the backward
            heads = 1 + model.mtp_depth  # each MTP module's loss holds its logits too, until the backward
            activations += heads * model.logits_bytes(config.micro_batch, config.tp, config.cp) * loss_bytes / 4
            activations += model.mtp_depth * in_flight * mtp_input_bytes(model, config, w, sp)
        return Memory(weights, gradients, optimizer, activations, stage)

    worst: Memory | None = None
    # each kind of rank: one stage, or under DualPipe two, whose states and activations it holds both of
    for rank, stages in rank_stage_kinds(config.schedule, config.pp).items():
        parts = [stage_memory(stage, index, i == 0) for i, (stage, index) in enumerate(stages)]
        weights, gradients, optimizer, activations = (sum(getattr(p, f) for p in parts)
                                                      for f in ("weights", "gradients", "optimizer", "activations"))
        activations += working
        if recipe.gradients_freed and m == 1 and training.sharding not in (Sharding.ZERO3, Sharding.HSDP):
            # one micro-batch and no gradients at its start: the backward makes them as it frees the
            # activations, so the peak is the larger of the two (the gradients counted are what exceeds)
            gradients = max(0.0, gradients - activations)
        memory = Memory(weights, gradients, optimizer, activations, rank)
        if worst is None or memory.total > worst.total:
            worst = memory
    assert worst is not None
    return worst


def mtp_input_bytes(model: Transformer, config: Configuration, bytes_per_value: int, sp: bool) -> float:
    """What one multi-token prediction module stores for its backward beside
    its block (whose activations are a layer's) and its loss (the logits'):
    its two inputs before their norms and the 2h-wide concatenation the
    projection reads, ``4 s b h`` values per micro-batch (``s / cp`` of the
    sequence; split over tp with sequence parallelism, as a layer's norm
    inputs are)."""
    values = 4 * model.seq // config.cp * config.micro_batch * model.hidden
    return bytes_per_value * values / (config.tp if sp else 1)
