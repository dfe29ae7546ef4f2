"""DualPipe (``--schedule dualpipe``): each rank runs stages i and pp-1-i,
half the micro-batches from each end, so its pace is the mean of its two
stages'; bubble (pp/2 - 1)(F&B + B - 3W) and, per rank, both stages'
parameters and pp + 1 stage micro-batches of activations (DeepSeek-V3
report, Table 2; deepseek-ai/DualPipe). Every expected value is computed
here from the model's shape, not by the planner."""

from __future__ import annotations

import json

import pytest
from planner_cases import Recording, gpt

from synth.planner.schedules import Schedule
from synth.planner.stepmodel import Configuration, Training, configuration_problem, memory_per_device, step_shape, step_time

L, H, HEADS, S, V = 8, 64, 4, 32, 100


def _layer_flops(tokens: int) -> float:
    """One layer's training FLOPs (forward + 2x backward): its 12 h^2 GEMM
    weights and the attention core's 4 s h per token."""
    return 3 * (2 * tokens * 12 * H * H + 4 * tokens * S * H)


def _head_flops(tokens: int) -> float:
    return 3 * 2 * tokens * H * V


def test_bubble_is_table_2s_with_one_slot_as_the_overlapped_pair():
    """(pp/2 - 1)(F&B + B - 3W): F&B one slot (forward and backward with the
    exposed communication), B the backward's two thirds of it (no
    recomputation: the backward is twice the forward), W the weight-gradient
    GEMMs' share of the compute; the compute, tp and pp terms are 1F1B's on
    even stages."""
    model = gpt(L, H, HEADS, S, V)
    tp, dp, pp, b, B = 2, 2, 4, 2, 32  # 8 micro-batches (2 pp), 2 layers per stage
    training = Training(B, sequence_parallel=False)
    t_mb = 0.1
    config = Configuration(tp, dp, pp, b, schedule=Schedule.DUALPIPE)
    dual = step_time(model, training, config, Recording(), t_mb)
    plain = step_time(model, training, Configuration(tp, dp, pp, b), Recording(), t_mb)
    tp_mb = 2 * 4 * 1e-3 * (1 + b * S * H * 2 / 2**30)  # 2 layers x 2 all-reduces x 2 passes
    slot = t_mb + tp_mb + 2 * 2e-3
    T = b * S
    weight_flops = 2 * T * (L * 12 * H * H + H * V)
    total_flops = L * _layer_flops(T) + _head_flops(T)
    w_s = t_mb * weight_flops / total_flops
    assert dual.bubble_s == pytest.approx((pp // 2 - 1) * (slot + 2 / 3 * slot - 3 * w_s))
    assert dual.compute_s == plain.compute_s and dual.tp_s == plain.tp_s and dual.pp_s == plain.pp_s
    two = step_time(model, training, Configuration(tp, dp, 2, b, schedule=Schedule.DUALPIPE), Recording(), t_mb)
    assert two.bubble_s == 0.0  # pp = 2: pp/2 - 1 = 0 slots


@pytest.mark.parametrize("layout, slowest_rank", [
    ((1, 3, 3, 4), "middle"),  # unpaired the last stage (4 layers + head) is slowest; paired, the middle rank (3)
    ((3, 2, 2, 5), "first+last"),  # the first and last stages' mean, (3 + 5 + head) / 2, against 2
])
def test_pace_is_the_slowest_ranks_mean_of_its_two_stages(layout, slowest_rank):
    """On uneven stages each rank's micro-batch costs the mean of its two
    stages' (rank i runs stages i and pp-1-i, half the micro-batches each),
    where 1F1B and zero bubble wait for the slowest stage."""
    model = gpt(sum(layout), H, HEADS, S, V)
    tp, b = 2, 2
    T = b * S
    layer, head = _layer_flops(T), _head_flops(T)
    stages = [n * layer for n in layout]
    stages[-1] += head
    pairs = [(stages[i] + stages[-1 - i]) / 2 for i in range(len(layout) // 2)]
    assert pairs.index(max(pairs)) == (0 if slowest_rank == "first+last" else 1)
    dual = step_shape(model, Training(64), Configuration(tp, 2, 4, b, stage_layers=layout, schedule=Schedule.DUALPIPE))
    zb = step_shape(model, Training(64), Configuration(tp, 2, 4, b, stage_layers=layout, schedule=Schedule.ZERO_BUBBLE))
    assert dual.flops_per_micro_batch == pytest.approx(max(pairs) / tp)
    assert zb.flops_per_micro_batch == pytest.approx(max(stages) / tp)
    assert max(pairs) < max(stages)
    # the tp all-reduces: per micro-batch the slowest rank's mean layers, (n_i + n_(pp-1-i)) / 2
    blocks = max((layout[i] + layout[-1 - i]) / 2 for i in range(2))
    assert dual.layers_per_stage == pytest.approx(blocks)
    assert zb.layers_per_stage == max(layout)


def test_memory_holds_both_stages_and_pp_plus_one_micro_batches():
    """Rank 0 runs the first and the last stage: both stages' weights,
    gradients and optimizer states (Megatron-LM's 18 bytes per parameter) and
    activations of pp micro-batches of the first stage's layers and one of
    the last's (pp + 1 in all), with the last's logits."""
    model = gpt(L, H, HEADS, S, V)
    tp, dp, pp, b, B = 2, 2, 4, 2, 32
    training = Training(B, sequence_parallel=False)
    memory = memory_per_device(model, training, Configuration(tp, dp, pp, b, schedule=Schedule.DUALPIPE))
    layer_params = 12 * H * H + 13 * H
    first = 2 * layer_params + V * H + S * H  # its two layers, word and position embeddings
    last = 2 * layer_params + 2 * H + V * H  # its two layers, the final norm and the tied output layer's copy
    act = S * b * H * (10 + 24 / tp)  # one layer, one micro-batch (Korthikanti et al., no recomputation)
    logits = 4 * S * b * V / tp
    assert memory.stage == "first+last"
    assert memory.weights + memory.gradients + memory.optimizer == pytest.approx(18 * (first + last) / tp)
    assert memory.activations == pytest.approx((pp + 1) * 2 * act + logits)
    one = memory_per_device(model, training, Configuration(tp, dp, pp, b, schedule=Schedule.ZERO_BUBBLE))
    assert one.weights + one.gradients + one.optimizer == pytest.approx(18 * first / tp)
    assert one.activations == pytest.approx(pp * 2 * act)


def test_schedule_problems_follow_dualpipes_asserts():
    """dualpipe.py asserts an even number of ranks and an even number of
    micro-batches, at least twice the ranks."""
    model = gpt(L, H, HEADS, S, V)
    training = Training(32, sequence_parallel=False)

    def problem(pp, micro_batches, virtual_stages=1):
        config = Configuration(1, 1, pp, 1, schedule=Schedule.DUALPIPE, virtual_stages=virtual_stages)
        return configuration_problem(model, Training(micro_batches, sequence_parallel=False), config)

    assert problem(4, 8) is None
    assert problem(2, 4) is None
    assert problem(1, 8) == "the dualpipe schedule pairs stages i and pp-1-i on each rank: it needs an even pp >= 2, not pp=1"
    assert problem(8, 15) is not None and "odd" not in problem(8, 15)
    assert problem(4, 7) == ("the dualpipe schedule needs an even number of micro-batches per step, at least 2 x pp = 8 "
                             "(half enter from each end), not 7")
    assert problem(4, 6) == ("the dualpipe schedule needs an even number of micro-batches per step, at least 2 x pp = 8 "
                             "(half enter from each end), not 6")
    assert problem(4, 8, 2) == "the dualpipe schedule runs its two stages per device, no virtual stages (2 asked)"
    assert configuration_problem(gpt(9, H, HEADS, S, V), training,
                                 Configuration(1, 1, 3, 1, stage_layers=(3, 3, 3), schedule=Schedule.DUALPIPE)) == (
        "the dualpipe schedule pairs stages i and pp-1-i on each rank: it needs an even pp >= 2, not pp=3")


def _plan(cli, *words):
    code, out, err = cli("plan", "--topology", "dgx-h100", "--scale", "node=1", "--model",
                         f"layers={L},hidden={H},heads={HEADS},seq={S},vocab={V}", "--global-batch", "32",
                         "--axes", "tp=1,dp=2,pp=4", "--micro-batch", "1", "--no-verify", *words)
    return code, out, err


def test_cli_accepts_dualpipe_and_reports_it(cli):
    """``--schedule dualpipe`` plans with it and ``--json`` names it;
    ``--schedule search`` tries it only under a framework that runs it
    (DeepSeek's), so a Megatron-LM plan never picks it; too few
    micro-batches are refused with the reason."""
    code, out, err = _plan(cli, "--schedule", "dualpipe", "--json")
    assert code == 0, err
    configs = json.loads(out)["configurations"]
    assert configs and {c["schedule"] for c in configs} == {"dualpipe"}
    assert {c["virtual_stages"] for c in configs} == {1}
    code, out, err = _plan(cli, "--schedule", "search", "--json")
    assert code == 0, err
    assert "dualpipe" not in {c["schedule"] for c in json.loads(out)["configurations"]}
    code, out, err = _plan(cli, "--schedule", "dualpipe", "--global-batch", "6", "--json")
    assert "at least 2 x pp = 8" in out + err


def test_search_tries_dualpipe_only_where_its_framework_runs_it():
    """Of the frameworks modelled only DeepSeek's runs DualPipe; and only
    where its asserts hold (even pp, even micro-batches >= 2 pp)."""
    from synth.planner.schedules import wanted_schedules

    assert Schedule.DUALPIPE in wanted_schedules("search", "deepseek", 4, 8)
    for framework in ("megatron", "torchtitan", "eager"):
        assert Schedule.DUALPIPE not in wanted_schedules("search", framework, 4, 8)
    assert Schedule.DUALPIPE not in wanted_schedules("search", "deepseek", 4, 6)
    assert Schedule.DUALPIPE not in wanted_schedules("search", "deepseek", 3, 12)
    assert wanted_schedules("dualpipe", "megatron", 4, 8) == [Schedule.DUALPIPE]  # asked for: planned


def test_dualpipe_tries_every_split_of_the_first_and_last_stages():
    """The first and the last stage share a rank, so an uneven layout is
    tried with each split of their layers (one each at least, the leading
    dense layers the first stage holds kept there), the middle stages kept;
    an even split is --stages even's; one-stage-per-rank schedules keep the
    layout."""
    from synth.planner.schedules import schedule_layouts

    assert schedule_layouts(Schedule.DUALPIPE, (4, 4, 4, 1)) == [(4, 4, 4, 1), (1, 4, 4, 4), (2, 4, 4, 3),
                                                                 (3, 4, 4, 2)]
    assert schedule_layouts(Schedule.DUALPIPE, (3, 4, 4, 5)) == [(3, 4, 4, 5), (1, 4, 4, 7), (2, 4, 4, 6),
                                                                 (5, 4, 4, 3), (6, 4, 4, 2), (7, 4, 4, 1)]
    # an MoE model's 3 leading dense layers stay on the first stage (the middle stages stay alike)
    assert schedule_layouts(Schedule.DUALPIPE, (4, 4, 4, 1), 3) == [(4, 4, 4, 1), (3, 4, 4, 2)]
    assert schedule_layouts(Schedule.DUALPIPE, (2, 4, 4, 3), 3) == [(2, 4, 4, 3), (3, 4, 4, 2), (4, 4, 4, 1)]
    assert schedule_layouts(Schedule.DUALPIPE, ()) == [()]
    assert schedule_layouts(Schedule.ZERO_BUBBLE, (4, 4, 4, 1)) == [(4, 4, 4, 1)]

