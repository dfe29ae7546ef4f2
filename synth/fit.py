"""Learn the cost model's parameters from measurements, and score its accuracy.

Measurements are the records of :mod:`synth.records` (JSON lines written by
``synth-reduce bench --jsonl``); each is modelled with the algorithm it names
(``Record.algorithm``: ``algo`` if set, else ``mpi`` for the MPI backend, else
``ring``).

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

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .cost import Algorithm, Features, Model, Predictor, Profile, lowered_loads
from .errors import SynthError
from .language import Collective, Program
from .lowering import lower
from .records import Record, read_records
from .reduction import Reduction
from .semantics import Loads
from .topology import Topology


# ---------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    """A measurement record with what the model needs: the chunks each step of
    its program moves and the algorithm to model it with."""

    record: Record
    loads: tuple[Loads, ...]
    algorithm: Algorithm

    @property
    def reduction(self) -> Reduction:
        return self.record.reduction

    @property
    def program(self) -> Program:
        return self.record.program

    @property
    def size_bytes(self) -> int:
        return self.record.size_bytes

    @property
    def median_s(self) -> float:
        return self.record.median_s

    @property
    def line(self) -> int:
        return self.record.line

    @property
    def case(self) -> tuple:
        return self.record.case


def samples_of(records: Sequence[Record], source: str = "measurements") -> list[Sample]:
    """Samples of records; each distinct (reduction, program) is lowered once.
    Errors name ``source:line``."""
    loads: dict[tuple[Reduction, Program], tuple[Loads, ...]] = {}
    out = []
    for record in records:
        where = f"{source}:{record.line}" if record.line else source
        try:
            algorithm = Algorithm.from_text(record.algorithm)
        except SynthError:
            raise SynthError(f"{where}: unknown algo {record.algorithm!r}; use one of "
                             f"{', '.join(a.value for a in Algorithm)}") from None
        key = (record.reduction, record.program)
        if key not in loads:
            try:
                loads[key] = tuple(lowered_loads(lower(record.program, record.reduction)))
            except SynthError as exc:
                raise SynthError(f"{where}: unknown program for this placement: {exc}") from None
        out.append(Sample(record, loads[key], algorithm))
    return out


def load_samples(path: str | Path) -> tuple[Topology, list[Sample]]:
    """Read a measurements file (:func:`synth.records.read_records`) into samples."""
    topology, records = read_records(path)
    return topology, samples_of(records, str(path))


# ---------------------------------------------------------------- fitting


class _Predictors:
    """Predictors per (reduction, algorithm) for one profile."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._predictors: dict[tuple, Predictor] = {}

    def predictor(self, s: Sample) -> Predictor:
        key = (s.reduction, s.algorithm)
        if key not in self._predictors:
            self._predictors[key] = Predictor(s.reduction, Model(s.algorithm, self.profile))
        return self._predictors[key]

    def predict(self, s: Sample) -> float:
        return self.predictor(s).program(s.program, s.loads, s.size_bytes)

    def features(self, s: Sample) -> Features:
        return self.predictor(s).features(s.program, s.loads, s.size_bytes)


def predict_all(profile: Profile, samples: Sequence[Sample]) -> np.ndarray:
    predictors = _Predictors(profile)
    return np.array([predictors.predict(s) for s in samples])


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
    measurements: Sequence[Sample], prior: Profile, iterations: int = 8, efficiency: bool = False
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
        predictors = _Predictors(profile)
        feats = [predictors.features(m) for m in measurements]
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


def accuracy(profile: Profile, measurements: Sequence[Sample], ks: Iterable[int] = (1, 3, 5, 10)) -> Accuracy:
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


def split_cases(measurements: Sequence[Sample], holdout: float, seed: int = 0) -> tuple[list[Sample], list[Sample]]:
    """(fit set, held-out set): whole cases go to one side or the other."""
    if not 0 < holdout < 1:
        raise SynthError(f"--holdout {holdout}: give the held-out fraction of cases, between 0 and 1")
    keys = sorted({m.case for m in measurements}, key=repr)
    random.Random(seed).shuffle(keys)
    held = set(keys[: max(1, round(holdout * len(keys)))])
    if len(held) == len(keys):
        raise SynthError("--holdout leaves no case to fit on; measure more cases or hold out less")
    return [m for m in measurements if m.case not in held], [m for m in measurements if m.case in held]
