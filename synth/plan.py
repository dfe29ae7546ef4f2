"""Plans: a placement and verified programs, as a versioned JSON document.

The schema is documented in ``docs/plan-schema.md`` (version 2; version 1 files
are read too). A plan holds one placement (topology, axes, matrix, mesh) and one
or more reductions over it (axes and goal), each with one program per range of
buffer sizes (one range covering every size for a plan written by the main
command; several for ``tune`` or the job planner).

:func:`load_plan` is the path to execution and stays light (numpy only: no z3,
lark or yaml): it rebuilds the placement, re-derives every program's lowering
from its text with the semantics (:func:`synth.synthesis.lowering.lower`) and refuses a
file whose stored values differ in any field from that derivation. Proving the
programs (numpy reference and z3) is a separate, explicit step:
:func:`verify_plan` (which loads z3 only when called) or ``synth-reduce verify``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .version import __version__
from .documents import read_document, write_document
from .errors import SynthError
from .synthesis.language import Program, format_program, read_program
from .synthesis.lowering import LoweredProgram, as_runs, lower
from .synthesis.placement import Axis, Placement
from .synthesis.reduction import Reduction
from .synthesis.semantics import Goal
from .topology import topology_from_dict
from .units import MAX_COUNT

if TYPE_CHECKING:
    from .synthesis.verify import Verification

SCHEMA = "synth-reduce/plan"
VERSION = 2
READABLE_VERSIONS = (1, 2)
_FIX = "re-create the plan with synth-reduce --out"
MAX_PROGRAM_LINES = 1000  # instructions of a stored program, as check takes (the search writes at most 10)


# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class PlannedProgram:
    """A lowered program used for buffers of ``min_bytes <= size < max_bytes``
    bytes per device (``max_bytes`` None: no upper bound)."""

    lowered: LoweredProgram
    min_bytes: int = 0
    max_bytes: int | None = None
    predicted_s: float | None = None  # informative: the model's prediction when chosen
    predicted_for_bytes: int | None = None

    @property
    def program(self) -> Program:
        return self.lowered.program

    def covers(self, size_bytes: int) -> bool:
        return self.min_bytes <= size_bytes and (self.max_bytes is None or size_bytes < self.max_bytes)


@dataclass(frozen=True)
class PlannedReduction:
    """A reduction and its programs by size range. Invariants: the ranges are
    sorted, start at 0, touch without gaps or overlaps and end unbounded; every
    program leaves the same chunk on each rank (one ``chunk_of_rank`` per
    reduction: a reduce-scatter's programs may otherwise differ in which rank
    ends with which chunk; :func:`one_chunk_layout` makes them agree)."""

    reduction: Reduction
    programs: tuple[PlannedProgram, ...]

    def __post_init__(self) -> None:
        problem = _range_problem(self.programs)
        if not problem and len({p.lowered.chunk_of_rank for p in self.programs}) > 1:
            problem = ("its programs leave different chunks on the ranks (chunk_of_rank); one reduction has one "
                       "layout (plan.one_chunk_layout)")
        if problem:
            raise SynthError(f"{self.reduction.describe()}: {problem}")

    def program_for(self, size_bytes: int) -> PlannedProgram:
        """The program for buffers of ``size_bytes`` bytes per device."""
        return next(p for p in self.programs if p.covers(size_bytes))


def one_chunk_layout(programs: Sequence[PlannedProgram]) -> tuple[PlannedProgram, ...]:
    """``programs`` (size ranges, smallest first) with one chunk layout: a
    program whose ``chunk_of_rank`` differs from the one of the largest sizes
    (where the bytes are) gives its range to that program (the range keeps no
    prediction: none was made for it there), and neighbouring ranges of one
    program become one."""
    anchor = programs[-1]
    out: list[PlannedProgram] = []
    for p in programs:
        if p.lowered.chunk_of_rank != anchor.lowered.chunk_of_rank:
            p = PlannedProgram(anchor.lowered, p.min_bytes, p.max_bytes)
        if out and out[-1].program == p.program:
            last = out[-1]
            p = PlannedProgram(last.lowered, last.min_bytes, p.max_bytes, last.predicted_s, last.predicted_for_bytes)
            out[-1] = p
        else:
            out.append(p)
    return tuple(out)


def _range_problem(programs: Sequence[PlannedProgram]) -> str | None:
    if not programs:
        return "no program"
    if programs[0].min_bytes != 0:
        return f"the first size range starts at {programs[0].min_bytes} bytes, not 0"
    for a, b in zip(programs, programs[1:]):
        if a.max_bytes is None or a.max_bytes != b.min_bytes or b.min_bytes <= a.min_bytes:
            return (f"size ranges [{a.min_bytes}, {a.max_bytes}) and [{b.min_bytes}, {b.max_bytes}) "
                    "must follow each other without gap or overlap")
    if programs[-1].max_bytes is not None:
        return f"the last size range ends at {programs[-1].max_bytes} bytes; it must be unbounded (null)"
    return None


@dataclass(frozen=True)
class Plan:
    """A placement and the programs of its reductions (see the module docstring).
    ``job`` is free-form information from the job planner (informative; not
    verified)."""

    placement: Placement
    reductions: tuple[PlannedReduction, ...]
    job: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.reductions:
            raise SynthError("a plan needs at least one reduction")
        keys = [(r.reduction.axes, r.reduction.goal) for r in self.reductions]
        for key in keys:
            if keys.count(key) > 1:
                raise SynthError(f"a plan holds {key[1].value} over {','.join(key[0])} twice")
        if any(r.reduction.placement != self.placement for r in self.reductions):
            raise SynthError("every reduction of a plan must be on the plan's placement")

    @classmethod
    def single(cls, lowered: LoweredProgram, reduction: Reduction, predicted_s: float | None = None,
               predicted_for_bytes: int | None = None) -> "Plan":
        """A plan of one reduction with one program for every size."""
        program = PlannedProgram(lowered, predicted_s=predicted_s, predicted_for_bytes=predicted_for_bytes)
        return cls(reduction.placement, (PlannedReduction(reduction, (program,)),))

    def find(self, axes: Sequence[str] | str | None = None, goal: Goal | str | None = None) -> PlannedReduction:
        """The reduction over ``axes`` (names or ``"dp,mp"``) toward ``goal``;
        either may be omitted when it leaves one candidate."""
        if isinstance(axes, str):
            axes = [a.strip() for a in axes.split(",") if a.strip()]
        if isinstance(goal, str):
            goal = _goal(goal, "goal")
        found = [r for r in self.reductions
                 if (axes is None or set(r.reduction.axes) == set(axes)) and (goal is None or r.reduction.goal is goal)]
        if len(found) == 1:
            return found[0]
        held = ", ".join(r.reduction.describe() for r in self.reductions)
        wanted = " ".join(x for x in (goal.value if goal else None, f"over {','.join(axes)}" if axes else None) if x)
        if not found:
            raise SynthError(f"the plan has no reduction {wanted or ''}; it holds {held}".replace("  ", " "))
        raise SynthError(f"the plan holds several reductions ({held}); name the axes and goal to use")

    @property
    def only(self) -> PlannedReduction:
        """The plan's reduction when it holds exactly one."""
        return self.find()

    @property
    def reduction(self) -> Reduction:
        return self.only.reduction

    @property
    def lowered(self) -> LoweredProgram:
        """The program of a plan with one reduction and one size range."""
        only = self.only
        if len(only.programs) != 1:
            raise SynthError(
                f"the plan has {len(only.programs)} programs by buffer size for {only.reduction.describe()}; "
                "pick one with plan.only.program_for(size_bytes)"
            )
        return only.programs[0].lowered

    @property
    def programs(self) -> tuple[PlannedProgram, ...]:
        """Every program of every reduction, in document order."""
        return tuple(p for r in self.reductions for p in r.programs)


