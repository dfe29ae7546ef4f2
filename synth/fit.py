"""Learn the cost model's parameters from measurements, and score its accuracy.

Two kinds of measurement:

* programs (:class:`Sample`): the records of :mod:`synth.records` (JSON lines
  written by ``synth-reduce bench --jsonl``), each modelled with the algorithm it
  names (``Record.algorithm``); a record whose result was wrong (``wrong`` > 0)
  is refused: its time measures a broken run;
* single calls (:class:`CallSample`): the NCCL corpus (:mod:`synth.corpus`), a
  collective over a group of a topology given on the command line, modelled by
  NCCL's choice or the algorithm the run forced.

Fitting. With the critical flows and NCCL's choices fixed, a prediction is
linear in the parameters (:class:`synth.cost.Features`): per level the MPI
latency, the NCCL step latency per protocol and the inverse bandwidth, the MPI
per-call overhead, the NCCL base latency per ``algorithm.protocol``, and one
inverse efficiency per key in front of its bandwidth terms. ``fit_profile``
alternates two least-squares solves on relative errors (rows divided by the
measured time): the level and latency parameters with the efficiencies fixed,
then the efficiencies with those fixed; it recomputes the critical flows and
repeats until the parameters settle (at most 8 rounds).

Identification. A parameter keeps its prior, and is reported, when the records
cannot identify it: no record exercises it; it is not separable from others
(the design matrix is rank-deficient: the first of the collinear parameters in
the order base latencies, NCCL step latencies, MPI latencies, call overhead,
bandwidths is kept at its prior until the rest are separable); the solve puts it
at or below zero; or, with residual degrees of freedom, its standard error
exceeds its value. Efficiencies are relative: one measured key (``ring.Simple``,
else ``AllReduce``, else the most measured) keeps its prior and the bandwidths
absorb the scale. NCCL ``algorithm.protocol`` efficiencies are always fitted;
the MPI model's per-collective ones only on request (``efficiency=True``, ``fit
--efficiency``): on the emulated cluster they lowered the error but made the
ranking worse (docs/results.md).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .corpus import CorpusCall, read_corpus
from .cost import Algorithm, Features, Model, Predictor, Profile, lowered_loads, step_cost
from .cost.nccl import NCCL_KEYS, PROTOCOLS
from .cost.profile import EFFICIENCY_KEYS
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


@dataclass(frozen=True)
class CallSample:
    """One collective call on the first ``call.ranks`` devices of ``topology``
    (a corpus line, :mod:`synth.corpus`)."""

    call: CorpusCall
    topology: Topology
    algorithm: Algorithm

    @property
    def median_s(self) -> float:
        return self.call.time_s

    @property
    def size_bytes(self) -> int:
        return self.call.size_bytes

    @property
    def line(self) -> str:
        return self.call.where

    @property
    def case(self) -> None:
        return None  # one call, no programs to rank

    def features(self, profile: Profile) -> Features:
        group = np.arange(self.call.ranks)[None, :]
        return step_cost(self.topology, profile, self.algorithm, self.call.collective, group,
                         np.array([float(self.call.size_bytes)]), self.call.nvls_enabled)[1]


Measurement = Sample | CallSample


def samples_of(records: Sequence[Record], source: str = "measurements") -> list[Sample]:
    """Samples of records; each distinct (reduction, program) is lowered once.
    Errors name ``source:line``; a record with wrong results is refused."""
    loads: dict[tuple[Reduction, Program], tuple[Loads, ...]] = {}
    out = []
    for record in records:
        where = f"{source}:{record.line}" if record.line else source
        if record.wrong:
            raise SynthError(f"{where}: the run gave {record.wrong} wrong element(s) (field 'wrong'), so its time "
                             f"is not a measurement of a correct program; re-measure it or delete the line")
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


def call_samples(calls: Sequence[CorpusCall], topology: Topology) -> list[CallSample]:
    """Corpus calls on ``topology``; a call over more ranks than it has devices
    is an error naming its line."""
    out = []
    for call in calls:
        if call.ranks > topology.num_devices:
            raise SynthError(f"{call.where}: the run used {call.ranks} GPUs but topology '{topology.name}' has "
                             f"{topology.num_devices}; give the topology of the measured system (--topology)")
        out.append(CallSample(call, topology, Algorithm(call.algo) if call.algo else Algorithm.NCCL))
    return out


def load_measurements(paths: Sequence[str | Path], topology: Topology | None = None
                      ) -> tuple[Topology, list[Measurement], int]:
    """Measurements from bench record files and NCCL corpus files (the format
    of each file is told by its first line); corpus files need ``topology``, and
    record files must be of the same topology. Returns the topology, the
    measurements and the number of corpus lines skipped (not modelled)."""
    out: list[Measurement] = []
    skipped = 0
    for path in paths:
        if _is_corpus_file(path):
            if topology is None:
                raise SynthError(f"{path}: NCCL corpus lines carry no synth-reduce topology; "
                                 f"give the measured system's with --topology")
            calls, n = read_corpus(path)
            skipped += n
            out.extend(call_samples(calls, topology))
        else:
            this, samples = load_samples(path)
            if topology is not None and this != topology:
                raise SynthError(f"{path}: measurements of topology '{this.name}', not '{topology.name}'; "
                                 f"fit one topology at a time")
            topology = this
            out.extend(samples)
    if topology is None or not out:
        raise SynthError(f"{', '.join(str(p) for p in paths)}: no measurements the model covers")
    return topology, out, skipped


def _is_corpus_file(path: str | Path) -> bool:
    import json

    try:
        with open(path) as f:
            first = next((line for line in f if line.strip()), "")
        doc = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False  # read_records reports it
    return isinstance(doc, dict) and "set" in doc and "system" in doc and "schema" not in doc


# ---------------------------------------------------------------- predicting


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

    def features(self, s: Measurement) -> Features:
        if isinstance(s, CallSample):
            return s.features(self.profile)
        return self.predictor(s).features(s.program, s.loads, s.size_bytes)

    def predict(self, s: Measurement) -> float:
        if isinstance(s, CallSample):
            return s.features(self.profile).seconds(self.profile)
        return self.predictor(s).program(s.program, s.loads, s.size_bytes)


def predict_all(profile: Profile, samples: Sequence[Measurement]) -> np.ndarray:
    predictors = _Predictors(profile)
    return np.array([predictors.predict(s) for s in samples])


# ---------------------------------------------------------------- the parameters as a vector


class _Layout:
    """The linear parameters of a profile as one vector (seconds, and seconds
    per byte for the inverse bandwidths) and their names."""

    def __init__(self, profile: Profile) -> None:
        self.levels = list(profile.level_names)
        L = len(self.levels)
        self.names = ([f"{n} latency_us" for n in self.levels] + ["call_overhead_us"]
                      + [f"{n} {p} latency_us" for n in self.levels for p in PROTOCOLS]
                      + [f"{k} base latency_us" for k in NCCL_KEYS]
                      + [f"{n} bandwidth_GBps" for n in self.levels])
        self.mpi_lat = slice(0, L)
        self.overhead = L
        self.proto_lat = slice(L + 1, L + 1 + 3 * L)
        self.base = slice(4 * L + 1, 4 * L + 1 + len(NCCL_KEYS))
        self.inv_bw = slice(4 * L + 1 + len(NCCL_KEYS), 5 * L + 1 + len(NCCL_KEYS))
        self.size = 5 * L + 1 + len(NCCL_KEYS)
        # which parameters to keep at their prior first when they are collinear
        kind = np.zeros(self.size)
        kind[self.base], kind[self.proto_lat], kind[self.mpi_lat] = 0, 1, 2
        kind[self.overhead], kind[self.inv_bw] = 3, 4
        self.fix_order = list(np.argsort(kind, kind="stable"))

    def vector(self, p: Profile) -> np.ndarray:
        return np.concatenate([p.latency_s, [p.call_overhead_us * 1e-6], p.protocol_latency_s.ravel(),
                               [p.base_us(k) * 1e-6 for k in NCCL_KEYS], 1.0 / p.bandwidth_Bps])

    def row(self, f: Features, eff: dict[str, float]) -> np.ndarray:
        load = sum((x / eff[k] for k, x in f.load.items()), np.zeros(len(self.levels)))
        return np.concatenate([f.latency_count, [f.calls], f.protocol_count.ravel(),
                               [f.base_count.get(k, 0.0) for k in NCCL_KEYS], load])

    def profile(self, theta: np.ndarray, like: Profile, efficiency: dict[str, float]) -> Profile:
        L = len(self.levels)
        return Profile(
            topology=like.topology, level_names=like.level_names,
            bandwidth_GBps=tuple(float(v) for v in 1.0 / theta[self.inv_bw] / 1e9),
            latency_us=tuple(float(v) for v in theta[self.mpi_lat] * 1e6),
            efficiency=tuple(efficiency.items()),
            call_overhead_us=float(theta[self.overhead] * 1e6),
            protocol_latency_us=tuple(tuple(float(v) for v in r) for r in (theta[self.proto_lat] * 1e6).reshape(L, 3)),
            base_latency_us=tuple((k, float(v * 1e6)) for k, v in zip(NCCL_KEYS, theta[self.base])),
            structure=like.structure,
        )


def _identified_solve(a: np.ndarray, b: np.ndarray, prior: np.ndarray, names: Sequence[str],
                      order: Sequence[int], floor: np.ndarray) -> tuple[np.ndarray, dict[str, str]]:
    """Least squares for ``a x = b`` where every parameter the rows cannot
    identify keeps its ``prior`` (see the module docstring); returns x and, per
    parameter kept at its prior although exercised, the reason."""
    used = np.abs(a).sum(axis=0) > 0
    free = used.copy()
    why: dict[str, str] = {}
    # 1. collinear parameters: keep them at the prior in ``order`` until the rest have full rank
    while free.any():
        cols = np.flatnonzero(free)
        scaled = a[:, cols] / np.linalg.norm(a[:, cols], axis=0)
        _, s, vt = np.linalg.svd(scaled, full_matrices=True)
        rank = int((s > 1e-9 * s[0]).sum()) if len(s) else 0
        if rank == len(cols):
            break
        null = vt[rank:]
        involved = {int(cols[i]) for i in np.flatnonzero(np.abs(null).max(axis=0) > 1e-6)}
        fix = next(j for j in order if j in involved)
        partners = ", ".join(names[j] for j in sorted(involved - {fix})[:3])
        why[names[fix]] = f"not separable from {partners}" if partners else "not separable from the others"
        free[fix] = False
    # 2. values at or below the floor, and values the records do not pin down
    while True:
        cols = np.flatnonzero(free)
        x = prior.copy()
        rhs = b - a[:, ~free] @ prior[~free]
        if len(cols) == 0:
            return x, why
        sol, *_ = np.linalg.lstsq(a[:, cols], rhs, rcond=None)
        x[cols] = sol
        low = cols[sol <= floor[cols]]
        if len(low):
            worst = low[np.argmin(sol[np.isin(cols, low)] / np.maximum(np.abs(prior[low]), 1e-300))]
            why[names[worst]] = "the records put it at or below zero"
            free[worst] = False
            continue
        dof = a.shape[0] - len(cols)
        if dof > 0:
            residual = a[:, cols] @ sol - rhs
            sigma2 = float(residual @ residual) / dof
            cov = sigma2 * np.linalg.pinv(a[:, cols].T @ a[:, cols])
            ratio = np.sqrt(np.maximum(np.diag(cov), 0.0)) / np.abs(sol)
            if (ratio > 1.0).any():
                worst = cols[int(np.argmax(ratio))]
                why[names[worst]] = f"too uncertain (standard error {ratio.max():.0%} of the value)"
                free[worst] = False
                continue
        return x, why


@dataclass(frozen=True)
class FitReport:
    records: int
    iterations: int
    median_rel_error: float
    mean_rel_error: float
    max_rel_error: float
    rmse_s: float
    not_identified: tuple[tuple[str, str], ...] = ()  # (parameter, why) kept at the prior
    not_exercised: tuple[str, ...] = ()  # parameters no record uses (kept at the prior)

    def to_dict(self) -> dict[str, Any]:
        out = self.__dict__.copy()
        out["not_identified"] = dict(self.not_identified)
        out["not_exercised"] = list(self.not_exercised)
        return out


def _anchor(keys: Sequence[str], counts: dict[str, int]) -> str | None:
    for k in ("ring.Simple", "AllReduce"):
        if k in keys:
            return k
    return max(keys, key=lambda k: counts[k]) if keys else None


def fit_profile(
    measurements: Sequence[Measurement], prior: Profile, iterations: int = 8, efficiency: bool = False
) -> tuple[Profile, FitReport]:
    """Least-squares fit of the profile's parameters (see the module docstring);
    with ``efficiency`` also the MPI model's per-collective efficiencies."""
    layout = _Layout(prior)
    prior_theta = layout.vector(prior)
    floor = np.zeros(layout.size)
    floor[layout.inv_bw] = 1e-15
    measured = np.array([m.median_s for m in measurements])
    weight = 1.0 / measured
    profile = prior
    eff = dict(prior.efficiency)
    done, why, used = 0, {}, np.zeros(layout.size, dtype=bool)
    eff_why: dict[str, str] = {}
    for done in range(1, iterations + 1):
        predictors = _Predictors(profile)
        feats = [predictors.features(m) for m in measurements]
        # 1. levels, latencies, overheads: efficiencies fixed
        a = np.array([layout.row(f, eff) for f in feats])
        used = np.abs(a).sum(axis=0) > 0
        theta, why = _identified_solve(a * weight[:, None], measured * weight, prior_theta, layout.names,
                                       layout.fix_order, floor)
        # 2. efficiencies: unknown 1/efficiency per key, the rest fixed
        inv_bw = theta[layout.inv_bw]
        fixed_part = a[:, :layout.inv_bw.start] @ theta[:layout.inv_bw.start]
        counts = {k: sum(1 for f in feats if k in f.load) for k in EFFICIENCY_KEYS}
        keys = [k for k in EFFICIENCY_KEYS if counts[k] and (k in NCCL_KEYS or efficiency)]
        new_eff = dict(eff)
        anchor = _anchor(keys, counts)
        fitted = [k for k in keys if k != anchor]
        eff_why = {}
        if fitted:
            cols = np.array([[float(f.load.get(k, np.zeros(len(inv_bw))) @ inv_bw) for k in fitted] for f in feats])
            rhs = measured - fixed_part
            if anchor is not None:
                rhs = rhs - np.array([float(f.load.get(anchor, np.zeros(len(inv_bw))) @ inv_bw) for f in feats]) / eff[anchor]
            inv_eff, eff_why = _identified_solve(cols * weight[:, None], rhs * weight,
                                                 np.array([1.0 / prior.efficiency_of(k) for k in fitted]),
                                                 [f"{k} efficiency" for k in fitted], range(len(fitted)),
                                                 np.full(len(fitted), 1e-3))
            new_eff.update({k: 1.0 / v for k, v in zip(fitted, inv_eff)})
        new = layout.profile(theta, prior, new_eff)
        old = layout.vector(profile)
        change = max(np.max(np.abs(np.log(np.maximum(layout.vector(new)[used], 1e-300)
                                          / np.maximum(old[used], 1e-300))), initial=0.0),
                     max(abs(math.log(new_eff[k] / eff[k])) for k in eff))
        profile, eff = new, new_eff
        if change < 1e-6:
            break
    predicted = predict_all(profile, measurements)
    rel = np.abs(predicted - measured) / measured
    eff_used = {k for f in feats for k in f.load}
    report = FitReport(
        records=len(measurements),
        iterations=done,
        median_rel_error=float(np.median(rel)),
        mean_rel_error=float(rel.mean()),
        max_rel_error=float(rel.max()),
        rmse_s=float(np.sqrt(((predicted - measured) ** 2).mean())),
        not_identified=tuple(sorted({**why, **eff_why}.items())),
        not_exercised=tuple([n for n, u in zip(layout.names, used) if not u]
                            + [f"{k} efficiency" for k in EFFICIENCY_KEYS if k not in eff_used]),
    )
    return profile, report


