"""torchtitan's parallelism settings from a plan.

torchtitan builds a row-major ``DeviceMesh`` over ``pp, dp_replicate,
dp_shard, cp, tp`` (``tp`` fastest) from the world's ranks: the numbering of
Megatron's order ``tp-cp-dp-pp`` with the data-parallel coordinate split as
``dp_replicate`` (outer) x ``dp_shard`` (inner). Launched with the plan's rank
map (:mod:`synth.export.rank_map`) its ``tp``, ``cp``, ``pp`` and
``dp_replicate x dp_shard`` groups are the plan's.

The data-parallel split follows the job's sharding: none or ZeRO-1 (torchtitan
has no ZeRO-1: plain replication) is ``dp_replicate = dp``, ``dp_shard = 1``
(DDP); ZeRO-3 / FSDP, ZeRO-2 (FSDP with ``fsdp_reshard_after_forward =
"never"``: whole weights through forward and backward, sharded gradients and
states) and a placement plan shard inside the innermost
hierarchy level dp spans and replicate across the rest (HSDP: ``dp_shard`` =
the dp axis' split at that level), so the shard groups stay inside a node when
the placement allows. Every group is checked against the plan's mesh before
anything is written. With pipeline parallelism the schedule is
``pipeline_parallel_schedule`` (``1F1B``, or ``Interleaved1F1B`` for 2
virtual stages; a zero-bubble or DualPipe plan is refused, :func:`_schedule`); a plan
made with ``--tp-overlap`` turns on ``enable_async_tensor_parallel``
(torchtitan's micro-pipelined tensor parallelism, applied under
``torch.compile``); a plan made with ``--dtype fp8`` adds the ``float8``
model converter (``[model] converters``), which swaps the linear layers for
FP8 ones.

Output: the command line torchtitan 0.3's ``ConfigManager`` parses
(``--parallelism.tensor_parallel_degree 4 ... activation-checkpoint:selective``),
then the same settings as the TOML tables of the releases that read job files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SynthError
from ..plan import Plan
from ..synthesis.placement import Placement
from .rank_map import MEGATRON_ORDER, RankMap, rank_map
from .trainer import TrainerJob, dp_split, renamed, trainer_job, trainer_mesh_ids


@dataclass(frozen=True)
class TorchtitanExport:
    """torchtitan's degrees (``parallelism``), activation checkpointing (None:
    not a job plan) and the rank map to launch them with."""

    parallelism: dict[str, int | str | bool]
    activation_checkpoint: str | None
    ranks: RankMap
    converters: tuple[str, ...] = ()  # torchtitan's model converters: float8 for a plan made with --dtype fp8
    cp_comm: str = "allgather"  # the keys' and values' exchange the plan priced (torchtitan 0.3 gathers them)

    def overrides(self) -> list[str]:
        """The settings as torchtitan 0.3's command line (its ``ConfigManager``,
        tyro): ``--parallelism.KEY VALUE`` (a switch alone when on), async
        tensor parallelism as ``--compile.enable
        --compile.enable_async_tensor_parallel`` (torchtitan applies it under
        ``torch.compile`` only), ``--training.disable_cuda_graphs`` with
        pipeline parallelism (torchtitan's CUDA graphs do not run pipelines),
        and the activation checkpointing last, as its subcommand
        ``activation-checkpoint:MODE``. The FP8 converter is not a command-line
        setting in 0.3 (it is part of the model's config): see :meth:`notes`."""
        args = []
        for key, value in self.parallelism.items():
            if key == "enable_async_tensor_parallel":
                args += ["--compile.enable", "--compile.enable_async_tensor_parallel"] if value else []
            elif isinstance(value, bool):  # a switch: given alone when on
                args += [f"--parallelism.{key}"] if value else []
            else:
                args += [f"--parallelism.{key}", str(value)]
        if int(self.parallelism.get("pipeline_parallel_degree", 1)) > 1:
            args += ["--training.disable_cuda_graphs"]
        if self.activation_checkpoint is not None:
            args += [f"activation-checkpoint:{self.activation_checkpoint}"]
        return args

    def notes(self) -> list[str]:
        """What the command line cannot say: the FP8 model converter, and
        that torchtitan 0.3 has no choice of how context parallelism
        exchanges keys and values: it all-gathers them (FlexAttention:
        ``flex_cp_allgather`` in ``apply_cp_to_forward``,
        torchtitan/distributed/context_parallel/api.py; SDPA: PyTorch's
        context-parallel dispatcher, whose ``_ContextParallelOptions.rotate_method``
        defaults to ``ALL_GATHER``), so a plan that priced a ring says so."""
        notes = []
        if "float8" in self.converters:
            notes.append("fp8: torchtitan 0.3 takes its float8 converter from the model's config (a config function "
                         "whose model_spec has Float8LinearConverter, as its *_float8 configs do), not from the "
                         "command line")
        if int(self.parallelism.get("context_parallel_degree", 1)) > 1 and self.cp_comm != "allgather":
            notes.append("cp: torchtitan 0.3 all-gathers each layer's keys and values over the cp group, and this "
                         f"plan priced a {self.cp_comm} exchange; plan with --cp-comm allgather to price what "
                         "torchtitan runs")
        return notes

    def toml(self) -> str:
        """The job-file tables of the torchtitan releases that read TOML job
        files (before 0.3; torchtitan 0.3 reads none): ``[parallelism]``,
        ``[activation_checkpoint]`` and ``[model] converters``."""
        lines = ["[parallelism]"] + [f"{key} = {_toml_value(value)}" for key, value in self.parallelism.items()]
        if self.activation_checkpoint is not None:
            lines += ["", "[activation_checkpoint]", f'mode = "{self.activation_checkpoint}"']
            if self.activation_checkpoint == "selective":
                lines.append('selective_ac_option = "op"')
        if self.converters:
            lines += ["", "[model]", "converters = [" + ", ".join(f'"{c}"' for c in self.converters) + "]"]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"format": "torchtitan", "parallelism": dict(self.parallelism),
                "activation_checkpoint": self.activation_checkpoint, "converters": list(self.converters),
                "overrides": self.overrides(), "notes": self.notes(),
                "renumbering_needed": not self.ranks.is_identity, "rank_map": self.ranks.to_dict()}


def _toml_value(value: int | str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int) else f'"{value}"'


def check_torchtitan_groups(placement: Placement, ranks: RankMap, shard: int) -> None:
    """SynthError unless torchtitan's row-major mesh over ``pp, dp_replicate,
    dp_shard, cp, tp``, its ranks mapped through the rank map, is the plan's
    trainer mesh (:func:`~synth.export.trainer.trainer_mesh_ids`) with dp split
    in blocks of ``shard``: then every group torchtitan forms is the plan's."""
    want = trainer_mesh_ids(placement, shard)
    if not np.array_equal(np.asarray(ranks.device_of_rank).reshape(want.shape), want):
        raise SynthError("torchtitan export: torchtitan's mesh under the rank map is not the plan's")


def torchtitan_export(plan: Plan, axis_names: dict[str, str] | None = None) -> TorchtitanExport:
    placement = renamed(plan.placement, axis_names or {})
    names = [a.name for a in placement.axes]
    if "ep" in names:
        raise SynthError("torchtitan export: plans with an expert axis are not exported yet")
    ranks = rank_map(placement, tuple(a for a in MEGATRON_ORDER if a in names))
    job = trainer_job(plan)
    if job is not None and ranks.size("tp") > 1 and job.sequence_parallel is False:
        raise SynthError("torchtitan export: torchtitan's tensor parallelism always splits the norms over the "
                         "sequence (sequence parallelism), and this plan was made without it; plan again with "
                         "--sequence-parallel on, or export --format megatron")
    if job is not None and isinstance(job.model.get("mla"), dict):
        raise SynthError("torchtitan export: the plan's model has multi-head latent attention, and the export "
                         "writes torchtitan's Llama; export --format megatron (--multi-latent-attention)")
    if job is not None and job.stage_layers:
        raise SynthError(f"torchtitan export: the plan's pipeline stages are uneven ({list(job.stage_layers)} layers) "
                         "and are not exported to torchtitan; plan with --stages even, or export --format megatron")
    sharded = job is None or job.sharding in ("zero2", "zero3", "hsdp")
    dp = ranks.size("dp")
    shard = dp_split(placement)[1] if sharded else 1
    check_torchtitan_groups(placement, ranks, shard)
    parallelism: dict[str, int | str | bool] = {
        "data_parallel_replicate_degree": dp // shard, "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": ranks.size("tp"), "context_parallel_degree": ranks.size("cp"),
        "pipeline_parallel_degree": ranks.size("pp")}
    if job is not None and job.tp_overlap and ranks.size("tp") > 1:
        parallelism["enable_async_tensor_parallel"] = True  # torchtitan applies it under torch.compile only
    if job is not None and job.sharding == "zero2":
        parallelism["fsdp_reshard_after_forward"] = "never"  # weights kept whole, gradients and states sharded
    if job is not None and ranks.size("pp") > 1:
        parallelism["pipeline_parallel_schedule"] = _schedule(job)
    checkpoint = None if job is None else job.recompute
    converters = ("float8",) if job is not None and job.dtype == "fp8" else ()
    return TorchtitanExport(parallelism, checkpoint, ranks, converters, "allgather" if job is None else job.cp_comm)


def _schedule(job: TrainerJob) -> str:
    """torchtitan's name of the job's pipeline schedule. torchtitan gives a
    multi-stage schedule 2 stages per rank unless told its layers per stage,
    and it counts the embedding and the output layer as layers there: only
    the interleaved schedule with 2 virtual stages maps exactly, its zero
    bubble schedules run 2 stages per rank (not the planner's ZB-H1), and its
    DualPipeV is not the planner's DualPipe."""
    if job.schedule == "zero-bubble":
        raise SynthError("torchtitan export: torchtitan's zero-bubble schedules (InterleavedZeroBubble, "
                         "ZBVZeroBubble) run 2 stages per rank, not the one-stage ZB-H1 the plan was priced "
                         "with; plan with --schedule 1f1b or interleaved")
    if job.schedule == "dualpipe":
        raise SynthError("torchtitan export: torchtitan runs DualPipeV (PyTorch's ScheduleDualPipeV: a V of 2 p "
                         "stages, every micro-batch one way), not the DualPipe the plan was priced with; plan with "
                         "--schedule 1f1b or interleaved")
    if job.schedule == "interleaved":
        if job.virtual_stages != 2:
            raise SynthError(f"torchtitan export: the plan interleaves {job.virtual_stages} virtual stages per "
                             "device; torchtitan's Interleaved1F1B is exported with its default of 2 (plan with "
                             "--schedule interleaved --virtual-stages 2)")
        return "Interleaved1F1B"
    return "1F1B"


def torchtitan_text(export: TorchtitanExport, plan_path: str, launch: str) -> str:
    """torchtitan 0.3's command-line overrides (after its ``--module`` and
    ``--config``), then the TOML tables for releases that read job files, and
    how to launch (``launch``: :func:`~synth.export.rank_map.launch_command`)."""
    ranks = export.ranks
    lines = [f"# torchtitan settings from {plan_path}: torchtitan 0.3's command line (after --module M --config C)",
             " ".join(export.overrides())]
    lines += [f"# {note}" for note in export.notes()]
    lines += ["# the same as job-file tables, for torchtitan releases that read TOML job files (before 0.3):"]
    lines += ["#   " + line if line else "#" for line in export.toml().rstrip().split("\n")]
    if ranks.is_identity:
        lines.append("# torchrun's ranks already form the plan's groups (no renumbering)")
    else:
        lines += ["# the mesh's groups are the plan's when rank r runs on device device_of_rank[r]; launch through "
                  "the renumbering launcher:", f"#   {launch}", f"# device_of_rank {list(ranks.device_of_rank)}"]
    return "\n".join(lines) + "\n"
