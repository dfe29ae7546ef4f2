"""NCCL's tuning log: the parser (every log form NCCL has printed), the capture
of this process's log, the measurement record's optional NCCL fields, and bench
attributing logged choices to each (program, size) it measures. The last runs
bench in-process on thread ranks whose communicators log the way NCCL does
(comm rank 0, one line per call): the GPU path itself is scripts/gpu_check.sh's."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from synth.cli.bench import request_of
from synth.cost import default_program
from synth.cost.nccl_log import Capture, LoggedChoice, logged_version, parse, parse_line, summarize, version_text
from synth.cost.records import Record, append_records, read_records
from synth.errors import SynthError
from synth.runtime.backends import LocalWorld, run_local
from synth.runtime.bench import bench_on
from synth.synthesis.language import parse_program
from synth.synthesis.placement import Placement, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

HEAD = "gpu1:13135:13922 [0] NCCL INFO "


def test_every_form_of_the_tuning_line_is_parsed():
    # newest: names and the channel range, with or without the communicator
    assert parse_line(HEAD + "AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}") == \
        LoggedChoice("AllReduce", 4194304, "RING", "SIMPLE", 32)
    assert parse_line(HEAD + "ReduceScatter: 4 Bytes -> Algo NVLS_TREE proto LL channel{Lo..Hi}={2..3} comm 0x55a7") \
        == LoggedChoice("ReduceScatter", 4, "NVLS_TREE", "LL", 2)
    # names as some notes print them, mixed case: the same choice
    assert parse_line(HEAD + "AllGather: 1048576 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..3}") == \
        LoggedChoice("AllGather", 1048576, "RING", "SIMPLE", 4)
    # the collective and NCCL's enum numbers, with its predicted time
    assert parse_line(HEAD + "AllGather: 37756928 Bytes -> Algo 1 proto 2 time 2860.208008") == \
        LoggedChoice("AllGather", 37756928, "RING", "SIMPLE")
    # the oldest: numbers only, no collective
    assert parse_line(HEAD + "262144 Bytes -> Algo 0 proto 1 time 54.707825") == LoggedChoice(None, 262144, "TREE", "LL128")
    assert parse_line(HEAD + "8 Bytes -> Algo 6 proto 0 time 1.0").algorithm == "PAT"
    assert parse_line(HEAD + "8 Bytes -> Algo 9 proto 0 time 1.0").algorithm == "#9"  # an enum value we do not know


@pytest.mark.parametrize("line", [
    HEAD + "AllReduce: opCount 139d sendbuff 0x78d0 recvbuff 0x78d0 count 7382228 datatype 7 op 0 root 0 comm 0x78 "
           "[nranks=128] stream 0x78",
    HEAD + "NCCL version 2.21.5+cuda12.4",
    HEAD + "comm 0x55a7 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0",
    "",
])
def test_other_lines_are_not_choices(line):
    assert parse_line(line) is None


def test_choices_are_summarized_in_order_with_their_calls():
    lines = [HEAD + f"{c}: {b} Bytes -> Algo {a} proto SIMPLE channel{{Lo..Hi}}={{0..1}}"
             for c, b, a in [("ReduceScatter", 64, "RING"), ("AllReduce", 32, "TREE"), ("ReduceScatter", 64, "RING"),
                             ("AllReduce", 32, "RING"), ("ReduceScatter", 64, "RING")]]
    assert summarize(parse(lines)) == (LoggedChoice("ReduceScatter", 64, "RING", "SIMPLE", 2, calls=3),
                                       LoggedChoice("AllReduce", 32, "TREE", "SIMPLE", 2, calls=1),
                                       LoggedChoice("AllReduce", 32, "RING", "SIMPLE", 2, calls=1))


def test_versions():
    assert logged_version(["x", HEAD + "NCCL version 2.21.5+cuda12.4"]) == "2.21.5"
    assert logged_version(["x"]) is None
    assert [version_text(c) for c in (22105, 21805, 2708)] == ["2.21.5", "2.18.5", "2.7.8"]


def test_capture_points_nccl_at_a_private_file_and_cleans_up(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    with Capture() as capture:
        assert os.environ["NCCL_DEBUG"] == "INFO" and "TUNING" in os.environ["NCCL_DEBUG_SUBSYS"]
        path = os.environ["NCCL_DEBUG_FILE"]
        assert capture.read() == []  # NCCL has not logged yet
        with open(path, "a") as log:  # NCCL writes unbuffered, possibly half a line at a time
            log.write("line 1\nline 2\nhalf ")
        assert capture.read() == ["line 1", "line 2"]
        with open(path, "a") as log:
            log.write("a line\n")
        assert capture.read() == ["half a line"]
        assert capture.read() == []
    assert os.environ["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" not in os.environ
    assert "NCCL_DEBUG_SUBSYS" not in os.environ and not os.path.exists(path)


# ---------------------------------------------------------------- records


PLACEMENT = Placement(load_topology("testbed-2x4"), parse_axes("dp=8"), ((2, 4),))


def test_records_keep_the_nccl_fields_and_refuse_bad_ones(tmp_path):
    reduction = Reduction.of(PLACEMENT, ["dp"])
    choices = (LoggedChoice("AllReduce", 4096, "RING", "LL", 2, calls=7), LoggedChoice(None, 64, "TREE", "LL128", None, 1))
    with_nccl = Record(reduction, default_program(Goal.ALLREDUCE), 4096, 1e-4, backend="torch-nccl",
                       nccl_version="2.21.5", nccl_choices=choices)
    without = Record(reduction, default_program(Goal.ALLREDUCE), 4096, 2e-4, backend="torch-gloo")
    path = tmp_path / "m.jsonl"
    append_records(path, [with_nccl, without])
    _, read = read_records(path)
    assert read == [with_nccl, without]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["nccl_choices"][0] == {"collective": "AllReduce", "size_bytes": 4096, "algorithm": "RING",
                                           "protocol": "LL", "channels": 2, "calls": 7}
    assert "nccl_version" not in lines[1] and "nccl_choices" not in lines[1]  # optional: absent when unknown
    for bad in ({"nccl_choices": [{"collective": "AllReduce"}]}, {"nccl_choices": "RING"}, {"nccl_version": 2.21}):
        path.write_text(json.dumps(dict(lines[0], **bad)) + "\n")
        with pytest.raises(SynthError, match=f"m.jsonl:1: '{next(iter(bad))}' must be"):
            read_records(path)


# ---------------------------------------------------------------- bench records what NCCL logged


class LoggingComm:
    """A thread rank's communicator that, like NCCL on comm rank 0, logs one
    tuning line per call to the file NCCL_DEBUG_FILE names; only world rank 0
    logs (NCCL's log is per process)."""

    def __init__(self, comm, logs: bool) -> None:  # comm: what LocalWorld.split returns
        self.comm, self.logs = comm, logs

    def _log(self, collective: str, a: np.ndarray) -> None:
        if self.logs and self.comm.rank == 0:
            with open(os.environ["NCCL_DEBUG_FILE"], "a") as f:
                f.write(f"{HEAD}{collective}: {a.nbytes} Bytes -> Algo TREE proto LL channel{{Lo..Hi}}={{0..1}}\n")

    def __getattr__(self, name):
        names = {"allreduce": "AllReduce", "reduce_scatter": "ReduceScatter", "allgather": "AllGather",
                 "reduce": "Reduce", "bcast": "Broadcast"}

        def call(a, *rest):
            self._log(names[name], a)
            return getattr(self.comm, name)(a, *rest)

        return call


class LoggingWorld(LocalWorld):
    name = "nccl"
    nccl_version = "2.99.1"

    def split(self, groups):
        comm = super().split(groups)
        return None if comm is None else LoggingComm(comm, self.rank == 0)


def test_bench_records_what_nccl_logged_for_each_program_and_size(tmp_path):
    jsonl = tmp_path / "m.jsonl"
    request = request_of(["--topology", "testbed-2x4", "--axes", "dp=8", "--sizes", "64,4K", "--top", "1",
                          "--iters", "2", "--warmup", "1", "--backend", "nccl", "--jsonl", str(jsonl)], tune=False)
    with Capture() as capture:  # eight thread ranks, each as a LoggingWorld on the same rendezvous
        run_local(8, lambda world: bench_on(LoggingWorld(world.shared, world.rank), request, capture))
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == 2 * 2  # the default and the best predicted program x 2 sizes
    for r in records:
        program = parse_program(r["program"])
        calls = 1 + 1 + 2  # the checked call, 1 warmup, 2 timed iterations
        logged = [(c["collective"], c["calls"]) for c in r["nccl_choices"]]
        steps = [i.collective.value for i in program.instructions]
        # one entry per step of this program and no other program's lines
        assert sorted(name for name, _ in logged) == sorted(set(steps)), (steps, logged)
        assert all(n == calls * steps.count(name) for name, n in logged)
        assert r["nccl_version"] == "2.99.1" and r["backend"] == "nccl"
        assert all(c["algorithm"] == "TREE" and c["protocol"] == "LL" and c["channels"] == 2
                   for c in r["nccl_choices"])