# ---------------------------------------------------------------- writing


def _runs(chunks: Sequence[int]) -> list[list[int]]:
    """``[0, 1, 2, 5]`` -> ``[[0, 3], [5, 6]]``: ``[first, stop)`` runs."""
    return [list(run) for run in as_runs(chunks)]


def steps_document(lowered: LoweredProgram) -> list[dict[str, Any]]:
    return [
        {
            "instruction": str(step.instruction),
            "collective": step.collective.value,
            "groups": [list(g) for g in step.groups],
            "chunks": [_runs(c) for c in step.chunks],
        }
        for step in lowered.steps
    ]


def program_document(lowered: LoweredProgram) -> dict[str, Any]:
    """The program's text and lowered steps (what ``--json`` lists per program)."""
    return {
        "text": format_program(lowered.program),
        "num_steps": len(lowered.steps),
        "steps": steps_document(lowered),
    }


def _hierarchy_document(reduction: Reduction) -> list[dict[str, Any]]:
    h = reduction.hierarchy
    return [{"name": n, "size": s} for n, s in zip(h.names, h.sizes)]


def plan_document(plan: Plan) -> dict[str, Any]:
    placement = plan.placement
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "version": VERSION,
        "created_by": f"synth-reduce {__version__}",
        "topology": placement.topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in placement.axes],
        "matrix": [list(row) for row in placement.matrix],
        "mesh": placement.mesh.tolist(),
        "reductions": [],
    }
    for planned in plan.reductions:
        reduction = planned.reduction
        first = planned.programs[0].lowered
        programs = []
        for p in planned.programs:
            entry: dict[str, Any] = {"min_bytes": p.min_bytes, "max_bytes": p.max_bytes}
            entry.update(program_document(p.lowered))
            if p.predicted_s is not None:
                entry["predicted_s"] = p.predicted_s
                entry["predicted_for_bytes"] = p.predicted_for_bytes
            programs.append(entry)
        doc["reductions"].append({
            "reduce": list(reduction.axes),
            "collective": reduction.goal.value,
            "synthesis_hierarchy": _hierarchy_document(reduction),
            "num_chunks": first.num_chunks,
            "reduction_groups": [list(g) for g in first.reduction_groups],
            "chunk_of_rank": list(first.chunk_of_rank),
            "programs": programs,
        })
    if plan.job is not None:
        doc["job"] = plan.job
    return doc


