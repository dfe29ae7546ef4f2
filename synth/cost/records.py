"""Measurement records: one JSON line per timed (placement, reduction, program,
size), written by ``synth-reduce bench``/``tune`` and read by ``fit``,
``validate`` and the evaluation (:mod:`synth.testbed.evaluation`).

Format (``"schema": "synth-reduce/measurement"``, ``"version": 1``): ``topology``
(the plan's topology object), ``axes`` (``{name, size}`` list), ``matrix``,
``reduce`` (axis names), ``collective`` (the goal), ``program`` (text),
``size_bytes`` and ``median_s`` are required; ``is_default``, ``backend``,
``algo`` (the library algorithm the run used, when known or forced), ``dtype``,
``ranks``, ``iters``, ``times_s``, ``min_s``, ``max_s`` and ``wrong`` are
optional; so are, for runs on NCCL, ``nccl_version`` (``"2.21.5"``) and
``nccl_choices`` (what NCCL's tuning log said it ran: a list of ``{collective,
size_bytes, algorithm, protocol, channels, calls}``, see
:mod:`synth.cost.nccl_log`), written only when known. A reader refuses a line of
another schema or version, naming the file and line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..documents import append_lines, check_schema, json_lines
from ..errors import SynthError
from ..synthesis.language import Program, format_program, read_program
from ..synthesis.placement import Axis, Placement
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal
from ..topology import Topology, topology_from_dict
from ..units import shortened
from .nccl_log import LoggedChoice

SCHEMA = "synth-reduce/measurement"
VERSION = 1
REQUIRED = ("topology", "axes", "matrix", "reduce", "collective", "program", "size_bytes", "median_s")


@dataclass(frozen=True)
class Record:
    """One measured program: its reduction, size and times (seconds)."""

    reduction: Reduction
    program: Program
    size_bytes: int
    median_s: float
    is_default: bool = False
    backend: str | None = None
    algo: str | None = None
    dtype: str | None = None
    ranks: int | None = None
    times_s: tuple[float, ...] = ()
    min_s: float | None = None
    max_s: float | None = None
    wrong: int = 0
    nccl_version: str | None = None
    nccl_choices: tuple[LoggedChoice, ...] = ()
    line: int = field(default=0, compare=False)  # line of the file it was read from (0: not read)

    @property
    def algorithm(self) -> str:
        """The library algorithm to model this run with: ``algo`` when the
        record names it, else ``mpi`` for the MPI backend, else ``nccl``
        (NCCL's own choice)."""
        return self.algo or ("mpi" if self.backend == "mpi" else "nccl")

    @property
    def case(self) -> tuple:
        """Placement x reduction x size x algorithm: the programs compared in a case."""
        r = self.reduction
        return (r.placement.matrix, r.axes, r.goal, self.size_bytes, self.algorithm)

    def to_dict(self) -> dict[str, Any]:
        reduction = self.reduction
        placement = reduction.placement
        doc: dict[str, Any] = {
            "schema": SCHEMA, "version": VERSION,
            "topology": placement.topology.to_dict(),
            "axes": [{"name": a.name, "size": a.size} for a in placement.axes],
            "matrix": [list(row) for row in placement.matrix],
            "reduce": list(reduction.axes),
            "collective": reduction.goal.value,
            "program": format_program(self.program),
            "is_default": self.is_default,
            "backend": self.backend, "algo": self.algo, "dtype": self.dtype, "ranks": self.ranks,
            "size_bytes": self.size_bytes,
        }
        if self.times_s:
            doc["iters"] = len(self.times_s)
            doc["times_s"] = list(self.times_s)
        doc["median_s"] = self.median_s
        if self.min_s is not None:
            doc["min_s"] = self.min_s
        if self.max_s is not None:
            doc["max_s"] = self.max_s
        doc["wrong"] = self.wrong
        if self.nccl_version is not None:
            doc["nccl_version"] = self.nccl_version
        if self.nccl_choices:
            doc["nccl_choices"] = [c.to_dict() for c in self.nccl_choices]
        return doc


def append_records(path: str | Path, records: Iterable[Record]) -> None:
    """Append records as JSON lines, one ``write`` per record under a lock,
    so jobs appending to one file at once keep every record
    (:func:`~synth.documents.append_lines`; a symlink is refused)."""
    append_lines(path, "measurements", [json.dumps(r.to_dict()) + "\n" for r in records])


def _number(rec: dict, key: str, where: str, kind: type = float) -> Any:
    value = rec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SynthError(f"{where}: '{key}' must be a number, got {value!r}")
    return kind(value)


def record_from_dict(rec: Any, where: str, topology: Topology | None = None, line: int = 0) -> Record:
    """One record; errors name ``where`` (file:line) and the field. With
    ``topology``, the record's topology must equal it."""
    if not isinstance(rec, dict):
        raise SynthError(f"{where}: expected a JSON object")
    check_schema(rec, where, "measurement", SCHEMA, VERSION, required=REQUIRED)
    this = topology_from_dict(rec["topology"], f"{where}: topology")
    if topology is not None and this != topology:
        raise SynthError(f"{where}: topology '{this.name}' differs from the file's first record "
                         f"('{topology.name}'); fit one topology per file")
    try:
        axes = tuple(Axis(str(a["name"]), int(a["size"])) for a in rec["axes"])
        placement = Placement(this, axes, tuple(tuple(int(v) for v in row) for row in rec["matrix"]))
        goal = Goal(rec["collective"])
        size_bytes, median_s = int(rec["size_bytes"]), float(rec["median_s"])
    except SynthError as exc:
        raise SynthError(f"{where}: {exc}") from None
    except (TypeError, ValueError, KeyError):
        raise SynthError(f"{where}: malformed axes, matrix, collective, size_bytes or median_s") from None
    if size_bytes < 1 or not (median_s > 0 and math.isfinite(median_s)):
        raise SynthError(f"{where}: size_bytes must be >= 1 and median_s a positive number")
    reduce_axes = rec["reduce"]
    if not isinstance(reduce_axes, list) or not reduce_axes or any(r not in placement.axis_names for r in reduce_axes):
        raise SynthError(
            f"{where}: 'reduce' must be a non-empty list of declared axes "
            f"({', '.join(placement.axis_names)}), got {reduce_axes!r}"
        )
    reduction = Reduction.of(placement, reduce_axes, goal)
    if not isinstance(rec["program"], str):
        raise SynthError(f"{where}: 'program' must be the program's text")
    program = read_program(rec["program"], f"{where}: program")
    times = rec.get("times_s")
    times = [] if times is None else times
    if not isinstance(times, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
        raise SynthError(f"{where}: 'times_s' must be a list of numbers")
    for key in ("backend", "algo", "dtype", "nccl_version"):
        if rec.get(key) is not None and not isinstance(rec[key], str):
            raise SynthError(f"{where}: '{key}' must be a string or null")
    low, high = _number(rec, "min_s", where), _number(rec, "max_s", where)
    if (low is not None and median_s < low) or (high is not None and median_s > high):
        raise SynthError(f"{where}: median_s {median_s} lies outside min_s..max_s ({low}..{high}); the record is "
                         "inconsistent")
    _check_measurement(rec, where, size_bytes, median_s, times, placement.topology.num_devices)
    return Record(
        reduction, program, size_bytes, median_s,
        is_default=bool(rec.get("is_default", False)),
        backend=rec.get("backend"), algo=rec.get("algo"), dtype=rec.get("dtype"),
        ranks=_number(rec, "ranks", where, int),
        times_s=tuple(float(t) for t in times),
        min_s=_number(rec, "min_s", where), max_s=_number(rec, "max_s", where),
        wrong=_number(rec, "wrong", where, int) or 0,
        nccl_version=rec.get("nccl_version"),
        nccl_choices=_choices(rec.get("nccl_choices"), where),
        line=line,
    )


# what bench writes: the element types of its --dtype (bytes each) and its backends (synth.runtime.bench_report.backend_label)
RECORD_DTYPES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2}
RECORD_BACKENDS = ("mpi", "nccl", "torch-gloo", "torch-nccl", "torch-mpi")


def _check_measurement(rec: dict, where: str, size_bytes: int, median_s: float, times: list, devices: int) -> None:
    """SynthError naming the field of a measurement that cannot be one: a
    time that is not a positive finite number, a median outside the times it
    summarizes (outside min_s..max_s is refused before), a dtype or backend bench does not write,
    a size that is not a whole number of elements, ranks other than the
    topology's devices, a negative count of wrong elements."""
    for key in ("min_s", "max_s"):
        value = rec.get(key)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise SynthError(f"{where}: '{key}' must be a positive finite number of seconds, got {value!r}")
    bad = next((t for t in times if not (math.isfinite(t) and t > 0)), None)
    if bad is not None:
        raise SynthError(f"{where}: 'times_s' must hold positive finite seconds, got {bad!r}")
    if times and not min(times) <= median_s <= max(times):
        raise SynthError(f"{where}: 'median_s' {median_s} lies outside its times_s ({min(times)}..{max(times)}); "
                         "the record is inconsistent")
    dtype = rec.get("dtype")
    if dtype is not None and dtype not in RECORD_DTYPES:
        raise SynthError(f"{where}: 'dtype' {shortened(repr(dtype))} is not an element type bench measures; one of "
                         f"{', '.join(RECORD_DTYPES)}")
    if dtype is not None and size_bytes % RECORD_DTYPES[dtype]:
        raise SynthError(f"{where}: 'size_bytes' {size_bytes} is not a whole number of {dtype} elements "
                         f"({RECORD_DTYPES[dtype]} bytes each)")
    backend = rec.get("backend")
    if backend is not None and backend not in RECORD_BACKENDS:
        raise SynthError(f"{where}: 'backend' {shortened(repr(backend))} is not a backend bench runs; one of "
                         f"{', '.join(RECORD_BACKENDS)}")
    ranks = rec.get("ranks")
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks != devices):
        raise SynthError(f"{where}: 'ranks' {ranks!r} is not the {devices} devices of the record's topology")
    wrong = rec.get("wrong")
    if wrong is not None and (isinstance(wrong, bool) or not isinstance(wrong, int) or wrong < 0):
        raise SynthError(f"{where}: 'wrong' must be a count of wrong elements >= 0, got {wrong!r}")


