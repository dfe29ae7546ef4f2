"""PyTorch consumes plans (synth.torch) and the meshes it builds on (synth.runtime.meshes):
mesh layouts and launch checks in-process; under one ``torchrun`` launch of 8
gloo ranks the executor on every program of a placement, the DeviceMesh's
groups, DDP with the plan's hook and FSDP2's HSDP against default DDP
(tests/torch_worker.py); bad launches fail on every rank; ``bench`` and ``tune
--backend torch``; examples/torch_ddp.py. Every launch has a timeout so that a
hang fails the test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from processes import launch_output, launch_sections, limit_s

import synth
from synth.cli import main
from synth.errors import SynthError
from synth.plan import load_plan
from synth.runtime.meshes import host_level, launch_problem, launch_shape_problem, mesh_layout, node_of_device
from synth.synthesis.placement import Placement, enumerate_placements, parse_axes
from synth.topology import load_topology

REPO = Path(__file__).resolve().parents[1]
TESTBED = load_topology("testbed-2x4")


# ---------------------------------------------------------------- meshes (no torch)


def axis_coordinates(placement: Placement, device: int) -> tuple[int, ...]:
    """Each axis' rank of ``device``, from the digit convention of
    synth.synthesis.placement directly: the level coordinates of the device id, each split
    into the axes' digits (last axis fastest), then each axis' digits as a
    number over the levels (outer level most significant)."""
    counts = placement.topology.counts
    level_coords = np.unravel_index(device, counts)
    ranks = [0] * len(placement.axes)
    for level, coordinate in enumerate(level_coords):
        splits = [row[level] for row in placement.matrix]
        digits = np.unravel_index(int(coordinate), splits)
        for a, digit in enumerate(digits):
            ranks[a] = ranks[a] * splits[a] + int(digit)
    return tuple(ranks)


@pytest.mark.parametrize("topology, axes", [("testbed-2x4", "dp=2,mp=4"), ("rack", "dp=8,tp=4,pp=2"),
                                            ("testbed-2x2x2", "dp=4,mp=2")])
def test_mesh_layouts_place_every_device_at_its_axis_coordinates(topology, axes):
    for placement in enumerate_placements(load_topology(topology), parse_axes(axes)):
        flat = mesh_layout(placement)
        assert flat.names == placement.axis_names and flat.shape == tuple(a.size for a in placement.axes)
        for device in range(placement.topology.num_devices):
            assert flat.ids[axis_coordinates(placement, device)] == device
        tree = mesh_layout(placement, hierarchical=True)
        levels = placement.topology.level_names
        want = []
        for axis, row in zip(placement.axes, placement.matrix):
            want += [f"{axis.name}_{name}" for name, split in zip(levels, row) if split > 1] or [axis.name]
        assert list(tree.names) == want
        # splitting each axis coordinate into its level digits is a reshape of the flat mesh
        assert (tree.ids.reshape(flat.shape) == flat.ids).all()
        assert all(d.size == placement.matrix[placement.axis_names.index(d.axis)][d.level]
                   for d in tree.dims if d.level is not None)


def test_a_mesh_dimension_name_may_not_occur_twice():
    placement = Placement(TESTBED, parse_axes("dp=8,dp_rank=1"), ((2, 4), (1, 1)))
    with pytest.raises(SynthError, match="mesh dimension name.s. dp_rank occur twice"):
        mesh_layout(placement, hierarchical=True)


def test_hosts_are_the_node_level_else_the_level_above_the_innermost():
    assert host_level(load_topology("rack")) == 1  # rack > node > cpu > gpu
    assert node_of_device(load_topology("rack")).tolist() == [d // 8 for d in range(64)]
    assert host_level(TESTBED) == 0 and node_of_device(TESTBED).tolist() == [0] * 4 + [1] * 4
    one_level = TESTBED.scaled({"node": 1})
    assert host_level(load_topology("testbed-2x2x2")) == 1
    assert node_of_device(one_level).tolist() == [0] * 4


def test_launch_problems_name_the_ranks_hosts_and_the_fix():
    fix = "launch right"
    assert launch_problem(TESTBED, ["a"] * 8, fix) is None  # every plan node on one host: fine
    assert launch_problem(TESTBED, ["a"] * 4 + ["b"] * 4, fix) is None
    assert launch_problem(TESTBED, ["a"] * 4, fix) == (
        "the plan is for 8 ranks (2 node(s) x 4) but 4 were launched; launch right")
    assert launch_problem(TESTBED, ["a"] * 4 + ["b", "b", "c", "b"], fix) == (
        "ranks 4..7 of plan node 1 must share one host but run on several (ranks 4,5,7 on b; 6 on c); launch right")


def test_a_plan_for_another_topology_of_the_same_world_size_is_refused(tmp_path, capsys):
    """The plan's shape (nodes x devices per node) against torchrun's
    (WORLD_SIZE / LOCAL_WORLD_SIZE x LOCAL_WORLD_SIZE): a 2 x 4 plan launched
    as 4 hosts x 2 or 8 x 1 is refused by synth-reduce launch before the
    script runs, with the same line on every rank; on one host it runs."""
    fours = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"}
    message = launch_shape_problem(TESTBED, fours)
    assert message.startswith("the plan is for 2 node(s) x 4 devices (testbed-2x4) but torchrun launched 4 node(s) "
                              "x 2 ranks"), message
    assert launch_shape_problem(TESTBED, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}) is None
    assert launch_shape_problem(TESTBED, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}) is None  # one host
    assert launch_shape_problem(TESTBED, {"WORLD_SIZE": "8"}) is None  # not said
    plan = tmp_path / "plan.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=8", "--out", str(plan)]) == 0
    capsys.readouterr()
    env = {k: v for k, v in os.environ.items() if k not in ("SYNTH_DEVICE", "SYNTH_RENUMBERED")}
    for rank in (0, 5):
        done = subprocess.run([sys.executable, "-m", "synth.cli", "launch", str(plan), "--", "-c", "print('ran')"],
                              env={**env, **fours, "RANK": str(rank), "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=limit_s(60))
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert done.stderr.strip() == f"synth-reduce: error: {message}", done.stderr


# ---------------------------------------------------------------- light imports


@pytest.mark.slow
def test_synth_torch_and_synth_jax_do_not_load_the_synthesizer():
    code = ("import sys, synth.torch, synth.jax\n"
            "print(sorted({'z3', 'lark'} & {m.split('.')[0] for m in sys.modules}))\n"
            "import synth.runtime.meshes, synth.runtime.executor\n"
            "print(sorted({'torch', 'jax'} & {m.split('.')[0] for m in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit_s(120), cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "['jax', 'torch']"]
    core = ("import sys, synth, synth.api, synth.runtime.executor, synth.runtime.bench, synth.runtime.backends, synth.cli\n"
            "print(sorted({'torch', 'jax'} & {m.split('.')[0] for m in sys.modules}))\n")
    done = subprocess.run([sys.executable, "-c", core], capture_output=True, text=True, timeout=limit_s(120), cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_synth_torch_needs_an_initialized_process_group_and_a_plan():
    import synth.torch

    with pytest.raises(SynthError, match="torch.distributed is not initialized"):
        synth.torch.world()
    with pytest.raises(SynthError, match="plan: give a path or a synth.Plan, not int"):
        synth.torch.Executor(3)
    with pytest.raises(SynthError, match=r"RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set\); e.g. torchrun"):
        synth.torch.init_process_group()


# ---------------------------------------------------------------- torchrun


def torchrun(n: int, *argv: str, timeout_s: float, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
    command = [*launcher, "--no-python", *wrap, *argv] if wrap else [*launcher, *argv]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit_s(timeout_s))


@pytest.fixture(scope="module")
def parity_plans(tmp_path_factory):
    from test_runtime import tampered_plans

    directory = tmp_path_factory.mktemp("parity")
    plan8 = directory / "plan8.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=8", "--program", "5", "--out", str(plan8)]) == 0
    tampered_plans(plan8, directory)  # swapped.json beside it
    return directory


@pytest.fixture(scope="module")
def suite(parity_plans):
    """One launch of 8 gloo ranks (tests/torch_worker.py ``suite``) for the
    pipelined schedules, the mpiexec failure cases, bench and tune, and every
    check of ``checks``: ``(sections, done, directory)``, ``sections`` mapping
    each section's name to its stdout text and its exit code (None if the
    section never reported one)."""
    done = torchrun(8, "tests/torch_worker.py", "suite", str(parity_plans), timeout_s=900)
    return launch_sections(done.stdout), done, parity_plans


def suite_section(suite, name: str) -> str:
    """The stdout of section ``name`` of the suite launch, asserted to have run
    to exit code 0 (the launch's output as the message otherwise)."""
    sections, done, _ = suite
    assert name in sections and sections[name][1] == 0, (name, launch_output(done))
    return sections[name][0]


@pytest.fixture(scope="module")
def checks(suite):
    """The ``checks`` section's records by check name, and the launch."""
    sections, done, _ = suite
    results = {}
    for line in sections.get("checks", [""])[0].splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            results[record["check"]] = record
    return results, done


def assert_check(checks, name: str) -> str:
    results, done = checks
    assert name in results, launch_output(done)
    assert results[name]["ok"], results[name]["detail"]
    return results[name]["detail"]


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_executor_is_exact_on_every_allreduce_program_at_odd_lengths(checks):
    detail = assert_check(checks, "allreduce_programs")
    # every program of dp over both nodes (100 on a (2, 4) hierarchy), x 3 lengths, float32 and float64
    # alternately (the worker checks that all 6 pairs of length and dtype ran)
    count = synth.solve("testbed-2x4", {"dp": 8}, verify=False).placements[0].num_programs
    assert count >= 100 and detail == f"{count} programs, {count * 3} runs per rank"


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_ddp_sparse_embedding_gradients_run_the_plans_program_in_sparse_form(checks):
    """comm_hook(plan, sparse=True) under DDP: nn.Embedding(sparse=True)'s
    gradient equals default DDP's exactly, and without sparse=True the hook
    refuses the sparse bucket by name (tests/torch_worker.py)."""
    detail = assert_check(checks, "ddp_sparse_embedding")
    assert re.fullmatch(r"\d+ gradient rows equal default DDP's; a hook without sparse=True refuses the sparse bucket",
                        detail), detail


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_alltoall_programs_run_exactly_on_gloo(checks):
    """synth.runtime.alltoall on the torch world: the one call and both
    hierarchical programs of ep=8 over 2 x 4 (tests/torch_worker.py)."""
    assert assert_check(checks, "alltoall_programs") == "3 all-to-all programs exact"


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_executor_is_exact_on_reducescatter_and_allgather_plans(checks):
    assert re.fullmatch(r"\d+ programs", assert_check(checks, "shard_programs"))


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_executor_takes_a_plan_path_and_picks_the_program_by_size(checks):
    assert_check(checks, "plan_file_with_size_ranges")


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_a_job_plan_from_the_planner_runs_exactly_through_synth_torch(checks):
    detail = assert_check(checks, "job_plan")
    assert detail == "allgather over tp, reducescatter over tp, reducescatter over dp, allgather over dp: exact", \
        detail


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_device_mesh_groups_are_the_plans_reduction_groups(checks):
    assert_check(checks, "device_mesh")


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_ddp_with_the_plans_hook_trains_like_default_ddp(checks):
    for name in ("ddp_dp_only", "ddp_dp_mp"):
        detail = assert_check(checks, name)
        calls = [int(n) for n in re.search(r"hook calls per step \[([\d, ]+)\]", detail)[1].split(",")]
        assert all(n >= 3 for n in calls[1:]), detail


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_hsdp_on_the_hierarchical_mesh_runs_the_blueconnect_program(checks):
    assert_check(checks, "hsdp")


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_the_hook_refuses_a_process_group_other_than_the_plans(checks):
    detail = assert_check(checks, "hook_group")
    assert "else replicas would silently diverge" in detail


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_the_trainer_mesh_has_stable_names_and_the_plans_groups(checks):
    assert assert_check(checks, "trainer_mesh").startswith("tp [")


def test_the_hook_queue_returns_at_once_and_completes_in_order():
    """The hooks' bucket queue (CPU tensors): submit returns a pending future;
    buckets run one after the other in submission order, whichever hook
    submitted them; a failing step reaches the future, not the backward pass."""
    torch = pytest.importorskip("torch")
    import threading

    from synth.torch import _BucketQueue

    gate, order = threading.Event(), []

    def program(name):
        def run(tensor):
            gate.wait(timeout=60)
            if tensor[0] < 0:
                raise SynthError("step failed")
            order.append((name, int(tensor[0])))
            tensor.add_(100)
        return run

    buckets = _BucketQueue()
    first, second = program("first hook"), program("second hook")
    futures = [buckets.submit(run, torch.tensor([float(i)]))
               for run, i in ((first, 1), (second, 2), (first, -1), (second, 3))]
    assert not any(f.done() for f in futures)  # the work waits on the gate: nothing ran yet
    gate.set()
    assert [float(f.wait()[0]) for f in (futures[0], futures[1], futures[3])] == [101.0, 102.0, 103.0]
    with pytest.raises(Exception, match="step failed"):
        futures[2].wait()
    assert order == [("first hook", 1), ("second hook", 2), ("second hook", 3)]


def _can_unshare() -> bool:
    unshare = shutil.which("unshare")
    return bool(unshare) and subprocess.run([unshare, "--uts", "true"], capture_output=True).returncode == 0


@pytest.mark.torchrun
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _can_unshare(), reason="giving ranks their own host names needs root (unshare --uts)")
def test_bad_launches_fail_on_every_rank_with_one_message(tmp_path):
    # each rank in its own UTS namespace with host name host<local rank>: plan nodes span hosts
    inner = 'hostname "host$LOCAL_RANK" && exec "$0" "$@"'
    rename = ["sh", "-c", f"exec unshare --uts sh -c '{inner}' \"$0\" \"$@\"", sys.executable]
    done = torchrun(4, "tests/torch_worker.py", "launch", str(tmp_path), timeout_s=240, wrap=rename)
    # ranks write to one pipe: count messages in the whole stream, not per line
    size = ("synth-reduce: error: the plan is for 8 ranks (2 node(s) x 4) but 4 were launched; run torchrun "
            "--nnodes 2 --nproc-per-node 4 with --node-rank = the plan's node index (on one host: torchrun "
            "--nproc-per-node 8)")
    hosts = ("synth-reduce: error: ranks 0..1 of plan node 0 must share one host but run on several (ranks 0 on "
             "host0; 1 on host1); run torchrun --nnodes 2 --nproc-per-node 2")
    bench = ("synth-reduce: error: the plan has 8 devices but 4 ranks were launched; run under torchrun "
             "--nproc-per-node 8")
    assert done.stderr.count(size) == 4, done.stdout + done.stderr
    assert done.stderr.count(hosts) == 2 * 4, done.stderr  # device_mesh and comm_hook
    assert done.stderr.count(bench) == 4, done.stderr
    assert sorted(re.findall(r"rank (\d): bench exit 2", done.stdout)) == ["0", "1", "2", "3"]
    assert "no error" not in done.stdout


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_bench_and_tune_run_on_the_torch_backend(suite, cli):
    stdout, tmp_path = suite_section(suite, "bench"), suite[2]
    assert "backend torch-gloo, 8 ranks" in stdout and "gloo implements reduce-scatter through all-reduce" \
        in stdout
    rows = [line.split() for line in stdout.splitlines() if re.match(r"\s+\d+/\d+\s+\d+\s+\d+\s", line)]
    assert rows and all(row[-1] == "0" for row in rows), stdout
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    # the 2 best predicted at the largest size (the NCCL model, as bench ranks them) and the default, x 2 sizes
    best = synth.solve("testbed-2x4", {"dp": 8}, model="nccl", size=4096, top=2, verify=False).placements[0]
    expected = {r.text for r in best.programs} | {"AllReduce(root, inside)"}
    assert {r["program"] for r in records} == expected and len(records) == 2 * len(expected)
    assert {r["backend"] for r in records} == {"torch-gloo"} and all(r["wrong"] == 0 for r in records)
    assert not any("nccl_version" in r or "nccl_choices" in r for r in records)  # gloo: nothing from NCCL
    assert re.search(r"winner at 4 KiB: .*\n# winner at 64 KiB: ", stdout)
    code, out, err = cli("verify", tmp_path / "tuned.json")
    assert code == 0 and "verified allreduce over dp" in out, err
    programs = load_plan(tmp_path / "tuned.json").only.programs
    assert programs[0].min_bytes == 0 and programs[-1].max_bytes is None


