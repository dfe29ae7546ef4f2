"""Worker for the launches of tests/export/test_export.py under ``synth-reduce
launch`` (torchrun, 8 gloo ranks, ranks renumbered by the plan's rank map).

``renumbered PLAN``: megatron-core's groups formed from rank order hold the
plan's devices. ``synth_launch PLAN``: synth.torch's meshes, executor and DDP
hook on the plan's devices. ``torchtitan PLAN``: torchtitan's own mesh holds
the plan's groups. ``launched DIR``: the three in one process group (see
:func:`run_launched`). Helpers (the reports, the DDP comparison) are
tests/torch_worker.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_worker import (KEEP_GROUP, ddp_against_default, devices_of_group, end_process_group,
                          ensure_process_group, model, report, run_sections)

import synth.torch
from synth.synthesis.reduction import Reduction


def run_renumbered(plan_path: Path) -> int:
    """Under ``synth-reduce launch``: this process's rank is the rank map's
    for its device (``SYNTH_DEVICE``). Groups formed from rank order as
    megatron-core forms them (its RankGenerator; without it, the rank map's own
    grouping) gather each member's device: every group must be the plan's
    group of that axis, member order included."""
    import os

    from synth.plan import load_plan

    ensure_process_group()
    rank, device = dist.get_rank(), int(os.environ["SYNTH_DEVICE"])
    plan = load_plan(plan_path)
    sizes = {a.name: a.size for a in plan.placement.axes}
    try:
        from megatron.core.parallel_state import RankGenerator

        generator = RankGenerator(tp=sizes.get("tp", 1), ep=1, dp=sizes.get("dp", 1), pp=sizes.get("pp", 1),
                                  cp=1, order="tp-cp-ep-dp-pp")
        groups_of = generator.get_ranks
    except ImportError:
        from synth.export.rank_map import rank_map

        groups_of = rank_map(plan.placement).groups
    problems = []
    for axis in ("tp", "dp"):
        mine = None
        for group in groups_of(axis):  # every rank creates every group, in the same order
            pg = dist.new_group(list(group))
            if rank in group:
                mine = (list(group), pg)
        got = devices_of_group(mine[1], device)
        want = next(list(map(int, row)) for row in Reduction.of(plan.placement, (axis,)).reduction_groups
                    if device in row)
        if got != want:
            problems.append(f"rank {rank} (device {device}): {axis} group holds devices {got}, the plan's {want}")
    return report(problems, f"renumbered: tp, dp groups are the plan's on {dist.get_world_size()} ranks")


def run_synth_under_launch(plan_path: Path) -> int:
    """Under ``synth-reduce launch`` (ranks renumbered): ``synth.torch``'s
    device mesh and trainer mesh give each axis the plan's devices (gathered
    ``SYNTH_DEVICE`` of the group's members, member order included); the
    executor's all-reduce over the plan's group is exact; DDP on the plan's dp
    group with the hook trains like default DDP; and the hook refuses a DDP
    whose own process group is not the plan's even when registered with the
    plan's group as its state."""
    import os

    from synth.plan import load_plan

    device = int(os.environ["SYNTH_DEVICE"])
    synth.torch.init_process_group()
    plan = load_plan(plan_path)
    problems = []

    def want(axis: str) -> list[int]:
        return next(list(map(int, row)) for row in Reduction.of(plan.placement, (axis,)).reduction_groups
                    if device in row)

    mesh = synth.torch.device_mesh(plan, "cpu")
    trainer = synth.torch.trainer_mesh(plan, "cpu")
    for axis in ("tp", "dp"):
        for name, m in (("device_mesh", mesh), ("trainer_mesh", trainer)):
            got = devices_of_group(m.get_group(axis), device)
            if got != want(axis):
                problems.append(f"device {device}: {name} {axis} group holds devices {got}, the plan's {want(axis)}")
    data = torch.full((12,), float(device + 1))
    synth.torch.Executor(plan)(data)
    total = float(sum(d + 1 for d in want("dp")))
    if not torch.all(data == total):
        problems.append(f"device {device}: executor gave {data[0].item()}, the plan's dp sum is {total}")
    dp = mesh.get_group("dp")
    difference, _, _ = ddp_against_default(device, plan, dp, seed=3)
    if difference > 1e-6:
        problems.append(f"device {device}: DDP with the hook differs from default DDP by {difference}")
    tp = mesh.get_group("tp")
    wrong = DDP(model(5), process_group=tp)
    wrong.register_comm_hook(dp, synth.torch.comm_hook(plan))  # the state is the plan's group, DDP's is not
    try:
        ((wrong(torch.ones(2, 32)) - 1) ** 2).mean().backward()
        problems.append(f"device {device}: a DDP on the tp group ran the plan's dp hook")
    except Exception as exc:  # DDP's reducer re-raises the hook's SynthError as a RuntimeError
        if "DDP's process group spans ranks" not in str(exc):
            problems.append(f"device {device}: the hook failed otherwise: {exc}")
    return report(problems, "under launch: device_mesh, trainer_mesh, executor, hook on the plan's devices")


