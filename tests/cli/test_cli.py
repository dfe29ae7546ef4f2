"""The ``synth-reduce`` command line: good paths (table, JSON, plans, check) and bad
input (exit code 2, one line on stderr naming what is wrong, nothing on stdout)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import usage_error
from processes import limit_s

from synth.cli import main

REPO = Path(__file__).resolve().parents[2]
P2 = ("--topology", "p2-a100", "--axes", "dp=4,mp=16", "--reduce", "dp")

BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"
REQUIRED_2LEVEL = [
    "AllReduce(root, inside)",
    BLUECONNECT,
    "Reduce(node, inside)\nAllReduce(node, master(root))\nBroadcast(node, inside)",
    "AllReduce(node, inside)\nAllReduce(node, parallel(root))",
]


def run_json(*argv) -> dict:
    """In-process run for module-scoped fixtures (capsys is function-scoped)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--json"])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def expected_mesh(counts, matrix) -> np.ndarray:
    """The device mesh, computed independently from docs/model.md's convention: a device id
    is mixed radix over the levels (outer most significant); inside a level the axes'
    digits are in declared order, last fastest; an axis rank is mixed radix over its
    digits per level, outermost most significant."""
    naxes = len(matrix)
    sizes = [math.prod(row) for row in matrix]
    mesh = np.full(sizes, -1)
    for device in range(math.prod(counts)):
        coords, rest = [], device
        for h in reversed(counts):
            coords.append(rest % h)
            rest //= h
        coords.reverse()
        ranks = [0] * naxes
        for lvl, c in enumerate(coords):
            digits = []
            for a in reversed(range(naxes)):
                digits.append(c % matrix[a][lvl])
                c //= matrix[a][lvl]
            digits.reverse()
            for a in range(naxes):
                ranks[a] = ranks[a] * matrix[a][lvl] + digits[a]
        mesh[tuple(ranks)] = device
    return mesh


@pytest.fixture(scope="module")
def p2_json() -> dict:
    """The full, verified JSON document for dp=4,mp=16 on p2-a100, reducing dp."""
    return run_json(*P2)


def placement_by_matrix(doc: dict, matrix) -> dict:
    (found,) = [p for p in doc["placements"] if p["matrix"] == matrix]
    return found


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory, p2_json) -> Path:
    """A plan of BlueConnect on the 2-level placement (dp split over node and gpu)."""
    placement = placement_by_matrix(p2_json, [[2, 2], [2, 8]])
    program = [q["text"] for q in placement["programs"]].index(BLUECONNECT)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*P2, "--no-verify", "--placement", str(placement["index"]),
                     "--program", str(program), "--out", str(path)])
    assert code == 0
    assert out.getvalue().rstrip().endswith(
        f"wrote plan: placement {placement['index']}, program {program} -> {path}"
    )
    return path


def reduction0(doc: dict) -> dict:
    """The first (here: only) reduction of a version-2 plan document."""
    return doc["reductions"][0]


def program0(doc: dict) -> dict:
    """Its first (here: only) program."""
    return doc["reductions"][0]["programs"][0]


FIX = "; re-create the plan with synth-reduce --out"


def tampered(plan_path: Path, tmp_path: Path, change) -> Path:
    doc = json.loads(plan_path.read_text())
    change(doc)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    return path


# ================================================================ good paths


