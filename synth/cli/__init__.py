"""The ``synth-reduce`` command line, one module per command, over the public
API (:mod:`synth.api`) and the runtime.

    synth-reduce --topology T --axes dp=16,mp=8 [--reduce dp] [...]   placements, ranked programs (solve)
    synth-reduce --topology T --axes ... --workload SPEC              whole-job placement (solve)
    synth-reduce COMMAND ...                                          the commands of COMMANDS

``synth-reduce --help`` lists every command of :data:`COMMANDS` with its line
of :data:`SUMMARIES`. Shared argument groups are in :mod:`synth.cli.args`. Bad
input gives a one-line error on stderr and exit code 2, never a traceback; an
interrupt (Ctrl-C), also during start-up, gives one line and exit code 130.
"""

from __future__ import annotations

import importlib
import sys

from ..errors import SynthError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: less start-up outside main's error handling
    from typing import Callable, Sequence

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

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

# command -> what it does, one line for 'synth-reduce --help' (a test checks
# that every command of COMMANDS has one)
SUMMARIES: dict[str, str] = {
    "plan": "plan a training job: tp/dp/pp sizes, placement and programs of the fastest step that fits",
    "verify": "re-prove a plan file (numpy reference and z3)",
    "check": "check a hand-written program on one placement (--matrix) or on each",
    "fit": "learn the cost model's parameters from measurements",
    "validate": "score the cost model's accuracy on measurements",
    "bench": "time a plan's or the predicted best programs against the default (under mpiexec)",
    "tune": "time the predicted best programs and write the plan of the measured winner (under mpiexec)",
    "emulate": "run a command on an emulated cluster of network namespaces on this machine (root)",
}


def commands_text() -> str:
    """The commands, one per line with its summary (for the main command's help)."""
    width = max(len(name) for name in COMMANDS)
    return "\n".join(f"  {name:<{width}}  {SUMMARIES.get(name, '')}".rstrip() for name in COMMANDS)


def _command(name: str) -> Callable[[Sequence[str]], int]:
    module, function = COMMANDS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def _load(argv: Sequence[str]) -> tuple[Callable[[Sequence[str]], int], list[str]]:
    """The function that runs ``argv`` and its arguments (imports its module)."""
    if argv and argv[0] in COMMANDS:
        return _command(argv[0]), list(argv[1:])
    if argv and not argv[0].startswith("-"):
        raise SynthError(f"unknown command '{argv[0]}'; the commands are {', '.join(COMMANDS)}, or the main "
                         "command's options (see 'synth-reduce --help')")
    from .solve import run

    return run, list(argv)


def _load_holding_interrupts(argv: Sequence[str]) -> tuple[Callable[[Sequence[str]], int], list[str]]:
    """:func:`_load` with Ctrl-C held until the imports are done, then raised
    as KeyboardInterrupt: C extensions such as numpy's turn an interrupt during
    their import into an ImportError with a traceback. Where SIGINT is not
    Python's default handler (ignored, or set by an embedding program), or off
    the main thread, it is left alone."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return _load(argv)
    held: list[int] = []
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread
        return _load(argv)
    try:
        loaded = _load(argv)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if held:
        raise KeyboardInterrupt
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run, args = _load_holding_interrupts(list(sys.argv[1:] if argv is None else argv))
        return run(args)
    except SynthError as exc:
        print(f"synth-reduce: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("synth-reduce: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
