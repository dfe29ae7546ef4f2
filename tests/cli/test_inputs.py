"""Input paths and values that are not what a command reads: each is one
error line (exit 2) that says what the path or value is and names the limit
or the fix, at once and in bounded memory. Special files are made in a
temporary folder (a FIFO), never touched in the real /dev."""

from __future__ import annotations

import os

import pytest

from helpers import usage_error

AXES = ("--axes", "dp=8")
WANTED = "give a topology YAML file (a path or a shipped name)"


def test_a_topology_that_is_not_a_file_says_what_it_is(cli, tmp_path):
    fifo = tmp_path / "topo"
    os.mkfifo(fifo)
    assert usage_error(cli, "--topology", fifo, *AXES) == f"topology '{fifo}' is a FIFO, not a file; {WANTED}"
    assert usage_error(cli, "--topology", tmp_path, *AXES) == f"topology '{tmp_path}' is a folder, not a file; {WANTED}"
    assert usage_error(cli, "--topology", "-", *AXES) == (
        f"topology '-': standard input is not read here; {WANTED}")


def test_a_plan_that_is_xml_empty_or_a_folder_says_so(cli, tmp_path):
    xml = tmp_path / "algo.XML"
    xml.write_text('<algo name="x" nchunksperloop="1" nchannels="1">\n</algo>\n')
    assert usage_error(cli, "verify", xml) == (
        f"{xml}: not a valid plan: it is XML (an MSCCL algorithm?), not JSON; give the plan's JSON file")
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    assert usage_error(cli, "verify", empty) == f"{empty}: not a valid plan: it is empty"
    assert usage_error(cli, "verify", tmp_path) == f"{tmp_path}: is a folder, not a plan file; give the plan's JSON file"


TINY = "layers=4,hidden=256,heads=8,seq=128,vocab=1000"
PLAN = ("plan", "--topology", "dgx-a100", "--global-batch", "8", "--model")


@pytest.mark.parametrize("field, limit", [("layers", 10_000), ("hidden", 2**20), ("vocab", 2**24), ("seq", 2**24)])
def test_model_sizes_are_bounded_in_files_and_inline(cli, tmp_path, field, limit):
    from synth.planner.modelspec import MODEL_LIMITS

    assert MODEL_LIMITS[field] == limit
    fields = dict(item.split("=") for item in TINY.split(","))
    fields[field] = str(limit + 1)
    inline = ",".join(f"{k}={v}" for k, v in fields.items())
    assert usage_error(cli, *PLAN, inline) == f"--model {field}={limit + 1}: at most {limit:,}"
    path = tmp_path / "m.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    assert usage_error(cli, *PLAN, path) == (
        f"{path}: model field '{field}' is {limit + 1}; at most {limit:,} (far above any model trained today)")


def test_a_moe_field_is_bounded(cli):
    assert usage_error(cli, *PLAN, TINY + ",experts=70000,top_k=2,expert_ffn=512") == (
        "--model experts=70000: at most 65,536")


@pytest.mark.parametrize("value, message", [
    ("²", "--model layers=²: must be an integer >= 1"),
    ("9" * 5000, "--model layers=99999999... (5000 digits): at most 10,000"),
])
def test_inline_model_numbers_that_int_cannot_read_are_one_line(cli, value, message):
    assert usage_error(cli, *PLAN, TINY.replace("layers=4", f"layers={value}")) == message


@pytest.mark.parametrize("item", ["lay ers=4", "layers =4", "layers= 4"])
def test_inline_model_keys_with_spaces_are_refused(cli, item):
    assert usage_error(cli, *PLAN, TINY.replace("layers=4", item)).startswith(f"--model '{item.split(',')[0]}")


def test_sizes_that_int_cannot_read_are_one_line(cli):
    assert usage_error(cli, "--topology", "testbed-2x4", *AXES, "--size", "1." + "1" * 5000) == (
        "--size 1.111111... (5002 digits): at most 16 digits after the point")
    assert usage_error(cli, "--topology", "testbed-2x4", *AXES, "--size", "²").startswith("--size '²': expected")


def test_empty_option_values_and_huge_arguments_are_refused(cli):
    base = ("--topology", "testbed-2x4", *AXES)
    assert usage_error(cli, *base, "--size", "") == "--size: an empty value; give a value or leave the option out"
    assert usage_error(cli, *base, "--size=") == "--size: an empty value; give a value or leave the option out"
    assert usage_error(cli, "check", "--topology", "testbed-2x4", *AXES, "--matrix", "", "AllReduce(root, inside)") \
        == "--matrix: an empty value; give a value or leave the option out"
    axes = "dp=8," * 20_000
    assert usage_error(cli, "--topology", "testbed-2x4", "--axes", axes) == (
        f"argument 4 ('dp=8,dp=8,dp=8,dp=8,...') is {len(axes):,} characters; at most 65,536")
    assert usage_error(cli, "plan", "--topology", "dgx-a100", "--global-batch", "8", "--model", "gpt3-175b",
                       "--micro-batch", "9" * 5000) == f"--micro-batch 99999999... (5000 digits): at most 16,777,216"


