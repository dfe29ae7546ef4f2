"""``--tp-overlap`` (Megatron-LM's ``--tp-comm-overlap`` over Transformer
Engine's userbuffers) against a timeline simulated here chunk by chunk: the
GEMM's chunks one after another, each communication chunk when its data is
ready and the one before it is done, the GEMM at ``1 - share`` of its speed
while a kernel holding ``share`` of the SMs runs beside it. The simulation
shares no code with the closed forms of synth.planner.overlaps."""

from __future__ import annotations

from pathlib import Path

import pytest
from planner_cases import Recording, gpt

from synth.errors import SynthError
from synth.planner.activations import Recompute
from synth.planner.compute import load_compute_profile
from synth.planner.layercompute import tp_overlap_chunk_ops
from synth.planner.optimes import Shard
from synth.planner.modelspec import load_model
from synth.planner.overlaps import tp_overlap_exposed_s
from synth.planner.stepmodel import Configuration, Training, compute_estimate, memory_per_device, step_time
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

H100_PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "h100-sxm5-80gb.compute.json"

SHARE = 16 / 132  # Transformer Engine <= v1.7: pipeline and bulk kernels on 16 SMs, no margin; an H100's 132 SMs


def simulate(gemm_chunks: list[float], comm_chunks: list[float], after_gemm: bool, share: float) -> float:
    """Makespan of GEMM chunks run back to back and communication chunks run
    one after another, chunk ``j`` starting once chunk ``j - 1`` is done and,
    with ``after_gemm``, once GEMM chunk ``j`` is done (else at once); the GEMM
    progresses at ``1 - share`` while a communication chunk runs. Event by
    event."""
    t, gi, gemm_left = 0.0, 0, gemm_chunks[0]
    ci, comm_left, comm_running = 0, 0.0, False
    gemm_done_at: list[float] = []
    while gi < len(gemm_chunks) or ci < len(comm_chunks) or comm_running:
        if not comm_running and ci < len(comm_chunks) and (not after_gemm or len(gemm_done_at) > ci):
            comm_running, comm_left = True, comm_chunks[ci]
        rate = (1 - share) if comm_running else 1.0
        to_gemm = gemm_left / rate if gi < len(gemm_chunks) else float("inf")
        to_comm = comm_left if comm_running else float("inf")
        step = min(to_gemm, to_comm)
        assert step < float("inf")
        t += step
        if gi < len(gemm_chunks):
            gemm_left -= step * rate
        if comm_running:
            comm_left -= step
        if gi < len(gemm_chunks) and to_gemm <= step * (1 + 1e-12):
            gemm_done_at.append(t)
            gi += 1
            gemm_left = gemm_chunks[gi] if gi < len(gemm_chunks) else 0.0
        if comm_running and to_comm <= step * (1 + 1e-12):
            comm_running, ci = False, ci + 1
    return t


def ring_exchange(gather: float, gemm: float, tp: int) -> float:
    """Exposed: tp GEMM chunks, chunk k once the k-th ring step (of tp - 1,
    by copy engine: no SMs) has brought its shard."""
    step, end = gather / (tp - 1), 0.0
    for k in range(tp):
        end = max(end, k * step) + gemm / tp
    return end - gemm


def pipeline(scatter: float, gemm: float) -> float:
    """Exposed: 4 GEMM chunks, each chunk's reduce-scatter after it."""
    return simulate([gemm / 4] * 4, [scatter / 4] * 4, True, SHARE) - gemm


def bulk(comm: float, gemm: float) -> float:
    """Exposed: the whole collective started with the whole GEMM."""
    return simulate([gemm], [comm], False, SHARE) - gemm


def by_simulation(gather, scatter, gemms, tp):
    qkv, proj, up, down = gemms
    forward = ring_exchange(gather, qkv, tp) + pipeline(scatter, proj) + ring_exchange(gather, up, tp) \
        + pipeline(scatter, down)
    backward = ring_exchange(gather, proj, tp) + ring_exchange(gather, down, tp) + bulk(gather, qkv) \
        + bulk(scatter, qkv) + bulk(gather, up) + bulk(scatter, up)
    return forward, backward


