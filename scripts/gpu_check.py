"""The GPU-only checks of synth-reduce; run through scripts/gpu_check.sh, which
refuses to start without a GPU. Prints one line per check (``PASS``, ``FAIL`` or
``SKIP``, the check's name, what it found) after a header naming the machine and
the libraries, and a summary line; exit 1 if a check failed.

    python scripts/gpu_check.py --gpus N          # the report
    torchrun --nproc-per-node N scripts/gpu_check.py --executor   # one of its checks

Single-rank checks run on any GPU: every collective of the CuPy NCCL backend
(``synth.runtime.backends``) and of the torch backend (``synth.torch``) on one-member
communicators, whose sum, scatter, gather and broadcast must leave the GPU
buffer as it was, in every dtype the backends claim. With two GPUs or more, one
rank per GPU: the torch executor on every allreduce program of a placement and
on a reducescatter and an allgather program against the numpy reference, and
``bench`` on GPU buffers (torch; CuPy under mpiexec when mpi4py is there),
whose records must name the NCCL version and NCCL's logged choices; and, with
``MSCCL_NCCL_LIB`` naming the MSCCL executor build's ``libnccl.so``,
all-reduces through torch with a plan's exported MSCCL XMLs loaded, at 64 MiB
and at a size where every step runs one chunk per piece (>= 256 MiB), whose
NCCL log must show an MSCCL kernel and whose results must be exact
(docs/nccl-programs.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")


def host_data(name: str) -> np.ndarray:
    """Small integers, exact in every dtype (bfloat16 through ml_dtypes)."""
    from synth.runtime.bench_setup import numpy_dtype

    return (np.arange(24) % 7 - 3).astype(numpy_dtype(name))


def identity_checks(comm, to_device, to_host, empty) -> list[str]:
    """On a one-member communicator every collective must leave the data as it
    was; returns what differed."""
    wrong = []
    for name in DTYPES:
        try:
            host = host_data(name)
            for op in ("allreduce", "allgather", "reduce", "bcast"):
                a = to_device(host)
                getattr(comm, op)(a)
                if not np.array_equal(to_host(a), host.astype(np.float64)):
                    wrong.append(f"{op} {name}")
            a, out = to_device(host), empty(a, host.size)
            comm.reduce_scatter(a, out)
            if not np.array_equal(to_host(out), host.astype(np.float64)):
                wrong.append(f"reduce_scatter {name}")
        except Exception as exc:  # a dtype or call the library refuses: reported, the others still run
            wrong.append(f"{name}: {type(exc).__name__}: {exc}")
    return wrong


def check_cupy() -> tuple[str, str]:
    from synth.cost.nccl_log import version_text
    from synth.errors import SynthError
    from synth.runtime.backends import _NCCLComm, import_cupy_nccl

    try:
        cupy, nccl = import_cupy_nccl()
    except SynthError as exc:
        return "SKIP", str(exc)
    comm = _NCCLComm(nccl.NcclCommunicator(1, nccl.get_unique_id(), 0), 0, 1, cupy, nccl)

    def to_host(a):
        cupy.cuda.get_current_stream().synchronize()
        return cupy.asnumpy(a).astype(np.float64)

    wrong = identity_checks(comm, cupy.asarray, to_host, lambda a, n: cupy.empty(n, dtype=a.dtype))
    detail = f"5 collectives x {len(DTYPES)} dtypes, NCCL {version_text(nccl.get_version())}"
    return ("FAIL", f"{detail}; wrong: {'; '.join(wrong)}") if wrong else ("PASS", detail)


def check_torch() -> tuple[str, str]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return "SKIP", f"no torch ({exc})"
    if not torch.cuda.is_available():
        return "FAIL", "torch does not see the GPU (a CPU build of torch?); install torch with CUDA"
    import synth.torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        world = synth.torch.world()
        comm = world.split([(0,)])
        wrong = identity_checks(comm, lambda a: world.xp.asarray(a),
                                lambda t: t.float().cpu().numpy().astype(np.float64),
                                lambda a, n: torch.empty(n, dtype=a.dtype, device=a.device))
        problem = world.buffer_problem(torch.zeros(3))
        if not problem or "move it with tensor.to('cuda:0')" not in problem:
            wrong.append(f"a CPU tensor is not refused clearly: {problem!r}")
        detail = f"5 collectives x {len(DTYPES)} dtypes on {world.device}, NCCL {world.nccl_version}"
        return ("FAIL", f"{detail}; wrong: {'; '.join(wrong)}") if wrong else ("PASS", detail)
    finally:
        dist.destroy_process_group()


MSCCL_CHECK = "all-reduce with an exported MSCCL XML (MSCCL executor build)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scale(gpus: int) -> tuple[str, str]:
    """testbed-2x4 rescaled to ``gpus`` devices (two nodes when it divides)."""
    return (f"node=2,rank={gpus // 2}", f"dp={gpus}") if gpus % 2 == 0 else (f"node=1,rank={gpus}", f"dp={gpus}")


def run(command: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


def check_executor(gpus: int) -> tuple[str, str]:
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
                "scripts/gpu_check.py", "--executor"])
    found = re.search(r"^executor: (PASS|FAIL) (.*)$", done.stdout, re.M)
    if done.returncode or not found:
        return "FAIL", f"exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}"
    return found[1], found[2]


def executor_worker() -> int:
    """Under torchrun, one rank per GPU: every allreduce program of the
    rescaled testbed and its reducescatter and allgather programs, lengths 1, 7,
    4099, float32/float16/bfloat16, against the numpy reference."""
    import torch
    import torch.distributed as dist

    import synth.torch
    from synth.plan import Plan
    from synth.runtime.bench_measure import rank_data
    from synth.runtime.bench_setup import numpy_dtype
    from synth.runtime.executor import reference
    from synth.synthesis.lowering import lower
    from synth.synthesis.placement import enumerate_placements, parse_axes
    from synth.synthesis.reduction import Reduction
    from synth.synthesis.search import synthesize_reduction
    from synth.synthesis.semantics import Goal
    from synth.topology import load_topology, parse_scale

    world = synth.torch.init_process_group()
    counts, axes = scale(world.size)
    topology = load_topology("testbed-2x4").scaled(parse_scale(counts))
    placement = enumerate_placements(topology, parse_axes(axes))[0]
    wrong, runs = [], 0
    for goal in Goal:
        result = synthesize_reduction(Reduction.of(placement, ["dp"], goal), 5)
        programs = result.programs if goal is Goal.ALLREDUCE else result.programs[:1]
        for program in programs:
            lowered = lower(program, result.reduction)
            executor = synth.torch.Executor(Plan.single(lowered, result.reduction))
            for length in (1, 7, 4099):
                for name in ("float32", "float16", "bfloat16"):
                    dtype = numpy_dtype(name)
                    data = [rank_data(lowered, r, length, dtype) for r in range(world.size)]
                    want = reference(lowered, np.stack([d.input for d in data]))[world.rank].astype(np.float64)
                    buffer = world.xp.asarray(data[world.rank].input)
                    executor(buffer)
                    got = buffer.float().cpu().numpy().astype(np.float64)
                    runs += 1
                    if not np.array_equal(got, want):
                        wrong.append(f"{goal.value} {program} length {length} {name}")
    everyone = world.allgather(wrong)
    if world.rank == 0:
        bad = [w for ws in everyone for w in ws]
        verdict = "FAIL" if bad else "PASS"
        print(f"executor: {verdict} {runs} runs per rank on {world.size} GPUs ({torch.cuda.get_device_name()}), "
              f"NCCL {world.nccl_version}" + (f"; wrong: {bad[:3]}" if bad else ""), flush=True)
    dist.destroy_process_group()
    return 0


def check_bench(gpus: int, backend: str) -> tuple[str, str]:
    counts, axes = scale(gpus)
    if backend == "torch":
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus)]
    else:
        try:
            import mpi4py  # noqa: F401
        except ImportError as exc:
            return "SKIP", f"no mpi4py ({exc}); pip install '.[mpi]'"
        mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
        launch = [mpiexec, "-n", str(gpus), "--oversubscribe", "--bind-to", "none", sys.executable]
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("float32", "float16", "bfloat16"):
            jsonl = Path(tmp) / f"{dtype}.jsonl"
            done = run([*launch, "-m", "synth.cli", "bench", "--backend", backend, "--topology", "testbed-2x4",
                        "--scale", counts, "--axes", axes, "--sizes", "4K,1M", "--iters", "5", "--warmup", "2",
                        "--top", "2", "--dtype", dtype, "--jsonl", str(jsonl)])
            if done.returncode:
                notes.append(f"{dtype}: exit {done.returncode}: {(done.stdout + done.stderr)[-600:]}")
                continue
            rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s+\d+/\d+\s+\d+\s", line)]
            records = [json.loads(line) for line in jsonl.read_text().splitlines()]
            if not rows or any(row[-1] != "0" for row in rows):
                notes.append(f"{dtype}: #wrong not 0 everywhere")
            if not records or not all(r.get("nccl_version") and r.get("nccl_choices") for r in records):
                notes.append(f"{dtype}: records without nccl_version or nccl_choices")
            else:
                first = records[0]["nccl_choices"][0]
                notes.append(f"{dtype} ok (NCCL {records[0]['nccl_version']}, e.g. {first['collective']} "
                             f"{first['size_bytes']} B: {first['algorithm']}/{first['protocol']})")
    failed = [n for n in notes if " ok " not in n]
    return ("FAIL" if failed else "PASS"), "; ".join(notes)


def check_msccl(gpus: int) -> tuple[str, str]:
    """An all-reduce with an exported MSCCL XML loaded: the MSCCL executor
    build of NCCL (``MSCCL_NCCL_LIB``, preloaded under torch) must log that it
    ran an MSCCL kernel and the result must be exact."""
    library = os.environ.get("MSCCL_NCCL_LIB")
    if not library:
        return "SKIP", ("no MSCCL executor build: build github.com/Azure/msccl-executor-nccl and set MSCCL_NCCL_LIB "
                        "to its libnccl.so")
    if not Path(library).is_file():
        return "FAIL", f"MSCCL_NCCL_LIB={library}: no such file"
    counts, axes = scale(gpus)
    with tempfile.TemporaryDirectory() as tmp:
        plan, algos = Path(tmp) / "plan.json", Path(tmp) / "algos"
        done = run([sys.executable, "-m", "synth.cli", "--topology", "testbed-2x4", "--scale", counts, "--axes", axes,
                    "--size", "64MiB", "--out", str(plan)])
        if done.returncode == 0:
            done = run([sys.executable, "-m", "synth.cli", "export", str(plan), "--format", "msccl", "--out",
                        str(algos), "--json"])
        if done.returncode:
            return "FAIL", f"export: exit {done.returncode}: {(done.stdout + done.stderr)[-800:]}"
        chunks = math.lcm(*(f["nchunksperloop"] for f in json.loads(done.stdout)["files"]))
        env = dict(os.environ, LD_PRELOAD=library, NCCL_MSCCL_ENABLE="1", MSCCL_ALGO_DIR=str(algos),
                   NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,COLL", SYNTH_MSCCL_CHUNKS=str(chunks),
                   SYNTH_MSCCL_SIZES=",".join(str(s) for s in msccl_sizes(chunks)))
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               str(gpus), "scripts/gpu_check.py", "--msccl-worker"], cwd=REPO, capture_output=True,
                              text=True, timeout=600, env=dict(env, PYTHONPATH=str(REPO)))
    log = done.stdout + done.stderr
    found = re.search(r"^msccl: (PASS|FAIL) (.*)$", done.stdout, re.M)
    if done.returncode or not found:
        return "FAIL", f"exit {done.returncode}: {log[-1500:]}"
    if found[1] == "PASS" and "MSCCL: Setup Kernel finished" not in log:
        return "FAIL", f"{found[2]}, but NCCL's log has no 'MSCCL: Setup Kernel finished': the XML was not used"
    return found[1], found[2]


# Simple's chunk effective size with NCCL's default 4 MiB buffer (msccl-executor-nccl msccl_setup.cc:46-52): above
# this many bytes per xml chunk the executor runs every step one chunk per piece, over more than one loop iteration
SIMPLE_CHUNK_BYTES = 2 * 2**20


def msccl_sizes(chunks: int) -> tuple[int, int]:
    """The all-reduce sizes the MSCCL check runs: 64 MiB, and one where every
    piece is one chunk and the kernel loops more than once (>= 256 MiB; 2 MiB
    and more per xml chunk), where a ring that fills its connections hangs."""
    return 64 * 2**20, max(256 * 2**20, 2 * chunks * SIMPLE_CHUNK_BYTES)


def msccl_worker() -> int:
    """Under torchrun with the MSCCL build preloaded: an all-reduce at each
    size of ``SYNTH_MSCCL_SIZES`` (a multiple of the files' chunks) on
    integer-valued float32, exact."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    chunks = int(os.environ["SYNTH_MSCCL_CHUNKS"])
    results = []
    for nbytes in (int(s) for s in os.environ["SYNTH_MSCCL_SIZES"].split(",")):
        n = (nbytes // 4) // chunks * chunks
        values = torch.arange(n, device="cuda", dtype=torch.float32) % 1000
        buffer = values * (rank + 1)
        dist.all_reduce(buffer)
        torch.cuda.synchronize()
        exact = bool(torch.equal(buffer, values * (size * (size + 1) // 2)))
        verdicts = [None] * size
        dist.all_gather_object(verdicts, exact)
        results.append((n, all(verdicts)))
        del values, buffer
    if rank == 0:
        passed = all(ok for _, ok in results)
        sizes = ", ".join(f"{n} float32 {'exact' if ok else 'WRONG on some rank'}" for n, ok in results)
        print(f"msccl: {'PASS' if passed else 'FAIL'} all-reduces on {size} GPUs: {sizes}", flush=True)
    dist.destroy_process_group()
    return 0


def header(gpus: int) -> list[str]:
    lines = [f"# synth-reduce GPU checks, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"host {platform.node()}, {gpus} GPU(s)"]
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    lines += [f"# GPU: {line.strip()}" for line in smi.stdout.splitlines()[:1]]
    for module in ("torch", "cupy", "numpy"):
        try:
            lines.append(f"# {module} {__import__(module).__version__}")
        except ImportError:
            lines.append(f"# {module}: not installed")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1, help="GPUs on this machine (scripts/gpu_check.sh counts them)")
    parser.add_argument("--executor", action="store_true", help=argparse.SUPPRESS)  # the torchrun worker
    parser.add_argument("--msccl-worker", action="store_true", help=argparse.SUPPRESS)  # the MSCCL torchrun worker
    args = parser.parse_args()
    if args.executor:
        return executor_worker()
    if args.msccl_worker:
        return msccl_worker()
    print("\n".join(header(args.gpus)), flush=True)
    checks = [("cupy-nccl single-rank collectives", check_cupy), ("torch-nccl single-rank collectives", check_torch)]
    if args.gpus >= 2:
        checks += [("torch executor on NCCL, every program", lambda: check_executor(args.gpus)),
                   ("bench --backend torch on GPU buffers", lambda: check_bench(args.gpus, "torch")),
                   ("bench --backend nccl (CuPy) on GPU buffers", lambda: check_bench(args.gpus, "nccl")),
                   (MSCCL_CHECK, lambda: check_msccl(args.gpus))]
    else:
        skipped = "needs 2 GPUs (NCCL refuses two ranks on one GPU)"
        checks += [(name, lambda: ("SKIP", skipped)) for name in (
            "torch executor on NCCL, every program", "bench --backend torch on GPU buffers",
            "bench --backend nccl (CuPy) on GPU buffers", MSCCL_CHECK)]
    verdicts = []
    for name, check in checks:
        try:
            verdict, detail = check()
        except Exception as exc:  # a crash is a failed check; the others still run
            verdict, detail = "FAIL", f"{type(exc).__name__}: {exc} {traceback.format_exc(limit=3)}"
        verdicts.append(verdict)
        print(f"{verdict} {name}: {detail}", flush=True)
    print(f"# {verdicts.count('PASS')} passed, {verdicts.count('FAIL')} failed, {verdicts.count('SKIP')} skipped")
    return 1 if "FAIL" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
