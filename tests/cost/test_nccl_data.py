"""Checks of the NCCL calibration corpus in data/nccl/*.jsonl.

Every line is one measurement transcribed from a public source; see
data/nccl/README.md. Besides the schema, the test re-derives algbw from
size/time and busbw from algbw with nccl-tests' factor for the collective and
rank count: a line whose printed numbers disagree beyond the printing precision
of the source is a transcription error (fix the line, not the tolerance).
"""

import glob
import json
import os
from collections import defaultdict

import pytest

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "nccl")
FILES = sorted(glob.glob(os.path.join(DATA, "*.jsonl")))

COLLECTIVES = {"allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "sendrecv"}
ALGOS = {"Ring", "Tree", "NVLS", "NVLSTree", "CollnetDirect", "CollnetChain", "PAT"}
PROTOS = {"LL", "LL128", "Simple"}

NUMBER = (int, float)
OPT_NUMBER = (int, float, type(None))
OPT_STR = (str, type(None))
OPT_INT = (int, type(None))

FIELDS = {
    "source": str,
    "set": str,
    "system": dict,
    "nccl_version": OPT_STR,
    "collective": str,
    "algo": OPT_STR,
    "proto": OPT_STR,
    "algo_reported": OPT_STR,
    "size_bytes": int,
    "count": OPT_INT,
    "dtype": OPT_STR,
    "redop": OPT_STR,
    "time_us": OPT_NUMBER,
    "algbw_GBps": OPT_NUMBER,
    "busbw_GBps": OPT_NUMBER,
    "in_place": (bool, type(None)),
    "ranks": int,
    "env": dict,
    "tool": str,
}
OPTIONAL_FIELDS = {"note": str}

SYSTEM_FIELDS = {
    "gpu": str,
    "gpus_per_node": int,
    "nodes": int,
    "nics_per_node": OPT_INT,
    "nic_Gbps": OPT_NUMBER,
    "nic_type": OPT_STR,
    "nvlink": OPT_STR,
    "nvswitch": (bool, type(None)),
    "nvls": (bool, type(None)),
    "cloud": OPT_STR,
    "notes": str,
}

# Printing precision. nccl-tests prints algbw and busbw with 2 decimals, so a
# printed bandwidth is within half a unit (0.005 GB/s) of the value it computed;
# the other sources' tables print 2 decimals as well. The time is printed with
# 0, 1 or 2 decimals depending on its magnitude and the nccl-tests version
# (e.g. "66132", "1334.9", "93.12"), so its half unit is taken from the number
# itself (an integer: 0.5 us; one decimal: 0.05 us; ...). A number stored as
# 1540.0 for a printed "1540.20" only makes the bound looser, never tighter.
# These bounds are exact, plus floating point slack: a relative tolerance of
# 1% would let a swapped digit in a 3-digit busbw or a 5-digit time pass.
HALF_UNIT = 0.005
SLACK = 1e-6


def half_ulp(x):
    """Half a unit in the last printed place of a number read from JSON."""
    if isinstance(x, int):
        return 0.5
    text = repr(x)
    if "e" in text or "E" in text:  # not produced by any source here
        return abs(x) * 1e-3
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** (-decimals)


def time_rel_error(t):
    """Largest relative error of 1/t given t's printing precision."""
    h = half_ulp(t)
    return h / (t - h)


def busbw_factor(collective, n):
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("reducescatter", "allgather", "alltoall"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, sendrecv


def load():
    lines = []
    for path in FILES:
        with open(path) as fh:
            for i, raw in enumerate(fh, 1):
                if raw.strip():
                    lines.append((os.path.basename(path), i, raw))
    return lines


LINES = load()


def records():
    return [(f, i, json.loads(raw)) for f, i, raw in LINES]


def test_files_exist():
    assert FILES, "no data/nccl/*.jsonl files"


def test_every_line_parses():
    for f, i, raw in LINES:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:  # pragma: no cover - failure path
            pytest.fail(f"{f}:{i}: not JSON: {e}")
        assert isinstance(obj, dict), f"{f}:{i}: not an object"


def _check_type(where, key, value, typ):
    # bool is a subclass of int: do not let True pass as a number or a count
    if isinstance(value, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        pytest.fail(f"{where}: {key} is a bool")
    assert isinstance(value, typ), f"{where}: {key}={value!r} is not {typ}"


def test_fields_and_types():
    for f, i, d in records():
        where = f"{f}:{i}"
        for key, typ in FIELDS.items():
            assert key in d, f"{where}: missing {key}"
            _check_type(where, key, d[key], typ)
        extra = set(d) - set(FIELDS) - set(OPTIONAL_FIELDS)
        assert not extra, f"{where}: unknown fields {extra}"
        for key, typ in OPTIONAL_FIELDS.items():
            if key in d:
                _check_type(where, key, d[key], typ)
        sysd = d["system"]
        for key, typ in SYSTEM_FIELDS.items():
            assert key in sysd, f"{where}: system missing {key}"
            _check_type(where, "system." + key, sysd[key], typ)
        assert not set(sysd) - set(SYSTEM_FIELDS), f"{where}: unknown system fields"
        for k, v in d["env"].items():
            assert isinstance(k, str) and k.startswith("NCCL_") and isinstance(v, str), f"{where}: env {k}={v!r}"


def test_values():
    for f, i, d in records():
        where = f"{f}:{i}"
        assert d["collective"] in COLLECTIVES, where
        assert d["algo"] is None or d["algo"] in ALGOS, where
        assert d["proto"] is None or d["proto"] in PROTOS, where
        assert d["size_bytes"] > 0, where
        assert d["count"] is None or d["count"] > 0, where
        s = d["system"]
        assert s["gpus_per_node"] >= 1 and s["nodes"] >= 1, where
        assert s["nics_per_node"] is None or s["nics_per_node"] >= 1, where
        assert s["nic_Gbps"] is None or s["nic_Gbps"] > 0, where
        assert 2 <= d["ranks"] <= s["nodes"] * s["gpus_per_node"], f"{where}: ranks vs system"
        if d["ranks"] != s["nodes"] * s["gpus_per_node"]:
            assert "note" in d, f"{where}: a run on part of the system must say so in 'note'"
        given = [d[k] for k in ("time_us", "algbw_GBps", "busbw_GBps") if d[k] is not None]
        assert given, f"{where}: no measurement"
        for k in ("time_us", "algbw_GBps", "busbw_GBps"):
            assert d[k] is None or d[k] >= 0, where
        assert d["time_us"] is None or d["time_us"] > 0, where
        assert d["source"].strip() and d["set"].strip(), where


def test_set_ids_consistent():
    by_set = defaultdict(set)
    files_of = defaultdict(set)
    for f, i, d in records():
        by_set[d["set"]].add(d["source"])
        files_of[d["set"]].add(f)
    for set_id, sources in by_set.items():
        assert len(sources) == 1, f"set {set_id} has several sources: {sources}"
        assert files_of[set_id] == {set_id + ".jsonl"}, f"set {set_id} spread over {files_of[set_id]}"
    # one file per set, named after it
    for path in FILES:
        assert os.path.basename(path)[: -len(".jsonl")] in by_set


def test_at_least_ten_sets():
    sets = {d["set"] for _, _, d in records()}
    assert len(sets) >= 10, sorted(sets)


def test_no_duplicate_lines():
    seen = {}
    for f, i, d in records():
        key = json.dumps({k: v for k, v in d.items() if k not in ("time_us", "algbw_GBps", "busbw_GBps", "note")},
                         sort_keys=True)
        assert key not in seen, f"{f}:{i} duplicates {seen[key]}"
        seen[key] = f"{f}:{i}"


def test_algbw_matches_size_over_time():
    checked = 0
    for f, i, d in records():
        t, a = d["time_us"], d["algbw_GBps"]
        if t is None or a is None:
            continue
        exact = d["size_bytes"] / t / 1e3  # GB/s, GB = 1e9 bytes
        tol = HALF_UNIT + exact * time_rel_error(t) + SLACK
        assert abs(a - exact) <= tol, (
            f"{f}:{i}: algbw {a} but size/time = {exact:.4f} (size {d['size_bytes']}, time {t})")
        checked += 1
    assert checked > 100


def test_busbw_matches_nccl_tests_factor():
    checked = 0
    for f, i, d in records():
        a, b = d["algbw_GBps"], d["busbw_GBps"]
        if a is None or b is None:
            continue
        fac = busbw_factor(d["collective"], d["ranks"])
        if d["time_us"] is not None:
            exact = d["size_bytes"] / d["time_us"] / 1e3 * fac
            tol = HALF_UNIT + exact * time_rel_error(d["time_us"]) + SLACK
        else:
            exact = a * fac  # printed algbw is itself rounded to half a unit
            tol = HALF_UNIT * (1 + fac) + SLACK
        assert abs(b - exact) <= tol, (
            f"{f}:{i}: busbw {b} but the {d['collective']} factor for {d['ranks']} ranks gives {exact:.4f}")
        checked += 1
    assert checked > 100


def test_rank_count_matches_count_column():
    """nccl-tests' count column is per rank for all-gather, reduce-scatter and
    all-to-all (size = count * ranks * type size) and the whole buffer otherwise."""
    width = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "uint8": 1, "int8": 1}
    for f, i, d in records():
        if d["count"] is None or d["dtype"] not in width:
            continue
        per = d["ranks"] if d["collective"] in ("allgather", "reducescatter", "alltoall") else 1
        assert d["count"] * width[d["dtype"]] * per == d["size_bytes"], f"{f}:{i}: count/size/ranks disagree"
