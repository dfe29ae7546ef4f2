"""Parameters that carry over to a system never measured.

A :class:`~synth.cost.profile.NetworkProfile` belongs to one topology: its bandwidths
and latencies are per level, so a fit of one system says nothing of another.
:class:`SharedParameters` expresses the same cost per *kind of link* instead,
so that measurements of some systems predict another:

* the achieved fraction of a level's stated bandwidth, per link kind: ``nvlink``,
  ``pcie``, and for a network its ``transport`` (one of
  :data:`~synth.topology.TRANSPORTS`; :data:`~synth.topology.DEFAULT_TRANSPORT` where the topology does
  not state it), since each network stack has its own latency and efficiency. The level's bandwidth is its
  topology's ``bandwidth_GBps`` times ``achieved[kind]``;
* the latency of one NCCL step per link kind and protocol (LL, LL128, Simple);
* per ``algorithm.protocol``: the efficiency (``ring.Simple`` stays 1: the
  achieved fractions carry the scale) and the base latency of a call, NCCL's
  own, which the fit keeps (docs/simulator.md says why);
* per timing tool: what it adds to each call beyond nccl-tests (a PyTorch loop
  around ``all_reduce`` measures its own dispatch too; nccl-tests adds 0 by
  definition, so the base latencies are NCCL's).

:meth:`SharedParameters.profile_for` turns them into a topology's profile;
:func:`fit_shared` fits them on corpus calls of any systems. The prior is
:mod:`synth.cost.priors` with every achieved fraction 1.

Fitting. With NCCL's choices and the critical flows fixed, a call's time is
linear in the latencies and a sum of ``load / (bandwidth x achieved x
efficiency)`` terms (:class:`~synth.cost.terms.Features`): Levenberg-Marquardt
on relative errors over the log of the fractions and efficiencies and the
latencies (held at >= 0; :func:`synth.cost.fit.levenberg_marquardt`, the
profiles' own), with a weak pull toward the prior (weight ``PULL``) against
what few calls say; a parameter no call exercises (:func:`exercised`: a
transport, link kind or protocol absent from the calls) is held at its prior
value, so a system whose transport the calls never measured is priced by the
prior there. The critical flows are then recomputed and the fit repeated
(``rounds``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import SynthError
from ..topology import Topology
from .fit import levenberg_marquardt
from .nccl import NCCL_KEYS, PROTOCOLS
from .profile import NetworkProfile
from .shared import ANCHOR, LINK_KINDS, PULL, TOOLS, SharedParameters, link_kind
from .terms import Features

__all__ = ["ANCHOR", "LINK_KINDS", "PULL", "TOOLS", "SharedParameters", "exercised", "fit_shared", "predict_calls"]


def predict_calls(shared: SharedParameters, samples: Sequence) -> np.ndarray:
    """Seconds of corpus calls (:class:`~synth.cost.fit.CallSample`) as their
    tool measures them: the profile's prediction plus the tool's overhead."""
    profiles = _profiles(shared, samples)
    overhead = dict(shared.tool_overhead_us)
    return np.array([s.features(profiles[s.topology]).seconds(profiles[s.topology])
                     + overhead.get(s.call.tool, 0.0) * 1e-6 for s in samples])


def _profiles(shared: SharedParameters, samples: Sequence) -> dict[Topology, NetworkProfile]:
    """The profile of each topology the samples are on."""
    return {t: shared.profile_for(t) for t in {s.topology for s in samples}}


# ---------------------------------------------------------------- the parameter vector

_K, _P, _N = len(LINK_KINDS), len(PROTOCOLS), len(NCCL_KEYS)
_LAT = slice(0, _K * _P)  # step latencies, seconds
_BASE = slice(_K * _P, _K * _P + _N)  # base latencies, seconds
_TOOL = slice(_BASE.stop, _BASE.stop + len(TOOLS))  # tool overheads, seconds
_LINEAR = _TOOL.stop  # the parameters a call's time is linear in come first
_ACH = slice(_LINEAR, _LINEAR + _K)  # log achieved fractions
_EFF = slice(_ACH.stop, _ACH.stop + _N)  # log efficiencies
_SIZE = _EFF.stop


def _vector(p: SharedParameters) -> np.ndarray:
    steps = dict(p.step_latency_us)
    return np.concatenate([np.ravel([steps[k] for k in LINK_KINDS]) * 1e-6,
                           np.array([v for _, v in p.base_latency_us]) * 1e-6,
                           np.array([v for _, v in p.tool_overhead_us]) * 1e-6,
                           np.log([v for _, v in p.achieved]), np.log([v for _, v in p.efficiency])])


def _parameters(x: np.ndarray) -> SharedParameters:
    lat = x[_LAT].reshape(_K, _P) * 1e6
    return SharedParameters(
        achieved=tuple((k, float(math.exp(v))) for k, v in zip(LINK_KINDS, x[_ACH])),
        step_latency_us=tuple((k, tuple(float(v) for v in row)) for k, row in zip(LINK_KINDS, lat)),
        base_latency_us=tuple((k, float(v * 1e6)) for k, v in zip(NCCL_KEYS, x[_BASE])),
        efficiency=tuple((k, float(math.exp(v))) for k, v in zip(NCCL_KEYS, x[_EFF])),
        tool_overhead_us=tuple((t, float(v * 1e6)) for t, v in zip(TOOLS, x[_TOOL])),
    )


@dataclass(frozen=True)
class _Terms:
    """One call's features arranged against the parameter vector: latency rows
    (linear part) and the transfer terms ``load / stated bandwidth`` per
    (link kind, key) (seconds at achieved fraction and efficiency 1)."""

    linear: np.ndarray  # (_LINEAR,)
    transfer: np.ndarray  # (_K, _N)


def _terms(f: Features, topology: Topology, tool: str) -> _Terms:
    kinds = [LINK_KINDS.index(link_kind(topology, i)) for i in range(len(topology.levels))]
    lat = np.zeros((_K, _P))
    if f.protocol_count is not None:
        for level, kind in enumerate(kinds):
            lat[kind] += f.protocol_count[level]
    base = np.array([f.base_count.get(k, 0.0) for k in NCCL_KEYS])
    stated = np.array([lv.bandwidth_GBps * 1e9 for lv in topology.levels])
    transfer = np.zeros((_K, _N))
    for key, load in f.load.items():
        if key not in NCCL_KEYS:
            raise SynthError(f"shared parameters cover NCCL's algorithms only, not the {key!r} term")
        for level, kind in enumerate(kinds):
            transfer[kind, NCCL_KEYS.index(key)] += load[level] / stated[level]
    if tool not in TOOLS:
        raise SynthError(f"unknown timing tool {tool!r}; known: {', '.join(TOOLS)}")
    return _Terms(np.concatenate([lat.ravel(), base, [t == tool for t in TOOLS]]), transfer)


def _predict(x: np.ndarray, linear: np.ndarray, transfer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of every call and their Jacobian against ``x``. ``linear``: (n,
    _LINEAR); ``transfer``: (n, _K, _N)."""
    scale = np.exp(-x[_ACH])[:, None] * np.exp(-x[_EFF])[None, :]  # (_K, _N)
    moved = transfer * scale[None]  # seconds of each (kind, key) term
    seconds = linear @ x[:_LINEAR] + moved.sum(axis=(1, 2))
    jac = np.empty((len(seconds), _SIZE))
    jac[:, :_LINEAR] = linear
    jac[:, _ACH] = -moved.sum(axis=2)
    jac[:, _EFF] = -moved.sum(axis=1)
    return seconds, jac


