"""The measured evaluation's case list and measures (docs/results.md).

``scripts/run_evaluation.py`` measures every case of :func:`cases` on the
emulated clusters :data:`CLUSTERS`; ``scripts/evaluation_report.py`` computes
the measures below from the records and writes the report and its plots.

Definitions:

- a *case* is one placement, reduction and size; its programs are the default
  all-reduce and the measured synthesized programs; a time is the median over
  iterations of the slowest rank;
- a case is *cross-node* when its reduction group spans more than one node;
- *speedup* of a case: the default's time over the fastest synthesized program's;
- *held-out* predictions: two-fold cross-validation per cluster, whole cases
  on one side (:func:`synth.cost.fit.split_cases`), a profile fitted on one half
  (:func:`synth.cost.fit.fit_profile`) predicts the other half.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..cost import NetworkProfile
from ..cost.fit import Sample, fit_profile, measured_best_position, predict_all, split_cases
from ..cost.records import Record
from ..synthesis.language import format_program

CLUSTERS = ("testbed-2x4", "testbed-4x4", "testbed-2x2x2")
AXIS_NAMES = ("dp", "mp", "pp")
# one shape per multiset of axis sizes (permuting equal-role axes only renames them)
SHAPES = {8: ((8,), (4, 2), (2, 2, 2)), 16: ((16,), (8, 2), (4, 4), (4, 2, 2))}


def cases(num_devices: int, quick: bool = False) -> list[tuple[str, str]]:
    """(--axes, --reduce) of every shape and reduction for a world of this size."""
    out = []
    shapes = SHAPES[num_devices][:2] if quick else SHAPES[num_devices]
    for shape in shapes:
        names = AXIS_NAMES[: len(shape)]
        axes = ",".join(f"{n}={s}" for n, s in zip(names, shape))
        reductions = [(n,) for n in names]
        if len(names) == 3:
            reductions += list(itertools.combinations(names, 2))
        out += [(axes, ",".join(r)) for r in reductions]
    return out


# ---------------------------------------------------------------- measured programs and cases


@dataclass(frozen=True)
class ProgramTime:
    """One measured program of one case of an evaluation run (one record of
    ``<cluster>-<baseline>.jsonl``), as plain values the measures group by."""

    cluster: str
    baseline: str
    axes: str  # "dp=4,mp=2"
    matrix: tuple[tuple[int, ...], ...]
    reduce: str  # "dp" or "dp,mp"
    program: str
    is_default: bool
    size_bytes: int
    median_s: float
    min_s: float
    max_s: float
    wrong: int
    spans: int  # how many outer levels the reduction group crosses (0: inside a node)

    @property
    def case(self) -> tuple:
        return (self.cluster, self.baseline, self.axes, self.matrix, self.reduce, self.size_bytes)

    @property
    def reduction(self) -> tuple:
        """The same reduction on every placement: what placements are compared on."""
        return (self.cluster, self.baseline, self.axes, self.reduce, self.size_bytes)


def spans(matrix: Sequence[Sequence[int]], axis_names: Sequence[str], reduce: Sequence[str]) -> int:
    """Outer levels (all but the innermost) on which a reduced axis has more than one index."""
    rows = [row for name, row in zip(axis_names, matrix) if name in reduce]
    return sum(any(row[level] > 1 for row in rows) for level in range(len(matrix[0]) - 1))


def program_time(record: Record, baseline: str) -> ProgramTime:
    """The evaluation's view of a measurement record."""
    reduction = record.reduction
    placement = reduction.placement
    return ProgramTime(
        cluster=placement.topology.name, baseline=baseline,
        axes=",".join(f"{a.name}={a.size}" for a in placement.axes), matrix=placement.matrix,
        reduce=",".join(reduction.axes), program=format_program(record.program, " ; "),
        is_default=record.is_default, size_bytes=record.size_bytes, median_s=record.median_s,
        min_s=record.min_s if record.min_s is not None else record.median_s,
        max_s=record.max_s if record.max_s is not None else record.median_s,
        wrong=record.wrong, spans=spans(placement.matrix, placement.axis_names, reduction.axes),
    )


