"""Sparse all-reduce (#22): hierarchical hash partitions, encodings, the sparse
form of proved dense programs checked exactly against the numpy dense sum,
the cost model's density growth and crossover, and the command line."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from helpers import usage_error

from synth.cli import main as cli_main
from synth.cost import Model
from synth.cost.sparse import SparsePredictor, SparseSpec, expected_entries, rank_sparse, step_bytes
from synth.errors import SynthError
from synth.synthesis.hashing import (
    Encoding,
    Format,
    HashPartition,
    choose_format,
    decode,
    encode,
    imbalance,
    range_partition,
    wire_bytes,
)
from synth.synthesis.language import Collective, Form, Instruction, Program
from synth.synthesis.lowering import LoweredProgram, LoweredStep, lower
from synth.synthesis.problem import make_problem
from synth.synthesis.search import synthesize_reduction
from synth.synthesis.sparse import (
    Skew,
    check_sparse,
    dense_sum,
    execute_sparse,
    format_sparse,
    parse_sparse,
    sparse_indices,
    sparse_inputs,
)


def reductions(axes: str = "dp=8", steps: int = 4):
    problem = make_problem("testbed-2x4", axes, "dp", "allreduce", (), steps)
    return [synthesize_reduction(problem.reduction(p), steps) for p in problem.placements()]


# ---------------------------------------------------------------- hashing


def test_the_partition_of_an_index_depends_on_the_index_only():
    a = HashPartition(10_000, (2, 4), seed=3)
    b = HashPartition(10_000, (2, 4), seed=3)
    idx = np.array([7, 9_999, 0, 4_242])
    assert np.array_equal(a.of(idx), b.of(idx))
    assert np.array_equal(a.of(idx), a.partition_of_index[idx])  # table and direct hash agree
    assert np.array_equal(a.of(idx[::-1]), a.of(idx)[::-1])  # no dependence on neighbours
    assert a.partition_sizes.sum() == 10_000 and len(a.partition_sizes) == 8
    assert not np.array_equal(HashPartition(10_000, (2, 4), seed=4).partition_of_index, a.partition_of_index)


def test_split_and_join_are_inverse_and_slots_name_the_partitions_members():
    part = HashPartition(5_000, (4, 2))
    rng = np.random.default_rng(1)
    idx = np.sort(rng.choice(5_000, 700, replace=False))
    val = rng.integers(1, 9, 700)
    pieces = part.split(idx, val)
    for j, (slots, _) in enumerate(pieces):
        assert np.all(part.partition_of_index[part.members(j)[slots]] == j)
    back_idx, back_val = part.join(pieces)
    assert np.array_equal(back_idx, idx) and np.array_equal(back_val, val)
    # the runtime's form keeps the indices themselves, in the same order; any input order gives it
    shuffled = rng.permutation(700)
    for order in (np.arange(700), shuffled):
        by_index = part.split_indices(idx[order], val[order])
        for j, ((slots, values), (keys, same)) in enumerate(zip(pieces, by_index)):
            assert keys.dtype == np.int32 and np.array_equal(keys, part.members(j)[slots])
            assert np.array_equal(same, values) and np.array_equal(part.slots_of(keys), slots)


@pytest.mark.parametrize("sizes", [(8,), (2, 4), (4, 4), (2, 2, 4)])
def test_zipf_skewed_indices_spread_evenly_over_hash_partitions_but_not_over_ranges(sizes):
    n, k = 1 << 20, math.prod(sizes)
    part = HashPartition(n, sizes, seed=0)
    inputs = sparse_inputs(4, n, 0.01, Skew.parse("zipf:1.1"), seed=5)
    union = np.unique(np.concatenate([idx for idx, _ in inputs]))
    for idx in [i for i, _ in inputs] + [union]:
        assert imbalance(part.partition_of_index[idx], k) <= 1.2
    assert imbalance(range_partition(n, k, union), k) > 2  # the skew is real: contiguous chunks overload


def test_skew_parses_and_says_what_is_wrong():
    assert Skew.parse("zipf:1.5") == Skew("zipf", 1.5) and str(Skew.parse(None)) == "uniform"
    for bad in ("zipf", "zipf:0", "pareto:2"):
        with pytest.raises(SynthError, match=r"--skew .*: use uniform or zipf:S"):
            Skew.parse(bad)


def test_zipf_indices_concentrate_on_the_popular_positions():
    rng = np.random.default_rng(0)
    idx = sparse_indices(100_000, 0.01, Skew("zipf", 1.2), rng)
    assert len(idx) == 1000 == len(np.unique(idx))
    assert np.mean(idx < 1000) > 0.3  # uniform would put about 1% there


# ---------------------------------------------------------------- encodings


@pytest.mark.parametrize("entries", [0, 1, 5, 60, 200])
@pytest.mark.parametrize("encoding", list(Encoding))
def test_every_encoding_round_trips_in_the_bytes_it_announces(entries, encoding):
    size = 200
    rng = np.random.default_rng(entries)
    slots = np.sort(rng.choice(size, entries, replace=False))
    values = rng.integers(1, 50, entries).astype(np.float32)
    fmt, blob = encode(slots, values, size, encoding)
    got_slots, got_values = decode(fmt, entries, blob, size, np.float32)
    assert np.array_equal(got_slots, slots) and np.array_equal(got_values, values)
    assert len(blob) == wire_bytes(fmt, entries, size, 4)
    sizes = {f: wire_bytes(f, entries, size, 4) for f in Format}
    assert sizes[fmt] == min(sizes[f] for f in {Encoding.COO: (Format.COO, Format.DENSE),
                                                Encoding.BITMAP: (Format.BITMAP, Format.DENSE),
                                                Encoding.AUTO: tuple(Format)}[encoding])


def test_the_bitmap_wins_once_more_than_one_slot_in_32_holds_an_entry():
    assert choose_format(Encoding.AUTO, 10, 1000, 4) is Format.COO  # 80 B vs 125 + 40
    assert choose_format(Encoding.AUTO, 100, 1000, 4) is Format.BITMAP  # 800 vs 525
    assert choose_format(Encoding.AUTO, 900, 1000, 4) is Format.BITMAP  # 125 + 3600 < 4000
    assert choose_format(Encoding.AUTO, 980, 1000, 4) is Format.DENSE  # 4000 < 125 + 3920
    assert choose_format(Encoding.COO, 900, 1000, 4) is Format.DENSE


def test_encoding_names_are_checked():
    with pytest.raises(SynthError, match="--encoding zip: use one of coo, bitmap, auto"):
        Encoding.of("zip")


# ---------------------------------------------------------------- the sparse form, checked against the dense sum


@pytest.mark.parametrize("axes", ["dp=8", "dp=4,mp=2"])
def test_every_synthesized_program_is_exact_on_uniform_and_skewed_data(axes):
    checked = 0
    for result in reductions(axes, steps=4):
        sizes = result.reduction.hierarchy.sizes
        for program in result.programs:
            lowered = lower(program, result.reduction)
            for skew, density in (("uniform", 0.05), ("zipf:1.1", 0.2)):
                for encoding in (Encoding.COO, Encoding.BITMAP, Encoding.AUTO):
                    checked += check_sparse(lowered, 301, density, Skew.parse(skew), seed=len(program),
                                            encoding=encoding, sizes=sizes)
    assert checked > 0


def test_the_reference_result_is_the_dense_sums_non_zeros_even_where_values_cancel():
    result = reductions("dp=8", 3)[0]
    lowered = lower(Program((Instruction(Collective.REDUCESCATTER, "root", Form.INSIDE),
                             Instruction(Collective.ALLGATHER, "root", Form.INSIDE))), result.reduction)
    n = 64
    part = HashPartition(n, (8,))
    inputs = [(np.array([3, 10]), np.array([5, 1])), (np.array([3]), np.array([-5]))] + [
        (np.array([10 + d]), np.array([d])) for d in range(2, 8)]
    out = execute_sparse(lowered, part, inputs)
    want = dense_sum(inputs, n)
    assert 3 not in want[0]  # 5 - 5 cancels
    for idx, val in out:
        assert np.array_equal(idx, want[0]) and np.array_equal(val, want[1])


def test_a_double_counting_program_is_caught():
    result = reductions("dp=8", 3)[0]
    once = lower(Program((Instruction(Collective.ALLREDUCE, "root", Form.INSIDE),)), result.reduction)
    twice = LoweredProgram(once.program, once.goal, once.num_devices, once.num_chunks, once.reduction_groups,
                           once.chunk_of_rank, once.steps + (LoweredStep(*vars(once.steps[0]).values()),))
    check_sparse(once, 100, 0.1, Skew(), sizes=(8,))
    with pytest.raises(SynthError, match="sparse reference: device 0 holds .*values differ"):
        check_sparse(twice, 100, 0.1, Skew(), sizes=(8,))


def test_sparse_text_round_trips_to_the_dense_program():
    for program in reductions("dp=8", 3)[0].programs:
        assert parse_sparse(format_sparse(program)) == program
    assert format_sparse(Program((Instruction(Collective.REDUCESCATTER, "node", Form.INSIDE),))) == \
        "PartitionSum(node, inside)"


# ---------------------------------------------------------------- cost


def test_expected_entries_follow_the_union_of_independent_sets():
    rng = np.random.default_rng(0)
    n, d = 200_000, 0.03
    for k in (1, 2, 4, 8):
        union = np.unique(np.concatenate([sparse_indices(n, d, Skew(), rng) for _ in range(k)]))
        assert abs(len(union) - expected_entries(n, d, k)) < 0.02 * len(union)


def test_step_bytes_of_the_flat_reduce_scatter_and_all_gather():
    result = reductions("dp=8", 2)[0]
    n, d = 1 << 20, 0.001
    program = Program((Instruction(Collective.REDUCESCATTER, "root", Form.INSIDE),
                       Instruction(Collective.ALLGATHER, "root", Form.INSIDE)))
    rs, ag = step_bytes(program, result.reduction, SparseSpec(n, d, 4, Encoding.COO))
    # each rank holds 8 partitions of about n d / 8 entries each, 8 bytes per entry, and sends 7 of them
    assert rs.send_bytes[0] == pytest.approx(n * d * 8)
    assert rs.receive_bytes[0] == pytest.approx(7 / 8 * n * d * 8)
    # each partition now sums 8 sets: 1 - (1 - d)^8 of its n / 8 slots
    assert ag.send_bytes[0] == pytest.approx(n / 8 * (1 - (1 - d) ** 8) * 8)


def test_predictions_grow_with_density_and_cross_the_dense_default():
    result = reductions("dp=8", 4)[0]
    model = Model.load("mpi")
    spec = SparseSpec(16 << 20, 0.01)
    ranking = rank_sparse(result.reduction, result.programs, spec, model)
    assert list(ranking.predicted_s) == sorted(ranking.predicted_s)
    assert ranking.speedup > 2  # 1% of 64 MiB moves far fewer bytes over the 1 Gbit/s uplinks
    predictor = SparsePredictor(result.reduction, model)
    best = ranking.programs[0]
    times = [predictor.program(best, spec.at(d)) for d in (0.001, 0.01, 0.1, 0.5)]
    assert times == sorted(times)
    crossing = ranking.crossover_density
    assert crossing is not None and 0.01 < crossing < 1
    fastest = min(predictor.program(p, spec.at(crossing)) for p in ranking.programs[:8])
    assert fastest == pytest.approx(ranking.dense_default_s, rel=1e-3)


def test_at_density_one_the_sparse_form_costs_what_its_dense_program_costs():
    result = reductions("dp=8", 3)[0]
    model = Model.load("mpi")
    predictor = SparsePredictor(result.reduction, model)
    from synth.cost.predict import Predictor, lowered_loads

    dense = Predictor(result.reduction, model)
    for program in result.programs:
        sparse_s = predictor.program(program, SparseSpec(1 << 20, 1.0))
        dense_s = dense.program(program, lowered_loads(lower(program, result.reduction)), 4 << 20)
        # at density 1 every partition travels dense: the same bytes; only latency may differ (a GatherSum
        # over two members is one exchange where the ring all-reduce takes two rounds)
        assert sparse_s >= dense_s * 0.99


# ---------------------------------------------------------------- command line


def run_cli(capsys, *argv):
    code = cli_main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


BASE = ("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--algo", "mpi", "--size", "4MiB")


def test_cli_ranks_verified_sparse_programs_beside_the_dense_default(capsys):
    code, out, _ = run_cli(capsys, *BASE, "--density", "0.01", "--json", "--top", "2")
    assert code == 0
    doc = json.loads(out)
    assert doc["collective"] == "sparse-allreduce" and doc["verified"]
    for p in doc["placements"]:
        assert len(p["programs"]) == 2 and all(q["checked_entries"] > 0 for q in p["programs"])
        assert p["programs"][0]["predicted_s"] <= p["programs"][1]["predicted_s"]
        assert parse_sparse(p["programs"][0]["text"]) == parse_sparse(p["programs"][0]["dense_text"])
    code, out, _ = run_cli(capsys, *BASE, "--collective", "sparse-allreduce", "--density", "0.01", "--encoding",
                           "bitmap", "--no-verify")
    assert code == 0 and "encoding bitmap" in out and "crossover" in out


@pytest.mark.parametrize("extra, message", [
    (("--density", "0"), "--density 0: outside (0, 1]"),
    (("--density", "1.5"), "--density 1.5: outside (0, 1]"),
    (("--density", "x"), "--density x: outside (0, 1]"),
    (("--collective", "sparse-allreduce"), "--collective sparse-allreduce needs --density D"),
    (("--collective", "allgather", "--density", "0.1"), "--density applies to sparse-allreduce, not --collective allgather"),
    (("--density", "0.1", "--out", "p.json"), "--out: a plan holds dense programs: write the dense all-reduce's plan"),
])
def test_cli_errors_name_the_option_and_the_fix(capsys, extra, message):
    code, _, err = run_cli(capsys, *BASE, *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- runtime


@pytest.mark.parametrize("encoding", list(Encoding))
@pytest.mark.parametrize("n, density", [(499, 0.1), (40_000, 0.004)])  # merged sums dense / by sorted runs
def test_the_executor_on_thread_ranks_gives_every_rank_the_dense_sums_non_zeros(encoding, n, density):
    from synth.runtime.backends import run_local
    from synth.runtime.sparse import SparseExecutor

    for result in reductions("dp=4,mp=2", 3):
        partition = HashPartition(n, result.reduction.hierarchy.sizes)
        inputs = sparse_inputs(8, n, density, Skew.parse("zipf:1.1"), seed=2, dtype="float32")
        for program in result.programs:
            lowered = lower(program, result.reduction)
            out = run_local(8, lambda world: SparseExecutor(lowered, world, partition, encoding).run(
                *inputs[world.rank]))
            for row in lowered.reduction_groups:
                want_idx, want_val = dense_sum([inputs[d] for d in row], n)
                for d in row:
                    assert np.array_equal(out[d][0], want_idx) and np.array_equal(out[d][1], want_val)


@pytest.mark.mpi
def test_bench_density_under_mpi_prints_zero_wrong_beside_the_dense_default():
    from test_runtime import mpirun

    done = mpirun(4, "-m", "synth.cli", "bench", "--topology", "testbed-2x4", "--scale", "node=1",
                  "--axes", "dp=4", "--density", "0.02", "--skew", "zipf:1.1", "--sizes", "64K", "--iters", "2",
                  "--warmup", "0", "--top", "2", timeout_s=240)
    assert done.returncode == 0, done.stdout + done.stderr
    wrong = re.findall(r"\d\.\d\dx +(\d+)  (?:dense default|PartitionSum|Gather|BroadcastSet)", done.stdout)
    assert wrong == ["0", "0", "0"], done.stdout  # the #wrong column of the default and two sparse programs
    assert "dense default" in done.stdout and "predicted crossover density" in done.stdout


@pytest.mark.mpi
def test_bench_density_errors_name_the_option():
    from test_runtime import mpirun

    done = mpirun(1, "-m", "synth.cli", "bench", "--topology", "testbed-2x4", "--axes", "dp=8", "--skew", "zipf:1")
    assert done.returncode == 2 and "--skew applies to a sparse gradient: add --density D" in done.stderr


def test_bench_density_refuses_the_dense_only_options(cli, tmp_path):
    """--jsonl (fit's measurement records) and --pipelined (MSCCL schedules)
    describe dense collectives: said, not silently dropped."""
    common = ("bench", "--topology", "testbed-2x4", "--axes", "dp=8", "--density", "0.01")
    assert "--jsonl writes measurement records of dense collectives for fit" in usage_error(
        cli, *common, "--jsonl", tmp_path / "r.jsonl")
    assert "--pipelined times MSCCL schedules of dense all-reduces; drop it with --density" in usage_error(
        cli, *common, "--pipelined")


@pytest.mark.torchrun
def test_bench_density_under_torchrun_runs_every_sparse_step_exactly():
    """torch.distributed (gloo): the sparse steps as all_to_all_single with
    split sizes, all_gather, gather and broadcast of padded byte messages
    (synth.runtime.torch_world.TorchSparseComm); the top three programs use
    every one of them, and every result equals the numpy dense sum."""
    from test_torch import torchrun

    done = torchrun(4, "-m", "synth.cli", "bench", "--backend", "torch", "--topology", "testbed-2x4", "--scale",
                    "node=1", "--axes", "dp=4", "--density", "0.02", "--skew", "zipf:1.1", "--sizes", "64K",
                    "--iters", "2", "--warmup", "0", "--top", "3", timeout_s=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"\d\.\d\dx +(\d+)  (.+)", done.stdout)
    assert [w for w, _ in rows] == ["0"] * 4, done.stdout  # the default and three sparse programs
    steps = " ".join(p for _, p in rows)
    for step in ("PartitionSum", "GatherPartitions", "GatherSum(", "GatherSumRoot", "BroadcastSet"):
        assert step in steps, done.stdout


def test_a_workload_takes_sparse_items_priced_by_their_sparse_form(cli):
    """--workload dp:sparse-allreduce:SIZE@D*REPS: the item is the dense
    all-reduce's programs ranked by their sparse form's prediction (the same
    ranking solve_sparse makes), beside the dense default, times its
    repetitions in the placement's total."""
    from synth.synthesis.problem import ProblemSpec
    from synth.synthesis.reduction import Reduction
    from synth.synthesis.search import synthesize_reduction
    from synth.synthesis.semantics import Goal

    code, out, _ = cli("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--workload",
                       "dp:sparse-allreduce:64MiB@0.01*3,mp:allreduce:1MiB", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["workload"][0] == {"reduce": ["dp"], "collective": "sparse-allreduce", "size_bytes": 64 << 20,
                                  "repetitions": 3, "density": 0.01}
    placements = ProblemSpec(topology="testbed-2x4", axes="dp=4,mp=2").build().placements()
    for p in doc["placements"]:
        reduction = Reduction(placements[p["index"]], ("dp",), Goal.ALLREDUCE)
        ranking = rank_sparse(reduction, synthesize_reduction(reduction, 5).programs, SparseSpec((64 << 20) // 4, 0.01))
        sparse_item, dense_item = p["items"]
        assert sparse_item["best_predicted_s"] == ranking.predicted_s[0]
        assert sparse_item["default_predicted_s"] == ranking.dense_default_s
        assert sparse_item["best_sparse_program"] == format_sparse(ranking.programs[0], " ; ")
        assert p["total_predicted_s"] == pytest.approx(3 * ranking.predicted_s[0] + dense_item["best_predicted_s"])


def test_sparse_workload_items_name_their_mistakes(cli):
    common = ("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--workload")
    assert usage_error(cli, *common, "dp:sparse-allreduce:64MiB") == (
        "--workload 'dp:sparse-allreduce:64MiB': give the sparse gradient's density after the size, e.g. "
        "dp:sparse-allreduce:64MiB@0.01")
    assert "'@0.01' is the density of a sparse-allreduce item" in usage_error(cli, *common, "dp:allreduce:1M@0.01")
    assert "density 'x' is not a number" in usage_error(cli, *common, "dp:sparse-allreduce:1M@x")
    assert "in (0, 1]" in usage_error(cli, *common, "dp:sparse-allreduce:1M@1.5")
    assert "use one of allreduce, reducescatter, allgather, sparse-allreduce" in usage_error(cli, *common, "dp:bcast:1M")
    assert "--workload replaces --reduce, --collective, --size and --density" in usage_error(
        cli, *common, "dp:sparse-allreduce:1M@0.1", "--density", "0.1")
    assert "--out: the workload has a sparse-allreduce item; a plan holds dense programs" in usage_error(
        cli, *common, "dp:sparse-allreduce:1M@0.1", "--out", "/tmp/never-written.json")
