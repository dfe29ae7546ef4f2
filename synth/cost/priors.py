"""What a call costs before any measurement: the priors of the time model.

NCCL decides with its own cost table (:mod:`synth.cost.nccl`); that table's
factors (the tree all-reduce x .92, LL's / 3.8 on the tree, NVLS's 5/6, PAT's
.75, LL128's .92) are how NCCL *chooses*, not what the choice costs. Used as
physical efficiencies they would make a program that replaces a tree all-reduce
by a ring reduce-scatter and all-gather moving the same bytes 1/.92 faster out
of nothing. So the time model keeps the choice (NCCL's table, unchanged) apart
from its cost, whose prior is physics only:

* **Efficiency** of every ``algorithm.protocol`` = the fraction of the bytes on
  the wire that is payload, a property of the protocol alone: LL sends 8 bytes
  of data and 8 of flags per 16-byte line (``union ncclLLFifoLine``: data1,
  flag1, data2, flag2, 4 bytes each), so .5; LL128 keeps one 8-byte flag per
  128-byte line (``NCCL_LL128_LINEELEMS`` 16, ``NCCL_LL128_DATAELEMS`` 15), so
  120/128; Simple sends the data alone, 1. What else makes an algorithm slower
  than its bytes over its links (a tree's chain pipelining, NVLS's switch
  reduction) is measured: ``synth-reduce fit`` learns each key's efficiency.
* **Latency**: NCCL's own numbers, for want of better physics: ``baseLat`` per
  call and the ring row of ``hwLat`` per step over NVLink, PCI or the network
  (NCCL 2.27.7, ``src/graph/tuning.cc``). They are a choosing model too, and the
  measured small calls are 2-7x slower (docs/simulator.md); the fit replaces them.
"""

from __future__ import annotations

from .nccl import BASE_LAT_US, HW_LAT_US, NCCL_KEYS, PROTOCOLS

# payload fraction of the bytes a protocol puts on the wire (see the module docstring)
WIRE_EFFICIENCY = {"LL": 8.0 / 16.0, "LL128": 120.0 / 128.0, "Simple": 1.0}

EFFICIENCY_PRIOR = {key: WIRE_EFFICIENCY[key.split(".")[1]] for key in NCCL_KEYS}

# Latency per call of each (algorithm, protocol): baseLat; NVLS's whole latency is its NVLink hwLat (25 us, NCCL
# sets latencies = intraLat), NVLS Tree adds it to its network hops, PAT's base time is 8 us.
BASE_PRIOR_US = {
    **{f"{a}.{p}": BASE_LAT_US[a][i] for a in ("ring", "tree") for i, p in enumerate(PROTOCOLS)},
    "nvls.Simple": HW_LAT_US["nvlink"]["nvls"][2], "nvlstree.Simple": HW_LAT_US["nvlink"]["nvlstree"][2],
    "pat.Simple": 8.0,
}


def hop_latency_prior_us(link: str) -> tuple[float, float, float]:
    """(LL, LL128, Simple) latency of one step over a link of this kind: the ring
    row of NCCL's hwLat for NVLink, PCI or the network."""
    return HW_LAT_US[link]["ring"]
