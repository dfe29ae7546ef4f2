"""Exports (synth.export, ``synth-reduce export`` and ``launch``): the rank map
reproduces the plan's groups when a trainer forms its groups from rank order,
checked against megatron-core's own RankGenerator and against a plain
reference, on every placement (interleaved ones included); Megatron-LM,
torchtitan and JAX outputs; the renumbering under torchrun (gloo, 8 ranks)."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import usage_error
from processes import launch_output, launch_sections, run

import synth
from synth.errors import SynthError
from synth.export.jax_mesh import jax_export
from synth.export.megatron import megatron_export
from synth.export.rank_map import RankMap, check_rank_map, default_order, launch_environment, parse_order, rank_map
from synth.export.torchtitan import torchtitan_export
from synth.plan import Plan, load_plan
from synth.planner.modelspec import load_model
from synth.synthesis.language import parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.reduction import Reduction
from synth.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
TINY = "layers=4,hidden=256,heads=8,seq=128,vocab=1000"
DEVICE = "memory_GiB=16,peak_TFLOPs=1"

# (topology, scale, axes): every placement of each is checked
PROBLEMS = [("testbed-2x4", {}, "dp=4,mp=2"), ("testbed-2x4", {}, "tp=2,dp=4"),
            ("testbed-2x2x2", {}, "tp=2,dp=2,pp=2"), ("p2-a100", {}, "dp=4,mp=16"),
            ("dgx-a100", {"node": 4}, "tp=4,dp=4,pp=2"), ("rack", {}, "pp=2,tp=4,dp=8")]


def placements():
    for topology, scale, axes in PROBLEMS:
        topo = load_topology(topology).scaled(scale) if scale else load_topology(topology)
        for placement in enumerate_placements(topo, parse_axes(axes)):
            yield pytest.param(placement, id=f"{topology}-{axes}-{placement.describe()}")


def reference_groups(order, sizes, axis) -> list[tuple[int, ...]]:
    """Megatron's grouping written out plainly: rank r's coordinate on axis i
    is (r // prod(sizes[:i])) % sizes[i]; a group is the ranks agreeing on all
    other coordinates, increasing."""
    n = int(np.prod(sizes))
    strides = [int(np.prod(sizes[:i])) for i in range(len(sizes))]
    a = order.index(axis)
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(n):
        coords = tuple((r // strides[i]) % sizes[i] for i in range(len(sizes)))
        groups.setdefault(coords[:a] + coords[a + 1:], []).append(r)
    return sorted(tuple(g) for g in groups.values())


def plan_groups(placement, axis) -> list[tuple[int, ...]]:
    """The plan's groups of ``axis``: the reduction tables of synthesis, member
    order = reduction rank."""
    return sorted(tuple(int(d) for d in row) for row in Reduction.of(placement, (axis,)).reduction_groups)


@pytest.mark.parametrize("placement", list(placements()))
def test_rank_map_groups_are_the_plans_on_every_placement(placement):
    ranks = rank_map(placement)
    assert sorted(ranks.device_of_rank) == list(range(placement.topology.num_devices))
    for axis in ranks.order:
        want = plan_groups(placement, axis)
        got = sorted(tuple(ranks.device_of_rank[r] for r in g)
                     for g in reference_groups(ranks.order, ranks.sizes, axis))
        assert got == want, axis


def test_some_placements_need_renumbering_and_the_identity_is_recognised():
    """The README's interleaved placements are not the identity; a placement
    laid out in Megatron's own order is."""
    p2 = enumerate_placements(load_topology("p2-a100"), parse_axes("dp=4,mp=16"))
    assert [rank_map(p).is_identity for p in p2].count(False) >= 2
    rows = enumerate_placements(load_topology("testbed-2x2x2"), parse_axes("tp=2,dp=2,pp=2"))
    # pp outermost, then dp, tp innermost: Megatron's tp-cp-ep-dp-pp numbering is the device id
    identity = [p for p in rows if p.matrix == ((1, 1, 2), (1, 2, 1), (2, 1, 1))]
    assert identity and rank_map(identity[0]).is_identity




@pytest.fixture(scope="module")
def rank_generator():
    module = pytest.importorskip("megatron.core.parallel_state",
                                 reason="megatron-core is not installed: pip install '.[test]' installs it")
    return module.RankGenerator


@pytest.mark.parametrize("placement", [p for p in placements() if set(
    a.name for a in p.values[0].axes) <= {"tp", "dp", "pp"}] + ["job plan"])
def test_megatron_cores_own_groups_are_the_plans(rank_generator, placement, request):
    """megatron-core's RankGenerator, given the sizes and order of the export,
    forms exactly the plan's tp, dp and pp groups once ranks run on
    ``device_of_rank``: every placement plan of the problems, and a job plan."""
    if placement == "job plan":
        plan = load_plan(request.getfixturevalue("job_plan"))
        placement = plan.placement
    else:
        plan = Plan(placement, (_any_reduction(placement),))
    export = megatron_export(plan)
    ranks = export.ranks
    generator = rank_generator(tp=ranks.size("tp"), ep=1, dp=ranks.size("dp"), pp=ranks.size("pp"),
                               cp=ranks.size("cp"), order="tp-cp-ep-dp-pp")
    for axis in ("tp", "dp", "pp"):
        got = sorted(tuple(ranks.device_of_rank[r] for r in g) for g in generator.get_ranks(axis))
        if ranks.size(axis) == 1:
            assert all(len(g) == 1 for g in got)
        else:
            assert got == plan_groups(placement, axis), axis


def _any_reduction(placement):
    """A plan needs one proved reduction: the default all-reduce over the first axis."""
    from synth.synthesis.verify import verify_lowered

    reduction = Reduction.of(placement, (placement.axes[0].name,))
    lowered = lower(parse_program("AllReduce(root, inside)"), reduction)
    verify_lowered(lowered)
    return Plan.single(lowered, reduction).reductions[0]


def test_a_wrong_rank_map_is_refused():
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("dp=4,mp=2"))[0]
    good = rank_map(placement)
    swapped = list(good.device_of_rank)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    inverse = [0] * 8
    for r, d in enumerate(swapped):
        inverse[d] = r
    with pytest.raises(SynthError, match="the groups of axis .* are not the plan's"):
        check_rank_map(placement, RankMap(good.order, good.sizes, tuple(swapped), tuple(inverse)))
    with pytest.raises(SynthError, match="not the inverse"):
        check_rank_map(placement, RankMap(good.order, good.sizes, good.device_of_rank, tuple(range(8))[::-1]))


