"""Worker for tests/test_torch.py, run under ``torchrun --standalone`` on gloo.

``checks`` (8 ranks): the executor on every allreduce program of a placement at
lengths 1, 7, 4099 in float32 and float64 and on every reducescatter and
allgather program of several placements, every rank's whole buffer against the
numpy reference (``synth.runtime.executor.reference``) and the goal's part against the
direct reduction; a plan file with two size ranges; a job plan from
``synth-reduce plan --out`` (every reduction exact); the DeviceMesh's groups;
DDP with the plan's hook against default DDP (dp only, and dp x mp with DDP on
the dp sub-group); FSDP2's HSDP on the hierarchical mesh against default DDP.
Rank 0 prints one JSON line per check: ``{"check", "ok", "detail"}``.

``launch`` (4 ranks, rank-dependent host names): a plan for 8 ranks, then a
plan whose node 0 spans two hosts, then ``synth-reduce bench`` on the 8-rank
plan: each must raise the same SynthError on every rank, printed as
``synth-reduce: error: ...`` on stderr, never hang.

``bench PLAN_DIR`` (8 ranks): ``synth-reduce bench --backend torch`` with
``--jsonl`` and ``synth-reduce tune --backend torch`` over two sizes,
in-process through the CLI's ``main``.

``suite PLAN_DIR`` (8 ranks): ``pipelined``, ``parity``, ``bench`` and
``checks`` in one launch (:func:`run_suite`), each section's output framed
for ``processes.launch_sections``; ``kill`` stays a launch of its own.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import synth.torch
from synth.cli import main as cli_main
from synth.errors import SynthError
from synth.plan import Plan, PlannedProgram, PlannedReduction, write_plan
from synth.runtime.bench_measure import rank_data
from synth.runtime.executor import reference
from synth.synthesis.language import format_program, parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import Placement, enumerate_placements, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.search import synthesize_reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

TESTBED = load_topology("testbed-2x4")
BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"
DEFAULT = "AllReduce(root, inside)"


def placement(axes: str, matrix) -> Placement:
    return Placement(TESTBED, parse_axes(axes), matrix)


def single(text: str, reduction: Reduction) -> Plan:
    return Plan.single(lower(parse_program(text), reduction), reduction)


# ---------------------------------------------------------------- executor


def exact(lowered, executor, rank: int, length: int, dtype: np.dtype, check: bool = True) -> str | None:
    """Run ``executor`` on every rank's integer-valued data; None if this rank's
    whole buffer equals the reference and its goal part the direct reduction.
    ``check=False`` skips the executor's collective buffer check."""
    data = [rank_data(lowered, r, length, dtype) for r in range(8)]
    want = reference(lowered, np.stack([d.input for d in data]))[rank]
    mine = data[rank]
    buffer = torch.from_numpy(mine.input.copy())
    executor(buffer, check=check)
    got = buffer.numpy()
    if np.array_equal(got, want) and np.array_equal(got[mine.checked], mine.expected[mine.checked]):
        return None
    return f"rank {rank}: {lowered.goal.value} {str(lowered.program)!r} length {length} {dtype}"


def check_allreduce_programs(rank: int) -> str:
    """Every allreduce program of dp over both nodes, lengths 1, 7, 4099, in
    float32 and float64 alternately (every program runs both dtypes, and every
    (length, dtype) pair runs on half of the programs: one run per length, not
    one per length and dtype, halves the launch's time)."""
    result = synthesize_reduction(Reduction.of(placement("dp=8", ((2, 4),)), ["dp"]), 5)
    runs, pairs = 0, set()
    for number, program in enumerate(result.programs):
        lowered = lower(program, result.reduction)
        executor = synth.torch.Executor(Plan.single(lowered, result.reduction))
        for position, length in enumerate((1, 7, 4099)):
            dtype = np.dtype(("float32", "float64")[(number + position) % 2])
            problem = exact(lowered, executor, rank, length, dtype, check=length == 1)
            if problem:
                raise AssertionError(problem)
            runs += 1
            pairs.add((length, dtype.name))
    assert len(pairs) == 6, pairs
    return f"{len(result.programs)} programs, {runs} runs per rank"


