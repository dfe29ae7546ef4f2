"""NCCL's tuning rules by version: the constants and switches that differ
between releases, one :class:`NcclRules` per transcribed release.

:mod:`synth.cost.nccl` computes what NCCL runs from one of these; the default
is the newest. Each value is NCCL's, read at the release tag of NVIDIA/nccl
(``v<version>-1``) in the file and line the comment gives (``tuning.cc`` is
``src/graph/tuning.cc``, ``search.cc`` and ``connect.cc`` likewise under
``src/graph/``, ``topo.h`` and ``topo.cc`` too); docs/nccl-versions.md has the reading in full.

A requested version that is not one of :data:`RULES` uses the newest rule set
not newer than it (:func:`rules_for`): NCCL 2.26.2 is predicted with 2.23.4's
rules. Versions before the oldest transcribed one are refused.

Protocol triples are ``(LL, LL128, Simple)``. Capability tables have one row
per ``[Volta, Ampere, Hopper, Blackwell]`` (a release without a row for a newer
architecture uses its last row, as its code does with ``minCompCap >= 90``)
and one column per node count ``[1, 2, >2]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..caches import memoised
from ..errors import SynthError

PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class NcclRules:
    """What NCCL's tuning does in one release (see the module docstring)."""

    version: str
    base_lat_us: dict  # algorithm -> (LL, LL128, Simple): baseLat
    hw_lat_us: dict  # "nvlink" | "pcie" | "net" -> algorithm -> (LL, LL128, Simple): hwLat
    ll_max_bws: tuple  # llMaxBws rows (Volta-N1/Intel-N2/N4, Ampere-N1/AMD-N2/N4, Hopper-N1, Blackwell-N1)
    per_ch_max_ring_ll128_bws: tuple
    per_ch_max_tree_ll128_bws: tuple
    per_ch_max_tree_bws: tuple
    nvlink_GBps: tuple  # (minimum compute capability x 10, GB/s per NVLink), first match wins
    speeds_sm90: tuple  # search.cc speed arrays on sm >= 90: (intra, inter)
    speeds_sm100: tuple | None  # on sm >= 100 (None: the sm90 arrays)
    max_graph_channels: int  # MAXCHANNELS / 2: the ring graph's most channels
    ring_ll_quarter: bool  # ring LL x 1/4 (x 1/3 on one node for Broadcast, AllGather, ReduceScatter) instead of x .5
    ring_ll128_ppn1: float | None  # ring LL128 factor when ppn < 2 (else .92)
    reduce_scatter_allgather: tuple  # algorithms besides the ring for ReduceScatter and AllGather
    ratio_on_nonring_rs_ag: bool  # the bus-to-algorithm ratio also on non-ring ReduceScatter/AllGather
    nvls_min_bw: bool  # NVLS bw = min(bwIntra, bwInter) (else the graph's bw as for the others)
    nvlstree_ratio_070: bool  # NVLS Tree's ratio .70 nodes / (2(nodes-1)) instead of 5/6
    nvls_split_rs_ag_bw: bool  # NVLS ReduceScatter/AllGather bw = min(bwIntra (ppn-1)/ppn, bwInter x .9)
    pat_factor: float | None  # PAT's bandwidth factor (None: no PAT)
    pat_needs_sm60: bool
    ring_inter_steps_all_nodes: bool  # all-reduce ring: 2 nodes network steps (else 2(nodes-1))
    ppn1_tree_net_latency: bool  # one GPU per node: the tree's network hwLat row for every algorithm
    nvls_latency_base: bool  # NVLS: baseLat (+ net hwLat across nodes); NVLS Tree: baseLat + 2(nodes-1) net hwLat
    ring_pass2: bool  # the search's second pass raises the ring's speed (and duplicates channels before it)
    hopper_double: str  # connect.cc's extra doubling across nodes: "ge90<16", "eq90<16", "eq90fits" (2 nc <= MAX), "none"
    nvls_channel_raise: bool  # comm->nChannels raised to the NVLS channels where NVLS is usable
    nvls_channels_sm100: tuple | None  # NVLS channels on sm >= 100 (across nodes, one node); None: 16 as on sm90
    ll128_archs: tuple | None  # compute capabilities (x 10) with LL128 on by default (None: every one >= 70)
    log2_of_zero_is_zero: bool  # log2i(0) == 0 (the tree correction's column 0 below 64 B); from 2.23 it is -1
    # the switches of releases before NVLS (2.8.4); their defaults are 2.18.5 onwards
    nvls: bool = True  # NVLS and NVLS Tree exist (2.17+)
    speeds_all: tuple | None = None  # one search.cc speed array for every architecture, inside and across nodes
    dup_sm_exception: bool = True  # no channel doubling on sm > 80 below 50 GB/s with more than 4 channels
    cc80_bus_cap: float | None = None  # every bus bandwidth capped when all GPUs are sm80
    compcap80_rows: bool = False  # LL max (one node) and tree cap rows: 1 if all GPUs are sm80, else Volta's 0
    ll128_per_coll_caps: tuple | None = None  # LL128 cap per channel by collective (Bcast, Reduce, AG, RS, AR)
    tree_ll128_internode: float = 120.0 / 128.0  # the tree's LL128 factor across nodes
    tree_pattern_085: bool = True  # x .85 on a plain TREE pattern (2.18.3+)
    net_overhead: bool = True  # the ring's intra-node steps cost at least the network overhead across nodes (2.18+)
    ll_intra_x18: bool = False  # LL's intra-node latency x 1.8 across nodes
    plateau_bytes_per_rank: int | None = None  # old plateau: x1.9 from ranks x this many bytes (no channel count)
    tree_correction: tuple | None = None  # treeCorrectionFactor (None: TREE_CORRECTION of synth.cost.nccl)
    fp8_ring_penalty: bool = False  # enqueue.cc: fp8 rings over more than 8 ranks x 1024 (fp8 types from 2.24)
    # the switches of releases before 2.7 (2.6.4); their defaults are 2.8.4 onwards
    ring_ll_one_node_third: bool = True  # ring LL x 1/3 on one node for Broadcast, AllGather, ReduceScatter
    ring_ll128_factor: float = .92  # the ring's LL128 factor (ppn >= 2, or always without ring_ll128_ppn1)
    ll128_total_caps: tuple | None = None  # ring LL128 capped at this many GB/s by collective, not per channel
    # tree bw = min(bw x factor, cap) before 2.8: (factor, cap on <= 2 nodes, on more, LL128 on all-sm80 on <= 2
    # nodes, on more); None: x .92 and a per-channel cap
    tree_bus_caps: tuple | None = None
    tree_ll128_cap_factor: float = 1.0  # the tree's LL128 per-channel cap x this (2.7: 7/9)
    tree_ll_divisor: float = 3.8  # the tree's LL bandwidth / this
    ring_steps_all_net: bool = False  # across nodes every ring step costs the network hwLat
    ring_plateau: bool = True  # the ring Simple plateau factor across nodes (x1.9 / x1.4)
    ll128_pix_nvl: bool = False  # LL128 only with the NIC at PIX (or no network) and NVLink (not LOC) inside


