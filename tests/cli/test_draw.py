"""``synth-reduce draw``: a picture of every shipped topology's example plan
(an SVG that parses, holding each axis' and each step's title, each panel
coloured with as many colours as the groups it shows, up to the palette) and
of the README's plans (PNG); the errors of a missing matplotlib and a bad
file name."""

from __future__ import annotations

import json
import math
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from helpers import usage_error

from synth.cli import main
from synth.cli.drawing import COLOURS, MAX_DRAWN, layout
from synth.topology import load_topology

pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted(p.stem for p in (REPO / "topologies").glob("*.yaml"))


def example_axes(name: str) -> str:
    """tp over the innermost level, dp over the rest (one axis where the
    topology has one level or one device per innermost element)."""
    counts = load_topology(name).counts
    inner, rest = counts[-1], math.prod(counts[:-1])
    if len(counts) == 1 or inner == 1 or rest == 1:
        return f"dp={inner * rest}"
    return f"tp={inner},dp={rest}"


def reference_groups(plan_json: dict, axis: int) -> list[set[int]]:
    """The groups of axis ``axis`` from the plan file's mesh: the devices that
    agree on every other coordinate."""
    mesh = np.asarray(plan_json["mesh"])
    size = mesh.shape[axis]
    return [set(map(int, row)) for row in np.moveaxis(mesh, axis, -1).reshape(-1, size)]


def expected_colours(groups: list[set[int]], drawn: int) -> int:
    return min(COLOURS, sum(1 for g in groups if min(g) < drawn))


def recording_draws(monkeypatch) -> list[dict[str, int]]:
    """What each ``draw_plan`` the ``draw`` command calls returns (the colours
    used per panel title), in call order: the command's own drawing is the
    one checked, not a second drawing of the same plan."""
    import synth.cli.draw as command

    returned, draw = [], command.draw_plan

    def recording(*args, **kwargs):
        returned.append(draw(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(command, "draw_plan", recording)
    return returned


@pytest.mark.timeout(900)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_each_shipped_topology_example_plan_is_drawn(topology, tmp_path, capsys, monkeypatch):
    plan_path, picture = tmp_path / "plan.json", tmp_path / "plan.svg"
    draws = recording_draws(monkeypatch)
    axes = example_axes(topology)
    reduce = "dp"
    assert main(["--topology", topology, "--axes", axes, "--reduce", reduce, "--max-steps", "3", "--top", "1",
                 "--no-verify", "--out", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["draw", str(plan_path), "--out", str(picture)]) == 0
    assert capsys.readouterr().out == f"wrote {picture}\n"
    root = ET.parse(picture).getroot()  # valid XML
    assert root.tag.endswith("svg")
    text = " ".join("".join(t.itertext()) for t in root.iter() if t.tag.endswith("text"))
    doc = json.loads(plan_path.read_text())
    for i, axis in enumerate(doc["axes"]):
        groups = reference_groups(doc, i)
        assert f"{axis['name']}={axis['size']}: {len(groups)} group" in text, text[:500]
    program = doc["reductions"][0]["programs"][-1]
    for n, step in enumerate(program["steps"][:6], start=1):
        assert f"{n}. {step['instruction']}" in text
    drawn = min(load_topology(topology).num_devices, layout(load_topology(topology)).drawn)
    assert len(draws) == 1
    used = draws[0]
    for i, axis in enumerate(doc["axes"]):
        title = next(t for t in used if t.startswith(f"{axis['name']}={axis['size']}:"))
        assert used[title] == expected_colours(reference_groups(doc, i), drawn), title
    for n, step in enumerate(program["steps"][:6], start=1):
        title = next(t for t in used if t.startswith(f"{n}. {step['instruction']}"))
        assert used[title] == expected_colours([set(g) for g in step["groups"]], drawn), title


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readmes_plans_are_drawn_as_png(tmp_path, capsys):
    """The main job's plan (placement 1 of p2-a100) and a job plan of 512
    GPUs: PNGs of a readable size, the job's sizes and step split drawn."""
    placement, job = tmp_path / "plan.json", tmp_path / "job.json"
    assert main(["--topology", "p2-a100", "--axes", "dp=4,mp=16", "--placement", "1", "--out", str(placement)]) == 0
    assert main(["plan", "--topology", "dgx-a100", "--scale", "node=64", "--model", "gpt3-175b", "--global-batch",
                 "1536", "--recompute", "selective", "--top", "1", "--out", str(job)]) == 0
    capsys.readouterr()
    for plan in (placement, job):
        png = plan.with_suffix(".png")
        assert main(["draw", str(plan), "--out", str(png)]) == 0
        width, height = _png_size(png)
        assert 600 <= width <= 4000 and 400 <= height <= 5000, (width, height)
    svg = tmp_path / "job.svg"
    assert main(["draw", str(job), "--out", str(svg)]) == 0
    text = svg.read_text()
    sizes = json.loads(job.read_text())["job"]["sizes"]
    assert f"job: tp={sizes['tp']} dp={sizes['dp']} pp={sizes['pp']}" in text
    assert "compute " in text and "bubble " in text  # the step split's legend


def test_beyond_the_limit_the_first_nodes_are_drawn_and_the_rest_said():
    topology = load_topology("dgx-h800")  # 256 nodes x 8
    where = layout(topology)
    assert where.drawn == MAX_DRAWN and topology.num_devices == 2048
    cells = {tuple(c) for c in where.cells}
    assert len(cells) == where.drawn  # no two devices on one cell
    assert sum(1 for b in where.boxes if b.level == 0) == MAX_DRAWN // 8


def test_draw_without_matplotlib_says_what_to_install(tmp_path, monkeypatch, capsys):
    plan = tmp_path / "plan.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=8", "--out", str(plan)]) == 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    capsys.readouterr()
    assert main(["draw", str(plan), "--out", str(tmp_path / "p.svg")]) == 2
    assert capsys.readouterr().err.strip() == "synth-reduce: error: draw needs matplotlib: pip install matplotlib"
    assert not (tmp_path / "p.svg").exists()


def test_draw_refuses_a_picture_format_it_does_not_write(tmp_path, cli):
    plan = tmp_path / "plan.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=8", "--out", str(plan)]) == 0
    assert "--out plan.gif: give a file ending in .svg, .png, .pdf" in usage_error(
        cli, "draw", str(plan), "--out", "plan.gif")
