"""The ``synth-reduce`` command line, one module per command, over the public
API (:mod:`synth.api`) and the runtime.

    synth-reduce --topology T --axes dp=16,mp=8 [--reduce dp] [...]   placements, ranked programs (solve)
    synth-reduce --topology T --axes ... --workload SPEC              whole-job placement (solve)
    synth-reduce plan --topology T --model M --global-batch B [...]   plan a training job (plan)
    synth-reduce verify plan.json                                     re-prove a plan (verify)
    synth-reduce check FILE --topology T --axes ... [--matrix M]      check a program (check)
    synth-reduce fit MEASUREMENTS -o PROFILE                          learn the cost model (fit)
    synth-reduce validate MEASUREMENTS [--holdout F]                  score the cost model (fit)
    mpiexec -n N synth-reduce bench|tune ...                          run on MPI / NCCL (bench)
    torchrun --nproc-per-node N -m synth.cli bench|tune --backend torch ...   run on torch.distributed (bench)
    synth-reduce emulate [plan|down] ...                              emulated cluster (emulate)

Shared argument groups are in :mod:`synth.cli.args`. Bad input gives a one-line
error on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Sequence

from ..errors import SynthError

EXIT_USAGE = 2

# command -> (module, function); modules are imported on use, so the main
# command never loads the runtime's backends or the testbed
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "run"),
    "fit": ("fit", "run_fit"),
    "validate": ("fit", "run_validate"),
    "verify": ("verify", "run"),
    "check": ("check", "run"),
    "bench": ("bench", "run_bench"),
    "tune": ("bench", "run_tune"),
    "emulate": ("emulate", "run"),
}


def _command(name: str) -> Callable[[Sequence[str]], int]:
    module, function = COMMANDS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            return _command(argv[0])(argv[1:])
        from .solve import run

        return run(argv)
    except SynthError as exc:
        print(f"synth-reduce: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("synth-reduce: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
