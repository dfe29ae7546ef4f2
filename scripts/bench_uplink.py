"""What an emulated node uplink carries: one raw TCP stream between two
nodes, and MPI point-to-point between paired ranks of two nodes, each beside
the NIC bound (the payload at the shaped rate). Run under ``synth-reduce
emulate`` on a [node, rank] topology of two nodes or more:

    synth-reduce emulate --topology testbed-2x4 [--mtu 9000] -- \\
        python scripts/bench_uplink.py [--size 256M] [--iters 3] [--rate-gbit 1]

Rank 0 (node 0) and the first rank of node 1 time a raw TCP stream of
``--size`` bytes (kernel only: no MPI progress, no Python per byte). Then
every rank of node 0 exchanges ``--size / ranks-per-node`` bytes with its
counterpart on node 1 (``MPI_Sendrecv``), all at once and then one pair alone,
so each direction of the uplink carries ``--size`` bytes. Prints each time (the
slowest rank) and its ratio to the bound. docs/testbed.md records runs.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.runtime.bench_setup import parse_sizes  # noqa: E402

PORT = 45871


def _address() -> str:
    """This node's address on the emulated subnet (its only one besides loopback)."""
    words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()
    if not words:
        raise SystemExit("hostname -I: this node has no address")
    return words[0]


def raw_tcp(comm, size_bytes: int, receiver: int) -> float | None:
    """Seconds to stream ``size_bytes`` from rank ``receiver``'s node peer
    (the first rank of node 1) into rank 0; None on other ranks."""
    rank = comm.rank
    address = comm.bcast(_address() if rank == 0 else None, root=0)
    if rank == 0:
        with socket.create_server(("0.0.0.0", PORT), reuse_port=True) as server:
            comm.send(True, dest=receiver)
            conn, _ = server.accept()
            with conn:
                buffer, got = bytearray(1 << 20), 0
                started = time.perf_counter()
                while got < size_bytes:
                    n = conn.recv_into(buffer)
                    if n == 0:
                        raise SystemExit(f"raw TCP: the sender closed after {got} of {size_bytes} bytes")
                    got += n
                return time.perf_counter() - started
    if rank == receiver:
        comm.recv(source=0)
        block = b"\0" * (1 << 20)
        with socket.create_connection((address, PORT)) as conn:
            left = size_bytes
            while left:
                conn.sendall(block[:min(left, len(block))])
                left -= min(left, len(block))
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="256M", help="bytes each direction of the uplink carries (default 256M)")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--rate-gbit", type=float, default=1.0, help="the node uplink's shaped rate (default 1)")
    args = p.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    per_node = hosts.count(hosts[0])  # ranks are laid out node by node (emulate's hostfile)
    if per_node == comm.size or hosts[:per_node] != [hosts[0]] * per_node:
        raise SystemExit(f"rank 0's host {hosts[0]} holds {per_node} of {comm.size} ranks, not the first ones of "
                         "2 nodes or more: run under synth-reduce emulate")
    size = parse_sizes(args.size)[0]
    bound_s = size * 8 / (args.rate_gbit * 1e9)

    def report(label: str, times: list[float]) -> None:
        if comm.rank == 0:
            median = statistics.median(times)
            print(f"{label:<44} {median * 1e3:>9.1f} ms  bound {bound_s * 1e3:.1f} ms  ratio {median / bound_s:.3f}  "
                  f"(runs: {', '.join(f'{t / bound_s:.3f}' for t in times)})", flush=True)

    if comm.rank == 0:
        print(f"{size} bytes per direction over the node uplink at {args.rate_gbit:g} Gbit/s; median of {args.iters}",
              flush=True)
    times = []
    for _ in range(args.iters):
        comm.Barrier()
        seconds = raw_tcp(comm, size, per_node)
        times.append(comm.bcast(seconds, root=0))
    report("raw TCP, one stream", times)
    for pairs in (per_node, 1):
        n = size // pairs // 4
        sent, got = np.ones(n, np.int32), np.empty(n, np.int32)
        local = comm.rank % per_node
        active = comm.rank < 2 * per_node and local < pairs
        peer = (comm.rank + per_node) % (2 * per_node)
        times = []
        for _ in range(args.iters):
            comm.Barrier()
            started = MPI.Wtime()
            if active:
                comm.Sendrecv(sent, peer, 0, got, peer, 0)
            times.append(comm.allreduce(MPI.Wtime() - started if active else 0.0, op=MPI.MAX))
        report(f"MPI_Sendrecv, {pairs} pair(s) at once", times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
