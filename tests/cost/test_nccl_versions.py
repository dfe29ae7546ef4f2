"""NCCL's tuning rules by release (synth.cost.nccl_rules, --nccl-version): each
expected number is computed here by hand from the release's own source, read at
its tag of NVIDIA/nccl (tag:file:line in each test)."""

from __future__ import annotations

import json
import math

import pytest

from synth.cli import main
from synth.cost import Model, NetworkProfile, default_program
from synth.cost.corpus import call_from_dict
from synth.cost.fit import call_samples, load_samples, measured_rules, predict_all
from synth.cost.nccl import algo_time_us, choose, comm_of, cost_table, ring_graph, runtime_channels
from synth.cost.nccl_rules import NCCL_VERSION, RULES, rules_for
from synth.errors import SynthError
from synth.synthesis.language import Collective, format_program
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

AR, RS, AG = Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9)


def test_a_version_uses_the_newest_transcribed_rules_not_newer_than_it():
    assert rules_for(None).version == NCCL_VERSION == "2.27.7"
    assert rules_for("2.18.5").version == "2.18.5"
    assert rules_for("2.20.5").version == "2.18.5"  # Azure ND H200 v5's NCCL
    assert rules_for("2.26.2").version == "2.23.4"
    assert rules_for("2.28").version == "2.27.7"
    assert rules_for("2.12.12").version == "2.8.4"
    assert rules_for("2.8.3").version == "2.7.8"
    assert rules_for("2.7.8").version == "2.7.8"
    assert rules_for("2.6.4").version == "2.6.4"
    assert rules_for("2.7.3").version == "2.6.4"
    with pytest.raises(SynthError, match=r"--nccl-version 2\.5\.6: the oldest transcribed NCCL is 2\.6\.4"):
        rules_for("2.5.6")
    with pytest.raises(SynthError, match="--nccl-version 'banana': give a version such as 2.21.5"):
        rules_for("banana")
    with pytest.raises(SynthError, match="--nccl-version 2.4.6"):
        Model(nccl_version="2.4.6")


def test_nccl_2_8_4_on_two_abci_v100_nodes():
    """v2.8.4-1 tuning.cc:56 baseLat ring LL 3.6; :63-70 hwLat NVLink ring LL
    .47, NET ring LL 2.7; :145 LL intra x1.8 across nodes; :112-114 all-reduce
    network steps 2(nodes-1); :125 ring LL x1/4 capped by llMaxBws[0][1] = 39;
    :281 the ring plateau x1.9 from nRanks/16 x 65536 bytes. The ring graph:
    search.cc:651 speeds from 42, 6 NVLinks x 21 GB/s (topo.h:16) = 126 per GPU
    but 2 x 12.5 GB/s NICs: 12 GB/s per channel, one per NIC."""
    abci = load_topology("abci-v").scaled({"node": 2})
    comm = comm_of(abci, tuple(range(8)), version="2.8.4")
    assert comm.intra_GBps == 6 * 21.0 and comm.version == "2.8.4" and not comm.nvls
    assert (ring_graph(comm).channels, ring_graph(comm).bw_intra) == (2, 12.0)
    assert runtime_channels(comm) == 4  # connect.cc: doubled, nothing else before 2.18
    table = cost_table(comm, AR)
    lat, bw = table[("ring", "LL")]
    assert close(lat, 3.6 + (14 - 2) * .47 * 1.8 + 2 * 2.7)
    assert close(bw, min(39.0, 2 * 12.0 / 4) * 8 / 14)
    # tree LL128 across nodes (two nodes: the graph's intra-node speed, which search.cc:753-762 raises below twice
    # the network's: 21 GB/s): x .92 capped per channel (perChMaxTreeBws[0][1] = 18.5), then x .915 capped by
    # ll128MaxBwPerCh[AllReduce] = 16.9 per channel (tuning.cc:74, 127, 129); no x .85 before 2.18.3; ratio .5
    tree = min(2 * 21.0 * .92, 2 * 18.5)
    tree = min(tree * .915, 2 * 16.9)
    assert close(table[("tree", "LL128")][1], tree * .5)
    s_lat, s_bw = table[("ring", "Simple")]
    assert close(algo_time_us(comm, AR, "ring", "Simple", 8 * 4096 - 1), s_lat + (8 * 4096 - 1) / (1000 * s_bw))
    assert close(algo_time_us(comm, AR, "ring", "Simple", 8 * 4096), s_lat * 1.9 + 8 * 4096 / (1000 * s_bw))


