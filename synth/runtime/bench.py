"""``synth-reduce bench`` and ``synth-reduce tune``: time programs on a real
collective library, nccl-tests style, under ``mpiexec`` (backends ``mpi``,
``nccl``) or ``torchrun`` (backend ``torch``: NCCL on GPUs, gloo on CPUs).

    mpiexec -n 8 synth-reduce bench PLAN.json [options]
    mpiexec -n 8 synth-reduce bench --topology T --axes ... [--top K] [options]
    mpiexec -n 8 synth-reduce tune --topology T --axes ... --out PLAN.json [options]
    torchrun --nproc-per-node 8 -m synth.cli bench --backend torch ...

Every rank parses, synthesizes and checks the same input; setup problems are
agreed collectively, so a bad input is the same one-line error on every rank and
a nonzero exit, never a hang. Only rank 0 prints. On NCCL, rank 0 reads NCCL's
tuning log after each (program, size) and records the version and the
algorithms NCCL chose (:mod:`synth.cost.nccl_log`).

This module is the order of the work; each part is a module of its own:

* :mod:`~synth.runtime.bench_setup`: the request, the checks before the work,
  the candidates (a plan file's programs, or synthesis and the choice of the
  predicted best) and the memory check;
* :mod:`~synth.runtime.bench_measure`: each rank's data and the timing;
* :mod:`~synth.runtime.bench_report`: the table and the ``--jsonl`` records;
* :mod:`~synth.runtime.bench_tune`: ``tune``'s plan of the measured winners.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Iterator

from ..cost.nccl_log import Capture
from ..errors import SynthError
from ..interrupts import holding_interrupts
from .backends import make_world
from .bench_measure import Pipeliner, Timing, nccl_log_of, time_set, with_pipelined
from .bench_report import print_header, print_row, print_set, print_speedups, print_written, write_record
from .bench_setup import (
    BenchRequest,
    agree_on_request,
    candidate_sets,
    check_memory,
    check_request,
    collectively,
    prepare,
)
from .bench_tune import write_tuned
from .executor import World


def run(request: BenchRequest, pipeliner: Pipeliner | None = None) -> int:
    """Run ``bench`` or ``tune`` on this process's rank (under mpiexec or
    torchrun); every rank calls it with the same request (the first collective
    checks it). Only rank 0 prints. ``pipeliner`` (with ``request.pipelined``)
    gives a candidate's checked pipelined schedule for a member of its group
    (the command line compiles it: synth.export.msccl)."""
    nccl_log = request.nccl_log and request.backend in ("nccl", "torch")
    with Capture() if nccl_log else contextlib.nullcontext() as capture:
        world, interrupted = _start_world(request.backend)
        with _rank0_prints(world):
            try:
                if interrupted:
                    raise KeyboardInterrupt
                agree_on_request(world, request)
                check_request(request)
                return bench_on(world, request, capture, pipeliner)
            except SynthError:
                raise
            except KeyboardInterrupt:  # Ctrl-C or SIGINT to one rank: end the job, never leave the others waiting
                print("synth-reduce: interrupted", file=sys.stderr, flush=True)
                world.abort(130)
                raise
            except Exception:  # a bug or a library failure on some ranks: stop all, never hang
                traceback.print_exc()
                sys.stderr.flush()
                world.abort(1)
                raise
            finally:
                getattr(world, "close", lambda: None)()  # the torch backend's process group


def bench_on(world: World, request: BenchRequest, capture: Capture | None = None,
             pipeliner: Pipeliner | None = None) -> int:
    """Collective: the benchmark of a checked ``request`` on ``world``: set
    up, then per benchmark set time every candidate at every size (a row and
    a record each as it is measured), then the speedups and, for ``tune``,
    the plan."""
    setup, dtype = collectively(world, lambda: prepare(request, world))
    check_memory(world, setup, request.sizes, dtype)
    print_header(setup, request, world)
    log = nccl_log_of(world, capture)
    timings: list[Timing] = []
    for candidates in candidate_sets(setup.candidates):
        print_set(candidates)
        executors = None
        if request.pipelined and pipeliner is not None:
            candidates, executors = with_pipelined(candidates, world, pipeliner)
        for timing in time_set(world, candidates, request.sizes, dtype, request.iters, request.warmup, log,
                               executors):
            print_row(timing, request.dtype)
            write_record(world, request, timing)
            timings.append(timing)
    print_speedups(timings, request.sizes)
    print_written(request, timings)
    if request.tune:
        write_tuned(request, world, timings, request.sizes)
    return 0


def _start_world(backend: str) -> tuple[World, bool]:
    """This rank's world and whether an interrupt arrived while it was made.

    Under mpiexec an interrupt inside MPI_Init is held until the world exists,
    so that it ends the job (world.abort) instead of leaving this rank in
    MPI_Finalize at exit while the others wait for it (torchrun ends a job
    whose rank exits; its rendezvous stays interruptible)."""
    if backend in ("mpi", "nccl"):
        return holding_interrupts(lambda: make_world(backend))
    return make_world(backend), False


@contextlib.contextmanager
def _rank0_prints(world: World) -> Iterator[None]:
    if world.rank == 0:
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield
