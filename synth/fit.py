"""Learn the cost model's parameters from measurements, and score its accuracy.

Measurements are JSON lines written by ``synth-reduce bench --jsonl``, one per
(placement, program, size): ``topology``, ``axes``, ``matrix``, ``reduce``,
``collective``, ``program`` (text), ``size_bytes`` and ``median_s`` are required;
``backend`` and ``algo`` say which algorithm to model (``algo`` if set, else
``mpi`` for the MPI backend, else ``ring``).

Fitting. With the critical flows fixed, a prediction is linear in the per-level
latencies, the per-call overhead and the inverse bandwidths, with one efficiency
per collective in front of its bandwidth terms (see :mod:`synth.cost`).
``fit_profile`` alternates two least-squares solves (levels and overhead with
efficiencies fixed; efficiencies with those fixed), each on relative errors
(rows divided by the measured time, since times span orders of magnitude), and
recomputes the critical flows with the new parameters, until the parameters
settle. Efficiencies are fitted only on request (``efficiency=True``, ``fit
--efficiency``): on the emulated cluster they lowered the error but made the
ranking worse (docs/results.md), so by default the prior's are kept. Fitted
efficiencies are relative to AllReduce (fixed at 1) when AllReduce was measured.
Levels no record exercises keep their prior values.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .cost import ALGORITHMS, Features, Predictor, Profile, lowered_loads
from .documents import read_document, write_document
from .errors import SynthError
from .language import Collective, Program, parse_program
from .lowering import lower
from .placement import Axis, Placement
from .semantics import Goal
from .topology import Topology, topology_from_dict

PROFILE_SCHEMA = "synth-reduce/profile"
PROFILE_VERSION = 1
_REQUIRED = ("topology", "axes", "matrix", "reduce", "collective", "program", "size_bytes", "median_s")


# ---------------------------------------------------------------- profiles


def profile_document(profile: Profile, report: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema": PROFILE_SCHEMA,
        "version": PROFILE_VERSION,
        "topology": profile.topology,
        "levels": [
            {"name": n, "bandwidth_GBps": b, "latency_us": l}
            for n, b, l in zip(profile.level_names, profile.bandwidth_GBps, profile.latency_us)
        ],
        "efficiency": dict(profile.efficiency),
        "call_overhead_us": profile.call_overhead_us,
        "fit": report or {},
    }


def save_profile(path: str | Path, profile: Profile, report: dict[str, Any] | None = None) -> None:
    write_document(path, "profile", profile_document(profile, report))


def load_profile(path: str | Path) -> Profile:
    source = str(path)
    doc = read_document(path, "profile", PROFILE_SCHEMA, PROFILE_VERSION, fix="re-fit it with synth-reduce fit")
    try:
        levels = doc["levels"]
        efficiency = {c.value: float(doc["efficiency"].get(c.value, 1.0)) for c in Collective}
        profile = Profile(
            topology=str(doc["topology"]),
            level_names=tuple(str(lv["name"]) for lv in levels),
            bandwidth_GBps=tuple(float(lv["bandwidth_GBps"]) for lv in levels),
            latency_us=tuple(float(lv["latency_us"]) for lv in levels),
            efficiency=tuple(efficiency.items()),
            call_overhead_us=float(doc.get("call_overhead_us", 0.0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise SynthError(f"{source}: not a valid profile: expected topology, levels[{{name, bandwidth_GBps, latency_us}}], efficiency, optional call_overhead_us") from None
    if not (profile.call_overhead_us >= 0 and math.isfinite(profile.call_overhead_us)):
        raise SynthError(f"{source}: call_overhead_us must be a non-negative number")
    if any(not (b > 0 and math.isfinite(b)) for b in profile.bandwidth_GBps) or any(
        not (e > 0 and math.isfinite(e)) for _, e in profile.efficiency
    ):
        raise SynthError(f"{source}: bandwidths and efficiencies must be positive numbers")
    return profile


# ---------------------------------------------------------------- measurements


@dataclass(frozen=True)
class Measurement:
    line: int
    placement: Placement
    reduce_axes: tuple[str, ...]
    goal: Goal
    program: Program
    loads: tuple[tuple[int, ...], ...]
    size_bytes: int
    algo: str
    median_s: float

    @property
    def case(self) -> tuple:
        """Placement x reduction x size x algorithm: programs compared in a case."""
        return (self.placement.matrix, self.reduce_axes, self.goal, self.size_bytes, self.algo)


def load_measurements(path: str | Path) -> tuple[Topology, list[Measurement]]:
    """Read and check a JSON-lines file; errors name the file, line and field."""
    source = str(path)
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise SynthError(f"{source}: no such measurements file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SynthError(f"{source}: cannot read measurements ({exc})") from None
    topology: Topology | None = None
    out: list[Measurement] = []
    lowered_cache: dict[tuple, Any] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SynthError(f"{where}: not valid JSON ({exc.msg})") from None
        missing = [k for k in _REQUIRED if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise SynthError(f"{where}: missing field(s) {', '.join(missing)}")
        this = topology_from_dict(rec["topology"], f"{where}: topology")
        if topology is None:
            topology = this
        elif this != topology:
            raise SynthError(f"{where}: topology '{this.name}' differs from the file's first record ('{topology.name}'); fit one topology per file")
        try:
            axes = tuple(Axis(str(a["name"]), int(a["size"])) for a in rec["axes"])
            placement = Placement(topology, axes, tuple(tuple(int(v) for v in row) for row in rec["matrix"]))
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
        reduce_axes = tuple(a for a in placement.axis_names if a in reduce_axes)
        algo = rec.get("algo") or ("mpi" if rec.get("backend") == "mpi" else "ring")
        if algo not in ALGORITHMS:
            raise SynthError(f"{where}: unknown algo {algo!r}; use one of {', '.join(ALGORITHMS)}")
        try:
            program = parse_program(str(rec["program"]), f"{where}: program")
            key = (placement, reduce_axes, goal, program)
            if key not in lowered_cache:
                lowered_cache[key] = lowered_loads(lower(program, placement, reduce_axes, goal))
        except SynthError as exc:
            raise SynthError(f"{where}: unknown program for this placement: {exc}") from None
        out.append(Measurement(number, placement, reduce_axes, goal, program,
                               tuple(lowered_cache[key]), size_bytes, algo, median_s))
    if topology is None:
        raise SynthError(f"{source}: no measurements")
    return topology, out


# ---------------------------------------------------------------- fitting


class _Model:
    """Predictors per (placement, reduction, algorithm) for one profile."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._predictors: dict[tuple, Predictor] = {}

    def predictor(self, m: Measurement) -> Predictor:
        key = (m.placement, m.reduce_axes, m.algo)
        if key not in self._predictors:
            self._predictors[key] = Predictor(m.placement, m.reduce_axes, m.algo, self.profile)
        return self._predictors[key]

    def predict(self, m: Measurement) -> float:
        return self.predictor(m).program(m.program, m.loads, m.size_bytes)

    def features(self, m: Measurement) -> Features:
        return self.predictor(m).features(m.program, m.loads, m.size_bytes)