def test_orders():
    assert default_order(["pp", "dp", "tp"]) == ("tp", "dp", "pp")
    assert default_order(["dp", "mp"]) == ("mp", "dp")  # not Megatron's names: the plan's last axis fastest
    assert parse_order("dp-mp", ["dp", "mp"]) == ("dp", "mp")
    with pytest.raises(SynthError, match="--order dp: name every axis of the plan once"):
        parse_order("dp", ["dp", "mp"])
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("dp=4,mp=2"))[0]
    for order in itertools.permutations(["dp", "mp"]):
        ranks = rank_map(placement, order)  # checked inside; every order reproduces the groups
        assert ranks.order == order


# ---------------------------------------------------------------- launching


def test_launch_environment_renumbers_once():
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("tp=2,dp=4"))[0]
    ranks = rank_map(placement)
    assert not ranks.is_identity
    for device in range(8):
        env = {"RANK": str(device), "WORLD_SIZE": "8", "LOCAL_RANK": str(device % 4), "TORCHELASTIC_RUN_ID": "r1"}
        first = launch_environment(ranks, env)
        new = ranks.rank_of_device[device]
        assert first == {"RANK": str(new), "SYNTH_DEVICE": str(device), "SYNTH_RENUMBERED": f"r1:{device}:{new}"}
        assert launch_environment(ranks, {**env, **first}) == first  # a second call maps the same device
        # a marker inherited from another run is ignored: torchrun's RANK is the device
        stale = {**env, "SYNTH_RENUMBERED": f"r0:{(device + 1) % 8}:{device}"}
        assert launch_environment(ranks, stale) == first
    with pytest.raises(SynthError, match="the plan is for 8 ranks but WORLD_SIZE is 4; launch 8 processes"):
        launch_environment(ranks, {"RANK": "0", "WORLD_SIZE": "4"})
    with pytest.raises(SynthError, match="RANK, WORLD_SIZE not set: run under torchrun"):
        launch_environment(ranks, {})


