"""What a prediction models: the collective library's algorithms and the
parameters of the links (a :class:`Model` = an :class:`Algorithm` + a profile).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import SynthError
from ..topology import Topology
from .nccl_rules import NCCL_VERSION, rules_for
from .profile import NetworkProfile, load_profile
from .shared import shipped

PRIOR = "prior"  # --profile prior: the topology's numbers and NCCL's own constants, no calibration


class Algorithm(enum.Enum):
    """How the library runs each collective (see :mod:`synth.cost.nccl` and
    :mod:`synth.cost.algorithms`)."""

    NCCL = "nccl"  # NCCL's own choice of algorithm, protocol and channels (the default)
    RING = "ring"  # NCCL forced to its ring (NCCL_ALGO=Ring), protocol by NCCL's tuning
    TREE = "tree"  # NCCL forced to its tree (NCCL_ALGO=Tree): AllReduce; rings otherwise
    NVLS = "nvls"  # NCCL_ALGO=NVLS where NCCL has it (one node with NVLink SHARP), rings otherwise
    NVLS_TREE = "nvlstree"  # NCCL_ALGO=NVLSTree (AllReduce across nodes with NVLink SHARP), rings otherwise
    PAT = "pat"  # NCCL_ALGO=PAT (ReduceScatter, AllGather with one GPU per node), rings otherwise
    MPI = "mpi"  # OpenMPI 5.0 coll/tuned's fixed decisions (the CPU testbed)

    __hash__ = object.__hash__

    @property
    def title(self) -> str:
        if self is Algorithm.MPI:
            return "MPI (OpenMPI tuned defaults)"
        if self is Algorithm.NCCL:
            return f"NCCL {NCCL_VERSION}"
        return f"NCCL {NCCL_VERSION} forced {self.value}"

    @property
    def forced(self) -> tuple[str, ...] | None:
        """The NCCL algorithms allowed (``NCCL_ALGO``); None: NCCL chooses."""
        return None if self in (Algorithm.NCCL, Algorithm.MPI) else (self.value,)

    @classmethod
    def from_text(cls, text: str) -> "Algorithm":
        for algorithm in cls:
            if algorithm.value == text:
                return algorithm
        raise SynthError(f"--algo {text}: choose one of {', '.join(a.value for a in cls)}")


ALGORITHMS = tuple(a.value for a in Algorithm)


@dataclass(frozen=True)
class Model:
    """A cost model: the library's algorithm choice and the link parameters.

    ``profile`` None means the shipped calibration (:func:`synth.cost.shared.shipped`, :mod:`synth.cost.calibration`:
    the parameters fitted on the public NCCL corpus, per link kind, priced on
    the topology's stated links) for the NCCL models, and the topology's own
    numbers (its prior) for the MPI model; ``prior`` True (``--profile prior``)
    means the prior for every model: the topology's numbers and NCCL's own
    constants. A fitted profile must match the topology it is used on.
    ``profile_path`` only says where the profile was read, for reports."""

    algorithm: Algorithm = Algorithm.NCCL
    profile: NetworkProfile | None = None
    profile_path: str | None = None
    nccl_version: str = NCCL_VERSION  # whose rules choose (synth.cost.nccl_rules.rules_for)
    prior: bool = False  # NCCL's constants instead of the shipped calibration (--profile prior)

    def __post_init__(self) -> None:
        rules_for(self.nccl_version)  # an unknown or too old version fails here, naming the option
        if self.prior and self.profile is not None:
            raise SynthError("a model takes a fitted profile or the prior (--profile prior), not both")

    @property
    def rules_version(self) -> str:
        """The transcribed NCCL release whose rules this model's version follows."""
        return rules_for(self.nccl_version).version

    @classmethod
    def load(cls, algorithm: str | Algorithm = Algorithm.NCCL, profile: str | Path | None = None,
             nccl_version: str | None = None) -> "Model":
        """A model from names: ``algorithm`` as text or enum, ``profile`` a path
        to a profile written by ``synth-reduce fit``, ``"prior"`` (NCCL's
        constants, :data:`PRIOR`) or None (the shipped calibration),
        ``nccl_version`` the NCCL release to model (default: the newest
        transcribed)."""
        if not isinstance(algorithm, Algorithm):
            algorithm = Algorithm.from_text(algorithm)
        version = nccl_version or NCCL_VERSION
        if profile is None or str(profile) == PRIOR:
            return cls(algorithm, nccl_version=version, prior=profile is not None)
        return cls(algorithm, load_profile(profile), str(profile), version)

    def with_algorithm(self, algorithm: Algorithm) -> "Model":
        """This model with another algorithm: the same parameters (profile,
        shipped calibration or prior) and NCCL version."""
        return replace(self, algorithm=algorithm)

    def profile_for(self, topology: Topology) -> NetworkProfile:
        """The parameters to predict with on ``topology``; SynthError if a fitted
        profile belongs to another topology."""
        if self.profile is None:
            if self.prior or self.algorithm is Algorithm.MPI:
                return NetworkProfile.prior(topology)
            return shipped().profile_for(topology)
        self.profile.check_matches(topology, self.profile_path or "profile")
        return self.profile

    def describe(self) -> str:
        """``NCCL 2.27.7 model, shipped calibration from the public NCCL corpus``
        (``topology's numbers as priors`` with ``--profile prior``)."""
        if self.profile is not None:
            source = f"profile {self.profile_path or self.profile.topology}"
        elif self.prior or self.algorithm is Algorithm.MPI:
            source = "topology's numbers as priors"
        else:
            source = "shipped calibration from the public NCCL corpus"
        title = self.algorithm.title
        if self.algorithm is not Algorithm.MPI and self.nccl_version != NCCL_VERSION:
            rules = "" if self.rules_version == self.nccl_version else f" (rules of {self.rules_version})"
            title = title.replace(f"NCCL {NCCL_VERSION}", f"NCCL {self.nccl_version}{rules}")
        return f"{title} model, {source}"