def test_table_ranks_three_placements_by_predicted_time(cli):
    code, out, err = cli(*P2, "--profile", "prior")  # NCCL's constants: the speedup below is theirs
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "topology p2-a100: node x4 > gpu x16 (64 devices); axes dp=4 mp=16; allreduce over dp"
    assert lines[1] == "predicted for 256 MiB per device, NCCL 2.27.7 model, topology's numbers as priors"
    assert lines[2].startswith("3 placement(s), 106 program(s) of at most 5 steps; synthesized in ")
    assert lines[2].endswith("; listed programs verified (numpy reference + z3)")
    rows = [ln for ln in lines if ln[:4].strip().isdigit()]
    # rank, placement #, matrix: inside a node first, across all 4 nodes last
    assert [r.split()[:5] for r in rows] == [
        ["1", "0", "dp:1,4", "/", "mp:4,4"], ["2", "1", "dp:2,2", "/", "mp:2,8"], ["3", "2", "dp:4,1", "/", "mp:1,16"],
    ]
    assert "gpu x4" in rows[0] and "node x2 > gpu x2" in rows[1] and "node x4" in rows[2]
    # hierarchical program wins on the shared NIC (against NCCL's 2-node tree: 1.06x; 1.15x while NCCL's choosing
    # factor tree x .92 counted as a cost), flat all-reduce elsewhere
    assert rows[1].endswith(BLUECONNECT.replace("\n", " ; ")) and "1.06x" in rows[1]
    assert rows[0].endswith("AllReduce(root, inside)") and "1.00x" in rows[0]
    header = next(i for i, ln in enumerate(lines) if ln.startswith("rank   #  matrix"))
    assert set(lines[header + 1]) == {"-"}
    table = lines[header + 2 :]
    assert len(table) == 9 and all(ln.endswith(")") for ln in table)  # 3 programs per placement


def test_top_limits_the_programs_listed(cli):
    for option in ("--top", "--show"):
        code, out, _ = cli(*P2, option, "1", "--no-verify")
        assert code == 0
        rows = [ln for ln in out.splitlines() if ln.endswith(")")]
        assert len(rows) == 3  # one program per placement
        assert "verified" not in out


def test_json_document_shape(p2_json):
    doc = p2_json
    assert doc["reduce"] == ["dp"] and doc["collective"] == "allreduce"
    assert doc["axes"] == [{"name": "dp", "size": 4}, {"name": "mp", "size": 16}]
    assert [(lv["name"], lv["count"]) for lv in doc["topology"]["levels"]] == [("node", 4), ("gpu", 16)]
    assert doc["verified"] is True and doc["max_steps"] == 5 and doc["constraints"] == []
    assert isinstance(doc["placements"], list) and len(doc["placements"]) == 3
    assert [p["index"] for p in doc["placements"]] == [0, 1, 2]
    assert [p["matrix"] for p in doc["placements"]] == [[[1, 4], [4, 4]], [[2, 2], [2, 8]], [[4, 1], [1, 16]]]
    assert [p["num_programs"] for p in doc["placements"]] == [3, 100, 3]
    assert [p["crosses"] for p in doc["placements"]] == [["gpu"], ["node", "gpu"], ["node"]]


def test_json_matrices_are_parallelism_matrices(p2_json):
    counts, sizes = (4, 16), (4, 16)
    for p in p2_json["placements"]:
        m = p["matrix"]
        assert len(m) == 2 and all(len(row) == 2 for row in m)  # axes x levels
        assert tuple(math.prod(row[lvl] for row in m) for lvl in range(2)) == counts
        assert tuple(math.prod(row) for row in m) == sizes


def test_json_mesh_holds_every_device_once_in_the_documented_order(p2_json):
    for p in p2_json["placements"]:
        mesh = np.array(p["mesh"])
        assert mesh.shape == (4, 16)
        assert sorted(mesh.ravel().tolist()) == list(range(64))
        assert mesh.tolist() == expected_mesh((4, 16), p["matrix"]).tolist()


def test_json_programs_and_steps(p2_json):
    for p in p2_json["placements"]:
        assert len(p["programs"]) == p["num_programs"]  # --json lists all
        for prog in p["programs"]:
            lines = prog["text"].split("\n")
            assert prog["num_steps"] == len(prog["steps"]) == len(lines)
            assert prog["verified"]["numpy_elements"] > 0 and prog["verified"]["z3"]
            for line, step in zip(lines, prog["steps"]):
                assert step["instruction"] == line
                assert line.startswith(step["collective"] + "(")
                assert step["collective"] in {"AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast"}
                flat = [d for g in step["groups"] for d in g]
                assert all(isinstance(d, int) and 0 <= d < 64 for d in flat)
                assert len(flat) == len(set(flat))  # a device is in at most one group per step