def data_files(data: Path) -> list[tuple[Path, str, str]]:
    """(file, cluster, baseline) of ``<cluster>-<baseline>.jsonl``."""
    out = []
    for path in sorted(data.glob("*.jsonl")):
        cluster, _, baseline = path.stem.rpartition("-")
        out.append((path, cluster, baseline))
    return out


def group(records: Iterable[ProgramTime], key) -> dict[tuple, list[ProgramTime]]:
    out: dict[tuple, list[ProgramTime]] = defaultdict(list)
    for r in records:
        out[key(r)].append(r)
    return dict(out)


# ---------------------------------------------------------------- the measures


@dataclass(frozen=True)
class Spread:
    """One reduction on every placement: the default's time on each."""

    reduction: tuple
    best_s: float
    worst_s: float
    placements: int

    @property
    def ratio(self) -> float:
        return self.worst_s / self.best_s


def placement_spreads(records: Sequence[ProgramTime]) -> list[Spread]:
    """Reductions with two or more placements, at least one of them cross-node."""
    out = []
    for reduction, rs in group(records, lambda r: r.reduction).items():
        defaults = [r for r in rs if r.is_default]
        if len(defaults) >= 2 and any(r.spans for r in defaults):
            times = [r.median_s for r in defaults]
            out.append(Spread(reduction, min(times), max(times), len(defaults)))
    return out


@dataclass(frozen=True)
class CaseResult:
    """One cross-node case: the default and the programs measured besides it."""

    case: tuple
    default_s: float
    best_s: float  # the fastest synthesized (non-default) program
    best_program: str
    programs: int

    @property
    def speedup(self) -> float:
        return self.default_s / self.best_s


def case_results(records: Sequence[ProgramTime]) -> list[CaseResult]:
    out = []
    for case, rs in group(records, lambda r: r.case).items():
        default = [r for r in rs if r.is_default]
        others = [r for r in rs if not r.is_default]
        if rs[0].spans and default and others:
            best = min(others, key=lambda r: r.median_s)
            out.append(CaseResult(case, default[0].median_s, best.median_s, best.program, len(rs)))
    return out


def default_ratios(records: Sequence[ProgramTime], other: Sequence[ProgramTime]) -> list[float]:
    """Per cross-node case measured under both baselines: the other baseline's
    default time over this one's."""
    mine = {r.case[:1] + r.case[2:]: r.median_s for r in records if r.is_default and r.spans}
    return [r.median_s / mine[r.case[:1] + r.case[2:]] for r in other
            if r.is_default and r.spans and r.case[:1] + r.case[2:] in mine]


@dataclass(frozen=True)
class Distribution:
    cases: int
    share_above_1: float
    mean: float
    median: float
    max: float
    min: float


