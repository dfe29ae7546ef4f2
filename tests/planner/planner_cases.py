"""What the planner's tests share: small models, the job planner on a
named topology and model, and collectives that record their calls."""

from __future__ import annotations

import math
from pathlib import Path
from synth.planner.collectives import BareCollectives
from synth.planner.configurations import plan_job
from synth.planner.modelspec import load_model, parse_inline_model
from synth.planner.request import JobRequest
from synth.planner.stepmodel import BUCKET_GRID_BYTES, Training
from synth.synthesis.placement import parse_axis_ranges
from synth.topology import load_topology


REPO = Path(__file__).resolve().parents[2]


TINY = "layers=4,hidden=256,heads=8,seq=128,vocab=1000"


def gpt(layers=4, hidden=64, heads=4, seq=32, vocab=100):
    return parse_inline_model(f"layers={layers},hidden={hidden},heads={heads},seq={seq},vocab={vocab}")


class Recording(BareCollectives):
    """Collectives that cost a fixed time per call and record every call."""

    def __init__(self, reduce_s=1e-3, send_s=2e-3, alltoall_s=5e-3):
        self.reduce_s, self.send_s, self.alltoall_s = reduce_s, send_s, alltoall_s
        self.calls = []

    def reduce(self, axis, goal, size_bytes):
        self.calls.append(("reduce", axis, goal, size_bytes))
        return self.reduce_s * (1 + size_bytes / 2**30)

    def send(self, axis, size_bytes):
        self.calls.append(("send", axis, size_bytes))
        return self.send_s

    def alltoall(self, axis, size_bytes):
        self.calls.append(("alltoall", axis, size_bytes))
        return self.alltoall_s


def plan(topology, model, batch, axes="tp,dp,pp", micro_batches=None, **kwargs):
    topo = load_topology(topology) if isinstance(topology, str) else topology
    return plan_job(JobRequest(topo, topo.device, load_model(model), Training(batch, **kwargs),
                               parse_axis_ranges(axes), micro_batches))


MOE = "layers=4,hidden=64,heads=4,ffn=96,mlp=swiglu,seq=32,vocab=100,experts=8,top_k=2,expert_ffn=48,shared_experts=1"


class AlltoallsByBytes(BareCollectives):
    """Collectives whose all-to-alls cost their bytes at 1 GB/s, every size
    recorded, over an ep group that spans ``ep_nodes`` nodes; reductions and
    sends cost nothing."""

    def __init__(self, ep_nodes: int):
        self.ep_nodes = ep_nodes
        self.sizes: list[int] = []

    def nodes(self, axis):
        return self.ep_nodes if axis == "ep" else 1

    def reduce(self, axis, goal, size_bytes):
        return 0.0

    def send(self, axis, size_bytes):
        return 0.0

    def alltoall(self, axis, size_bytes):
        self.sizes.append(size_bytes)
        return size_bytes / 1e9


def zero1_dp_by_hand(gradient_bytes: int, backward_s: float, forward_s: float, alpha_s: float, bytes_per_s: float,
                     overlap_gather: bool = True, cost=lambda total_s, exposed_s: exposed_s) -> float:
    """ZeRO-1's data-parallel seconds by hand, the best bucket of the grid,
    each collective ``alpha_s + bytes / bytes_per_s``: the reduce-scatters
    (fp32 gradients, Megatron-LM under bf16) become ready over the last
    backward (the last one never hides), the all-gathers of the bf16 weights
    (half a bucket's bytes) after the step or, overlapped, over the next
    forward (the first one never hides). ``cost(total_s, exposed_s)``: what a
    phase of collectives costs the step (default: its exposed seconds)."""
    best = math.inf
    for bucket in [b for b in BUCKET_GRID_BYTES if b <= gradient_bytes] or BUCKET_GRID_BYTES[:1]:
        n = math.ceil(gradient_bytes / bucket)
        each = alpha_s + bucket / bytes_per_s
        weights = alpha_s + bucket / 2 / bytes_per_s
        scatter = max(each, n * each - backward_s * (1 - 1 / n))
        gather = max(weights, n * weights - forward_s * (1 - 1 / n)) if overlap_gather else n * weights
        best = min(best, cost(n * each, scatter) + cost(n * weights, gather))
    return best