def test_the_docstrings_worked_example():
    """tp 8, all-gather and reduce-scatter 0.8 ms, GEMMs 1.2, 0.4, 1.6, 1.6
    ms: forward 0.2 + 0.75 x 0.4 + 0.2 + 0.75 x 0.8 x 16/132, backward 0.45 +
    4 x 0.8 x 16/132 (worked out by hand in the docstring), and the simulation
    agrees."""
    forward, backward = tp_overlap_exposed_s(0.8, 0.8, [1.2, 0.4, 1.6, 1.6], 8)
    assert forward == pytest.approx(0.2 + 0.75 * 0.4 + 0.2 + 0.75 * 0.8 * SHARE)
    assert backward == pytest.approx(0.45 + 4 * 0.8 * SHARE)
    assert (forward, backward) == pytest.approx(by_simulation(0.8, 0.8, [1.2, 0.4, 1.6, 1.6], 8))


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("gemm_scale", [0.01, 0.3, 0.9, 1.0, 1.3, 5.0])
def test_each_overlap_against_the_simulated_timeline(tp, gemm_scale):
    """Short GEMMs leave most of each collective, long ones hide all of the
    ring exchange, all but a quarter (the last chunk) of the pipeline and all
    of the bulk collectives, which still slow the GEMM beside them."""
    gather, scatter = 1.0, 1.7
    gemms = [gemm_scale * x for x in (1.5, 0.5, 2.0, 2.0)]
    assert tp_overlap_exposed_s(gather, scatter, gemms, tp) == pytest.approx(
        by_simulation(gather, scatter, gemms, tp), rel=1e-9)


class ByGoal(Recording):
    COSTS = {Goal.ALLREDUCE: 4e-3, Goal.ALLGATHER: 1e-3, Goal.REDUCESCATTER: 2e-3}

    def reduce(self, axis, goal, size_bytes):
        super().reduce(axis, goal, size_bytes)
        return self.COSTS[goal]


def test_the_step_counts_the_overlap_per_layer_and_pass():
    """Per layer: the forward (twice under full recomputation) and the
    backward of the simulated timeline, each GEMM its share of the
    micro-batch's compute by FLOPs (QKV, projection, MLP up, MLP down); the
    overlap moves no tensor; it needs sequence parallelism."""
    L, h, a, s, V = 8, 64, 4, 32, 100
    m = gpt(L, h, a, s, V)
    tp, b = 4, 2
    config = Configuration(tp, 1, 2, b)  # 4 layers per stage, 4 micro-batches
    T = b * s
    gemm_flops = [2 * T * 3 * h * h / tp, 2 * T * h * h / tp, 2 * T * 4 * h * h / tp, 2 * T * 4 * h * h / tp]
    for recompute, passes in ((Recompute.NONE, 2), (Recompute.FULL, 3)):
        flops = m.training_flops(b, recompute).total / (tp * 2)
        for t_mb in (1e-6, 1.0):  # GEMMs shorter than the collectives, and far longer
            g = [t_mb * f / flops for f in gemm_flops]
            on = step_time(m, Training(8, recompute=recompute, tp_overlap=True), config, ByGoal(), t_mb)
            forward, backward = by_simulation(1e-3, 2e-3, g, tp)
            assert on.tp_s == pytest.approx(4 * 4 * ((passes - 1) * forward + backward))
            if t_mb == 1.0:  # long GEMMs hide more than the two all-gathers the backward adds
                assert on.tp_s < step_time(m, Training(8, recompute=recompute), config, ByGoal(), t_mb).tp_s
            assert memory_per_device(m, Training(8, recompute=recompute, tp_overlap=True), config) == \
                memory_per_device(m, Training(8, recompute=recompute), config)
    with pytest.raises(SynthError, match="--tp-overlap needs --sequence-parallel on"):
        Training(8, sequence_parallel=False, tp_overlap=True)