def write_plan(path: str | Path, plan: Plan) -> None:
    """Write ``plan`` to the file ``path`` (whole or not at all); SynthError
    naming the argument that is not a path or not a plan."""
    _check_path(path, "write_plan")
    if not isinstance(plan, Plan):
        raise SynthError(f"write_plan: 'plan' must be a synth.Plan, not {type(plan).__name__}")
    write_document(path, "plan", plan_document(plan))


def _check_path(path: Any, function: str) -> None:
    """SynthError unless ``path`` is a file path (str or os.PathLike)."""
    if not isinstance(path, (str, os.PathLike)):
        raise SynthError(f"{function}: 'path' must be a file path (str or os.PathLike), not {type(path).__name__}"
                         + ("; for a parsed document use synth.plan.plan_from_document" if isinstance(path, dict)
                            else ""))


# ---------------------------------------------------------------- reading


class _Reader:
    """Typed access to a plan document; errors name the file and the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> SynthError:
        return SynthError(f"{self.source}: not a valid plan: {where} {what}")

    def get(self, doc: Any, key: str, kind: type, where: str = "") -> Any:
        name = f"{where}.{key}" if where else key
        if not isinstance(doc, dict) or key not in doc:
            raise SynthError(f"{self.source}: not a valid plan: missing field '{name}'")
        value = doc[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(f"'{name}'", f"must be {_KIND_NAMES.get(kind, kind.__name__)}")
        return value

    def ints(self, value: Any, name: str) -> tuple[int, ...]:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.fail(f"'{name}'", "must be a list of integers")
        return tuple(value)

    def int_lists(self, value: Any, name: str) -> tuple[tuple[int, ...], ...]:
        if not isinstance(value, list):
            raise self.fail(f"'{name}'", "must be a list of lists of integers")
        return tuple(self.ints(row, name) for row in value)


_KIND_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object", bool: "true or false"}


def _goal(text: str, where: str) -> Goal:
    try:
        return Goal(text)
    except ValueError:
        raise SynthError(f"{where}: unknown collective {text!r}; use one of {', '.join(g.value for g in Goal)}") from None


def _upgrade_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """A version-1 document (one reduction, one program, chunk lists as plain
    integers) in the version-2 layout, for the one reader below."""
    program = doc.get("program")
    if isinstance(program, dict) and isinstance(program.get("steps"), list):
        program = dict(program, min_bytes=0, max_bytes=None)
        steps = []
        for step in program["steps"]:
            if isinstance(step, dict) and isinstance(step.get("chunks"), list):
                step = dict(step, chunks=[_runs(c) if isinstance(c, list) and all(
                    isinstance(x, int) for x in c) else c for c in step["chunks"]])
            steps.append(step)
        program["steps"] = steps
    reduction = {key: doc[key] for key in ("reduce", "collective", "synthesis_hierarchy", "num_chunks",
                                           "reduction_groups", "chunk_of_rank") if key in doc}
    reduction["programs"] = [program] if program is not None else None
    if "predicted_s" in doc and isinstance(program, dict):
        program["predicted_s"] = doc["predicted_s"]
    out = {key: doc[key] for key in ("schema", "created_by", "topology", "axes", "matrix", "mesh") if key in doc}
    out["version"] = VERSION
    out["reductions"] = [reduction]
    return out


def _chunk_list(r: _Reader, runs: Any, name: str, num_chunks: int, most: int) -> tuple[int, ...]:
    """The chunks of ``[first, stop)`` runs, each run checked against the
    plan's own ``num_chunks`` and the total against ``most`` (what the stored
    list must equal) before anything is expanded: a crafted run such as
    ``[0, 10**12]`` is one error line, never a list of that length."""
    chunks: list[int] = []
    for run in r.int_lists(runs, name):
        if len(run) != 2 or not 0 <= run[0] < run[1]:
            raise r.fail(f"'{name}'", "must be a list of [first, stop) chunk runs with 0 <= first < stop")
        if run[1] > num_chunks:
            raise r.fail(f"'{name}'", f"holds the chunk run {list(run)} past the plan's num_chunks {num_chunks} "
                                      f"(chunks are 0..{num_chunks - 1}); {_FIX}")
        if len(chunks) + run[1] - run[0] > most:
            raise r.fail(f"'{name}'", f"holds more chunks than the lowering of the program gives this group "
                                      f"({most}); {_FIX}")
        chunks.extend(range(run[0], run[1]))
    return tuple(chunks)


def load_plan(path: str | Path) -> Plan:
    """Read a plan file and check it against the derivation of its programs;
    errors name the file, the field and the fix. Needs numpy only."""
    _check_path(path, "load_plan")
    source = str(path)
    doc = read_document(path, "plan", SCHEMA, READABLE_VERSIONS, fix=_FIX)
    if doc["version"] == 1:
        doc = _upgrade_v1(doc)
    return plan_from_document(doc, source)


def as_plan(plan: Plan | str | Path) -> Plan:
    """A loaded plan as it is, or the plan at a path (:func:`load_plan`): what
    the trainer integrations accept wherever they take a plan."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return load_plan(plan)
    raise SynthError(f"plan: give a path or a synth.Plan, not {type(plan).__name__}")