def check_alltoall_programs(rank: int) -> str:
    """Every all-to-all program of ep over both nodes (ep=8 on 2 x 4), on int64
    tensors: block i of the result is what rank i addressed to this rank."""
    from synth.runtime.alltoall import run_alltoall
    from synth.synthesis.alltoall import synthesize_alltoall

    groups = Reduction.of(placement("ep=8", ((2, 4),)), ["ep"])
    programs = synthesize_alltoall(groups.hierarchy, 5).programs
    for program in programs:
        got = run_alltoall(synth.torch.world(), groups, program, torch.arange(24, dtype=torch.int64) + 1000 * rank)
        want = torch.cat([torch.arange(rank * 3, rank * 3 + 3) + 1000 * i for i in range(8)])
        if not torch.equal(got, want):
            raise AssertionError(f"rank {rank}: {program}: {got.tolist()} != {want.tolist()}")
    return f"{len(programs)} all-to-all programs exact"


def check_shard_programs(rank: int) -> str:
    """Every reducescatter and allgather program of every placement of dp=8 and
    of dp=4,mp=2 over dp, at lengths 7 and 4099."""
    programs = 0
    for axes in ("dp=8", "dp=4,mp=2"):
        for p in enumerate_placements(TESTBED, parse_axes(axes)):
            for goal in (Goal.REDUCESCATTER, Goal.ALLGATHER):
                result = synthesize_reduction(Reduction.of(p, ["dp"], goal), 5)
                if result.reduction.k == 1:
                    continue
                for program in result.programs:
                    lowered = lower(program, result.reduction)
                    executor = synth.torch.Executor(Plan.single(lowered, result.reduction))
                    for number, length in enumerate((7, 4099)):
                        dtype = np.dtype(("float32", "float64", "int64")[(programs + number) % 3])
                        problem = exact(lowered, executor, rank, length, dtype, check=number == 0)
                        if problem:
                            raise AssertionError(problem)
                    programs += 1
    return f"{programs} programs"


def check_plan_file_with_size_ranges(rank: int, directory: Path) -> str:
    reduction = Reduction.of(placement("dp=8", ((2, 4),)), ["dp"])
    small, large = (lower(parse_program(t), reduction) for t in (BLUECONNECT, DEFAULT))
    plan = Plan(reduction.placement, (PlannedReduction(reduction, (PlannedProgram(small, 0, 1000),
                                                                   PlannedProgram(large, 1000, None))),))
    path = directory / "ranges.json"
    if rank == 0:
        write_plan(path, plan)
    dist.barrier()
    executor = synth.torch.Executor(str(path))
    assert executor.program_for(7 * 4) == small and executor.program_for(4099 * 4) == large
    for lowered, length in ((small, 7), (large, 4099)):
        problem = exact(lowered, executor, rank, length, np.dtype("float32"))
        if problem:
            raise AssertionError(problem)
    return "a path, two size ranges, each exact"