def test_nccl_2_8_4_caps_an_a100_node_at_235_and_has_no_nvls_or_pat():
    """v2.8.4-1 tuning.cc:124: every bus bandwidth min(., 235) when all GPUs are
    sm80. One ABCI A100 node: 12 NVLinks x 21 GB/s = 252 per GPU; speeds from 42:
    6 channels of 42, doubled (search.cc:799: >= 25, no sm exception) to 12 x 21."""
    node = load_topology("abci-a").scaled({"node": 1})
    comm = comm_of(node, tuple(range(8)), version="2.8.4")
    assert (ring_graph(comm).channels, ring_graph(comm).bw_intra) == (12, 21.0)
    assert close(cost_table(comm, AR)[("ring", "Simple")][1], 235.0 * 8 / 14)
    newer = comm_of(node, tuple(range(8)), version="2.18.5")  # no cap; 12 x 20 GB/s NVLinks (topo.h:14-18)
    assert (ring_graph(newer).channels, ring_graph(newer).bw_intra) == (12, 20.0)
    assert close(cost_table(newer, AR)[("ring", "Simple")][1], 240.0 * 8 / 14)
    # one GPU per node: PAT exists from 2.23 only, NVLS never before 2.17
    dgx = load_topology("dgx-a100")
    ppn1 = tuple(range(0, 128, 8))
    assert choose(comm_of(dgx, ppn1, version="2.8.4"), AG, 4096.0).algorithm == "ring"
    assert choose(comm_of(dgx, ppn1), AG, 4096.0).algorithm == "pat"
    h100 = load_topology("dgx-h100")
    assert not comm_of(h100, tuple(range(8)), version="2.8.4").nvls and comm_of(h100, tuple(range(8))).nvls


def test_nccl_2_18_5_on_an_h100_node():
    """v2.18.5-1 topo.h:14-18: sm90 NVLink 20.0 GB/s (20.6 from 2.21); tuning.cc:56-59
    NVLS baseLat 23 (2.21+: none, its NVLink hwLat 25 instead); :178 ring LL x1/4
    (x .5 from 2.21); :166-169 ReduceScatter and AllGather on rings only."""
    h100 = load_topology("dgx-h100")
    old = comm_of(h100, tuple(range(8)), version="2.18.5")
    new = comm_of(h100, tuple(range(8)))
    assert close(old.intra_GBps, 18 * 20.0) and close(new.intra_GBps, 18 * 20.6)
    assert close(cost_table(old, AR)[("nvls", "Simple")][0], 23.0)
    assert close(cost_table(new, AR)[("nvls", "Simple")][0], 25.0)
    ring = ring_graph(old)
    assert close(cost_table(old, AR)[("ring", "LL")][1], min(87.7, ring.channels * ring.bw_intra / 4) * 8 / 14)
    assert {a for a, _ in cost_table(old, RS)} == {"ring"}
    assert {a for a, _ in cost_table(comm_of(h100, tuple(range(8)), version="2.21.5"), RS)} == {"ring", "nvls"}


def test_nccl_2_18_and_2_21_count_2_nodes_network_steps_in_the_ring():
    """v2.18.5-1 tuning.cc:161-163 and v2.21.5-1 likewise: an all-reduce ring's
    network steps are 2 x nodes (2(nodes-1) from 2.23: v2.23.4-1 tuning.cc:236)."""
    dgx = load_topology("dgx-a100").scaled({"node": 4})
    members = tuple(range(32))
    for version, inter_steps in (("2.18.5", 8), ("2.21.5", 8), ("2.23.4", 6), ("2.27.7", 6)):
        comm = comm_of(dgx, members, version=version)
        hw = RULES[version].hw_lat_us
        intra = max(hw["nvlink"]["ring"][2], 3 * 1.0)  # the network overhead, x3 for Simple (2.18+)
        expected = RULES[version].base_lat_us["ring"][2] + (62 - inter_steps) * intra + inter_steps * hw["net"]["ring"][2]
        assert close(cost_table(comm, AR)[("ring", "Simple")][0], expected), version