def test_the_gemms_run_in_transformer_engines_chunks():
    """The ring exchange's GEMMs as tp GEMMs of T / tp tokens (QKV and MLP-up
    forward, the projection's and MLP-down's input gradients), the pipelined
    ones as 4 GEMMs of a quarter of the output features (projection and
    MLP-down forward), each priced by the profile, less the whole GEMM; an MoE
    layer's MLP is its experts' and not chunked; nothing without sequence
    parallelism or at tp 1. On the H100 profile, a 462B layer at tp 8 (4,096
    tokens): chunks of 512 tokens cost more than the whole GEMM."""
    profile = load_compute_profile(H100_PROFILE)
    model = load_model("megatron-462b")
    tp, T, h = 8, model.seq, model.hidden
    f = model.ffn

    def gemm(m, k, n):
        return float(profile.gemm.seconds(m, k, n, 1.0, None))

    expected = {  # name: (whole GEMM, its chunks), shapes written out from the model's sizes
        "qkv.chunks": ((T, h, 3 * h // tp), [(T // tp, h, 3 * h // tp)] * tp),
        "attention_projection.chunks": ((T, h // tp, h), [(T, h // tp, h // 4)] * 4),
        "attention_projection.dgrad.chunks": ((T, h, h // tp), [(T // tp, h, h // tp)] * tp),
        "mlp_up.chunks": ((T, h, f // tp), [(T // tp, h, f // tp)] * tp),
        "mlp_down.chunks": ((T, f // tp, h), [(T, f // tp, h // 4)] * 4),
        "mlp_down.dgrad.chunks": ((T, h, f // tp), [(T // tp, h, f // tp)] * tp),
    }
    ops = {op.name: op for op in tp_overlap_chunk_ops(profile, model, Shard(tp, 1, T, True)).ops}
    assert set(ops) == set(expected)
    for name, (whole, chunks) in expected.items():
        assert ops[name].seconds == pytest.approx(sum(gemm(*c) for c in chunks) - gemm(*whole))
    assert ops["qkv.chunks"].seconds > 0 and ops["mlp_up.chunks"].seconds > 0
    assert tp_overlap_chunk_ops(profile, model, Shard(tp, 1, T, False)).ops == ()
    assert tp_overlap_chunk_ops(profile, model, Shard(1, 1, T, True)).ops == ()
    moe = load_model("mixtral-8x7b")  # an MoE layer with ordinary heads (latent attention: tests/planner/test_mla.py)
    names = {op.name for op in tp_overlap_chunk_ops(profile, moe, Shard(2, 1, moe.seq, True), moe=True).ops}
    assert names == {"qkv.chunks", "attention_projection.chunks", "attention_projection.dgrad.chunks"}


def test_the_chunks_lengthen_each_layer_of_the_micro_batch():
    """--tp-overlap adds each layer's chunk cost to the micro-batch: once,
    and its forward part again under full recomputation."""
    profile = load_compute_profile(H100_PROFILE)
    device = load_topology("dgx-h100").device
    model = load_model("layers=8,hidden=4096,heads=32,seq=2048,vocab=32000")
    config = Configuration(4, 2, 2, 1)  # 4 layers a stage
    chunks = tp_overlap_chunk_ops(profile, model, Shard(4, 1, 2048, True))
    for recompute, forwards in ((Recompute.NONE, 0), (Recompute.FULL, 1)):
        off = compute_estimate(model, Training(8, recompute=recompute), config, device, profile)
        on = compute_estimate(model, Training(8, recompute=recompute, tp_overlap=True), config, device, profile)
        assert on.micro_batch_s - off.micro_batch_s == pytest.approx(
            4 * (chunks.total_s + forwards * chunks.forward_s), rel=1e-9)
