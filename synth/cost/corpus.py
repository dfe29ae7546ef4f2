"""The NCCL calibration corpus: public measurements of single NCCL calls
(``data/nccl/*.jsonl``, format in data/nccl/README.md) as measured calls on a
topology, for :mod:`synth.cost.fit`.

A corpus line is one call of a collective over ``ranks`` GPUs. On a topology it
is the call over the first ``ranks`` devices (device ids are node-major, so a
run over ``n`` whole nodes is nodes ``0..n-1``, and a run on 5 of a node's 8
GPUs is GPUs 0..4 of node 0). Its time is ``time_us`` where the source prints
it, else ``size / algbw``, else ``size / (busbw / factor)`` with nccl-tests'
bus-bandwidth factor (all-reduce ``2(n-1)/n``, reduce-scatter and all-gather
``(n-1)/n``, others 1), each marked ``derived``. ``algo`` (``NCCL_ALGO``) forces
the algorithm; ``NCCL_NVLS_ENABLE=0`` in ``env`` or ``"nvls": false`` in
``system`` turns NVLS off; ``NCCL_ALGO`` in ``env`` (a list, ``^`` to exclude)
restricts the algorithms NCCL chooses from, ``proto`` or ``NCCL_PROTO`` the
protocols. A set whose run applied NCCL variables its lines do not print gets
them from :data:`RUN_ENVIRONMENT` (the setup its source names documents them).
Send/receive and all-to-all are not collectives the model has, nor is CollNet;
such lines are skipped and counted, as are lines whose only number is a
bandwidth printed as 0.00.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..documents import json_lines
from ..errors import SynthError
from ..synthesis.language import Collective
from .nccl import PROTOCOLS, call_type

COLLECTIVES = {
    "allreduce": Collective.ALLREDUCE, "reducescatter": Collective.REDUCESCATTER, "allgather": Collective.ALLGATHER,
    "broadcast": Collective.BROADCAST, "reduce": Collective.REDUCE,
}
FORCED = {"Ring": "ring", "Tree": "tree", "NVLS": "nvls", "NVLSTree": "nvlstree", "PAT": "pat"}
REQUIRED = ("set", "source", "system", "collective", "size_bytes", "ranks")

# corpus set -> NCCL variables its run applied, not printed by the source: the run sourced
# /var/lib/tcpxo/lib64/nccl-env-profile.sh of the GPUDirect-TCPXO plugin image (data/nccl/README.md); Google's
# A3 Mega setup of the same release line states that profile's choice variables as "NCCL_ALGO=Ring,Tree",
# "NCCL_PROTO=Simple", "NCCL_NVLS_ENABLE=0" (GoogleCloudPlatform/cluster-toolkit,
# examples/machine-learning/a3-megagpu-8g/nemo-framework/Dockerfile, commit 5417609, over /var/lib/tcpxo/lib64)
TCPXO_PROFILE = {"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple", "NCCL_NVLS_ENABLE": "0"}
RUN_ENVIRONMENT = {"a3mega-2x8-allreduce": TCPXO_PROFILE}


@dataclass(frozen=True)
class CorpusCall:
    """One measured call from the corpus (see the module docstring)."""

    set: str
    source: str
    collective: Collective
    size_bytes: int
    time_s: float
    derived: bool  # time computed from algbw or busbw
    ranks: int
    algo: str | None  # forced algorithm (synth.cost Algorithm value), None: NCCL's choice
    algo_reported: str | None  # what the source says NCCL chose (NCCL's spelling)
    nvls_enabled: bool
    where: str  # file:line
    tool: str = "nccl-tests"  # what timed it (a PyTorch loop adds its own per-call overhead)
    nccl_version: str | None = None  # as the source states it (None: not stated)
    dtype: str = "float32"  # NCCL's name (synth.cost.nccl.DTYPES) of nccl-tests' type column
    op: str = "sum"  # its redop column
    allowed: tuple[str, ...] | None = None  # algorithms NCCL_ALGO lets NCCL choose from (None: all)
    protocols: tuple[str, ...] | None = None  # protocols of NCCL_PROTO (None: all)


def is_corpus_line(doc: object) -> bool:
    """A corpus line has ``set`` and ``system`` and no measurement ``schema``."""
    return isinstance(doc, dict) and "set" in doc and "system" in doc and "schema" not in doc


def bus_factor(collective: Collective, ranks: int) -> float:
    """nccl-tests' busbw / algbw for a collective over ``ranks``."""
    if collective is Collective.ALLREDUCE:
        return 2 * (ranks - 1) / ranks
    if collective in (Collective.REDUCESCATTER, Collective.ALLGATHER):
        return (ranks - 1) / ranks
    return 1.0


