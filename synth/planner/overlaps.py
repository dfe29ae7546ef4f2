"""Overlaps of communication with computation in a training step: transfers
that become ready over a compute window (data parallelism's buckets, ZeRO's
gathers, the ring of context parallelism), the tensor-parallel collectives
pipelined with their GEMMs (Transformer Engine's userbuffers), and the
expert-parallel all-to-alls run beside another micro-batch's computation
(DeepSeek-V3's DualPipe). Each gives the seconds that stay exposed, and
what the overlap costs the computation beside it where the communication
takes streaming multiprocessors from it."""

from __future__ import annotations

# Transformer Engine's userbuffers (transformer_engine/pytorch/module/base.py, initialize_ub's defaults): the
# "pipeline" (reduce-scatter after the projection and MLP-down GEMMs) and "bulk" (beside the QKV and MLP-up input
# gradients) overlaps run their communication on 16 SMs and set the GEMM's SM margin, so those GEMMs run on the
# others; "ring_exchange" (the all-gathers) uses 1 SM and copy engines, no margin. Of an H100's 132 SMs.
TP_OVERLAP_SMS, HOPPER_SMS = 16, 132
TP_OVERLAP_SM_SHARE = TP_OVERLAP_SMS / HOPPER_SMS
# DeepSeek-V3 (arXiv:2412.19437, Section 3.2.2): "only 20 SMs are sufficient to fully utilize the bandwidths of IB
# and NVLink" for its all-to-all kernels overlapped with computation, of the H800's 132
EP_OVERLAP_SMS = 20
EP_OVERLAP_SM_SHARE = EP_OVERLAP_SMS / HOPPER_SMS


def slowed_s(compute_s: float, sm_share: float) -> float:
    """What ``compute_s`` of computation costs more when ``sm_share`` of the
    GPU's SMs run communication beside it (the rest run it, proportionally
    slower)."""
    return compute_s * sm_share / (1 - sm_share)


def overlapped_mixed_s(transfers: list[tuple[int, float]], window_s: float) -> float:
    """:func:`overlapped_s` of several kinds of transfers, ``(count,
    seconds each)``, ready evenly over the window one after another: the
    longest one is taken as the last, which never overlaps. Equal to
    :func:`overlapped_s` for one kind."""
    count = sum(n for n, _ in transfers)
    if count < 1:
        return 0.0
    total = sum(n * each for n, each in transfers)
    return max(max(each for n, each in transfers if n), total - window_s * (1 - 1 / count))


def overlapped_s(count: int, each_s: float, window_s: float) -> float:
    """Exposed seconds of ``count`` equal transfers of ``each_s`` that become
    ready evenly over a compute window of ``window_s`` (transfer ``i`` ready at
    ``(i + 1) window / count``, one at a time): the last one never overlaps, and
    more transfer time than window shows. ``max(each, count x each - window x
    (1 - 1/count))``."""
    if count < 1:
        return 0.0
    return max(each_s, count * each_s - window_s * (1 - 1 / count))


def chunked_overlap_s(total_s: float, chunks: int, window_s: float) -> float:
    """Exposed seconds of a data-parallel transfer of ``total_s`` split over
    the ``chunks`` model chunks of the interleaved schedule, each chunk's part
    sent at once, one chunk after another, ``window_s / chunks`` apart, the
    last one where the step needs it: :func:`overlapped_s` of ``chunks``
    transfers of ``total_s / chunks`` over ``window_s``, i.e. ``max(total /
    chunks, total - window (1 - 1/chunks))``.

    Megatron-LM (NVIDIA/Megatron-LM at d98e8a64dd) launches each chunk's
    gradient reduction whole (``start_grad_sync``, megatron/training/training.py:4357)
    when that chunk's last micro-batch's backward has run, at the same time
    on every pipeline rank (megatron/core/pipeline_parallel/schedules.py:1438-1455;
    the remaining chunks after the cool-down, 2063-2069): in the cool-down the
    chunks' backwards run in groups of pp micro-batches (the schedule table,
    ``microbatch_group_size_per_vp_stage`` = pp), so consecutive chunks'
    reductions start pp chunk-backwards apart, ``window_s`` = pp micro-batch
    backwards, and the first chunk's, launched last, overlaps nothing. With
    ``--overlap-param-gather`` it all-gathers the first two chunks' weights at
    the start of the step and each further chunk's as the forward of the
    chunk before it begins (schedules.py:1219-1221, 1341-1352): the same
    form, ``window_s`` = pp micro-batch forwards."""
    return overlapped_s(chunks, total_s / chunks, window_s)


def tp_overlap_exposed_s(gather_s: float, scatter_s: float, gemms_s: list[float], tp: int) -> tuple[float, float]:
    """Exposed seconds of one layer's tensor-parallel collectives in a forward
    and in a backward pass when each is overlapped with the GEMM it feeds or follows (Megatron-LM's
    ``--tp-comm-overlap``: Transformer Engine splits the GEMM and the
    collective into ``tp`` chunks and pipelines them). A collective of ``c``
    seconds beside a GEMM of ``g`` shows ``max(c / tp, c - g)``: the first
    chunk never overlaps, and no more than the GEMM can be hidden. Forward:
    all-gather with QKV, reduce-scatter with the projection, all-gather with
    the MLP's up, reduce-scatter with its down GEMM; the backward pairs the
    transposed collectives with the same GEMMs' input-gradient halves (the
    same FLOPs; ``gemms_s``: QKV, projection, up, down). A GEMM beside a
    reduce-scatter (forward: projection and down; backward: QKV and up) runs
    on the SMs the communication leaves (:data:`TP_OVERLAP_SM_SHARE`): its
    extra time is added (:func:`slowed_s`)."""
    qkv, proj, up, down = gemms_s

    def shown(c: float, g: float) -> float:
        return max(c / tp, c - g)

    def margin(g: float) -> float:  # the GEMM on the SMs the reduce-scatter's kernels leave it
        return slowed_s(g, TP_OVERLAP_SM_SHARE)

    forward = (shown(gather_s, qkv) + shown(scatter_s, proj) + margin(proj) + shown(gather_s, up)
               + shown(scatter_s, down) + margin(down))
    backward = (shown(scatter_s, qkv) + margin(qkv) + shown(gather_s, proj) + shown(scatter_s, up) + margin(up)
                + shown(gather_s, down))
    return forward, backward


def ep_overlap_exposed_s(alltoall_s: float, window_s: float) -> float:
    """Exposed seconds of one MoE layer's all-to-alls of one micro-batch
    (dispatch and combine, every pass: ``alltoall_s`` together) run beside
    another micro-batch's computation of that layer (``window_s``: its
    forward and backward), as DeepSeek-V3's DualPipe pairs a forward chunk
    with a backward chunk: what outlasts the window shows, and the computation
    beside the all-to-alls runs on the SMs they leave
    (:data:`EP_OVERLAP_SM_SHARE`), for as long as they run."""
    return max(0.0, alltoall_s - window_s) + slowed_s(min(alltoall_s, window_s), EP_OVERLAP_SM_SHARE)