def test_nccl_2_23_4_pat_and_ll128():
    """v2.23.4-1 tuning.cc:193: PAT x .85 (.75 in 2.27.7); :324-335: LL128 on by
    default only on sm70, sm80, sm90 (any sm >= 70 in 2.27.7: a B200 node)."""
    dgx = load_topology("dgx-a100")
    ppn1 = tuple(range(0, 128, 8))
    old, new = (cost_table(comm_of(dgx, ppn1, version=v), AG)[("pat", "Simple")][1] for v in ("2.23.4", "2.27.7"))
    assert close(old / new, .85 / .75)
    b200 = load_topology("p6-b200").scaled({"node": 1})
    assert not any(p == "LL128" for _, p in cost_table(comm_of(b200, tuple(range(8)), version="2.23.4"), AR))
    assert any(p == "LL128" for _, p in cost_table(comm_of(b200, tuple(range(8))), AR))


def test_the_model_and_the_command_line_carry_the_version(capsys):
    model = Model.load("nccl", None, "2.26.2")
    assert model.rules_version == "2.23.4"
    assert model.describe() == "NCCL 2.26.2 (rules of 2.23.4) model, shipped calibration from the public NCCL corpus"
    assert Model.load("nccl", "prior", "2.18.5").describe() == "NCCL 2.18.5 model, topology's numbers as priors"
    args = ["--topology", "dgx-h100", "--scale", "node=2", "--axes", "dp=16", "--size", "1M"]
    assert main(args + ["--nccl-version", "2.18.5"]) == 0
    old = capsys.readouterr().out
    assert main(args) == 0
    new = capsys.readouterr().out
    assert "NCCL 2.18.5 model" in old and "NCCL 2.27.7 model" in new and old.splitlines()[3:] != new.splitlines()[3:]
    assert main(args + ["--nccl-version", "2.5"]) == 2
    assert "--nccl-version 2.5: the oldest transcribed NCCL is 2.6.4" in capsys.readouterr().err


def test_a_corpus_line_is_modelled_with_the_version_its_source_states():
    line = {"set": "s", "source": "x", "system": {}, "collective": "allreduce", "size_bytes": 1024, "ranks": 8,
            "time_us": 30.0, "nccl_version": "2.26.2+cuda12.8"}
    call = call_from_dict(line, "l:1")
    assert call.nccl_version == "2.26.2"
    (sample,) = call_samples([call], load_topology("dgx-h100"))
    assert sample.nccl_rules == "2.23.4"
    assert call_samples([call_from_dict({**line, "nccl_version": None}, "l:2")], load_topology("dgx-h100"))[
        0].nccl_rules is None
    old = call_samples([call_from_dict({**line, "nccl_version": "2.4.6"}, "l:3")], load_topology("dgx-h100"))[0]
    assert old.nccl_rules == "2.6.4"  # older than every transcribed release: the oldest