def test_launch_rank_sets_the_rank_before_the_process_group(monkeypatch, tmp_path):
    torch_module = pytest.importorskip("synth.torch")
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("tp=2,dp=4"))[0]
    path = tmp_path / "plan.json"
    synth.write_plan(path, Plan(placement, (_any_reduction(placement),)))
    ranks = rank_map(placement)
    for name, value in (("RANK", "5"), ("WORLD_SIZE", "8"), ("SYNTH_DEVICE", ""), ("SYNTH_RENUMBERED", "")):
        monkeypatch.setenv(name, value)  # restored (or removed) after the test, whatever launch_rank sets
    assert torch_module.launch_rank(path) == ranks.rank_of_device[5]
    assert os.environ["RANK"] == str(ranks.rank_of_device[5]) and os.environ["SYNTH_DEVICE"] == "5"
    assert torch_module.launch_rank(path) == ranks.rank_of_device[5]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch of 8 gloo ranks through ``synth-reduce launch`` on an
    interleaved placement of tp=2,dp=4 (mesh [[0, 1, 4, 5], [2, 3, 6, 7]]:
    its rank map renumbers), running tests/launch_worker.py ``launched``:
    ``renumbered`` and (where installed) ``torchtitan`` on ``plan.json`` (the
    default all-reduce over tp), ``synth_launch`` on ``dp.json`` (a proved
    all-reduce over dp, same placement). ``(placement, sections, done)``,
    ``sections`` as :func:`processes.launch_sections` gives them."""
    pytest.importorskip("torch")
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("tp=2,dp=4"))[0]
    assert placement.matrix == ((1, 2), (2, 2)), placement.matrix
    directory = tmp_path_factory.mktemp("launched")
    synth.write_plan(directory / "plan.json", Plan(placement, (_any_reduction(placement),)))
    reduction = Reduction.of(placement, ("dp",))
    from synth.synthesis.verify import verify_lowered

    lowered = lower(parse_program("AllReduce(root, inside)"), reduction)
    verify_lowered(lowered)
    synth.write_plan(directory / "dp.json", Plan.single(lowered, reduction))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SYNTH_DEVICE", "SYNTH_RENUMBERED")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
                "-m", "synth.cli", "launch", str(directory / "plan.json"), "--", "tests/launch_worker.py", "launched",
                str(directory)], quiet_s=480, cwd=REPO, env=env)
    return placement, launch_sections(done.stdout), done


def launched_section(launched, name: str) -> str:
    """The output of section ``name`` of the ``launched`` launch, asserted to
    have run to exit code 0 (the launch's output as the message otherwise)."""
    _, sections, done = launched
    assert name in sections and sections[name][1] == 0, (name, launch_output(done))
    return sections[name][0]


@pytest.mark.torchrun
@pytest.mark.timeout(600)
def test_launch_under_torchrun_gives_megatrons_groups_the_plans_devices(launched):
    """8 gloo ranks launched through ``synth-reduce launch`` on an interleaved
    plan: megatron-core's groups (or the plain reference without it) summed
    over gloo hold exactly the plan's devices, in member order."""
    assert not rank_map(launched[0]).is_identity
    assert "renumbered: tp, dp groups are the plan's on 8 ranks" in launched_section(launched, "renumbered")


@pytest.mark.torchrun
@pytest.mark.timeout(600)
def test_synth_torch_under_launch_puts_every_axis_on_the_plans_devices(launched):
    """8 gloo ranks under ``synth-reduce launch`` on a plan whose rank map
    renumbers: synth.torch's meshes, executor and DDP hook work on the plan's
    devices (tests/launch_worker.py run_synth_under_launch), and the hook
    refuses a DDP on another group registered with the plan's group as state."""
    assert not rank_map(launched[0]).is_identity
    assert "under launch: device_mesh, trainer_mesh, executor, hook on the plan's devices" in launched_section(
        launched, "synth_launch")


def _torchtitan_job_plan(directory: Path) -> Path:
    """A ZeRO-3 job plan over tp, dp and pp (its groups: tp, pp, batch, dp_shard)."""
    from synth.cli import main

    job = directory / "job3.json"
    assert main(["plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "16", "--axes",
                 "tp=2,dp=2,pp=2", "--device", DEVICE, "--sharding", "zero3", "--out", str(job)]) == 0
    return job


@pytest.mark.torchrun
@pytest.mark.timeout(900)
def test_torchtitans_own_mesh_holds_the_plans_groups(tmp_path, request):
    """torchtitan's ParallelDims (installed by .ci/run's own step: its package
    pulls datasets, tensorboard and wandb, so it is not in the test extra),
    given the exported degrees and launched through ``synth-reduce launch``,
    forms the plan's groups on 8 gloo ranks, for a placement plan (an
    interleaved HSDP placement: dp over 2 nodes x 2 ranks; the ``launched``
    launch) and a job plan (a launch of its own)."""
    pytest.importorskip("torchtitan.distributed.parallel_dims",
                        reason="torchtitan is not installed (.ci/run installs it: see the README's test section)")
    launch = request.getfixturevalue("launched")
    assert not rank_map(launch[0]).is_identity
    hsdp = launched_section(launch, "torchtitan")
    assert "torchtitan: tp, batch, dp_shard, dp_replicate groups are the plan's" in hsdp, hsdp[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SYNTH_DEVICE", "SYNTH_RENUMBERED")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    path = _torchtitan_job_plan(tmp_path)
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
                "-m", "synth.cli", "launch", str(path), "--", "tests/launch_worker.py", "torchtitan", str(path)],
               quiet_s=180, cwd=REPO, env=env)
    assert done.returncode == 0, launch_output(done)
    assert "torchtitan: tp, pp, batch, dp_shard groups are the plan's" in done.stdout, done.stdout[-2000:]


