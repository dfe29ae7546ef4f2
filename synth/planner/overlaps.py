"""Overlaps of communication with computation in a training step: transfers
that become ready over a compute window (data parallelism's buckets, ZeRO's
gathers, the ring of context parallelism), the tensor-parallel collectives
pipelined with their GEMMs (Transformer Engine's userbuffers), and the
expert-parallel all-to-alls run beside another micro-batch's computation
(DeepSeek-V3's DualPipe). Each gives the seconds that stay exposed, and
what the overlap costs the computation beside it where the communication
takes streaming multiprocessors from it."""

from __future__ import annotations

# Transformer Engine's userbuffers as Megatron-LM's --tp-comm-overlap sets them up: Megatron-LM (NVIDIA/Megatron-LM
# at f2e5db402c, the README's H100 runs) passes an empty config (megatron/training/initialize.py:197-210) to
# initialize_ub(shape, tp_size, ...), the signature of Transformer Engine up to v1.7 (NVIDIA/TransformerEngine at
# 4e7caa1c3, transformer_engine/pytorch/module/base.py:64-69), whose defaults are: ring_exchange for the forward
# all-gathers and the backward's output-gradient all-gathers (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad), pipeline
# for the forward reduce-scatters (proj_fprop, fc2_fprop), bulk for the backward beside the QKV and MLP-up input and
# weight gradients (qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad) (base.py:88-92); num_sm 16, set_sm_margin 0
# (base.py:110, 112, 219-226); num_splits 4 for pipeline, none for the others (base.py:225).
# Transformer Engine from v2.0 sets an SM margin for pipeline and bulk (NVIDIA/TransformerEngine at d0067d0da,
# base.py:384-387), so those GEMMs run on 116 SMs throughout; that is not the release the README's runs could call,
# and not modelled here.
TP_OVERLAP_SMS, HOPPER_SMS = 16, 132  # the pipeline and bulk kernels' SMs (base.py:110), of an H100's 132
TP_OVERLAP_SM_SHARE = TP_OVERLAP_SMS / HOPPER_SMS
# pipeline: the GEMM and its reduce-scatter in 4 chunks (base.py:199, 225; comm_gemm_overlap.h:336); with no margin
# the GEMM is launched on every SM (comm_gemm_overlap.h:118). The last chunk's reduce-scatter runs on UB_MAX_SM = 32
# SMs (comm_gemm_overlap.h:25, 419), alone; its time is taken as the others'.
TP_OVERLAP_PIPELINE_SPLITS = 4
# DeepSeek-V3 (arXiv:2412.19437, Section 3.2.2): "only 20 SMs are sufficient to fully utilize the bandwidths of IB
# and NVLink" for its all-to-all kernels overlapped with computation, of the H800's 132
EP_OVERLAP_SMS = 20
EP_OVERLAP_SM_SHARE = EP_OVERLAP_SMS / HOPPER_SMS


def slowed_s(compute_s: float, sm_share: float) -> float:
    """What ``compute_s`` of computation costs more when ``sm_share`` of the
    GPU's SMs run communication beside it (the rest run it, proportionally
    slower)."""
    return compute_s * sm_share / (1 - sm_share)


def sm_held_s(comm_s: float, exposed_s: float, sm_share: float) -> float:
    """Exposed seconds of an NCCL collective of ``comm_s`` overlapped with
    computation, ``exposed_s`` of it outlasting the compute window (the
    overlap's own term: :func:`overlapped_s`, :func:`overlapped_mixed_s`,
    :func:`chunked_overlap_s`), counting what it costs the computation
    beside it: NCCL runs one thread block per channel, each on one SM for the
    kernel's life (``grid = {nChannels}``, src/enqueue.cc:1539-1541 at
    NVIDIA/nccl v2.27.7-1), so for the ``comm_s - exposed_s`` the collective
    runs beside the computation, that computation runs on the ``1 - sm_share``
    of the SMs it leaves (``sm_share``: its channels over the device's SMs,
    :meth:`synth.cost.Predictor.sm_share`). ``exposed + slowed_s(comm -
    exposed, sm_share)``; with the window at least as long as the collective
    and nothing exposed, ``slowed_s(min(comm, window), sm_share)``.

    Worked example: a gradient reduce-scatter of 0.2 s on 16 channels of an
    H100's 132 SMs, 0.01 s of it after the backward: 0.01 + 0.19 x 16 / 116
    = 0.036207 s."""
    return exposed_s + slowed_s(max(0.0, comm_s - exposed_s), sm_share)


def mean_share(parts: list[tuple[float, float]]) -> float:
    """The one SM share that slows computation as much as several
    collectives run one after another beside it, ``(seconds, sm_share)``
    each: :func:`slowed_s` of their seconds together at it is the sum of
    theirs (the slowdowns ``share / (1 - share)`` averaged by seconds); 0 when
    they take none. Of 1 s at 16/132 and 1 s at 8/132: slowdowns 16/116 and
    8/124, mean 0.10120, share 0.10120 / 1.10120."""
    total = sum(seconds for seconds, _ in parts)
    if total <= 0:
        return 0.0
    slowdown = sum(slowed_s(seconds, share) for seconds, share in parts) / total
    return slowdown / (1 + slowdown)


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


def beside_s(gemm_s: float, comm_s: float, sm_share: float) -> float:
    """Wall seconds of a GEMM of ``gemm_s`` (alone, on every SM) started
    together with a communication kernel of ``comm_s`` that holds
    ``sm_share`` of the SMs while it runs, the GEMM given no SM margin (it is
    launched on all of them and runs on what the kernel leaves): while both
    run the GEMM goes at ``1 - sm_share`` of its speed. ``max(comm, gemm +
    sm_share x comm)``: the GEMM ends ``sm_share x comm`` late if it outlasts
    the kernel, else the kernel ends last."""
    return max(comm_s, gemm_s + sm_share * comm_s)