_VOLTA_AMPERE_LL = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0))
_RING_LL128_VA = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0))
_TREE_VA = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8))
_SPEEDS_SM90_2_21 = ((60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                     (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12))
_NVLINK_2_21 = ((90, 20.6), (86, 12.0), (80, 20.0), (70, 20.0), (60, 18.0))
_HW_2_23 = {  # v2.23.4-1 tuning.cc:65-78 = v2.27.7-1 tuning.cc:143-156 (the modelled algorithms)
    "nvlink": {"tree": (.6, 1.25, 4.0), "ring": (.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0), "nvlstree": (0.0, 0.0, 25.0)},
    "pcie": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0), "nvlstree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0), "nvlstree": (0.0, 0.0, 14.0)},
}

NCCL_2_27_7 = NcclRules(
    version="2.27.7",
    base_lat_us={"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
                 "nvlstree": (0.0, 0.0, 0.0), "pat": (0.0, 0.0, 0.0)},  # tuning.cc:134-137
    hw_lat_us=_HW_2_23,
    ll_max_bws=_VOLTA_AMPERE_LL + ((141.0, 45.0, 35.0), (282.0, 90.0, 70.0)),  # tuning.cc:165-170
    per_ch_max_ring_ll128_bws=_RING_LL128_VA + ((36.7, 36.7, 36.7), (73.4, 73.4, 73.4)),  # :172-177
    per_ch_max_tree_ll128_bws=_RING_LL128_VA + ((36.7, 36.7, 29.0), (73.4, 73.4, 58.0)),  # :178-183
    per_ch_max_tree_bws=_TREE_VA + ((38.7, 41.4, 36.0), (77.4, 82.8, 72.0)),  # :184-189
    nvlink_GBps=((100, 40.1),) + _NVLINK_2_21,  # topo.h:16-21, 256-265
    speeds_sm90=_SPEEDS_SM90_2_21,  # search.cc:952-963
    speeds_sm100=((90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
                  (96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
                   0.12)),
    max_graph_channels=32,  # MAXCHANNELS 64 (device.h:87) / 2
    ring_ll_quarter=False,
    ring_ll128_ppn1=None,
    reduce_scatter_allgather=("pat", "nvls"),
    ratio_on_nonring_rs_ag=False,
    nvls_min_bw=True,
    nvlstree_ratio_070=False,
    nvls_split_rs_ag_bw=True,  # tuning.cc:267-274
    pat_factor=.75,  # tuning.cc:285
    pat_needs_sm60=True,  # tuning.cc:194
    ring_inter_steps_all_nodes=False,
    ppn1_tree_net_latency=True,
    nvls_latency_base=False,
    ring_pass2=True,
    hopper_double="ge90<16",  # connect.cc:466
    nvls_channel_raise=True,  # connect.cc:493
    nvls_channels_sm100=(32, 24),  # src/transport/nvls.cc:147-149
    ll128_archs=None,  # tuning.cc:457-470: any sm >= 70
    log2_of_zero_is_zero=False,  # bitops.h: log2Down(0) = -1
    fp8_ring_penalty=True,  # enqueue.cc:1777-1781
)

NCCL_2_23_4 = NcclRules(
    **{**NCCL_2_27_7.__dict__,
       "version": "2.23.4",
       "ll_max_bws": _VOLTA_AMPERE_LL + ((141.0, 45.0, 35.0),),  # tuning.cc:86-90
       "per_ch_max_ring_ll128_bws": _RING_LL128_VA + ((36.7, 36.7, 36.7),),  # :92-96
       "per_ch_max_tree_ll128_bws": _RING_LL128_VA + ((36.7, 36.7, 29.0),),  # :97-101
       "per_ch_max_tree_bws": _TREE_VA + ((38.7, 41.4, 36.0),),  # :102-106
       "nvlink_GBps": _NVLINK_2_21,  # topo.h:14-18, 227
       "speeds_sm100": None,  # search.cc:935-936: the sm90 arrays
       "max_graph_channels": 16,  # MAXCHANNELS 32 (device.h:62) / 2
       "nvls_split_rs_ag_bw": False,  # tuning.cc:182: min(bwIntra, bwInter)
       "pat_factor": .85,  # tuning.cc:193
       "pat_needs_sm60": False,  # tuning.cc:108-115: no compute capability check
       "hopper_double": "eq90<16",  # connect.cc:469
       "nvls_channels_sm100": None,  # src/transport/nvls.cc:145: NCCL_NVLS_NCHANNELS 16
       "ll128_archs": (70, 80, 90),  # tuning.cc:324-335
       "fp8_ring_penalty": False,
       }
)

NCCL_2_21_5 = NcclRules(
    **{**NCCL_2_23_4.__dict__,
       "version": "2.21.5",
       # tuning.cc:56-59 (Tree Simple 0 until 2.23)
       "base_lat_us": {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
                       "nvlstree": (0.0, 0.0, 0.0)},
       "hw_lat_us": {  # tuning.cc:65-78: the tree's Simple rows are 28
           "nvlink": {"tree": (.6, 1.25, 28.0), "ring": (.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0),
                      "nvlstree": (0.0, 0.0, 25.0)},
           "pcie": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0),
                    "nvlstree": (0.0, 0.0, 0.0)},
           "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
                   "nvlstree": (0.0, 0.0, 14.0)},
       },
       "ring_ll128_ppn1": .7,  # tuning.cc:181
       "reduce_scatter_allgather": ("nvls",),  # tuning.cc:168-169
       "ratio_on_nonring_rs_ag": True,  # tuning.cc:213-218
       "pat_factor": None,
       "ring_inter_steps_all_nodes": True,  # tuning.cc:161-163
       "ppn1_tree_net_latency": False,
       "log2_of_zero_is_zero": True,  # src/include/utils.h:40-44
       }
)

