"""The cost's parameters per kind of link (:class:`SharedParameters`) and the
shipped calibration's file, which every NCCL prediction reads
(:func:`shipped`; how it is fitted: :mod:`synth.cost.calibration`; the fit
itself: :mod:`synth.cost.transfer`).

A :class:`~synth.cost.profile.NetworkProfile` belongs to one topology; these
parameters are per link kind (NVLink, PCIe, a network per transport) and per
``algorithm.protocol``, so they price any topology
(:meth:`SharedParameters.profile_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..caches import memoised
from ..documents import read_document
from ..errors import SynthError
from ..resources import profiles_dir
from ..topology import TRANSPORTS, Topology
from .nccl import NCCL_KEYS, PROTOCOLS
from .priors import BASE_PRIOR_US, EFFICIENCY_PRIOR, hop_latency_prior_us
from .profile import NetworkProfile

CALIBRATION_SCHEMA = "synth-reduce/calibration"
CALIBRATION_VERSION = 1
SHIPPED_NAME = "nccl-calibration.json"
SIGNIFICANT_DIGITS = 6  # the shipped numbers are rounded to this many digits

LINK_KINDS = ("nvlink", "pcie") + TRANSPORTS  # a network that states no transport is priced as DEFAULT_TRANSPORT
TOOLS = ("nccl-tests", "torch.distributed all_reduce_bench.py")  # the corpus's; nccl-tests is the reference
ANCHOR = "ring.Simple"  # its efficiency stays at the prior: the achieved fractions carry the scale
PULL = 0.05  # weight of the prior per parameter, against relative errors of 1 per call


@dataclass(frozen=True)
class SharedParameters:
    """The cost's parameters per link kind and per ``algorithm.protocol`` (see
    the module docstring). Invariant: every mapping lists every key of
    :data:`LINK_KINDS` or :data:`~synth.cost.nccl.NCCL_KEYS`, in that order."""

    achieved: tuple[tuple[str, float], ...]  # link kind -> fraction of the stated bandwidth
    step_latency_us: tuple[tuple[str, tuple[float, float, float]], ...]  # link kind -> (LL, LL128, Simple)
    base_latency_us: tuple[tuple[str, float], ...]  # algorithm.protocol -> us per call
    efficiency: tuple[tuple[str, float], ...]  # algorithm.protocol -> payload efficiency
    tool_overhead_us: tuple[tuple[str, float], ...] = tuple((t, 0.0) for t in TOOLS)  # per call, over nccl-tests

    @classmethod
    def prior(cls) -> "SharedParameters":
        return cls(
            achieved=tuple((k, 1.0) for k in LINK_KINDS),
            step_latency_us=tuple((k, tuple(hop_latency_prior_us("net" if k in TRANSPORTS else k)))
                                  for k in LINK_KINDS),
            base_latency_us=tuple((k, BASE_PRIOR_US[k]) for k in NCCL_KEYS),
            efficiency=tuple((k, EFFICIENCY_PRIOR[k]) for k in NCCL_KEYS),
        )

    def profile_for(self, topology: Topology) -> NetworkProfile:
        """The profile of ``topology`` these parameters give (what nccl-tests
        would measure: no tool overhead)."""
        achieved, steps = dict(self.achieved), dict(self.step_latency_us)
        kinds = [link_kind(topology, i) for i in range(len(topology.levels))]
        return NetworkProfile(
            topology=topology.name,
            level_names=topology.level_names,
            bandwidth_GBps=tuple(lv.bandwidth_GBps * achieved[k] for lv, k in zip(topology.levels, kinds)),
            latency_us=tuple(lv.latency_us for lv in topology.levels),
            efficiency=self.efficiency,
            protocol_latency_us=tuple(steps[k] for k in kinds),
            base_latency_us=self.base_latency_us,
            structure=topology.structure,
        )

    def to_dict(self) -> dict:
        return {"achieved": dict(self.achieved), "tool_overhead_us": dict(self.tool_overhead_us),
                "step_latency_us": {k: dict(zip(PROTOCOLS, v)) for k, v in self.step_latency_us},
                "base_latency_us": dict(self.base_latency_us), "efficiency": dict(self.efficiency)}


def link_kind(topology: Topology, level: int) -> str:
    """The level's link kind: its link, or a network's transport (stated, or
    the documented default :data:`~synth.topology.DEFAULT_TRANSPORT`; one of
    LINK_KINDS: the topology's loader admits no other)."""
    path = topology.network_path(level)
    return topology.link(level) if path is None else path.transport




def _round(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}") if x and math.isfinite(x) else float(x)


def parameters_from_dict(doc: Any, where: str) -> SharedParameters:
    """:class:`SharedParameters` from their ``to_dict`` form (numbers rounded to
    :data:`SIGNIFICANT_DIGITS`); SynthError naming ``where`` if a key is missing."""
    try:
        return SharedParameters(
            achieved=tuple((k, _round(float(doc["achieved"][k]))) for k in LINK_KINDS),
            step_latency_us=tuple((k, tuple(_round(float(doc["step_latency_us"][k][p])) for p in PROTOCOLS))
                                  for k in LINK_KINDS),
            base_latency_us=tuple((k, _round(float(doc["base_latency_us"][k]))) for k in NCCL_KEYS),
            efficiency=tuple((k, _round(float(doc["efficiency"][k]))) for k in NCCL_KEYS),
            tool_overhead_us=tuple((t, _round(float(doc["tool_overhead_us"][t]))) for t in TOOLS),
        )
    except (KeyError, TypeError, ValueError):
        raise SynthError(f"{where}: not valid calibration parameters: expected achieved, step_latency_us, "
                         f"base_latency_us, efficiency and tool_overhead_us for every link kind and key") from None


def load_calibration(path: str | Path) -> SharedParameters:
    doc = read_document(path, "calibration", CALIBRATION_SCHEMA, CALIBRATION_VERSION,
                        fix="regenerate it with python scripts/nccl_accuracy.py --calibrate")
    return parameters_from_dict(doc.get("parameters"), str(path))


def shipped_path() -> Path:
    return profiles_dir() / SHIPPED_NAME


@memoised(maxsize=1)
def shipped() -> SharedParameters:
    """The shipped calibration (read once)."""
    return load_calibration(shipped_path())
