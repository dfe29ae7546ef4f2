"""Train a small model with DDP whose gradient buckets are averaged by a plan's
program instead of one all-reduce.

    synth-reduce --topology testbed-2x4 --axes dp=8 --out plan.json
    torchrun --nproc-per-node 8 examples/torch_ddp.py --plan plan.json

Runs on gloo with CPU tensors, or on NCCL with one GPU per rank when CUDA is
available. On a cluster, launch one torchrun per plan node with ``--node-rank``
= the plan's node index so that torch rank = the plan's device id. DDP runs over
the plan's ``dp`` allreduce when it has one (a job plan from ``synth-reduce plan
--sharding none``), else over its only allreduce of one axis (DDP's process
group is that axis' group).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import synth
import synth.torch


def ddp_axes(plan: synth.Plan) -> tuple[str, ...]:
    """The axis DDP averages over: the plan's dp allreduce, else its only allreduce."""
    allreduces = [r.reduction.axes for r in plan.reductions if r.reduction.goal is synth.Goal.ALLREDUCE]
    if ("dp",) in allreduces:
        return ("dp",)
    if "dp" in plan.placement.axis_names and plan.placement.axes[plan.placement.axis_names.index("dp")].size > 1:
        if plan.job is not None:
            raise synth.SynthError("the plan's dp gradients are not all-reduced (sharded optimizer: reduce-scatter "
                                   "and all-gather); DDP needs a plan written with synth-reduce plan --sharding none")
        reduced = " and ".join(",".join(a) for a in allreduces) or "nothing"
        raise synth.SynthError(f"the plan all-reduces over {reduced}, not over its dp axis; write the plan with "
                               "--reduce dp")
    axes = plan.find(goal="allreduce").reduction.axes
    if len(axes) != 1:
        raise synth.SynthError(f"this example runs DDP over one axis; the plan reduces over {','.join(axes)}")
    return axes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="a plan written by synth-reduce --out or tune")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    try:  # every rank reads the same file: the same error everywhere, before any connection is made
        plan = synth.load_plan(args.plan)
        axes = ddp_axes(plan)
    except synth.SynthError as exc:
        os.write(2, f"torch_ddp.py: error: {exc}\n".encode())  # one write: ranks' lines never interleave
        return 2

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts it)
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)

        # the three lines: the plan's mesh, DDP on the axis' group, the plan's hook
        mesh = synth.torch.device_mesh(plan, device.type)
        model = DDP(net, process_group=mesh.get_group(axes[0]), bucket_cap_mb=0.01)
        model.register_comm_hook(model.process_group, synth.torch.comm_hook(plan, axes))

        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        generator = torch.Generator().manual_seed(rank)  # each rank its own data
        for step in range(1, args.steps + 1):
            x = torch.randn(64, 32, generator=generator).to(device)
            y = x[:, :1] * 2 - x[:, 1:2]
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)

        # every rank of a DDP group must hold the same parameters
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        group = mesh.get_group(axes[0])
        copies = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
        dist.all_gather(copies, flat, group=group)
        same = all(torch.equal(c, flat) for c in copies)
        if rank == 0:
            print("parameters equal on every rank of each group" if same else "parameters DIFFER", flush=True)
        return 0 if same else 1
    except synth.SynthError as exc:
        print(f"torch_ddp.py: error: {exc}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
