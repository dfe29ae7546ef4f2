"""Plans whose stored derived fields were edited are refused, by ``load_plan``
(the runtime's path) and by ``synth-reduce verify``, with a message naming the
field: the collective and instruction of a step, the number of steps, the
synthesis hierarchy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth.cli import main
from synth.errors import SynthError
from synth.plan import Plan, load_plan, write_plan
from synth.synthesis.language import parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import Placement, parse_axes
from synth.synthesis.reduction import Reduction
from synth.topology import load_topology

BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"
FIX = "; re-create the plan with synth-reduce --out"


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory) -> dict:
    placement = Placement(load_topology("p2-a100"), parse_axes("dp=4,mp=16"), ((2, 2), (2, 8)))
    reduction = Reduction.of(placement, ["dp"])
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    write_plan(path, Plan.single(lower(parse_program(BLUECONNECT), reduction), reduction))
    return json.loads(path.read_text())


def _program(doc: dict) -> dict:
    return doc["reductions"][0]["programs"][0]


def _set_step(i: int, key: str, value):
    return lambda d: _program(d)["steps"][i].update({key: value})


@pytest.mark.parametrize("change, expected", [
    (_set_step(0, "collective", "Broadcast"),
     "reductions[0].programs[0].steps[0].collective is 'Broadcast' but step 1 of the program text is "
     "ReduceScatter(node, inside)" + FIX),
    (_set_step(0, "collective", "Frobnicate"),
     "reductions[0].programs[0].steps[0].collective is 'Frobnicate' but step 1 of the program text is "
     "ReduceScatter(node, inside)" + FIX),
    (_set_step(2, "collective", "AllReduce"),
     "reductions[0].programs[0].steps[2].collective is 'AllReduce' but step 3 of the program text is "
     "AllGather(node, inside)" + FIX),
    (_set_step(1, "instruction", "AllReduce(root, inside)"),
     "reductions[0].programs[0].steps[1].instruction is 'AllReduce(root, inside)' but instruction 2 of the "
     "program text is 'AllReduce(node, parallel(root))'" + FIX),
    (_set_step(0, "instruction", "Frobnicate(node, inside)"),
     "reductions[0].programs[0].steps[0].instruction is 'Frobnicate(node, inside)' but instruction 1 of the "
     "program text is 'ReduceScatter(node, inside)'" + FIX),
    (lambda d: _program(d).update(num_steps=2),
     "reductions[0].programs[0].num_steps is 2 but the program has 3 instructions" + FIX),
    (lambda d: _program(d).update(num_steps=4),
     "reductions[0].programs[0].num_steps is 4 but the program has 3 instructions" + FIX),
    (lambda d: d["reductions"][0]["synthesis_hierarchy"][0].update(size=4),
     "reductions[0].synthesis_hierarchy is not the synthesis hierarchy of the stored matrix and reduction axes "
     "(node x2 > gpu x2)" + FIX),
    (lambda d: d["reductions"][0]["synthesis_hierarchy"][1].update(name="cpu"),
     "reductions[0].synthesis_hierarchy is not the synthesis hierarchy of the stored matrix and reduction axes "
     "(node x2 > gpu x2)" + FIX),
    (lambda d: d["reductions"][0]["synthesis_hierarchy"].pop(),
     "reductions[0].synthesis_hierarchy is not the synthesis hierarchy of the stored matrix and reduction axes "
     "(node x2 > gpu x2)" + FIX),
], ids=["collective-broadcast", "collective-frobnicate", "collective-last", "instruction", "instruction-unknown",
        "num-steps-less", "num-steps-more", "hierarchy-size", "hierarchy-name", "hierarchy-level"])
def test_edited_derived_fields_are_refused(tmp_path: Path, capsys, plan_doc, change, expected):
    doc = json.loads(json.dumps(plan_doc))
    change(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SynthError) as exc:
        load_plan(path)
    assert str(exc.value) == f"{path}: {expected}"
    assert main(["verify", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"synth-reduce: error: {path}: {expected}\n"


def test_the_unedited_plan_loads_and_verifies(tmp_path: Path, capsys, plan_doc):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc))
    assert load_plan(path).lowered.program == parse_program(BLUECONNECT)
    assert main(["verify", str(path)]) == 0
    assert "verified allreduce over dp" in capsys.readouterr().out
