"""The planner's step model against the step computed here by hand: the
bubble and the bytes of each collective, recomputation, sequence and context
parallelism, ZeRO stages, overlap, schedules, expert parallelism, HSDP."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import yaml
from planner_cases import MOE, Recording, gpt

from synth.errors import SynthError
from synth.planner.activations import Recompute
from synth.planner.compute import DEFAULT_COMPUTE
from synth.planner.configurations import plan_job
from synth.planner.curvepasses import curve_pass_s
from synth.planner.modelspec import load_model, parse_inline_model
from synth.planner.schedules import Schedule, in_flight_micro_batches
from synth.planner.stepmodel import (
    BUCKET_GRID_BYTES,
    Configuration,
    Sharding,
    Training,
    compute_estimate,
    configuration_problem,
    memory_per_device,
    overlapped_s,
    step_shape,
    step_time,
)
from synth.synthesis.placement import enumerate_placements, parse_axes, parse_axis_ranges
from synth.synthesis.semantics import Goal
from synth.topology import load_topology


def test_bubble_and_the_bytes_of_each_collective_by_hand():
    L, h, s, V = 8, 64, 32, 100
    m = gpt(L, h, 4, s, V)
    tp, dp, pp, b, B = 2, 2, 4, 2, 32  # 8 micro-batches, 2 layers per stage
    training = Training(B, sequence_parallel=False)
    config = Configuration(tp, dp, pp, b)
    rec = Recording()
    t_mb = 0.5
    step = step_time(m, training, config, rec, t_mb)
    act = b * s * h * 2  # bf16
    tp_call = 1e-3 * (1 + act / 2**30)
    assert ("reduce", "tp", Goal.ALLREDUCE, act) in rec.calls
    assert ("send", "pp", act // tp) in rec.calls
    tp_mb = 2 * 4 * tp_call  # 2 layers per stage x 4 all-reduces (2 forward, 2 backward)
    pp_mb = 2 * 2e-3  # activations forward, gradients backward
    assert step.compute_s == pytest.approx(8 * t_mb)
    assert step.tp_s == pytest.approx(8 * tp_mb)
    assert step.pp_s == pytest.approx(8 * pp_mb)
    assert step.bubble_s == pytest.approx((pp - 1) * (t_mb + tp_mb + pp_mb))
    # DP: the largest stage's gradients in bf16, in buckets of a grid size not above them
    layer = 12 * h * h + 13 * h
    grads = math.ceil(max(2 * layer + V * h + s * h, 2 * layer + 2 * h + V * h) / tp) * 2
    dp_sizes = {c[3] for c in rec.calls if c[1] == "dp"}
    assert dp_sizes == {BUCKET_GRID_BYTES[0]} and grads < BUCKET_GRID_BYTES[0]  # one padded bucket
    backward = t_mb * 2 / 3
    assert step.dp_s == pytest.approx(overlapped_s(1, 1e-3 * (1 + 2**20 / 2**30), backward))
    assert step.total_s == pytest.approx(step.compute_s + step.bubble_s + step.tp_s + step.pp_s + step.dp_s)
    # interleaving divides the bubble and multiplies the sends
    inter = step_time(m, training, Configuration(tp, dp, pp, b, virtual_stages=2), Recording(), t_mb)
    assert inter.bubble_s == pytest.approx((pp - 1) / 2 * (t_mb + tp_mb + 2 * pp_mb))
    assert inter.pp_s == pytest.approx(8 * 2 * pp_mb)


@pytest.mark.parametrize("sp", [False, True])
def test_full_recomputation_adds_two_tp_all_reduces_per_layer(sp):
    m = gpt(8, 64, 4, 32, 100)
    config = Configuration(2, 1, 1, 1)
    none = step_time(m, Training(4, sequence_parallel=sp), config, Recording(), 1.0)
    full = step_time(m, Training(4, recompute=Recompute.FULL, sequence_parallel=sp), config, Recording(), 1.0)
    assert full.tp_s == pytest.approx(none.tp_s * 6 / 4)


class ByGoal(Recording):
    """A different cost per goal, so that a swapped collective shows."""

    COSTS = {Goal.ALLREDUCE: 4e-3, Goal.ALLGATHER: 1e-3, Goal.REDUCESCATTER: 2e-3}

    def reduce(self, axis, goal, size_bytes):
        super().reduce(axis, goal, size_bytes)
        return self.COSTS[goal]


def test_sequence_parallelism_turns_each_tp_all_reduce_into_an_all_gather_and_a_reduce_scatter():
    """Korthikanti et al. 2022, Fig. 5: per layer forward two all-gathers and
    two reduce-scatters of b s h values where there were two all-reduces,
    the same backward; nothing changes at tp = 1."""
    L, h, s, b = 8, 64, 32, 2
    m = gpt(L, h, 4, s, 100)
    config = Configuration(2, 1, 2, b)  # 4 layers per stage
    act = b * s * h * 2
    rec = ByGoal()
    sp = step_time(m, Training(8), config, rec, 1.0)
    tp_calls = {(c[2], c[3]) for c in rec.calls if c[1] == "tp"}
    assert tp_calls == {(Goal.ALLGATHER, act), (Goal.REDUCESCATTER, act)}
    assert sp.tp_s == pytest.approx(4 * 4 * 4 * (1e-3 + 2e-3))  # 4 micro-batches x 4 layers x 4 pairs
    assert [r for r in sp.reductions if r[0] == "tp"] == [("tp", Goal.ALLGATHER, act),
                                                          ("tp", Goal.REDUCESCATTER, act)]
    plain = step_time(m, Training(8, sequence_parallel=False), config, ByGoal(), 1.0)
    assert plain.tp_s == pytest.approx(4 * 4 * 4 * 4e-3)
    one = step_time(m, Training(8), Configuration(1, 1, 2, b), ByGoal(), 1.0)
    assert one.tp_s == 0 and not any(r[0] == "tp" for r in one.reductions)


def test_zero_sizes():
    L, h = 4, 64
    m = gpt(L, h, 4, 32, 100)
    layer_bytes = math.ceil((12 * h * h + 13 * h) / 2) * 2
    rec = Recording()
    step_time(m, Training(8, sharding=Sharding.ZERO3), Configuration(2, 2, 1, 1), rec, 1.0)
    assert {(c[2], c[3]) for c in rec.calls if c[1] == "dp"} == {(Goal.ALLGATHER, layer_bytes),
                                                                  (Goal.REDUCESCATTER, layer_bytes)}
    rec = Recording()
    step_time(m, Training(8, sharding=Sharding.ZERO1), Configuration(2, 2, 1, 1), rec, 1.0)
    assert {c[2] for c in rec.calls if c[1] == "dp"} == {Goal.REDUCESCATTER, Goal.ALLGATHER}


@pytest.mark.parametrize("count, each, window", [(1, 1.0, 5.0), (4, 1.0, 10.0), (4, 1.0, 2.0), (10, 0.3, 2.0),
                                                 (7, 2.0, 0.0)])
def test_overlap_against_a_simulation(count, each, window):
    end = 0.0
    for i in range(count):  # transfer i is ready when the compute has produced its share
        end = max(end, (i + 1) * window / count) + each
    assert overlapped_s(count, each, window) == pytest.approx(max(0.0, end - window))


# ================================================================ schedules, ZeRO-2, recomputation search


def test_in_flight_micro_batches_are_megatrons_warm_up_and_korthikantis_factor():
    """1F1B: stage i holds min(p - i, m); interleaved: Megatron-LM's warm-up
    2 (p - i - 1) + (v - 1) p chunks plus the one in its steady state, over v;
    on the first stage that is Korthikanti et al.'s p (1 + (p - 1) / (p v))."""
    for p, v, m in itertools.product((2, 4, 8), (2, 3, 4), (8, 16, 64)):
        first = in_flight_micro_batches(Schedule.INTERLEAVED, p, 0, m, v)
        assert first == pytest.approx(min(p * (1 + (p - 1) / (p * v)), m))
        for i in range(p):
            assert in_flight_micro_batches(Schedule.ONE_F_ONE_B, p, i, m, 1) == min(p - i, m)
            assert in_flight_micro_batches(Schedule.ZERO_BUBBLE, p, i, m, 1) == min(p - i, m)
            assert in_flight_micro_batches(Schedule.INTERLEAVED, p, i, m, v) == pytest.approx(
                min(2 * (p - i - 1) + (v - 1) * p + 1, m * v) / v)
    assert in_flight_micro_batches(Schedule.INTERLEAVED, 4, 0, 2, 2) == 2  # every chunk of both micro-batches


