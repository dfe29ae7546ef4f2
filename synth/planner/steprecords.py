"""Step-time records: one JSON line per measured training configuration, what
``synth-reduce fit`` learns the planner's compute-efficiency curve from.

Format (``"schema": "synth-reduce/step"``, ``"version": 1``), required fields:

* ``topology``: the topology object (as in plans), with its ``device``;
* ``model``: the model's fields (``layers``, ``hidden``, ``heads``, ``seq``,
  ``vocab`` and optionally ``ffn``, ``kv_heads``, ``gated_mlp`` or ``mlp``,
  ``biases``, ``norm``, ``positions``, ``tied_embeddings``, ``name``; as in
  ``models/*.yaml``);
* ``training``: ``global_batch`` and optionally ``dtype`` (bf16), ``sharding``
  (none), ``recompute`` (none), ``overlap_dp`` (true), ``attention`` (flash),
  ``sequence_parallel`` (true: Megatron-LM's, where tp > 1), ``tp_overlap``
  (false), ``cp_comm`` (ring; or allgather: Llama 3's context parallelism);
* ``axes`` (``{name, size}`` with names among tp, dp, pp; an axis left out has
  size 1) and ``matrix``: the placement the run used;
* ``micro_batch``; ``step_s``: the measured seconds of one training step.

Optional: ``virtual_stages`` (interleaved 1F1B, default 1), ``algo`` (the
collective algorithm to model the run's communication with, default ``ring``),
``source`` (where the measurement comes from). A reader refuses a line of
another schema or version, or with a missing or malformed field, naming the
file, line and field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..documents import MAX_DOCUMENT_BYTES, check_schema, json_lines, parse_json
from ..errors import SynthError
from ..synthesis.placement import Axis, Placement
from ..topology import Device, Topology, topology_from_dict
from .activations import Recompute
from .modelspec import model_from_dict
from .stepmodel import Configuration, Sharding, Training, configuration_problem
from .transformer import Transformer

SCHEMA = "synth-reduce/step"
VERSION = 1
REQUIRED = ("topology", "model", "training", "axes", "matrix", "micro_batch", "step_s")
AXES = ("tp", "dp", "pp")


@dataclass(frozen=True)
class StepRecord:
    """A measured training step: the configuration, its placement and seconds."""

    model: Transformer
    training: Training
    placement: Placement
    config: Configuration
    step_s: float
    algo: str = "ring"
    source: str = ""
    line: int = field(default=0, compare=False)

    @property
    def topology(self) -> Topology:
        return self.placement.topology

    @property
    def device(self) -> Device:
        assert self.topology.device is not None  # checked when read
        return self.topology.device

    def to_dict(self) -> dict[str, Any]:
        m = self.model
        model = {"name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "seq": m.seq,
                 "vocab": m.vocab}
        if m.ffn != 4 * m.hidden:
            model["ffn"] = m.ffn
        if m.kv_heads != m.heads:
            model["kv_heads"] = m.kv_heads
        model.update(m.architecture_fields())
        doc: dict[str, Any] = {
            "schema": SCHEMA, "version": VERSION,
            "topology": self.topology.to_dict(),
            "model": model,
            "training": self.training.to_dict(),
            "axes": [{"name": a.name, "size": a.size} for a in self.placement.axes],
            "matrix": [list(row) for row in self.placement.matrix],
            "micro_batch": self.config.micro_batch,
            "virtual_stages": self.config.virtual_stages,
            "algo": self.algo,
            "step_s": self.step_s,
        }
        if self.source:
            doc["source"] = self.source
        return doc


def write_step_records(path: str | Path, records: Iterable[StepRecord]) -> None:
    text = "".join(json.dumps(r.to_dict()) + "\n" for r in records)
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise SynthError(f"{path}: cannot write step records ({exc.strerror})") from None


def _positive_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SynthError(f"{where}: '{name}' must be an integer >= 1, got {value!r}")
    return value


def _training(raw: Any, where: str) -> Training:
    if not isinstance(raw, dict):
        raise SynthError(f"{where}: 'training' must be an object with global_batch")
    known = ("global_batch", "dtype", "sharding", "recompute", "overlap_dp", "attention", "sequence_parallel",
             "tp_overlap", "cross_entropy", "framework", "overlap_param_gather", "ep_overlap", "cp_comm")
    for key in raw:
        if key not in known:
            raise SynthError(f"{where}: unknown training field '{key}'; known fields are {', '.join(known)}")
    if "global_batch" not in raw:
        raise SynthError(f"{where}: missing field 'training.global_batch'")
    overlap = raw.get("overlap_dp", True)
    if not isinstance(overlap, bool):
        raise SynthError(f"{where}: 'training.overlap_dp' must be true or false")
    flags = {}
    for key, default in (("sequence_parallel", True), ("tp_overlap", False), ("overlap_param_gather", False),
                         ("ep_overlap", False)):
        flags[key] = raw.get(key, default)
        if not isinstance(flags[key], bool):
            raise SynthError(f"{where}: 'training.{key}' must be true or false")
    try:
        return Training(_positive_int(raw["global_batch"], where, "training.global_batch"),
                        str(raw.get("dtype", "bf16")),
                        Sharding.from_text(str(raw.get("sharding", "none")), "training.sharding"),
                        Recompute.from_text(str(raw.get("recompute", "none")), "training.recompute"), overlap,
                        str(raw.get("attention", "flash")), flags["sequence_parallel"], flags["tp_overlap"],
                        str(raw.get("cross_entropy", "fused")), str(raw.get("framework", "megatron")),
                        flags["overlap_param_gather"], flags["ep_overlap"], str(raw.get("cp_comm", "ring")))
    except SynthError as exc:
        raise SynthError(f"{where}: {exc}") from None


def step_record_from_dict(rec: Any, where: str, line: int = 0) -> StepRecord:
    """One record; errors name ``where`` (file:line) and the field."""
    if not isinstance(rec, dict):
        raise SynthError(f"{where}: expected a JSON object")
    check_schema(rec, where, "step record", SCHEMA, VERSION, required=REQUIRED)
    topology = topology_from_dict(rec["topology"], f"{where}: topology")
    if topology.device is None:
        raise SynthError(f"{where}: the topology has no 'device' (memory_GiB, peak_TFLOPs); a step record needs "
                         "the device it ran on")
    model = model_from_dict(rec["model"], f"{where}: model")
    training = _training(rec["training"], where)
    try:
        axes = tuple(Axis(str(a["name"]), int(a["size"])) for a in rec["axes"])
        matrix = tuple(tuple(int(v) for v in row) for row in rec["matrix"])
    except (TypeError, ValueError, KeyError):
        raise SynthError(f"{where}: 'axes' must be a list of {{name, size}} and 'matrix' a list of integer "
                         "rows") from None
    for a in axes:
        if a.name not in AXES:
            raise SynthError(f"{where}: unknown axis '{a.name}' in 'axes'; step records use tp, dp and pp")
    try:
        placement = Placement(topology, axes, matrix)
    except SynthError as exc:
        raise SynthError(f"{where}: {exc}") from None
    sizes = {a.name: a.size for a in axes}
    config = Configuration(sizes.get("tp", 1), sizes.get("dp", 1), sizes.get("pp", 1),
                           _positive_int(rec["micro_batch"], where, "micro_batch"),
                           _positive_int(rec.get("virtual_stages", 1), where, "virtual_stages"))
    problem = configuration_problem(model, training, config)
    if problem:
        raise SynthError(f"{where}: {problem}")
    step_s = rec["step_s"]
    if isinstance(step_s, bool) or not isinstance(step_s, (int, float)) or not (step_s > 0 and math.isfinite(step_s)):
        raise SynthError(f"{where}: 'step_s' must be a positive number of seconds, got {step_s!r}")
    for key in ("algo", "source"):
        if key in rec and not isinstance(rec[key], str):
            raise SynthError(f"{where}: '{key}' must be a string")
    return StepRecord(model, training, placement, config, float(step_s), rec.get("algo", "ring"),
                      rec.get("source", ""), line)


def read_step_records(path: str | Path) -> list[StepRecord]:
    """Every record of a JSON-lines file (blank lines skipped); errors name the
    file, line and field."""
    out = [step_record_from_dict(rec, where, number) for where, number, rec in json_lines(path, "step records")]
    if not out:
        raise SynthError(f"{path}: no step records")
    return out


def first_schema(path: str | Path) -> str | None:
    """The ``schema`` of a JSON-lines file's first record (None if unreadable):
    how ``fit`` tells step records from measurements."""
    try:
        with open(path, "rb") as f:
            scanned = 0
            while scanned <= MAX_DOCUMENT_BYTES:  # a device such as /dev/zero has no end and no line break
                line = f.readline(MAX_DOCUMENT_BYTES + 1 - scanned)
                if not line:
                    return None
                scanned += len(line)
                if line.strip():
                    rec = parse_json(line.decode("utf-8"))
                    return rec.get("schema") if isinstance(rec, dict) else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return None  # past the cap: the reader of the records says so