def _choices(value: Any, where: str) -> tuple[LoggedChoice, ...]:
    """The optional ``nccl_choices`` list; errors name the field and the fix."""
    if value is None:
        return ()
    fields = {"collective": (str, type(None)), "size_bytes": int, "algorithm": str, "protocol": str,
              "channels": (int, type(None)), "calls": int}
    problem = f"{where}: 'nccl_choices' must be a list of {{{', '.join(fields)}}} objects as bench writes them"
    if not isinstance(value, list):
        raise SynthError(problem)
    out = []
    for item in value:
        if (not isinstance(item, dict) or set(item) != set(fields)
                or any(isinstance(item[k], bool) or not isinstance(item[k], t) for k, t in fields.items())):
            raise SynthError(problem)
        out.append(LoggedChoice(**item))
    return tuple(out)


def read_records(path: str | Path) -> tuple[Topology, list[Record]]:
    """Every record of a JSON-lines file (blank lines skipped), all of one
    topology; errors name the file, line and field."""
    topology: Topology | None = None
    out: list[Record] = []
    for where, number, rec in json_lines(path, "measurements"):
        record = record_from_dict(rec, where, topology, number)
        topology = record.reduction.topology
        out.append(record)
    if topology is None:
        raise SynthError(f"{path}: no measurements")
    return topology, out