def test_schedules_bubble_and_memory_by_hand():
    """Zero bubble (ZB-H1) takes twice the weight-gradient compute off each
    bubble slot at 1F1B's memory; interleaving divides the bubble by v,
    multiplies the sends by v and holds (p (v + 1) - 1) / v micro-batches on
    the first stage; its micro-batches must be a multiple of pp (Megatron-LM)."""
    L, h, a, s, V = 8, 64, 4, 32, 100
    m = gpt(L, h, a, s, V)
    tp, dp, pp, b, B = 2, 2, 4, 2, 32  # 8 micro-batches, 2 layers per stage
    training = Training(B, sequence_parallel=False)
    t_mb = 0.1
    plain = step_time(m, training, Configuration(tp, dp, pp, b), Recording(), t_mb)
    tp_mb = 2 * 4 * 1e-3 * (1 + b * s * h * 2 / 2**30)
    slot = t_mb + tp_mb + 2 * 2e-3
    assert plain.bubble_s == pytest.approx((pp - 1) * slot)
    T = b * s  # tokens of a micro-batch
    matrices = 12 * h * h
    weight_flops = 2 * T * (L * matrices + h * V)  # every forward GEMM has one weight-gradient GEMM
    total_flops = 3 * (L * (2 * T * matrices + 4 * T * s * h) + 2 * T * h * V)
    zb_config = Configuration(tp, dp, pp, b, schedule=Schedule.ZERO_BUBBLE)
    zb = step_time(m, training, zb_config, Recording(), t_mb)
    assert zb.bubble_s == pytest.approx((pp - 1) * (slot - 2 * t_mb * weight_flops / total_flops))
    assert zb.compute_s == plain.compute_s and zb.tp_s == plain.tp_s and zb.pp_s == plain.pp_s
    assert memory_per_device(m, training, zb_config) == memory_per_device(m, training, Configuration(tp, dp, pp, b))
    inter_config = Configuration(tp, dp, pp, b, virtual_stages=2)
    assert inter_config.schedule is Schedule.INTERLEAVED  # Megatron-LM's convention: v > 1 interleaves
    inter = step_time(m, training, inter_config, Recording(), t_mb)
    assert inter.bubble_s == pytest.approx((pp - 1) / 2 * (t_mb + tp_mb + 2 * 2 * 2e-3))
    act = s * b * h * (10 + 24 / tp)
    params = (2 * (matrices + 13 * h) + V * h + s * h) / tp  # the first stage's
    first = memory_per_device(m, training, inter_config)
    assert first.stage == "first"
    assert first.activations == pytest.approx(2 * (pp * 3 - 1) / 2 * act)  # 2 layers x 5.5 micro-batches
    assert first.total == pytest.approx(18 * params + first.activations)
    assert configuration_problem(m, Training(24, sequence_parallel=False), Configuration(tp, dp, pp, 2,
                                 virtual_stages=2)) == (
        "the interleaved schedule needs the micro-batches per step (6) to be a multiple of pp=4")
    assert configuration_problem(m, training, Configuration(tp, dp, pp, b, virtual_stages=4)) == (
        "4 virtual stages do not divide the 2 layers per stage")
    assert configuration_problem(m, training, Configuration(tp, dp, pp, b, virtual_stages=2,
                                                            schedule=Schedule.ZERO_BUBBLE)) == (
        "the zero-bubble schedule runs one stage per device (virtual stages 2)")
    assert configuration_problem(m, training, Configuration(tp, dp, pp, b, schedule=Schedule.INTERLEAVED)) == (
        "the interleaved schedule needs at least 2 virtual stages, not 1")


