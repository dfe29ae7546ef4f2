"""Contention-aware cost model: predicted seconds of a lowered program.

The package, one concern per module:

* :mod:`~synth.cost.nccl`: what NCCL 2.27.7 runs for a call (its choice of
  algorithm, protocol and channels, from its own cost table);
* :mod:`~synth.cost.priors`: what a call costs before any measurement (each
  protocol's payload fraction, NCCL's latencies), apart from NCCL's choosing
  factors;
* :mod:`~synth.cost.profile`: the parameters (:class:`NetworkProfile`: per level
  bandwidth, MPI latency and NCCL step latency per protocol, efficiencies, NCCL
  base latencies, the MPI call overhead) and their JSON document;
* :mod:`~synth.cost.model`: :class:`Model` = an :class:`Algorithm` (NCCL's
  choice, an NCCL algorithm forced, OpenMPI's tuned decisions) + a profile;
* :mod:`~synth.cost.links`: the links and their contention, the time of one
  round of concurrent flows;
* :mod:`~synth.cost.algorithms`: the library's algorithms as round patterns,
  and NCCL's latency steps;
* :mod:`~synth.cost.terms`: the linear form of a prediction (:class:`Features`);
* :mod:`~synth.cost.predict`: step and program predictions (:class:`Predictor`);
* :mod:`~synth.cost.pipeline`: the price of a program run pipelined over pieces;
* :mod:`~synth.cost.alltoall`: the all-to-all of expert parallelism (grouped
  point-to-point sends) on the links, with NCCL's measured cost per peer, and
  the price of all-to-all programs (:mod:`synth.synthesis.alltoall`);
* :mod:`~synth.cost.ranking`: programs of a reduction sorted by prediction;
* :mod:`~synth.cost.records`: measurement records (what ``bench`` writes and
  ``fit`` reads), with :mod:`~synth.cost.nccl_log` (what NCCL's tuning log says
  it chose) and :mod:`~synth.cost.corpus` (the public NCCL measurements of
  ``data/nccl/``);
* :mod:`~synth.cost.fit`: the parameters learned from records by least
  squares, and the accuracy report (``fit``, ``validate``);
* :mod:`~synth.cost.shared`: parameters per link kind and per algorithm that
  carry over to systems never measured, and the shipped calibration's file
  (what every NCCL prediction uses unless a profile or ``--profile prior`` is
  given); :mod:`~synth.cost.transfer` fits them on corpus calls of any
  systems, :mod:`~synth.cost.calibration` on the whole public corpus.

Imports: the shared top-level values and ``synthesis``; nothing of ``plan``,
``planner``, ``runtime``, ``export``, ``testbed`` or ``cli``. This ``__init__``
imports the model and prediction modules only (not the fit, records or corpus).

Steps and rounds. A step runs all its groups at once. A collective is a
sequence of rounds; in a round every member sends its flows, and the round takes
as long as its slowest flow, ``bytes / (bandwidth x share x efficiency)``, shares
counted over the flows of ALL groups of the step (this is where 16 GPUs sharing
one NIC show up). Latency: per level crossed and round in the MPI model; per
NCCL step (a base latency per algorithm and protocol, plus steps per level x the
level's latency for the protocol) in the NCCL models.

Linear form. Given the critical (slowest) flow of every round and NCCL's
choices, a prediction is linear in the latencies and in the inverse bandwidths
once the efficiencies are fixed: :class:`Features` records the terms so that
:mod:`synth.cost.fit` can fit the parameters.

``Profile`` is a deprecated alias of :class:`NetworkProfile` (the same class),
kept so that ``synth.Profile`` and ``synth.cost.Profile`` go on importing.
"""

from .alltoall import AllToAll, alltoall_of, alltoall_s
from .model import ALGORITHMS, Algorithm, Model
from .predict import Predictor, default_program, lowered_loads, predict_program, step_cost
from .profile import NetworkProfile, load_profile, profile_document, save_profile
from .ranking import Ranked, rank
from .terms import Features

Profile = NetworkProfile  # deprecated alias: the name before NetworkProfile

__all__ = [
    "ALGORITHMS", "AllToAll", "Algorithm", "Features", "Model", "NetworkProfile", "Predictor", "Profile", "Ranked",
    "alltoall_of", "alltoall_s", "default_program",
    "load_profile", "lowered_loads", "predict_program", "profile_document", "rank", "save_profile", "step_cost",
]
