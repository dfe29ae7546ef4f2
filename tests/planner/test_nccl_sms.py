"""An NCCL collective overlapped with computation costs that computation the
SMs its kernel holds: one thread block per channel (src/enqueue.cc:1539-1541
at NVIDIA/nccl v2.27.7-1), each on one SM while the collective runs, the
computation beside it on the rest. Checked by hand: the term, the
data-parallel and ZeRO-3 steps that carry it, and the channels a collective
runs on."""

from __future__ import annotations


import pytest
from planner_cases import zero1_dp_by_hand

from synth.cost import Algorithm, Model, Predictor
from synth.cost.predict import default_program
from synth.planner.collectives import BareCollectives
from synth.planner.modelspec import parse_inline_model
from synth.planner.overlaps import mean_share, sm_held_s
from synth.planner.stepmodel import Configuration, Sharding, Training, step_shape, step_time
from synth.synthesis.placement import Placement, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

SHARE = 16 / 132  # 16 channels of an H100's 132 SMs


class Holding(BareCollectives):
    """Reductions of ``alpha + size / beta`` seconds whose kernels hold
    ``share`` of the SMs (``shares``: per goal, where they differ)."""

    def __init__(self, share=SHARE, alpha_s=1e-4, bytes_per_s=1e10, shares=None):
        self.share, self.alpha_s, self.bytes_per_s, self.shares = share, alpha_s, bytes_per_s, shares or {}

    def reduce(self, axis, goal, size_bytes):
        return self.alpha_s + size_bytes / self.bytes_per_s

    def sm_share(self, axis, goal, size_bytes):
        return self.shares.get(goal, self.share)

    def send(self, axis, size_bytes):
        return 0.0

    def alltoall(self, axis, size_bytes):
        return 0.0


def test_mean_share_slows_as_the_collectives_one_after_another():
    share = mean_share([(1.0, 16 / 132), (3.0, 8 / 132)])
    assert sm_held_s(4.0, 0.0, share) == pytest.approx(1.0 * 16 / 116 + 3.0 * 8 / 124)
    assert mean_share([(2.0, SHARE)]) == pytest.approx(SHARE)
    assert mean_share([]) == 0.0


def test_sm_held_s_by_hand():
    # the docstring's example: 0.2 s of reduce-scatter on 16 of 132 SMs, 0.01 s after the backward
    assert sm_held_s(0.2, 0.01, SHARE) == pytest.approx(0.01 + 0.19 * 16 / 116)
    # the computation beside it runs on 116 SMs: 0.19 s of its work takes 0.19 x 132 / 116
    assert sm_held_s(0.2, 0.01, SHARE) == pytest.approx(0.01 + 0.19 * 132 / 116 - 0.19)
    assert sm_held_s(0.2, 0.2, SHARE) == 0.2  # nothing beside computation: nothing slowed
    assert sm_held_s(0.2, 0.0, 0.0) == 0.0  # a collective that holds no SM (MPI's) is free when hidden


def _hidden_cost_s(comm_s: float, exposed_s: float) -> float:
    """``comm_s`` of collective, ``exposed_s`` after the window: the rest ran beside computation on 116 of 132
    SMs, which took 132 / 116 as long."""
    beside = comm_s - exposed_s
    return exposed_s + beside * 132 / 116 - beside


@pytest.mark.parametrize("t_mb", [1e-3, 10.0])  # collectives mostly exposed, and hidden entirely
def test_overlapped_reduce_scatter_and_gather_slow_the_computation_beside_them_by_hand(t_mb):
    model = parse_inline_model("layers=4,hidden=1024,heads=8,seq=256,vocab=1000")
    config = Configuration(1, 8, 1, 1)
    training = Training(8, sharding=Sharding.ZERO1, overlap_param_gather=True)
    shape = step_shape(model, training, config)
    backward = t_mb * shape.backward_fraction
    c = Holding()
    step = step_time(model, training, config, c, t_mb)
    assert step.dp_s == pytest.approx(zero1_dp_by_hand(shape.gradient_bytes, backward, t_mb - backward, c.alpha_s,
                                                       c.bytes_per_s, cost=_hidden_cost_s))
    assert step.dp_s > step_time(model, training, config, Holding(share=0.0), t_mb).dp_s