def run_torchtitan(plan_path: Path) -> int:
    """Under ``synth-reduce launch``: torchtitan's own ParallelDims, given the
    degrees of ``export --format torchtitan``, builds its mesh from rank order
    (on CPU: its device type forced to cpu); each of its groups of degree > 1,
    as devices, must be the plan's: ``tp`` and ``pp`` the plan's, ``batch``
    (dp_replicate x dp_shard) the plan's dp group, ``dp_shard`` this device's
    block of consecutive dp ranks, ``dp_replicate`` the dp members at its
    place in the other blocks."""
    import os

    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend torchtitan
    import torchtitan.distributed.parallel_dims as titan  # gives its degree-1 and batch dimensions

    from synth.export.torchtitan import torchtitan_export
    from synth.plan import load_plan

    ensure_process_group()
    device = int(os.environ["SYNTH_DEVICE"])
    plan = load_plan(plan_path)
    degrees = torchtitan_export(plan).parallelism
    titan.device_type = "cpu"
    shard = degrees["data_parallel_shard_degree"]
    dims = titan.ParallelDims(dp_replicate=degrees["data_parallel_replicate_degree"], dp_shard=shard,
                              cp=degrees["context_parallel_degree"], tp=degrees["tensor_parallel_degree"],
                              pp=degrees["pipeline_parallel_degree"], ep=1, world_size=dist.get_world_size())
    dims.build_mesh()
    sizes = {a.name: a.size for a in plan.placement.axes}
    want = {axis: next(list(map(int, row)) for row in Reduction.of(plan.placement, (axis,)).reduction_groups
                       if device in row) for axis in sizes if sizes[axis] > 1}
    dp = want.get("dp", [device])
    place = dp.index(device)
    want["batch"] = dp
    want["dp_shard"] = dp[place // shard * shard:(place // shard + 1) * shard]
    want["dp_replicate"] = dp[place % shard::shard]
    degree = {"tp": degrees["tensor_parallel_degree"], "pp": degrees["pipeline_parallel_degree"],
              "batch": len(dp), "dp_shard": shard, "dp_replicate": degrees["data_parallel_replicate_degree"]}
    problems, checked = [], []
    for name in ("tp", "pp", "batch", "dp_shard", "dp_replicate"):
        if degree[name] == 1:
            continue
        got = devices_of_group(dims.get_mesh(name).get_group(), device)
        checked.append(name)
        if got != want[name]:
            problems.append(f"device {device}: torchtitan's {name} group holds {got}, the plan's {want[name]}")
    return report(problems, f"torchtitan: {', '.join(checked)} groups are the plan's ({degrees})")


def run_launched(directory: Path) -> int:
    """Under ``synth-reduce launch`` of ``directory/plan.json``: ``renumbered``
    on that plan, ``synth_launch`` on ``directory/dp.json`` (a plan of the same
    placement) and, where torchtitan is installed, ``torchtitan`` on
    ``plan.json``, in one process group (the ranks import torch once),
    reported by :func:`run_sections`."""
    import importlib.util

    KEEP_GROUP.append(True)
    synth.torch.init_process_group()
    plan, dp = directory / "plan.json", directory / "dp.json"
    sections = [("renumbered", lambda: run_renumbered(plan)), ("synth_launch", lambda: run_synth_under_launch(dp))]
    if importlib.util.find_spec("torchtitan") is not None:
        sections.append(("torchtitan", lambda: run_torchtitan(plan)))
    code = run_sections(sections)
    end_process_group()
    return code


if __name__ == "__main__":
    mode, where = sys.argv[1], Path(sys.argv[2])
    sys.exit({"renumbered": run_renumbered, "synth_launch": run_synth_under_launch, "torchtitan": run_torchtitan,
              "launched": run_launched}[mode](where))