def test_zero2_shards_gradients_and_reduce_scatters_every_micro_batch():
    """ZeRO-2: ZeRO-1's memory with the gradients divided by dp too; its
    reduce-scatter runs after every micro-batch's backward (ZeRO-1's once),
    the all-gather of the weights once after the optimizer step."""
    m = gpt(8, 64, 4, 32, 100)
    config = Configuration(2, 2, 1, 2)  # 32 / (2 x 2) = 8 micro-batches
    zero1, zero2 = (Training(32, sharding=s, sequence_parallel=False) for s in (Sharding.ZERO1, Sharding.ZERO2))
    one, two = (memory_per_device(m, t, config) for t in (zero1, zero2))
    assert two.gradients == pytest.approx(one.gradients / 2) and two.optimizer == one.optimizer
    assert two.weights == one.weights and two.activations == one.activations
    t_mb = 0.01
    rec1, rec2 = Recording(), Recording()
    step1, step2 = step_time(m, zero1, config, rec1, t_mb), step_time(m, zero2, config, rec2, t_mb)
    assert step1.bucket_bytes == step2.bucket_bytes == BUCKET_GRID_BYTES[0]  # one padded bucket
    # the bucket holds fp32 gradients (Megatron-LM under bf16); the gathered bf16 weights are half its bytes
    scatter, gather = (1e-3 * (1 + size / 2**30) for size in (BUCKET_GRID_BYTES[0], BUCKET_GRID_BYTES[0] // 2))
    backward = t_mb * 2 / 3
    assert step1.dp_s == pytest.approx(overlapped_s(1, scatter, backward) + gather)
    assert step2.dp_s == pytest.approx(8 * overlapped_s(1, scatter, backward) + gather)
    assert {(c[1], c[2]) for c in rec2.calls if c[0] == "reduce"} >= {("dp", Goal.REDUCESCATTER),
                                                                     ("dp", Goal.ALLGATHER)}


def test_gradients_reduce_in_the_bytes_the_framework_holds_them():
    """Megatron-LM under bf16 reduces its fp32 main gradients in fp32
    (arguments.py's validate_args), under fp16 in fp16; the eager-master loop
    its bf16 gradients. Counted by hand: a GPT layer holds 12 h^2 + 13 h
    parameters, plus the tied word embeddings V h, learned positions s h and
    the final LayerNorm 2 h; tp 2 splits them."""
    h, layers, seq, vocab = 64, 8, 32, 100
    m = gpt(layers, h, 4, seq, vocab)
    params = layers * (12 * h * h + 13 * h) + vocab * h + seq * h + 2 * h
    config = Configuration(2, 2, 1, 2)
    for dtype, framework, value_bytes in (("bf16", "megatron", 4), ("fp16", "megatron", 2),
                                          ("bf16", "eager-master", 2), ("bf16", "torchtitan", 4)):
        training = Training(32, dtype=dtype, framework=framework, sharding=Sharding.ZERO1)
        assert step_shape(m, training, config).gradient_bytes == params // 2 * value_bytes
        rec = Recording()
        step_time(m, training, config, rec, 0.01)
        sizes = {c[2]: c[3] for c in rec.calls if c[0] == "reduce" and c[1] == "dp"}
        # one padded bucket of gradients, the weights' all-gather in the training dtype's 2 bytes
        assert sizes[Goal.ALLGATHER] == sizes[Goal.REDUCESCATTER] * 2 // value_bytes


class Linear(Recording):
    """Collectives priced by their bytes (10 us + 1 GB/s), so that the
    bucket size and the window they overlap with both matter."""

    @staticmethod
    def price(size_bytes):
        return 1e-5 + size_bytes / 1e9

    def reduce(self, axis, goal, size_bytes):
        super().reduce(axis, goal, size_bytes)
        return self.price(size_bytes)


def _exposed_by_hand(count, each, window):
    """``count`` equal transfers ready evenly over ``window``, one at a time
    (written out here, not the step model's helper): transfer ``i`` starts at
    the later of its readiness ``(i + 1) window / count`` and the previous
    one's end; what runs past the window shows, and the last never overlaps."""
    end = 0.0
    for i in range(count):
        end = max(end, (i + 1) * window / count) + each
    return end - window


def test_zero3_step_by_hand():
    """ZeRO-3 (FSDP): per micro-batch every layer's weights are all-gathered
    before its forward and again before its backward, and its gradients
    reduce-scattered after it; the forward's gathers overlap the forward, the
    backward's gathers and scatters the backward; no gradient buckets. The
    memory: weights and gradients of the stage over dp (one layer's whole
    weights gathered for the forward and the backward, its gradients whole
    once), optimizer states over dp."""
    L, h, s, V = 4, 64, 32, 100
    m = gpt(L, h, 4, s, V)
    tp, dp, b, B = 2, 2, 1, 8  # 8 / (2 x 1) = 4 micro-batches, all 4 layers on the one stage
    training = Training(B, sharding=Sharding.ZERO3, sequence_parallel=False)
    config = Configuration(tp, dp, 1, b)
    layer_params = 12 * h * h + 13 * h
    layer_bytes = math.ceil(layer_params / tp) * 2
    each = 1e-3 * (1 + layer_bytes / 2**30)  # Recording's price of one all-gather or reduce-scatter
    t_mb = 8e-3  # forward 1/3 of it, backward 2/3 (no recomputation): both windows partly hide the transfers
    rec = Recording()
    step = step_time(m, training, config, rec, t_mb)
    forward = _exposed_by_hand(L, each, t_mb / 3)
    backward = _exposed_by_hand(L, 2 * each, 2 * t_mb / 3)
    assert each < forward < L * each and 2 * each < backward < 2 * L * each  # partly hidden, as chosen
    assert step.dp_s == pytest.approx(4 * (forward + backward))
    assert step.bucket_bytes is None
    assert step.compute_s == pytest.approx(4 * t_mb) and step.bubble_s == 0 and step.pp_s == 0
    assert step.tp_s == pytest.approx(4 * L * 2 * 2 * 1e-3 * (1 + b * s * h * 2 / 2**30))
    assert step.total_s == pytest.approx(step.compute_s + step.tp_s + step.dp_s)
    memory = memory_per_device(m, training, config)
    stage = (L * layer_params + V * h + s * h + 2 * h) / tp  # embedding (tied head) and final norm
    assert memory.weights == pytest.approx(2 * stage / dp + 2 * 2 * layer_params / tp)
    assert memory.gradients == pytest.approx(4 * stage / dp + 2 * layer_params / tp)  # fp32 shards, a bf16 layer
    assert memory.optimizer == pytest.approx(12 * stage / dp)


def test_torchtitan_zero3_reduces_in_fp32_and_gathers_its_root_unit_outside_the_layers():
    """torchtitan's FSDP2 (pytorch/torchtitan at 9dec370,
    torchtitan/parallelisms/parallelize_llama.py lines 320-339): each layer's
    gradients reduce-scattered in fp32 (``reduce_dtype``), twice the bytes of
    its bf16 gathers, and the model's root unit (the embedding, tied here to
    the output layer, and the final norm) gathered once before the first layer
    and reduce-scattered once after the last, neither overlapped."""
    L, h, s, V = 4, 64, 32, 100
    m = gpt(L, h, 4, s, V)
    tp, dp, b, B = 2, 2, 1, 2  # one micro-batch
    training = Training(B, sharding=Sharding.ZERO3, sequence_parallel=False, framework="torchtitan")
    config = Configuration(tp, dp, 1, b)
    layer_params = 12 * h * h + 13 * h
    gathered = math.ceil(layer_params / tp) * 2
    root = math.ceil((V * h + s * h + 2 * h) / tp)  # word and position embeddings, final norm's weight and bias

    def price(nbytes: int) -> float:
        return 1e-3 * (1 + nbytes / 2**30)  # Recording's price of one all-gather or reduce-scatter

    t_mb = 8e-3
    step = step_time(m, training, config, Recording(), t_mb)
    forward = _exposed_by_hand(L, price(gathered), t_mb / 3)
    backward = _exposed_by_hand(L, price(gathered) + price(2 * gathered), 2 * t_mb / 3)
    assert step.dp_s == pytest.approx(forward + backward + price(2 * root) + price(4 * root))


@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_selective_recomputation_step_and_memory_by_hand(attention):
    """Selective recomputation (Korthikanti et al. 2022, Section 5): the
    attention core is not stored (no 5 a s^2 b of scores, whatever the
    kernel) and its forward runs again in the backward: 4 T s h FLOPs per
    layer more, all of them in the backward window the gradients' buckets
    overlap with; the tensor-parallel calls stay those of two passes."""
    L, h, a, s, V = 8, 256, 4, 64, 1000
    m = gpt(L, h, a, s, V)
    tp, dp, b, B = 1, 2, 2, 16  # 16 / (2 x 2) = 4 micro-batches
    config = Configuration(tp, dp, 1, b)
    none = Training(B, attention=attention, sequence_parallel=False)
    selective = replace(none, recompute=Recompute.SELECTIVE)
    act = s * b * h * (10 + 24 / tp)  # no scores
    scores = 5 * a * s * s * b / tp if attention == "unfused" else 0
    mem_none, mem_sel = memory_per_device(m, none, config), memory_per_device(m, selective, config)
    assert mem_sel.activations == pytest.approx(L * act + 4 * s * b * V / tp)
    assert mem_none.activations == pytest.approx(L * (act + scores) + 4 * s * b * V / tp)
    assert mem_sel.weights == mem_none.weights and mem_sel.optimizer == mem_none.optimizer
    # the step: the backward window is (backward + recomputation) / total of the FLOPs
    T = b * s
    forward = 2 * T * L * 12 * h * h + L * 4 * T * s * h + 2 * T * h * V
    recomputed = L * 4 * T * s * h
    window_share = (2 * forward + recomputed) / (3 * forward + recomputed)
    t_mb = 0.015
    step = step_time(m, selective, config, Linear(), t_mb)
    grads = (L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h) * 4  # fp32 main gradients (bf16), one stage, tp 1

    def by_hand(share):
        return min(_exposed_by_hand(math.ceil(grads / bucket), Linear.price(bucket), t_mb * share)
                   for bucket in BUCKET_GRID_BYTES if bucket <= grads)
    assert step.dp_s == pytest.approx(by_hand(window_share))
    assert step.compute_s == pytest.approx(4 * t_mb)
    plain = step_time(m, none, config, Linear(), t_mb)
    assert plain.dp_s == pytest.approx(by_hand(2 / 3)) and plain.dp_s > step.dp_s  # a shorter window
    # the efficiency curve prices the recomputed FLOPs like the others
    device = load_topology("dgx-a100").device
    est_none = compute_estimate(m, none, config, device, DEFAULT_COMPUTE)
    est_sel = compute_estimate(m, selective, config, device, DEFAULT_COMPUTE)
    total = 3 * forward + recomputed  # the curve's argument is the FLOPs per layer of the stage
    # an unfused attention adds its softmax and dropout passes at the HBM bandwidth: per score element
    # 7 + 2c bytes forward, 7 + 4c backward, the forward's again (selective recomputes the core), c = (s+1)/(2s)
    c = (s + 1) / (2 * s)
    passes_s = L * b * a / tp * s * s * (2 * (7 + 2 * c) + 7 + 4 * c) / 2039e9 if attention == "unfused" else 0
    passes_s += curve_pass_s(m, selective, config, L, device)  # the layers' other passes (test_curve_passes.py)
    assert est_sel.micro_batch_s == pytest.approx(
        total / (device.peak_flops * DEFAULT_COMPUTE.efficiency(total / L)) + passes_s)
    assert est_sel.micro_batch_s > est_none.micro_batch_s
    wide = Configuration(2, 2, 1, b)
    assert step_time(m, selective, wide, Recording(), t_mb).tp_s == step_time(m, none, wide, Recording(), t_mb).tp_s


def test_expert_parallel_step_by_hand():
    """Per MoE layer and pass one dispatch and one combine all-to-all over ep
    of the micro-batch's routed token copies (its sequence-parallel share),
    on the critical path and in the bubble's slot; the dense gradients reduce
    over dp x ep, the experts' over dp, in buckets of one size; without ep no
    all-to-all."""
    m = parse_inline_model(MOE)
    h, s, b, tp = 64, 32, 2, 2
    config = Configuration(tp, 2, 1, b, ep=2)  # 16 / (2 x 2 x 2) = 2 micro-batches
    training = Training(16)
    rec = Recording()
    t_mb = 0.01
    step = step_time(m, training, config, rec, t_mb)
    sends = [c for c in rec.calls if c[0] == "alltoall"]
    assert {c[1:] for c in sends} == {("ep", b * s * 2 * h * 2 // tp)}  # top-2 copies, bf16, / tp
    assert step.ep_s == pytest.approx(2 * 4 * 2 * 2 * 5e-3)  # micro-batches x layers x passes x 2
    full = step_time(m, replace(training, recompute=Recompute.FULL), config, Recording(), t_mb)
    assert full.ep_s == pytest.approx(step.ep_s * 3 / 2)
    dp_axes = {(c[1], c[2]) for c in rec.calls if c[0] == "reduce" and c[1] != "tp"}
    assert dp_axes == {("dp+ep", Goal.ALLREDUCE), ("dp", Goal.ALLREDUCE)}
    no_ep = Recording()
    plain = step_time(m, training, Configuration(tp, 4, 1, b), no_ep, t_mb)
    assert plain.ep_s == 0 and not any(c[0] == "alltoall" for c in no_ep.calls)
    assert {c[1] for c in no_ep.calls if c[0] == "reduce" and c[1] != "tp"} == {"dp"}
    pipelined = step_time(m, training, Configuration(tp, 2, 2, 1, ep=2), Recording(), t_mb)
    assert pipelined.bubble_s == pytest.approx(
        (2 - 1) * (t_mb + pipelined.tp_s / 4 + pipelined.ep_s / 4 + pipelined.pp_s / 4))


def test_capacity_factor_pads_what_the_experts_compute_keep_and_send(tmp_path):
    """moe.capacity_factor c (drop-and-pad): every expert is padded to c
    times its even share, so per token top_k x c routed copies are computed,
    kept for the backward and carried by both all-to-alls; without a factor
    (dropless) c = 1. Checked on a model file too, and refused out of range."""
    dropless = parse_inline_model(MOE)
    padded = parse_inline_model(MOE + ",capacity_factor=1.5")
    assert padded.moe.capacity_factor == 1.5 and dropless.moe.capacity_factor is None
    h, fe, s, b, E, tp, L = 64, 48, 32, 2, 8, 2, 4
    T = b * s
    # forward FLOPs: each of the L MoE layers computes one routed copy more per token (2 x 1.5 - 2)
    extra = padded.training_flops(b).forward - dropless.training_flops(b).forward
    assert extra == pytest.approx(L * 2 * T * (3 - 2) * 3 * h * fe)

    def moe_activations(routed):
        return 10 * s * b * h + (2 * s * b * h + 4 * s * b * h + 2 * s * b * h + 2 * 3 * s * b * (routed + 1) * fe
                                 + 2 * s * b * h * routed + 4 * s * b * E) / tp
    assert padded.activation_bytes_per_layer(b, tp, Recompute.NONE, scores=False, moe=True) == pytest.approx(
        moe_activations(3))
    assert dropless.activation_bytes_per_layer(b, tp, Recompute.NONE, scores=False, moe=True) == pytest.approx(
        moe_activations(2))
    rec = Recording()
    step_time(padded, Training(16), Configuration(tp, 2, 1, b, ep=2), rec, 0.01)
    assert {c[1:] for c in rec.calls if c[0] == "alltoall"} == {("ep", b * s * 3 * h * 2 // tp)}
    spec = dict(name="padded", layers=4, hidden=64, heads=4, ffn=96, mlp="swiglu", seq=32, vocab=100,
                moe=dict(experts=8, top_k=2, expert_ffn=48, shared_experts=1, capacity_factor=1.5))
    path = tmp_path / "padded.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert load_model(str(path)).training_flops(b).forward == padded.training_flops(b).forward
    path.write_text(yaml.safe_dump({**spec, "moe": {**spec["moe"], "capacity_factor": 0.5}}))
    with pytest.raises(SynthError, match=r"field 'moe.capacity_factor' must be a number from 1 to 64 or null "
                                         r"\(dropless\), got 0.5"):
        load_model(str(path))


def test_alltoall_cost_by_hand():
    """An all-to-all is every member's n - 1 sends of size / n at once: inside
    a node each GPU's flows share its NVLink port; across nodes they share the
    node's NICs (GPUDirect RDMA), so groups spread over nodes pay the
    network. Each member also pays NCCL's measured cost per peer: (28.20 -
    11.75) us over (32 - 8) GPUs (NVIDIA/nccl's contrib all-to-all README)."""
    from synth.cost import Model, alltoall_s

    topo = load_topology("dgx-h100").scaled({"node": 2})
    profile = Model(prior=True).profile_for(topo)  # the topology's numbers, as used below
    size = 64 * 2**20
    peer = (28.20e-6 - 11.75e-6) / 24
    inside = np.arange(16).reshape(2, 8)
    nvlink = 450e9  # dgx-h100.yaml's GPU level, bytes per second per direction
    assert alltoall_s(topo, profile, inside, size) == pytest.approx(7 * peer + 1e-6 + 7 * (size / 8) / nvlink)
    assert alltoall_s(topo, profile, inside, size, peer_s=0.0) == pytest.approx(1e-6 + 7 * (size / 8) / nvlink)
    across = np.arange(16).reshape(2, 8).T.copy()  # 8 groups of 2, one GPU in each node
    # each node sends 8 flows of size / 2 through its 8 NICs of 47 GB/s: one NIC each
    assert alltoall_s(topo, profile, across, size) == pytest.approx(peer + 5e-6 + (size / 2) / 47e9, rel=1e-9)
    assert alltoall_s(topo, profile, np.arange(16).reshape(1, 16), size) > alltoall_s(topo, profile, inside, size)
    assert alltoall_s(topo, profile, np.arange(8).reshape(8, 1), size) == 0.0


# ================================================================ context parallelism


def test_context_parallel_step_and_memory_by_hand():
    """cp splits each sequence into cp shares: compute, activations, logits,
    tp collectives and pipeline sends per device all / cp; per layer and pass
    a ring of cp - 1 key-value steps (their gradients too, backward) beside
    the attention core, which hides up to its own time; the dense gradients
    reduce over dp x cp, and ZeRO shards over dp x cp."""
    L, h, a, s, V = 8, 64, 4, 32, 100
    m = gpt(L, h, a, s, V)
    tp, cp, dp, pp, b, B = 2, 2, 2, 2, 1, 8  # 8 / (2 x 1) = 4 micro-batches, 4 layers per stage
    training = Training(B, sequence_parallel=False, sharding=Sharding.ZERO1)
    config = Configuration(tp, dp, pp, b, cp=cp)
    assert config.devices == 16 and config.micro_batches(training) == 4 and config.sizes()["cp"] == 2
    rec = Recording(send_s=2e-3)
    t_mb = 0.05
    step = step_time(m, training, config, rec, t_mb)
    act = b * (s // cp) * h * 2
    assert {c[3] for c in rec.calls if c[0] == "reduce" and c[1] == "tp"} == {act}
    kv = 2 * b * (s // cp) * h * 2 // tp  # keys and values of the chunk, bf16, this rank's heads
    assert ("send", "cp", kv) in rec.calls and ("send", "pp", act // tp) in rec.calls
    flops = m.training_flops(b)
    attention = t_mb * L * 3 * m.attention_core_flops(b * s) / flops.total / 4  # per layer of the stage
    ring = 4 * (overlapped_s(1, 2e-3, attention / 3) + overlapped_s(1, 4e-3, attention * 2 / 3))
    assert step.cp_s == pytest.approx(4 * ring)
    assert {c[1] for c in rec.calls if c[0] == "reduce" and c[1] != "tp"} == {"dp+cp"}
    per_layer = m.activation_bytes_per_layer(b, tp, Recompute.NONE, 2, False, False, False, cp)
    assert per_layer == pytest.approx((s // cp) * b * h * (10 + 24 / tp))
    memory = memory_per_device(m, training, config)
    one = memory_per_device(m, training, Configuration(tp, dp, pp, b))
    assert memory.weights == one.weights and memory.optimizer == pytest.approx(one.optimizer / cp)
    assert memory.activations == pytest.approx(one.activations / cp)
    shape_flops = step_time(m, training, config, Recording(), 1.0).compute_s  # 4 micro-batches x 1 s
    assert shape_flops == 4.0
    assert m.parallelism_problem(1, 1, 1, 3) == "cp=3 does not split the model's seq (32) into 2 x cp equal chunks"


@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.FULL])
def test_context_parallel_allgather_is_on_the_critical_path_by_hand(recompute):
    """--cp-comm allgather (Llama 3's context parallelism, Llama Team 2024,
    Section 3.3.2): per layer and micro-batch the whole sequence's keys and
    values (cp x the chunk's) are all-gathered before each forward (the
    recomputed one too) and again for the backward, and their gradients
    reduce-scattered after it; none of it hides, no ring step is sent, and
    the bubble's slot carries it as it carries the ring."""
    L, h, a, s, V = 8, 64, 4, 32, 100
    m = gpt(L, h, a, s, V)
    tp, cp, dp, pp, b, B = 2, 4, 2, 2, 1, 8  # 4 micro-batches, 4 layers per stage
    config = Configuration(tp, dp, pp, b, cp=cp)
    training = Training(B, sequence_parallel=False, recompute=recompute, cp_comm="allgather")
    rec = Recording()
    step = step_time(m, training, config, rec, 0.05)
    ring = step_time(m, replace(training, cp_comm="ring"), config, Recording(), 0.05)
    gathered = cp * 2 * b * (s // cp) * h * 2 // tp  # every chunk's keys and values, bf16, this rank's heads
    each = 1e-3 * (1 + gathered / 2**30)  # Recording's price of one reduction
    gathers = 3 if recompute is Recompute.FULL else 2  # each forward's, and the backward's
    per_micro_batch = 4 * (gathers * each + each)  # 4 layers: the gathers and one reduce-scatter each
    assert step.cp_s == pytest.approx(4 * per_micro_batch)
    assert ("reduce", "cp", Goal.ALLGATHER, gathered) in rec.calls
    assert ("reduce", "cp", Goal.REDUCESCATTER, gathered) in rec.calls
    assert not [c for c in rec.calls if c[0] == "send" and c[1] == "cp"]
    assert step.bubble_s - ring.bubble_s == pytest.approx((pp - 1) * (per_micro_batch - ring.cp_s / 4))
    assert step.compute_s == ring.compute_s and step.dp_s == ring.dp_s
    with pytest.raises(SynthError, match=r"^--cp-comm a2a: choose one of ring, allgather$"):
        Training(B, cp_comm="a2a")


# ================================================================ HSDP


def test_hsdp_split_keeps_every_device_in_place():
    """HSDP's sub-axes of dp: the shard axis is dp's split at the innermost
    level it spans, the replicate axis the rest; the mesh is dp's, reshaped
    (replicate x shard, shard fastest), on every placement."""
    from synth.synthesis.placement import split_at_innermost_level

    for topology, axes in (("testbed-2x2x2", "tp=2,dp=4"), ("dgx-a100", "tp=2,dp=32,pp=2")):
        for p in enumerate_placements(load_topology(topology), parse_axes(axes)):
            q = split_at_innermost_level(p, "dp", "dp_replicate", "dp_shard")
            dp = p.axis_names.index("dp")
            row = p.matrix[dp]
            innermost = max(level for level, split in enumerate(row) if split > 1)
            assert q.matrix[dp + 1] == tuple(row[innermost] if level == innermost else 1 for level in range(len(row)))
            assert np.array_equal(q.mesh.reshape(p.mesh.shape), p.mesh)


class WithSizes(Recording):
    """Recording collectives that know the HSDP sub-axes' sizes."""

    def __init__(self, shard, replicate):
        super().__init__()
        self.sizes = {"dp_shard": shard, "dp_replicate": replicate}

    def size(self, axis):
        return self.sizes[axis]


def test_hsdp_memory_and_step_by_hand():
    """HSDP is ZeRO-3 over the shard group: weights, gradients and states / s
    with the gathered layers; per micro-batch and layer an all-gather before the
    forward and the backward and a reduce-scatter after the backward over the
    shard group, and the all-reduce of the shard over the replicate group;
    with the whole dp as the shard group it is ZeRO-3."""
    m = gpt(4, 64, 4, 32, 100)
    config = Configuration(1, 8, 1, 1)  # 8 micro-batches of 1
    hsdp, zero3 = Training(64, sharding=Sharding.HSDP), Training(64, sharding=Sharding.ZERO3)
    params = m.parameters
    layer = 12 * 64 * 64 + 13 * 64
    memory = memory_per_device(m, hsdp, config, 2)
    assert memory.weights == pytest.approx(2 * params / 2 + 2 * 2 * layer)
    assert memory.gradients == pytest.approx(4 * params / 2 + 2 * layer)
    assert memory.optimizer == pytest.approx(12 * params / 2)
    assert memory_per_device(m, hsdp, config, 8) == memory_per_device(m, zero3, config)
    t_mb = 0.01
    rec = WithSizes(2, 4)
    step = step_time(m, hsdp, config, rec, t_mb)
    size = math.ceil(layer) * 2
    each = 1e-3 * (1 + size / 2**30)
    across = 1e-3 * (1 + (size // 2) / 2**30)
    backward = t_mb * 2 / 3
    per_micro_batch = overlapped_s(4, each, t_mb - backward) + overlapped_s(4, 2 * each + across, backward)
    assert step.dp_s == pytest.approx(8 * per_micro_batch)
    assert {(c[1], c[2], c[3]) for c in rec.calls if c[0] == "reduce"} == {
        ("dp_shard", Goal.ALLGATHER, size), ("dp_shard", Goal.REDUCESCATTER, size),
        ("dp_replicate", Goal.ALLREDUCE, size // 2)}
    alone = WithSizes(8, 1)
    step_time(m, hsdp, config, alone, t_mb)
    assert not any(c[1] == "dp_replicate" for c in alone.calls)  # one group: nothing to replicate across


def test_interleaving_on_uneven_stages_by_hand():
    """Interleaving runs on uneven stages too, each device's layers split into
    v virtual stages (no more than its fewest layers): the bubble is (pp - 1) /
    v slots of the slowest stage, the first stage holds Megatron-LM's warm-up
    chunks of its own layers; Megatron-LM's export refuses the layout (it
    takes it only as a layout string)."""
    m = gpt(9, 64, 4, 32, 100)
    training = Training(16, sequence_parallel=False)
    config = Configuration(1, 1, 2, 2, virtual_stages=2, stage_layers=(4, 5))  # 8 micro-batches
    assert configuration_problem(m, training, config) is None
    assert configuration_problem(m, training, replace(config, virtual_stages=5)) == (
        "5 virtual stages are more than the 4 layers of the smallest stage (every virtual stage holds a layer)")
    t_mb = 0.1
    step = step_time(m, training, config, Recording(), t_mb)
    assert step.bubble_s == pytest.approx((2 - 1) / 2 * (t_mb + 2 * 2 * 2e-3))
    h, s_, V, b = 64, 32, 100, 2
    act = s_ * b * h * (10 + 24)  # per layer and micro-batch, tp = 1, flash attention
    layer = 12 * h * h + 13 * h
    first_chunks = min(2 * (2 - 0 - 1) + (2 - 1) * 2 + 1, 8 * 2)  # Megatron-LM's warm-up, rank 0: 5
    last_chunks = min(2 * (2 - 1 - 1) + (2 - 1) * 2 + 1, 8 * 2)  # rank 1: 3
    first = 18 * (4 * layer + V * h + s_ * h) + first_chunks / 2 * 4 * act
    last = 18 * (5 * layer + 2 * h + V * h) + last_chunks / 2 * 5 * act + 4 * s_ * b * V
    memory = memory_per_device(m, training, config)
    assert memory.total == pytest.approx(max(first, last))
    assert memory.stage == ("first" if first > last else "last")
    from synth.planner.request import JobRequest as Request

    topology = load_topology("dgx-a100").scaled({"node": 1, "gpu": 4})
    request = Request(topology, topology.device, m, training, parse_axis_ranges("tp=2,dp=1,pp=2"), (2,),
                      stages="uneven", schedule="interleaved", memory_margin_GiB=0)
    solution = plan_job(request)
    assert {c.config.virtual_stages for c in solution.candidates} <= {2, 3, 4}
    assert all(c.config.stage_layers for c in solution.candidates)
    from synth.export.megatron import megatron_export

    plan = solution.plan()
    with pytest.raises(SynthError, match="virtual stages on uneven stages only as a --pipeline-model-parallel-layout"):
        megatron_export(plan)