def test_allreduce_root_inside_groups_are_the_mesh_columns(p2_json):
    for p in p2_json["placements"]:
        mesh = np.array(p["mesh"])
        (prog,) = [q for q in p["programs"] if q["text"] == "AllReduce(root, inside)"]
        (step,) = prog["steps"]
        assert step["collective"] == "AllReduce"
        # reducing dp on a (4, 16) mesh: the group of mp index j is mesh[:, j]
        assert step["groups"] == [mesh[:, j].tolist() for j in range(16)]


def test_two_level_placement_has_the_required_programs(p2_json):
    placement = placement_by_matrix(p2_json, [[2, 2], [2, 8]])
    assert placement["synthesis_hierarchy"] == [{"name": "node", "size": 2}, {"name": "gpu", "size": 2}]
    texts = [q["text"] for q in placement["programs"]]
    for required in REQUIRED_2LEVEL:
        assert required in texts
    times = [q["predicted_s"] for q in placement["programs"]]
    assert times == sorted(times)  # fastest first
    assert texts[0] == BLUECONNECT and placement["best_predicted_s"] == times[0]
    assert placement["default"] == {"text": "AllReduce(root, inside)",
                                    "predicted_s": times[texts.index("AllReduce(root, inside)")]}
    assert len(texts) == len(set(texts))


def test_two_level_program_groups_follow_the_mesh(p2_json):
    placement = placement_by_matrix(p2_json, [[2, 2], [2, 8]])
    mesh = np.array(placement["mesh"])
    # dp rank = 2 * (node digit) + (gpu digit)
    inside = sorted(mesh[[2 * n, 2 * n + 1], j].tolist() for n in range(2) for j in range(16))
    parallel = sorted(mesh[[g, 2 + g], j].tolist() for g in range(2) for j in range(16))
    master = sorted(mesh[[0, 2], j].tolist() for j in range(16))
    expected = {
        "ReduceScatter(node, inside)": inside,
        "AllGather(node, inside)": inside,
        "Reduce(node, inside)": inside,
        "Broadcast(node, inside)": inside,
        "AllReduce(node, inside)": inside,
        "AllReduce(node, parallel(root))": parallel,
        "AllReduce(node, master(root))": master,
    }
    by_text = {q["text"]: q for q in placement["programs"]}
    seen = 0
    for text in REQUIRED_2LEVEL[1:]:
        for step in by_text[text]["steps"]:
            assert sorted(step["groups"]) == expected[step["instruction"]], step["instruction"]
            seen += 1
    assert seen == 8


@pytest.mark.parametrize(
    "constraint, matrices",
    [
        ("dp@node=1", [[[1, 4], [4, 4]]]),
        ("dp@node>=2", [[[2, 2], [2, 8]], [[4, 1], [1, 16]]]),
        ("dp@node==4", [[[4, 1], [1, 16]]]),
        ("mp@node<=2", [[[2, 2], [2, 8]], [[4, 1], [1, 16]]]),
        ("mp@gpu=16", [[[4, 1], [1, 16]]]),
    ],
)
def test_constrain(cli, constraint, matrices):
    code, out, err = cli(*P2, "--constrain", constraint, "--json", "--no-verify")
    assert code == 0, err
    doc = json.loads(out)
    assert [p["matrix"] for p in doc["placements"]] == matrices
    assert doc["constraints"] == [constraint.replace("==", "=")]
    assert doc["verified"] is False and "verified" not in doc["placements"][0]["programs"][0]


def test_constrain_is_repeatable(cli):
    code, out, _ = cli(*P2, "--constrain", "dp@node>=2", "--constrain", "dp@gpu>=2", "--json", "--no-verify")
    assert code == 0
    assert [p["matrix"] for p in json.loads(out)["placements"]] == [[[2, 2], [2, 8]]]


