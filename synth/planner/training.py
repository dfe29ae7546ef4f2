"""What a training job is before any timing: the training options
(:class:`Training`), a configuration's axis sizes and micro-batch
(:class:`Configuration`), whether a configuration can run a model
(:func:`configuration_problem`), and what each kind of pipeline stage holds
(:func:`stage_kinds`, :func:`stage_parameters`). The step model
(:mod:`synth.planner.stepmodel`) times them and :mod:`synth.planner.memory`
counts their memory."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property

from ..errors import SynthError
from ..units import MAX_COUNT, shown_number
from .activations import Recompute
from .frameworks import Framework, at_dtype, framework_of
from .schedules import Schedule, schedule_problem
from .stages import describe_layers
from .transformer import Transformer


# bytes of the weights, activations and communication; fp8 is BF16 training whose layers' GEMMs run in
# FP8 (Transformer Engine's and torchtitan's float8 recipes), with the same 16-bit tensors around them
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
ATTENTIONS = ("flash", "unfused")
# how context parallelism exchanges keys and values: Megatron-LM's ring (each step beside the attention it feeds)
# or Llama 3's all-gather before the attention (exposed; stepmodel.step_time)
CP_COMMS = ("ring", "allgather")
# the loss's memory at the start of the backward, in bytes per logit (s b V / (t cp) of them): Megatron-LM's fused
# vocabulary-parallel cross-entropy keeps the fp32 logits and overwrites them with their gradient (4); PyTorch's
# F.cross_entropy on ``logits.float()`` (torchtitan, plain eager loops) keeps the bf16 logits (2), the fp32
# log-softmax it saved (4), and makes the fp32 gradients of its output and of its input (4 + 4); Megatron-LM's
# unfused one (megatron/core/tensor_parallel/cross_entropy.py at f2e5db402c) saves the fp32 softmax it computed in
# place in the logits' fp32 copy and multiplies it in place by the output gradient (4)
CROSS_ENTROPY_BYTES = {"fused": 4, "eager": 14, "megatron": 4}


class Sharding(enum.Enum):
    """Sharding over dp (Rajbhandari et al. 2020, "ZeRO"): none, ZeRO-1
    (optimizer states), ZeRO-2 (and gradients), ZeRO-3 / FSDP (and weights),
    HSDP (ZeRO-3 inside a shard group of dp, replicated across the groups:
    the shard group is dp's split at the innermost hierarchy level it spans,
    so it depends on the placement)."""

    NONE = "none"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    HSDP = "hsdp"

    @classmethod
    def from_text(cls, text: str, option: str = "--sharding") -> "Sharding":
        aliases = {"fsdp": "zero3", "zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3"}
        text = aliases.get(text.lower(), text.lower())
        for s in cls:
            if s.value == text:
                return s
        raise SynthError(f"{option} {text}: choose one of none, zero1, zero2, zero3 (fsdp), hsdp")


@dataclass(frozen=True)
class Training:
    """How the job trains: global batch (sequences per step), dtype, optimizer
    sharding, recomputation, whether DP reductions overlap the backward, the
    attention kernel, sequence parallelism (Megatron-LM's, applied where
    tp > 1: :func:`sequence_parallel`), whether its collectives overlap
    their GEMMs (:func:`tp_overlap_exposed_s`) and how the loss is computed,
    for its memory (:data:`CROSS_ENTROPY_BYTES`), and the framework whose
    states and passes outside the layers the step counts
    (:mod:`synth.planner.frameworks`)."""

    global_batch: int
    dtype: str = "bf16"
    sharding: Sharding = Sharding.NONE
    recompute: Recompute = Recompute.NONE
    overlap_dp: bool = True
    attention: str = "flash"  # flash: no s x s scores stored; unfused: they are (Megatron-LM before flash attention)
    sequence_parallel: bool = True
    tp_overlap: bool = False  # tensor-parallel collectives overlapped with their GEMMs (with sequence parallelism)
    cross_entropy: str = "fused"  # the loss's memory: CROSS_ENTROPY_BYTES
    framework: str = "megatron"  # the states and the step's passes outside the layers: synth.planner.frameworks
    overlap_param_gather: bool = False  # ZeRO-1/2's all-gather of the updated weights beside the next forward
    ep_overlap: bool = False  # MoE all-to-alls beside another micro-batch's computation (DualPipe-style)
    cp_comm: str = "ring"  # CP_COMMS: context parallelism's exchange of keys and values

    def __post_init__(self) -> None:
        if self.tp_overlap and not self.sequence_parallel:
            raise SynthError("--tp-overlap needs --sequence-parallel on: Megatron-LM overlaps the tensor-parallel "
                             "all-gathers and reduce-scatters of sequence parallelism with their GEMMs")
        if self.attention not in ATTENTIONS:
            raise SynthError(f"--attention {self.attention}: choose one of {', '.join(ATTENTIONS)}")
        if self.cp_comm not in CP_COMMS:
            raise SynthError(f"--cp-comm {self.cp_comm}: choose one of {', '.join(CP_COMMS)}")
        if self.cross_entropy not in CROSS_ENTROPY_BYTES:
            raise SynthError(f"--cross-entropy {self.cross_entropy}: choose one of {', '.join(CROSS_ENTROPY_BYTES)}")
        framework_of(self.framework)  # SynthError naming the choices
        if self.overlap_param_gather and self.sharding not in (Sharding.ZERO1, Sharding.ZERO2):
            raise SynthError("--overlap-param-gather needs --sharding zero1 or zero2: it overlaps the all-gather of "
                             "the weights the sharded optimizer updated (Megatron-LM's distributed optimizer)")
        if self.dtype not in DTYPE_BYTES:
            raise SynthError(f"--dtype {self.dtype}: choose one of {', '.join(DTYPE_BYTES)}")
        if isinstance(self.global_batch, bool) or not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise SynthError(f"--global-batch {self.global_batch!r}: must be an integer >= 1")
        if self.global_batch > MAX_COUNT:
            raise SynthError(f"--global-batch {shown_number(str(self.global_batch))}: at most {MAX_COUNT:,} sequences")

    @property
    def value_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def fp8(self) -> bool:
        """The layers' GEMMs run in FP8 (``--dtype fp8``)."""
        return self.dtype == "fp8"

    @property
    def fp8_blocks(self) -> bool:
        """FP8 scaled as DeepSeek-V3 scales it, per tile and block, with FP8
        dispatch (the framework's :attr:`~synth.planner.frameworks.Framework.fp8_blocks`)."""
        return self.fp8 and self.recipe.fp8_blocks

    def to_dict(self) -> dict:
        return {"global_batch": self.global_batch, "dtype": self.dtype, "sharding": self.sharding.value,
                "recompute": self.recompute.value, "overlap_dp": self.overlap_dp, "attention": self.attention,
                "sequence_parallel": self.sequence_parallel, "tp_overlap": self.tp_overlap,
                "cross_entropy": self.cross_entropy, "framework": self.framework,
                "overlap_param_gather": self.overlap_param_gather, "ep_overlap": self.ep_overlap,
                "cp_comm": self.cp_comm}

    @property
    def gradient_reduce_bytes(self) -> int:
        """Bytes per value of the data-parallel gradient reduction (DDP,
        ZeRO-1/2): the gradients as the framework holds them. Megatron-LM
        with bf16 reduces its fp32 main gradients in fp32
        (``validate_args`` sets ``accumulate_allreduce_grads_in_fp32`` for
        bf16 unless ``--grad-reduce-in-bf16``, NVIDIA/Megatron-LM
        megatron/training/arguments.py:1209-1217 at d98e8a64dd; Meta's
        Llama 3 likewise reduce-scatters in fp32, arXiv:2407.21783 Section
        3.3.4); with fp16 it reduces in fp16 (that setting stays off);
        FSDP2's ``reduce_dtype=float32`` (torchtitan) and the eager loops'
        gradients are as :attr:`recipe` holds them."""
        return gradient_reduce_bytes(self.framework, self.dtype)

    @property
    def recipe(self) -> Framework:
        """The framework's states and passes at this dtype (:func:`~synth.planner.frameworks.at_dtype`)."""
        return at_dtype(framework_of(self.framework), self.value_bytes)