def test_a_bench_record_is_modelled_with_the_nccl_it_ran(tmp_path):
    """``bench`` records NCCL's version; ``fit`` and ``validate`` model each
    record with that release's rules (:func:`synth.cost.fit.measured_rules`)."""
    assert (measured_rules("2.21.5"), measured_rules("2.20.3"), measured_rules("2.4.6"), measured_rules(None)) == (
        "2.21.5", "2.18.5", "2.6.4", None)
    assert (measured_rules("2.6.4"), measured_rules("2.7.8"), measured_rules("2.8.3")) == ("2.6.4", "2.7.8", "2.7.8")
    dgx = load_topology("dgx-h100").scaled({"node": 2})
    placement = enumerate_placements(dgx, parse_axes("dp=16"))[0]
    lines = []
    for version in ("2.18.5", "2.27.7"):
        lines.append({
            "schema": "synth-reduce/measurement", "version": 1, "topology": dgx.to_dict(),
            "axes": [{"name": "dp", "size": 16}], "matrix": [list(r) for r in placement.matrix], "reduce": ["dp"],
            "collective": "allreduce", "program": format_program(default_program(Goal.ALLREDUCE)), "is_default": True,
            "backend": "nccl", "algo": "nccl", "dtype": "float32", "ranks": 16, "size_bytes": 2**20, "iters": 1,
            "times_s": [1e-4], "median_s": 1e-4, "min_s": 1e-4, "max_s": 1e-4, "wrong": 0, "nccl_version": version})
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    _, samples = load_samples(path)
    assert [s.nccl_rules for s in samples] == ["2.18.5", "2.27.7"]
    old, new = predict_all(NetworkProfile.prior(dgx), samples)
    comm_old, comm_new = (comm_of(dgx, tuple(range(16)), version=v) for v in ("2.18.5", "2.27.7"))
    assert choose(comm_old, AR, 2.0**20) != choose(comm_new, AR, 2.0**20) and old != new


def test_the_data_type_and_the_reduction_take_part_in_the_choice():
    """src/include/device.h ncclNvlsSupported: no NVLS for 8-bit types nor for an
    average (a pre-multiplied sum); src/enqueue.cc (2.27.7): PAT runs no averaging
    reduce-scatter, and an fp8 ring over more than 8 ranks costs x 1024 (its
    precision loss), so NCCL prefers a tree."""
    h200 = comm_of(load_topology("hgx-h200"), tuple(range(8)))
    big = float(2**30)
    assert choose(h200, AR, big).algorithm == "nvls"
    assert choose(h200, AR, big, None, "bfloat16", "max").algorithm == "nvls"
    for dtype, op in (("int8", "sum"), ("float32", "avg"), ("float32", "max"), ("float8e4m3", "sum")):
        assert choose(h200, AR, big, None, dtype, op).algorithm == "ring", (dtype, op)
    # forced NVLS: an int8 all-reduce falls back to the ring, an all-gather (it reduces nothing) keeps NVLS
    assert choose(h200, AR, big, ("nvls",), "int8").algorithm == "ring"
    assert choose(h200, AG, big, ("nvls",), "int8").algorithm == "nvls"
    dgx = load_topology("dgx-a100")
    ppn1 = comm_of(dgx, tuple(range(0, 128, 8)))
    assert choose(ppn1, RS, 4096.0).algorithm == "pat"
    assert choose(ppn1, RS, 4096.0, None, "float32", "avg").algorithm == "ring"
    nodes = comm_of(dgx.scaled({"node": 2}), tuple(range(16)))
    ring = choose(nodes, AR, big, ("ring",))
    assert ring.algorithm == "ring" and choose(nodes, AR, big, None, "float8e5m2").algorithm == "tree"
    penalised = choose(nodes, AR, big, ("ring",), "float8e5m2")
    assert close(penalised.estimate_us, ring.estimate_us * 1024)
    old = comm_of(dgx.scaled({"node": 2}), tuple(range(16)), version="2.23.4")
    assert choose(old, AR, big, None, "float8e5m2") == choose(old, AR, big)  # no such rule before 2.24
    with pytest.raises(SynthError, match="data type 'complex64' is not one NCCL reduces"):
        choose(h200, AR, big, None, "complex64")
    with pytest.raises(SynthError, match="reduction 'xor' is not one of NCCL's: sum, prod, max, min, avg"):
        choose(h200, AR, big, None, "float32", "xor")
    line = {"set": "s", "source": "x", "system": {}, "collective": "allreduce", "size_bytes": 1024, "ranks": 8,
            "time_us": 30.0, "dtype": "half", "redop": "max"}
    assert (call_from_dict(line, "l:1").dtype, call_from_dict(line, "l:1").op) == ("float16", "max")
    with pytest.raises(SynthError, match="l:2: fields 'dtype', 'redop': data type 'quad' is not one NCCL reduces"):
        call_from_dict({**line, "dtype": "quad"}, "l:2")


