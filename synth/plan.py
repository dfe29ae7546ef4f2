"""Plans: a placement plus a verified program, as a versioned JSON document.

The schema is documented in ``docs/plan-schema.md``. ``load_plan`` validates a
document and rebuilds its parts; ``verify_plan`` re-derives the lowering from the
topology, matrix and program text, checks that the stored steps are exactly that
lowering, and re-proves the stored steps (numpy reference and z3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from . import __version__
from .documents import read_document, write_document
from .errors import SynthError
from .execute import check_numerically
from .language import Program, format_program, parse_program
from .lowering import LoweredProgram, LoweredStep, lower
from .placement import Axis, Placement
from .prove import Proof, prove
from .semantics import Goal, hierarchy_of
from .topology import topology_from_dict

SCHEMA = "synth-reduce/plan"
VERSION = 1


def steps_document(lowered: LoweredProgram) -> list[dict[str, Any]]:
    return [
        {
            "instruction": str(step.instruction),
            "collective": step.collective.value,
            "groups": [list(g) for g in step.groups],
            "chunks": [list(c) for c in step.chunks],
        }
        for step in lowered.steps
    ]


def program_document(lowered: LoweredProgram) -> dict[str, Any]:
    return {
        "text": format_program(lowered.program),
        "num_steps": len(lowered.steps),
        "steps": steps_document(lowered),
    }


def plan_document(placement: Placement, reduce_axes: Sequence[str], lowered: LoweredProgram) -> dict[str, Any]:
    hierarchy = hierarchy_of(placement, reduce_axes)
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "created_by": f"synth-reduce {__version__}",
        "topology": placement.topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in placement.axes],
        "reduce": list(reduce_axes),
        "collective": lowered.goal.value,
        "matrix": [list(row) for row in placement.matrix],
        "mesh": placement.mesh.tolist(),
        "synthesis_hierarchy": [{"name": n, "size": s} for n, s in zip(hierarchy.names, hierarchy.sizes)],
        "num_chunks": lowered.num_chunks,
        "reduction_groups": [list(g) for g in lowered.reduction_groups],
        "chunk_of_rank": list(lowered.chunk_of_rank),
        "program": program_document(lowered),
    }


def write_plan(path: str | Path, document: dict[str, Any]) -> None:
    write_document(path, "plan", document)


@dataclass(frozen=True)
class Plan:
    placement: Placement
    reduce_axes: tuple[str, ...]
    goal: Goal
    program: Program
    stored: LoweredProgram  # the steps exactly as the file has them


def _field(doc: dict[str, Any], key: str, kind: type, source: str) -> Any:
    if key not in doc:
        raise SynthError(f"{source}: not a valid plan: missing field '{key}'")
    if not isinstance(doc[key], kind):
        raise SynthError(f"{source}: not a valid plan: field '{key}' has the wrong type")
    return doc[key]


def _int_lists(value: Any, key: str, source: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list) or not all(
        isinstance(row, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in row) for row in value
    ):
        raise SynthError(f"{source}: not a valid plan: '{key}' must be a list of lists of integers")
    return tuple(tuple(row) for row in value)


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; errors name the file and the problem."""
    source = str(path)
    doc = read_document(path, "plan", SCHEMA, VERSION, fix="re-create the plan with --out")
    topology = topology_from_dict(_field(doc, "topology", dict, source), f"{source}: topology")
    axes_doc = _field(doc, "axes", list, source)
    try:
        axes = tuple(Axis(str(a["name"]), int(a["size"])) for a in axes_doc)
    except (TypeError, KeyError, ValueError):
        raise SynthError(f"{source}: not a valid plan: 'axes' must be a list of {{name, size}}") from None
    matrix = _int_lists(_field(doc, "matrix", list, source), "matrix", source)
    try:
        placement = Placement(topology, axes, matrix)
    except SynthError as exc:
        raise SynthError(f"{source}: not a valid plan: {exc}") from None
    if _field(doc, "mesh", list, source) != placement.mesh.tolist():
        raise SynthError(f"{source}: the stored mesh is not the mesh of the stored matrix")
    reduce_axes = tuple(_field(doc, "reduce", list, source))
    unknown = [r for r in reduce_axes if r not in placement.axis_names]
    if unknown or not reduce_axes:
        raise SynthError(f"{source}: not a valid plan: 'reduce' names unknown axes {unknown}")
    try:
        goal = Goal(_field(doc, "collective", str, source))
    except ValueError:
        raise SynthError(f"{source}: not a valid plan: unknown collective {doc['collective']!r}") from None
    program_doc = _field(doc, "program", dict, source)
    program = parse_program(_field(program_doc, "text", str, source), f"{source}: program.text")
    steps_doc = _field(program_doc, "steps", list, source)
    if len(steps_doc) != len(program):
        raise SynthError(
            f"{source}: plan is inconsistent: {len(steps_doc)} steps stored for a "
            f"{len(program)}-instruction program"
        )
    steps = []
    for instruction, step in zip(program.instructions, steps_doc):
        if not isinstance(step, dict):
            raise SynthError(f"{source}: not a valid plan: every step must be an object")
        groups = _int_lists(step.get("groups"), "groups", source)
        chunks = _int_lists(step.get("chunks"), "chunks", source)
        if len(groups) != len(chunks):
            raise SynthError(f"{source}: not a valid plan: a step has {len(groups)} groups but {len(chunks)} chunk lists")
        steps.append(LoweredStep(instruction, groups, chunks))
    k = _field(doc, "num_chunks", int, source)
    stored = LoweredProgram(
        program=program,
        goal=goal,
        num_devices=topology.num_devices,
        num_chunks=k,
        reduction_groups=_int_lists(_field(doc, "reduction_groups", list, source), "reduction_groups", source),
        chunk_of_rank=tuple(_field(doc, "chunk_of_rank", list, source)),
        steps=tuple(steps),
    )
    return Plan(placement, reduce_axes, goal, program, stored)


@dataclass(frozen=True)
class Verification:
    elements_checked: int
    proof: Proof


def verify_lowered(lowered: LoweredProgram) -> Verification:
    """Both independent checks; SynthError if either fails. A z3 proof skipped for
    size (``proof.skipped``) is not a failure; callers report its scope."""
    checked = check_numerically(lowered)
    proof = prove(lowered)
    if not proof.proved and not proof.skipped:
        raise SynthError(f"z3 refutes the program: {proof.counterexample}")
    return Verification(checked, proof)


def verify_plan(plan: Plan, source: str = "plan") -> Verification:
    """Re-derive the plan's lowering, compare it with the stored one, re-prove it."""
    try:
        derived = lower(plan.program, plan.placement, plan.reduce_axes, plan.goal)
    except SynthError as exc:
        raise SynthError(f"{source}: the program is not valid on the stored placement: {exc}") from None
    if derived != plan.stored:
        for number, (a, b) in enumerate(zip(derived.steps, plan.stored.steps), 1):
            if a != b:
                raise SynthError(
                    f"{source}: step {number} ({a.instruction}) stores groups or chunks that differ "
                    "from the lowering of the program on this placement"
                )
        raise SynthError(
            f"{source}: the stored reduction groups, chunk count or chunk_of_rank differ from "
            "the lowering of the program on this placement"
        )
    try:
        return verify_lowered(plan.stored)
    except SynthError as exc:
        raise SynthError(f"{source}: {exc}") from None