NCCL_2_18_5 = NcclRules(
    **{**NCCL_2_21_5.__dict__,
       "version": "2.18.5",
       "base_lat_us": {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 23.0),
                       "nvlstree": (0.0, 0.0, 23.0)},  # tuning.cc:56-59
       "hw_lat_us": {  # tuning.cc:65-78
           "nvlink": {"tree": (.6, 1.25, 4.0), "ring": (.6, 1.9, 3.4), "nvls": (0.0, 0.0, 0.0),
                      "nvlstree": (0.0, 0.0, 0.0)},
           "pcie": {"tree": (1.0, 1.9, 6.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0),
                    "nvlstree": (0.0, 0.0, 0.0)},
           "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
                   "nvlstree": (0.0, 0.0, 19.0)},
       },
       "ll_max_bws": _VOLTA_AMPERE_LL + ((87.7, 22.5, 19.0),),  # tuning.cc:86-90
       "nvlink_GBps": ((90, 20.0), (86, 12.0), (80, 20.0), (70, 20.0), (60, 18.0)),  # topo.h:14-18, 202-210
       "speeds_sm90": ((60.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0),  # search.cc:812-813
                       (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)),
       "ring_ll_quarter": True,  # tuning.cc:178
       "reduce_scatter_allgather": (),  # tuning.cc:166-169: rings only
       "nvls_min_bw": False,  # tuning.cc:174
       "nvlstree_ratio_070": True,  # tuning.cc:195-199
       "nvls_latency_base": True,  # tuning.cc:235-238
       "ring_pass2": False,  # search.cc:966-997: pass 2 raises only the tree; channels doubled after it
       "hopper_double": "eq90fits",  # connect.cc:405
       "nvls_channel_raise": False,  # from 2.21.5 (connect.cc:478-480 there)
       }
)

