"""The public Python API (synth.solve, synth.rank_placements, plans, Reduction,
Model, measurement records) and the light runtime: the API gives exactly what
the command line prints, plans round-trip with several reductions and size
ranges, and executing a plan loads no part of the synthesizer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from processes import limit_s

import synth
from synth.cli import main
from synth.cost import Algorithm, Model, NetworkProfile, default_program
from synth.cost.records import Record, append_records, read_records
from synth.errors import SynthError
from synth.plan import Plan, PlannedProgram, PlannedReduction, load_plan, plan_document, write_plan
from synth.runtime.backends import run_local
from synth.runtime.executor import Executor, reference
from synth.synthesis.language import format_program, parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import Placement, enumerate_placements, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

REPO = Path(__file__).resolve().parents[1]
BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"


def cli_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ================================================================ solve = the CLI


def test_solve_returns_exactly_what_the_cli_prints(capsys):
    doc = cli_json(capsys, "--topology", "p2-a100", "--axes", "dp=4,mp=16", "--reduce", "dp")
    solution = synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp")
    # .placements in enumeration order (the CLI's '#'), each with .matrix
    by_index = sorted(doc["placements"], key=lambda p: p["index"])
    assert [p.index for p in solution.placements] == [p["index"] for p in by_index] == [0, 1, 2]
    assert [[list(r) for r in p.matrix] for p in solution.placements] == [p["matrix"] for p in by_index]
    for got, want in zip(solution.placements, by_index):
        # every program, fastest predicted first, with the same text, steps and seconds
        assert [r.text for r in got.programs] == [q["text"] for q in want["programs"]]
        assert [r.predicted_s for r in got.programs] == [q["predicted_s"] for q in want["programs"]]
        assert [len(r.steps) for r in got.programs] == [q["num_steps"] for q in want["programs"]]
        assert got.num_programs == want["num_programs"] == len(got.programs)
        assert got.default_s == want["default"]["predicted_s"]
        assert all(r.verification is not None and r.verification.proof.proved for r in got.programs)
    assert [p.index for p in solution.by_speed] == [p["index"] for p in doc["placements"]]
    assert solution.best.index == doc["placements"][0]["index"]
    blueconnect = solution.placements[1].programs[0]
    assert blueconnect.text == BLUECONNECT and blueconnect.steps[0].groups[0] == (0, 8)


def test_solve_takes_a_topology_value_axes_text_a_model_and_constraints():
    dgx = load_topology("dgx-a100").scaled({"node": 2})
    solution = synth.solve(dgx, "dp=2,mp=8", model=Model(Algorithm.TREE), constraints=["mp@node=1"],
                           size="64MiB", top=1, verify=False)
    assert [p.matrix for p in solution.placements] == [((2, 1), (1, 8))]
    assert solution.size_bytes == 64 * 2**20 and solution.model.algorithm is Algorithm.TREE
    (only,) = solution.placements
    assert len(only.programs) == 1 and only.programs[0].verification is None and only.num_programs > 1
    assert only.program(only.num_programs - 1).predicted_s >= only.programs[0].predicted_s


@pytest.mark.parametrize("kwargs, message", [
    (dict(axes={"dp": 4, "mp": 8}), "--axes: the axis sizes multiply to 32"),
    (dict(axes={"dp": 4, "mp": 16}, reduce="tp"), "--reduce: unknown axis 'tp'"),
    (dict(axes={"dp": 4, "mp": 16}, goal="allfrobnicate"), "goal 'allfrobnicate': use one of allreduce"),
    (dict(axes={"dp": 4, "mp": 16}, model="bogus"), "--algo bogus: choose one of nccl, ring, tree, nvls, nvlstree, pat, mpi"),
    (dict(axes={"dp": 4, "mp": 16}, size="lots"), "--size 'lots': expected a positive size"),
    (dict(axes={"dp": 4, "mp": 16}, max_steps=0), "--max-steps 0: must be >= 1"),
    (dict(axes={"dp": 4, "mp": 16}, constraints=["dp@rack=1"]), "unknown level 'rack'"),
])
def test_solve_bad_input_is_a_synth_error(kwargs, message):
    with pytest.raises(SynthError) as exc:
        synth.solve("p2-a100", **kwargs)
    assert message in str(exc.value)


def test_solution_plan_is_the_clis_out(tmp_path):
    solution = synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp", top=0, verify=False)
    api_path = tmp_path / "api.json"
    write_plan(api_path, solution.plan(placement=1))
    cli_path = tmp_path / "cli.json"
    assert main(["--topology", "p2-a100", "--axes", "dp=4,mp=16", "--placement", "1", "--no-verify",
                 "--out", str(cli_path)]) == 0
    assert json.loads(api_path.read_text()) == json.loads(cli_path.read_text())
    with pytest.raises(SynthError, match="--program 100: placement 1 has programs 0..99"):
        solution.plan(placement=1, program=100)


def test_rank_placements_returns_what_the_cli_prints(capsys):
    workload = "dp:allreduce:1GiB,mp:allreduce:64MiB*48"
    doc = cli_json(capsys, "--topology", "p2-a100", "--axes", "dp=4,mp=16", "--workload", workload)
    result = synth.rank_placements("p2-a100", {"dp": 4, "mp": 16}, workload)
    assert [p.index for p in result.placements] == [p["index"] for p in doc["placements"]]
    for got, want in zip(result.placements, doc["placements"]):
        assert got.total_s == want["total_predicted_s"] and got.default_total_s == want["default_total_predicted_s"]
        assert [r.best.text for r in got.items] == [i["best_program"]["text"] for i in want["items"]]
        assert all(r.best.verification.proof.proved for r in got.items)


# ================================================================ Reduction


@pytest.mark.parametrize("name, axes, matrix, reduce", [
    ("p2-a100", "dp=4,mp=16", ((2, 2), (2, 8)), ("dp",)),
    ("rack", "a=4,b=4,c=4", ((2, 1, 1, 2), (1, 2, 2, 1), (1, 2, 1, 2)), ("a", "c")),
    ("testbed-2x4", "dp=2,mp=4", ((2, 1), (1, 4)), ("dp", "mp")),
])
def test_reduction_tables_hold_their_invariants(name, axes, matrix, reduce):
    topology = load_topology(name)
    placement = Placement(topology, parse_axes(axes), matrix)
    reduction = Reduction.of(placement, reversed(reduce))  # any order in, declared order kept
    assert reduction.axes == reduce
    k = math.prod(a.size for a in placement.axes if a.name in reduce)
    assert reduction.k == k == math.prod(reduction.hierarchy.sizes)
    by_rank, by_index = reduction.reduction_groups, reduction.synthesis_groups
    assert by_rank.shape == by_index.shape == (topology.num_devices // k, k)
    assert sorted(by_rank.ravel().tolist()) == list(range(topology.num_devices))
    for row_rank, row_index in zip(by_rank, by_index):
        assert sorted(row_rank.tolist()) == sorted(row_index.tolist())
    sigma = reduction.rank_to_synthesis_index
    assert (by_index[:, list(sigma)] == by_rank).all()
    # the reduction groups are the mesh's slices over the reduction axes
    mesh = placement.mesh
    kept = [i for i, a in enumerate(placement.axes) if a.name not in reduce]
    red = [i for i, a in enumerate(placement.axes) if a.name in reduce]
    assert (np.moveaxis(mesh, red, list(range(len(kept), mesh.ndim))).reshape(-1, k) == by_rank).all()
    # the synthesis hierarchy: levels where the reduction axes are split, in order
    levels = [(lv.name, math.prod(placement.matrix[i][l] for i in red)) for l, lv in enumerate(topology.levels)]
    assert list(zip(reduction.hierarchy.names, reduction.hierarchy.sizes)) == [x for x in levels if x[1] > 1]


def test_reduction_rejects_unknown_repeated_or_unordered_axes():
    placement = enumerate_placements(load_topology("p2-a100"), parse_axes("dp=4,mp=16"))[0]
    with pytest.raises(SynthError, match="name at least one of the declared axes"):
        Reduction(placement, ("tp",))
    with pytest.raises(SynthError, match="an axis is named twice"):
        Reduction.of(placement, ("dp", "dp"))
    with pytest.raises(SynthError, match="in declared order"):
        Reduction(placement, ("mp", "dp"))


def test_semantics_does_not_import_placement():
    source = (REPO / "synth" / "synthesis" / "semantics.py").read_text()
    assert "placement" not in [line.split()[1].lstrip(".") for line in source.splitlines()
                               if line.startswith(("from .", "import "))]


# ================================================================ Model


def test_model_names_its_algorithm_and_profile(tmp_path):
    p2 = load_topology("p2-a100")
    assert Model().describe() == "NCCL 2.27.7 model, shipped calibration from the public NCCL corpus"
    assert Model(prior=True).describe() == "NCCL 2.27.7 model, topology's numbers as priors"
    assert Model(prior=True).profile_for(p2) == NetworkProfile.prior(p2)
    path = tmp_path / "p.json"
    from synth.cost import save_profile

    save_profile(path, NetworkProfile.prior(p2))
    model = Model.load("mpi", path)
    assert model.algorithm is Algorithm.MPI and model.describe() == f"MPI (OpenMPI tuned defaults) model, profile {path}"
    with pytest.raises(SynthError, match=f"{path} was fitted for topology 'p2-a100'"):
        model.profile_for(load_topology("dgx-a100"))


# ================================================================ plans with several programs


def _two_reduction_plan() -> Plan:
    """dp allreduce with two size ranges and mp reducescatter, on testbed-2x4."""
    placement = Placement(load_topology("testbed-2x4"), parse_axes("dp=4,mp=2"), ((2, 2), (1, 2)))
    dp = Reduction.of(placement, ["dp"])
    mp = Reduction.of(placement, ["mp"], Goal.REDUCESCATTER)
    small = lower(default_program(Goal.ALLREDUCE), dp)
    large = lower(parse_program(BLUECONNECT), dp)
    return Plan(placement, (
        PlannedReduction(dp, (PlannedProgram(small, 0, 4096), PlannedProgram(large, 4096, None, 1e-3, 2**20))),
        PlannedReduction(mp, (PlannedProgram(lower(default_program(Goal.REDUCESCATTER), mp)),)),
    ))


def test_plan_with_several_reductions_and_sizes_round_trips(tmp_path):
    plan = _two_reduction_plan()
    path = tmp_path / "job.json"
    write_plan(path, plan)
    loaded = load_plan(path)
    assert loaded == plan
    assert plan_document(loaded) == json.loads(path.read_text())
    dp = loaded.find("dp")
    assert [format_program(dp.program_for(s).program, " ; ") for s in (0, 4095, 4096, 2**30)] == [
        "AllReduce(root, inside)"] * 2 + [BLUECONNECT.replace("\n", " ; ")] * 2
    assert loaded.find(goal="reducescatter").reduction.axes == ("mp",)
    with pytest.raises(SynthError, match="the plan holds several reductions"):
        loaded.only
    with pytest.raises(SynthError, match="the plan has no reduction allgather over dp"):
        loaded.find("dp", "allgather")
    code = main(["verify", str(path)])
    assert code == 0


@pytest.mark.parametrize("ranges, problem", [
    (((0, 100), (200, None)), "without gap or overlap"),
    (((10, None),), "starts at 10 bytes, not 0"),
    (((0, 100),), "must be unbounded"),
])
def test_plan_size_ranges_must_tile_every_size(tmp_path, ranges, problem):
    doc = plan_document(_two_reduction_plan())
    programs = doc["reductions"][0]["programs"]
    doc["reductions"][0]["programs"] = [dict(programs[0], min_bytes=lo, max_bytes=hi) for lo, hi in ranges]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SynthError) as exc:
        load_plan(path)
    assert str(exc.value).startswith(f"{path}: not a valid plan: 'reductions[0].programs' size ranges") and \
        problem in str(exc.value)


def test_version_1_plans_are_read(tmp_path):
    """A plan as the previous version wrote it (one program, plain chunk lists)."""
    placement = Placement(load_topology("p2-a100"), parse_axes("dp=4,mp=16"), ((2, 2), (2, 8)))
    reduction = Reduction.of(placement, ["dp"])
    lowered = lower(parse_program(BLUECONNECT), reduction)
    v1 = {
        "schema": "synth-reduce/plan", "version": 1, "created_by": "synth-reduce 0.1.0",
        "topology": placement.topology.to_dict(), "axes": [{"name": "dp", "size": 4}, {"name": "mp", "size": 16}],
        "reduce": ["dp"], "collective": "allreduce", "matrix": [[2, 2], [2, 8]], "mesh": placement.mesh.tolist(),
        "synthesis_hierarchy": [{"name": "node", "size": 2}, {"name": "gpu", "size": 2}], "num_chunks": 4,
        "reduction_groups": [list(g) for g in lowered.reduction_groups], "chunk_of_rank": [0, 1, 2, 3],
        "program": {"text": BLUECONNECT, "num_steps": 3, "steps": [
            {"instruction": str(s.instruction), "collective": s.collective.value,
             "groups": [list(g) for g in s.groups], "chunks": [list(c) for c in s.chunks]} for s in lowered.steps]},
        "predicted_s": 0.25,
    }
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(v1))
    plan = load_plan(path)
    assert plan.lowered == lowered and plan.reduction == reduction
    assert plan.only.programs[0].predicted_s == 0.25
    v1["program"]["steps"][1]["groups"][0] = [0, 40]
    path.write_text(json.dumps(v1))
    with pytest.raises(SynthError, match="step 2 .* stores groups or chunks that differ"):
        load_plan(path)


def test_executor_runs_the_program_of_the_buffer_size():
    plan = _two_reduction_plan()
    dp = plan.find("dp")
    rng = np.random.default_rng(3)
    for n, program in ((7, dp.programs[0]), (2048, dp.programs[1])):  # 28 B and 8 KiB of float32
        buffers = rng.integers(-100, 100, size=(8, n)).astype(np.float32)
        out = buffers.copy()

        def body(world):
            executor = Executor(plan, world, reduce="dp")
            assert executor.program_for(out[world.rank].nbytes) == program.lowered
            executor(out[world.rank])

        run_local(8, body)
        assert (out == reference(program.lowered, buffers)).all()
        groups = plan.find("dp").reduction.reduction_groups
        for group in groups:
            assert (out[group] == buffers[group].sum(axis=0)).all()
    with pytest.raises(SynthError, match="the plan holds several reductions"):
        run_local(8, lambda world: Executor(plan, world))


# ================================================================ light runtime


def test_the_runtime_loads_and_runs_a_plan_without_the_synthesizer(tmp_path):
    path = tmp_path / "plan.json"
    write_plan(path, _two_reduction_plan())
    code = (
        "import sys, numpy as np\n"
        "import synth.runtime.executor\n"
        "heavy = lambda: sorted({'z3', 'lark', 'yaml'} & {m.split('.')[0] for m in sys.modules})\n"
        "print(heavy())\n"
        "import synth\n"
        f"plan = synth.load_plan({str(path)!r})\n"
        "from synth.runtime.backends import run_local\n"
        "out = np.arange(8 * 5, dtype=np.float64).reshape(8, 5)\n"
        "run_local(8, lambda w: synth.Executor(plan, w, reduce='mp', goal='reducescatter')(out[w.rank]))\n"
        "print(heavy())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit_s(120), cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]"]


def test_package_top_level_exports_the_api():
    for name in ("solve", "rank_placements", "load_plan", "verify_plan", "Executor", "Model", "Plan", "Reduction"):
        assert getattr(synth, name) is not None and name in synth.__all__
    with pytest.raises(AttributeError, match="no attribute 'frobnicate'"):
        synth.frobnicate


# ================================================================ measurement records


def test_records_round_trip_and_refuse_other_schemas(tmp_path):
    placement = Placement(load_topology("testbed-2x4"), parse_axes("dp=8"), ((2, 4),))
    reduction = Reduction.of(placement, ["dp"])
    records = [Record(reduction, parse_program(BLUECONNECT.replace("node", "node")), 1024, 1e-3, backend="mpi",
                      dtype="float32", ranks=8, times_s=(1e-3, 2e-3, 1e-3), min_s=1e-3, max_s=2e-3),
               Record(reduction, default_program(Goal.ALLREDUCE), 1024, 2e-3, is_default=True, algo="tree")]
    path = tmp_path / "m.jsonl"
    append_records(path, records[:1])
    append_records(path, records[1:])
    topology, read = read_records(path)
    assert topology == placement.topology and read == records and [r.line for r in read] == [1, 2]
    assert [r.algorithm for r in read] == ["mpi", "tree"]


# ================================================================ scale: top-K, limits, shared verification


@pytest.mark.parametrize("topology, axes, reduce, goal", [
    ("p2-a100", {"dp": 4, "mp": 16}, "dp", "allreduce"),
    ("testbed-2x4", {"a": 2, "b": 2, "c": 2}, "a,c", "allreduce"),
    ("p2-v100", {"dp": 8, "mp": 4}, "dp,mp", "reducescatter"),
    ("rack", {"x": 16, "y": 4}, "x", "allreduce"),
])
def test_the_best_programs_are_the_prefix_of_the_full_ranking(topology, axes, reduce, goal):
    """The table's top K (k shortest paths, nothing enumerated) is exactly the
    first K of ranking every program (what --json lists)."""
    full = synth.solve(topology, axes, reduce=reduce, goal=goal, verify=False)
    for top in (1, 3):
        best = synth.solve(topology, axes, reduce=reduce, goal=goal, verify=False, top=top)
        for got, want in zip(best.placements, full.placements):
            assert [(r.text, r.predicted_s) for r in got.programs] == \
                [(r.text, r.predicted_s) for r in want.programs[:top]]
            assert (got.num_programs, got.default_s, got.best_s, got.speedup) == \
                (want.num_programs, want.default_s, want.best_s, want.speedup)
            if want.num_programs > 5:  # beyond the listed ones, on demand
                assert (got.program(5).text, got.program(5).predicted_s) == \
                    (want.programs[5].text, want.programs[5].predicted_s)
        assert [p.index for p in best.by_speed] == [p.index for p in full.by_speed]


def test_listing_every_program_is_refused_before_enumerating_beyond_the_limit(monkeypatch):
    import synth.api.reduction

    monkeypatch.setattr(synth.api.reduction, "LISTING_LIMIT", 50)
    with pytest.raises(SynthError) as exc:
        synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp", verify=False)
    assert str(exc.value) == (
        "listing every program means 106 programs of up to 5 steps here (more than 50; each also lowered for "
        "--json); list the best ones with --top K (found without listing the others), or lower --max-steps")
    assert synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp", top=3).placements[1].num_programs == 100


def test_lowering_that_would_not_fit_is_refused_before_building(monkeypatch):
    import synth.synthesis.lowering

    solution = synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp", top=1)
    best = solution.placements[1].programs[0]
    assert best.verification.proof.proved  # verified without lowering
    monkeypatch.setattr(synth.synthesis.lowering, "LOWERED_LIMIT_BYTES", 1000)
    with pytest.raises(SynthError) as exc:
        best.lowered
    assert str(exc.value).startswith(
        f"the lowered steps of {best.text.replace(chr(10), ' ; ')} on 64 devices would take about ")
    assert str(exc.value).endswith("the table (no --json or --out) lists and verifies programs without lowering them")


def test_max_steps_has_an_upper_bound():
    with pytest.raises(SynthError, match=r"--max-steps 11: must be 1\.\.10"):
        synth.solve("p2-a100", {"dp": 4, "mp": 16}, max_steps=11)


def test_each_program_is_proved_once_per_hierarchy_sizes(monkeypatch):
    """Placements with the same synthesis-hierarchy sizes share the z3 proof of
    a program; each placement's reduction group 0 is still checked numerically."""
    import synth.synthesis.verify

    synth.synthesis.verify.clear_cache()
    proved, checked = [], []
    real_prove, real_check = synth.synthesis.verify.prove, synth.synthesis.verify.check_runs
    monkeypatch.setattr(synth.synthesis.verify, "prove", lambda lowered: proved.append(lowered) or real_prove(lowered))
    monkeypatch.setattr(synth.synthesis.verify, "check_runs", lambda *a, **kw: checked.append(a) or real_check(*a, **kw))
    solution = synth.solve("p2-a100", {"a": 4, "b": 2, "c": 8}, reduce="a,c")
    listed = [(p.hierarchy.sizes, r.text, p.reduction.rank_to_synthesis_index)
              for p in solution.placements for r in p.programs]
    assert all(r.verification.proof.proved for p in solution.placements for r in p.programs)
    assert len(proved) == len({(sizes, text) for sizes, text, _ in listed}) < len(listed)
    assert len(checked) == len(set(listed))
    scope = solution.placements[0].programs[0].verification.proof.scope
    assert scope == "reduction group 0 of 2; the others run the same program (checked)"
    synth.synthesis.verify.clear_cache()


