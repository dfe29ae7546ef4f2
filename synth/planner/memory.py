"""Memory per device of one training step: the worst pipeline stage's
weights, gradients, optimizer states and activations (the accounting is in
:mod:`synth.planner.stepmodel`'s docstring and docs/planner.md)."""

from __future__ import annotations

from dataclasses import dataclass

from .schedules import in_flight_micro_batches
from .training import (CROSS_ENTROPY_BYTES, Configuration, Sharding, Training, largest_layer_params, sequence_parallel,
                       stage_mix, stage_parameters, stage_routed_parameters)
from .transformer import Recompute, Transformer


@dataclass(frozen=True)
class Memory:
    """Bytes per device of the worst pipeline stage."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    stage: str  # "first", "last" or "only"

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations

    def to_dict(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "total": self.total, "stage": self.stage}



def memory_per_device(model: Transformer, training: Training, config: Configuration,
                      hsdp_shard: int | None = None) -> Memory:
    """Memory per device of the worst stage (module docstring); under HSDP
    the states are sharded over ``hsdp_shard`` devices (the placement's shard
    group; default dp, which is ZeRO-3)."""
    w = training.value_bytes
    optimizer_bytes = 12 if w == 2 else 8  # fp32 master + Adam m, v; fp32 training has no master copy
    m = config.micro_batches(training)
    scores = training.attention == "unfused"
    sp = sequence_parallel(training, config)
    per_layer, per_moe_layer = (model.activation_bytes_per_layer(config.micro_batch, config.tp, training.recompute, w,
                                                                 scores, sp, moe, config.cp) for moe in (False, True))
    working = 0.0  # full recomputation rebuilds one layer's activations at a time
    if training.recompute is Recompute.FULL:
        working = max(model.activation_bytes_per_layer(config.micro_batch, config.tp, Recompute.NONE, w, scores, sp,
                                                       moe, config.cp) for moe in (False, model.moe_layers > 0))
    layout = config.layers_of_stages(model)
    mix = stage_mix(model, layout)
    routed = stage_routed_parameters(model, layout)
    worst: Memory | None = None
    for stage, params in stage_parameters(model, layout).items():
        # dense weights split over tp and replicated over dp x ep; routed experts split over tp x ep
        dense, experts = (params - routed[stage]) / config.tp, routed[stage] / (config.tp * config.ep)
        weights, gradients, optimizer = w * (dense + experts), w * (dense + experts), optimizer_bytes * (dense + experts)
        sharded = dense / config.dense_shards + experts / config.expert_shards  # one device's ZeRO shard
        if training.sharding is Sharding.ZERO1:
            optimizer = optimizer_bytes * sharded
        elif training.sharding is Sharding.ZERO2:
            gradients, optimizer = w * sharded, optimizer_bytes * sharded
        elif training.sharding in (Sharding.ZERO3, Sharding.HSDP):
            if training.sharding is Sharding.HSDP:  # ep = cp = 1 (configuration_problem)
                sharded = (dense + experts) / (hsdp_shard or config.dp)
            weights, gradients, optimizer = w * sharded, w * sharded, optimizer_bytes * sharded
            layer = largest_layer_params(model) / config.tp
            weights += 2 * w * layer  # the layer computing and the one prefetched, gathered
            gradients += w * layer  # one layer's full gradients before the reduce-scatter
        index = {"first": 0, "middle": 1, "last": config.pp - 1, "only": 0}[stage]
        in_flight = in_flight_micro_batches(config.schedule, config.pp, index, m, config.virtual_stages)
        dense_layers, moe_layers = mix[stage]
        activations = in_flight * (dense_layers * per_layer + moe_layers * per_moe_layer) + working
        if stage in ("last", "only"):
            activations += model.logits_bytes(config.micro_batch, config.tp, config.cp) \
                * CROSS_ENTROPY_BYTES[training.cross_entropy] / 4
        memory = Memory(weights, gradients, optimizer, activations, stage)
        if worst is None or memory.total > worst.total:
            worst = memory
    assert worst is not None
    return worst