@pytest.mark.torchrun
@pytest.mark.timeout(300)
def test_the_ddp_example_trains_with_a_plans_hook(tmp_path):
    """A job plan (tp all-gather and reduce-scatter, dp all-reduce; the
    example trains DDP over dp)."""
    plan = tmp_path / "job.json"
    assert main(["plan", "--topology", "testbed-2x4", "--scale", "rank=2", "--model",
                 "layers=2,hidden=64,heads=4,seq=32,vocab=100", "--global-batch", "8", "--axes", "tp=2,dp=2",
                 "--device", "memory_GiB=16,peak_TFLOPs=1", "--sharding", "none", "--top", "1",
                 "--out", str(plan)]) == 0
    assert len(load_plan(plan).reductions) == 3
    done = torchrun(4, "examples/torch_ddp.py", "--plan", str(plan), "--steps", "3", timeout_s=240)
    assert done.returncode == 0, launch_output(done)
    assert re.search(r"step 3 loss \d+\.\d+", done.stdout), done.stdout
    assert "parameters equal on every rank" in done.stdout


@pytest.mark.torchrun
@pytest.mark.timeout(300)
def test_the_ddp_example_refuses_a_plan_without_a_dp_allreduce_in_one_line(tmp_path):
    """A placement plan reducing over tp of tp=2,dp=4: every rank that prints
    prints the one line (before any connection: no gloo errors, no traceback)
    and exits 2."""
    plan = tmp_path / "hsdp.json"
    assert main(["--topology", "testbed-2x4", "--axes", "tp=2,dp=4", "--out", str(plan)]) == 0
    done = torchrun(8, "examples/torch_ddp.py", "--plan", str(plan), timeout_s=240)
    lines = re.findall(r"torch_ddp\.py: error: .*", done.stderr)
    assert lines and set(lines) == {"torch_ddp.py: error: the plan all-reduces over tp, not over its dp axis; write "
                                    "the plan with --reduce dp"}, launch_output(done)
    assert "Gloo" not in done.stderr and "torch_ddp.py\", line" not in done.stderr, launch_output(done)
    assert "exitcode: 2" in done.stderr, launch_output(done)


