"""The linear form of a prediction (see :mod:`synth.cost`): the terms that
multiply each parameter on the critical path, which :mod:`synth.cost.fit` regresses
on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .profile import NetworkProfile


@dataclass
class Features:
    """Critical-path terms of a prediction::

        seconds(profile) = latency_s @ latency_count + calls x call_overhead
                         + sum(protocol_latency_s * protocol_count)
                         + sum_k base_count[k] x base_latency[k]
                         + sum_k (load[k] / bandwidth_Bps).sum() / efficiency[k]

    ``latency_count`` counts the MPI model's level crossings, ``protocol_count``
    the NCCL models' steps per (level, protocol) (None: none; :attr:`steps`
    creates it), ``base_count`` their calls per
    ``algorithm.protocol``; ``load[k]`` is bytes / (lanes x share) at the
    bottleneck levels of the transfers of efficiency key ``k``."""

    latency_count: np.ndarray  # (levels,)
    load: dict[str, np.ndarray] = field(default_factory=dict)  # efficiency key -> (levels,)
    calls: float = 0.0  # collective calls (steps) of the MPI model
    protocol_count: np.ndarray | None = None  # (levels, 3): LL, LL128, Simple
    base_count: dict[str, float] = field(default_factory=dict)  # algorithm.protocol -> calls

    @classmethod
    def zero(cls, levels: int) -> "Features":
        return cls(np.zeros(levels))

    @property
    def steps(self) -> np.ndarray:
        """``protocol_count``, created on first use (most rounds have none)."""
        if self.protocol_count is None:
            self.protocol_count = np.zeros((len(self.latency_count), 3))
        return self.protocol_count

    def add(self, other: "Features", times: float = 1.0) -> None:
        self.latency_count += times * other.latency_count
        if other.protocol_count is not None:
            self.steps[...] += times * other.protocol_count
        self.calls += times * other.calls
        for k, x in other.load.items():
            self.load[k] = self.load.get(k, 0) + times * x
        for k, n in other.base_count.items():
            self.base_count[k] = self.base_count.get(k, 0.0) + times * n

    def seconds(self, profile: NetworkProfile) -> float:
        total = float(profile.latency_s @ self.latency_count) + self.calls * profile.call_overhead_us * 1e-6
        if self.protocol_count is not None:
            total += float((profile.protocol_latency_s * self.protocol_count).sum())
        total += sum(n * profile.base_us(k) for k, n in self.base_count.items()) * 1e-6
        for k, x in self.load.items():
            total += float((x / profile.bandwidth_Bps).sum()) / profile.efficiency_of(k)
        return total