NCCL_2_8_4 = NcclRules(
    **{**NCCL_2_18_5.__dict__,
       "version": "2.8.4",
       # tuning.cc:56 (Tree, Ring)
       "base_lat_us": {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)},
       "hw_lat_us": {  # tuning.cc:63-70
           "nvlink": {"tree": (.52, 1.25, 28.0), "ring": (.47, 1.9, 3.4)},
           "pcie": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
           "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 9.6)},
       },
       "ll_max_bws": _VOLTA_AMPERE_LL,  # tuning.cc:75
       "per_ch_max_ring_ll128_bws": ((20.0, 20.0, 20.0),),  # unused: ll128_per_coll_caps
       "per_ch_max_tree_ll128_bws": ((20.0, 20.0, 20.0),),
       "per_ch_max_tree_bws": ((26.5, 18.5, 10.0), (24.0, 22.5, 16.0)),  # tuning.cc:76
       "nvlink_GBps": ((86, 12.0), (80, 21.0), (70, 21.0), (60, 18.0)),  # topo.h:15-18, 166-173
       "speeds_sm90": _SPEEDS_SM90_2_21,  # unused: speeds_all
       "speeds_all": (42.0, 30.0, 24.0, 21.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24,
                      0.12),  # search.cc:651
       "dup_sm_exception": False,  # search.cc:799-806
       "reduce_scatter_allgather": (),
       "nvls": False,
       "cc80_bus_cap": 235.0,  # tuning.cc:124
       "compcap80_rows": True,  # tuning.cc:93-100
       "ll128_per_coll_caps": (18.8, 12.0, 18.3, 15.2, 16.9),  # tuning.cc:74
       "tree_ll128_internode": .915,  # tuning.cc:129
       "tree_pattern_085": False,
       "net_overhead": False,
       "ll_intra_x18": True,  # tuning.cc:145
       "ring_inter_steps_all_nodes": False,  # tuning.cc:112-114: 2 (nodes - 1)
       "plateau_bytes_per_rank": 4096,  # tuning.cc:281: nBytes >= nRanks / 16 x 65536
       "ll128_archs": (70, 80),  # tuning.cc:190-193: all sm70 or all sm80
       "hopper_double": "none",  # connect.cc: the doubling alone
       "tree_correction": (  # tuning.cc:265-269
           (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
           (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92),
           (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
       ),
       }
)

NCCL_2_7_8 = NcclRules(
    **{**NCCL_2_8_4.__dict__,
       "version": "2.7.8",
       "hw_lat_us": {  # tuning.cc:63-70
           "nvlink": {"tree": (.52, 1.2, 28.0), "ring": (.47, 1.9, 3.4)},
           "pcie": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
           "net": {"tree": (5.0, 8.5, 50.0), "ring": (2.7, 4.0, 9.6)},
       },
       "ll_max_bws": (),  # no LL cap (tuning.cc:113, 119)
       "per_ch_max_tree_bws": (),  # unused: tree_bus_caps
       "nvlink_GBps": ((61, 21.0), (60, 18.0), (0, 21.0)),  # topo.cc:445: 18 on sm60, else 21 (topo.h:15-16)
       "speeds_all": (42.0, 24.0, 21.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24,
                      0.12),  # search.cc:626
       "ll128_per_coll_caps": (18.8, 12.0, 18.3, 15.2, 16.7),  # tuning.cc:74
       "tree_bus_caps": (.9, 110.0, 80.0, 130.0, 105.0),  # tuning.cc:115-118
       "tree_ll128_cap_factor": 7.0 / 9.0,  # tuning.cc:120
       "tree_correction": (  # tuning.cc:247-251: 22 columns, applied if logSize < 22 (:260)
           (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0),
           (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, 1.0),
           (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9),
       ),
       }
)

NCCL_2_6_4 = NcclRules(
    **{**NCCL_2_7_8.__dict__,
       "version": "2.6.4",
       # tuning.cc:60 (Tree, Ring; CollNet is not modelled)
       "base_lat_us": {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 3.6, 8.4)},
       "hw_lat_us": {  # tuning.cc:67-74
           "nvlink": {"tree": (.5, 1.9, 28.0), "ring": (.4, 2.5, 5.7)},
           "pcie": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
           "net": {"tree": (5.0, 7.5, 50.0), "ring": (.9, 2.5, 6.6)},
       },
       "ll_max_bws": (),  # no LL cap (tuning.cc:110, 113)
       "per_ch_max_tree_bws": (),  # unused: tree_bus_caps
       "nvlink_GBps": ((61, 21.0), (60, 18.0), (0, 21.0)),  # topo.cc:447: 18 on sm60, else 21 (topo.h:15-16)
       "speeds_all": (24.0, 21.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24,
                      0.12),  # search.cc:624
       "cc80_bus_cap": None,  # no such cap (tuning.cc:105-117)
       "compcap80_rows": False,  # no per-architecture tables
       "ll128_per_coll_caps": None,
       "ll128_archs": (70,),  # tuning.cc:165: minCompCap == maxCompCap == 70
       "tree_ll128_internode": 7.0 / 9.0,  # tuning.cc:114, every node count
       "ll_intra_x18": False,  # tuning.cc:137-140: no x1.8
       "plateau_bytes_per_rank": None,
       "tree_correction": (  # tuning.cc:232-236: 22 columns, applied if logSize < 22 (:244)
           (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .5, .5, .6, .7, .8, .9, .9, 1.0, 1.0, 1.0),
           (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .8, .7, .7, .7, .6, .6, .7, .7, .8, .8, .9, .9, 1.0),
           (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9),
       ),
       "ring_ll128_ppn1": None,  # tuning.cc:111: 120/128 whatever the GPUs per node
       "ring_ll_one_node_third": False,  # tuning.cc:110: x 1/4 for every collective
       "ring_ll128_factor": 120.0 / 128.0,  # tuning.cc:111
       "ll128_total_caps": (113.0, 72.0, 110.0, 91.0, 100.0),  # tuning.cc:77 ll128MaxBw, used at :111
       "tree_bus_caps": (.9, 110.0, 80.0, 110.0, 80.0),  # tuning.cc:112
       "tree_ll_divisor": 3.0,  # tuning.cc:113
       "ring_steps_all_net": True,  # tuning.cc:95, 134: nsteps x hwLat[NET] across nodes
       "ring_plateau": False,  # no plateau factor (tuning.cc:238-246)
       "ll128_pix_nvl": True,  # tuning.cc:165: typeInter <= LINK_PCI (PATH_PIX), typeIntra == LINK_NVL
       }
)

RULES = {r.version: r for r in (NCCL_2_6_4, NCCL_2_7_8, NCCL_2_8_4, NCCL_2_18_5, NCCL_2_21_5, NCCL_2_23_4, NCCL_2_27_7)}
NCCL_VERSION = NCCL_2_27_7.version  # the default: the newest transcribed


def _key(version: str) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in version.split("."))
    except ValueError:
        parts = ()
    if len(parts) < 2:
        raise SynthError(f"--nccl-version {version!r}: give a version such as 2.21.5")
    return parts


@memoised(maxsize=64)  # asked once per priced step: the rule sets and their order are fixed
def rules_for(version: str | None) -> NcclRules:
    """The rule set NCCL ``version`` follows: its own if transcribed, else the
    newest transcribed release not newer than it; None gives the default."""
    if version is None:
        return RULES[NCCL_VERSION]
    wanted = _key(version)
    older = [v for v in RULES if _key(v) <= wanted]
    if not older:
        raise SynthError(f"--nccl-version {version}: the oldest transcribed NCCL is {min(RULES, key=_key)}; "
                         f"rule sets: {', '.join(sorted(RULES, key=_key))}")
    return RULES[max(older, key=_key)]