def gradient_reduce_bytes(framework: str, dtype: str) -> int:
    """:attr:`Training.gradient_reduce_bytes` of a framework and dtype (also
    what a DP bucket's bytes are counted in, for the exports' bucket sizes in
    gradient elements)."""
    if framework == "megatron" and dtype == "fp16":
        return 2
    return at_dtype(framework_of(framework), DTYPE_BYTES[dtype]).gradient_bytes


@dataclass(frozen=True)
class Configuration:
    """Axis sizes and micro-batch; the pipeline ``schedule`` with its
    ``virtual_stages`` per device (:mod:`synth.planner.schedules`; virtual
    stages > 1 with the default schedule mean interleaved 1F1B, Megatron-LM's
    convention); ``stage_layers``: the layers of each pipeline stage when they
    are not even (:mod:`synth.planner.stages`; empty: ``L / pp`` each)."""

    tp: int
    dp: int
    pp: int
    micro_batch: int
    virtual_stages: int = 1
    stage_layers: tuple[int, ...] = ()
    schedule: Schedule = Schedule.ONE_F_ONE_B
    ep: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        if self.schedule is Schedule.ONE_F_ONE_B and self.virtual_stages > 1:
            object.__setattr__(self, "schedule", Schedule.INTERLEAVED)

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.ep * self.dp * self.pp

    @property
    def replicas(self) -> int:
        """Data-parallel replicas, each on its own data: dp x ep (expert
        parallelism splits the experts, context parallelism the sequence,
        neither the batch)."""
        return self.dp * self.ep

    @property
    def dense_shards(self) -> int:
        """Devices that hold the same dense weights: dp x cp x ep (what their
        gradients reduce over, and ZeRO shards over)."""
        return self.dp * self.cp * self.ep

    @property
    def expert_shards(self) -> int:
        """Devices that hold the same routed experts: dp x cp."""
        return self.dp * self.cp

    def micro_batches(self, training: Training) -> int:
        return training.global_batch // (self.replicas * self.micro_batch)

    def sizes(self) -> dict[str, int]:
        """The axis sizes (``cp`` and ``ep`` where there is context or expert
        parallelism)."""
        return {"tp": self.tp, **({"cp": self.cp} if self.cp > 1 else {}), **({"ep": self.ep} if self.ep > 1 else {}),
                "dp": self.dp, "pp": self.pp}

    @cached_property  # asked at every step prediction; a frozen value's own memo
    def dense_axes(self) -> str:
        """The axes the dense weights' gradients reduce over (``dp``,
        ``dp+ep``, ``dp+cp``, ...; empty: none), as a reduction's axis text."""
        return "+".join(axis for axis, size in (("dp", self.dp), ("cp", self.cp), ("ep", self.ep)) if size > 1)

    @cached_property
    def expert_axes(self) -> str:
        """The axes the routed experts' gradients reduce over: dp and cp."""
        return "+".join(axis for axis, size in (("dp", self.dp), ("cp", self.cp)) if size > 1)

    def describe(self) -> str:
        v = f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        if self.schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE):
            v = f" {self.schedule.value}"
        stages = f" stages={describe_layers(self.stage_layers)}" if self.stage_layers else ""
        ep = f" ep={self.ep}" if self.ep > 1 else ""
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        return f"tp={self.tp}{cp}{ep} dp={self.dp} pp={self.pp} mb={self.micro_batch}{v}{stages}"

    def layers_of_stages(self, model: Transformer) -> tuple[int, ...]:
        """Layers per pipeline stage, first to last."""
        return self.stage_layers or (model.layers // self.pp,) * self.pp


def sequence_parallel(training: Training, config: Configuration) -> bool:
    """Whether the configuration runs sequence parallelism: asked for, and a
    tensor-parallel group to split the sequence over (tp > 1)."""
    return training.sequence_parallel and config.tp > 1


def configuration_problem(model: Transformer, training: Training, config: Configuration) -> str | None:
    """Why the configuration cannot run the model (None if it can)."""
    if config.stage_layers:
        problem = model.parallelism_problem(config.tp, 1, config.ep, config.cp)
        layout = config.stage_layers
        if not problem and (len(layout) != config.pp or sum(layout) != model.layers or min(layout) < 1):
            problem = (f"stages {describe_layers(layout)}: {config.pp} stages of at least one layer each must hold "
                       f"the model's {model.layers} layers")
        if not problem and len(set(layout[1:-1])) > 1:
            problem = (f"stages {describe_layers(layout)}: the stages between the first and the last must hold "
                       "equal layers (the form modelled, Megatron-LM's)")
    else:
        problem = model.parallelism_problem(config.tp, config.pp, config.ep, config.cp)
    if problem:
        return problem
    if config.ep > 1 and training.sharding is Sharding.ZERO3:
        return "ZeRO-3 with expert parallelism is not modelled (use --sharding zero1 or zero2)"
    if (config.cp > 1 or config.ep > 1) and training.sharding is Sharding.HSDP:
        return "HSDP with context or expert parallelism is not modelled (use --sharding zero1 or zero2)"
    if training.global_batch % (config.replicas * config.micro_batch):
        if config.ep > 1:
            return (f"--global-batch {training.global_batch} is not divisible by dp x ep x micro-batch = "
                    f"{config.dp} x {config.ep} x {config.micro_batch}")
        return (f"--global-batch {training.global_batch} is not divisible by dp x micro-batch = "
                f"{config.dp} x {config.micro_batch}")
    return schedule_problem(config.schedule, config.virtual_stages, config.pp, config.micro_batches(training),
                            config.layers_of_stages(model))



def stage_kinds(layout: tuple[int, ...]) -> dict[str, int]:
    """The stages that differ, by kind, with their layers: ``only`` (pp = 1),
    else ``first``, ``last`` and, when pp > 2, ``middle`` (the middle stages
    all hold the same layers; the second stage stands for them, the one with
    the most micro-batches in flight)."""
    if len(layout) == 1:
        return {"only": layout[0]}
    kinds = {"first": layout[0], "last": layout[-1]}
    if len(layout) > 2:
        kinds["middle"] = layout[1]
    return kinds


def stage_mix(model: Transformer, layout: tuple[int, ...]) -> dict[str, tuple[int, int]]:
    """``(dense, moe)`` transformer blocks each kind of pipeline stage
    (:func:`stage_kinds`) runs: its layers (an MoE model's first
    ``dense_layers`` layers are dense, on the first stages) and, on the last,
    the ``mtp_depth`` blocks of the multi-token prediction modules (MoE where
    the model has experts)."""
    starts = {"only": 0, "first": 0, "middle": layout[0], "last": sum(layout[:-1])}
    mix = {kind: model.layer_mix(starts[kind], layers) for kind, layers in stage_kinds(layout).items()}
    if model.mtp_depth:
        kind = "only" if len(layout) == 1 else "last"
        dense, moe = mix[kind]
        mix[kind] = (dense, moe + model.mtp_depth) if model.moe else (dense + model.mtp_depth, moe)
    return mix


def stage_parameters(model: Transformer, layout: tuple[int, ...]) -> dict[str, int]:
    """Parameters of each kind of pipeline stage (:func:`stage_kinds`). With
    tied embeddings and pp > 1 the last stage keeps its own copy of the word
    embeddings for the output layer (as Megatron-LM does). The last holds the
    multi-token prediction modules: their blocks (:func:`stage_mix`) and the
    rest of each (:attr:`~synth.planner.transformer.Transformer.mtp_extra_params`;
    the embedding and head they use are the model's, no other copy)."""
    mtp = model.mtp_depth * model.mtp_extra_params
    head = model.head_params + (model.vocab * model.hidden if model.tied_embeddings and len(layout) > 1 else 0) + mtp
    extra = {"only": model.embedding_params + model.head_params + mtp, "first": model.embedding_params, "last": head,
             "middle": 0}
    return {kind: model.layers_params(dense, moe) + extra[kind] for kind, (dense, moe) in stage_mix(model, layout).items()}


def largest_layer_params(model: Transformer) -> int:
    """The parameters of the model's largest layer (an MoE layer's, all its
    experts, when it has any)."""
    return max(model.layer_params, model.moe_layer_params if model.moe else 0)


def stage_routed_parameters(model: Transformer, layout: tuple[int, ...]) -> dict[str, int]:
    """Of :func:`stage_parameters`, the routed experts' (what ep shards)."""
    return {kind: moe * model.moe_layer_routed_params for kind, (_, moe) in stage_mix(model, layout).items()}
