"""MSCCL XML: every synthesized program of the P2 configurations compiles to a
file the independent chunk-level checker accepts (in place and out of place);
the checker catches planted faults with a clear message and accepts a
hand-written ring; the export and verify commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import usage_error

from synth.errors import SynthError
from synth.export.msccl import MAX_STEPS_PER_TB, compile_program, plan_files, shadowed
from synth.export.msccl_check import check_algorithm, execute, parse
from synth.plan import Plan, load_plan, write_plan
from synth.synthesis.lowering import lower
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.search import synthesize_reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

GOALS = (Goal.ALLREDUCE, Goal.REDUCESCATTER, Goal.ALLGATHER)


def _programs(topology: str, axes: str, reduce: str, goal: Goal, limit: int | None = None):
    for placement in enumerate_placements(load_topology(topology), parse_axes(axes)):
        reduction = Reduction.of(placement, reduce, goal)
        for program in synthesize_reduction(reduction, 5).programs[:limit]:
            yield reduction, program


@pytest.mark.slow
@pytest.mark.parametrize("topology,axes,reduce", [("p2-a100", "dp=4,mp=16", "dp"), ("p2-a100", "dp=4,mp=16", "mp"),
                                                  ("p2-v100", "dp=4,mp=8", "dp"), ("p2-v100", "dp=4,mp=8", "mp")])
@pytest.mark.parametrize("goal", GOALS, ids=lambda g: g.value)
def test_every_program_of_the_p2_configurations_compiles_and_checks(topology, axes, reduce, goal):
    """Each placement's every program of at most 5 steps: its XML passes the
    checker in both modes, with the limits of the executor kept."""
    count = 0
    for reduction, program in _programs(topology, axes, reduce, goal):
        algorithm = compile_program(program, reduction, "t")
        result = check_algorithm(algorithm.xml(), f"{program}")
        assert result.modes == ("out-of-place", "in-place")
        assert max(len(tb.steps) for tbs in algorithm.thread_blocks for tb in tbs) <= MAX_STEPS_PER_TB
        count += 1
    assert count > 0


@pytest.mark.parametrize("topology,axes,reduce,scale", [("testbed-2x2x2", "dp=8", "dp", None),
                                                        ("dgx-a100", "dp=16", "dp", {"node": 2}),
                                                        ("dgx-h100", "dp=2,mp=8", "dp,mp", {"node": 2})])
def test_the_first_programs_on_shipped_topologies(topology, axes, reduce, scale):
    top = load_topology(topology)
    if scale:
        top = top.scaled(scale)
    for goal in GOALS:
        placement = enumerate_placements(top, parse_axes(axes))[0]
        reduction = Reduction.of(placement, reduce, goal)
        for program in synthesize_reduction(reduction, 5).programs[:6]:
            check_algorithm(compile_program(program, reduction, "t").xml(), str(program))


def test_pieces_pipeline_chunks_and_keep_results_exact():
    reduction, program = next(_programs("testbed-2x4", "dp=8", "dp", Goal.ALLREDUCE))
    assert str(program) == "AllReduce(root, inside)"  # one ring of 8: 15 operations per piece and member
    for pieces in (1, 2, 4):
        algorithm = compile_program(program, reduction, "t", pieces=pieces)
        assert algorithm.nchunksperloop == 8 * pieces and algorithm.pieces == pieces
        assert max(len(tb.steps) for tbs in algorithm.thread_blocks for tb in tbs) == 15 * pieces
        check_algorithm(algorithm.xml())
    assert compile_program(program, reduction, "t").pieces == 4  # the most that fits 64 steps per thread block
    # 8 pieces do not fit one ring per thread block (120 steps); as ReduceScatter + AllGather thread blocks on
    # two channels (8 steps per piece each) they do
    with pytest.raises(SynthError, match=r"does not fit MSCCL's 64 steps per thread block and 32 channels "
                                         r"\(8 piece\(s\): 120 steps in a thread block\)"):
        compile_program(program, reduction, "t", pieces=8, split_allreduce=False)
    split = compile_program(program, reduction, "t", pieces=8)
    assert split.nchannels == 2 and max(len(tb.steps) for tbs in split.thread_blocks for tb in tbs) == 64
    check_algorithm(split.xml())
    with pytest.raises(SynthError, match=r"\(16 piece\(s\): 240 steps in a thread block; AllReduce as "
                                         r"ReduceScatter \+ AllGather thread blocks, 16 piece\(s\): 128 steps"):
        compile_program(program, reduction, "t", pieces=16)


def test_an_allreduce_ring_over_64_ranks_runs_as_two_thread_blocks_per_rank():
    """One ring of g ranks needs 2g - 1 operations per thread block: 127 on
    p2-a100's 64 GPUs, above MSCCL's 64. As a ReduceScatter ring and an
    AllGather ring on two channels (g operations each, the AllGather waiting
    for the ReduceScatter's result on the same rank) it fits, and the
    checker's chunk-level run finds every output holding every input once."""
    reduction, program = next(_programs("p2-a100", "dp=64", "dp", Goal.ALLREDUCE))
    assert str(program) == "AllReduce(root, inside)"
    with pytest.raises(SynthError, match=r"\(1 piece\(s\): 127 steps in a thread block\)"):
        compile_program(program, reduction, "t", split_allreduce=False)
    algorithm = compile_program(program, reduction, "t")
    assert (algorithm.nchannels, algorithm.pieces, algorithm.ngpus) == (2, 1, 64)
    for rank, tbs in enumerate(algorithm.thread_blocks):
        assert sorted((tb.send, tb.recv, tb.chan) for tb in tbs) == [((rank + 1) % 64, (rank - 1) % 64, 0),
                                                                       ((rank + 1) % 64, (rank - 1) % 64, 1)]
        assert [len(tb.steps) for tb in tbs] == [64, 64]
    result = check_algorithm(algorithm.xml())
    assert (result.coll, result.ngpus) == ("allreduce", 64)


# ---------------------------------------------------------------- planted faults


@pytest.fixture(scope="module")
def good_xml() -> str:
    """A three-step hierarchical all-reduce on 2 nodes x 4 ranks, 2 pieces,
    for calls up to 1 MiB (so a message may carry 4 chunks: a piece holds up
    to 32 of them there)."""
    for reduction, program in _programs("testbed-2x4", "dp=8", "dp", Goal.ALLREDUCE):
        if len(program.instructions) == 3:
            return compile_program(program, reduction, "t", pieces=2, max_bytes=2**20).xml()
    raise AssertionError("no 3-step program")


def _lines(xml: str, pattern: str) -> list[int]:
    return [n for n, line in enumerate(xml.splitlines()) if re.search(pattern, line)]


def _replace_line(xml: str, number: int, old: str, new: str) -> str:
    lines = xml.splitlines()
    assert old in lines[number], (lines[number], old)
    lines[number] = lines[number].replace(old, new, 1)
    return "\n".join(lines) + "\n"


def _drop_step(xml: str, number: int) -> str:
    """Remove one step line and renumber the rest of its thread block."""
    lines = xml.splitlines()
    del lines[number]
    n = number
    while n < len(lines) and lines[n].strip().startswith("<step"):
        lines[n] = re.sub(r' s="(\d+)"', lambda m: f' s="{int(m.group(1)) - 1}"', lines[n], count=1)
        n += 1
    return "\n".join(lines) + "\n"


def _gpu0(xml: str, pattern: str) -> int:
    """The first line of gpu 0 matching ``pattern``."""
    last = _lines(xml, r'<gpu id="1"')[0]
    return next(n for n in _lines(xml, pattern) if n < last)


def _fault(xml: str, name: str) -> str:
    """``xml`` (the fixture's program: ReduceScatter(root, inside) ; AllGather(node,
    inside) ; AllGather(node, parallel(root))) with one fault planted in gpu 0."""
    tb0, tb1, tb2 = (_gpu0(xml, f'<tb id="{t}"') for t in range(3))
    if name == "wrong peer":
        return _replace_line(xml, tb0, 'send="1"', 'send="2"')
    if name == "dropped step":  # the last receive of the cross-node step
        return _drop_step(xml, tb2 + 6)
    if name == "duplicated reduce":  # adds its own input again to a reduced chunk it receives
        return _replace_line(xml, tb1 + 2, 'type="rcs" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="3"',
                             'type="rrcs" srcbuf="i" srcoff="3" dstbuf="o" dstoff="3"')
    if name == "wrong offset":
        return _replace_line(xml, tb0 + 1, 'srcoff="7"', 'srcoff="6"')
    if name == "missing dependency":  # sends o[0] without waiting for tb 0 to reduce it there
        return _replace_line(xml, tb1 + 1, 'depid="0" deps="7"', 'depid="-1" deps="-1"')
    if name == "cyclic dependencies":  # tb 0 waits for tb 1, which waits for tb 0
        return _replace_line(xml, tb0 + 1, 'depid="-1" deps="-1" hasdep="0"', 'depid="1" deps="3" hasdep="0"')
    if name == "swapped buffers":
        return _replace_line(xml, tb1 + 4, 'dstbuf="o" dstoff="1"', 'dstbuf="i" dstoff="1"')
    if name == "channel mismatch":
        return _replace_line(xml, tb1, 'chan="1"', 'chan="2"')
    if name == "bad protocol":
        return xml.replace('proto="Simple"', 'proto="simple"', 1)
    if name == "wrong chunk count":
        return _replace_line(xml, tb2 + 2, 'cnt="4"', 'cnt="3"')
    if name == "hasdep cleared":  # tb 1 waits for tb 0 step 7; neither it nor tb 0's later step 15 raise a flag now
        return _replace_line(_replace_line(xml, tb0 + 8, 'hasdep="1"', 'hasdep="0"'), tb0 + 16, 'hasdep="1"',
                             'hasdep="0"')
    if name == "deadlock above a size":  # messages of 4 chunks fill a connection once a piece holds 3 chunks or fewer
        return xml.replace('maxBytes="1048576"', 'maxBytes="0"', 1)
    if name == "xml declaration":
        return '<?xml version="1.0"?>\n' + xml
    if name == "tab indent":
        return xml.replace("    <tb", "\t<tb", 1)
    if name == "reduce_scatter name":
        return xml.replace('coll="allreduce"', 'coll="reduce_scatter"', 1)
    raise AssertionError(name)


FAULTS = {
    "wrong peer": r"deadlock|receives \d chunk",
    "dropped step": r"gpu 4 sent 1 message\(s\) to gpu 0 on chan 2 that no step receives",
    "duplicated reduce": r"gpu 0 output chunk 3 holds \{rank 0 chunk 3 x2, rank 1 chunk 3",
    "wrong offset": r"output chunk \d+ holds",
    "missing dependency": r"gpu \d output chunk 0 holds uninitialised data",
    "cyclic dependencies": r"deadlock .*gpu 0 tb 0 step 0 \(s, line \d+\): waits for tb 1 step 3",
    "swapped buffers": r"gpu 0 output chunk 1 holds uninitialised data",
    "channel mismatch": r"deadlock .*a message from gpu 0 on chan 1",
    "bad protocol": r'proto="simple": the executor knows Simple, LL, LL128 \(exact case\)',
    "wrong chunk count": r"gpu 4 tb \d step \d \(r\) receives 4 chunk\(s\) but gpu 0 sent 3 on chan 2",
    "hasdep cleared": r'depends on tb 0 step 7, but neither it nor a later step of that thread block has hasdep="1"',
    # the cross-node step is a ring of 2 that sends 4 chunks, then receives 4; Simple pieces take 4 of a connection's
    # 8 slots and hold up to 2 MiB (4 MiB buffer / 8 slots x 4), so the send sticks once it is 3 pieces or more: at
    # one chunk per piece, above 16 chunks x 1 MiB
    "deadlock above a size": rf"deadlock at {16 * 2**20 + 1} bytes \(Simple, 1 chunk\(s\) per piece, 1 loop "
                             r"iteration\(s\)\): 8 thread block\(s\) stuck: gpu 0 tb 2 step 1 \(s cnt=4, line \d+\), "
                             r"iteration 1, piece 3 of 4: connection gpu 0 -> gpu 4 chan 2 is full \(8 of 8 slots "
                             r"unreceived\)",
    "xml declaration": r"an XML declaration",
    "tab indent": r"a tab before the tag",
    "reduce_scatter name": r"write reducescatter",
}


@pytest.mark.parametrize("name", FAULTS)
def test_planted_faults_are_caught(good_xml, name):
    check_algorithm(good_xml, "good.xml")
    bad = _fault(good_xml, name)
    assert bad != good_xml
    with pytest.raises(SynthError) as caught:
        check_algorithm(bad, "bad.xml")
    message = str(caught.value)
    assert message.startswith("bad.xml"), message
    assert "\n" not in message
    assert re.search(FAULTS[name], message), message


def test_a_flag_raised_by_a_later_step_releases_a_wait(good_xml):
    """Flags only rise: a wait on a step without hasdep is released by a
    later step of that thread block that has it (the kernel compares
    curFlag >= goalFlag), so the file stays valid and exact."""
    tb0 = _gpu0(good_xml, '<tb id="0"')
    assert 'hasdep="1"' in good_xml.splitlines()[tb0 + 16]
    assert 'depid="0" deps="7"' in good_xml  # tb 1 waits for tb 0 step 7
    relaxed = _replace_line(good_xml, tb0 + 8, 'hasdep="1"', 'hasdep="0"')
    check_algorithm(relaxed, "relaxed.xml")


HAND_WRITTEN_RING = """<algo name="ring3" proto="LL" nchannels="1" nchunksperloop="3" ngpus="3" coll="allreduce" \
inplace="1" outofplace="1" minBytes="0" maxBytes="65536">
""" + "".join(
    f"""  <gpu id="{r}" i_chunks="3" o_chunks="3" s_chunks="0">
    <tb id="0" send="{(r + 1) % 3}" recv="{(r + 2) % 3}" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="{(r - 1) % 3}" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="{(r + 1) % 3}" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrcs" srcbuf="i" srcoff="{r}" dstbuf="o" dstoff="{r}" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rcs" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="{(r - 1) % 3}" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="4" type="r" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="{(r + 1) % 3}" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
""" for r in range(3)) + "</algo>\n"


def test_a_hand_written_ring_passes_and_its_results_are_the_sums():
    result = check_algorithm(HAND_WRITTEN_RING, "ring3.xml")
    assert (result.coll, result.ngpus, result.proto, result.max_bytes) == ("allreduce", 3, "LL", 65536)
    algo = parse(HAND_WRITTEN_RING, "ring3.xml")
    buffers = execute(algo, in_place=False, source="ring3.xml")
    for r in range(3):
        for c in range(3):
            assert dict(buffers[r]["o"][c][0]) == {(q, c): 1 for q in range(3)}
            assert dict(buffers[r]["i"][c][0]) == {(r, c): 1}  # out of place: the input is untouched
    # a reduce-scatter by the same ring, stopped after the reduction, is not an all-reduce
    partial = "\n".join(line for line in HAND_WRITTEN_RING.splitlines() if '<step s="3"' not in line and '<step s="4"' not in line)
    partial = partial.replace('type="rrcs"', 'type="rrc"') + "\n"
    with pytest.raises(SynthError, match=r"output chunk \d holds uninitialised data"):
        check_algorithm(partial, "partial.xml")


def test_reads_like_the_executor():
    with pytest.raises(SynthError, match=r"x.xml:1: <algo> lacks maxBytes"):
        check_algorithm(HAND_WRITTEN_RING.replace(' maxBytes="65536"', ""), "x.xml")
    with pytest.raises(SynthError, match=r"not one whole tag with double-quoted attributes"):
        check_algorithm(HAND_WRITTEN_RING.replace('ngpus="3"', "ngpus='3'"), "x.xml")
    with pytest.raises(SynthError, match=r"thread block ids \[1\]: must be 0, 1, \.\.\."):
        check_algorithm(HAND_WRITTEN_RING.replace('<tb id="0"', '<tb id="1"'), "x.xml")
    with pytest.raises(SynthError, match=r'cnt="x" is not an integer'):
        check_algorithm(HAND_WRITTEN_RING.replace('cnt="1"', 'cnt="x"', 1), "x.xml")


# ---------------------------------------------------------------- commands


def _dp_and_tp_plan(topology: str, axes: str) -> Plan:
    """A plan all-reducing over dp and over tp, each with its first program."""
    placement = enumerate_placements(load_topology(topology), parse_axes(axes))[0]
    reductions = []
    for axis in ("dp", "tp"):
        reduction = Reduction.of(placement, axis, Goal.ALLREDUCE)
        program = synthesize_reduction(reduction, 5).programs[0]
        reductions.append(Plan.single(lower(program, reduction), reduction).reductions[0])
    return Plan(placement, tuple(reductions))


@pytest.fixture
def hierarchical_plan(tmp_path) -> Path:
    path = tmp_path / "plan.json"
    write_plan(path, _dp_and_tp_plan("testbed-2x4", "tp=2,dp=4"))
    return path


def test_export_writes_checked_files_and_verify_reads_them(cli, tmp_path, hierarchical_plan):
    out = tmp_path / "msccl"
    code, text, err = cli("export", hierarchical_plan, "--format", "msccl", "--out", out)
    assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    # one program per reduction, cut where the protocol changes: LL for small sizes up to Simple for large ones
    assert {n.rsplit("-", 1)[0] for n in names} == {"dp-allreduce-0", "tp-allreduce-0"} and len(names) >= 4, names
    assert "checked out-of-place and in-place" in text and "MSCCL_ALGO_DIR" in text
    for name in names:
        code, text, _ = cli("verify", out / name)
        assert code == 0 and "verified allreduce on" in text
    code, text, _ = cli("verify", out / names[0], "--json")
    doc = json.loads(text)
    assert doc["verified"] and doc["ngpus"] == 4 and doc["modes"] == ["out-of-place", "in-place"]
    code, text, _ = cli("export", hierarchical_plan, "--format", "msccl", "--out", tmp_path / "dp", "--reduce", "dp",
                        "--json")
    doc = json.loads(text)
    assert all(f["file"].startswith("dp-allreduce-0-") for f in doc["files"]) and doc["files"][0]["checked"]["steps"] > 0
    assert [f["proto"] for f in doc["files"]][0] == "LL" and doc["files"][-1]["proto"] == "Simple"
    assert doc["files"][0]["minBytes"] == 0 and doc["files"][-1]["maxBytes"] == 0
    predicted = doc["files"][-1]["predicted"]  # the large-size file: pipelining pays there
    assert 0 < predicted["pipelined_s"] <= predicted["step_by_step_s"] and predicted["size_bytes"] > 0
    assert all(f["predicted"]["as_written_s"] > 0 for f in doc["files"])


def test_export_errors(cli, tmp_path, hierarchical_plan):
    assert "give --out DIR" in usage_error(cli, "export", hierarchical_plan, "--format", "msccl")
    assert "its parent folder" in usage_error(cli, "export", hierarchical_plan, "--format", "msccl", "--out",
                                              tmp_path / "no" / "where")
    assert "--reduce pp: the plan reduces over dp; tp" == usage_error(
        cli, "export", hierarchical_plan, "--format", "msccl", "--out", tmp_path / "x", "--reduce", "pp")
    assert "--reduce applies to --format msccl only" in usage_error(
        cli, "export", hierarchical_plan, "--format", "rank-map", "--reduce", "dp")
    bad = tmp_path / "bad.xml"
    bad.write_text(HAND_WRITTEN_RING.replace('proto="LL"', 'proto="ll"'))
    assert usage_error(cli, "verify", bad).startswith(f"{bad}:1: proto=\"ll\"")


def test_files_of_two_reductions_alike_are_reported(tmp_path):
    """tp and dp groups of one size, both all-reduce: the executor would pick
    the first file for both; the export says so."""
    assert shadowed(plan_files(_dp_and_tp_plan("testbed-2x2x2", "tp=2,dp=4"))) == []  # 4 and 2 ranks: told apart
    files = plan_files(_dp_and_tp_plan("testbed-2x2x2", "tp=2,dp=2,pp=2"))
    expected = [(a.name, b.name) for a in files for b in files if a.axes == ("dp",) and b.axes == ("tp",)
                and a.algorithm.min_bytes <= (b.algorithm.max_bytes or 2**64)
                and b.algorithm.min_bytes <= (a.algorithm.max_bytes or 2**64)]
    assert expected and sorted((a.name, b.name) for a, b in shadowed(files)) == sorted(expected)


def test_a_job_plan_exports_every_size_range(tmp_path):
    from synth.cli import main

    job = tmp_path / "job.json"
    assert main(["plan", "--topology", "testbed-2x4", "--model", "layers=4,hidden=256,heads=8,seq=128,vocab=1000",
                 "--global-batch", "16", "--axes", "tp=2,dp=4,pp=1", "--device", "memory_GiB=16,peak_TFLOPs=1",
                 "--out", str(job)]) == 0
    plan = load_plan(job)
    files = plan_files(plan)
    ranges = sum(len(p.programs) for p in plan.reductions)
    assert len(files) >= ranges  # each range cut where its protocol changes
    for f in files:
        check_algorithm(f.algorithm.xml(), f.name)
        assert f.algorithm.proto in ("Simple", "LL128", "LL")
    by_reduction: dict = {}
    for f in files:
        by_reduction.setdefault((f.axes, f.algorithm.coll), []).append(f.algorithm)
    for algorithms in by_reduction.values():
        assert algorithms[0].min_bytes == 0 and algorithms[-1].max_bytes == 0
        for a, b in zip(algorithms, algorithms[1:]):
            assert b.min_bytes == a.max_bytes + 1  # MSCCL's maxBytes is inclusive


# ---------------------------------------------------------------- NCCL tuner rules


def test_tuner_rules_cover_every_size_with_the_cheapest_algorithm(hierarchical_plan):
    """Per group shape, ranges from 0 to the largest size without gaps; at
    each range's start the rule's algorithm is priced no slower than any other
    the group has (recomputed here with the model forced to each)."""
    from synth.cost import Model
    from synth.cost.model import Algorithm
    from synth.cost.nccl import choose, comm_of
    from synth.cost.predict import default_program, predict_program
    from synth.export.nccl_tuner import MAX_BYTES, TunerRule, check_tuner_csv, plan_rules, tuner_csv
    from synth.synthesis.language import Collective

    plan = load_plan(hierarchical_plan)
    rules = plan_rules(plan)
    assert check_tuner_csv(tuner_csv(rules, "plan"), "rules.csv") == [
        TunerRule(r.collective, r.min_bytes, r.max_bytes, r.algorithm, r.protocol, r.channels, r.nodes, r.ranks)
        for r in rules]
    names = {"nvls_tree": "nvlstree"}
    for planned in plan.reductions:
        first = planned.reduction
        comm = comm_of(first.topology, tuple(int(d) for d in first.reduction_groups[0]))
        # every collective a trainer calls on the group gets rules, or the plugin runs it on 1 channel
        assert {r.collective for r in rules if r.reduce == first.axes} == {"allreduce", "reducescatter", "allgather"}
        for goal in Goal:
            reduction = Reduction.of(first.placement, first.axes, goal)
            mine = [r for r in rules if r.reduce == first.axes and r.collective == goal.value]
            assert mine[0].min_bytes == 0 and mine[-1].max_bytes == MAX_BYTES
            assert all(b.min_bytes == a.max_bytes + 1 for a, b in zip(mine, mine[1:]))
            assert {(r.nodes, r.ranks) for r in mine} == {(comm.nodes, comm.ranks)}
            lowered = lower(default_program(reduction.goal), reduction)
            for rule in mine:
                size = max(rule.min_bytes, 1)
                times = {}
                for algorithm in (Algorithm.RING, Algorithm.TREE, Algorithm.NVLS, Algorithm.NVLS_TREE, Algorithm.PAT):
                    if choose(comm, goal.collective, float(size), algorithm.forced).algorithm == algorithm.value:
                        times[algorithm.value] = predict_program(lowered, reduction, size, Model(algorithm))
                assert times[names.get(rule.algorithm, rule.algorithm)] == min(times.values()), (rule, times)
                # the channels NCCL would run the call on at both ends (src/enqueue.cc's loop: the communicator's
                # channels, one fewer while the bytes are below channels x threads x threshold)
                for end in (size, min(rule.max_bytes, 2**40)):
                    assert rule.channels == _nccl_channels(comm, rule.algorithm, rule.protocol, end), (rule, end)


def test_tuner_rules_keep_nvls_on_the_channels_nccl_runs_it_on():
    """NCCL runs an NVLS call on the communicator's nvlsChannels (16 on an
    H100: src/enqueue.cc:1845-1847, src/transport/nvls.cc:147-149 at
    v2.27.7-1) and a tuner's count overrides its own: the rules of an NVLS
    all-reduce inside a DGX H100 node state 16, not the NVLS graph's 8 heads."""
    from synth.export.nccl_tuner import plan_rules

    rules = plan_rules(_dp_and_tp_plan("dgx-h100", "tp=8,dp=16"))
    nvls = [r for r in rules if r.algorithm in ("nvls", "nvls_tree")]
    assert nvls and {r.channels for r in nvls} == {16}, nvls


def _nccl_channels(comm, algorithm: str, protocol: str, nbytes: int) -> int:
    from synth.cost.nccl import MAX_THREADS, PCI_BW, THREAD_THRESHOLDS, ring_graph, runtime_channels

    if algorithm in ("nvls", "nvls_tree"):  # comm->nvlsChannels (src/enqueue.cc:1845-1847; nvls.cc:147-149, 193-198)
        return 16 if comm.sm < 100 else (32 if comm.nodes > 1 else 24)
    proto = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}[protocol]
    threads = MAX_THREADS[proto]
    if algorithm == "ring" and proto == "Simple":
        ring = ring_graph(comm)
        threads = 256 if ring.bw_intra * ring.channels <= PCI_BW else 512
    threshold = THREAD_THRESHOLDS[proto] * (comm.ranks if algorithm == "ring" and proto == "LL" else 1)
    return max(1, min(runtime_channels(comm), nbytes // (threads * threshold)))


@pytest.mark.parametrize("line,message", [
    ("allreduce,0,100,ring,simple,-1,1,8", None),
    ("allreduce,0,100,ring,simple,-1,1", "7 fields; the plugin needs 8 to 10"),
    ("all_reduce,0,100,ring,simple,-1,1,8", "collective 'all_reduce' is not one the plugin knows"),
    ("allreduce,0,100,Ring,simple,-1,1,8", "algorithm 'Ring' is not one the plugin knows"),
    ("allreduce,0,100,ring,LL,-1,1,8", "protocol 'LL' is not one the plugin knows"),
    ("allreduce,100,0,ring,simple,-1,1,8", "sizes 100..0"),
    ("allreduce,0,1e3,ring,simple,-1,1,8", "field 3 '1e3' is not an integer"),
    ("allreduce,0,100,ring,simple,0,1,8", "channels 0: -1"),
    ("allreduce,0,100,ring,simple,-1,1,8,-1,2", "regBuff 2"),
    ("allreduce,0,100,ring,simple,-1,1,8 " + " " * 260, "characters; the plugin reads at most 254"),
])
def test_the_tuner_csv_is_read_as_the_plugin_reads_it(line, message):
    from synth.export.nccl_tuner import check_tuner_csv

    text = "# a comment\n\n" + line + "\n"
    if message is None:
        assert len(check_tuner_csv(text, "t.csv")) == 1
    else:
        with pytest.raises(SynthError, match=re.escape(message)):
            check_tuner_csv(text, "t.csv")
    hidden = "allreduce,0,100,ring,simple,-1,1,8\nallreduce,50,200,tree,simple,-1,1,8\n"
    with pytest.raises(SynthError, match=r"t.csv:2: sizes 50..200 overlap line 1's 0..100"):
        check_tuner_csv(hidden, "t.csv")
    assert len(check_tuner_csv(hidden.replace(",1,8\nallreduce,50", ",1,8\nallreduce,101"), "t.csv")) == 2


def test_tuner_and_env_commands(cli, tmp_path, hierarchical_plan):
    out = tmp_path / "rules.csv"
    code, text, _ = cli("export", hierarchical_plan, "--format", "nccl-tuner", "--out", out)
    assert code == 0 and out.read_text().startswith("# NCCL example tuner plugin rules")
    code, text, _ = cli("export", hierarchical_plan, "--format", "nccl-env")
    assert code == 0
    env = dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines())
    assert set(env) == {"NCCL_ALGO", "NCCL_PROTO"}
    # NCCL's parseList grammar: "func:elem,elem;func:elem", names from ncclFuncStr / ncclAlgoStr / ncclProtoStr
    for entry in env["NCCL_ALGO"].strip('"').split(";"):
        func, elems = entry.split(":")
        assert func in ("AllReduce", "ReduceScatter", "AllGather")
        assert set(elems.split(",")) <= {"Tree", "Ring", "NVLS", "NVLSTree", "PAT"}
    for entry in env["NCCL_PROTO"].strip('"').split(";"):
        assert set(entry.split(":")[1].split(",")) <= {"LL", "LL128", "Simple"}
    doc = json.loads(cli("export", hierarchical_plan, "--format", "nccl-tuner", "--json")[1])
    assert doc["format"] == "nccl-tuner" and doc["rules"] and set(doc["env"]) == {"NCCL_ALGO", "NCCL_PROTO"}


# ---------------------------------------------------------------- pipelined execution


@pytest.mark.mpi
def test_pipelined_schedules_are_exact_under_mpi():
    """Every all-reduce program of testbed-2x4 (dp=8; dp=4,mp=2 over dp) as
    its MSCCL schedule, run with non-blocking point-to-point on 8 MPI ranks
    (one stream per thread block): every buffer equals the direct sum."""
    from processes import run_watched
    from test_runtime import REPO, mpi_env, mpiexec_command

    done = run_watched(mpiexec_command(8, "tests/mpi_worker.py", "pipelined"), stall_s=180, cwd=REPO, env=mpi_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"ok: \d+ pipelined runs on 8 ranks, all exact", done.stdout), done.stdout


@pytest.mark.mpi
def test_the_pipelined_benchmark_script_checks_every_result_and_prints_bound_and_model():
    """scripts/bench_pipelined.py (docs/nccl-programs.md) under mpiexec: the
    default, the program step by step and pipelined, all exact; with
    ``--uplink-gbit`` the NIC bound (2 (N-1)/N x size per uplink direction) and
    with ``--predict`` the model's times, the pipelined one as
    synth.cost.pipeline prices it."""
    from dataclasses import replace

    from processes import run_watched
    from test_runtime import REPO, mpi_env, mpiexec_command

    from synth.cost.pipeline import predict_pipelined
    from synth.synthesis.lowering import lower
    from synth.synthesis.placement import enumerate_placements, parse_axes
    from synth.synthesis.reduction import Reduction
    from synth.synthesis.search import synthesize_reduction
    from synth.synthesis.semantics import Goal
    from synth.topology import load_topology

    done = run_watched(mpiexec_command(8, "scripts/bench_pipelined.py", "--sizes", "64K", "--iters", "1",
                                       "--program", "16", "--uplink-gbit", "0.5", "--predict"),
                       stall_s=120, cwd=REPO, env=mpi_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "NIC bound at 0.5 Gbit/s over 2 nodes" in done.stdout, done.stdout
    row = next(line.split() for line in done.stdout.splitlines() if line.strip().startswith("65536 "))
    assert row[7] == "0", done.stdout  # #wrong over the three variants
    assert row[8] == f"{65536 * 8 / 0.5e9 * 1e3:.2f}ms"  # 2 nodes: the whole buffer crosses each uplink once
    topology = load_topology("testbed-2x4")
    node = topology.levels[0]
    seen = replace(topology, levels=(replace(node, bandwidth_GBps=0.5 / 8 / node.ports), *topology.levels[1:]))
    reduction = Reduction.of(enumerate_placements(seen, parse_axes("dp=8"))[0], "dp", Goal.ALLREDUCE)
    program = synthesize_reduction(reduction, 5).programs[16]
    priced = predict_pipelined(lower(program, reduction), reduction, 65536, 8).pipelined_s
    assert row[13] == f"{priced * 1e3:.2f}ms", done.stdout


@pytest.mark.mpi
def test_bench_times_the_pipelined_schedule_beside_the_program(tmp_path):
    """``bench --pipelined`` under mpiexec: each synthesized all-reduce is
    followed by itself run as its schedule (``~p``), checked exactly every
    iteration; measurement records stay those of step-by-step execution."""
    from processes import run_watched
    from test_runtime import REPO, mpi_env, mpiexec_command

    records = tmp_path / "m.jsonl"
    done = run_watched(mpiexec_command(8, "-m", "synth.cli", "bench", "--topology", "testbed-2x4", "--axes", "dp=8",
                                       "--sizes", "64K", "--iters", "2", "--warmup", "0", "--top", "2",
                                       "--placement", "0", "--pipelined", "--jsonl", str(records)),
                       stall_s=120, cwd=REPO, env=mpi_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("0/")]
    timed = {row[0]: row[-1] for row in rows if len(row) == 10}
    assert set(timed) == {"0/0", "0/1", "0/1~p"} and set(timed.values()) == {"0"}, done.stdout
    assert len(records.read_text().splitlines()) == 2  # 0/0 and 0/1; the ~p row is not a record of the program


def test_pipelined_bench_needs_mpi():
    from synth.runtime.bench_setup import BenchRequest, check_request
    from synth.synthesis.problem import ProblemSpec

    request = BenchRequest(sizes=(1024,), problem=ProblemSpec(topology="testbed-2x4", axes="dp=8"), backend="torch",
                           pipelined=True)
    with pytest.raises(SynthError, match="--pipelined runs schedules with MPI point-to-point: bench with --backend mpi"):
        check_request(request)


def test_instances_deal_pieces_over_channels():
    """``instances`` channels per step: piece p on the (p mod instances)-th,
    each with its own thread blocks; the files still check, and thread blocks
    get shorter."""
    reduction, program = next((r, p) for r, p in _programs("testbed-2x4", "dp=8", "dp", Goal.ALLREDUCE)
                              if len(p.instructions) == 3)
    one = compile_program(program, reduction, "t", pieces=4)
    two = compile_program(program, reduction, "t", pieces=4, instances=2)
    assert (one.nchannels, two.nchannels) == (3, 6)
    assert {tb.chan for tbs in two.thread_blocks for tb in tbs} == set(range(6))
    assert max(len(tb.steps) for tbs in two.thread_blocks for tb in tbs) < max(
        len(tb.steps) for tbs in one.thread_blocks for tb in tbs)
    for algorithm in (one, two):
        check_algorithm(algorithm.xml(), "t")
    with pytest.raises(SynthError, match=r"3 steps x 11 instance\(s\) need 33 channels; MSCCL has 32"):
        compile_program(program, reduction, "t", instances=11)
    with pytest.raises(SynthError, match=r"--instances 0: channels per step, an integer >= 1"):
        compile_program(program, reduction, "t", instances=0)


def test_export_instances(cli, tmp_path, hierarchical_plan):
    code, text, _ = cli("export", hierarchical_plan, "--format", "msccl", "--out", tmp_path / "x", "--instances", "2",
                        "--json")
    assert code == 0 and all(f["checked"]["steps"] > 0 for f in json.loads(text)["files"])
    assert "--instances applies to --format msccl only" in usage_error(
        cli, "export", hierarchical_plan, "--format", "rank-map", "--instances", "2")