# ---------------------------------------------------------------- formats and the command


@pytest.fixture(scope="module")
def job_plan(tmp_path_factory):
    from synth.cli import main

    path = tmp_path_factory.mktemp("job") / "job.json"
    code = main(["plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "16",
                 "--axes", "tp=2,dp=2,pp=2", "--device", DEVICE, "--sharding", "zero1", "--recompute", "selective",
                 "--out", str(path)])
    assert code == 0
    return path


def test_megatron_arguments_of_a_job_plan(job_plan):
    plan = load_plan(job_plan)
    args = list(megatron_export(plan).arguments)

    def value(flag):
        return args[args.index(flag) + 1]

    job = plan.job
    assert value("--tensor-model-parallel-size") == "2" and value("--pipeline-model-parallel-size") == "2"
    assert value("--micro-batch-size") == str(job["micro_batch"]) and value("--global-batch-size") == "16"
    assert value("--num-layers") == "4" and value("--hidden-size") == "256" and value("--num-attention-heads") == "8"
    assert value("--recompute-granularity") == "selective" and "--use-distributed-optimizer" in args
    assert value("--ddp-bucket-size") == str(job["bucket_bytes"] // 4)  # fp32 main gradients (bf16 training)
    assert "--bf16" in args and "--context-parallel-size" not in args
    assert job["sequence_parallel"] is True and "--sequence-parallel" in args  # the planner's default at tp 2


def test_megatron_builds_the_layer_the_planner_counted(job_plan):
    """A gated model is Llama's layer in the planner (RMSNorm, rotary
    positions, no biases: Transformer.layer_params, embedding_params), so
    Megatron-LM must be told all of it, not only --swiglu; a GPT model keeps
    Megatron-LM's defaults (LayerNorm, learned positions, biases)."""
    from dataclasses import replace

    plan = load_plan(job_plan)
    gpt = list(megatron_export(plan).arguments)
    assert not {"--swiglu", "--normalization", "--position-embedding-type", "--disable-bias-linear"} & set(gpt)
    architecture = ("mlp", "biases", "norm", "positions")
    older = {k: v for k, v in plan.job["model"].items() if k not in architecture}  # a plan from before the fields
    llama = load_model("layers=4,hidden=256,heads=8,kv_heads=4,ffn=688,mlp=swiglu,tied_embeddings=false,seq=128,"
                       "vocab=1000").to_dict()
    for llama_model in ({**older, "gated_mlp": True, "ffn": 688, "kv_heads": 4, "tied_embeddings": False}, llama):
        args = list(megatron_export(replace(plan, job={**plan.job, "model": llama_model})).arguments)
        assert "--swiglu" in args and "--disable-bias-linear" in args
        assert "--untie-embeddings-and-output-weights" in args
        assert args[args.index("--normalization") + 1] == "RMSNorm"
        assert args[args.index("--position-embedding-type") + 1] == "rope"
        assert args[args.index("--num-query-groups") + 1] == "4" and args[args.index("--ffn-hidden-size") + 1] == "688"
    nemotron = load_model("layers=4,hidden=256,heads=8,mlp=squared_relu,biases=false,positions=rotary,seq=128,"
                          "vocab=1000").to_dict()  # squared ReLU, LayerNorm, rotary, no biases
    args = list(megatron_export(replace(plan, job={**plan.job, "model": nemotron})).arguments)
    assert "--squared-relu" in args and "--swiglu" not in args and "--normalization" not in args
    assert "--disable-bias-linear" in args and args[args.index("--position-embedding-type") + 1] == "rope"
    relu = {**plan.job["model"], "mlp": "relu"}
    with pytest.raises(SynthError, match="Megatron-LM's arguments have no plain ReLU MLP"):
        megatron_export(replace(plan, job={**plan.job, "model": relu}))


def test_sequence_parallelism_in_the_trainer_exports(job_plan):
    """Megatron-LM gets --sequence-parallel exactly when the planned
    configuration runs it; torchtitan, whose tensor parallelism always splits
    the norms over the sequence, refuses a plan made without it; a plan
    written before the planner modelled it says nothing either way."""
    from dataclasses import replace

    plan = load_plan(job_plan)
    off = replace(plan, job={**plan.job, "sequence_parallel": False})
    assert "--sequence-parallel" not in megatron_export(off).arguments
    with pytest.raises(SynthError, match="torchtitan's tensor parallelism always splits the norms over the "
                                         "sequence .* plan again with --sequence-parallel on"):
        torchtitan_export(off)
    older = replace(plan, job={k: v for k, v in plan.job.items() if k != "sequence_parallel"})
    assert "--sequence-parallel" not in megatron_export(older).arguments
    assert torchtitan_export(older).parallelism["tensor_parallel_degree"] == 2
    with pytest.raises(SynthError, match="job.sequence_parallel must be true or false"):
        megatron_export(replace(plan, job={**plan.job, "sequence_parallel": "yes"}))


def test_torchtitan_degrees(job_plan, tmp_path):
    export = torchtitan_export(load_plan(job_plan))
    assert export.parallelism == {"data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1,
                                  "tensor_parallel_degree": 2, "context_parallel_degree": 1,
                                  "pipeline_parallel_degree": 2,  # ZeRO-1: replicated (torchtitan has no ZeRO-1)
                                  "pipeline_parallel_schedule": "1F1B"}
    assert export.activation_checkpoint == "selective"
    assert "[parallelism]\ndata_parallel_replicate_degree = 2\n" in export.toml()
    # a placement plan of dp over 2 nodes x 2 ranks: HSDP, shard inside the node
    placement = next(p for p in enumerate_placements(load_topology("testbed-2x4"), parse_axes("tp=2,dp=4"))
                     if p.matrix == ((1, 2), (2, 2)))
    hsdp = torchtitan_export(Plan(placement, (_any_reduction(placement),)))
    assert (hsdp.parallelism["data_parallel_replicate_degree"], hsdp.parallelism["data_parallel_shard_degree"]) \
        == (2, 2)


def test_the_torchtitan_check_refuses_a_mesh_that_is_not_the_plans():
    from synth.export.torchtitan import check_torchtitan_groups

    placement = next(p for p in enumerate_placements(load_topology("testbed-2x4"), parse_axes("tp=2,dp=4"))
                     if p.matrix == ((1, 2), (2, 2)))
    good = rank_map(placement)
    for shard in (1, 2, 4):
        check_torchtitan_groups(placement, good, shard)  # any split of dp: the same numbering
    swapped = list(good.device_of_rank)
    swapped[2], swapped[4] = swapped[4], swapped[2]
    with pytest.raises(SynthError, match="torchtitan's mesh under the rank map is not the plan's"):
        check_torchtitan_groups(placement, RankMap(good.order, good.sizes, tuple(swapped), good.rank_of_device), 2)


def test_jax_device_array_is_the_mesh():
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("dp=4,mp=2"))[0]
    plan = Plan(placement, (_any_reduction(placement),))
    flat, hier = jax_export(plan), jax_export(plan, hierarchical=True)
    assert flat.axis_names == ("dp", "mp") and np.array_equal(np.array(flat.device_ids), placement.mesh)
    assert np.array_equal(np.array(hier.device_ids).reshape(placement.mesh.shape), placement.mesh)


