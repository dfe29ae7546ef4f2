"""Learn the cost model's parameters from measurements, and score its accuracy.

Two kinds of measurement:

* programs (:class:`Sample`): the records of :mod:`synth.cost.records` (JSON lines
  written by ``synth-reduce bench --jsonl``), each modelled with the algorithm it
  names (``Record.algorithm``); a record whose result was wrong (``wrong`` > 0)
  is refused: its time measures a broken run;
* single calls (:class:`CallSample`): the NCCL corpus (:mod:`synth.cost.corpus`), a
  collective over a group of a topology given on the command line, modelled by
  NCCL's choice or the algorithm the run forced.

Fitting. With the critical flows and NCCL's choices fixed, a prediction is
linear in the latencies (per level the MPI latency and the NCCL step latency per
protocol, the MPI per-call overhead, the NCCL base latency per
``algorithm.protocol``) and bilinear in the inverse bandwidths and the inverse
efficiencies (see :class:`synth.cost.Features`). ``fit_profile`` fits them all
jointly by Levenberg-Marquardt on relative errors (rows divided by the measured
time, since times span orders of magnitude), recomputes the critical flows with
the new parameters and repeats until they settle (at most 8 rounds).

Identification. A parameter keeps its prior, and is reported, when the records
cannot identify it: no record exercises it; it is not separable from others (the
design matrix is rank-deficient: of the collinear parameters the first in the
order base latencies, NCCL step latencies, MPI latencies, call overhead,
bandwidths, efficiencies keeps its prior until the rest are separable); its term
is below 1% of every predicted time it enters; or the records push a bandwidth
or an efficiency beyond 10x or 1/10 of its prior (the fit restarts without it).
A latency the records put below zero rests at 0 (reported too). Efficiencies
are relative: one measured key (``ring.Simple``, else another Simple protocol's,
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

from ..documents import json_lines
from ..errors import SynthError
from ..synthesis.language import Program
from ..synthesis.lowering import lower
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Loads
from ..topology import Topology
from . import Algorithm, Features, Model, Predictor, NetworkProfile, lowered_loads, step_cost
from .corpus import CorpusCall, is_corpus_line, read_corpus
from .nccl import NCCL_KEYS, PROTOCOLS
from .nccl_rules import NCCL_VERSION, RULES, rules_for
from .profile import EFFICIENCY_KEYS
from .records import Record, read_records

# ---------------------------------------------------------------- samples


def measured_rules(version: str | None) -> str | None:
    """The NCCL release whose rules model a measurement made with NCCL
    ``version``: the newest transcribed not newer than it, the oldest for an
    older one (a measurement is data, not a request to refuse); None (the
    default rules) when the version is not known."""
    if version is None:
        return None
    try:
        return rules_for(version).version
    except SynthError:
        return min(RULES, key=lambda v: tuple(int(p) for p in v.split(".")))


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

    @property
    def nccl_rules(self) -> str | None:
        """The NCCL release whose rules model this record (:func:`measured_rules`)."""
        return measured_rules(self.record.nccl_version)


@dataclass(frozen=True)
class CallSample:
    """One collective call on the first ``call.ranks`` devices of ``topology``
    (a corpus line, :mod:`synth.cost.corpus`)."""

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

    @property
    def nccl_rules(self) -> str | None:
        """The NCCL release whose rules model this call (:func:`measured_rules`
        of the version its source states)."""
        return measured_rules(self.call.nccl_version)

    def features(self, profile: NetworkProfile) -> Features:
        group = np.arange(self.call.ranks)[None, :]
        return step_cost(self.topology, profile, self.algorithm, self.call.collective, group,
                         np.array([float(self.call.size_bytes)]), self.call.nvls_enabled, self.nccl_rules,
                         self.call.dtype, self.call.op, self.call.allowed, self.call.protocols)[1]


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
    """Read a measurements file (:func:`synth.cost.records.read_records`) into samples."""
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
    """Whether the first line of ``path`` is an NCCL corpus line (the file's
    errors, if any, are reported by the reader that follows)."""
    try:
        return is_corpus_line(next(json_lines(path, "measurements"))[2])
    except (SynthError, StopIteration):
        return False


# ---------------------------------------------------------------- predicting


class _Predictors:
    """Predictors per (reduction, algorithm) for one profile."""

    def __init__(self, profile: NetworkProfile) -> None:
        self.profile = profile
        self._predictors: dict[tuple, Predictor] = {}

    def predictor(self, s: Sample) -> Predictor:
        key = (s.reduction, s.algorithm, s.nccl_rules)
        if key not in self._predictors:
            self._predictors[key] = Predictor(s.reduction, Model(s.algorithm, self.profile,
                                                                 nccl_version=s.nccl_rules or NCCL_VERSION))
        return self._predictors[key]

    def features(self, s: Measurement) -> Features:
        if isinstance(s, CallSample):
            return s.features(self.profile)
        return self.predictor(s).features(s.program, s.loads, s.size_bytes)

    def predict(self, s: Measurement) -> float:
        if isinstance(s, CallSample):
            return s.features(self.profile).seconds(self.profile)
        return self.predictor(s).program(s.program, s.loads, s.size_bytes)


def predict_all(profile: NetworkProfile, samples: Sequence[Measurement]) -> np.ndarray:
    predictors = _Predictors(profile)
    return np.array([predictors.predict(s) for s in samples])


# ---------------------------------------------------------------- the parameters as a vector


class _Layout:
    """The linear parameters of a profile as one vector (seconds, and seconds
    per byte for the inverse bandwidths) and their names."""

    def __init__(self, profile: NetworkProfile) -> None:
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
        # which parameters to keep at their prior first when they are collinear (the
        # fit puts the efficiencies after the bandwidths: a level's bandwidth is a
        # spec, its efficiencies what the library achieves on it)
        kind = np.zeros(self.size)
        kind[self.base], kind[self.proto_lat], kind[self.mpi_lat] = 0, 1, 2
        kind[self.overhead], kind[self.inv_bw] = 3, 4
        self.fix_order = [int(i) for i in np.argsort(kind, kind="stable")]

    def vector(self, p: NetworkProfile) -> np.ndarray:
        return np.concatenate([p.latency_s, [p.call_overhead_us * 1e-6], p.protocol_latency_s.ravel(),
                               [p.base_us(k) * 1e-6 for k in NCCL_KEYS], 1.0 / p.bandwidth_Bps])

    def latency_row(self, f: Features) -> np.ndarray:
        """The terms of ``f`` that multiply the latency parameters (all but the
        inverse bandwidths), in vector order."""
        return np.concatenate([f.latency_count, [f.calls], f.steps.ravel(), [f.base_count.get(k, 0.0) for k in NCCL_KEYS]])

    def profile(self, theta: np.ndarray, like: NetworkProfile, efficiency: dict[str, float]) -> NetworkProfile:
        L = len(self.levels)
        return NetworkProfile(
            topology=like.topology, level_names=like.level_names,
            bandwidth_GBps=tuple(float(v) for v in 1.0 / theta[self.inv_bw] / 1e9),
            latency_us=tuple(float(v) for v in theta[self.mpi_lat] * 1e6),
            efficiency=tuple(efficiency.items()),
            call_overhead_us=float(theta[self.overhead] * 1e6),
            protocol_latency_us=tuple(tuple(float(v) for v in r) for r in (theta[self.proto_lat] * 1e6).reshape(L, 3)),
            base_latency_us=tuple((k, float(v * 1e6)) for k, v in zip(NCCL_KEYS, theta[self.base])),
            structure=like.structure,
        )


def _separable(a: np.ndarray, names: Sequence[str], order: Sequence[int]) -> tuple[np.ndarray, dict[str, str]]:
    """Which exercised columns of ``a`` the rows can separate: while the free
    columns are rank-deficient, the first column in ``order`` that takes part in
    a null direction is kept at its prior. Returns the free mask and the reasons."""
    free = np.abs(a).sum(axis=0) > 0
    why: dict[str, str] = {}
    while free.any():
        cols = np.flatnonzero(free)
        scaled = a[:, cols] / np.linalg.norm(a[:, cols], axis=0)
        _, s, vt = np.linalg.svd(scaled, full_matrices=True)
        rank = int((s > 1e-9 * s[0]).sum()) if len(s) else 0
        if rank == len(cols):
            break
        involved = {int(cols[i]) for i in np.flatnonzero(np.abs(vt[rank:]).max(axis=0) > 1e-6)}
        fix = next(j for j in order if j in involved)
        partners = ", ".join(names[j] for j in sorted(involved - {fix})[:3])
        why[names[fix]] = f"not separable from {partners}" if partners else "not separable from the others"
        free[fix] = False
    return free, why


def levenberg_marquardt(x, free, floor, ceiling, measured, weight, pred, jac, model, steps: int = 200):
    """Minimise the weighted squared error of ``model(x) -> (predicted, jacobian)``
    over the ``free`` parameters, each kept in (``floor``, ``ceiling``):
    Levenberg-Marquardt steps, damped until they lower the error, clipped to the
    range (a latency, whose floor is 0, may rest on it). Returns x, its
    prediction and jacobian, and the free parameter (if any) with a positive
    floor or a ceiling that the undamped solution puts furthest out of range at
    the end: these records do not place it."""
    cols = np.flatnonzero(free)
    lam = 1e-3
    cost = float(((pred - measured) * weight) @ ((pred - measured) * weight))
    inside_floor = np.where(floor > 0, floor * (1 + 1e-9), floor)
    inside_ceiling = ceiling * (1 - 1e-9)
    for _ in range(steps):
        if len(cols) == 0:
            break
        j = jac[:, cols] * weight[:, None]
        r = (measured - pred) * weight
        jtj, jtr = j.T @ j, j.T @ r
        diag = np.maximum(np.diag(jtj), 1e-300)
        improved = False
        while lam < 1e12:
            delta = np.linalg.solve(jtj + lam * np.diag(diag), jtr)
            trial = x.copy()  # a step out of range stops at the range (just inside it)
            trial[cols] = np.clip(x[cols] + delta, inside_floor[cols], inside_ceiling[cols])
            t_pred, t_jac = model(trial)
            t_cost = float(((t_pred - measured) * weight) @ ((t_pred - measured) * weight))
            if t_cost <= cost:
                improved = True
                break
            lam *= 10
        if not improved:
            break
        settled = np.allclose(trial[cols], x[cols], rtol=1e-12, atol=0) or cost - t_cost <= 1e-14 * max(cost, 1e-300)
        x, pred, jac, cost = trial, t_pred, t_jac, t_cost
        lam = max(lam / 10, 1e-12)
        if settled:
            break
    # where does the undamped step want to go from here?
    out: list[int] = []
    if len(cols):
        j = jac[:, cols] * weight[:, None]
        full, *_ = np.linalg.lstsq(j, (measured - pred) * weight, rcond=None)
        target = x[cols] + full
        beyond = np.maximum((floor[cols] - target) / np.maximum(np.abs(x[cols]), 1e-300),
                            (target - ceiling[cols]) / np.maximum(np.abs(x[cols]), 1e-300))
        # resting on the edge of the range is being pushed out of it
        edge = (x[cols] <= inside_floor[cols] * (1 + 1e-6)) | (x[cols] >= inside_ceiling[cols] * (1 - 1e-6))
        beyond = np.where(edge, np.maximum(beyond, 0.0), beyond)
        beyond[floor[cols] == 0] = -1.0  # a latency may rest at 0: the records show none
        if (beyond >= 0).any():
            out = [int(cols[int(np.argmax(beyond))])]
    return x, pred, jac, out


@dataclass(frozen=True)
class FitReport:
    records: int
    iterations: int
    median_rel_error: float
    mean_rel_error: float
    max_rel_error: float
    rmse_s: float
    not_identified: tuple[tuple[str, str], ...] = ()  # (parameter, why) kept at the prior
    at_zero: tuple[str, ...] = ()  # latencies the records put at 0 (they show none)
    not_exercised: tuple[str, ...] = ()  # parameters no record uses (kept at the prior)

    def to_dict(self) -> dict[str, Any]:
        out = self.__dict__.copy()
        out["not_identified"] = dict(self.not_identified)
        out["at_zero"] = list(self.at_zero)
        out["not_exercised"] = list(self.not_exercised)
        return out


MIN_SHARE = 0.01  # a parameter is identified only by records where its term is at least this share of the time
RANGE = 10.0  # a fitted bandwidth or efficiency stays within this factor of its prior, else it keeps the prior


def _anchor(keys: Sequence[str], counts: dict[str, int]) -> str | None:
    """The efficiency that keeps its prior: ring Simple's (1, NCCL's own scale),
    else another Simple protocol's, else AllReduce's (MPI), else the most measured."""
    for k in ("ring.Simple", "tree.Simple", "nvls.Simple", "nvlstree.Simple", "pat.Simple", "AllReduce"):
        if k in keys:
            return k
    return max(keys, key=lambda k: counts[k]) if keys else None


def fit_profile(
    measurements: Sequence[Measurement], prior: NetworkProfile, iterations: int = 8, efficiency: bool = False
) -> tuple[NetworkProfile, FitReport]:
    """Least-squares fit of the profile's parameters (see the module docstring);
    with ``efficiency`` also the MPI model's per-collective efficiencies."""
    return _fit(measurements, prior, iterations, efficiency, {})


