"""The linear form of a prediction (see :mod:`synth.cost`): the terms that
multiply each parameter on the critical path, which :mod:`synth.fit` regresses
on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..language import Collective
from .profile import Profile


@dataclass
class Features:
    """Critical-path terms of a prediction: ``seconds(profile) = latency_s @
    latency_count + calls x call_overhead + sum_c (load[c] / bandwidth_Bps).sum()
    / efficiency[c]``."""

    latency_count: np.ndarray  # (levels,)
    load: dict[Collective, np.ndarray] = field(default_factory=dict)  # bytes/share, (levels,)
    calls: float = 0.0  # collective calls (steps)

    @classmethod
    def zero(cls, levels: int) -> "Features":
        return cls(np.zeros(levels))

    def add(self, other: "Features", times: float = 1.0) -> None:
        self.latency_count += times * other.latency_count
        self.calls += times * other.calls
        for c, x in other.load.items():
            self.load[c] = self.load.get(c, 0) + times * x

    def seconds(self, profile: Profile) -> float:
        total = float(profile.latency_s @ self.latency_count) + self.calls * profile.call_overhead_us * 1e-6
        for c, x in self.load.items():
            total += float((x / profile.bandwidth_Bps).sum()) / profile.efficiency_of(c)
        return total
