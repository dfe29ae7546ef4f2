"""Inputs are bounded (issue 23): numbers of hundreds or thousands of digits,
huge or endless files, enumerations without bound and oversized topologies give
one error line naming the limit, at once; outputs are checked before the work
and written whole (never through a symlink)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import usage_error

import synth.cli.fit
import synth.cli.plan
from synth.documents import MAX_YAML_BYTES, write_text
from synth.errors import SynthError
from synth.planner.modelspec import load_model
from synth.planner.stepmodel import Training
from synth.synthesis.placement import MAX_ASSIGNMENTS, parse_axes
from synth.topology import MAX_DEVICES, load_topology
from synth.units import MAX_COUNT, MAX_REPEATS, MAX_SIZE_BYTES, bounded_int, parse_size

TINY = "layers=4,hidden=256,heads=8,seq=128,vocab=1000"
BASE = ("--topology", "testbed-2x4", "--axes", "dp=8")


@pytest.mark.parametrize("digits", [400, 5000])
def test_numbers_of_many_digits_are_one_error_naming_the_limit(cli, digits):
    big = "9" * digits
    shown = f"99999999... ({digits} digits)"
    assert usage_error(cli, *BASE, "--size", big) == f"--size {shown}: at most {MAX_SIZE_BYTES:,} bytes (1 PiB)"
    assert usage_error(cli, "--topology", "testbed-2x4", "--axes", f"dp={big}") == (
        f"--axes dp={shown}: at most {MAX_COUNT:,}")
    assert usage_error(cli, *BASE, "--scale", f"node={big}") == f"--scale node={shown}: at most {MAX_COUNT:,}"
    assert usage_error(cli, *BASE, "--constrain", f"dp@node={big}") == (
        f"--constrain dp@node={shown}: at most {MAX_COUNT:,}")
    assert f"repetitions {shown}: at most {MAX_REPEATS:,}" in usage_error(
        cli, *BASE, "--workload", f"dp:allreduce:1M*{big}")
    assert usage_error(cli, "--topology", "testbed-2x4", "--axes", f"tp<={big},dp") == (
        f"--axes 'tp<={big[:26]}...': the size {shown}: at most {MAX_COUNT:,}")
    assert usage_error(cli, "plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", big) == (
        f"--global-batch {shown}: at most {MAX_COUNT:,}")
    with pytest.raises(SynthError, match=f"--global-batch {MAX_COUNT + 1}: at most {MAX_COUNT:,} sequences"):
        Training(MAX_COUNT + 1)


def test_bounded_int_and_sizes_at_their_limits():
    assert bounded_int(str(MAX_COUNT), "--x", MAX_COUNT) == MAX_COUNT
    with pytest.raises(SynthError, match=f"--x {MAX_COUNT + 1}: at most {MAX_COUNT:,}"):
        bounded_int(str(MAX_COUNT + 1), "--x", MAX_COUNT)
    with pytest.raises(SynthError, match="--x 0: must be >= 1"):
        bounded_int("000", "--x", 10)
    assert parse_size("1048576GiB") == MAX_SIZE_BYTES  # exactly 1 PiB, computed without floats
    with pytest.raises(SynthError, match="at most"):
        parse_size("1048577GiB")
    assert parse_size("0.5KiB") == 512


def test_a_topology_count_of_many_digits_or_too_many_devices(tmp_path, cli):
    text = load_topology("testbed-2x4").to_dict()
    for count, expected in ((int("7" * 400), f"'count' must be at most {MAX_COUNT:,}, got 77777777... (400 digits)"),
                            (2**17, f"would have {2**19:,} devices (131072 x 4); at most {MAX_DEVICES:,}")):
        doc = json.loads(json.dumps(text))
        doc["levels"][0]["count"] = count
        path = tmp_path / "big.yaml"
        path.write_text(json.dumps(doc))  # JSON is YAML
        assert expected in usage_error(cli, "--topology", path, "--axes", "dp=8")
    path.write_text(json.dumps(text).replace('"count": 2', '"count": ' + "7" * 5000, 1))
    assert "malformed YAML" in usage_error(cli, "--topology", path, "--axes", "dp=8")


def test_131072_nodes_of_8_are_refused_with_the_count(cli):
    message = usage_error(cli, "--topology", "dgx-h100", "--scale", "node=131072", "--axes", "dp=1048576")
    assert message == (f"--scale: topology 'dgx-h100' would have 1,048,576 devices (131072 x 8); at most "
                       f"{MAX_DEVICES:,} are supported")
    assert load_topology("dgx-h100").scaled({"node": 16384}).num_devices == 131072  # the measured scale is allowed


def test_huge_and_endless_input_files(cli, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (MAX_YAML_BYTES // 10 + 1))
    assert usage_error(cli, "--topology", big, "--axes", "dp=8") == (
        f"{big}: larger than {MAX_YAML_BYTES:,} bytes, the most a topology file may hold; is it the right file?")
    if Path("/dev/zero").exists():
        assert "/dev/zero: larger than" in usage_error(cli, "check", "/dev/zero", *BASE)
        assert "/dev/zero: larger than" in usage_error(cli, "verify", "/dev/zero")
    long = tmp_path / "long.txt"
    long.write_text("AllReduce(root, inside)\n" * 20000)
    assert usage_error(cli, "check", long, *BASE) == (
        f"{long}: 20,000 instructions; a program checked here has at most 1,000 (synthesized ones have at most 10)")


def test_axes_without_sizes_are_bounded(cli):
    axes = ",".join(f"a{i}" for i in range(40))
    message = usage_error(cli, "--topology", "testbed-2x4", "--axes", axes)
    assert f"more than {MAX_ASSIGNMENTS:,} assignments of sizes to 40 axes over 8 devices" in message


def test_a_model_whose_heads_do_not_divide_hidden():
    with pytest.raises(SynthError, match=r"model field 'heads' \(6\) must divide hidden \(256\)"):
        load_model("layers=4,hidden=256,heads=6,seq=128,vocab=1000")


def test_a_measurement_whose_median_lies_outside_its_range(cli, tmp_path):
    from test_fit import record, write

    from synth.synthesis.language import parse_program
    from synth.synthesis.placement import enumerate_placements
    from synth.synthesis.semantics import Goal

    topology = load_topology("testbed-2x4")
    placement = enumerate_placements(topology, parse_axes("dp=8"))[0]
    line = record(topology, placement, ("dp",), Goal.ALLREDUCE, parse_program("AllReduce(root, inside)"), "mpi",
                  4096, 1e-3)
    line["min_s"], line["max_s"] = 2e-3, 3e-3
    path = write(tmp_path / "m.jsonl", [line])
    assert "median_s 0.001 lies outside min_s..max_s (0.002..0.003)" in usage_error(
        cli, "fit", path, "-o", tmp_path / "p.json")


def test_outputs_are_checked_before_the_work(cli, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the work ran before the output was checked")

    monkeypatch.setattr(synth.cli.plan, "plan_job", never)
    missing = tmp_path / "missing" / "j.json"
    assert usage_error(cli, "plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "16",
                       "--out", missing) == (
        f"--out {missing}: the folder {missing.parent} does not exist; create it or write elsewhere")
    monkeypatch.setattr(synth.cli.fit, "fit_profile", never)
    monkeypatch.setattr(synth.cli.fit, "load_measurements", never)
    assert usage_error(cli, "fit", tmp_path / "m.jsonl", "-o", missing).startswith(f"--output {missing}:")


def test_writes_replace_a_symlink_and_leave_no_temporary(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("keep me\n")
    link = tmp_path / "out.json"
    os.symlink(target, link)
    write_text(link, "plan", "new\n")
    assert target.read_text() == "keep me\n"  # never written through the link
    assert not link.is_symlink() and link.read_text() == "new\n"
    dangling = tmp_path / "dangling.json"
    os.symlink(tmp_path / "nowhere" / "x", dangling)
    write_text(dangling, "plan", "fresh\n")
    assert dangling.read_text() == "fresh\n" and not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "out.json", "target.txt"]
    with pytest.raises(SynthError, match="cannot write plan"):
        write_text(tmp_path / "nowhere" / "y.json", "plan", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "out.json", "target.txt"]
