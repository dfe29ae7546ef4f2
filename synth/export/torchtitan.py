"""torchtitan's parallelism settings from a plan.

torchtitan builds a row-major ``DeviceMesh`` over ``pp, dp_replicate,
dp_shard, cp, tp`` (``tp`` fastest) from the world's ranks: the numbering of
Megatron's order ``tp-cp-dp-pp`` with the data-parallel coordinate split as
``dp_replicate`` (outer) x ``dp_shard`` (inner). Launched with the plan's rank
map (:mod:`synth.export.rank_map`) its ``tp``, ``cp``, ``pp`` and
``dp_replicate x dp_shard`` groups are the plan's.

The data-parallel split follows the job's sharding: none or ZeRO-1 (torchtitan
has no ZeRO-1: plain replication) is ``dp_replicate = dp``, ``dp_shard = 1``
(DDP); ZeRO-3 / FSDP, and a placement plan, shard inside the innermost
hierarchy level dp spans and replicate across the rest (HSDP: ``dp_shard`` =
the dp axis' split at that level), so the shard groups stay inside a node when
the placement allows. Every group is checked against the plan's mesh before
anything is written.

Output: the TOML ``[parallelism]`` (and ``[activation_checkpoint]``) tables of
torchtitan's job files, and the same settings as the command-line overrides
torchtitan 0.3 takes (``--parallelism.tensor_parallel_degree 4`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SynthError
from ..plan import Plan
from ..synthesis.placement import Placement
from .rank_map import MEGATRON_ORDER, RankMap, rank_map
from .trainer import dp_split, renamed, trainer_job, trainer_mesh_ids


@dataclass(frozen=True)
class TorchtitanExport:
    """torchtitan's degrees (``parallelism``), activation checkpointing (None:
    not a job plan) and the rank map to launch them with."""

    parallelism: dict[str, int]
    activation_checkpoint: str | None
    ranks: RankMap

    def overrides(self) -> list[str]:
        """The settings as torchtitan 0.3's command-line overrides."""
        args = []
        for key, value in self.parallelism.items():
            args += [f"--parallelism.{key}", str(value)]
        if self.activation_checkpoint is not None:
            args += ["--activation_checkpoint.mode", self.activation_checkpoint]
        return args

    def toml(self) -> str:
        lines = ["[parallelism]"] + [f"{key} = {value}" for key, value in self.parallelism.items()]
        if self.activation_checkpoint is not None:
            lines += ["", "[activation_checkpoint]", f'mode = "{self.activation_checkpoint}"']
            if self.activation_checkpoint == "selective":
                lines.append('selective_ac_option = "op"')
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"format": "torchtitan", "parallelism": dict(self.parallelism),
                "activation_checkpoint": self.activation_checkpoint, "overrides": self.overrides(),
                "renumbering_needed": not self.ranks.is_identity, "rank_map": self.ranks.to_dict()}


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
    if job is not None and job.stage_layers:
        raise SynthError(f"torchtitan export: the plan's pipeline stages are uneven ({list(job.stage_layers)} layers) "
                         "and are not exported to torchtitan; plan with --stages even, or export --format megatron")
    sharded = job is None or job.sharding == "zero3"
    dp = ranks.size("dp")
    shard = dp_split(placement)[1] if sharded else 1
    check_torchtitan_groups(placement, ranks, shard)
    parallelism = {"data_parallel_replicate_degree": dp // shard, "data_parallel_shard_degree": shard,
                   "tensor_parallel_degree": ranks.size("tp"), "context_parallel_degree": ranks.size("cp"),
                   "pipeline_parallel_degree": ranks.size("pp")}
    checkpoint = None if job is None else job.recompute
    return TorchtitanExport(parallelism, checkpoint, ranks)


def torchtitan_text(export: TorchtitanExport, plan_path: str, launch: str) -> str:
    """The TOML tables, their command-line form and how to launch
    (``launch``: :func:`~synth.export.rank_map.launch_command`)."""
    ranks = export.ranks
    lines = [f"# torchtitan settings from {plan_path} (job file tables; torchtitan 0.3 takes the same as "
             "command-line overrides:", "#   " + " ".join(export.overrides()) + ")", export.toml().rstrip()]
    if ranks.is_identity:
        lines.append("# torchrun's ranks already form the plan's groups (no renumbering)")
    else:
        lines += ["# the mesh's groups are the plan's when rank r runs on device device_of_rank[r]; launch through "
                  "the renumbering launcher:", f"#   {launch}", f"# device_of_rank {list(ranks.device_of_rank)}"]
    return "\n".join(lines) + "\n"
