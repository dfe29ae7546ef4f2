"""The ``synth-reduce`` command line, one module per command, over the public
API (:mod:`synth.api`) and the runtime.

    synth-reduce --topology T --axes dp=16,mp=8 [--reduce dp] [...]   placements, ranked programs (solve)
    synth-reduce --topology T --axes ... --workload SPEC              whole-job placement (solve)
    synth-reduce COMMAND ...                                          the commands of COMMANDS

``synth-reduce --help`` lists every command of
:data:`~synth.cli.commands.COMMANDS` with its line of
:data:`~synth.cli.commands.SUMMARIES`. Shared argument groups are in
:mod:`synth.cli.args`. Bad input gives a one-line error on stderr and exit code
2, never a traceback; an interrupt (Ctrl-C), also during start-up, gives one
line and exit code 130.

Imports: any stage (the command line is the top of the pipeline), each
command's module only when that command runs, so the main command never loads
the runtime's backends or the testbed.
"""

from __future__ import annotations

import errno
import importlib
import sys

from ..collector import freeze_after_pauses
from ..errors import SynthError
from ..interrupts import holding_interrupts
from .commands import COMMANDS

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: less start-up outside main's error handling
    from typing import Callable, Sequence

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

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
    as KeyboardInterrupt (:func:`~synth.interrupts.holding_interrupts`): C
    extensions such as numpy's turn an interrupt during their import into an
    ImportError with a traceback."""
    loaded, interrupted = holding_interrupts(lambda: _load(argv))
    if interrupted:
        raise KeyboardInterrupt
    return loaded


# the longest command-line argument: far above any real one (a long --workload or --matrix is a few hundred
# characters; check's longest program, 1,000 instructions, about 40,000), so that a pasted file or a runaway
# script is one error line, not minutes of parsing
MAX_ARGUMENT_CHARS = 65_536


def _check_arguments(argv: Sequence[str]) -> None:
    """SynthError for an argument longer than :data:`MAX_ARGUMENT_CHARS`, or
    an option given an empty value (``--size ''``), which would otherwise read
    as the option left out. What follows ``--`` (a script's own arguments
    under ``launch``, a command under ``emulate``) is not looked at."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return
        if len(arg) > MAX_ARGUMENT_CHARS:
            shown = arg[:20].replace("\n", " ")
            raise SynthError(f"argument {i + 1} ('{shown}...') is {len(arg):,} characters; at most "
                             f"{MAX_ARGUMENT_CHARS:,}")
        option, equals, value = arg.partition("=")
        empty = (equals and not value) or (not equals and i + 1 < len(argv) and argv[i + 1] == "")
        if arg.startswith("--") and len(option) > 2 and empty:
            raise SynthError(f"{option}: an empty value; give a value or leave the option out")


def _tell_torchrun(line: str) -> None:
    """Under torchrun (``TORCHELASTIC_ERROR_FILE`` set), write ``line`` to
    the error file torchrun reads when a worker fails, so that its failure
    report names this one line as the cause instead of pointing at its
    traceback instructions. Best effort: nothing is raised."""
    import os

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import json
    import time

    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                   "timestamp": str(int(time.time()))}}}, f)
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    try:
        arguments = list(sys.argv[1:] if argv is None else argv)
        _check_arguments(arguments)
        run, args = _load_holding_interrupts(arguments)
        return run(args)
    except SynthError as exc:
        print(f"synth-reduce: error: {exc}", file=sys.stderr)
        _tell_torchrun(f"synth-reduce: error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("synth-reduce: interrupted", file=sys.stderr)
        _tell_torchrun("synth-reduce: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is an interrupt in disguise
        # Ctrl-C while ctypes converted a z3 call's arguments arrives as ctypes.ArgumentError(KeyboardInterrupt)
        if type(exc).__name__ != "ArgumentError" or "KeyboardInterrupt" not in str(exc):
            if isinstance(exc, OSError) and exc.errno in (errno.ENAMETOOLONG, errno.ELOOP):
                return _path_error(exc)
            raise
        print("synth-reduce: interrupted", file=sys.stderr)
        _tell_torchrun("synth-reduce: interrupted")
        return EXIT_INTERRUPTED


def _path_error(exc: OSError) -> int:
    """One line for a path the system refuses (too long, a loop of links)."""
    name = str(exc.filename or "")
    shown = name if len(name) <= 60 else f"{name[:40]}... ({len(name):,} characters)"
    line = (f"{shown}: {exc.strerror}: the system takes at most 255 bytes a file name and 4,096 a path"
            if exc.errno == errno.ENAMETOOLONG else f"{shown}: {exc.strerror}: a link that points to itself")
    print(f"synth-reduce: error: {line}", file=sys.stderr)
    _tell_torchrun(f"synth-reduce: error: {line}")
    return EXIT_USAGE


def console() -> int:
    """The ``synth-reduce`` program (and ``python -m synth.cli``): :func:`main`
    in a process of its own, which owns its garbage collector
    (:func:`~synth.collector.freeze_after_pauses`), except under ``launch``,
    which runs a training script in this process."""
    if sys.argv[1:2] != ["launch"]:
        freeze_after_pauses()
    return main()