def plan_from_document(doc: dict[str, Any], source: str = "plan") -> Plan:
    """:func:`load_plan` on an already parsed version-2 document."""
    r = _Reader(source)
    topology = topology_from_dict(r.get(doc, "topology", dict), f"{source}: topology")
    axes_doc = r.get(doc, "axes", list)
    try:
        axes = tuple(Axis(a["name"], a["size"]) for a in axes_doc)
        if not all(isinstance(a.name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", a.name)
                   and isinstance(a.size, int) and not isinstance(a.size, bool) and 1 <= a.size <= MAX_COUNT
                   for a in axes):
            raise TypeError
    except (TypeError, KeyError):
        raise r.fail("'axes'", f"must be a list of {{name, size}} with an identifier as name (as --axes takes) and "
                               f"a size from 1 to {MAX_COUNT:,}") from None
    matrix = r.int_lists(r.get(doc, "matrix", list), "matrix")
    try:
        placement = Placement(topology, axes, matrix)
    except SynthError as exc:
        raise SynthError(f"{source}: not a valid plan: {exc}") from None
    if r.get(doc, "mesh", list) != placement.mesh.tolist():
        raise SynthError(f"{source}: the stored mesh is not the mesh of the stored matrix; {_FIX}")
    reductions = []
    for i, entry in enumerate(r.get(doc, "reductions", list)):
        reductions.append(_planned_reduction(r, entry, f"reductions[{i}]", placement))
    if not reductions:
        raise r.fail("'reductions'", "must hold at least one reduction")
    job = doc.get("job")
    try:
        return Plan(placement, tuple(reductions), job if isinstance(job, dict) else None)
    except SynthError as exc:
        raise SynthError(f"{source}: not a valid plan: {exc}") from None


def _planned_reduction(r: _Reader, entry: Any, where: str, placement: Placement) -> PlannedReduction:
    source = r.source
    reduce_axes = r.get(entry, "reduce", list, where)
    if not all(isinstance(a, str) for a in reduce_axes):
        raise r.fail(f"'{where}.reduce'", "must be a list of axis names")
    goal = _goal(r.get(entry, "collective", str, where), f"{source}: {where}.collective")
    try:
        reduction = Reduction(placement, tuple(reduce_axes), goal)
    except SynthError as exc:
        raise SynthError(f"{source}: not a valid plan: {where}: {exc}") from None
    hierarchy = r.get(entry, "synthesis_hierarchy", list, where)
    derived_hierarchy = [{"name": n, "size": s} for n, s in zip(reduction.hierarchy.names, reduction.hierarchy.sizes)]
    if hierarchy != derived_hierarchy:
        raise SynthError(f"{source}: {where}.synthesis_hierarchy is not the synthesis hierarchy of the stored "
                         f"matrix and reduction axes ({reduction.hierarchy.describe()}); {_FIX}")
    num_chunks = r.get(entry, "num_chunks", int, where)
    groups = r.int_lists(r.get(entry, "reduction_groups", list, where), f"{where}.reduction_groups")
    chunk_of_rank = r.ints(r.get(entry, "chunk_of_rank", list, where), f"{where}.chunk_of_rank")
    programs = []
    for j, program_doc in enumerate(r.get(entry, "programs", list, where)):
        at = f"{where}.programs[{j}]"
        lowered = _checked_program(r, program_doc, at, reduction)
        for name, stored, derived in (("num_chunks", num_chunks, lowered.num_chunks),
                                      ("reduction_groups", groups, lowered.reduction_groups),
                                      ("chunk_of_rank", chunk_of_rank, lowered.chunk_of_rank)):
            if stored != derived:
                raise SynthError(f"{source}: {where}.{name} differs from the lowering of {at}'s program on this "
                                 f"placement; {_FIX}")
        min_bytes = r.get(program_doc, "min_bytes", int, at)
        max_bytes = program_doc.get("max_bytes")
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)):
            raise r.fail(f"'{at}.max_bytes'", "must be an integer or null")
        predicted = program_doc.get("predicted_s")
        predicted_for = program_doc.get("predicted_for_bytes")
        programs.append(PlannedProgram(
            lowered, min_bytes, max_bytes,
            float(predicted) if isinstance(predicted, (int, float)) and not isinstance(predicted, bool) else None,
            predicted_for if isinstance(predicted_for, int) and not isinstance(predicted_for, bool) else None,
        ))
    problem = _range_problem(programs)
    if problem:
        raise r.fail(f"'{where}.programs'", f"size ranges are inconsistent: {problem}")
    return PlannedReduction(reduction, tuple(programs))


