"""What a trainer export needs of a plan: its parallel sizes under the names
trainers use, and, for a job plan, the job (model, batch, schedule, memory
choices) the planner chose.

Trainers know the axes ``tp`` (tensor), ``cp`` (context), ``ep`` (expert),
``dp`` (data) and ``pp`` (pipeline). A plan from ``synth-reduce plan`` uses
those names; a placement plan may name its axes freely (``mp``), and a trainer
export then asks for ``--axis-names mp=tp``. :func:`trainer_job` reads the
plan's informative ``job`` object (written by the planner, not verified) and
names any field it misses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ..errors import SynthError
from ..plan import Plan
from ..planner.training import CP_COMMS
from ..synthesis.placement import Placement

TRAINER_AXES = ("tp", "cp", "ep", "dp", "pp")
SCHEDULES = ("1f1b", "interleaved", "zero-bubble", "dualpipe")  # the planner's pipeline schedules (job.schedule)


def parse_axis_names(text: str | None) -> dict[str, str]:
    """``mp=tp,data=dp``: the plan's axis -> the trainer's axis."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for part in text.split(","):
        plan_axis, sep, trainer_axis = part.partition("=")
        plan_axis, trainer_axis = plan_axis.strip(), trainer_axis.strip()
        if not sep or not plan_axis or trainer_axis not in TRAINER_AXES:
            raise SynthError(f"--axis-names {part!r}: expected PLAN_AXIS=TRAINER_AXIS with TRAINER_AXIS one of "
                             f"{', '.join(TRAINER_AXES)}, e.g. --axis-names mp=tp")
        out[plan_axis] = trainer_axis
    return out


def renamed(placement: Placement, names: Mapping[str, str]) -> Placement:
    """``placement`` with its axes renamed to the trainer's names; SynthError
    naming an axis that has no trainer name, or a name given twice."""
    unknown = [n for n in names if n not in [a.name for a in placement.axes]]
    if unknown:
        raise SynthError(f"--axis-names: the plan has no axis {', '.join(unknown)} "
                         f"(its axes: {', '.join(a.name for a in placement.axes)})")
    new = [names.get(a.name, a.name) for a in placement.axes]
    missing = [a.name for a, n in zip(placement.axes, new) if n not in TRAINER_AXES]
    if missing:
        raise SynthError(f"axis {', '.join(missing)} has no trainer name (trainers know {', '.join(TRAINER_AXES)}); "
                         f"map it with --axis-names, e.g. --axis-names {missing[0]}=tp")
    if len(set(new)) != len(new):
        raise SynthError(f"--axis-names maps two axes to one trainer axis ({', '.join(new)})")
    if new == [a.name for a in placement.axes]:
        return placement
    axes = tuple(replace(a, name=n) for a, n in zip(placement.axes, new))
    return Placement(placement.topology, axes, placement.matrix)


# the dimensions of a trainer mesh, slowest first (torchtitan's order; tp fastest)
TRAINER_MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def dp_split(placement: Placement) -> tuple[int, int]:
    """``(replicate, shard)`` of the plan's dp axis for HSDP: shard inside the
    innermost hierarchy level dp spans (its split there), replicate across the
    rest; ``(1, 1)`` without a dp axis. The dp coordinate is ``replicate_index
    x shard + shard_index`` (the innermost level's digit is dp's fastest)."""
    names = [a.name for a in placement.axes]
    if "dp" not in names:
        return 1, 1
    row = placement.matrix[names.index("dp")]
    spanned = [split for split in row if split > 1]
    shard = spanned[-1] if spanned else 1
    return placement.axes[names.index("dp")].size // shard, shard


