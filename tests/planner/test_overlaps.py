"""The overlaps frontier runs use, each a term of the step with its window,
checked by hand: MoE all-to-alls beside another micro-batch's computation
(``--ep-overlap``, DeepSeek-V3's DualPipe, with the SMs its kernels take),
the sharded optimizer's weight all-gather beside the next forward
(``--overlap-param-gather``), and ZeRO-3 with context parallelism."""

from __future__ import annotations

import math

import pytest
from planner_cases import AlltoallsByBytes, zero1_dp_by_hand

from synth.errors import SynthError
from synth.planner.collectives import BareCollectives
from synth.planner.modelspec import parse_inline_model
from synth.planner.stepmodel import (
    Configuration,
    Sharding,
    Training,
    configuration_problem,
    memory_per_device,
    step_shape,
    step_time,
)
from synth.synthesis.semantics import Goal

MOE = "layers=4,hidden=64,heads=4,ffn=96,mlp=swiglu,seq=32,vocab=100,experts=8,top_k=2,expert_ffn=48"


class Fixed(BareCollectives):
    """Collectives at a fixed cost per call (all-to-all, send), and a reduction
    cost of ``alpha + size / beta`` that records its axes."""

    def __init__(self, alltoall_s=1e-3, alpha_s=1e-4, bytes_per_s=1e9):
        self.alltoall_s, self.alpha_s, self.bytes_per_s = alltoall_s, alpha_s, bytes_per_s
        self.axes = set()

    def reduce(self, axis, goal, size_bytes):
        self.axes.add((axis, goal))
        return self.alpha_s + size_bytes / self.bytes_per_s

    def send(self, axis, size_bytes):
        return 2e-3

    def alltoall(self, axis, size_bytes):
        return self.alltoall_s


def _by_hand_exposed_s(alltoalls_s: float, window_s: float) -> float:
    """One layer: what outlasts the paired computation shows; the computation beside the all-to-alls runs on
    the 112 of 132 SMs DeepSeek-V3's communication kernels leave (20 SMs, Section 3.2.2)."""
    overlapped = min(alltoalls_s, window_s)
    return max(0.0, alltoalls_s - window_s) + overlapped * 132 / 112 - overlapped


@pytest.mark.parametrize("t_mb", [1e-4, 1.0])  # all-to-alls longer than a layer's computation, and far shorter
def test_ep_overlap_hides_the_all_to_alls_behind_another_micro_batch_by_hand(t_mb):
    model = parse_inline_model(MOE)
    config = Configuration(1, 1, 1, 1, ep=4)  # 4 MoE layers on one stage; 8 / 4 replicas = 2 micro-batches
    plain = step_time(model, Training(8), config, Fixed(), t_mb)
    overlapped = step_time(model, Training(8, ep_overlap=True), config, Fixed(), t_mb)
    layer_alltoalls = 2 * 2 * 1e-3  # dispatch and combine, forward and backward
    assert plain.ep_s == pytest.approx(2 * 4 * layer_alltoalls)
    assert overlapped.ep_s == pytest.approx(2 * 4 * _by_hand_exposed_s(layer_alltoalls, t_mb / 4))
    assert overlapped.ep_s < plain.ep_s
    if t_mb == 1.0:  # fully hidden: only the computation's slowdown while the all-to-alls run is left
        assert overlapped.ep_s == pytest.approx(2 * 4 * layer_alltoalls * 20 / 112)


@pytest.mark.parametrize("t_mb", [1e-3, 10.0])
def test_overlap_param_gather_hides_the_weight_all_gathers_behind_the_next_forward_by_hand(t_mb):
    model = parse_inline_model("layers=4,hidden=1024,heads=8,seq=256,vocab=1000")
    config = Configuration(1, 8, 1, 1)
    c = Fixed(alpha_s=1e-4, bytes_per_s=1e10)
    training = Training(8, sharding=Sharding.ZERO1)
    shape = step_shape(model, training, config)
    backward = t_mb * shape.backward_fraction
    plain = step_time(model, training, config, c, t_mb)
    overlapped = step_time(model, Training(8, sharding=Sharding.ZERO1, overlap_param_gather=True), config, c, t_mb)
    by_hand = (shape.gradient_bytes, backward, t_mb - backward, c.alpha_s, c.bytes_per_s)
    assert plain.dp_s == pytest.approx(zero1_dp_by_hand(*by_hand, overlap_gather=False))
    assert overlapped.dp_s == pytest.approx(zero1_dp_by_hand(*by_hand, overlap_gather=True))
    assert overlapped.dp_s <= plain.dp_s
    if t_mb == 10.0:
        assert overlapped.dp_s < plain.dp_s


def _queue_exposed_s(starts_s: list[float], each_s: float) -> float:
    """Transfers of ``each_s`` run one at a time, each from its start (seconds before the moment the step needs
    them all, negative: earlier): how long after that moment the last one ends."""
    free = -math.inf
    for start in sorted(starts_s):
        free = max(free, start) + each_s
    return max(0.0, free)