def test_out_then_verify(cli, plan_path, p2_json):
    doc = json.loads(plan_path.read_text())
    assert doc["schema"] == "synth-reduce/plan" and doc["version"] == 2
    assert doc["matrix"] == [[2, 2], [2, 8]] and reduction0(doc)["reduce"] == ["dp"]
    assert doc["mesh"] == placement_by_matrix(p2_json, [[2, 2], [2, 8]])["mesh"]
    assert program0(doc)["text"] == BLUECONNECT
    assert (program0(doc)["min_bytes"], program0(doc)["max_bytes"]) == (0, None)
    code, out, err = cli("verify", plan_path)
    assert code == 0 and err == ""
    assert out.splitlines()[0] == (
        f"{plan_path}: verified allreduce over dp on dp:2,2 / mp:2,8"
    )
    assert "program: " + BLUECONNECT.replace("\n", " ; ") in out
    assert "z3: proved for all inputs" in out


def test_verify_json(cli, plan_path):
    code, out, _ = cli("verify", plan_path, "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["verified"] is True and summary["program"] == BLUECONNECT
    assert summary["collective"] == "allreduce" and summary["reduce"] == ["dp"]
    assert summary["numpy_elements"] > 0 and summary["z3_obligations"] > 0


def test_check_blueconnect_on_a_given_matrix(cli, tmp_path):
    program = tmp_path / "blueconnect.txt"
    program.write_text("# BlueConnect\n" + BLUECONNECT + "\n")
    code, out, err = cli("check", program, *P2, "--matrix", "dp:2,2 / mp:2,8")
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"{program}: " + BLUECONNECT.replace("\n", " ; ")
    assert "dp:2,2 / mp:2,8: valid (numpy: " in out
    assert "not valid" not in out


def test_check_over_all_placements_reports_each(cli, tmp_path):
    program = tmp_path / "blueconnect.txt"
    program.write_text(BLUECONNECT)
    code, out, _ = cli("check", program, *P2, "--json")
    assert code == 0
    rows = json.loads(out)["placements"]
    assert [r["valid"] for r in rows] == [False, True, False]  # needs both node and gpu in the hierarchy
    assert "not in the synthesis hierarchy" in rows[0]["reason"]


def test_check_reads_standard_input(cli, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("ReduceScatter(root, inside); AllGather(root, inside)"))
    code, out, _ = cli("check", "-", *P2)
    assert code == 0
    assert out.count(": valid (numpy: ") == 3


def _verify_every_program(cli, tmp_path, collective, counts):
    """--out each (placement, program) and re-prove it with verify."""
    code, out, _ = cli(*P2, "--collective", collective, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["collective"] == collective
    assert [p["num_programs"] for p in doc["placements"]] == counts
    texts = []
    for p in doc["placements"]:
        for j, prog in enumerate(p["programs"]):
            assert prog["verified"]["numpy_elements"] > 0
            path = tmp_path / f"{collective}-{p['index']}-{j}.json"
            code, _, err = cli(*P2, "--collective", collective, "--no-verify", "--placement", p["index"],
                               "--program", j, "--out", path)
            assert code == 0, err
            code, vout, err = cli("verify", path)
            assert code == 0, err
            assert f"verified {collective} over dp" in vout
            texts.append(prog["text"])
    return texts


def test_reducescatter_programs_all_verify(cli, tmp_path):
    texts = _verify_every_program(cli, tmp_path, "reducescatter", [1, 3, 1])
    assert "ReduceScatter(root, inside)" in texts
    assert "ReduceScatter(node, inside)\nReduceScatter(node, parallel(root))" in texts
    assert all(t.startswith("ReduceScatter") for t in texts)


def test_allgather_programs_all_verify(cli, tmp_path):
    texts = _verify_every_program(cli, tmp_path, "allgather", [1, 5, 1])
    assert "AllGather(root, inside)" in texts
    assert "AllGather(node, inside)\nAllGather(node, parallel(root))" in texts


def test_scale_changes_the_device_count(cli):
    argv = ("--topology", "p2-a100", "--axes", "dp=2,mp=16")
    code, out, _ = cli(*argv, "--scale", "node=2", "--no-verify")
    assert code == 0
    assert out.splitlines()[0] == "topology p2-a100: node x2 > gpu x16 (32 devices); axes dp=2 mp=16; allreduce over dp"
    msg = usage_error(cli, *argv)  # without --scale: 32 axes product vs 64 devices
    assert "multiply to 32" in msg and "64 devices" in msg


def test_scale_in_json(cli):
    code, out, _ = cli("--topology", "rack", "--axes", "dp=2,mp=4", "--scale", "rack=1,node=1",
                       "--json", "--no-verify")
    assert code == 0
    doc = json.loads(out)
    assert [lv["count"] for lv in doc["topology"]["levels"]] == [1, 1, 2, 4]
    for p in doc["placements"]:
        assert sorted(np.array(p["mesh"]).ravel().tolist()) == list(range(8))


def test_default_reduction_axis_is_the_first(cli):
    code, out, _ = cli("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--no-verify")
    assert code == 0
    assert out.splitlines()[0].endswith("axes dp=4 mp=2; allreduce over dp")


def test_version(cli, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("synth-reduce ")


# ================================================================ bad input


def test_malformed_yaml(cli, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: t\nlevels:\n  - name: node\n    count: 4: 5\n")
    msg = usage_error(cli, "--topology", path, "--axes", "dp=4")
    assert msg.startswith(str(path))
    assert "malformed YAML at line 4, column 13" in msg


def test_unknown_key_in_topology(cli, tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("levels:\n  - {name: node, count: 4, bandwidth_GBps: 1, latency_us: 1, colour: red}\n")
    msg = usage_error(cli, "--topology", path, "--axes", "dp=4")
    assert msg == (
        f"{path}: levels[0] (node): unknown key 'colour'; allowed keys are "
        "name, count, bandwidth_GBps, latency_us, ports, fabric, link, nvlinks, nvls, compute_capability, transport, "
        "nic_path, gpus_per_nic, pcie_gen, pcie_width, graph"
    )


def test_unknown_topology(cli):
    msg = usage_error(cli, "--topology", "nosuch", "--axes", "dp=4")
    assert msg.startswith("topology file 'nosuch' not found; give a path or one of: a3-high, a3-mega, abci-a, abci-v, dgx-a100")


def test_inconsistent_axes_states_both_numbers(cli):
    msg = usage_error(cli, "--topology", "p2-a100", "--axes", "dp=4,mp=8")
    assert "multiply to 32 (4 x 8)" in msg
    assert "topology 'p2-a100' has 64 devices (4 x 16)" in msg


@pytest.mark.parametrize(
    "axes, expected",
    [
        ("dp:4", "--axes 'dp:4': expected NAME=SIZE"),  # a bare 'dp' asks to choose sizes (test_sizes.py)
        ("", "--axes: an empty value; give a value or leave the option out"),
        ("dp=0,mp=64", "--axes dp=0: an axis size must be >= 1"),
        ("dp=4,dp=16", "--axes: axis 'dp' is declared twice"),
    ],
)
def test_bad_axes(cli, axes, expected):
    assert expected in usage_error(cli, "--topology", "p2-a100", "--axes", axes)


def test_unknown_reduction_axis(cli):
    msg = usage_error(cli, "--topology", "p2-a100", "--axes", "dp=4,mp=16", "--reduce", "tp")
    assert msg == "--reduce: unknown axis 'tp'; declared axes are dp, mp"


def test_reduction_axis_named_twice(cli):
    msg = usage_error(cli, "--topology", "p2-a100", "--axes", "dp=4,mp=16", "--reduce", "dp,dp")
    assert "--reduce: an axis is named twice" in msg


@pytest.mark.parametrize(
    "constraint, expected",
    [
        ("tp@node=1", "--constrain 'tp@node=1': unknown axis 'tp'; declared axes are dp, mp"),
        ("dp@rack=1", "--constrain 'dp@rack=1': unknown level 'rack'; topology 'p2-a100' has levels node, gpu"),
        ("dp=node", "--constrain 'dp=node': expected AXIS@LEVEL=N"),
        ("dp@node<2", "--constrain 'dp@node<2': expected AXIS@LEVEL=N"),
    ],
)
def test_bad_constraint(cli, constraint, expected):
    assert usage_error(cli, *P2, "--constrain", constraint).startswith(expected)


@pytest.mark.parametrize(
    "constraints, shown",
    [
        (["dp@node=3"], "dp@node=3"),
        (["dp@node=1", "mp@node=1"], "dp@node=1, mp@node=1"),
        (["dp@gpu>=8"], "dp@gpu>=8"),
    ],
)
def test_unsatisfiable_constraints(cli, constraints, shown):
    argv = [x for c in constraints for x in ("--constrain", c)]
    msg = usage_error(cli, *P2, *argv)  # usage_error checks stdout is empty: no empty table
    assert msg == f"no placement satisfies the constraints ({shown}); relax or remove a --constrain"


@pytest.mark.parametrize(
    "scale, expected",
    [
        ("node=0", "--scale node=0: a level count must be >= 1"),
        ("node", "--scale 'node': expected LEVEL=COUNT"),
        ("node=two", "--scale 'node=two': expected LEVEL=COUNT"),
        ("rack=2", "unknown level 'rack'; topology 'p2-a100' has levels node, gpu"),
    ],
)
def test_bad_scale(cli, scale, expected):
    assert expected in usage_error(cli, *P2, "--scale", scale)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--collective", "broadcast"], "argument --collective: invalid choice: 'broadcast'"),
        (["--max-steps", "0"], "--max-steps 0: must be >= 1"),
        (["--max-steps", "x"], "argument --max-steps: invalid int value: 'x'"),
        (["--placement", "7", "--out", "never.json"], "--placement 7: choose 0..2"),
        (["--program", "999", "--out", "never.json"], "--program 999: placement 0 has programs 0..2"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_options(cli, tmp_path, monkeypatch, extra, expected):
    monkeypatch.chdir(tmp_path)
    assert expected in usage_error(cli, *P2, "--no-verify", *extra)
    assert not (tmp_path / "never.json").exists()


def test_missing_required_arguments(cli):
    msg = usage_error(cli)
    assert "the following arguments are required: --topology, --axes" in msg
    assert "see 'synth-reduce --help'" in msg


def test_check_unparsable_program(cli, tmp_path):
    program = tmp_path / "bad.txt"
    program.write_text("ReduceScatter(node, inside)\nAllReduce(node parallel(root))\n")
    msg = usage_error(cli, "check", program, *P2)
    assert msg == f"{program}:2:16: syntax error: unexpected 'parallel'; expected ','"


def test_check_unexpected_character(cli, tmp_path):
    program = tmp_path / "bad.txt"
    program.write_text("AllReduce(root, inside) $\n")
    assert usage_error(cli, "check", program, *P2) == f"{program}:1:25: syntax error: unexpected character '$'"


def test_check_program_that_is_not_an_allreduce(cli, tmp_path):
    program = tmp_path / "rs.txt"
    program.write_text("ReduceScatter(root, inside)\n")
    msg = usage_error(cli, "check", program, *P2)
    assert msg.startswith(f"{program} does not implement allreduce over dp on any of 3 placements; first: ")
    msg = usage_error(cli, "check", program, *P2, "--matrix", "2,2;2,8")
    assert msg.startswith(f"{program} does not implement allreduce over dp on dp:2,2 / mp:2,8: ")
    # ...but it is exactly a reduce-scatter
    code, _, _ = cli("check", program, *P2, "--collective", "reducescatter")
    assert code == 0


def test_check_rejects_allreduce_over_gpu_parallel_root(cli, tmp_path):
    # (gpu, parallel(root)) varies every digit: one group of all 4 members, which
    # hold different chunks after the intra-node reduce-scatter
    program = tmp_path / "p.txt"
    program.write_text("ReduceScatter(node, inside)\nAllReduce(gpu, parallel(root))\nAllGather(node, inside)\n")
    msg = usage_error(cli, "check", program, *P2, "--matrix", "2,2;2,8")
    assert "step 2 AllReduce(gpu, parallel(root)) is invalid" in msg
    assert "members hold different chunks" in msg


def test_check_unknown_level_in_program(cli, tmp_path):
    program = tmp_path / "p.txt"
    program.write_text("AllReduce(rack, inside)\n")
    msg = usage_error(cli, "check", program, *P2, "--matrix", "2,2;2,8")
    assert "level 'rack' is not in the synthesis hierarchy (root, node, gpu)" in msg


def test_check_missing_program_file(cli, tmp_path):
    missing = tmp_path / "nope.txt"
    assert usage_error(cli, "check", missing, *P2) == f"{missing}: cannot read program (No such file or directory)"


@pytest.mark.parametrize(
    "matrix, expected",
    [
        ("3,2;2,8", "matrix column 'node' multiplies to 6, expected the level count 4"),
        ("2,2", "--matrix '2,2': expected one row per axis like 'dp:N,N / mp:N,N' (the axis's split at each level "
                "node, gpu, outermost first); no row for mp"),
        ("a,b;c,d", "; row 'a,b' is not integers separated by ','"),
        ("dp:2,2 / tp:2,8", "; 'tp' is not an axis"),
        ("dp:2,2 / 2,8", "; name every row's axis or none"),
        ("dp:2,2 / dp:2,8", "; axis dp has two rows"),
        ("dp:2,2,1 / mp:2,8", "; row 'dp:2,2,1' has 3 entries for 2 levels"),
    ],
)
def test_check_bad_matrix(cli, tmp_path, matrix, expected):
    program = tmp_path / "p.txt"
    program.write_text("AllReduce(root, inside)\n")
    assert expected in usage_error(cli, "check", program, *P2, "--matrix", matrix)


def test_verify_corrupted_plan(cli, tmp_path, plan_path):
    path = tmp_path / "cut.json"
    path.write_text(plan_path.read_text()[:300])
    msg = usage_error(cli, "verify", path)
    assert msg.startswith(f"{path}: not a valid plan: corrupted JSON (")


def test_verify_missing_plan(cli, tmp_path):
    assert usage_error(cli, "verify", tmp_path / "nope.json") == f"{tmp_path / 'nope.json'}: no such plan file"


def test_verify_not_a_plan(cli, tmp_path):
    path = tmp_path / "other.json"
    path.write_text("[1, 2]")
    assert usage_error(cli, "verify", path) == (
        f'{path}: not a synth-reduce plan (expected "schema": "synth-reduce/plan")'
    )


def test_verify_wrong_version(cli, tmp_path, plan_path):
    path = tampered(plan_path, tmp_path, lambda d: d.update(version=3))
    assert usage_error(cli, "verify", path) == (
        f"{path}: plan version 3 is not supported; this synth-reduce reads version 1 and 2 "
        "(re-create the plan with synth-reduce --out)"
    )


def _swap_first_members(groups):
    groups[0][0], groups[1][0] = groups[1][0], groups[0][0]


def test_verify_tampered_step_groups(cli, tmp_path, plan_path):
    path = tampered(plan_path, tmp_path, lambda d: _swap_first_members(program0(d)["steps"][1]["groups"]))
    assert usage_error(cli, "verify", path) == (
        f"{path}: step 2 (AllReduce(node, parallel(root))) stores groups or chunks that differ "
        "from the lowering of the program on this placement" + FIX
    )


def test_verify_tampered_reduction_groups(cli, tmp_path, plan_path):
    path = tampered(plan_path, tmp_path, lambda d: _swap_first_members(reduction0(d)["reduction_groups"]))
    msg = usage_error(cli, "verify", path)
    assert msg == (f"{path}: reductions[0].reduction_groups differs from the lowering of reductions[0].programs[0]'s "
                   "program on this placement" + FIX)


def test_verify_tampered_chunks(cli, tmp_path, plan_path):
    def change(d):  # the first group's chunks, as one run [0, 4), reversed: 3, 2, 1, 0
        assert program0(d)["steps"][0]["chunks"][0] == [[0, 4]]
        program0(d)["steps"][0]["chunks"][0] = [[3, 4], [2, 3], [1, 2], [0, 1]]

    msg = usage_error(cli, "verify", tampered(plan_path, tmp_path, change))
    assert "step 1 (ReduceScatter(node, inside)) stores groups or chunks that differ" in msg


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: program0(d).pop("text"), "not a valid plan: missing field 'reductions[0].programs[0].text'"),
        (lambda d: d.update(matrix="x"), "not a valid plan: 'matrix' must be a list"),
        (lambda d: reduction0(d).update(collective="foo"),
         "reductions[0].collective: unknown collective 'foo'; use one of allreduce, reducescatter, allgather"),
        (lambda d: program0(d)["steps"].pop(), "reductions[0].programs[0]: 2 steps stored for a 3-instruction "
                                               "program" + FIX),
        (lambda d: program0(d).update(text="AllReduce(root inside)"),
         "reductions[0].programs[0].text:1:16: syntax error"),
    ],
    ids=["no-text", "matrix-type", "collective", "steps", "text-syntax"],
)
def test_verify_invalid_plan_fields(cli, tmp_path, plan_path, change, expected):
    path = tampered(plan_path, tmp_path, change)
    msg = usage_error(cli, "verify", path)
    assert msg.startswith(f"{path}: ") and expected in msg


# ================================================================ subprocess


def test_subprocess_exit_code_2_without_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "synth.cli", "--topology", "p2-a100", "--axes", "dp=4,mp=8"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=limit_s(120),
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("synth-reduce: error: --axes: the axis sizes multiply to 32")
    assert proc.stderr.count("\n") == 1


# ================================================================ fixed bugs (regressions)


def test_out_to_unwritable_path_is_a_clean_error(cli, tmp_path):
    target = tmp_path / "missing-dir" / "plan.json"
    assert str(target) in usage_error(cli, *P2, "--no-verify", "--out", target)


def test_verify_directory_is_a_clean_error(cli, tmp_path):
    assert str(tmp_path) in usage_error(cli, "verify", tmp_path)


def test_verify_detects_tampered_mesh(cli, tmp_path, plan_path):
    path = tampered(plan_path, tmp_path, lambda d: d["mesh"][0].reverse())
    assert "mesh" in usage_error(cli, "verify", path)


def test_verify_changed_matrix_names_the_file(cli, tmp_path, plan_path):
    path = tampered(plan_path, tmp_path, lambda d: d.update(matrix=[[4, 1], [1, 16]]))
    assert usage_error(cli, "verify", path).startswith(f"{path}: ")


def test_empty_reduce_list_is_an_error(cli):
    assert "--reduce" in usage_error(cli, *P2[:4], "--reduce", ",", "--no-verify")


def test_negative_top_is_an_error(cli):
    assert "--top -1: must be >= 0" in usage_error(cli, *P2, "--show", "-1", "--no-verify")


def test_json_output_is_the_standard_encoders_text():
    """--json prints through a faster encoder (synth.cli.solve.dumps): the
    same text as json.dumps(doc, indent=1), on a whole solution document and
    on the corner cases it formats itself."""
    from synth.api import solve
    from synth.cli.solve import dumps, solution_document

    doc = solution_document(solve("testbed-2x4", {"dp": 4, "mp": 2}, reduce="dp", verify=True))
    assert dumps(doc) == json.dumps(doc, indent=1)
    corners = {"empty": [], "nested": [[], {}, [1, [2, 3]], {"a": None}], "mixed": [1, 2.5, True, "x"],
               "text": "d\u00e9j\u00e0 \"q\" \\ \n", "floats": [0.1, 1e-300, 1e300, -0.0, 3.0],
               "bools": [True, False, None], 7: "int key", "nan": float("nan"), "inf": [float("inf"), -float("inf")]}
    assert dumps(corners) == json.dumps(corners, indent=1)
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"x": object()})