def _checked_program(r: _Reader, doc: Any, at: str, reduction: Reduction) -> LoweredProgram:
    """The lowering of the stored program text, after checking that every stored
    field of the program equals it."""
    source = r.source
    text = r.get(doc, "text", str, at)
    if text.count("\n") + 1 > MAX_PROGRAM_LINES:  # before it is parsed and lowered
        raise r.fail(f"'{at}.text'", f"holds {text.count(chr(10)) + 1:,} lines; a program has at most "
                                     f"{MAX_PROGRAM_LINES:,} instructions (synthesized ones at most 10)")
    program = read_program(text, f"{source}: {at}.text")
    try:
        derived = lower(program, reduction)
    except SynthError as exc:
        raise SynthError(f"{source}: {at}: the program is not valid on the stored placement: {exc}") from None
    if r.get(doc, "num_steps", int, at) != len(derived.steps):
        raise SynthError(f"{source}: {at}.num_steps is {doc['num_steps']} but the program has "
                         f"{len(derived.steps)} instructions; {_FIX}")
    steps = r.get(doc, "steps", list, at)
    if len(steps) != len(derived.steps):
        raise SynthError(f"{source}: {at}: {len(steps)} steps stored for a {len(derived.steps)}-instruction "
                         f"program; {_FIX}")
    for number, (step, want) in enumerate(zip(steps, derived.steps), 1):
        where = f"{at}.steps[{number - 1}]"
        if r.get(step, "instruction", str, where) != str(want.instruction):
            raise SynthError(f"{source}: {where}.instruction is {step['instruction']!r} but instruction {number} "
                             f"of the program text is {str(want.instruction)!r}; {_FIX}")
        if r.get(step, "collective", str, where) != want.collective.value:
            raise SynthError(f"{source}: {where}.collective is {step['collective']!r} but step {number} of the "
                             f"program text is {want.instruction}; {_FIX}")
        groups = r.int_lists(r.get(step, "groups", list, where), f"{where}.groups")
        chunks_doc = r.get(step, "chunks", list, where)
        if groups != want.groups or len(chunks_doc) != len(want.chunks):
            raise SynthError(f"{source}: step {number} ({want.instruction}) stores groups or chunks that differ "
                             f"from the lowering of the program on this placement; {_FIX}")
        chunks = tuple(_chunk_list(r, c, f"{where}.chunks", derived.num_chunks, len(w))
                       for c, w in zip(chunks_doc, want.chunks))
        if chunks != want.chunks:
            raise SynthError(f"{source}: step {number} ({want.instruction}) stores groups or chunks that differ "
                             f"from the lowering of the program on this placement; {_FIX}")
    return derived


def verify_plan(plan: Plan, source: str = "plan") -> tuple[Verification, ...]:
    """Prove every program of ``plan`` (in document order) with the numpy
    reference and z3 (:func:`synth.synthesis.verify.verify_lowered`); SynthError
    naming ``source``, the reduction and the size range of the first that fails.
    The verifier (z3, lark) is imported here, on first call, so that
    :func:`load_plan` stays light."""
    if not isinstance(plan, Plan):
        raise SynthError(f"verify_plan: 'plan' must be a synth.Plan, not {type(plan).__name__}; load a plan file "
                         "with synth.load_plan(path) first")
    from .synthesis.verify import verify_lowered

    out = []
    for planned in plan.reductions:
        for program in planned.programs:
            try:
                out.append(verify_lowered(program.lowered))
            except SynthError as exc:
                where = planned.reduction.describe()
                if len(planned.programs) > 1:
                    where += f", buffers of {program.min_bytes}..{program.max_bytes or 'any'} bytes"
                raise SynthError(f"{source}: {where}: {exc}") from None
    return tuple(out)