def predict_all(profile: Profile, measurements: Sequence[Measurement]) -> np.ndarray:
    model = _Model(profile)
    return np.array([model.predict(m) for m in measurements])


@dataclass(frozen=True)
class FitReport:
    records: int
    iterations: int
    median_rel_error: float
    mean_rel_error: float
    max_rel_error: float
    rmse_s: float

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _solve_nonnegative(a: np.ndarray, b: np.ndarray, floor: float) -> np.ndarray:
    """Least squares with unused columns left at 0 and the rest kept >= floor
    (columns that want to go below are pinned at the floor and the rest re-solved)."""
    active = np.abs(a).sum(axis=0) > 0
    x = np.zeros(a.shape[1])
    for _ in range(a.shape[1]):
        cols = np.flatnonzero(active)
        if len(cols) == 0:
            break
        pinned = ~active & (np.abs(a).sum(axis=0) > 0)
        rhs = b - a[:, pinned] @ np.full(pinned.sum(), floor)
        sol, *_ = np.linalg.lstsq(a[:, cols], rhs, rcond=None)
        if (sol >= floor).all():
            x[cols] = sol
            x[pinned] = floor
            return x
        active[cols[sol < floor]] = False
    x[np.abs(a).sum(axis=0) > 0] = floor
    return x