def _fit(measurements: Sequence[Measurement], prior: NetworkProfile, iterations: int, efficiency: bool,
         held: dict[str, str]) -> tuple[NetworkProfile, FitReport]:
    """The fit with the parameters named in ``held`` at their prior.

    Each round fixes the critical paths (features) and fits all parameters
    jointly by Levenberg-Marquardt (the bandwidth terms are bilinear: inverse
    bandwidth x inverse efficiency); one efficiency (the anchor) keeps its value.
    A parameter the records put at or below zero is held at its prior and the
    fit restarts."""
    layout = _Layout(prior)
    measured = np.array([m.median_s for m in measurements])
    weight = 1.0 / measured
    profile = prior
    eff = dict(prior.efficiency)
    done, why, feats = 0, dict(held), []
    used = np.zeros(layout.size, dtype=bool)
    L = len(layout.levels)
    for done in range(1, iterations + 1):
        predictors = _Predictors(profile)
        feats = [predictors.features(m) for m in measurements]
        counts = {k: sum(1 for f in feats if k in f.load) for k in EFFICIENCY_KEYS}
        keys = [k for k in EFFICIENCY_KEYS if counts[k] and (k in NCCL_KEYS or efficiency)]
        anchor = _anchor(keys, counts)
        fitted = [k for k in keys if k != anchor]
        names = layout.names + [f"{k} efficiency" for k in fitted]
        prior_x = np.concatenate([layout.vector(prior), [1.0 / prior.efficiency_of(k) for k in fitted]])
        # latencies >= 0; inverse bandwidths and efficiencies within RANGE of their prior
        floor = np.concatenate([np.zeros(layout.inv_bw.start), prior_x[layout.inv_bw] / RANGE,
                                prior_x[layout.size:] / RANGE])
        ceiling = np.concatenate([np.full(layout.inv_bw.start, np.inf), prior_x[layout.inv_bw] * RANGE,
                                  prior_x[layout.size:] * RANGE])
        order = layout.fix_order + list(range(layout.size, len(names)))
        per_key = {k: np.array([f.load.get(k, np.zeros(L)) for f in feats]) for k in EFFICIENCY_KEYS if counts[k]}
        fixed_rows = np.array([layout.latency_row(f) for f in feats])
        x = np.concatenate([layout.vector(profile), [1.0 / eff[k] for k in fitted]])

        def predicted_and_jacobian(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            u = x[layout.inv_bw]
            inv_eff = {k: 1.0 / eff[k] for k in per_key} | dict(zip(fitted, x[layout.size:]))
            j_u = sum((inv_eff[k] * per_key[k] for k in per_key), np.zeros((len(feats), L)))
            j_v = np.stack([per_key[k] @ u for k in fitted], axis=1) if fitted else np.zeros((len(feats), 0))
            return fixed_rows @ x[:layout.inv_bw.start] + j_u @ u, np.hstack([fixed_rows, j_u, j_v])

        pred, jac = predicted_and_jacobian(x)
        used = np.abs(jac[:, :layout.size]).sum(axis=0) > 0
        # a parameter counts where its term is at least 1% of the predicted time (at the prior; a
        # prior of 0, such as the call overhead's, says nothing about the term's size)
        p_pred, p_jac = predicted_and_jacobian(prior_x)
        share = np.abs(p_jac * prior_x[None, :]) / np.maximum(p_pred, 1e-300)[:, None]
        negligible = (np.abs(jac).sum(axis=0) > 0) & (share.max(axis=0) < MIN_SHARE) & (prior_x > 0)
        why.update({names[j]: f"its term is below {MIN_SHARE:.0%} of every predicted time"
                    for j in np.flatnonzero(negligible)})
        free, separable_why = _separable(jac * weight[:, None] * ~negligible[None, :], names, order)
        free &= ~np.isin(names, list(held))
        why.update(separable_why)
        x[~free] = prior_x[~free]
        pred, jac = predicted_and_jacobian(x)
        x, pred, jac, out = levenberg_marquardt(x, free, floor, ceiling, measured, weight, pred, jac,
                                                 predicted_and_jacobian)
        solve_why = {names[j]: f"the records put it beyond {RANGE:g}x or 1/{RANGE:g} of its prior" for j in out}
        why.update(solve_why)
        new_eff = {**eff, **{k: 1.0 / val for k, val in zip(fitted, x[layout.size:])}}
        new = layout.profile(x[:layout.size], prior, new_eff)
        change = max(np.max(np.abs(np.log(np.maximum(layout.vector(new)[used], 1e-300)
                                          / np.maximum(layout.vector(profile)[used], 1e-300))), initial=0.0),
                     max(abs(math.log(new_eff[k] / eff[k])) for k in eff))
        profile, eff = new, new_eff
        if solve_why:  # fit again without what the records put out of range
            return _fit(measurements, prior, iterations, efficiency, {**held, **solve_why})
        if change < 1e-9:
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
        not_identified=tuple(sorted(why.items())),
        at_zero=tuple(n for n, v, f in zip(layout.names, layout.vector(profile), free[:layout.size]) if f and v == 0),
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


def accuracy(profile: NetworkProfile, measurements: Sequence[Measurement], ks: Iterable[int] = (1, 3, 5, 10)) -> Accuracy:
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
