"""The job planner's compute models and their files.

Two models, one file schema (``synth-reduce/compute-profile``): version 2 is
the per-operation model (:mod:`synth.planner.operations`, composed per layer
by :mod:`synth.planner.layercompute` and per stage by
:mod:`synth.planner.stagecompute`), fitted per GPU from operation
timings (``synth-reduce calibrate``); a shipped one (``profiles/``) is the
default for the devices it names. Version 1 is the compute-efficiency curve
below, the default for every other device (:data:`DEFAULT_COMPUTE`, fitted on
A100 steps).

The curve: how much of a device's peak
a training step sustains, as a function of the per-device GEMM work.

Tensor parallelism (t) and small micro-batches (b) shrink the GEMMs each device
runs; small GEMMs reach a smaller fraction of peak (fixed per-kernel costs,
tiles that do not fill the device). The planner models this with one saturating
curve of ``x``, the FLOPs one device spends on one layer for one micro-batch
(forward, backward and recomputation: roughly ``72 b s h^2 / t``)::

    efficiency(x) = efficiency_max * x / (x + half_flops)

so that a micro-batch's compute time is ``flops / (peak * efficiency(x))`` =
``flops / (peak * efficiency_max) + layers * half_flops / (peak *
efficiency_max)``: a peak-bound part and a fixed cost per layer and micro-batch.
Both parameters are learned (:mod:`synth.planner.stepfit`, ``synth-reduce fit`` on
step-time records) by least squares on ``1 / efficiency = 1 / efficiency_max +
(half_flops / efficiency_max) / x``, which is linear in the two unknowns.

:data:`DEFAULT_COMPUTE` is that fit on the ten Megatron-LM SC'21 Table 1 runs
(``data/megatron_sc21_steps.jsonl``, ``scripts/megatron_sc21.py``); see
docs/planner.md for what it means and where it does not carry over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np

from ..caches import memoised
from ..documents import read_document, write_document
from ..errors import SynthError
from ..resources import profiles_dir
from .operations import OperationProfile, operation_profile_from_dict

SCHEMA = "synth-reduce/compute-profile"
VERSION = 1  # the efficiency curve
OPERATIONS_VERSION = 2  # the per-operation model


@dataclass(frozen=True)
class EfficiencyCurve:
    """The compute-efficiency curve (the version-1 compute profile):
    ``efficiency(x) = efficiency_max * x / (x + half_flops)`` (module docstring);
    ``source`` says where the parameters come from."""

    efficiency_max: float
    half_flops: float
    source: str = ""

    def __post_init__(self) -> None:
        if not (0 < self.efficiency_max <= 1 and math.isfinite(self.efficiency_max)):
            raise SynthError(f"compute profile: efficiency_max must be in (0, 1], got {self.efficiency_max}")
        if not (self.half_flops >= 0 and math.isfinite(self.half_flops)):
            raise SynthError(f"compute profile: half_flops must be a number >= 0, got {self.half_flops}")

    def efficiency(self, flops_per_layer: float) -> float:
        """Sustained fraction of peak for ``flops_per_layer`` per micro-batch."""
        return self.efficiency_max * flops_per_layer / (flops_per_layer + self.half_flops)

    def to_dict(self) -> dict[str, Any]:
        return {"efficiency_max": self.efficiency_max, "half_flops": self.half_flops, "source": self.source}


# Fitted by `python scripts/megatron_sc21.py fit` on data/megatron_sc21_steps.jsonl
# with the default communication model (tests/planner/test_planner_records.py checks that a refit
# gives these numbers; regenerate them when the default cost model changes).
DEFAULT_COMPUTE = EfficiencyCurve(
    efficiency_max=0.6473240701528752,
    half_flops=0.0,
    source="least-squares fit on the 10 Megatron-LM SC'21 Table 1 runs (data/megatron_sc21_steps.jsonl)",
)


@dataclass(frozen=True)
class CurveFit:
    """The fitted curve and its residuals: relative errors of the predicted
    compute times (1/efficiency) against the implied ones."""

    profile: EfficiencyCurve
    points: int
    median_rel_error: float
    max_rel_error: float


def fit_curve(flops_per_layer: Sequence[float], efficiency: Sequence[float], source: str = "") -> CurveFit:
    """Least squares on relative errors of ``1/efficiency = u + v/x`` with
    ``u >= 1`` (never above peak) and ``v >= 0`` (efficiency never rises as GEMMs
    shrink); ``efficiency_max = 1/u``, ``half_flops = v/u``."""
    x = np.asarray(flops_per_layer, dtype=float)
    e = np.asarray(efficiency, dtype=float)
    if len(x) == 0:
        raise SynthError("fit: no step records to fit the compute curve to")
    if (e <= 0).any() or not np.isfinite(e).all() or (x <= 0).any():
        raise SynthError("fit: implied efficiencies and per-layer FLOPs must be positive")
    # residual of record r: (u + v / x_r) * e_r - 1 (relative error of the predicted time)
    a = np.stack([e, e / x], axis=1)
    u, v = np.linalg.lstsq(a, np.ones_like(e), rcond=None)[0] if len(x) > 1 else (1 / e[0], 0.0)
    if v < 0:  # efficiency cannot grow as GEMMs shrink: a flat curve
        u, v = float(np.sum(e) / np.sum(e * e)), 0.0
    if u < 1:  # never above peak: pin efficiency_max at 1 and refit v
        u = 1.0
        v = max(0.0, float(np.sum((e / x) * (1 - e)) / np.sum((e / x) ** 2)))
    rel = np.abs((u + v / x) * e - 1)
    profile = EfficiencyCurve(1.0 / u, v / u, source)
    return CurveFit(profile, len(x), float(np.median(rel)), float(rel.max()))


def compute_profile_document(fit: CurveFit, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = {"schema": SCHEMA, "version": VERSION}
    doc.update(fit.profile.to_dict())
    doc["fit"] = {"points": fit.points, "median_rel_error": fit.median_rel_error,
                  "max_rel_error": fit.max_rel_error, **(extra or {})}
    return doc


def save_compute_profile(path: str | Path, fit: CurveFit, extra: dict[str, Any] | None = None) -> None:
    write_document(path, "compute profile", compute_profile_document(fit, extra))


def load_compute_profile(path: str | Path) -> "ComputeModel":
    """A compute profile file: version 1 (the efficiency curve of this module)
    or version 2 (the per-operation model, :mod:`synth.planner.operations`)."""
    doc = read_document(path, "compute profile", SCHEMA, (VERSION, OPERATIONS_VERSION),
                        fix="re-fit it with synth-reduce calibrate or synth-reduce fit")
    try:
        if doc["version"] == OPERATIONS_VERSION:
            profile = operation_profile_from_dict(doc)
            return profile if profile.source else replace(profile, source=str(path))
        return EfficiencyCurve(float(doc["efficiency_max"]), float(doc["half_flops"]),
                              str(doc.get("source") or path))
    except (KeyError, TypeError, ValueError):
        raise SynthError(f"{path}: not a valid compute profile: expected efficiency_max and half_flops "
                         "numbers") from None
    except SynthError as exc:
        raise SynthError(f"{path}: {exc}") from None


def operation_profile_document(profile: OperationProfile) -> dict[str, Any]:
    return {"schema": SCHEMA, "version": OPERATIONS_VERSION, **profile.to_dict()}


def save_operation_profile(path: str | Path, profile: OperationProfile) -> None:
    write_document(path, "compute profile", operation_profile_document(profile))


@memoised(maxsize=1)
def shipped_operation_profiles() -> tuple[OperationProfile, ...]:
    """The per-operation profiles shipped with synth-reduce (``profiles/``)."""
    found = []
    for path in sorted(profiles_dir().glob("*.compute.json")):
        profile = load_compute_profile(path)
        if isinstance(profile, OperationProfile):
            found.append(profile)
    return tuple(found)


def default_compute(device_name: str) -> "ComputeModel":
    """The shipped per-operation profile of ``device_name``, else
    :data:`DEFAULT_COMPUTE` (the efficiency curve fitted on A100 steps)."""
    for profile in shipped_operation_profiles():
        if profile.applies_to(device_name):
            return profile
    return DEFAULT_COMPUTE


def shipped_profile_for(name: str) -> OperationProfile:
    """The shipped per-operation profile named ``name`` (its file stem, e.g.
    ``h100-sxm5-80gb``) or applying to the device ``name``; SynthError listing
    what is shipped otherwise."""
    profiles = shipped_operation_profiles()
    for profile in profiles:
        if profile.name.casefold() == name.casefold() or profile.applies_to(name):
            return profile
    known = "; ".join(f"{p.name} ({', '.join(p.devices)})" for p in profiles) or "none"
    raise SynthError(f"--device {name}: no shipped per-operation compute profile (shipped: {known}); measure "
                     "this GPU with synth-reduce calibrate --out PROFILE.json and pass --compute-profile PROFILE.json")


ComputeModel = Union[EfficiencyCurve, OperationProfile]