def check_job_plan(rank: int, directory: Path) -> str:
    """A job plan from ``synth-reduce plan --out`` (tp all-gather and
    reduce-scatter under sequence parallelism, dp reduce-scatter and
    all-gather under ZeRO-1) runs each of its reductions exactly through
    synth.torch, loaded from its path."""
    path = directory / "job.json"
    if rank == 0:
        code = cli_main(["plan", "--topology", "testbed-2x4", "--model", "layers=4,hidden=256,heads=8,seq=128,vocab=1000",
                         "--global-batch", "16", "--axes", "tp=2,dp=4", "--device", "memory_GiB=16,peak_TFLOPs=1",
                         "--sharding", "zero1", "--out", str(path)])
        assert code == 0, f"plan exited {code}"
    dist.barrier()
    from synth.plan import load_plan

    plan = load_plan(path)
    done = []
    for planned in plan.reductions:
        reduction = planned.reduction
        executor = synth.torch.Executor(str(path), reduce=reduction.axes, goal=reduction.goal)
        for program in planned.programs:
            length = max(7, (program.min_bytes // 4) + 7)
            problem = exact(program.lowered, executor, rank, length, np.dtype("float32"))
            if problem:
                raise AssertionError(problem)
        done.append(reduction.describe())
    assert {"allgather over tp", "reducescatter over tp", "reducescatter over dp", "allgather over dp"} == set(done), \
        done
    return ", ".join(done) + ": exact"


# ---------------------------------------------------------------- meshes


def check_device_mesh(rank: int) -> str:
    """A non-row-major placement: every axis' group is its reduction group, in
    order; the hierarchical mesh's groups are the BlueConnect steps' groups."""
    p = placement("dp=2,mp=4", ((1, 2), (2, 2)))
    plan = single(BLUECONNECT, Reduction.of(p, ["mp"]))
    mesh = synth.torch.device_mesh(plan, "cpu")
    assert mesh.mesh_dim_names == ("dp", "mp") and mesh.mesh.tolist() == p.mesh.tolist(), mesh
    for axis in ("dp", "mp"):
        groups = Reduction.of(p, [axis]).reduction_groups.tolist()
        mine = next(g for g in groups if rank in g)
        got = dist.get_process_group_ranks(mesh.get_group(axis))
        assert got == mine, (axis, got, mine)
    hierarchical = synth.torch.device_mesh(plan, "cpu", hierarchical=True)
    assert hierarchical.mesh_dim_names == ("dp_rank", "mp_node", "mp_rank"), hierarchical.mesh_dim_names
    steps = plan.lowered.steps
    for dim, step in (("mp_rank", steps[0]), ("mp_node", steps[1])):
        mine = next(list(g) for g in step.groups if rank in g)
        got = dist.get_process_group_ranks(hierarchical.get_group(dim))
        assert got == mine, (dim, got, mine)
    return f"mesh {p.mesh.tolist()}"


# ---------------------------------------------------------------- training


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 8))


