"""Input paths and values that are not what a command reads: each is one
error line (exit 2) that says what the path or value is and names the limit
or the fix, at once and in bounded memory. Special files are made in a
temporary folder (a FIFO), never touched in the real /dev."""

from __future__ import annotations

import os

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