def test_nccl_2_6_4_on_two_p3dn_nodes():
    """v2.6.4-1 tuning.cc:60 baseLat (Tree LL/LL128/Simple 4.4, 4.4, 0; Ring 3.6,
    3.6, 8.4); :67-74 hwLat (NVLink tree .5, 1.9, 28; NET tree 5.0, 7.5, 50; NET
    ring .9, 2.5, 6.6); :95 and :134 every ring step across nodes at the NET row;
    :140 the tree 2((ppn-1) intra + log2(nodes) inter); :110-114 ring LL x1/4,
    ring LL128 min(x 120/128, ll128MaxBw[AllReduce] = 100), tree min(x .9, 110 on
    two nodes), tree LL x1/3, tree LL128 x7/9; :120 ratio nRanks/nsteps, tree .5;
    :232-244 the tree correction, none from logSize 22; no ring plateau. The graph:
    search.cc:624 speeds from 24, one 12.5 GB/s EFA: one channel of 12; the tree's
    intra speed raised below twice that (pass 2, :747-754): 21, which two nodes use."""
    p3dn = load_topology("p3dn").scaled({"node": 2})
    comm = comm_of(p3dn, tuple(range(16)), version="2.6.4")
    assert comm.version == "2.6.4" and comm.intra_GBps == 6 * 21.0  # topo.cc:447: 21 per NVLink off sm60
    assert (ring_graph(comm).channels, ring_graph(comm).bw_intra) == (1, 12.0)
    assert runtime_channels(comm) == 2
    table = cost_table(comm, AR)
    assert close(table[("ring", "LL")][0], 3.6 + 30 * .9) and close(table[("ring", "LL")][1], 12.0 / 4 * 16 / 30)
    assert close(table[("ring", "LL128")][0], 3.6 + 30 * 2.5)
    assert close(table[("ring", "LL128")][1], min(12.0 * 120 / 128, 100.0) * 16 / 30)
    assert close(table[("ring", "Simple")][0], 8.4 + 30 * 6.6) and close(table[("ring", "Simple")][1], 12.0 * 16 / 30)
    assert close(table[("tree", "LL")][0], 4.4 + 2 * (7 * .5 + 1 * 5.0))
    assert close(table[("tree", "LL")][1], min(21.0 * .9, 110.0) / 3 * .5)
    assert close(table[("tree", "LL128")][0], 4.4 + 2 * (7 * 1.9 + 1 * 7.5))
    assert close(table[("tree", "LL128")][1], min(21.0 * .9, 110.0) * 7 / 9 * .5)
    assert close(table[("tree", "Simple")][0], 2 * (7 * 28.0 + 1 * 50.0))
    assert close(table[("tree", "Simple")][1], min(21.0 * .9, 110.0) * .5)
    mib16, gib = float(2 ** 24), float(2 ** 30)
    # 16 MiB: log2(2^24 / 64) = 18, Simple correction .6; 1 GiB: 24, none; the ring never x1.9
    assert close(algo_time_us(comm, AR, "tree", "Simple", mib16), 492.0 + mib16 / (1000 * 9.45 * .6))
    assert close(algo_time_us(comm, AR, "tree", "Simple", gib), 492.0 + gib / (1000 * 9.45))
    assert close(algo_time_us(comm, AR, "ring", "Simple", gib), 206.4 + gib / (1000 * 6.4))
    # 16 MiB: ring Simple 206.4 + 2621.4 us beats ring LL128 (78.6 + 2796.2) and tree LL128 (46 + 2853.3)
    assert choose(comm, AR, mib16).key == "ring.Simple"
    assert choose(comm, AR, gib).key == "tree.Simple"
    # 2.8.4 on the same nodes: 28 intra-node ring steps at the NVLink row's 3.4, the 2 network ones at 9.6
    # (v2.8.4-1 tuning.cc:63-70, 112-114)
    old = cost_table(comm_of(p3dn, tuple(range(16)), version="2.8.4"), AR)[("ring", "Simple")][0]
    assert close(old, 8.4 + 28 * 3.4 + 2 * 9.6)