def fit_profile(
    measurements: Sequence[Measurement], prior: Profile, iterations: int = 8, efficiency: bool = False
) -> tuple[Profile, FitReport]:
    """Least-squares fit of per-level latency and bandwidth and the per-call
    overhead, and with ``efficiency`` of per-collective efficiencies (else the
    prior's are kept; see the module docstring)."""
    profile = prior
    levels = len(prior.level_names)
    measured = np.array([m.median_s for m in measurements])
    weight = 1.0 / measured
    collectives = sorted({i.collective for m in measurements for i in m.program.instructions}, key=lambda c: c.value)
    done = 0
    for done in range(1, iterations + 1):
        model = _Model(profile)
        feats = [model.features(m) for m in measurements]
        eff = {c: profile.efficiency_of(c) for c in Collective}
        # 1. levels: unknowns latency_s[l], call overhead s, inverse bandwidth s/byte[l]
        a = np.array([
            np.concatenate([f.latency_count, [f.calls], sum((x / eff[c] for c, x in f.load.items()), np.zeros(levels))])
            for f in feats
        ])
        theta = _solve_nonnegative(a * weight[:, None], measured * weight, floor=1e-15)
        lat = np.where(a[:, :levels].any(axis=0), theta[:levels] * 1e6, prior.latency_us)
        overhead_us = float(theta[levels] * 1e6) if a[:, levels].any() else prior.call_overhead_us
        inv_bw = theta[levels + 1:]
        exercised = a[:, levels + 1:].any(axis=0)  # levels some record's bandwidth term uses
        bw = np.where(exercised, 1.0 / np.maximum(inv_bw, 1e-15) / 1e9, prior.bandwidth_GBps)
        # 2. efficiencies: unknown 1/efficiency[c], levels and overhead fixed
        inv_bw_now = 1.0 / (bw * 1e9)
        latency_part = np.array([f.latency_count @ (lat * 1e-6) + f.calls * overhead_us * 1e-6 for f in feats])
        b_cols = np.array([[float(f.load.get(c, np.zeros(levels)) @ inv_bw_now) for c in collectives] for f in feats])
        u = _solve_nonnegative(b_cols * weight[:, None], (measured - latency_part) * weight, floor=1e-3)
        new_eff = dict(eff)
        for c, value in zip(collectives, u) if efficiency else ():
            if b_cols[:, collectives.index(c)].any():
                new_eff[c] = 1.0 / value
        # efficiencies are relative: AllReduce (or the first measured collective) is 1
        anchor = Collective.ALLREDUCE if Collective.ALLREDUCE in collectives else (collectives[0] if collectives else None)
        scale = new_eff[anchor] if anchor is not None and efficiency else 1.0
        new = Profile(
            topology=prior.topology,
            level_names=prior.level_names,
            bandwidth_GBps=tuple(float(v) * (scale if used else 1.0) for v, used in zip(bw, exercised)),
            latency_us=tuple(float(v) for v in lat),
            efficiency=tuple((c.value, new_eff[c] / scale) for c in Collective),
            call_overhead_us=overhead_us,
        )
        change = max(
            abs(math.log(n / o)) for n, o in zip(new.bandwidth_GBps + tuple(e for _, e in new.efficiency),
                                                 profile.bandwidth_GBps + tuple(e for _, e in profile.efficiency))
        )
        profile = new
        if change < 1e-6:
            break
    predicted = predict_all(profile, measurements)
    rel = np.abs(predicted - measured) / measured
    report = FitReport(
        records=len(measurements),
        iterations=done,
        median_rel_error=float(np.median(rel)),
        mean_rel_error=float(rel.mean()),
        max_rel_error=float(rel.max()),
        rmse_s=float(np.sqrt(((predicted - measured) ** 2).mean())),
    )
    return profile, report


# ---------------------------------------------------------------- accuracy


@dataclass(frozen=True)
class Accuracy:
    cases: int
    top_k: dict[int, float]  # k -> share of cases whose measured best is in the k predicted best
    spearman_mean: float
    median_rel_error: float
    records: int


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return 1.0
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if ra.std() == 0 or rb.std() == 0:
        return 1.0
    return float(np.corrcoef(ra, rb)[0, 1])


def measured_best_position(predicted: np.ndarray, measured: np.ndarray) -> int:
    """Where the measured-fastest program of a case stands in the predicted
    order (0 = predicted fastest; predicted ties keep the records' order; of
    programs tied for the fastest measured time, the best placed counts)."""
    position = np.argsort(np.argsort(predicted, kind="stable"), kind="stable")
    return int(position[measured == measured.min()].min())


def accuracy(profile: Profile, measurements: Sequence[Measurement], ks: Iterable[int] = (1, 3, 5, 10)) -> Accuracy:
    """Top-k accuracy over cases with at least two programs, mean Spearman
    correlation per case, and median relative error over all records."""
    predicted = predict_all(profile, measurements)
    measured = np.array([m.median_s for m in measurements])
    cases: dict[tuple, list[int]] = {}
    for i, m in enumerate(measurements):
        cases.setdefault(m.case, []).append(i)
    compared = [idx for idx in cases.values() if len(idx) >= 2]
    hits = {k: 0 for k in ks}
    rhos = []
    for idx in compared:
        p, t = predicted[idx], measured[idx]
        position = measured_best_position(p, t)
        for k in hits:
            hits[k] += position < k
        rhos.append(_spearman(p, t))
    n = len(compared)
    return Accuracy(
        cases=n,
        top_k={k: hits[k] / n if n else float("nan") for k in hits},
        spearman_mean=float(np.mean(rhos)) if rhos else float("nan"),
        median_rel_error=float(np.median(np.abs(predicted - measured) / measured)),
        records=len(measurements),
    )


def split_cases(measurements: Sequence[Measurement], holdout: float, seed: int = 0) -> tuple[list[Measurement], list[Measurement]]:
    """(fit set, held-out set): whole cases go to one side or the other."""
    if not 0 < holdout < 1:
        raise SynthError(f"--holdout {holdout}: give the held-out fraction of cases, between 0 and 1")
    keys = sorted({m.case for m in measurements}, key=repr)
    random.Random(seed).shuffle(keys)
    held = set(keys[: max(1, round(holdout * len(keys)))])
    if len(held) == len(keys):
        raise SynthError("--holdout leaves no case to fit on; measure more cases or hold out less")
    return [m for m in measurements if m.case not in held], [m for m in measurements if m.case in held]