# ---------------------------------------------------------------- accuracy

MIN_CASES = 10  # top-k accuracy is not reported from fewer cases


@dataclass(frozen=True)
class Accuracy:
    cases: int
    top_k: dict[int, float]  # k -> share of cases whose measured best is in the k predicted best
    top_k_ci: dict[int, tuple[float, float]]  # k -> 95% Wilson score interval of that share
    spearman_mean: float
    median_rel_error: float
    records: int

    @property
    def enough_cases(self) -> bool:
        return self.cases >= MIN_CASES


def wilson_interval(hits: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``hits / n``."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


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
    """Top-k accuracy (with 95% Wilson intervals) over cases with at least two
    programs, mean Spearman correlation per case, and median relative error over
    all records. Below :data:`MIN_CASES` cases, :attr:`Accuracy.enough_cases` is
    false and the top-k shares are not to be reported."""
    predicted = predict_all(profile, measurements)
    measured = np.array([m.median_s for m in measurements])
    cases: dict[tuple, list[int]] = {}
    for i, m in enumerate(measurements):
        if m.case is not None:
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
        top_k_ci={k: wilson_interval(hits[k], n) for k in hits},
        spearman_mean=float(np.mean(rhos)) if rhos else float("nan"),
        median_rel_error=float(np.median(np.abs(predicted - measured) / measured)),
        records=len(measurements),
    )


def split_cases(measurements: Sequence[Measurement], holdout: float, seed: int = 0
                ) -> tuple[list[Measurement], list[Measurement]]:
    """(fit set, held-out set): whole cases go to one side or the other (a
    corpus call is a case of its own)."""
    if not 0 < holdout < 1:
        raise SynthError(f"--holdout {holdout}: give the held-out fraction of cases, between 0 and 1")
    key = [m.case if m.case is not None else ("call", m.line) for m in measurements]
    keys = sorted(set(key), key=repr)
    random.Random(seed).shuffle(keys)
    held = set(keys[: max(1, round(holdout * len(keys)))])
    if len(held) == len(keys):
        raise SynthError("--holdout leaves no case to fit on; measure more cases or hold out less")
    return ([m for m, k in zip(measurements, key) if k not in held],
            [m for m, k in zip(measurements, key) if k in held])