def train(module: nn.Module, rank: int, steps: int = 4) -> None:
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own data
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        loss = ((module(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def train_single_process(module: nn.Module, ranks: int, steps: int = 4) -> None:
    """What ``train`` on ``ranks`` data-parallel replicas computes, in one
    process: per step, the mean over the ranks' losses (each rank's own data),
    one SGD step. No collective."""
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    for step in range(steps):
        losses = []
        for rank in range(ranks):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
            losses.append(((module(x) - y) ** 2).mean())
        optimizer.zero_grad()
        torch.stack(losses).mean().backward()
        optimizer.step()


def max_difference(a: nn.Module, b_params) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b_params))


def ddp_against_default(rank: int, plan: Plan, group, seed: int) -> tuple[float, list[int], set]:
    """Train default DDP and DDP with the plan's hook on ``group``, with
    buckets of about 16 KB; return the largest parameter difference, the hook
    calls per step and the programs the hook ran."""
    reference_ddp = DDP(model(seed), process_group=group, bucket_cap_mb=0.016)
    train(reference_ddp, rank)
    hooked = DDP(model(seed), process_group=group, bucket_cap_mb=0.016)
    hook = synth.torch.comm_hook(plan)
    executor = synth.torch.Executor(plan)
    calls: list[int] = []
    used = set()

    def counting(state, bucket):
        calls.append(bucket.index())
        used.add(format_program(executor.program_for(bucket.buffer().nbytes).program, " ; "))
        return hook(state, bucket)

    hooked.register_comm_hook(hooked.process_group, counting)
    per_step = []
    optimizer = torch.optim.SGD(hooked.parameters(), lr=0.1)
    for step in range(4):
        before = len(calls)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        loss = ((hooked(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        per_step.append(len(calls) - before)
    return max_difference(reference_ddp.module, list(hooked.module.parameters())), per_step, used


def check_ddp_dp_only(rank: int) -> str:
    reduction = Reduction.of(placement("dp=8", ((2, 4),)), ["dp"])
    small, large = (lower(parse_program(t), reduction) for t in (BLUECONNECT, DEFAULT))
    plan = Plan(reduction.placement, (PlannedReduction(reduction, (PlannedProgram(small, 0, 12000),
                                                                   PlannedProgram(large, 12000, None))),))
    group = synth.torch.device_mesh(plan, "cpu").get_group("dp")
    difference, per_step, used = ddp_against_default(rank, plan, group, seed=0)
    assert difference <= 1e-6, difference
    assert all(n >= 3 for n in per_step[1:]), per_step  # DDP's first step uses one large first bucket
    assert len(used) == 2, used  # buckets on both sides of the size ranges' bound
    return f"max |difference| {difference:.1e}; hook calls per step {per_step}; programs used {sorted(used)}"


def check_ddp_dp_mp(rank: int) -> str:
    p = placement("dp=4,mp=2", ((2, 2), (1, 2)))
    plan = single(BLUECONNECT, Reduction.of(p, ["dp"]))
    mesh = synth.torch.device_mesh(plan, "cpu")
    mp_rank = int(np.argwhere(p.mesh == rank)[0][1])
    difference, per_step, _ = ddp_against_default(rank, plan, mesh.get_group("dp"), seed=10 + mp_rank)
    assert difference <= 1e-6, difference
    assert all(n >= 3 for n in per_step[1:]), per_step
    return f"max |difference| {difference:.1e}; hook calls per step {per_step}"


def check_ddp_sparse_embedding(rank: int) -> str:
    """nn.Embedding(sparse=True) under DDP with the plan's hook built with
    sparse=True: the embedding's sparse gradient runs the sparse form of the
    plan's dp program, the linear layer's dense buckets the program itself.
    With integer-valued gradients (integer weights and loss coefficients) both
    equal default DDP's (gloo's sparse all-reduce, divided by the group)
    exactly; a hook built without sparse=True refuses the sparse bucket."""
    plan = single(BLUECONNECT, Reduction.of(placement("dp=8", ((2, 4),)), ["dp"]))
    group = synth.torch.device_mesh(plan, "cpu").get_group("dp")

    def net() -> nn.Module:
        torch.manual_seed(0)
        module = nn.Sequential(nn.Embedding(1000, 16, sparse=True), nn.Linear(16, 4))
        with torch.no_grad():
            module[0].weight.copy_(torch.randint(-3, 4, (1000, 16)).float())
            module[1].weight.copy_(torch.randint(-3, 4, (4, 16)).float())
        return module

    def backward(ddp) -> None:
        g = torch.Generator().manual_seed(rank)
        tokens = torch.randint(0, 1000, (64,), generator=g)
        coefficients = torch.randint(-2, 3, (64, 4), generator=g).float()
        (ddp(tokens) * coefficients).sum().backward()

    reference = DDP(net(), process_group=group)
    backward(reference)
    hooked = DDP(net(), process_group=group)
    hooked.register_comm_hook(hooked.process_group, synth.torch.comm_hook(plan, sparse=True))
    backward(hooked)
    want, got = reference.module[0].weight.grad, hooked.module[0].weight.grad
    assert got.is_sparse and torch.equal(want.coalesce().to_dense(), got.coalesce().to_dense())
    for p, q in zip(reference.module[1].parameters(), hooked.module[1].parameters()):
        assert torch.equal(p.grad, q.grad)
    refusing = DDP(net(), process_group=group)
    refusing.register_comm_hook(refusing.process_group, synth.torch.comm_hook(plan))
    try:
        backward(refusing)
        raise AssertionError("a sparse bucket ran without sparse=True")
    except Exception as exc:  # DDP re-raises the hook's error from backward
        assert "build the hook with comm_hook(plan, sparse=True)" in str(exc), exc
    rows = int(got.coalesce().indices().shape[1])
    return f"{rows} gradient rows equal default DDP's; a hook without sparse=True refuses the sparse bucket"


def check_trainer_mesh(rank: int) -> str:
    """The trainer mesh's dims have fixed names whatever the placement; on an
    interleaved placement (dp over 2 nodes x 2 ranks, tp inside the node) each
    dim's group is the plan's: tp and the flattened dp the plan's groups,
    dp_shard the dp members inside this rank's node, dp_replicate the others."""
    p = placement("tp=2,dp=4", ((1, 2), (2, 2)))  # mesh [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert not np.array_equal(p.mesh.ravel(), np.arange(8))
    plan = single(DEFAULT, Reduction.of(p, ["dp"]))
    mesh = synth.torch.trainer_mesh(plan, "cpu")
    assert mesh.mesh_dim_names == ("pp", "dp_replicate", "dp_shard", "cp", "tp"), mesh.mesh_dim_names
    groups = {}
    for name in ("tp", "dp", "dp_shard", "dp_replicate", "pp", "cp"):
        groups[name] = dist.get_process_group_ranks(mesh[name].get_group())
    for axis in ("tp", "dp"):
        want = next(list(map(int, row)) for row in Reduction.of(p, (axis,)).reduction_groups if rank in row)
        assert groups[axis] == want, (axis, groups[axis], want)
    assert groups["dp_shard"] == [d for d in groups["dp"] if d // 4 == rank // 4], groups
    assert len(groups["dp_replicate"]) == 2 and {d // 4 for d in groups["dp_replicate"]} == {0, 1}, groups
    assert groups["pp"] == [rank] and groups["cp"] == [rank]
    return f"tp {groups['tp']}, dp {groups['dp']}, dp_shard {groups['dp_shard']}"


def check_hook_group(rank: int) -> str:
    """The hook refuses, with one message, a DDP process group other than the
    plan's reduction group (the world, here) and a missing one (state None):
    at build when given, else at the first bucket."""
    p = placement("dp=4,mp=2", ((2, 2), (1, 2)))
    plan = single(BLUECONNECT, Reduction.of(p, ["dp"]))
    seen = []
    try:
        synth.torch.comm_hook(plan, process_group=dist.group.WORLD)
    except SynthError as exc:
        seen.append(str(exc))
    hook = synth.torch.comm_hook(plan, process_group=synth.torch.device_mesh(plan, "cpu").get_group("dp"))
    for state in (None, dist.group.WORLD):
        try:
            hook(state, None)
        except SynthError as exc:
            seen.append(str(exc))
    assert len(seen) == 3, seen
    assert "DDP's process group spans ranks [0, 1, 2, 3, 4, 5, 6, 7] but the plan reduces over" in seen[0], seen
    assert seen[1].startswith("the hook needs DDP's process group as its state"), seen
    assert seen[2].startswith("DDP's process group spans ranks [0, 1, 2, 3, 4, 5, 6, 7]"), seen
    return seen[2]


def check_hsdp(rank: int) -> str:
    """FSDP2's HSDP on the hierarchical mesh: its reduce-scatter groups are the
    plan's ReduceScatter(node, inside) groups, its all-reduce groups those of
    AllReduce(node, parallel(root)); it trains like default DDP."""
    from torch.distributed.fsdp import fully_shard

    plan = single(BLUECONNECT, Reduction.of(placement("dp=8", ((2, 4),)), ["dp"]))
    mesh = synth.torch.device_mesh(plan, "cpu", hierarchical=True)
    steps = plan.lowered.steps
    for dim, step in (("dp_rank", steps[0]), ("dp_node", steps[1])):
        mine = next(list(g) for g in step.groups if rank in g)
        assert dist.get_process_group_ranks(mesh.get_group(dim)) == mine, dim
    reference_ddp = DDP(model(0), process_group=synth.torch.device_mesh(plan, "cpu").get_group("dp"))
    train(reference_ddp, rank)
    sharded = model(0)
    fully_shard(sharded, mesh=mesh["dp_node", "dp_rank"])  # 2-D mesh: replicate across nodes, shard inside
    train(sharded, rank)
    difference = max_difference(reference_ddp.module, [p.full_tensor() for p in sharded.parameters()])
    assert difference <= 1e-6, difference
    # the same HSDP through the trainer mesh's stable names, against one process training on all ranks' data
    trainer = synth.torch.trainer_mesh(plan, "cpu")
    for stable, level in (("dp_replicate", "dp_node"), ("dp_shard", "dp_rank")):
        assert dist.get_process_group_ranks(trainer[stable].get_group()) == \
            dist.get_process_group_ranks(mesh.get_group(level)), stable
    titan = model(0)
    fully_shard(titan, mesh=trainer["dp_replicate", "dp_shard"])
    train(titan, rank)
    one_process = model(0)
    train_single_process(one_process, 8)
    from_one = max_difference(one_process, [p.full_tensor() for p in titan.parameters()])
    assert from_one <= 1e-5, from_one
    return f"max |difference| {difference:.1e}; trainer mesh HSDP vs one process {from_one:.1e}"


# ---------------------------------------------------------------- modes


def run_checks(directory: Path) -> int:
    dist.init_process_group("gloo")
    code = checks_on(directory)
    end_process_group()
    return code


def checks_on(directory: Path) -> int:
    """The ``checks`` on the initialized process group (left initialized)."""
    rank = dist.get_rank()
    checks = [("allreduce_programs", lambda: check_allreduce_programs(rank)),
              ("shard_programs", lambda: check_shard_programs(rank)),
              ("alltoall_programs", lambda: check_alltoall_programs(rank)),
              ("plan_file_with_size_ranges", lambda: check_plan_file_with_size_ranges(rank, directory)),
              ("job_plan", lambda: check_job_plan(rank, directory)),
              ("device_mesh", lambda: check_device_mesh(rank)),
              ("ddp_dp_only", lambda: check_ddp_dp_only(rank)),
              ("ddp_dp_mp", lambda: check_ddp_dp_mp(rank)),
              ("hsdp", lambda: check_hsdp(rank)),
              ("hook_group", lambda: check_hook_group(rank)),
              ("trainer_mesh", lambda: check_trainer_mesh(rank)),
              ("ddp_sparse_embedding", lambda: check_ddp_sparse_embedding(rank))]  # last: it makes DDP raise
    failed = False
    for name, check in checks:
        try:
            detail, ok = check(), True
        except Exception as exc:  # reported, and the other checks still run
            detail, ok = f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}", False
        everyone = synth.torch.world().allgather((ok, detail))
        if rank == 0:
            bad = [d for o, d in everyone if not o]
            print(json.dumps({"check": name, "ok": not bad, "detail": bad[0] if bad else detail}), flush=True)
        failed |= not all(o for o, _ in everyone)
    return 1 if failed else 0


def run_launch(directory: Path) -> int:
    """Every bad launch must give the same error on every rank."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plan8 = directory / "plan8.json"
    plan4 = directory / "plan4.json"
    if rank == 0:
        write_plan(plan8, single(BLUECONNECT, Reduction.of(placement("dp=8", ((2, 4),)), ["dp"])))
        small = Placement(TESTBED.scaled({"rank": 2}), parse_axes("dp=4"), ((2, 2),))
        write_plan(plan4, single(BLUECONNECT, Reduction.of(small, ["dp"])))
    dist.barrier()
    for attempt in (lambda: synth.torch.Executor(plan8), lambda: synth.torch.device_mesh(plan4, "cpu"),
                    lambda: synth.torch.comm_hook(plan4)):
        try:
            attempt()
            print(f"rank {rank}: no error", flush=True)
        except SynthError as exc:
            sys.stderr.write(f"synth-reduce: error: {exc}\n")
            sys.stderr.flush()
    code = cli_main(["bench", str(plan8), "--backend", "torch"])
    print(f"rank {rank}: bench exit {code}", flush=True)
    end_process_group()
    return 0


def run_bench(directory: Path) -> int:
    dist.init_process_group("gloo")
    code = bench_on(directory)
    end_process_group()
    return code


def bench_on(directory: Path) -> int:
    """``bench`` and ``tune`` on the initialized process group (left initialized)."""
    common = ["--backend", "torch", "--topology", "testbed-2x4", "--axes", "dp=8", "--iters", "2", "--warmup", "0"]
    code = cli_main(["bench", *common, "--sizes", "52,4K", "--top", "2", "--jsonl", str(directory / "m.jsonl")])
    code |= cli_main(["tune", *common, "--sizes", "4K,64K", "--top", "3", "--out", str(directory / "tuned.json")])
    return code


def devices_of_group(pg, device: int) -> list[int]:
    """The device (``SYNTH_DEVICE``) of every member of process group ``pg``,
    in group rank order, gathered over ``pg``."""
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in dist.get_process_group_ranks(pg)]
    dist.all_gather(gathered, torch.tensor([device], dtype=torch.int64), group=pg)
    return [int(x) for x in gathered]


# set by run_launched: the modes it runs in one process group leave it initialized
KEEP_GROUP = []


def ensure_process_group() -> None:
    """Initialize gloo's default process group unless it is already."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def report(problems: list[str], ok: str, end: bool = True) -> int:
    """Gather every rank's problems; rank 0 prints them, or ``ok``. Ends the
    process group unless ``end`` is false or :data:`KEEP_GROUP` is set; the
    exit code says whether any rank had a problem."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, problems)
    if dist.get_rank() == 0:
        wrong = [p for ps in everyone for p in ps]
        print("; ".join(wrong) if wrong else ok, flush=True)
    if end and not KEEP_GROUP:
        end_process_group()
    return 1 if any(everyone) else 0


def end_process_group() -> None:
    """Destroy the process group once every rank is done with gloo: ranks wait
    for each other on the launcher's key-value store (no gloo traffic), so no
    rank closes its gloo connections while a peer still has an operation on
    them (gloo's transport thread can abort the process when a connection
    closes under it: a torchtitan mesh run died of SIGABRT after its verdict)."""
    from torch.distributed import distributed_c10d

    store, size = distributed_c10d._get_default_store(), dist.get_world_size()
    store.add("synth/ended", 1)
    deadline = time.monotonic() + 300  # a rank that died is the launcher's to report, not a reason to hang
    while int(store.add("synth/ended", 0)) < size and time.monotonic() < deadline:
        time.sleep(0.01)
    dist.destroy_process_group()


def run_parity(directory: Path) -> int:
    """The failure cases the suite runs under mpiexec, under torchrun (8 gloo
    ranks, one launch): a tampered plan file on one rank and on all, a buffer
    of another length on one rank, an unsupported dtype on one rank, and ranks
    given different bench arguments. Each case's error on every rank is
    gathered; rank 0 prints one JSON line per case: ``{"case", "errors"}``
    (one message per rank, None where a rank raised nothing)."""
    dist.init_process_group("gloo")
    code = parity_on(directory)
    end_process_group()
    return code


def parity_on(directory: Path) -> int:
    """The ``parity`` cases on the initialized process group (left initialized)."""
    import contextlib
    import io

    rank = dist.get_rank()
    plan8, bad = directory / "plan8.json", directory / "swapped.json"

    def executor_of(path):
        return synth.torch.Executor(str(path))

    def buffer_case(length: int, dtype) -> None:
        executor = executor_of(plan8)
        executor(torch.zeros(length, dtype=dtype))

    def arguments() -> None:
        common = ["bench", "--backend", "torch", "--topology", "testbed-2x4", "--axes", "dp=8", "--sizes", "4K",
                  "--warmup", "0", "--iters", "3" if rank < 4 else "6"]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli_main(common)
        if code:
            raise SynthError(err.getvalue().strip().removeprefix("synth-reduce: error: "))

    cases = [("tampered-5", lambda: executor_of(bad if rank == 5 else plan8)),
             ("tampered-all", lambda: executor_of(bad)),
             ("bad-length", lambda: buffer_case(1024 - (rank == 3), torch.float32)),
             ("bad-dtype", lambda: buffer_case(1024, torch.int8 if rank == 1 else torch.float32)),
             ("arguments", arguments)]
    for name, case in cases:
        try:
            case()
            message = None
        except SynthError as exc:
            message = str(exc)
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, message)
        if rank == 0:
            print(json.dumps({"case": name, "errors": everyone}), flush=True)
    return 0


def run_pipelined(directory: Path) -> int:
    """The all-reduce programs of testbed-2x4 dp=8 (the first 12), each as its
    checked MSCCL schedule run with gloo point-to-point (synth.runtime.pipelined
    TorchLinks): every rank's buffer must equal the direct sum."""
    dist.init_process_group("gloo")
    return pipelined_on(directory, end=True)


def pipelined_on(directory: Path, end: bool = False) -> int:
    """The ``pipelined`` runs on the initialized process group (ended only if ``end``)."""
    from synth.export.msccl import compile_program, schedule_of
    from synth.export.msccl_check import check_algorithm
    from synth.runtime.pipelined import TorchLinks, allreduce
    from synth.synthesis.placement import enumerate_placements, parse_axes
    from synth.synthesis.reduction import Reduction
    from synth.synthesis.search import synthesize_reduction
    from synth.synthesis.semantics import Goal
    from synth.topology import load_topology

    rank = dist.get_rank()
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("dp=8"))[0]
    reduction = Reduction.of(placement, "dp", Goal.ALLREDUCE)
    group = tuple(int(d) for d in reduction.reduction_groups[0])
    problems, runs = [], 0
    for program in synthesize_reduction(reduction, 5).programs[:12]:
        algorithm = compile_program(program, reduction, "t")
        if rank == 0:
            check_algorithm(algorithm.xml(), "t")
        schedule = schedule_of(algorithm, group.index(rank))
        for length in (algorithm.nchunksperloop * 3, algorithm.nchunksperloop * 2 + 5):
            inputs = np.random.default_rng(runs).integers(-1000, 1000, size=(8, length)).astype(np.int64)
            buffer = inputs[rank].copy()
            allreduce(schedule, TorchLinks(group), buffer)
            if not np.array_equal(buffer, inputs.sum(axis=0)):
                problems.append(f"rank {rank}: {program} length {length} wrong")
            runs += 1
    return report(problems, f"pipelined: {runs} gloo runs per rank on 8 ranks, all exact", end=end)


def run_sections(sections) -> int:
    """Run each ``(name, section)`` in order on the initialized process group:
    rank 0 prints ``#section NAME``, the section's output, then ``{"section":
    NAME, "code": CODE}``, CODE the highest exit code any rank's section gave
    (1 for a section that raised: reported, and the rest still run). The exit
    code: 1 if any section's CODE was not 0."""
    rank, failed = dist.get_rank(), False
    for name, section in sections:
        if rank == 0:
            print(f"#section {name}", flush=True)
        try:
            code = section()
        except Exception:  # reported; the other sections still run
            traceback.print_exc()
            code = 1
        codes = synth.torch.world().allgather(code)
        if rank == 0:
            print(json.dumps({"section": name, "code": max(codes)}), flush=True)
        failed |= max(codes) != 0
    return 1 if failed else 0


def run_suite(directory: Path) -> int:
    """``pipelined``, ``parity`` (plans from ``directory``), ``bench`` and
    ``checks`` in one launch, one process group (the ranks import torch once,
    not four times), reported by :func:`run_sections`; ``checks`` come last
    (their final check makes DDP raise)."""
    dist.init_process_group("gloo")
    sections = [("pipelined", pipelined_on), ("parity", parity_on), ("bench", bench_on), ("checks", checks_on)]
    code = run_sections([(name, lambda section=section: section(directory)) for name, section in sections])
    end_process_group()
    return code


def run_kill(directory: Path) -> int:
    """Rank 6 dies (os._exit) between two runs of a program; the others are
    inside or entering a collective: torchrun must end the job, not hang."""
    import os

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    executor = synth.torch.Executor(str(directory / "plan8.json"))
    for step in range(1000):
        if rank == 6 and step == 3:
            os._exit(9)
        executor(torch.ones(4096), check=False)
    return 0


if __name__ == "__main__":
    mode, where = sys.argv[1], Path(sys.argv[2])
    sys.exit({"checks": run_checks, "launch": run_launch, "bench": run_bench, "parity": run_parity,
              "kill": run_kill, "pipelined": run_pipelined, "suite": run_suite}[mode](where))
