"""Profiles: the cost model's parameters, and their versioned JSON document
(written by ``synth-reduce fit``).

A profile holds, per level (outermost first): ``bandwidth_GBps`` (per port),
``latency_us`` (per level crossed, the MPI model's) and, for the NCCL models, the
latency of one step per protocol (``protocol_latency_us``: LL, LL128, Simple);
per efficiency key: ``efficiency`` (divides the bandwidth terms; the keys are the
five collectives for the MPI model and ``algorithm.protocol`` such as
``ring.LL128`` for the NCCL models); per ``algorithm.protocol``: the latency of a
call (``base_latency_us``); ``call_overhead_us`` (per step, MPI model); and the
:attr:`~synth.topology.Topology.structure` of the topology it belongs to.

The prior (:meth:`NetworkProfile.prior`) is the topology's numbers and, for the NCCL
models, each protocol's payload fraction as efficiency and NCCL 2.27.7's own
latencies (:mod:`synth.cost.priors`; NCCL's choosing factors stay in its
choice, :mod:`synth.cost.nccl`). A profile built by hand with some of these left out gets
the prior's efficiencies and base latencies and ``latency_us`` for every protocol.
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
from ..synthesis.language import Collective
from ..topology import Topology, describe_structure
from .nccl import NCCL_KEYS, PROTOCOLS
from .priors import BASE_PRIOR_US, EFFICIENCY_PRIOR, hop_latency_prior_us

PROFILE_SCHEMA = "synth-reduce/profile"
PROFILE_VERSION = 2

EFFICIENCY_KEYS = tuple(c.value for c in Collective) + NCCL_KEYS
DEFAULT_EFFICIENCY = {**{c.value: 1.0 for c in Collective}, **EFFICIENCY_PRIOR}


@dataclass(frozen=True)
class NetworkProfile:
    """Effective parameters per level, per efficiency key and per call (see the
    module docstring). Invariant: after construction ``efficiency`` and
    ``base_latency_us`` list every key in a fixed order and
    ``protocol_latency_us`` has one (LL, LL128, Simple) triple per level."""

    topology: str
    level_names: tuple[str, ...]
    bandwidth_GBps: tuple[float, ...]
    latency_us: tuple[float, ...]
    efficiency: tuple[tuple[str, float], ...] = ()
    call_overhead_us: float = 0.0  # per collective call (step) of the MPI model
    protocol_latency_us: tuple[tuple[float, float, float], ...] = ()
    base_latency_us: tuple[tuple[str, float], ...] = ()
    structure: tuple = ()  # Topology.structure of its topology; () = checked on name and level names only

    def __post_init__(self) -> None:
        given = dict(self.efficiency)
        unknown = set(given) - set(EFFICIENCY_KEYS)
        if unknown:
            raise SynthError(f"unknown efficiency key(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(EFFICIENCY_KEYS)}")
        object.__setattr__(self, "efficiency", tuple((k, float(given.get(k, DEFAULT_EFFICIENCY[k])))
                                                     for k in EFFICIENCY_KEYS))
        base = dict(self.base_latency_us)
        unknown = set(base) - set(NCCL_KEYS)
        if unknown:
            raise SynthError(f"unknown base latency key(s) {', '.join(sorted(unknown))}; known: {', '.join(NCCL_KEYS)}")
        object.__setattr__(self, "base_latency_us", tuple((k, float(base.get(k, BASE_PRIOR_US[k]))) for k in NCCL_KEYS))
        if not self.protocol_latency_us:
            object.__setattr__(self, "protocol_latency_us", tuple((l, l, l) for l in self.latency_us))

    @classmethod
    def prior(cls, topology: Topology) -> "NetworkProfile":
        return cls(
            topology=topology.name,
            level_names=topology.level_names,
            bandwidth_GBps=tuple(lv.bandwidth_GBps for lv in topology.levels),
            latency_us=tuple(lv.latency_us for lv in topology.levels),
            protocol_latency_us=tuple(hop_latency_prior_us(topology.link(i)) for i in range(len(topology.levels))),
            structure=topology.structure,
        )

    def efficiency_of(self, key: str | Collective) -> float:
        return self._efficiency[key.value if isinstance(key, Collective) else key]

    def base_us(self, key: str) -> float:
        return self._base[key]

    @cached_property
    def _efficiency(self) -> dict[str, float]:
        return dict(self.efficiency)

    @cached_property
    def _base(self) -> dict[str, float]:
        return dict(self.base_latency_us)

    @cached_property
    def latency_s(self) -> np.ndarray:
        return np.asarray(self.latency_us) * 1e-6

    @cached_property
    def protocol_latency_s(self) -> np.ndarray:
        """(levels, 3): seconds of one step per level and protocol (LL, LL128, Simple)."""
        return np.asarray(self.protocol_latency_us, dtype=float).reshape(len(self.level_names), 3) * 1e-6

    @cached_property
    def bandwidth_Bps(self) -> np.ndarray:
        return np.asarray(self.bandwidth_GBps) * 1e9

    def check_matches(self, topology: Topology, source: str = "profile") -> None:
        """SynthError unless this profile belongs to ``topology``: the same name and
        levels and, when recorded, the same structure (counts, ports, fabric, link,
        nvlinks, nvls, compute capability: a ``--scale`` changes it)."""
        if self.topology != topology.name or self.level_names != topology.level_names:
            raise SynthError(
                f"{source} was fitted for topology '{self.topology}' with levels "
                f"{', '.join(self.level_names)}, not '{topology.name}' with levels "
                f"{', '.join(topology.level_names)}; fit a profile for this topology"
            )
        if self.structure and self.structure != topology.structure:
            raise SynthError(
                f"{source} was fitted for '{self.topology}' as {describe_structure(self.structure)}, not as "
                f"{topology.describe_structure()}; fit a profile for this shape of the topology "
                f"(a --scale or an edited level changes it)"
            )


def profile_document(profile: NetworkProfile, report: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": PROFILE_SCHEMA, "version": PROFILE_VERSION, "topology": profile.topology}
    if profile.structure:
        doc["structure"] = {
            "levels": [dict(zip(("name", "count", "ports", "fabric", "link", "nvlinks", "nvls"), lv))
                       for lv in profile.structure[:-1]],
            "compute_capability": profile.structure[-1][1],
        }
    doc["levels"] = [
        {"name": n, "bandwidth_GBps": b, "latency_us": l, "nccl_latency_us": dict(zip(PROTOCOLS, p))}
        for n, b, l, p in zip(profile.level_names, profile.bandwidth_GBps, profile.latency_us,
                              profile.protocol_latency_us)
    ]
    doc["efficiency"] = dict(profile.efficiency)
    doc["nccl_base_latency_us"] = dict(profile.base_latency_us)
    doc["call_overhead_us"] = profile.call_overhead_us
    doc["fit"] = report or {}
    return doc


def save_profile(path: str | Path, profile: NetworkProfile, report: dict[str, Any] | None = None) -> None:
    write_document(path, "profile", profile_document(profile, report))


def load_profile(path: str | Path) -> NetworkProfile:
    source = str(path)
    doc = read_document(path, "profile", PROFILE_SCHEMA, PROFILE_VERSION, fix="re-fit it with synth-reduce fit")
    try:
        levels = doc["levels"]
        structure: tuple = ()
        if "structure" in doc:
            shape = doc["structure"]
            structure = tuple(
                (str(lv["name"]), int(lv["count"]), int(lv["ports"]), str(lv["fabric"]), str(lv["link"]),
                 None if lv["nvlinks"] is None else int(lv["nvlinks"]), bool(lv["nvls"]))
                for lv in shape["levels"]
            ) + (("compute_capability", float(shape["compute_capability"])),)
        profile = NetworkProfile(
            topology=str(doc["topology"]),
            level_names=tuple(str(lv["name"]) for lv in levels),
            bandwidth_GBps=tuple(float(lv["bandwidth_GBps"]) for lv in levels),
            latency_us=tuple(float(lv["latency_us"]) for lv in levels),
            efficiency=tuple((str(k), float(v)) for k, v in doc["efficiency"].items()),
            call_overhead_us=float(doc.get("call_overhead_us", 0.0)),
            protocol_latency_us=tuple(tuple(float(lv["nccl_latency_us"][p]) for p in PROTOCOLS) for lv in levels),
            base_latency_us=tuple((str(k), float(v)) for k, v in doc.get("nccl_base_latency_us", {}).items()),
            structure=structure,
        )
    except SynthError as exc:
        raise SynthError(f"{source}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError):
        raise SynthError(f"{source}: not a valid profile: expected topology, levels[{{name, bandwidth_GBps, "
                         f"latency_us, nccl_latency_us}}], efficiency, optional structure, nccl_base_latency_us, "
                         f"call_overhead_us") from None
    numbers = (profile.call_overhead_us, *profile.latency_us, *(x for p in profile.protocol_latency_us for x in p),
               *(v for _, v in profile.base_latency_us))
    if not all(v >= 0 and math.isfinite(v) for v in numbers):
        raise SynthError(f"{source}: latencies and call_overhead_us must be non-negative numbers")
    if any(not (b > 0 and math.isfinite(b)) for b in profile.bandwidth_GBps) or any(
        not (e > 0 and math.isfinite(e)) for _, e in profile.efficiency
    ):
        raise SynthError(f"{source}: bandwidths and efficiencies must be positive numbers")
    return profile