def test_export_command(cli, job_plan, tmp_path):
    code, out, err = cli("export", job_plan, "--format", "rank-map", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["format"] == "rank-map" and doc["order"] == ["tp", "dp", "pp"]
    assert doc["sizes"] == {"tp": 2, "dp": 2, "pp": 2} and sorted(doc["device_of_rank"]) == list(range(8))
    code, out, err = cli("export", job_plan, "--format", "megatron")
    assert code == 0 and "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" in out
    target = tmp_path / "titan.toml"
    code, out, err = cli("export", job_plan, "--format", "torchtitan", "--out", target)
    assert code == 0 and target.read_text().count("[parallelism]") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["titan.toml"]  # no temporary file left
    code, out, err = cli("export", job_plan, "--format", "jax", "--hierarchical", "--json")
    assert code == 0 and json.loads(out)["format"] == "jax"


def test_export_errors(cli, tmp_path):
    placement = enumerate_placements(load_topology("testbed-2x4"), parse_axes("dp=4,mp=2"))[0]
    path = tmp_path / "plan.json"
    synth.write_plan(path, Plan(placement, (_any_reduction(placement),)))
    assert usage_error(cli, "export", path, "--format", "megatron") == (
        "axis mp has no trainer name (trainers know tp, cp, ep, dp, pp); map it with --axis-names, "
        "e.g. --axis-names mp=tp")
    code, out, _ = cli("export", path, "--format", "megatron", "--axis-names", "mp=tp")
    assert code == 0 and "--tensor-model-parallel-size 2" in out
    assert usage_error(cli, "export", path, "--format", "jax", "--order", "dp-mp") == (
        "--order applies to --format rank-map only (see 'synth-reduce export --help')")
    assert usage_error(cli, "export", path, "--format", "megatron", "--axis-names", "mp=model").startswith(
        "--axis-names 'mp=model': expected PLAN_AXIS=TRAINER_AXIS")
    assert usage_error(cli, "export", path, "--format", "rank-map", "--out", tmp_path / "no" / "x.txt") == (
        f"--out {tmp_path / 'no' / 'x.txt'}: the folder {tmp_path / 'no'} does not exist; create it or write "
        "elsewhere")
    assert usage_error(cli, "launch", path) == (
        "give the script after --, e.g. synth-reduce launch plan.json -- train.py --steps 10 "
        "(see 'synth-reduce launch --help')")


def test_uneven_stages_in_the_trainer_exports(job_plan):
    """A plan with uneven stages gives Megatron-LM its first and last stage's
    layers; torchtitan is refused; a layout Megatron-LM cannot run (unequal
    middle stages) or one that does not hold the model's layers is refused."""
    from dataclasses import replace

    plan = load_plan(job_plan)  # 4 layers, pp = 2
    uneven = replace(plan, job={**plan.job, "stage_layers": [1, 3]})
    args = list(megatron_export(uneven).arguments)
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "1"
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "3"
    assert "--decoder-first-pipeline-num-layers" not in megatron_export(plan).arguments  # [2, 2]: even
    with pytest.raises(SynthError, match=r"pipeline stages are uneven \(\[1, 3\] layers\)"):
        torchtitan_export(uneven)
    with pytest.raises(SynthError, match="job.stage_layers must list each pipeline stage's layers"):
        megatron_export(replace(plan, job={**plan.job, "stage_layers": [1, 2]}))
    with pytest.raises(SynthError, match="Megatron-LM runs uneven stages as a first and a last stage of their own"):
        megatron_export(replace(plan, job={**plan.job, "stage_layers": [1, 1, 2]}))


def test_schedules_and_zero2_in_the_trainer_exports(job_plan):
    """The planned pipeline schedule reaches both trainers where they run it:
    Megatron-LM's interleaving by layers per virtual stage, torchtitan's by
    name (2 virtual stages, its default); zero-bubble and DualPipe plans are
    refused by both with the reason, ZeRO-2 by Megatron-LM, ZeRO-2 is torchtitan's FSDP that
    never reshards after the forward; an older plan's "1F1B" reads as 1f1b."""
    from dataclasses import replace

    plan = load_plan(job_plan)  # 4 layers, pp = 2
    assert plan.job["schedule"] == "1f1b" and plan.job["virtual_stages"] == 1
    interleaved = replace(plan, job={**plan.job, "schedule": "interleaved", "virtual_stages": 2})
    args = list(megatron_export(interleaved).arguments)
    assert args[args.index("--num-layers-per-virtual-pipeline-stage") + 1] == "1"
    assert torchtitan_export(interleaved).parallelism["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert 'pipeline_parallel_schedule = "Interleaved1F1B"' in torchtitan_export(interleaved).toml()
    with pytest.raises(SynthError, match="torchtitan's Interleaved1F1B is exported with its default of 2"):
        torchtitan_export(replace(plan, job={**plan.job, "schedule": "interleaved", "virtual_stages": 4}))
    with pytest.raises(SynthError, match="job.schedule 1f1b with job.virtual_stages 2"):
        megatron_export(replace(plan, job={**plan.job, "schedule": "1f1b", "virtual_stages": 2}))
    older = replace(plan, job={**plan.job, "schedule": "interleaved 1F1B, 2 stages", "virtual_stages": 2})
    assert "--num-layers-per-virtual-pipeline-stage" in megatron_export(older).arguments
    zero_bubble = replace(plan, job={**plan.job, "schedule": "zero-bubble"})
    with pytest.raises(SynthError, match="Megatron-LM has no zero-bubble schedule"):
        megatron_export(zero_bubble)
    with pytest.raises(SynthError, match="run 2 stages per rank, not the one-stage ZB-H1"):
        torchtitan_export(zero_bubble)
    dualpipe = replace(plan, job={**plan.job, "schedule": "dualpipe"})
    with pytest.raises(SynthError, match="Megatron-LM \\(core 0.16\\) has no DualPipe schedule"):
        megatron_export(dualpipe)
    with pytest.raises(SynthError, match="torchtitan runs DualPipeV .* not the DualPipe the plan was priced with"):
        torchtitan_export(dualpipe)
    zero2 = replace(plan, job={**plan.job, "training": {**plan.job["training"], "sharding": "zero2"}})
    with pytest.raises(SynthError, match="Megatron-LM has no ZeRO-2"):
        megatron_export(zero2)
    titan = torchtitan_export(zero2)
    assert titan.parallelism["fsdp_reshard_after_forward"] == "never"
    assert titan.parallelism["data_parallel_shard_degree"] == 2  # dp = 2 inside a node: sharded there


def test_tp_overlap_in_the_trainer_exports(job_plan, cli):
    """A plan made with --tp-overlap says so per configuration and in its job;
    Megatron-LM gets --tp-comm-overlap beside --sequence-parallel, torchtitan
    its async tensor parallelism (a switch on the command line)."""
    from dataclasses import replace

    plan = load_plan(job_plan)
    assert plan.job["training"]["tp_overlap"] is False
    assert "--tp-comm-overlap" not in megatron_export(plan).arguments
    assert "enable_async_tensor_parallel" not in torchtitan_export(plan).parallelism
    on = replace(plan, job={**plan.job, "training": {**plan.job["training"], "tp_overlap": True}})
    args = list(megatron_export(on).arguments)
    assert args.index("--tp-comm-overlap") == args.index("--sequence-parallel") + 1
    titan = torchtitan_export(on)
    assert "enable_async_tensor_parallel = true" in titan.toml()
    overrides = titan.overrides()
    i = overrides.index("--compile.enable_async_tensor_parallel")  # torchtitan 0.3: async TP runs compiled
    assert overrides[i - 1] == "--compile.enable" and overrides[i + 1].startswith(("--", "activation-checkpoint:"))
    code, out, _ = cli("plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "16", "--axes",
                       "tp=2,dp=2,pp=2", "--device", DEVICE, "--tp-overlap", "--json", "--no-verify")
    doc = json.loads(out)
    assert code == 0 and doc["training"]["tp_overlap"] is True
    assert {c["tp_overlap"] for c in doc["configurations"]} == {True}
    assert "--tp-overlap needs --sequence-parallel on" in usage_error(
        cli, "plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "16", "--device", DEVICE,
        "--tp-overlap", "--sequence-parallel", "off")


def test_overlap_param_gather_in_the_megatron_export(job_plan):
    """A plan made with --overlap-param-gather (ZeRO-1) exports Megatron-LM's
    --overlap-param-gather beside the distributed optimizer and
    --overlap-grad-reduce, which its validate_args asks for
    (arguments.py:1024-1029); without the DP overlap it is refused."""
    from dataclasses import replace

    import megatron_args

    plan = load_plan(job_plan)
    assert "--overlap-param-gather" not in megatron_export(plan).arguments
    on = replace(plan, job={**plan.job, "training": {**plan.job["training"], "overlap_param_gather": True}})
    export = megatron_export(on)
    args = list(export.arguments)
    assert {"--overlap-param-gather", "--overlap-grad-reduce", "--use-distributed-optimizer"} <= set(args)
    megatron_args.validate(megatron_args.parse(args), len(export.ranks.device_of_rank))
    without = [a for a in args if a != "--overlap-grad-reduce"]
    with pytest.raises(AssertionError, match="arguments.py:1028"):
        megatron_args.validate(megatron_args.parse(without), len(export.ranks.device_of_rank))
    off = replace(on, job={**on.job, "training": {**on.job["training"], "overlap_dp": False}})
    with pytest.raises(SynthError, match="--overlap-param-gather needs Megatron-LM's distributed optimizer"):
        megatron_export(off)


def test_cp_comm_in_the_trainer_exports(tmp_path):
    """A plan priced with Llama 3's all-gather context parallelism (--cp-comm
    allgather) exports Megatron-LM's --cp-comm-type all_gather, Transformer
    Engine's spelling, which the transcribed rules accept and whose help-text
    spelling "allgather" Transformer Engine refuses; a ring plan keeps
    Megatron-LM's default p2p (nothing written). torchtitan 0.3 has no choice
    and all-gathers: its export says so for a ring plan only."""
    from dataclasses import replace

    import megatron_args

    from synth.cli import main

    exports = {}
    for comm in ("ring", "allgather"):
        path = tmp_path / f"{comm}.json"
        assert main(["plan", "--topology", "testbed-2x4", "--model", TINY, "--global-batch", "16", "--axes",
                     "tp=2,cp=2,dp=2", "--device", DEVICE, "--cp-comm", comm, "--no-verify", "--out", str(path)]) == 0
        plan = load_plan(path)
        assert plan.job["training"]["cp_comm"] == comm
        exports[comm] = (megatron_export(plan), torchtitan_export(plan))
    ring, gathered = (list(exports[c][0].arguments) for c in ("ring", "allgather"))
    assert "--cp-comm-type" not in ring
    assert gathered[gathered.index("--cp-comm-type") + 1] == "all_gather" and gathered.count("--cp-comm-type") == 1
    for args in (ring, gathered):
        parsed = megatron_args.parse(args)
        megatron_args.validate(parsed, 8)
        megatron_args.core_checks(parsed, 8)
    with pytest.raises(AssertionError, match="Transformer Engine takes p2p, all_gather"):
        megatron_args.validate(megatron_args.parse(ring + ["--cp-comm-type", "allgather"]), 8)
    assert [n for n in exports["ring"][1].notes() if n.startswith("cp:")] == [
        "cp: torchtitan 0.3 all-gathers each layer's keys and values over the cp group, and this plan priced a ring "
        "exchange; plan with --cp-comm allgather to price what torchtitan runs"]
    assert exports["allgather"][1].notes() == []
    plan = load_plan(tmp_path / "allgather.json")
    bad = replace(plan, job={**plan.job, "training": {**plan.job["training"], "cp_comm": "all_gather"}})
    with pytest.raises(SynthError, match="job.training.cp_comm must be one of ring, allgather, not 'all_gather'"):
        megatron_export(bad)


def test_the_megatron_export_runs_the_loss_and_dropout_the_plan_priced(job_plan):
    """Megatron-LM's defaults are the unfused loss and dropouts of 0.1
    (model_parallel_config.py:320, transformer_config.py:188, 191): the
    export asks for the fused loss where the plan priced it, and sets the
    dropouts to the model's ``dropout`` and ``attention_dropout`` (each 0
    unless its file says), so the run
    is the one the plan priced; the transcribed parser and megatron-core's
    TransformerConfig take them."""
    from dataclasses import replace

    import megatron_args

    plan = load_plan(job_plan)
    args = list(megatron_export(plan).arguments)
    assert plan.job["training"]["cross_entropy"] == "fused" and "--cross-entropy-loss-fusion" in args
    assert args[args.index("--hidden-dropout") + 1] == "0" and args[args.index("--attention-dropout") + 1] == "0"
    parsed = megatron_args.parse(args)
    assert parsed.cross_entropy_loss_fusion and parsed.hidden_dropout == 0.0 and parsed.attention_dropout == 0.0
    megatron_args.core_checks(parsed, len(megatron_export(plan).ranks.device_of_rank))
    unfused = replace(plan, job={**plan.job, "model": {**plan.job["model"], "dropout": 0.1},
                                 "training": {**plan.job["training"], "cross_entropy": "megatron"}})
    args = list(megatron_export(unfused).arguments)
    assert "--cross-entropy-loss-fusion" not in args
    assert args[args.index("--hidden-dropout") + 1] == "0.1" and args[args.index("--attention-dropout") + 1] == "0"
    assert megatron_args.parse(args).hidden_dropout == 0.1
    both = replace(unfused, job={**unfused.job, "model": {**unfused.job["model"], "attention_dropout": 0.05}})
    parsed = megatron_args.parse(list(megatron_export(both).arguments))
    assert parsed.hidden_dropout == 0.1 and parsed.attention_dropout == 0.05


def test_fp8_in_the_trainer_exports(job_plan):
    """A plan made with --dtype fp8 is BF16 training with FP8 GEMMs: Megatron-LM
    gets --bf16 --fp8-format hybrid, torchtitan its float8 model converter."""
    from dataclasses import replace

    plan = load_plan(job_plan)
    fp8 = replace(plan, job={**plan.job, "training": {**plan.job["training"], "dtype": "fp8"}})
    args = list(megatron_export(fp8).arguments)
    assert "--bf16" in args and args[args.index("--fp8-format") + 1] == "hybrid"
    assert args[args.index("--ddp-bucket-size") + 1] == str(plan.job["bucket_bytes"] // 4)  # fp32 main gradients
    fp16 = replace(plan, job={**plan.job, "training": {**plan.job["training"], "dtype": "fp16"}})
    args = list(megatron_export(fp16).arguments)  # Megatron-LM reduces fp16 gradients in fp16
    assert args[args.index("--ddp-bucket-size") + 1] == str(plan.job["bucket_bytes"] // 2)
    titan = torchtitan_export(fp8)
    assert titan.converters == ("float8",) and '[model]\nconverters = ["float8"]' in titan.toml()
    assert not any("converters" in a for a in titan.overrides())  # 0.3: part of the model's config, not a flag
    assert "float8 converter" in titan.notes()[0]
    assert torchtitan_export(plan).converters == () and "--fp8-format" not in megatron_export(plan).arguments