def call_from_dict(doc: dict, where: str) -> CorpusCall | None:
    """The call of one corpus line; None for a line the model does not cover
    (send/receive, all-to-all, CollNet). Errors name ``where`` and the field."""
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise SynthError(f"{where}: corpus line without field(s) {', '.join(missing)}")
    collective = COLLECTIVES.get(doc["collective"])
    forced = doc.get("algo")
    if collective is None or (forced is not None and forced not in FORCED):
        return None
    size, ranks = doc["size_bytes"], doc["ranks"]
    if not (isinstance(size, int) and size > 0 and isinstance(ranks, int) and ranks >= 1):
        raise SynthError(f"{where}: 'size_bytes' and 'ranks' must be positive integers")
    timed = _seconds(doc, collective, size, ranks, where)
    if timed is None:
        return None
    seconds, derived = timed
    env = {**RUN_ENVIRONMENT.get(str(doc["set"]), {}), **(doc.get("env") or {})}
    system = doc["system"] if isinstance(doc["system"], dict) else {}
    nvls = not (str(env.get("NCCL_NVLS_ENABLE", "")) == "0" or system.get("nvls") is False)
    call = CorpusCall(str(doc["set"]), str(doc["source"]), collective, size, seconds, derived, ranks,
                      FORCED[forced] if forced else None, doc.get("algo_reported"), nvls, where,
                      str(doc.get("tool") or "nccl-tests"), _version(doc.get("nccl_version")),
                      *_call_type(doc, where))
    if doc.get("proto") is not None:  # the format's own field for NCCL_PROTO
        call = with_environment(call, {"NCCL_PROTO": doc["proto"]}, f"{where}: field 'proto'")
    return with_environment(call, env, f"{where}: field 'env'") if env else call


def with_environment(call: CorpusCall, env: dict, where: str) -> CorpusCall:
    """``call`` run under NCCL variables ``env``: ``NCCL_NVLS_ENABLE=0`` turns
    NVLS off, ``NCCL_ALGO`` (unless the line forces one algorithm) and
    ``NCCL_PROTO`` restrict NCCL's choice (lists as NCCL reads them: names
    separated by commas, case-insensitive, ``^`` first to exclude them).
    SynthError naming ``where`` for a name NCCL would not know."""
    nvls = call.nvls_enabled and str(env.get("NCCL_NVLS_ENABLE", "")) != "0"
    allowed = call.allowed
    if "NCCL_ALGO" in env and call.algo is None:
        allowed = _nccl_list(env["NCCL_ALGO"], {k.lower(): v for k, v in FORCED.items()}, "NCCL_ALGO", where)
    protocols = call.protocols
    if "NCCL_PROTO" in env:
        protocols = _nccl_list(env["NCCL_PROTO"], {p.lower(): p for p in PROTOCOLS}, "NCCL_PROTO", where)
    return replace(call, nvls_enabled=nvls, allowed=allowed, protocols=protocols)


def _nccl_list(text: object, names: dict[str, str], variable: str, where: str) -> tuple[str, ...]:
    """The names an NCCL list variable selects, in ``names``' order."""
    raw = str(text).strip()
    exclude = raw.startswith("^")
    given = [t.strip().lower() for t in raw.lstrip("^").split(",") if t.strip()]
    unknown = [t for t in given if t not in names]
    if unknown or not given:
        raise SynthError(f"{where}: {variable}={text!r}: expected names among {', '.join(names.values())}")
    picked = tuple(v for k, v in names.items() if (k in given) != exclude)
    if not picked:
        raise SynthError(f"{where}: {variable}={text!r} leaves nothing to choose")
    return picked


def _call_type(doc: dict, where: str) -> tuple[str, str]:
    """(NCCL's data type, reduction) of a line (:func:`synth.cost.nccl.call_type`);
    float and sum where not printed."""
    try:
        return call_type(doc.get("dtype") or "float", doc.get("redop") or "sum")
    except SynthError as exc:
        raise SynthError(f"{where}: fields 'dtype', 'redop': {exc}") from None


def _version(text: object) -> str | None:
    """``2.18.5`` of a stated version such as ``2.18.5`` or ``2.26.2+cuda12.8``; None when not stated."""
    if not isinstance(text, str):
        return None
    head = text.split("+")[0].split("-")[0].strip()
    parts = head.split(".")
    return head if len(parts) >= 2 and all(p.isdigit() for p in parts) else None


def _seconds(doc: dict, collective: Collective, size: int, ranks: int, where: str) -> tuple[float, bool] | None:
    """(seconds, derived) of a line; None when the only number is a bandwidth
    printed as 0.00 (too small for its two decimals)."""
    for key in ("time_us", "algbw_GBps", "busbw_GBps"):
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise SynthError(f"{where}: '{key}' must be a non-negative number or null, got {value!r}")
    if doc.get("time_us"):
        return doc["time_us"] * 1e-6, False
    if doc.get("algbw_GBps"):
        return size / (doc["algbw_GBps"] * 1e9), True
    if doc.get("busbw_GBps"):
        return size / (doc["busbw_GBps"] / bus_factor(collective, ranks) * 1e9), True
    if all(doc.get(k) is None for k in ("time_us", "algbw_GBps", "busbw_GBps")):
        raise SynthError(f"{where}: no time_us, algbw_GBps or busbw_GBps: nothing measured")
    return None


def read_corpus(path: str | Path) -> tuple[list[CorpusCall], int]:
    """The calls of a corpus file and the number of lines skipped (not modelled)."""
    calls, skipped = [], 0
    for where, _, doc in json_lines(path, "measurements"):
        if not is_corpus_line(doc):
            raise SynthError(f"{where}: not an NCCL corpus line (expected set, source, system, ...; "
                             f"see data/nccl/README.md); one format per file")
        call = call_from_dict(doc, where)
        if call is None:
            skipped += 1
        else:
            calls.append(call)
    return calls, skipped
