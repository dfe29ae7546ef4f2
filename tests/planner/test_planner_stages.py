"""Pipeline stage layouts: the balanced layout against an every-split
reference and Meta's published layout, uneven stage memory and compute, and
``plan --stages``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import usage_error
from planner_cases import TINY, gpt

from synth.errors import SynthError
from synth.planner.activations import Recompute
from synth.planner.stages import StageCosts, balanced_layers, describe_layers, slowest_stage
from synth.planner.stepmodel import Configuration, Training, compute_estimate, configuration_problem, memory_per_device
from synth.topology import load_topology


# ================================================================ pipeline stages


def _restricted_optimum(layers, pp, costs):
    """Brute force over every (first, middle, last) split with equal middles."""
    best = None
    for first in range(1, layers):
        for last in range(1, layers - first + 1):
            rest = layers - first - last
            if pp == 2 and rest:
                continue
            if pp > 2 and (rest < pp - 2 or rest % (pp - 2)):
                continue
            layout = (first,) + (rest // (pp - 2),) * (pp - 2) + (last,) if pp > 2 else (first, last)
            cost = slowest_stage(layout, costs)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("layers, pp", [(12, 2), (13, 3), (30, 4), (31, 5), (126, 16)])
@pytest.mark.parametrize("first, last", [(0.0, 0.0), (1.0, 1.0), (0.3, 2.5)])
def test_balanced_stages_are_optimal_among_first_middle_last_layouts(layers, pp, first, last):
    costs = StageCosts(1.0, first, last)
    layout = balanced_layers(layers, pp, costs)
    assert len(layout) == pp and sum(layout) == layers and min(layout) >= 1
    assert len(set(layout[1:-1])) <= 1
    assert slowest_stage(layout, costs) == pytest.approx(_restricted_optimum(layers, pp, costs))
    if first == last == 0.0 and layers % pp == 0:
        assert layout == (layers // pp,) * pp


def _every_split_layout(layers, pp, costs):
    """Reference for balanced_layers: every (middle, first) split tried, the
    least (slowest stage, spread of the counts, first count) kept."""
    best = None
    for middle in ([0] if pp == 2 else range(1, (layers - 2) // (pp - 2) + 1)):
        rest = layers - (pp - 2) * middle
        for first in range(1, rest):
            layout = (first,) + (middle,) * (pp - 2) + (rest - first,)
            counts = (first, rest - first, middle) if pp > 2 else (first, rest - first)
            key = (slowest_stage(layout, costs), max(counts) - min(counts), first)
            best = min(best, (key, layout)) if best else (key, layout)
    return best[1]


def test_balanced_stages_equal_the_every_split_reference():
    """The bisection over first-stage counts picks the layout the full scan
    picks, ties included (whole and decimal costs make many ties)."""
    rng = np.random.default_rng(11)
    for _ in range(400):
        layers = int(rng.integers(2, 90))
        pp = int(rng.integers(2, min(layers, 24) + 1))
        if rng.random() < 0.5:
            costs = StageCosts(*(round(float(x), 1) for x in rng.uniform([0.1, 0, 0], [3, 6, 6])))
        else:
            costs = StageCosts(*(float(x) for x in rng.uniform([1e-4, 0, 0], [1e-2, 0.05, 0.05])))
        assert balanced_layers(layers, pp, costs) == _every_split_layout(layers, pp, costs), (layers, pp, costs)


def test_llama3_405b_stages_are_metas():
    """126 layers on 16 stages with the embedding and the output layer about
    one layer each: one layer fewer on the first and the last stage, as Llama
    3 405B trained (arXiv:2407.21783, Section 3.3.2)."""
    layout = balanced_layers(126, 16, StageCosts(1.0, 1.0, 1.0))
    assert layout == (7,) + (8,) * 14 + (7,)
    assert describe_layers(layout) == "7,8x14,7" and describe_layers((3, 4)) == "3,4"
    with pytest.raises(SynthError, match="pp=8: 5 layers cannot give every pipeline stage at least one layer"):
        balanced_layers(5, 8, StageCosts(1.0, 0.0, 0.0))


def test_uneven_stage_memory_and_compute_by_hand():
    """Layers 3, 5, 5, 3 on pp = 4 (m = 4 micro-batches): the second stage
    holds 5 layers x 3 micro-batches in flight, more than the first's 3 x 4;
    the slowest stage by the per-operation model is the largest of first
    (3 layers + embedding), middle (5) and last (3 + output layer)."""
    from test_compute import known_profile
    from test_unfused_attention import kernels_by_hand

    from synth.planner.optimes import Shard
    from synth.planner.stagecompute import stage_compute
    L, h, a, s, V = 16, 64, 4, 32, 128
    m = gpt(L, h, a, s, V)
    config = Configuration(1, 1, 4, 1, stage_layers=(3, 5, 5, 3))
    training = Training(4, attention="unfused")
    assert configuration_problem(m, training, config) is None
    act = s * 1 * h * (10 + 24 + 5 * a * s / h)
    layer = 12 * h * h + 13 * h
    memory = memory_per_device(m, training, config)
    middle = 18 * 5 * layer + 5 * 3 * act  # Megatron-LM: bf16 weights, fp32 gradients, Adam: 18 bytes
    first = 18 * (3 * layer + V * h + s * h) + 3 * 4 * act
    last = 18 * (3 * layer + 2 * h + V * h) + 3 * act + 4 * s * V
    assert memory.total == pytest.approx(max(first, middle, last))
    assert memory.stage == {first: "first", middle: "middle", last: "last"}[max(first, middle, last)]
    p = known_profile()
    estimate = compute_estimate(m, training, config, load_topology("dgx-a100").device, p)
    shard = Shard(1, 1, s)
    # the unfused attention's four softmax and dropout kernels per layer, at the elementwise rate
    add = p.elementwise.of("add")
    scores = sum(max(add.floor_s, k / p.elementwise.bandwidth_Bps) for k in kernels_by_hand(1, a, s))
    want = max(stage_compute(p, m, shard, 3, Recompute.NONE, True, False).total_s + 3 * scores,
               stage_compute(p, m, shard, 5, Recompute.NONE, False, False).total_s + 5 * scores,
               stage_compute(p, m, shard, 3, Recompute.NONE, False, True).total_s + 3 * scores)
    assert estimate.micro_batch_s == pytest.approx(want, rel=1e-12)
    assert configuration_problem(m, training, Configuration(1, 1, 4, 1, stage_layers=(3, 5, 5, 4))) == (
        "stages 3,5x2,4: 4 stages of at least one layer each must hold the model's 16 layers")
    assert configuration_problem(m, training, Configuration(1, 1, 4, 1, 2, stage_layers=(3, 5, 5, 3))) is None
    assert configuration_problem(m, training, Configuration(1, 1, 4, 1, 4, stage_layers=(3, 5, 5, 3))) == (
        "4 virtual stages are more than the 3 layers of the smallest stage (every virtual stage holds a layer)")
    assert configuration_problem(m, training, Configuration(1, 1, 4, 1, stage_layers=(3, 6, 4, 3))) == (
        "stages 3,6,4,3: the stages between the first and the last must hold equal layers (the form modelled, "
        "Megatron-LM's)")


def test_plan_stages_option(cli):
    """pp = 3 does not divide 4 layers: even skips it, uneven plans it with
    its stages in the table and --json, search keeps the faster layout."""
    common = ["plan", "--topology", "dgx-a100", "--scale", "node=1,gpu=6", "--model", TINY, "--global-batch", "6",
              "--axes", "tp=2,dp=1,pp=3", "--no-verify"]
    assert "pp=3 does not divide the model's layers (4)" in usage_error(cli, *common)
    code, text, _ = cli(*common, "--stages", "uneven")
    assert code == 0 and "(layers per stage " in text
    doc = json.loads(cli(*common, "--stages", "uneven", "--json")[1])
    layouts = {tuple(c["stage_layers"]) for c in doc["configurations"]}
    assert all(len(x) == 3 and sum(x) == 4 for x in layouts)
    assert {c["stages"] for c in doc["configurations"]} == {"uneven"}
    search = ["plan", "--topology", "dgx-a100", "--scale", "node=1,gpu=4", "--model", TINY, "--global-batch", "8",
              "--axes", "tp=2,dp=1,pp=2", "--no-verify", "--json", "--stages"]
    even, both = (json.loads(cli(*search, choice)[1]) for choice in ("even", "search"))
    assert {tuple(c["stage_layers"]) for c in even["configurations"]} == {(2, 2)}
    assert {c["stages"] for c in even["configurations"]} == {"even"}
    for c in both["configurations"]:  # never slower than the even layout of the same sizes and micro-batch
        same = next(e for e in even["configurations"] if e["micro_batch"] == c["micro_batch"])
        assert sum(c["stage_layers"]) == 4 and c["predicted_step_s"] <= same["predicted_step_s"]
    assert "argument --stages: invalid choice: 'odd'" in usage_error(cli, *common, "--stages", "odd")