def test_zero3_gathers_and_scatters_slow_each_phase_by_hand():
    model = parse_inline_model("layers=4,hidden=256,heads=4,seq=64,vocab=100")
    config = Configuration(1, 8, 1, 1)
    training = Training(8, sharding=Sharding.ZERO3)  # one micro-batch per device
    shape = step_shape(model, training, config)
    t_mb = 1.0  # every gather and scatter hidden
    c = Holding(shares={Goal.ALLGATHER: 16 / 132, Goal.REDUCESCATTER: 8 / 132})
    step = step_time(model, training, config, c, t_mb)
    n = shape.layers_per_stage
    gather = c.reduce("dp", Goal.ALLGATHER, shape.layer_bytes)
    scatter = c.reduce("dp", Goal.REDUCESCATTER, shape.layer_bytes)  # reduced in the weights' bytes
    # the last layer's transfer never hides: it is exposed, the others slow the phase beside them
    forward = gather + (n - 1) * gather * 16 / 116
    backward = (gather + scatter) + (n - 1) * (gather * 16 / 116 + scatter * 8 / 124)
    assert step.dp_s == pytest.approx(shape.micro_batches * (forward + backward))


def _predictor(topology: str, scale: dict, axes: str, matrix, goal: Goal, algorithm: str) -> Predictor:
    topo = load_topology(topology).scaled(scale)
    return Predictor(Reduction.of(Placement(topo, parse_axes(axes), matrix), ("dp",), goal),
                     Model(Algorithm(algorithm)))


def _share(predictor: Predictor, goal: Goal, size_bytes: int) -> float:
    return predictor.sm_share(default_program(goal), ((predictor.reduction.k,),), size_bytes)


def test_nvls_all_reduce_holds_the_nvls_channels_of_an_h100():
    # 8 H100s of one node, 1 GiB: NCCL picks NVLS, whose kernel runs on comm->nvlsChannels = NVLS_NCHANNELS_SM90,
    # 16 (src/transport/nvls.cc:147, 193-198; src/enqueue.cc:1847), of the H100 SXM5's 132 SMs
    p = _predictor("dgx-h100", {"node": 2}, "dp=8,pp=2", ((1, 8), (2, 1)), Goal.ALLREDUCE, "nccl")
    assert _share(p, Goal.ALLREDUCE, 2**30) == pytest.approx(16 / 132)


def test_a_small_ring_call_runs_on_fewer_channels():
    # a ring all-gather of 64 KiB over 16 GPUs of 2 nodes: topoGetAlgoInfo drops channels while the bytes are under
    # channels x threads x threshold (enqueue.cc:1849-1853): far fewer than a 1 GiB call's
    p = _predictor("dgx-h100", {"node": 2}, "dp=16", ((2, 8),), Goal.ALLGATHER, "ring")
    assert _share(p, Goal.ALLGATHER, 2**16) < _share(p, Goal.ALLGATHER, 2**30)


def test_an_a100_has_108_sms_and_mpi_holds_none():
    nccl = _predictor("dgx-a100", {"node": 2}, "dp=16", ((2, 8),), Goal.REDUCESCATTER, "ring")
    channels = _share(nccl, Goal.REDUCESCATTER, 2**30) * 108
    assert channels == pytest.approx(round(channels)) and channels >= 1  # a whole number of A100 SMs
    mpi = _predictor("dgx-a100", {"node": 2}, "dp=16", ((2, 8),), Goal.REDUCESCATTER, "mpi")
    assert _share(mpi, Goal.REDUCESCATTER, 2**30) == 0.0


class HoldingWithSizes(Holding):
    """:class:`Holding` that knows HSDP's sub-axes' sizes, its shares per axis."""

    def __init__(self, shard, replicate, shares_by_axis):
        super().__init__()
        self.sizes, self.by_axis = {"dp_shard": shard, "dp_replicate": replicate}, shares_by_axis

    def size(self, axis):
        return self.sizes[axis]

    def sm_share(self, axis, goal, size_bytes):
        return self.by_axis[axis]


def test_hsdp_shard_and_replicate_collectives_slow_each_phase_by_hand():
    model = parse_inline_model("layers=4,hidden=256,heads=4,seq=64,vocab=100")
    config = Configuration(1, 8, 1, 1)
    training = Training(8, sharding=Sharding.HSDP)
    shape = step_shape(model, training, config)
    c = HoldingWithSizes(2, 4, {"dp_shard": 16 / 132, "dp_replicate": 4 / 132})
    step = step_time(model, training, config, c, 1.0)  # every transfer but each phase's last hidden
    n, size = shape.layers_per_stage, shape.layer_bytes
    gather = scatter = c.reduce("dp_shard", Goal.ALLGATHER, size)
    across = c.reduce("dp_replicate", Goal.ALLREDUCE, size // 2)
    forward = gather + (n - 1) * gather * 16 / 116
    backward = (gather + scatter + across) + (n - 1) * ((gather + scatter) * 16 / 116 + across * 4 / 128)
    assert step.dp_s == pytest.approx(shape.micro_batches * (forward + backward))
