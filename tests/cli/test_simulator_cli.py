"""The main command's simulator options: ``--size``, ``--algo``, ``--profile``,
``--top`` and the predicted fields of the table and ``--json``; hand-derived
times on p2-a100 (dp=4, mp=16, reducing dp) check that each option takes effect."""

from __future__ import annotations

import json
import math

import pytest
from helpers import usage_error

from synth.cost import NetworkProfile, save_profile
from synth.errors import SynthError
from synth.topology import load_topology
from synth.units import format_seconds, format_size, parse_size

# --profile prior: the hand derivations below use the topology's numbers and NCCL's constants (the default, the
# shipped calibration, is tests/cost/test_calibration.py's)
P2 = ("--topology", "p2-a100", "--axes", "dp=4,mp=16", "--reduce", "dp", "--no-verify", "--profile", "prior")
INSIDE, SPLIT, ACROSS = [[1, 4], [4, 4]], [[2, 2], [2, 8]], [[4, 1], [1, 16]]
US = 1e-6
S = 256 * 2**20
BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"


def run_json(cli, *argv) -> dict:
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def by_matrix(doc: dict, matrix) -> dict:
    (found,) = [p for p in doc["placements"] if p["matrix"] == matrix]
    return found


# NCCL 2.27.7 on 4 A100s of a p2-a100 node (270 GB/s per GPU as NCCL sees it, ring graph
# 18 channels x 15 GB/s): ring LL (min(87.7, 270/2) x 4/6 GB/s, 6.6 + 6 x 0.6 us) until
# 1.37 MB, LL128 (248.4 x 4/6, 14 + 6 x 1.9) until 7.04 MB, then Simple (180, 8.4 + 6 x 3.4)
# (tests/cost/test_nccl.py checks such choices by hand). The time model: 6 rounds of S/4 at
# 270 GB/s x the protocol's payload (LL .5, LL128 120/128, Simple 1), plus those latencies.
PROTOCOLS = {"LL": (0.5, 6.6 + 6 * 0.6), "LL128": (120 / 128, 14.0 + 6 * 1.9), "Simple": (1.0, 8.4 + 6 * 3.4)}


# bytes per channel before a call gets another (enqueue.cc: threads x bytes per thread; the ring's LL x 4 ranks)
PER_CHANNEL = {"LL": 512 * 8 * 4, "LL128": 640 * 8, "Simple": 512 * 64}


