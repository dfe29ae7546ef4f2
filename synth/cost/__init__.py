"""Contention-aware cost model: predicted seconds of a lowered program.

The package, one concern per module:

* :mod:`~synth.cost.profile`: the parameters (:class:`Profile`: per level
  bandwidth and latency, per collective efficiency, per call overhead) and their
  JSON document;
* :mod:`~synth.cost.model`: :class:`Model` = an :class:`Algorithm` (NCCL ring or
  tree, OpenMPI's tuned decisions) + a profile;
* :mod:`~synth.cost.links`: the links and their contention, the time of one
  round of concurrent flows;
* :mod:`~synth.cost.algorithms`: the library's algorithms as round patterns;
* :mod:`~synth.cost.terms`: the linear form of a prediction (:class:`Features`);
* :mod:`~synth.cost.predict`: step and program predictions (:class:`Predictor`);
* :mod:`~synth.cost.ranking`: programs of a reduction sorted by prediction.

Steps and rounds. A step runs all its groups at once. A collective is a
sequence of rounds; in a round every member sends its flows, and the round takes
as long as its slowest flow: ``latency + bytes / (bandwidth x share x
efficiency[collective])``, shares counted over the flows of ALL groups of the
step (this is where 16 GPUs sharing one NIC show up).

Linear form. Given the critical (slowest) flow of every round, a prediction is
``sum_l latency_us[l] * L[l] + call_overhead_us * calls + sum_c sum_l X[c][l] /
(bandwidth_GBps[l] * efficiency[c])`` (``calls``: the program's steps):
:class:`Features` records ``L``, ``calls`` and ``X`` so that :mod:`synth.fit`
can fit the parameters by least squares.
"""

from .model import ALGORITHMS, Algorithm, Model
from .predict import Predictor, default_program, lowered_loads, predict_program, step_cost
from .profile import Profile, load_profile, profile_document, save_profile
from .ranking import Ranked, rank
from .terms import Features

__all__ = [
    "ALGORITHMS", "Algorithm", "Features", "Model", "Predictor", "Profile", "Ranked", "default_program",
    "load_profile", "lowered_loads", "predict_program", "profile_document", "rank", "save_profile", "step_cost",
]
