"""Profiles: the cost model's parameters per level and per collective, and
their versioned JSON document (written by ``synth-reduce fit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..documents import read_document, write_document
from ..errors import SynthError
from ..language import Collective
from ..topology import Topology

PROFILE_SCHEMA = "synth-reduce/profile"
PROFILE_VERSION = 1


@dataclass(frozen=True)
class Profile:
    """Effective parameters per level (outermost first) and per collective.

    The prior comes from the topology file (no call overhead); :mod:`synth.fit`
    learns one from measurements. ``efficiency`` divides the bandwidth terms of a
    collective; ``call_overhead_us`` is added once per step (a library call's
    software cost: a kernel launch, or MPI's bookkeeping on the CPU testbed)."""

    topology: str
    level_names: tuple[str, ...]
    bandwidth_GBps: tuple[float, ...]
    latency_us: tuple[float, ...]
    efficiency: tuple[tuple[str, float], ...] = tuple((c.value, 1.0) for c in Collective)
    call_overhead_us: float = 0.0  # per collective call (step), whatever it moves

    @classmethod
    def prior(cls, topology: Topology) -> "Profile":
        return cls(
            topology=topology.name,
            level_names=topology.level_names,
            bandwidth_GBps=tuple(lv.bandwidth_GBps for lv in topology.levels),
            latency_us=tuple(lv.latency_us for lv in topology.levels),
        )

    def efficiency_of(self, collective: Collective) -> float:
        return self._efficiency[collective.value]

    @cached_property
    def _efficiency(self) -> dict[str, float]:
        return dict(self.efficiency)

    @cached_property
    def latency_s(self) -> np.ndarray:
        return np.asarray(self.latency_us) * 1e-6

    @cached_property
    def bandwidth_Bps(self) -> np.ndarray:
        return np.asarray(self.bandwidth_GBps) * 1e9

    def check_matches(self, topology: Topology, source: str = "profile") -> None:
        if self.topology != topology.name or self.level_names != topology.level_names:
            raise SynthError(
                f"{source} was fitted for topology '{self.topology}' with levels "
                f"{', '.join(self.level_names)}, not '{topology.name}' with levels "
                f"{', '.join(topology.level_names)}; fit a profile for this topology"
            )


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