# ---------------------------------------------------------------- parity with the mpiexec failure cases


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_the_mpiexec_failure_cases_fail_alike_under_torchrun(suite, parity_plans):
    """The tampered-plan, buffer-mismatch and argument-mismatch cases of
    tests/runtime/test_runtime.py, under torchrun on gloo: every rank gets the same
    one-line error, the one the MPI runs give (dtype names aside)."""
    stdout = suite_section(suite, "parity")
    cases = {r["case"]: r["errors"] for r in map(json.loads, (l for l in stdout.splitlines() if l.startswith("{")))}
    assert set(cases) == {"tampered-5", "tampered-all", "bad-length", "bad-dtype", "arguments"}, stdout
    for name, errors in cases.items():
        assert len(errors) == 8 and len(set(errors)) == 1 and errors[0], (name, errors)
    bad = parity_plans / "swapped.json"
    first = load_plan(parity_plans / "plan8.json").lowered.steps[0].instruction
    tampered = (f"{bad}: step 1 ({first}) stores groups or chunks that differ from the lowering of the program on "
                "this placement; re-create the plan with synth-reduce --out")
    assert cases["tampered-all"][0] == tampered and cases["tampered-5"][0] == f"rank 5: {tampered}"
    assert "buffer lengths differ across ranks" in cases["bad-length"][0]
    assert cases["bad-dtype"][0].startswith("rank 1: dtype int8 is not supported by the torch backend")
    assert cases["arguments"][0] == ("the ranks were given different arguments (--iters 3 on ranks 0,1,2,3, 6 on "
                                     "ranks 4,5,6,7); give every rank the same arguments")


@pytest.mark.torchrun
@pytest.mark.timeout(600)
def test_a_rank_that_dies_ends_the_torchrun_job(parity_plans):
    """Rank 6 exits mid-run while the others are in collectives: the launch
    ends with a failure naming it, never hangs (bounded by the time limit)."""
    done = torchrun(8, "tests/torch_worker.py", "kill", str(parity_plans), timeout_s=180)
    assert done.returncode != 0
    assert "exitcode  : 9" in done.stderr or "exitcode: 9" in done.stderr, done.stderr[-3000:]


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_pipelined_schedules_are_exact_with_gloo_point_to_point(request):
    """MSCCL schedules of 12 all-reduce programs run with torch.distributed
    isend/irecv (gloo) on 8 ranks: every buffer equals the direct sum."""
    pytest.importorskip("torch")
    stdout = suite_section(request.getfixturevalue("suite"), "pipelined")
    assert "pipelined: 24 gloo runs per rank on 8 ranks, all exact" in stdout, stdout[-2000:]
