"""DDP step time with the plan's communication hook against default DDP, side
by side in one run (8 gloo ranks on CPU under torchrun; NCCL where GPUs are).

    python scripts/bench_ddp_hook.py [--ranks 8] [--steps 12] [--hidden 1024]

Launches itself under ``torchrun --standalone``. Every rank trains the same MLP
(``--layers`` x ``--hidden``, buckets of DDP's default 25 MiB) with, in turn,
default DDP, the hook with a one-step program (``AllReduce(root, inside)``:
what DDP itself runs), the hook with the three-step BlueConnect program
(ReduceScatter inside the node, AllReduce across, AllGather inside) on a plan
for 2 nodes x 4 ranks, and the same three-step hook made blocking (it waits
for its future before returning: the hook before it overlapped backward).
Configurations alternate step by step so that load changes hit all alike; the
table shows each one's median step time (slowest rank) and its ratio to
default DDP. Results and the machine they came from: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import synth.torch
    from synth.plan import Plan
    from synth.synthesis.language import parse_program
    from synth.synthesis.lowering import lower
    from synth.synthesis.placement import Placement, parse_axes
    from synth.synthesis.reduction import Reduction
    from synth.topology import load_topology

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    topology = load_topology("testbed-2x4").scaled({"rank": n // 2})
    reduction = Reduction.of(Placement(topology, parse_axes(f"dp={n}"), ((2, n // 2),)), ["dp"])
    plans = {name: Plan.single(lower(parse_program(text), reduction), reduction)
             for name, text in (("one step", "AllReduce(root, inside)"), ("three steps", BLUECONNECT))}

    def model() -> nn.Module:
        torch.manual_seed(0)
        layers = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
        return nn.Sequential(*layers)

    def blocking(hook):
        def wrapped(state, bucket):
            future = hook(state, bucket)
            future.wait()
            return future
        return wrapped

    configs = {"default DDP": DDP(model())}
    for name, plan in plans.items():
        ddp = DDP(model())
        ddp.register_comm_hook(ddp.process_group, synth.torch.comm_hook(plan))
        configs[f"hook, {name}"] = ddp
    ddp = DDP(model())
    ddp.register_comm_hook(ddp.process_group, blocking(synth.torch.comm_hook(plans["three steps"])))
    configs["hook, three steps, blocking"] = ddp
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in configs.items()}
    times: dict[str, list[float]] = {name: [] for name in configs}
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.hidden, generator=generator)
    for step in range(args.warmup + args.steps):
        for name, m in configs.items():  # alternate: load changes hit every configuration alike
            dist.barrier()
            start = time.perf_counter()
            loss = m(x).square().mean()
            optimizers[name].zero_grad()
            loss.backward()
            optimizers[name].step()
            elapsed = time.perf_counter() - start
            slowest = torch.tensor([elapsed])
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if step >= args.warmup:
                times[name].append(float(slowest))
    if rank == 0:
        parameters = sum(p.numel() for p in configs["default DDP"].parameters())
        print(f"# {n} gloo ranks, MLP {args.layers} x {args.hidden} ({parameters * 4 / 2**20:.0f} MiB of fp32 "
              f"gradients), batch {args.batch}, {args.steps} steps after {args.warmup}, alternating")
        base = statistics.median(times["default DDP"])
        print(f"{'configuration':<30} {'median step':>12} {'min':>9} {'max':>9} {'vs default':>11}")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{name:<30} {median * 1e3:>9.1f} ms {min(values) * 1e3:>6.1f} ms {max(values) * 1e3:>6.1f} ms "
                  f"{median / base:>10.2f}x")
    dist.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ranks < 4 or args.ranks % 2:
        parser.error("--ranks: an even number >= 4 (2 nodes)")
    if args.worker:
        return worker(args)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
               __file__, "--worker", *sys.argv[1:]]
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