@pytest.mark.parametrize("t_mb", [1e-3, 0.05, 10.0])
def test_interleaved_reduces_and_gathers_each_model_chunk_in_its_own_window_by_hand(t_mb):
    """Megatron-LM's interleaved schedule (schedules.py:1438-1455, 1219-1221, 1341-1352) reduces a model
    chunk's gradients whole once its last backward has run: in the cool-down the chunks' backwards come in
    groups of pp micro-batches, last chunk first, so chunk c's reduction starts c groups (c x pp chunk
    backwards, each 1/v of a micro-batch's) before the end, and chunk 0's at the end. With
    --overlap-param-gather the first two chunks' weights are gathered at the step's start, chunk c + 1's when
    chunk c's forwards begin; chunk c's forwards wait for its weights."""
    model = parse_inline_model("layers=8,hidden=1024,heads=8,seq=256,vocab=1000")
    pp, v, dp = 2, 4, 4
    config = Configuration(1, dp, pp, 1, virtual_stages=v)  # 8 micro-batches
    c = Fixed(alpha_s=1e-4, bytes_per_s=1e10)
    for gather in (False, True):
        training = Training(dp * 8, sharding=Sharding.ZERO1, overlap_param_gather=gather)
        shape = step_shape(model, training, config)
        step = step_time(model, training, config, c, t_mb)
        backward = t_mb * shape.backward_fraction
        forward = t_mb - backward
        bucket = step.bucket_bytes
        n = math.ceil(shape.gradient_bytes / bucket)
        chunk_reduce = n * (c.alpha_s + bucket / c.bytes_per_s) / v
        chunk_gather = n * (c.alpha_s + bucket / 2 / c.bytes_per_s) / v
        reduce = _queue_exposed_s([-k * pp * backward / v for k in range(v)], chunk_reduce)
        if gather:  # chunk k's weights needed after chunk 0's gather and k groups of forwards
            starts = [0.0, 0.0] + [(k - 1) * pp * forward / v for k in range(2, v)]
            needed = [k * pp * forward / v for k in range(v)]
            free, late = 0.0, 0.0
            for start, need in zip(starts, needed):
                free = max(free, start) + chunk_gather
                late = max(late, free - need - chunk_gather)  # the first chunk's gather itself is exposed
            gathered = chunk_gather + late
        else:
            gathered = v * chunk_gather
        assert step.dp_s == pytest.approx(reduce + gathered)
        if t_mb == 10.0:  # long windows: only the first chunk's reduction (and gather, overlapped) stay exposed
            assert step.dp_s == pytest.approx(chunk_reduce + (chunk_gather if gather else v * chunk_gather))


def test_overlap_param_gather_needs_a_sharded_optimizer():
    with pytest.raises(SynthError, match="--overlap-param-gather needs --sharding zero1 or zero2"):
        Training(8, overlap_param_gather=True)


def test_zero3_with_context_parallelism_shards_over_dp_and_cp():
    model = parse_inline_model("layers=4,hidden=64,heads=4,seq=64,vocab=100")
    training = Training(8, sharding=Sharding.ZERO3)
    config = Configuration(1, 2, 1, 1, cp=2)
    assert configuration_problem(model, training, config) is None
    memory = memory_per_device(model, training, config)
    p, layer = model.parameters, 12 * 64 * 64 + 13 * 64
    # Megatron-LM's bytes (bf16 weights, fp32 gradients, 12 of optimizer) over the 4 devices of dp x cp, and the
    # gathered layers in bf16
    assert memory.weights == pytest.approx(2 * p / 4 + 2 * 2 * layer)
    assert memory.gradients == pytest.approx(4 * p / 4 + 2 * layer)
    assert memory.optimizer == pytest.approx(12 * p / 4)
    c = Fixed()
    step_time(model, training, config, c, 1e-3)
    assert {("dp+cp", Goal.ALLGATHER), ("dp+cp", Goal.REDUCESCATTER)} <= c.axes


@pytest.mark.parametrize("outer, inner, copies", [
    (8, 8, 4),  # 8 experts over 8 nodes reach 8 (1 - (7/8)^8) = 5.25 nodes on average: 4 at most
    (2, 8, 2 * (1 - 0.5 ** 8)),  # two nodes: each token reaches 1.99 of them, under the limit
    (1, 8, 8),  # inside one node: one copy per routed expert, as without the limit
])
def test_node_limited_routing_sends_a_token_once_per_node_it_reaches_by_hand(outer, inner, copies):
    """DeepSeek-V3 (arXiv:2412.19437 Sections 2.1.2, 3.2.2): a token goes to at
    most 4 nodes, once to each over InfiniBand, and is forwarded over NVLink to
    its experts there; the all-to-all carries those copies, not one per expert."""
    spec = MOE.replace("experts=8,top_k=2", "experts=64,top_k=8")
    limited, plain = parse_inline_model(spec + ",max_nodes=4"), parse_inline_model(spec)
    config = Configuration(1, 1, 1, 1, ep=outer * inner)
    token_bytes = limited.hidden * 2  # bf16
    seen = {}
    for name, model in (("limited", limited), ("plain", plain)):
        spanning = AlltoallsByBytes(outer)
        step_time(model, Training(64), config, spanning, 1.0)
        seen[name] = set(spanning.sizes)
    tokens = limited.seq  # micro-batch 1, no tp or cp
    assert seen["plain"] == {tokens * 8 * token_bytes}
    assert seen["limited"] == {math.ceil(tokens * 8 * token_bytes * copies / 8)}