def ring_exchange_exposed_s(gather_s: float, gemm_s: float, tp: int) -> float:
    """Exposed seconds of Transformer Engine's ring-exchange all-gather
    (``split_overlap_ag``, transformer_engine/pytorch/csrc/comm_gemm_overlap.h:769-939 at 4e7caa1c3): the
    GEMM runs in ``tp`` chunks, the first on the rank's own shard, each next
    one on the shard the previous ring step brought; the ``tp - 1`` steps
    (``gather_s / (tp - 1)`` each, the all-gather's time) go by copy engine
    (``use_ce`` 1 for the P2P overlap, comm_gemm_overlap.h:566;
    userbuffers/userbuffers.cu:2334, 2347-2352: a ``cudaMemcpyAsync`` and one-thread
    signal kernels), so they take no SMs from the GEMM.
    ``(tp - 1) max(0, step - gemm / tp)`` = ``max(0, gather - gemm (1 - 1/tp))``."""
    if tp < 2:
        return 0.0
    return max(0.0, gather_s - gemm_s * (1 - 1 / tp))


def pipeline_exposed_s(scatter_s: float, gemm_s: float, sm_share: float = TP_OVERLAP_SM_SHARE,
                       splits: int = TP_OVERLAP_PIPELINE_SPLITS) -> float:
    """Exposed seconds of Transformer Engine's pipelined GEMM and
    reduce-scatter (``split_overlap_rs``, comm_gemm_overlap.h:320-481 at
    4e7caa1c3, called with ``gemm_overlap`` true: cpp_extensions/gemm.py:120-125): the GEMM in ``splits`` chunks, each chunk's reduce-scatter
    (``scatter_s / splits``, on ``sm_share`` of the SMs) after it, beside the
    next chunk's GEMM (:func:`beside_s`); the first chunk's GEMM runs alone
    and the last chunk's reduce-scatter after the whole GEMM.
    ``scatter / splits + (1 - 1/splits) max(scatter - gemm, sm_share x scatter)``."""
    return scatter_s / splits + (1 - 1 / splits) * max(scatter_s - gemm_s, sm_share * scatter_s)


def bulk_exposed_s(comm_s: float, gemm_s: float, sm_share: float = TP_OVERLAP_SM_SHARE) -> float:
    """Exposed seconds of Transformer Engine's bulk overlap (``bulk_overlap``,
    comm_gemm_overlap.h:141-207, NVIDIA/TransformerEngine at 4e7caa1c3): the whole collective on
    ``sm_share`` of the SMs started with the whole GEMM, unsplit
    (:func:`beside_s` less the GEMM): ``max(comm - gemm, sm_share x comm)``."""
    return beside_s(gemm_s, comm_s, sm_share) - gemm_s


def tp_overlap_exposed_s(gather_s: float, scatter_s: float, gemms_s: list[float], tp: int) -> tuple[float, float]:
    """Exposed seconds of one layer's tensor-parallel collectives (with
    sequence parallelism) in a forward and in a backward pass under
    Megatron-LM's ``--tp-comm-overlap`` with Transformer Engine's default
    userbuffers (the constants above; ``gemms_s``: the forward QKV,
    projection, MLP-up and MLP-down GEMMs, each backward GEMM, input or
    weight gradient, as long as its forward one):

    - forward: the all-gather before QKV and before MLP-up by ring exchange
      (:func:`ring_exchange_exposed_s`), the reduce-scatter after the
      projection and after MLP-down pipelined in 4 chunks
      (:func:`pipeline_exposed_s`);
    - backward: the output gradient's all-gather before the projection's and
      MLP-down's input-gradient GEMMs by ring exchange; for QKV and MLP-up
      (Megatron-LM's LayerNorm-and-linear modules, ``ub_bulk_dgrad`` and
      ``ub_bulk_wgrad`` on by default: model_parallel_config.py:152-160 at
      f2e5db402c) the all-gather of the normalised input, needed by the weight
      gradient, beside the input-gradient GEMM, and the input gradient's
      reduce-scatter beside the weight-gradient GEMM, both bulk
      (:func:`bulk_exposed_s`): four all-gathers and two reduce-scatters.

    Worked example, tp 8, all-gather and reduce-scatter 0.8 ms each, GEMMs
    QKV 1.2, projection 0.4, MLP up and down 1.6 ms, SM share 16/132:
    forward 0 + (0.2 + 0.75 x 0.4) + 0 + (0.2 + 0.75 x 0.8 x 16/132) = 0.7727
    ms; backward (0.8 - 0.35) + 0 + 4 x 0.8 x 16/132 = 0.8379 ms."""
    qkv, proj, up, down = gemms_s
    forward = (ring_exchange_exposed_s(gather_s, qkv, tp) + pipeline_exposed_s(scatter_s, proj)
               + ring_exchange_exposed_s(gather_s, up, tp) + pipeline_exposed_s(scatter_s, down))
    backward = (ring_exchange_exposed_s(gather_s, proj, tp) + ring_exchange_exposed_s(gather_s, down, tp)
                + bulk_exposed_s(gather_s, qkv) + bulk_exposed_s(scatter_s, qkv)
                + bulk_exposed_s(gather_s, up) + bulk_exposed_s(scatter_s, up))
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