def test_the_cyclic_collector_is_paused_while_solving_and_restored(monkeypatch):
    """solve() pauses Python's cyclic garbage collector for its search, ranking
    and verification (synth.collector) and restores it as it was, also when
    the work fails; a caller's own pause is left alone."""
    import gc

    import synth.api as api
    from synth.collector import collector_paused

    during = []
    of = api.Ranking.of
    monkeypatch.setattr(api.Ranking, "of", lambda *a, **k: during.append(gc.isenabled()) or of(*a, **k))
    assert gc.isenabled()
    synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp")
    assert during and not any(during) and gc.isenabled()
    monkeypatch.setattr(api.Ranking, "of", lambda *a, **k: (_ for _ in ()).throw(SynthError("ranking failed")))
    with pytest.raises(SynthError, match="ranking failed"):
        synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp")
    assert gc.isenabled()
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause leaves it to the outer one
    assert gc.isenabled()


def test_the_program_freezes_what_survives_a_pause_and_a_library_call_does_not(monkeypatch):
    """A library call leaves the collector's generations alone; the
    synth-reduce program (synth.cli.console) asks that what survives an
    outermost pause be frozen (gc.freeze), except under ``launch``, which runs
    a training script in its process; an inner pause freezes nothing."""
    import gc

    import synth.cli as cli
    import synth.collector as collector

    monkeypatch.setattr(collector, "_freezing", False)
    gc.unfreeze()
    kept = []
    with collector.collector_paused():
        kept.append([object()])  # a tracked container built during the pause
    assert gc.get_freeze_count() == 0
    asked = []
    monkeypatch.setattr(cli, "main", lambda: asked.append(collector._freezing) or 0)
    monkeypatch.setattr(sys, "argv", ["synth-reduce", "launch", "job.json", "--", "train.py"])
    assert cli.console() == 0 and asked == [False]
    monkeypatch.setattr(sys, "argv", ["synth-reduce", "--topology", "p2-a100", "--axes", "dp=4"])
    assert cli.console() == 0 and asked == [False, True]
    try:
        with collector.collector_paused():
            with collector.collector_paused():
                kept.append([object()])
            assert gc.get_freeze_count() == 0  # the inner pause left it to the outer one
            kept.append([object()])
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        assert gc.is_tracked(kept[-1]) and not any(o is kept[-1] for o in gc.get_objects())  # frozen: not walked
    finally:
        gc.unfreeze()


def test_the_version_is_the_packages_and_plans_name_it(tmp_path, capsys):
    """One version (synth/version.py): the installed package's (pyproject),
    the facade's, ``--version``'s and a written plan's ``created_by``."""
    import re

    import synth.version
    from synth.cli import main

    declared = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert synth.__version__ == synth.version.__version__ == declared
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"synth-reduce {declared}\n"
    solution = synth.solve("testbed-2x4", {"dp": 8}, verify=False, top=1)
    synth.write_plan(tmp_path / "plan.json", solution.plan())
    assert json.loads((tmp_path / "plan.json").read_text())["created_by"] == f"synth-reduce {declared}"
