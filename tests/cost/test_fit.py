"""Learning the cost model (synth.cost.fit, ``synth-reduce fit`` and ``validate``) on
synthetic measurement files generated from a known "true" profile: the fit must
recover the parameters, validate must score a perfect model as perfect, and bad
files and profiles must give a one-line error with exit code 2."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import model, synthesize_all, usage_error

from synth.cost import Algorithm, Predictor, NetworkProfile, default_program, load_profile, save_profile, step_cost
from synth.cost.fit import accuracy, fit_profile, split_cases
from synth.cost.fit import load_samples as load_measurements
from synth.cost.nccl import NCCL_KEYS
from synth.cost.profile import PROFILE_SCHEMA
from synth.synthesis.language import Collective, format_program
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

TESTBED_CONFIGS = [("dp=8", ("dp",)), ("dp=4,mp=2", ("dp",)), ("dp=2,mp=4", ("dp",)), ("dp=2,mp=4", ("mp",))]
TESTBED_SIZES = [4096, 2**20, 16 * 2**20]
# efficiencies != 1 for every collective (the MPI model's, AllReduce's too); NCCL's ring
# LL and LL128 away from their priors, ring Simple at its prior: the NCCL anchor
TRUE_EFFICIENCY = {"AllReduce": 0.9, "ReduceScatter": 0.8, "AllGather": 1.2, "Reduce": 0.7, "Broadcast": 1.1,
                   "ring.LL": 0.6, "ring.LL128": 0.85}
# NCCL step latency per level (LL, LL128, Simple) and base latencies of the ring; the
# testbed's synthetic records do not run LL inside a node: that one stays at its prior 0.6
TRUE_STEPS = ((20.0, 30.0, 60.0), (0.6, 2.5, 4.0))
TRUE_BASE = (("ring.LL", 5.0), ("ring.LL128", 12.0), ("ring.Simple", 20.0))


def profile_for(topology, bandwidth, latency, efficiency=TRUE_EFFICIENCY, call_overhead_us=0.0,
                steps=TRUE_STEPS, base=TRUE_BASE) -> NetworkProfile:
    return replace(NetworkProfile.prior(topology), bandwidth_GBps=tuple(bandwidth), latency_us=tuple(latency),
                   efficiency=tuple(efficiency.items()), call_overhead_us=call_overhead_us,
                   protocol_latency_us=steps, base_latency_us=base)


def expected_fit(true: NetworkProfile) -> NetworkProfile:
    """What a fit can identify: with ring Simple measured (at its prior 1) everything."""
    return true


def record(topology, placement, reduce, goal, program, algo, size, seconds, wrong=0) -> dict:
    """One line in the format of ``synth-reduce bench --jsonl``."""
    backend = "mpi" if algo == "mpi" else "nccl"
    return {
        "schema": "synth-reduce/measurement", "version": 1,
        "topology": topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in placement.axes],
        "matrix": [list(row) for row in placement.matrix],
        "reduce": list(reduce), "collective": goal.value,
        "program": format_program(program),
        "is_default": program == default_program(goal),
        # mpi records say only their backend (as bench writes them); others name the algorithm
        "backend": backend, "algo": None if algo == "mpi" else algo,
        "dtype": "float32", "ranks": topology.num_devices,
        "size_bytes": size, "iters": 3, "times_s": [seconds] * 3, "median_s": seconds,
        "min_s": seconds, "max_s": seconds, "wrong": wrong,
    }


def make_records(topology, true, configs, algos, sizes, goals=(Goal.ALLREDUCE,), max_steps=3,
                 noise=0.0, seed=0, keep=lambda placement: True) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for axes, reduce in configs:
        placements = [p for p in enumerate_placements(topology, parse_axes(axes)) if keep(p)]
        for goal in goals:
            for result in synthesize_all(placements, reduce, goal, max_steps):
                for algo in algos:
                    predictor = Predictor(result.reduction, model(algo, true))
                    for size in sizes:
                        for program, loads in zip(result.programs, result.loads):
                            seconds = predictor.program(program, loads, size)
                            if noise:
                                seconds *= float(np.exp(rng.normal(0.0, noise)))
                            out.append(record(topology, result.placement, reduce, goal, program, algo, size, seconds))
    return out


def write(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def assert_recovers(fitted: NetworkProfile, expected: NetworkProfile, rel: float) -> None:
    assert fitted.topology == expected.topology and fitted.level_names == expected.level_names
    for name, got, want in zip(expected.level_names, fitted.bandwidth_GBps, expected.bandwidth_GBps):
        assert math.isclose(got, want, rel_tol=rel), ("bandwidth", name, got, want)
    for name, got, want in zip(expected.level_names, fitted.latency_us, expected.latency_us):
        assert math.isclose(got, want, rel_tol=rel), ("latency", name, got, want)
    for name, got, want in zip(expected.level_names, fitted.protocol_latency_us, expected.protocol_latency_us):
        assert np.allclose(got, want, rtol=rel, atol=0), ("NCCL step latency", name, got, want)
    for (name, got), (_, want) in zip(fitted.efficiency, expected.efficiency):
        assert math.isclose(got, want, rel_tol=rel), ("efficiency", name, got, want)
    for (name, got), (_, want) in zip(fitted.base_latency_us, expected.base_latency_us):
        assert math.isclose(got, want, rel_tol=rel), ("base latency", name, got, want)
    assert math.isclose(fitted.call_overhead_us, expected.call_overhead_us, rel_tol=rel, abs_tol=1e-6), (
        "call overhead", fitted.call_overhead_us, expected.call_overhead_us)


@pytest.fixture(scope="module")
def testbed():
    return load_topology("testbed-2x4")


@pytest.fixture(scope="module")
def true_testbed(testbed) -> NetworkProfile:
    return profile_for(testbed, (0.3, 5.0), (40.0, 3.0), call_overhead_us=25.0)


@pytest.fixture(scope="module")
def clean_records(testbed, true_testbed) -> list[dict]:
    return make_records(testbed, true_testbed, TESTBED_CONFIGS, ("ring", "mpi"), TESTBED_SIZES,
                        goals=(Goal.ALLREDUCE, Goal.REDUCESCATTER))


@pytest.fixture(scope="module")
def clean_file(tmp_path_factory, clean_records) -> Path:
    return write(tmp_path_factory.mktemp("fit") / "clean.jsonl", clean_records)


@pytest.fixture(scope="module")
def true_profile_file(tmp_path_factory, true_testbed) -> Path:
    path = tmp_path_factory.mktemp("fit") / "true.json"
    save_profile(path, true_testbed)
    return path


# ================================================================ fitting


def test_synthetic_file_covers_every_level_collective_and_algorithm(clean_file, clean_records):
    topology, measurements = load_measurements(clean_file)
    assert topology.name == "testbed-2x4" and len(measurements) == len(clean_records) > 500
    assert {m.algorithm.value for m in measurements} == {"ring", "mpi"}
    assert {m.reduction.goal for m in measurements} == {Goal.ALLREDUCE, Goal.REDUCESCATTER}
    assert {i.collective for m in measurements for i in m.program.instructions} == set(Collective)
    assert [m.line for m in measurements] == list(range(1, len(clean_records) + 1))


def test_noise_free_fit_recovers_every_parameter(clean_file, true_testbed):
    topology, measurements = load_measurements(clean_file)
    fitted, report = fit_profile(measurements, NetworkProfile.prior(topology), efficiency=True)
    assert_recovers(fitted, expected_fit(true_testbed), rel=1e-5)
    assert fitted.efficiency_of("ring.Simple") == 1.0  # the anchor keeps its prior
    assert report.records == len(measurements)
    assert report.median_rel_error < 1e-6 and report.max_rel_error < 1e-6
    assert 1 <= report.iterations <= 8
    assert report.not_identified == ()
    assert "rank LL latency_us" in report.not_exercised and "tree.Simple efficiency" in report.not_exercised


def test_fit_keeps_the_prior_mpi_efficiencies_unless_asked(tmp_path, clean_file, testbed):
    topology, measurements = load_measurements(clean_file)
    prior = NetworkProfile.prior(topology)
    fitted, report = fit_profile(measurements, prior)
    assert [fitted.efficiency_of(c) for c in Collective] == [1.0] * 5  # the MPI model's stay
    assert fitted.efficiency_of("ring.LL") != prior.efficiency_of("ring.LL")  # NCCL's are fitted
    assert report.median_rel_error > 0.01  # the data's MPI efficiencies are not 1
    # data with MPI efficiencies 1: everything else is recovered exactly
    plain = profile_for(testbed, (0.3, 5.0), (40.0, 3.0), {**TRUE_EFFICIENCY, **{c.value: 1.0 for c in Collective}},
                        call_overhead_us=25.0)
    records = make_records(testbed, plain, TESTBED_CONFIGS, ("ring", "mpi"), TESTBED_SIZES)
    topology, measurements = load_measurements(write(tmp_path / "plain.jsonl", records))
    fitted, report = fit_profile(measurements, NetworkProfile.prior(topology))
    assert_recovers(fitted, plain, rel=1e-5)
    assert report.max_rel_error < 1e-6


def test_validate_efficiency_needs_holdout(cli, clean_file):
    assert usage_error(cli, "validate", clean_file, "--efficiency") == (
        "--efficiency applies to the --holdout fit; give --holdout FRACTION")


def test_fit_with_5_percent_lognormal_noise_is_within_10_percent(tmp_path, testbed, true_testbed):
    records = make_records(testbed, true_testbed, TESTBED_CONFIGS, ("mpi",), TESTBED_SIZES,
                           goals=(Goal.ALLREDUCE, Goal.REDUCESCATTER), noise=0.05, seed=3)
    topology, measurements = load_measurements(write(tmp_path / "noisy.jsonl", records))
    prior = NetworkProfile.prior(topology)
    fitted, report = fit_profile(measurements, prior, efficiency=True)
    # MPI records only: AllReduce is the anchor (kept at 1), the bandwidths absorb its 0.9
    scale = true_testbed.efficiency_of(Collective.ALLREDUCE)
    for got, want in zip(fitted.bandwidth_GBps, true_testbed.bandwidth_GBps):
        assert math.isclose(got, want * scale, rel_tol=0.10)
    for c in Collective:
        assert math.isclose(fitted.efficiency_of(c), true_testbed.efficiency_of(c) / scale, rel_tol=0.10)
    # a latency the noise swamps keeps its prior (and is reported); the others are recovered
    for name, got, want, start in zip(topology.level_names, fitted.latency_us, true_testbed.latency_us,
                                      prior.latency_us):
        assert math.isclose(got, want, rel_tol=0.15) or (
            got == start and f"{name} latency_us" in dict(report.not_identified)), (name, got, report)
    # residuals reflect the noise: median |lognormal(0, 0.05) - 1| is about 3.4%
    assert 0.01 < report.median_rel_error < 0.08


def test_fit_on_p2_a100_with_ring_and_tree(tmp_path):
    p2 = load_topology("p2-a100")
    efficiency = {**{c.value: 1.0 for c in Collective}, "ring.LL": 0.45, "ring.LL128": 0.9,
                  "tree.LL": 0.3, "tree.LL128": 0.8, "tree.Simple": 0.85}
    true = profile_for(p2, (6.0, 200.0), (5.0, 1.0), efficiency, steps=((3.0, 5.0, 10.0), (0.5, 1.5, 3.0)),
                       base=(("ring.Simple", 9.0), ("tree.LL128", 11.0)))
    records = make_records(p2, true, [("dp=4,mp=16", ("dp",)), ("dp=16,mp=4", ("dp",))], ("ring", "tree"),
                           [65536, 4 * 2**20, 256 * 2**20])
    topology, measurements = load_measurements(write(tmp_path / "p2.jsonl", records))
    assert {m.algorithm.value for m in measurements} == {"ring", "tree"}
    fitted, report = fit_profile(measurements, NetworkProfile.prior(topology))
    assert report.max_rel_error < 1e-6
    assert math.isclose(fitted.bandwidth_GBps[0], 6.0, rel_tol=1e-6)
    assert math.isclose(fitted.bandwidth_GBps[1], 200.0, rel_tol=1e-6)
    for key in ("ring.LL128", "tree.LL128", "tree.Simple"):
        assert math.isclose(fitted.efficiency_of(key), efficiency[key], rel_tol=1e-6), key
    assert math.isclose(fitted.base_us("tree.LL128"), 11.0, rel_tol=1e-6) or \
        "tree.LL128 base latency_us" in dict(report.not_identified)


def test_levels_no_record_exercises_keep_their_prior(tmp_path, testbed, true_testbed):
    # mp inside one node only: nothing crosses the node level
    records = make_records(testbed, true_testbed, [("dp=2,mp=4", ("mp",))], ("mpi",), TESTBED_SIZES,
                           keep=lambda p: p.matrix[1][0] == 1)
    topology, measurements = load_measurements(write(tmp_path / "inside.jsonl", records))
    assert {m.reduction.placement.matrix for m in measurements} == {((2, 1), (1, 4))}
    fitted, report = fit_profile(measurements, NetworkProfile.prior(topology), efficiency=True)
    assert math.isclose(fitted.latency_us[0], 100.0, rel_tol=1e-9)
    assert math.isclose(fitted.bandwidth_GBps[0], 0.125, rel_tol=1e-9)
    assert math.isclose(fitted.latency_us[1], 3.0, rel_tol=1e-6)
    assert report.max_rel_error < 1e-6
    assert {"node latency_us", "node bandwidth_GBps"} <= set(report.not_exercised)


# ================================================================ what the records cannot identify (issue 12, item 13)


def test_five_records_do_not_fit_degenerate_parameters(tmp_path, testbed, true_testbed):
    # five records of one placement: before, the fit put a bandwidth at 1e6 GB/s and the
    # latencies at 1e-9 us, silently; now a bandwidth the records push beyond 10x its prior
    # keeps the prior and is reported, and latencies they put at zero are reported as such
    records = make_records(testbed, true_testbed, [("dp=8", ("dp",))], ("mpi",), TESTBED_SIZES, max_steps=2)
    five = [records[i] for i in (2, 5, 7, 9, 12)]
    topology, measurements = load_measurements(write(tmp_path / "five.jsonl", five))
    prior = NetworkProfile.prior(topology)
    fitted, report = fit_profile(measurements, prior)
    for got, start in zip(fitted.bandwidth_GBps, prior.bandwidth_GBps):
        assert start / 10 < got < start * 10, (fitted, report)
    kept = dict(report.not_identified)
    assert kept, report
    for name in kept:
        level, _, what = name.partition(" ")
        if what in ("bandwidth_GBps", "latency_us"):
            i = topology.level_names.index(level)
            assert math.isclose(getattr(fitted, what)[i], getattr(prior, what)[i], rel_tol=1e-9)
    for i, name in enumerate(topology.level_names):
        assert fitted.latency_us[i] > 0.1 or f"{name} latency_us" in report.at_zero + tuple(kept)
        assert fitted.latency_us[i] == 0 or fitted.latency_us[i] > 0.1  # no 1e-9 floor


def test_the_fit_command_lists_what_it_kept_at_the_prior(cli, tmp_path, testbed, true_testbed):
    records = make_records(testbed, true_testbed, [("dp=8", ("dp",))], ("mpi",), TESTBED_SIZES, max_steps=2)
    path = write(tmp_path / "five.jsonl", [records[i] for i in (2, 5, 7, 9, 12)])
    code, out, err = cli("fit", path, "-o", tmp_path / "p.json")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("kept at the prior, not identified by these measurements: "))
    assert "(not separable from " in line or "(the records put it beyond 10x or 1/10 of its prior)" in line
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["fit"]["not_identified"] and "call_overhead_us" not in doc["fit"]["not_exercised"]


def test_records_with_wrong_results_are_refused(cli, tmp_path, clean_records):
    rows = [dict(r) for r in clean_records[:4]]
    rows[2]["wrong"] = 3
    path = write(tmp_path / "wrong.jsonl", rows)
    expected = (f"{path}:3: the run gave 3 wrong element(s) (field 'wrong'), so its time is not a measurement "
                "of a correct program; re-measure it or delete the line")
    assert usage_error(cli, "fit", path, "-o", tmp_path / "p.json") == expected
    assert usage_error(cli, "validate", path) == expected
    assert not (tmp_path / "p.json").exists()


# ================================================================ NCCL corpus lines


def corpus_line(collective: str, ranks: int, size: int, seconds: float, algo=None, nvls=None) -> dict:
    """A line in data/nccl/'s format (data/nccl/README.md)."""
    return {"source": "synthetic", "set": "synthetic", "system": {
        "gpu": "H100", "gpus_per_node": 8, "nodes": max(1, ranks // 8), "nics_per_node": 8, "nic_Gbps": 400,
        "nic_type": "InfiniBand", "nvlink": "NVLink4", "nvswitch": True, "nvls": nvls, "cloud": None, "notes": ""},
        "nccl_version": "2.27.7", "collective": collective, "algo": algo, "proto": None, "algo_reported": None,
        "size_bytes": size, "count": None, "dtype": "float", "redop": "sum", "time_us": round(seconds * 1e6, 6),
        "algbw_GBps": None, "busbw_GBps": None, "in_place": False, "ranks": ranks, "env": {}, "tool": "nccl-tests"}


def test_fit_recovers_known_parameters_from_corpus_lines(cli, tmp_path):
    """Synthetic corpus lines on dgx-h100 (NCCL's choice and forced ring and tree,
    all-reduce and all-gather, 2 to 64 GPUs, 8 B to 16 GiB) from a known profile:
    the fit recovers every parameter the lines exercise."""
    dgx = load_topology("dgx-h100")
    prior = NetworkProfile.prior(dgx)
    rng = random.Random(1)
    true = replace(prior, bandwidth_GBps=(40.0, 380.0),
                   protocol_latency_us=tuple(tuple(x * rng.uniform(.5, 2) for x in p) for p in prior.protocol_latency_us),
                   base_latency_us=tuple((k, v * rng.uniform(.5, 2)) for k, v in prior.base_latency_us),
                   efficiency=tuple((k, v if k == "ring.Simple" else v * rng.uniform(.7, 1.2)) for k, v in prior.efficiency))
    lines = []
    for algo in (None, "Ring", "Tree"):
        for collective, c in (("allreduce", Collective.ALLREDUCE), ("allgather", Collective.ALLGATHER)):
            for ranks in (2, 4, 8, 16, 64):
                for size in (2**k for k in range(3, 35, 3)):
                    forced = {None: Algorithm.NCCL, "Ring": Algorithm.RING, "Tree": Algorithm.TREE}[algo]
                    seconds = step_cost(dgx, true, forced, c, np.arange(ranks)[None], np.array([float(size)]))[0]
                    lines.append(corpus_line(collective, ranks, size, seconds, algo))
    lines.append(corpus_line("sendrecv", 8, 1024, 1e-5))  # not a collective the model has: skipped
    path = write(tmp_path / "corpus.jsonl", lines)
    code, out, err = cli("fit", path, "--topology", "dgx-h100", "-o", tmp_path / "p.json")
    assert code == 0, err
    assert out.splitlines()[0].endswith("; 1 corpus line(s) skipped (not a collective the model has)")
    fitted = load_profile(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["fit"]["not_identified"] == {}
    unused = set(doc["fit"]["not_exercised"])
    assert unused == {"node latency_us", "gpu latency_us", "call_overhead_us", "pat.Simple base latency_us",
                      "pat.Simple efficiency", *(f"{c.value} efficiency" for c in Collective)}
    assert doc["fit"]["max_rel_error"] < 1e-5  # times are written with 1e-6 us resolution
    # everything exercised is the truth, the rest the prior (the truth's pat values are not)
    expected = replace(true, latency_us=prior.latency_us,
                       base_latency_us=tuple((k, prior.base_us(k) if k == "pat.Simple" else v)
                                             for k, v in true.base_latency_us),
                       efficiency=tuple((k, v if k in NCCL_KEYS and k != "pat.Simple" else prior.efficiency_of(k))
                                        for k, v in true.efficiency))
    assert_recovers(fitted, expected, rel=1e-4)


def test_corpus_lines_need_the_measured_topology(cli, tmp_path):
    path = write(tmp_path / "c.jsonl", [corpus_line("allreduce", 16, 1024, 1e-5)])
    assert usage_error(cli, "fit", path, "-o", tmp_path / "p.json") == (
        f"{path}: NCCL corpus lines carry no synth-reduce topology; give the measured system's with --topology")
    assert usage_error(cli, "validate", path, "--topology", "hgx-h200") == (
        f"{path}:1: the run used 16 GPUs but topology 'hgx-h200' has 8; give the topology of the measured "
        f"system (--topology)")
    mixed = write(tmp_path / "m.jsonl", [corpus_line("allreduce", 8, 1024, 1e-5), {"schema": "x"}])
    assert usage_error(cli, "validate", mixed, "--topology", "hgx-h200").startswith(
        f"{mixed}:2: not an NCCL corpus line")


def test_the_committed_corpus_fits(cli, tmp_path):
    sets = ["stas00-h200x8-torch-allreduce-sweep", "azure-ndh200v5-x8-nvls-inplace", "stas00-h200x8-nvls-ramp-8g"]
    paths = [str(Path(__file__).resolve().parents[2] / "data" / "nccl" / f"{s}.jsonl") for s in sets]
    code, out, err = cli("validate", *paths, "--topology", "hgx-h200", "--holdout", "0.5", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cases"] == 0 and doc["top_k"] is None  # single calls: nothing to rank
    assert doc["records"] + doc["fitted_on_records"] == 54
    assert doc["median_rel_error"] < 0.5


def test_fit_command_writes_a_profile_and_reports_residuals(cli, tmp_path, clean_file, true_testbed):
    out_path = tmp_path / "profile.json"
    code, out, err = cli("fit", clean_file, "-o", out_path, "--efficiency")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"fitted {len(clean_file.read_text().splitlines())} measurements of topology "
                               f"testbed-2x4 in ") and lines[0].endswith(f" -> {out_path}")
    assert lines[1].split()[:5] == ["level", "bandwidth_GBps", "(prior)", "latency_us", "(prior)"]
    assert lines[2].split()[0] == "node" and lines[2].split()[2] == "0.125"
    assert any(line.startswith("residuals: median 0.0%, mean 0.0%, max 0.0% relative; RMSE ") for line in lines)
    assert "call overhead: 25 us per collective call (prior 0)" in lines
    fitted = load_profile(out_path)
    assert_recovers(fitted, expected_fit(true_testbed), rel=1e-3)
    doc = json.loads(out_path.read_text())
    assert doc["schema"] == PROFILE_SCHEMA and doc["version"] == 2 and doc["topology"] == "testbed-2x4"
    assert doc["structure"]["levels"][0] == {"name": "node", "count": 2, "ports": 1, "fabric": "switch",
                                             "link": "net", "nvlinks": None, "nvls": False}
    assert doc["fit"]["records"] == len(clean_file.read_text().splitlines())
    assert doc["fit"]["median_rel_error"] < 1e-6
    assert math.isclose(doc["call_overhead_us"], 25.0, rel_tol=1e-3)


def test_fit_command_json_and_start_profile(cli, tmp_path, clean_file, true_profile_file, true_testbed):
    code, out, err = cli("fit", clean_file, "-o", tmp_path / "p.json", "--profile", true_profile_file, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc == json.loads((tmp_path / "p.json").read_text())
    assert [lv["name"] for lv in doc["levels"]] == ["node", "rank"]
    # without --efficiency the starting profile's MPI efficiencies stay, unnormalised, and are right here;
    # NCCL's are fitted relative to ring Simple, which the start has at its true value
    assert math.isclose(doc["levels"][0]["bandwidth_GBps"], true_testbed.bandwidth_GBps[0], rel_tol=1e-6)
    assert doc["efficiency"] == pytest.approx(dict(true_testbed.efficiency), rel=1e-9)
    assert doc["fit"]["median_rel_error"] < 1e-6
    assert set(doc["fit"]) >= {"records", "iterations", "median_rel_error", "max_rel_error", "rmse_s"}


def test_profile_round_trip(tmp_path, true_testbed):
    save_profile(tmp_path / "p.json", true_testbed)
    assert load_profile(tmp_path / "p.json") == true_testbed


def test_fitted_profile_changes_the_main_command(cli, tmp_path, testbed, true_testbed):
    save_profile(tmp_path / "p.json", true_testbed)
    argv = ("--topology", "testbed-2x4", "--axes", "dp=8", "--no-verify", "--top", "1", "--size", "1M", "--json")
    prior = json.loads(cli(*argv)[1])
    fitted = json.loads(cli(*argv, "--profile", tmp_path / "p.json")[1])
    assert fitted["model"]["profile"] == str(tmp_path / "p.json") and prior["model"]["profile"] is None
    placement = enumerate_placements(testbed, parse_axes("dp=8"))[0]
    result = synthesize_all([placement], ("dp",), Goal.ALLREDUCE, 5)[0]
    i = result.programs.index(default_program(Goal.ALLREDUCE))
    want = Predictor(result.reduction, model("ring", true_testbed)).program(result.programs[i], result.loads[i], 2**20)
    assert fitted["placements"][0]["default"]["predicted_s"] == pytest.approx(want, rel=1e-12)
    assert prior["placements"][0]["default"]["predicted_s"] != pytest.approx(want, rel=1e-3)


# ================================================================ validate


def test_validate_with_the_true_profile_is_perfect(cli, clean_file, true_profile_file, clean_records):
    code, out, err = cli("validate", clean_file, "--profile", true_profile_file, "--json")
    assert code == 0, err
    doc = json.loads(out)
    cases: dict = {}
    for r in clean_records:
        key = (json.dumps(r["matrix"]), tuple(r["reduce"]), r["collective"], r["size_bytes"], r["backend"], r["algo"])
        cases[key] = cases.get(key, 0) + 1
    # cases with one program (a ReduceScatter over 2 members) have nothing to rank
    assert 0 < sum(n == 1 for n in cases.values()) < len(cases)
    assert doc["cases"] == sum(n >= 2 for n in cases.values()) and doc["records"] == len(clean_records)
    assert doc["fitted_on_records"] == 0
    assert doc["cases"] >= 10 and doc["min_cases"] == 10
    assert doc["top_k"] == {"1": 1.0, "3": 1.0, "5": 1.0, "10": 1.0}
    n = doc["cases"]  # Wilson's interval for n of n: (n / (n + z^2), 1)
    assert doc["top_k_ci95"]["1"] == pytest.approx([n / (n + 1.959963984540054 ** 2), 1.0])
    assert doc["spearman_mean"] == pytest.approx(1.0, abs=1e-12)
    assert doc["median_rel_error"] == 0.0


def test_validate_table(cli, clean_file, true_profile_file):
    code, out, err = cli("validate", clean_file, "--profile", true_profile_file)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"scored {len(clean_file.read_text().splitlines())} measurements: ")
    n = int(lines[0].split(": ")[1].split()[0])
    low = f"{n / (n + 1.959963984540054 ** 2):.0%}"
    assert lines[1] == ("top-k accuracy (95% interval): " + "  ".join(
        f"top-{k} 100% ({low}-100%)" for k in (1, 3, 5, 10)))
    assert lines[2] == "Spearman correlation per case (mean): 1.000"
    assert lines[3] == "median relative error of predicted times: 0.0%"


def test_validate_with_the_prior_reports_its_error(cli, clean_file):
    doc = json.loads(cli("validate", clean_file, "--json")[1])
    assert doc["median_rel_error"] > 0.2  # the prior is far from the true profile


def test_top_k_counts_where_the_measured_fastest_ranks(clean_file, true_testbed):
    """Make one case's fastest measured program one the model ranks 11th or later:
    that case misses at every k, the others hit."""
    _, measurements = load_measurements(clean_file)
    predicted = np.array([m.median_s for m in measurements])  # true profile, noise-free
    by_case: dict = {}
    for i, m in enumerate(measurements):
        by_case.setdefault(m.case, []).append(i)
    case, idx = max(by_case.items(), key=lambda kv: len(kv[1]))
    assert len(idx) > 20
    # position of record j in its case when sorted by prediction (ties by record order)
    slow = max(idx, key=lambda j: predicted[j])
    position = sum(predicted[i] < predicted[slow] or (predicted[i] == predicted[slow] and i < slow) for i in idx)
    assert position >= 10
    changed = list(measurements)
    faster = replace(measurements[slow].record, median_s=float(predicted[idx].min()) / 2)
    changed[slow] = replace(measurements[slow], record=faster)
    acc = accuracy(true_testbed, changed)
    n = sum(len(v) >= 2 for v in by_case.values())
    assert acc.cases == n
    assert acc.top_k == {k: pytest.approx((n - 1) / n) for k in (1, 3, 5, 10)}
    assert acc.spearman_mean < 1.0
    assert acc.median_rel_error == 0.0


def test_validate_holdout_scores_held_out_cases(cli, clean_file, clean_records):
    code, out, err = cli("validate", clean_file, "--holdout", "0.5", "--efficiency", "--json")
    assert code == 0, err
    doc = json.loads(out)
    _, measurements = load_measurements(clean_file)
    train, held = split_cases(measurements, 0.5, seed=0)
    assert {m.case for m in train}.isdisjoint({m.case for m in held})
    assert len({m.case for m in held}) == round(0.5 * len({m.case for m in measurements}))
    held_sizes: dict = {}
    for m in held:
        held_sizes[m.case] = held_sizes.get(m.case, 0) + 1
    assert doc["cases"] == sum(n >= 2 for n in held_sizes.values())
    assert doc["records"] == len(held) and doc["fitted_on_records"] == len(train)
    assert doc["records"] + doc["fitted_on_records"] == len(clean_records)
    # fitted on the other half of noise-free data: the model is exact again
    assert doc["median_rel_error"] < 1e-6
    assert doc["top_k"] is None if doc["cases"] < 10 else doc["top_k"]["1"] == 1.0
    code, out, err = cli("validate", clean_file, "--holdout", "0.5")
    assert code == 0, err
    assert out.startswith(f"scored {len(held)} held-out measurements (fitted on {len(train)}): "
                          f"{doc['cases']} case(s)")
    # another seed, another split
    other = json.loads(cli("validate", clean_file, "--holdout", "0.5", "--seed", "1", "--json")[1])
    assert other["records"] + other["fitted_on_records"] == len(clean_records)


def test_validate_json_without_a_case_to_rank(cli, tmp_path, clean_records):
    path = write(tmp_path / "single.jsonl", clean_records[:1])
    code, out, err = cli("validate", path, "--json")
    if code == 2:  # a clear error is as good as valid JSON
        assert out == "" and err.count("\n") == 1
        return
    assert code == 0, err

    def reject(constant):
        raise ValueError(f"not JSON: {constant}")

    doc = json.loads(out, parse_constant=reject)
    assert doc["cases"] == 0 and doc["records"] == 1


def test_validate_reports_no_top_k_from_fewer_than_ten_cases(cli, tmp_path, clean_records, clean_file):
    _, measurements = load_measurements(clean_file)
    cases = sorted({m.case for m in measurements if sum(x.case == m.case for x in measurements) >= 2}, key=repr)
    two = [r for r, m in zip(clean_records, measurements) if m.case in cases[:2]]
    path = write(tmp_path / "two.jsonl", two)
    code, out, err = cli("validate", path)
    assert code == 0, err
    assert out.splitlines()[1] == ("top-k accuracy and Spearman: n/a (2 case(s) with two or more programs "
                                   "measured; at least 10 are needed)")
    doc = json.loads(cli("validate", path, "--json")[1])
    assert doc["cases"] == 2 and doc["top_k"] is None and doc["top_k_ci95"] is None


def test_wilson_interval():
    from synth.cost.fit import wilson_interval

    assert wilson_interval(9, 10) == pytest.approx((0.5958, 0.9821), abs=1e-4)  # the textbook 9 of 10
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)


@pytest.mark.parametrize("fraction", ["0", "1", "1.5", "-0.2"])
def test_validate_bad_holdout(cli, clean_file, fraction):
    assert usage_error(cli, "validate", clean_file, "--holdout", fraction) == (
        f"--holdout {float(fraction)}: give the held-out fraction of cases, between 0 and 1"
    )


def test_validate_holdout_needs_two_cases(cli, tmp_path, clean_records):
    one_case = [r for r in clean_records if r is clean_records[0] or (
        r["matrix"] == clean_records[0]["matrix"] and r["reduce"] == clean_records[0]["reduce"]
        and r["collective"] == clean_records[0]["collective"] and r["size_bytes"] == clean_records[0]["size_bytes"]
        and r["backend"] == clean_records[0]["backend"])]
    assert len(one_case) >= 2
    path = write(tmp_path / "one.jsonl", one_case)
    assert usage_error(cli, "validate", path, "--holdout", "0.5") == (
        "--holdout leaves no case to fit on; measure more cases or hold out less"
    )


# ================================================================ bad input


def edited(tmp_path: Path, records: list[dict], line: int, change, name="bad.jsonl") -> Path:
    """The first three records with record ``line`` (1-based) changed."""
    rows = [dict(r) for r in records[:3]]
    rows[line - 1] = change(rows[line - 1])
    return write(tmp_path / name, rows)


def drop(key):
    def change(r):
        r.pop(key)
        return r
    return change


def setting(**fields):
    def change(r):
        r.update(fields)
        return r
    return change


@pytest.mark.parametrize("command", ["fit", "validate"])
@pytest.mark.parametrize("field", ["topology", "matrix", "program", "size_bytes", "median_s", "reduce"])
def test_missing_field_names_file_line_and_field(cli, tmp_path, clean_records, command, field):
    path = edited(tmp_path, clean_records, 2, drop(field))
    extra = ("-o", tmp_path / "p.json") if command == "fit" else ()
    assert usage_error(cli, command, path, *extra) == f"{path}:2: missing field(s) {field}"
    assert not (tmp_path / "p.json").exists()


def test_several_missing_fields_are_all_named(cli, tmp_path, clean_records):
    path = edited(tmp_path, clean_records, 1,
                  lambda r: {"schema": r["schema"], "version": r["version"], "topology": r["topology"]})
    message = usage_error(cli, "validate", path)
    assert message == (f"{path}:1: missing field(s) axes, matrix, reduce, collective, program, "
                       "size_bytes, median_s")


def test_unparsable_json_line(cli, tmp_path, clean_records):
    path = write(tmp_path / "bad.jsonl", [clean_records[0], "{\"topology\": ", clean_records[1]])
    message = usage_error(cli, "validate", path)
    assert message.startswith(f"{path}:2: not valid JSON (")


def test_a_json_line_that_is_not_an_object(cli, tmp_path, clean_records):
    path = write(tmp_path / "bad.jsonl", [clean_records[0], "[1, 2]"])
    assert usage_error(cli, "validate", path) == f"{path}:2: expected a JSON object"


@pytest.mark.parametrize("change, expected", [
    (drop("schema"), 'not a synth-reduce measurement (expected "schema": "synth-reduce/measurement")'),
    (setting(schema="synth-reduce/plan"), 'not a synth-reduce measurement (expected "schema": "synth-reduce/measurement")'),
    (setting(version=2), "measurement version 2 is not supported; this synth-reduce reads version 1"),
])
def test_records_of_another_schema_or_version_are_refused(cli, tmp_path, clean_records, change, expected):
    path = edited(tmp_path, clean_records, 2, change)
    assert usage_error(cli, "fit", path, "-o", tmp_path / "p.json") == f"{path}:2: {expected}"


@pytest.mark.parametrize(
    "program, detail",
    [
        ("AllReduce(node, parallel(root))", "does not implement allreduce"),  # valid syntax, not a reduction
        ("AllReduce(gpu, inside)", "level 'gpu' is not in the synthesis hierarchy"),
    ],
)
def test_unknown_program_for_the_placement(cli, tmp_path, clean_records, program, detail):
    assert clean_records[0]["matrix"] == [[2, 4]] and clean_records[0]["collective"] == "allreduce"
    path = edited(tmp_path, clean_records, 3, setting(matrix=[[2, 4]], axes=[{"name": "dp", "size": 8}],
                                                       reduce=["dp"], program=program))
    message = usage_error(cli, "fit", path, "-o", tmp_path / "p.json")
    assert message.startswith(f"{path}:3: unknown program for this placement: ")
    assert detail in message


def test_unparsable_program_in_a_record(cli, tmp_path, clean_records):
    path = edited(tmp_path, clean_records, 3, setting(program="Frobnicate(root, inside)"))
    message = usage_error(cli, "fit", path, "-o", tmp_path / "p.json")
    assert message.startswith(f"{path}:3: program:1:1: syntax error: unexpected 'Frobnicate'")


def test_record_with_another_topology(cli, tmp_path, clean_records):
    p2 = load_topology("p2-a100").to_dict()
    path = edited(tmp_path, clean_records, 2, setting(topology=p2))
    assert usage_error(cli, "validate", path) == (
        f"{path}:2: topology 'p2-a100' differs from the file's first record ('testbed-2x4'); "
        "fit one topology per file"
    )
    # same name, other numbers: also another topology
    changed = json.loads(json.dumps(clean_records[0]["topology"]))
    changed["levels"][0]["bandwidth_GBps"] = 1.0
    path = edited(tmp_path, clean_records, 3, setting(topology=changed), "bad2.jsonl")
    assert usage_error(cli, "validate", path).startswith(f"{path}:3: topology 'testbed-2x4' differs")


def test_invalid_topology_in_a_record(cli, tmp_path, clean_records):
    broken = json.loads(json.dumps(clean_records[0]["topology"]))
    broken["levels"][1].pop("count")
    path = edited(tmp_path, clean_records, 1, setting(topology=broken))
    message = usage_error(cli, "validate", path)
    assert message.startswith(f"{path}:1: topology: levels[1] (rank): missing field 'count'")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_measurements_file(cli, tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    assert usage_error(cli, "fit", path, "-o", tmp_path / "p.json") == f"{path}: no measurements"
    assert usage_error(cli, "validate", path) == f"{path}: no measurements"


def test_missing_measurements_file(cli, tmp_path):
    path = tmp_path / "nope.jsonl"
    assert usage_error(cli, "validate", path) == f"{path}: no such measurements file"


@pytest.mark.parametrize(
    "fields",
    [{"size_bytes": -1024}, {"size_bytes": 0}, {"median_s": -1.0}, {"median_s": 0}],
)
def test_negative_or_zero_size_or_time(cli, tmp_path, clean_records, fields):
    path = edited(tmp_path, clean_records, 2, setting(**fields))
    assert usage_error(cli, "validate", path) == (
        f"{path}:2: size_bytes must be >= 1 and median_s a positive number"
    )


@pytest.mark.parametrize(
    "fields",
    [{"size_bytes": "lots"}, {"median_s": "fast"}, {"collective": "allsum"}, {"matrix": "2,4"},
     {"axes": [{"name": "dp"}]}],
)
def test_malformed_fields(cli, tmp_path, clean_records, fields):
    path = edited(tmp_path, clean_records, 2, setting(**fields))
    assert usage_error(cli, "validate", path) == (
        f"{path}:2: malformed axes, matrix, collective, size_bytes or median_s"
    )


def test_matrix_that_does_not_fit_the_topology(cli, tmp_path, clean_records):
    path = edited(tmp_path, clean_records, 1, setting(matrix=[[4, 2]]))
    message = usage_error(cli, "validate", path)
    assert message.startswith(f"{path}:1: matrix column 'node' multiplies to 4, expected the level count 2")


def test_record_reducing_an_unknown_axis(cli, tmp_path, clean_records):
    path = edited(tmp_path, clean_records, 2, setting(reduce=["zz"]))
    message = usage_error(cli, "validate", path)
    assert message.startswith(f"{path}:2: ")
    assert "zz" in message


def test_record_with_an_unknown_algorithm(cli, tmp_path, clean_records):
    path = edited(tmp_path, clean_records, 2, setting(algo="bogus"))
    message = usage_error(cli, "validate", path)
    assert message.startswith(f"{path}:2: ")


# ---------------------------------------------------------------- bad profiles


def profile_file(tmp_path: Path, topology_name: str, change=lambda doc: doc) -> Path:
    path = tmp_path / f"{topology_name}.json"
    save_profile(path, NetworkProfile.prior(load_topology(topology_name)))
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return path


def test_profile_for_another_topology_in_validate_and_fit(cli, tmp_path, clean_file):
    path = profile_file(tmp_path, "p2-a100")
    expected = (f"{path} was fitted for topology 'p2-a100' with levels node, gpu, not 'testbed-2x4' with "
                "levels node, rank; fit a profile for this topology")
    assert usage_error(cli, "validate", clean_file, "--profile", path) == expected
    assert usage_error(cli, "fit", clean_file, "-o", tmp_path / "out.json", "--profile", path) == expected
    assert not (tmp_path / "out.json").exists()


def test_profile_for_another_topology_in_the_main_command(cli, tmp_path):
    path = profile_file(tmp_path, "p2-a100")
    base = ("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--no-verify", "--profile", path)
    expected = (f"{path} was fitted for topology 'p2-a100' with levels node, gpu, not 'testbed-2x4' with "
                "levels node, rank; fit a profile for this topology")
    assert usage_error(cli, *base) == expected
    assert usage_error(cli, *base, "--workload", "dp:allreduce:1M") == expected


def test_profile_with_the_same_name_but_other_levels(cli, tmp_path):
    def rename(doc):
        doc["levels"][1]["name"] = "gpu"
        return doc
    path = profile_file(tmp_path, "testbed-2x4", rename)
    message = usage_error(cli, "--topology", "testbed-2x4", "--axes", "dp=8", "--no-verify", "--profile", path)
    assert message.startswith(f"{path} was fitted for topology 'testbed-2x4' with levels node, gpu, not")


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: {**d, "version": 1}, "profile version 1 is not supported; this synth-reduce reads version 2 "
                                        "(re-fit it with synth-reduce fit)"),
        (lambda d: {k: v for k, v in d.items() if k != "version"}, "profile version None is not supported"),
        (lambda d: {**d, "schema": "synth-reduce/plan"},
         'not a synth-reduce profile (expected "schema": "synth-reduce/profile")'),
        (lambda d: [d], 'not a synth-reduce profile (expected "schema": "synth-reduce/profile")'),
        (lambda d: {**d, "levels": [{"name": "node"}]},
         "not a valid profile: expected topology, levels[{name, bandwidth_GBps, latency_us, nccl_latency_us}]"),
        (lambda d: {**d, "efficiency": {"ring.Fast": 1.0}}, "unknown efficiency key(s) ring.Fast"),
        (lambda d: {**d, "efficiency": {"AllReduce": 0}}, "bandwidths and efficiencies must be positive numbers"),
        (lambda d: {**d, "levels": [{**lv, "bandwidth_GBps": -1} for lv in d["levels"]]},
         "bandwidths and efficiencies must be positive numbers"),
        (lambda d: {**d, "call_overhead_us": -1.0}, "latencies and call_overhead_us must be non-negative numbers"),
        (lambda d: {**d, "call_overhead_us": "fast"},
         "not a valid profile: expected topology, levels[{name, bandwidth_GBps, latency_us, nccl_latency_us}]"),
    ],
)
def test_bad_profile_documents(cli, tmp_path, clean_file, change, expected):
    path = profile_file(tmp_path, "testbed-2x4", change)
    assert usage_error(cli, "validate", clean_file, "--profile", path).startswith(f"{path}: {expected}")
    assert usage_error(cli, "--topology", "testbed-2x4", "--axes", "dp=8", "--no-verify",
                       "--profile", path).startswith(f"{path}: {expected}")


def test_profile_file_that_is_not_json_or_missing(cli, tmp_path, clean_file):
    path = tmp_path / "p.json"
    path.write_text("{nope")
    assert usage_error(cli, "validate", clean_file, "--profile", path).startswith(f"{path}: not a valid profile")
    missing = tmp_path / "missing.json"
    assert usage_error(cli, "validate", clean_file, "--profile", missing) == f"{missing}: no such profile file"


def test_fit_output_that_cannot_be_written(cli, tmp_path, clean_file):
    target = tmp_path / "no" / "such" / "dir" / "p.json"
    assert usage_error(cli, "fit", clean_file, "-o", target) == (  # checked before the fit
        f"--output {target}: the folder {target.parent} does not exist; create it or write elsewhere")


def test_fit_requires_an_output(cli, clean_file):
    message = usage_error(cli, "fit", clean_file)
    assert "-o/--output" in message and "synth-reduce fit --help" in message