def distribution(values: Sequence[float]) -> Distribution:
    v = np.asarray(values, dtype=float)
    if not len(v):
        return Distribution(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Distribution(len(v), float((v > 1).mean()), float(v.mean()), float(np.median(v)), float(v.max()), float(v.min()))


@dataclass(frozen=True)
class Predicted:
    """Measured and predicted times of one cluster's records, in file order."""

    records: list[ProgramTime]
    measured_s: np.ndarray
    prior_s: np.ndarray  # the topology file's parameters
    heldout_s: np.ndarray  # fitted on the other half of the cases
    fitted: NetworkProfile  # fitted on all cases (reported, not used for scores)
    heldout_efficiency_s: np.ndarray | None = None  # the same, fitting per-collective efficiencies too
    samples: tuple[Sample, ...] = ()  # as synth.cost.fit read them, in file order


def predictions(samples: Sequence[Sample], baseline: str, seed: int = 0) -> Predicted:
    """Prior, held-out and fitted predictions of one cluster's samples (of one
    topology, in file order)."""
    ms = list(samples)
    prior = NetworkProfile.prior(ms[0].reduction.topology)
    first, second = split_cases(ms, 0.5, seed)

    def heldout(efficiency: bool) -> np.ndarray:
        out = {}
        for fit_on, score_on in ((first, second), (second, first)):
            profile, _ = fit_profile(fit_on, prior, efficiency=efficiency)
            out.update(zip((m.line for m in score_on), predict_all(profile, score_on)))
        return np.array([out[m.line] for m in ms])

    fitted, _ = fit_profile(ms, prior)
    records = [program_time(m.record, baseline) for m in ms]
    return Predicted(records, np.array([m.median_s for m in ms]), predict_all(prior, ms), heldout(False), fitted,
                     heldout(True), tuple(ms))


@dataclass(frozen=True)
class Ranking:
    """Per case: how the simulator's order compares with the measured one."""

    case: tuple
    programs: int
    position: int  # of the measured fastest, in the predicted order (0 = first)
    pick_over_default: float | None  # time of the predicted-fastest / the default's; None without default
    cross_node: bool
    pick_over_best: float = 1.0  # time of the predicted-fastest / the measured fastest


def rankings(p: Predicted, predicted_s: np.ndarray) -> list[Ranking]:
    out = []
    for case, idx in group(range(len(p.records)), lambda i: p.records[i].case).items():
        idx = list(idx)
        if len(idx) < 2:
            continue
        pred, meas = predicted_s[idx], p.measured_s[idx]
        pick = int(np.argmin(pred))
        default = [j for j, i in enumerate(idx) if p.records[i].is_default]
        ratio = float(meas[pick] / meas[default[0]]) if default else None
        out.append(Ranking(case, len(idx), measured_best_position(pred, meas), ratio, bool(p.records[idx[0]].spans),
                           float(meas[pick] / meas.min())))
    return out


def top_k(rs: Sequence[Ranking], k: int, more_than_k: bool = False) -> tuple[float, int]:
    """Share of cases whose measured fastest is among the k predicted fastest, and
    the number of cases (only those with more than k programs if ``more_than_k``)."""
    chosen = [r for r in rs if r.programs > k] if more_than_k else list(rs)
    return (sum(r.position < k for r in chosen) / len(chosen) if chosen else math.nan), len(chosen)


def repeats(samples: Sequence[Sample]) -> list[float]:
    """Max over min of the medians of one program on the same reduction groups at
    one size (same ranks in the same order), measured more than once (in different
    cases of the run, minutes apart)."""
    times: dict[tuple, list[float]] = defaultdict(list)
    for s in samples:
        groups = tuple(sorted(tuple(int(d) for d in g) for g in s.reduction.reduction_groups))
        times[(groups, s.size_bytes, str(s.program), s.loads)].append(s.median_s)
    return [max(t) / min(t) for t in times.values() if len(t) > 1]


def noise(records: Sequence[ProgramTime]) -> Distribution:
    """Max over min of each measurement's iterations."""
    return distribution([r.max_s / r.min_s for r in records])


def crossover_density(points: Sequence[tuple[float, float]]) -> float | None:
    """Where a measured ratio (dense time / sparse time) crosses 1 over density:
    ``points`` are (density, ratio) in increasing density; the crossing is
    interpolated linearly in log density between the first two neighbouring
    points on either side of 1. None when the ratios never cross 1 (the caller
    says whether sparse won or lost everywhere)."""
    for (d0, r0), (d1, r1) in zip(points, points[1:]):
        if (r0 - 1) * (r1 - 1) <= 0 and r0 != r1:
            x = math.log(d0) + (1 - r0) / (r1 - r0) * (math.log(d1) - math.log(d0))
            return math.exp(x)
    return None
