"""The shipped calibration: the shared cost parameters (:mod:`synth.cost.transfer`)
fitted on the whole public NCCL corpus (``data/nccl/``): how it is fitted.
Every NCCL prediction uses it unless a profile is given (``--profile PROFILE.json``) or NCCL's
own constants are asked for (``--profile prior``).

The parameters are per link kind (NVLink, PCIe, and a network per transport:
one of :data:`~synth.topology.TRANSPORTS`) and per ``algorithm.protocol``, not per
system, so they price any topology: :meth:`SharedParameters.profile_for`. They
live in ``profiles/nccl-calibration.json`` (schema ``synth-reduce/calibration``,
read by :func:`synth.cost.shared.shipped`), written by :func:`save_calibration`
from :func:`fit_corpus`; a test refits the
corpus and compares, so the shipped file is what the committed data give.

Which corpus set was measured on which shipped topology is :data:`CORPUS_SETS`;
:data:`NOT_FITTED` names the sets left out and why. Both are read by
``scripts/nccl_accuracy.py`` too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..documents import write_document
from ..errors import SynthError
from ..topology import load_topology
from .corpus import read_corpus
from .fit import call_samples
from .shared import CALIBRATION_SCHEMA, CALIBRATION_VERSION, SharedParameters, parameters_from_dict
from .transfer import fit_shared

# corpus set -> shipped topology of the measured system (the run's GPUs are its first devices)
CORPUS_SETS = {
    "stas00-a100x8-nccltests-allreduce": "dgx-a100",  # one 8 x A100 NVLink 3 node: node 0 of dgx-a100
    "aws-p4de-2x8-allreduce": "p4de",
    "azure-ndh100v5-x8-nvls-inplace": "dgx-h100",  # one ND H100 v5 VM: node 0 of dgx-h100
    "aws-p5-2x8-allreduce": "p5",
    "aws-p5-2x8-allreduce-eks-nccl2.18.5": "p5",
    "a3mega-2x8-allreduce": "a3-mega",
    "dstack-gcp-a3mega-2x8-allgather": "a3-mega",
    "dstack-gcp-a3high-2x8-allgather": "a3-high",
    "stas00-h200x8-torch-allreduce-sweep": "hgx-h200",
    "stas00-h200x8-torch-allreduce-16g-nvls-off": "hgx-h200",
    "stas00-h200x8-nvls-ramp-8g": "hgx-h200",
    "stas00-h200x8-collectives-16g": "hgx-h200",
    "azure-ndh200v5-x8-nvls-inplace": "hgx-h200",
    "dstack-gcp-a4-2x8-allreduce": "gcp-a4",
    "stas00-p6b200-1v4nodes-torch": "p6-b200",
    "stas00-p6b200-nvls-ramp-8g": "p6-b200",
    "coreweave-gb200-nvl72-1rack": "gb200-nvl72",
    "nccltests309-xe9680-h100-2x8-allreduce": "dgx-h100",  # first 2 of its nodes: 8 x 400 Gb/s NDR per node
    "nccltests309-h100-vm-4x8-allreduce": "dgx-h100",
    "oci-oke-bmgpu48-a100-2x8-allreduce": "oci-bm-gpu4-8",
    "dranet-gke-a3ultra-2x1-allgather": "gke-a3ultra-1gpu1nic",
    "dranet-gke-h200-2x1-allreduce": "gke-a3ultra-1gpu1nic",
    "skypilot-gke-a3ultra-2x8-allgather": "gcp-a3-ultra",
    "skypilot-gke-a3ultra-2x8-allgather-nccl2.26.6": "gcp-a3-ultra",
    "skypilot-gcp-a3high-2x8-allreduce-ring-simple-tcpx": "a3-high",
    "skypilot-gcp-a3high-2x8-allreduce-ring-simple-tcp": "gcp-a3-high-tcp1",  # TCP sockets on the primary NIC
    "skypilot-aws-p4d-hyperpod-2x8-allreduce-efa": "p4d",
    "skypilot-aws-p4d-vm-2x8-allreduce-4efa": "p4d",
    "keitaw-p5-2x8-allreduce-nccl2.22.3": "p5",
    "keitaw-p5-2x8-allreduce-nccl2.22.3-run2": "p5",
    "keitaw-p5-2x8-allreduce-nccl2.20.3-ofituner": "p5",
    "together-b200-ib-1to64x8-allreduce-ring-tree-32g": "together-b200-ib",  # first n of its 64 nodes
    "together-b200-ib-1to64x8-allgather-ring-32g": "together-b200-ib",
    "cybertronai-p3dn-2x8-allreduce-treesoff": "p3dn",
    "awsdlami-p3dn-2x8-allreduce-treesoff": "p3dn",
    "eksefa-p3dn-2x8-allreduce": "p3dn",
    "eksefa-p3dn-8x8-allreduce": "p3dn",
    "awsdlami-p4d-2x8-allreduce-ring": "p4d",
    "awsefaeks-p4d-2x8-allreduce-ring-nccl2.8.3": "p4d",
    "awsefaeks-p4d-2x8-allreduce-nccl2.9.9": "p4d",
    **{f"abci-v100-{n}x4-allreduce": "abci-v" for n in (1, 2, 4, 8, 16, 32)},
    **{f"abci-a100-{n}-allreduce": "abci-a" for n in ("1x4of8", "1x8", "2x8", "4x8", "8x8", "16x8")},
}
NOT_FITTED = {
    "abcidocs-a100-2x8-allreduce-sharp": "CollNet (SHARP in the switches) ran; the model has no CollNet",
    "dstack-lambda-b200-2x8-allreduce": "the source states neither the NICs nor their rate",
    "coreweave-gb200-nvl72-20racks": "the source states neither the racks' NICs nor their rate",
    "nccl1801-gb200-3partitions-ring-vs-tree": "the source states neither the partitions' NICs nor their rate",
    "liplus-a100x8-sendrecv": "send/receive is not a collective the model has",
    **{f"nvidia-contrib-gb200-{n}-alltoall": "all-to-all lines set the per-peer cost (synth/cost/alltoall.py), "
                                              "not the collective model's fit" for n in (8, 32)},
}


def corpus_samples(data_dir: str | Path) -> dict[str, list]:
    """The calls (:class:`~synth.cost.fit.CallSample`) of every set of
    :data:`CORPUS_SETS` in ``data_dir``, on its topology, sets in name order.
    SynthError for a set file listed nowhere (a new set must name its topology)."""
    sets: dict[str, list] = {}
    for path in sorted(Path(data_dir).glob("*.jsonl")):
        name = path.stem
        if name in NOT_FITTED:
            continue
        if name not in CORPUS_SETS:
            raise SynthError(f"{path}: no topology for this set; add it to CORPUS_SETS or NOT_FITTED in "
                             f"synth/cost/calibration.py")
        calls, _ = read_corpus(path)
        sets[name] = call_samples(calls, load_topology(CORPUS_SETS[name]))
    return sets


def fit_corpus(data_dir: str | Path) -> SharedParameters:
    """The shared parameters fitted on every set of the corpus in ``data_dir``
    (:func:`~synth.cost.transfer.fit_shared`), rounded as shipped."""
    sets = corpus_samples(data_dir)
    return _rounded(fit_shared([s for name in sets for s in sets[name]]))


def _rounded(p: SharedParameters) -> SharedParameters:
    return parameters_from_dict(p.to_dict(), "fit")


def calibration_document(shared: SharedParameters, sets: list[str]) -> dict[str, Any]:
    """The JSON document of a calibration fitted on corpus ``sets``."""
    return {"schema": CALIBRATION_SCHEMA, "version": CALIBRATION_VERSION,
            "fitted_on": {"corpus": "data/nccl", "sets": sorted(sets)},
            "parameters": shared.to_dict()}


def save_calibration(path: str | Path, data_dir: str | Path) -> SharedParameters:
    """Fit the corpus in ``data_dir`` and write the calibration to ``path``."""
    shared = fit_corpus(data_dir)
    write_document(path, "calibration", calibration_document(shared, list(corpus_samples(data_dir))))
    return shared