def ring_inside(size: float, bw: float = 270e9) -> float:
    """Ring AllReduce of 4 GPUs inside a p2-a100 node (NCCL's protocol for the
    size), on the channels NCCL gives the call: floor(size / PER_CHANNEL) of the
    communicator's 36 (twice the graph's 18), at least one."""
    proto = "LL" if size < 1.374e6 else "LL128" if size < 7.04e6 else "Simple"
    eff, latency_us = PROTOCOLS[proto]
    channels = min(36, max(1, int(size // PER_CHANNEL[proto])))
    return 6 * size / 4 / (bw * eff * channels / 36) + latency_us * US


# ================================================================ --size


@pytest.mark.parametrize(
    "text, nbytes",
    [("1K", 2**10), ("1M", 2**20), ("1G", 2**30), ("1KiB", 2**10), ("1MiB", 2**20), ("1GiB", 2**30),
     ("1KB", 10**3), ("1MB", 10**6), ("1GB", 10**9), ("4096", 4096), ("256mib", 256 * 2**20),
     ("1.5K", 1536), ("64 KiB", 65536), ("7B", 7)],
)
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(
    "text, problem",
    [("-1", "expected a positive size"), ("abc", "expected a positive size"), ("", "expected a positive size"),
     ("1TB", "expected a positive size"), ("1e6", "expected a positive size"), ("M", "expected a positive size"),
     ("0", "the size must be a whole number of bytes >= 1"), ("0.5", "the size must be a whole number of bytes >= 1"),
     ("1.3", "the size must be a whole number of bytes >= 1"), ("0K", "the size must be a whole number of bytes >= 1")],
)
def test_parse_size_errors(text, problem):
    with pytest.raises(SynthError) as exc:
        parse_size(text)
    assert str(exc.value).startswith(f"--size '{text}': {problem}")


def test_format_units():
    assert format_size(2**30) == "1 GiB" and format_size(1536) == "1.5 KiB" and format_size(1000) == "1000 B"
    assert format_seconds(1.5) == "1.500 s" and format_seconds(0.0015) == "1.500 ms"
    assert format_seconds(2e-6) == "2.0 us"


def test_format_size_in_a_chosen_unit_and_places():
    """Memory amounts (planner, bench, the plan table) in a fixed unit or
    with fixed places, and the short form of narrow columns."""
    assert format_size(3 * 2**29, "GiB", 1) == "1.5 GiB" and format_size(2**29, "GiB", 1) == "0.5 GiB"
    assert format_size(62 * 2**30, places=1, short=True) == "62.0G"
    assert format_size(2**29, places=1, short=True) == "512.0M" and format_size(0) == "0 B"
    with pytest.raises(ValueError, match="unit 'GB'"):
        format_size(1, "GB")


@pytest.mark.parametrize("text, nbytes", [("1K", 1024), ("1KB", 1000), ("1M", 2**20), ("1MB", 10**6),
                                          ("1GiB", 2**30), ("1GB", 10**9)])
def test_size_option_sets_the_predicted_size(cli, text, nbytes):
    doc = run_json(cli, *P2, "--size", text, "--top", "0")  # NCCL's choice inside a node: the ring
    assert doc["model"]["size_bytes"] == nbytes
    assert math.isclose(by_matrix(doc, INSIDE)["default"]["predicted_s"], ring_inside(nbytes), rel_tol=1e-9)


def test_default_size_is_256MiB(cli):
    doc = run_json(cli, *P2, "--top", "0")
    assert doc["model"] == {"size_bytes": S, "algo": "nccl", "profile": None}
    code, out, _ = cli(*P2, "--size", "1K", "--top", "1")
    assert out.splitlines()[1] == "predicted for 1 KiB per device, NCCL 2.27.7 model, topology's numbers as priors"


@pytest.mark.parametrize(
    "argv, message",
    [(("--size", "-1"), "--size '-1': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"),
     (("--size=-1",), "--size '-1': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"),
     (("--size", "abc"), "--size 'abc': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"),
     (("--size", "0"), "--size '0': the size must be a whole number of bytes >= 1"),
     (("--size", "0.1K"), "--size '0.1K': the size must be a whole number of bytes >= 1")],
)
def test_bad_size(cli, argv, message):
    assert usage_error(cli, *P2, *argv) == message
    assert usage_error(cli, *P2, *argv, "--json") == message


# ================================================================ --algo


def test_algo_changes_predictions(cli):
    docs = [run_json(cli, *P2, "--top", "0", "--size", "64K", *(("--algo", a) if a else ()))
            for a in (None, "ring", "tree", "mpi")]
    assert [d["model"]["algo"] for d in docs] == ["nccl", "ring", "tree", "mpi"]
    size = 65536
    nccl, ring, tree, mpi = [by_matrix(d, INSIDE)["default"]["predicted_s"] for d in docs]
    assert math.isclose(ring, ring_inside(size), rel_tol=1e-9)
    assert nccl == ring  # NCCL picks the ring inside the node (its tree LL costs 10.4 us against 10.2)
    # forced tree: NCCL's tuning picks LL at 64 KiB (tree LL 13.7 us against LL128 22.5, Simple 32.4+);
    # inside a node a chain 3 -> 2 -> 1 -> 0 carrying S up and down at once: the middle GPUs
    # send both on one port, 135 GB/s each; LL's payload .5 (NCCL's .92 / 3.8 only choose); on 16 of the 36
    # channels (65536 bytes / (512 threads x 8 bytes): the tree's LL threshold has no x ranks); 2 x 3 chain steps
    assert math.isclose(tree, size / 135e9 / 0.5 * 36 / 16 + (6.8 + 6 * 0.6) * US, rel_tol=1e-9)
    # mpi at 64 KiB: Rabenseifner, halves then quarters, mirrored
    assert math.isclose(mpi, 2 * (1 * US + size / 2 / 270e9) + 2 * (1 * US + size / 4 / 270e9), rel_tol=1e-9)
    across = [by_matrix(d, ACROSS)["default"]["predicted_s"] for d in docs]
    assert len(set(across[1:])) == 3


def test_algo_names_the_model_in_the_table(cli):
    for algo, words in (("nccl", "NCCL 2.27.7 model"), ("ring", "NCCL 2.27.7 forced ring model"),
                        ("tree", "NCCL 2.27.7 forced tree model"), ("mpi", "MPI (OpenMPI tuned defaults) model")):
        code, out, _ = cli(*P2, "--top", "1", "--algo", algo)
        assert code == 0 and out.splitlines()[1] == f"predicted for 256 MiB per device, {words}, topology's numbers as priors"


def test_unknown_algo(cli):
    message = usage_error(cli, *P2, "--algo", "bogus")
    assert "--algo" in message and "invalid choice" in message and "bogus" in message


# ================================================================ --profile


@pytest.fixture
def fast_gpu_profile(tmp_path):
    p2 = load_topology("p2-a100")
    path = tmp_path / "fast.json"
    save_profile(path, NetworkProfile(p2.name, p2.level_names, (8.0, 540.0), (5.0, 0.5)))
    return path


def test_profile_changes_predictions(cli, fast_gpu_profile):
    doc = run_json(cli, *P2, "--top", "0", "--profile", fast_gpu_profile)
    assert doc["model"]["profile"] == str(fast_gpu_profile)
    # the ring of 4 GPUs, Simple: 6 NVLink steps at the profile's 0.5 us
    assert math.isclose(by_matrix(doc, INSIDE)["default"]["predicted_s"],
                        6 * S / 4 / 540e9 + (8.4 + 6 * 0.5) * US, rel_tol=1e-9)
    # across nodes the NIC still decides: 16 GPUs share 8 GB/s; the ring of 4 nodes:
    # 6 network steps at the profile's 5 us (it gives no per-protocol latencies)
    assert math.isclose(by_matrix(doc, ACROSS)["default"]["predicted_s"],
                        6 * S / 4 / 0.5e9 + (8.4 + 6 * 5.0) * US, rel_tol=1e-9)
    code, out, _ = cli(*P2, "--top", "1", "--profile", fast_gpu_profile)
    assert out.splitlines()[1] == f"predicted for 256 MiB per device, NCCL 2.27.7 model, profile {fast_gpu_profile}"


@pytest.mark.parametrize("name, scale", [("testbed-2x4", "node=4"), ("p2-a100", "node=2")])
def test_a_profile_is_refused_on_a_scaled_topology(cli, tmp_path, name, scale):
    # issue 12, item 14: a profile belongs to the whole level structure, counts included
    topology = load_topology(name)
    path = tmp_path / "fitted.json"
    save_profile(path, NetworkProfile.prior(topology))
    axes = "dp=16" if name == "testbed-2x4" else "dp=4,mp=8"
    message = usage_error(cli, "--topology", name, "--scale", scale, "--axes", axes, "--no-verify",
                          "--profile", path)
    scaled = topology.scaled({scale.split("=")[0]: int(scale.split("=")[1])})
    assert message == (f"{path} was fitted for '{name}' as {topology.describe_structure()}, not as "
                       f"{scaled.describe_structure()}; fit a profile for this shape of the topology "
                       f"(a --scale or an edited level changes it)")
    assert "x4" in message.split(" not as ")[1] or "x2" in message.split(" not as ")[1]


# ================================================================ JSON and table


# dp over 2 nodes x 2 GPUs (SPLIT), 256 MiB, NCCL's choices (tests/cost/test_cost.py computes them):
# BlueConnect = ring RS and AG of 2 GPUs inside the node (S/2 at 270 GB/s, 8.4 + 3.4 us each) and a
# ring AR of 2 nodes on S/2 (2 rounds of S/4, 16 GPUs on one 8 GB/s NIC: 0.5 GB/s; 8.4 + 2 x 14 us);
# the default all-reduce is NCCL's 2-node tree, LL128 (S/2 per NIC flow, 16 flows: 0.5 GB/s,
# LL128's payload 120/128; 14 + 2 x 1.9 + 2 x 4 us)
BLUECONNECT_S = 2 * (S / 2 / 270e9 + 11.8 * US) + 2 * S / 4 / 0.5e9 + 36.4 * US
SPLIT_DEFAULT_S = (S / 2) / 0.5e9 / (120 / 128) + 25.8 * US
INSIDE_DEFAULT_S = 1.5 * S / 270e9 + (8.4 + 6 * 3.4) * US  # ring of 4 GPUs, Simple
ACROSS_DEFAULT_S = 6 * S / 4 / 0.5e9 + (8.4 + 6 * 14.0) * US  # ring of 4 nodes, 16 groups per NIC, Simple


@pytest.fixture(scope="module")
def full_doc():
    import contextlib
    import io

    from synth.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*P2, "--json"]) == 0
    return json.loads(out.getvalue())


def test_json_predicted_fields(full_doc):
    placements = full_doc["placements"]
    assert [p["rank"] for p in placements] == list(range(len(placements)))
    bests = [p["best_predicted_s"] for p in placements]
    assert bests == sorted(bests)
    assert [p["matrix"] for p in placements] == [INSIDE, SPLIT, ACROSS]
    for p in placements:
        times = [q["predicted_s"] for q in p["programs"]]
        assert len(times) == p["num_programs"] > 0  # --json lists every program
        assert times == sorted(times)
        assert p["best_predicted_s"] == times[0]
        texts = [q["text"] for q in p["programs"]]
        assert p["default"]["text"] == "AllReduce(root, inside)"
        assert p["default"]["predicted_s"] == times[texts.index("AllReduce(root, inside)")]
        assert p["predicted_speedup"] == pytest.approx(p["default"]["predicted_s"] / p["best_predicted_s"], rel=1e-12)
        assert "verified" not in p["programs"][0]  # --no-verify
    split = by_matrix(full_doc, SPLIT)
    assert split["programs"][0]["text"] == BLUECONNECT
    assert split["best_predicted_s"] == pytest.approx(BLUECONNECT_S, rel=1e-9)
    assert split["default"]["predicted_s"] == pytest.approx(SPLIT_DEFAULT_S, rel=1e-9)


@pytest.mark.parametrize("top", [0, 1, 2])
def test_top_limits_programs_but_the_default_is_always_predicted(cli, full_doc, top):
    doc = run_json(cli, *P2, "--top", str(top))
    for p, full in zip(doc["placements"], full_doc["placements"]):
        assert p["matrix"] == full["matrix"]
        assert p["programs"] == full["programs"][:top]
        assert p["num_programs"] == full["num_programs"]
        assert p["default"] == full["default"]
        assert p["best_predicted_s"] == full["best_predicted_s"]


def test_bad_top(cli):
    assert usage_error(cli, *P2, "--top", "-1") == "--top -1: must be >= 0"


def test_table_shows_default_best_and_speedup(cli):
    code, out, err = cli(*P2)
    assert code == 0 and err == ""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank"))
    assert lines[header].split()[:9] == ["rank", "#", "matrix", "reduction", "crosses", "progs", "default", "best",
                                         "speedup"]
    rows = [line for line in lines[header + 2:] if line[:4].strip()]
    assert len(rows) == 3
    assert len(lines) == header + 2 + 3 * 3  # three programs per placement by default
    split = rows[1].split()
    assert split[:3] == ["2", "1", "dp:2,2"]
    # the default, NCCL's 2-node tree; best BlueConnect; speedup their ratio
    assert f" {SPLIT_DEFAULT_S * 1e3:.3f} ms  {BLUECONNECT_S * 1e3:.3f} ms   " \
           f"{SPLIT_DEFAULT_S / BLUECONNECT_S:.2f}x  ReduceScatter(node, inside) ; AllReduce(node, parallel(root))" in rows[1]
    assert " 286.357 ms  269.490 ms   1.06x  " in rows[1]
    assert f" {INSIDE_DEFAULT_S * 1e3:.3f} ms    {INSIDE_DEFAULT_S * 1e3:.3f} ms   1.00x  AllReduce(root, inside)" in rows[0]
    assert f" {ACROSS_DEFAULT_S * 1e3:.3f} ms  {ACROSS_DEFAULT_S * 1e3:.3f} ms   1.00x  AllReduce(root, inside)" in rows[2]


def test_out_records_the_predicted_time(cli, tmp_path):
    path = tmp_path / "plan.json"
    argv = ("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--no-verify", "--size", "1M")
    doc = run_json(cli, *argv)
    code, out, err = cli(*argv, "--out", path)
    assert code == 0, err
    plan = json.loads(path.read_text())
    best = doc["placements"][0]
    program = plan["reductions"][0]["programs"][0]
    assert program["predicted_s"] == best["best_predicted_s"] == best["programs"][0]["predicted_s"]
    assert program["predicted_for_bytes"] == 2**20