def fit_shared(samples: Sequence, prior: SharedParameters | None = None, rounds: int = 3,
               steps: int = 100) -> SharedParameters:
    """Shared parameters fitted on corpus calls (:class:`~synth.cost.fit.CallSample`)
    of any systems: relative least squares with a pull of weight :data:`PULL`
    toward ``prior`` (default :meth:`SharedParameters.prior`); :data:`ANCHOR`'s
    efficiency and the base latencies are held. ``rounds`` recomputations of the critical flows, each a
    Levenberg-Marquardt of at most ``steps`` iterations."""
    if not samples:
        raise SynthError("fit_shared: no measurements to fit")
    prior = prior or SharedParameters.prior()
    x0 = _vector(prior)
    x = x0.copy()
    measured = np.array([s.median_s for s in samples])
    free = np.ones(_SIZE, dtype=bool)
    free[_EFF.start + NCCL_KEYS.index(ANCHOR)] = False
    free[_TOOL.start + TOOLS.index("nccl-tests")] = False  # the reference
    free[_BASE] = False  # NCCL's base latency per call is kept: what a call waits for is fitted per step and link
    floor = np.full(_SIZE, -np.inf)
    floor[:_LINEAR] = 0.0  # latencies are not negative
    # the pull: latencies relative to their prior (or 10 us), logs absolutely
    pull_scale = np.ones(_SIZE)
    pull_scale[:_LINEAR] = np.maximum(np.abs(x0[:_LINEAR]), 1e-5)
    # the pull toward the prior: one more row per parameter, "measuring" its prior value
    target = np.concatenate([measured, x0])
    weight = np.concatenate([1.0 / measured, PULL / pull_scale])
    for _ in range(rounds):
        profiles = _profiles(_parameters(x), samples)
        rows = [_terms(s.features(profiles[s.topology]), s.topology, s.call.tool) for s in samples]
        linear = np.array([r.linear for r in rows])
        transfer = np.array([r.transfer for r in rows])
        held = free & ~exercised(linear, transfer)  # no call depends on them: they stay the prior's, exactly
        x[held] = x0[held]

        def model(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            seconds, jac = _predict(v, linear, transfer)
            return np.concatenate([seconds, v]), np.vstack([jac, np.eye(_SIZE)])

        x, *_ = levenberg_marquardt(x, free & ~held, floor, np.full(_SIZE, np.inf), target, weight, *model(x), model,
                                    steps)
    return _parameters(x)


def exercised(linear: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """Per parameter, whether any call's time depends on it: a latency that some
    call counts, the achieved fraction of a link kind some call moves bytes
    over, the efficiency of a key some call moves bytes with. A parameter no
    call exercises has nothing to be fitted to, so :func:`fit_shared` keeps its
    prior value (a transport never measured is priced by NCCL's constants and
    its topology's numbers, not by a fit to nothing)."""
    used = np.zeros(_SIZE, dtype=bool)
    used[:_LINEAR] = (linear != 0).any(axis=0)
    used[_ACH] = (transfer != 0).any(axis=(0, 2))
    used[_EFF] = (transfer != 0).any(axis=(0, 1))
    return used