def test_nccl_2_6_and_2_7_cap_the_tree_absolutely_and_2_8_per_channel():
    """One ABCI V100 node: 6 NVLinks x 21 GB/s = 126 per GPU, 6 ring channels of
    21 under every rule set here. The tree: v2.6.4-1 tuning.cc:112 and v2.7.8-1
    tuning.cc:115-118 min(126 x .9, 110) = 110 (no LL128 exception off sm80);
    v2.8.4-1 tuning.cc:127 min(126 x .92, 6 x perChMaxTreeBws[0][0] = 26.5). LL128:
    2.6.4 tree x7/9 (:114), ring min(126 x 120/128, 100) (:111); 2.7.8 tree min(110 x
    7/9, 16.7 x 6 x 7/9) (:74, :120), ring min(126 x .92, 16.7 x 6) (:114)."""
    node = load_topology("abci-v").scaled({"node": 1})
    tables = {}
    for version in ("2.6.4", "2.7.8", "2.8.4"):
        comm = comm_of(node, tuple(range(4)), version=version)
        assert (ring_graph(comm).channels, ring_graph(comm).bw_intra) == (6, 21.0), version
        tables[version] = cost_table(comm, AR)
    assert close(tables["2.6.4"][("tree", "Simple")][1], 110.0 * .5)
    assert close(tables["2.7.8"][("tree", "Simple")][1], 110.0 * .5)
    assert close(tables["2.8.4"][("tree", "Simple")][1], 126.0 * .92 * .5)
    assert close(tables["2.6.4"][("tree", "LL128")][1], 110.0 * 7 / 9 * .5)
    assert close(tables["2.7.8"][("tree", "LL128")][1], min(110.0 * 7 / 9, 16.7 * 6 * 7 / 9) * .5)
    assert close(tables["2.6.4"][("ring", "LL128")][1], 100.0 * 4 / 6)
    assert close(tables["2.7.8"][("ring", "LL128")][1], min(126.0 * .92, 16.7 * 6) * 4 / 6)
    # LL: no cap before 2.8 (2.8.4: llMaxBws[0][0] = 39 on one V100 node)
    assert close(tables["2.6.4"][("ring", "LL")][1], 126.0 / 4 * 4 / 6)
    assert close(tables["2.8.4"][("ring", "LL")][1], min(39.0, 126.0 / 4) * 4 / 6)
    assert close(tables["2.6.4"][("tree", "LL")][1], 110.0 / 3 * .5)
    assert close(tables["2.7.8"][("tree", "LL")][1], 110.0 / 3.8 * .5)


def test_nccl_2_6_4_turns_ll128_on_only_for_volta_on_nvlink():
    """v2.6.4-1 tuning.cc:165: LL128 by default only if typeIntra == LINK_NVL and
    all GPUs are sm70 (and the NIC path <= LINK_PCI, i.e. PIX). One GPU per node is
    PATH_LOC, so no LL128 there; A100s have none. 2.7.8 (tuning.cc:176-177) allows
    typeIntra <= PATH_NVL (LOC too) and sm80."""
    p3dn = load_topology("p3dn").scaled({"node": 2})
    ppn1 = (0, 8)
    a100 = load_topology("dgx-a100").scaled({"node": 1})

    def ll128(topology, members, version):
        return any(p == "LL128" for _, p in cost_table(comm_of(topology, members, version=version), AR))

    assert ll128(p3dn, tuple(range(16)), "2.6.4")
    assert not ll128(p3dn, ppn1, "2.6.4") and ll128(p3dn, ppn1, "2.7.8")
    assert not ll128(a100, tuple(range(8)), "2.6.4") and ll128(a100, tuple(range(8)), "2.7.8")