def trainer_mesh_ids(placement: Placement, shard: int | None = None) -> np.ndarray:
    """Device ids in an array over :data:`TRAINER_MESH_DIMS` (``pp,
    dp_replicate, dp_shard, cp, tp``), each of the plan's size (1 where the
    plan has no such axis), whatever the placement: the plan's mesh with its
    axes in that order and dp split into ``dp / shard`` x ``shard`` (default:
    :func:`dp_split`, HSDP). The axes must have trainer names
    (:func:`renamed`); an expert axis is refused."""
    names = [a.name for a in placement.axes]
    if "ep" in names:
        raise SynthError("a trainer mesh of a plan with an expert axis (ep) is not supported yet")
    unknown = [n for n in names if n not in ("pp", "dp", "cp", "tp")]
    if unknown:
        raise SynthError(f"axis {', '.join(unknown)} has no trainer name (pp, dp, cp, tp); name the plan's axes so")
    ids = placement.mesh
    for axis in ("pp", "dp", "cp", "tp"):
        if axis not in names:
            ids = ids[..., None]
            names = [*names, axis]
    ids = ids.transpose([names.index(a) for a in ("pp", "dp", "cp", "tp")])
    shard = dp_split(placement)[1] if shard is None else shard
    return ids.reshape(ids.shape[0], ids.shape[1] // shard, shard, *ids.shape[2:])


@dataclass(frozen=True)
class TrainerJob:
    """The job a planner chose (a job plan's ``job`` object): the model shape,
    batch, dtype, sharding, recomputation, schedule, DP bucket, whether the
    configuration runs sequence parallelism (None in plans written before the
    planner modelled it) and its layers per stage when they are uneven."""

    model: Mapping[str, Any]
    global_batch: int
    micro_batch: int
    dtype: str
    sharding: str
    recompute: str
    overlap_dp: bool
    virtual_stages: int
    bucket_bytes: int | None
    sequence_parallel: bool | None = None
    stage_layers: tuple[int, ...] = ()  # layers per pipeline stage; empty: even (or a plan that predates them)
    schedule: str = "1f1b"  # the pipeline schedule: 1f1b, interleaved, zero-bubble or dualpipe
    tp_overlap: bool = False  # tensor-parallel collectives overlapped with their GEMMs
    overlap_param_gather: bool = False  # the sharded optimizer's weight all-gather beside the next forward
    framework: str = "megatron"  # whose bytes the plan counted (the DP bucket's gradients among them)
    cp_comm: str = "ring"  # how context parallelism exchanges keys and values: ring or allgather (Llama 3's)
    cross_entropy: str = "fused"  # the loss the plan priced (synth.planner.training.CROSS_ENTROPY_BYTES)


def _field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key) if isinstance(doc, Mapping) else None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise SynthError(f"plan: job.{where}{key} is missing or not a {getattr(kind, '__name__', 'value')}; "
                         "write the plan again with synth-reduce plan --out")
    return value


def trainer_job(plan: Plan) -> TrainerJob | None:
    """The job of a job plan, None for a placement plan."""
    job = plan.job
    if job is None:
        return None
    training = _field(job, "training", dict, "")
    model = _field(job, "model", dict, "")
    for key in ("layers", "hidden", "heads", "seq"):
        _field(model, key, int, "model.")
    bucket = job.get("bucket_bytes")
    if bucket is not None and (not isinstance(bucket, int) or isinstance(bucket, bool) or bucket < 1):
        raise SynthError("plan: job.bucket_bytes must be a positive integer or null")
    sequence_parallel = job.get("sequence_parallel")
    if sequence_parallel is not None and not isinstance(sequence_parallel, bool):
        raise SynthError("plan: job.sequence_parallel must be true or false")
    stages = job.get("stage_layers", [])
    if not isinstance(stages, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                               for n in stages) or (stages and sum(stages) != model["layers"]):
        raise SynthError(f"plan: job.stage_layers must list each pipeline stage's layers (integers >= 1) summing to "
                         f"the model's {model['layers']} layers")
    virtual = job.get("virtual_stages", 1)
    if not isinstance(virtual, int) or isinstance(virtual, bool) or virtual < 1:
        raise SynthError("plan: job.virtual_stages must be an integer >= 1")
    schedule = job.get("schedule")
    if schedule not in SCHEDULES:  # plans written before the schedules were modelled said "1F1B" or "interleaved ..."
        schedule = "interleaved" if virtual > 1 else "1f1b"
    if (schedule == "interleaved") != (virtual > 1):
        raise SynthError(f"plan: job.schedule {schedule} with job.virtual_stages {virtual}: the interleaved schedule "
                         "and only it runs more than one virtual stage per device")
    return TrainerJob(model=model, global_batch=_field(training, "global_batch", int, "training."),
                      micro_batch=_field(job, "micro_batch", int, ""), dtype=_field(training, "dtype", str, "training."),
                      sharding=_field(training, "sharding", str, "training."),
                      recompute=_field(training, "recompute", str, "training."),
                      overlap_dp=bool(training.get("overlap_dp", True)), virtual_stages=virtual, bucket_bytes=bucket,
                      sequence_parallel=sequence_parallel,
                      stage_layers=tuple(stages) if len(set(stages)) > 1 else (), schedule=schedule,
                      tp_overlap=training.get("tp_overlap") is True,
                      overlap_param_gather=training.get("overlap_param_gather") is True,
                      framework=str(training.get("framework", "megatron")), cp_comm=_cp_comm(training),
                      cross_entropy=str(training.get("cross_entropy", "fused")))


def _cp_comm(training: Mapping[str, Any]) -> str:
    """The plan's ``training.cp_comm`` (``ring`` in plans written before it was a choice)."""
    cp_comm = training.get("cp_comm", "ring")
    if cp_comm not in CP_COMMS:
        raise SynthError(f"plan: job.training.cp_comm must be one of {', '.join(CP_COMMS)}, not {cp_comm!r}; "
                         "write the plan again with synth-reduce plan --out")
    return cp_comm