@pytest.mark.parametrize("name, shown", [('""', "''"), (r'"a\nb"', r"'a\nb'"), (r'"a\u001b[31m"', r"'a\x1b[31m'")])
def test_a_topology_name_must_be_printable_text(cli, tmp_path, name, shown):
    path = tmp_path / "t.yaml"
    path.write_text(f"name: {name}\nlevels:\n  - {{name: gpu, count: 8, bandwidth_GBps: 1.0, latency_us: 1.0}}\n")
    assert usage_error(cli, "--topology", path, *AXES) == (
        f"{path}: 'name' must be non-empty printable text of at most 200 characters (no line breaks or control "
        f"characters), got {shown}")


def test_a_topology_of_too_many_levels_is_refused_before_they_are_checked(cli, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("name: big\nlevels: [&a {name: x, count: 1, bandwidth_GBps: 1.0, latency_us: 1.0}"
                    + ", *a" * 1000 + "]\n")
    assert usage_error(cli, "--topology", path, *AXES) == (
        f"{path}: 'levels' holds 1,001 levels; at most 64 (real topologies have 2 to 4)")


def test_names_too_long_for_the_system_are_one_line(cli, tmp_path):
    long_name = "a" * 300
    tail = "File name too long: the system takes at most 255 bytes a file name and 4,096 a path"
    shown = f"{'a' * 40}... (300 characters)"
    assert usage_error(cli, "--topology", long_name, *AXES) == f"{shown}: {tail}"
    out = tmp_path / (long_name + ".json")
    assert usage_error(cli, "--topology", "testbed-2x4", *AXES, "--out", out).endswith(f"characters): {tail}")
    assert usage_error(cli, "verify", tmp_path / long_name).endswith(": cannot read plan (File name too long)")


def test_the_api_names_an_argument_of_the_wrong_type():
    import synth
    from synth.errors import SynthError

    with pytest.raises(SynthError, match=r"^load_plan: 'path' must be a file path \(str or os.PathLike\), not dict; "
                                         r"for a parsed document use synth.plan.plan_from_document$"):
        synth.load_plan({})
    with pytest.raises(SynthError, match=r"^verify_plan: 'plan' must be a synth.Plan, not str; load a plan file "):
        synth.verify_plan("plan.json")
    with pytest.raises(SynthError, match=r"^write_plan: 'path' must be a file path .*, not NoneType$"):
        synth.write_plan(None, None)
    with pytest.raises(SynthError, match=r"^write_plan: 'plan' must be a synth.Plan, not NoneType$"):
        synth.write_plan("plan.json", None)


def test_fit_of_an_endless_line_stops_at_the_cap(cli, tmp_path):
    """Like fit /dev/zero: a file of zero bytes without a line break larger
    than the cap (sparse: it takes no disk) is one line naming the cap, not
    a read of the whole file into memory."""
    from synth.documents import MAX_DOCUMENT_BYTES

    path = tmp_path / "zeros"
    with open(path, "wb") as f:
        f.truncate(MAX_DOCUMENT_BYTES + 1)
    assert usage_error(cli, "fit", path, "--output", tmp_path / "p.json") == (
        f"{path}: larger than {MAX_DOCUMENT_BYTES:,} bytes, the most a measurements file may hold; is it the right "
        "file?")


def test_more_axes_times_levels_than_array_dimensions_is_one_line(cli, tmp_path):
    ones = ",".join(f"a{i}=1" for i in range(40))
    assert usage_error(cli, "--topology", "testbed-2x4", "--axes", f"dp=8,{ones}") == (
        "41 axes on 2 levels: at most 64 axes x levels (one array dimension each); drop axes of size 1")


def test_a_plan_whose_matrix_does_not_fit_its_axes_is_refused(cli, tmp_path):
    import json

    from synth.cli import main

    good = tmp_path / "p.json"
    assert main(["--topology", "testbed-2x4", *AXES, "--out", str(good)]) == 0
    doc = json.loads(good.read_text())
    doc["matrix"] = [[2, 4, 1]]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert usage_error(cli, "verify", bad) == (
        f"{bad}: not a valid plan: the matrix must have one row per axis (1) of one entry per level (2)")
