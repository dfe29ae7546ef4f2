#!/usr/bin/env python3
"""Regenerate, or check, the example outputs printed in README.md.

An example is a fenced ``sh`` block holding one command (its last ``&&`` part,
when it is an install line), followed, after at most a line of prose such as
"Output:", by a plain fenced block: the command's output. Each command runs in
a fresh temporary directory (so that ``--out`` files land there) through this
checkout's ``synth-reduce`` (``python -m synth.cli``), with topology paths
relative to the repository.

    python scripts/readme_examples.py           # rewrite the output blocks in README.md
    python scripts/readme_examples.py --check   # exit 1 and show the difference if one is stale
    python scripts/readme_examples.py --run-blocks   # run every runnable block of several commands

A runnable block is a fenced ``sh`` block of several commands, each a
``synth-reduce`` or ``torchrun`` line without placeholders (``<...>``, ``...``):
its commands run in order in one fresh temporary directory (``torchrun`` as
``python -m torch.distributed.run``, paths under ``examples/`` and
``topologies/`` relative to the repository), each must exit 0.

``--check`` ignores the measured durations ("synthesized in 58 ms", "ranked in
5.356 s"), which differ from run to run; every other character must match.
Prose numbers quoted from these outputs are not checked: re-read them after a
rewrite.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DURATION = re.compile(r"\b(synthesized|predicted|ranked) in [0-9.]+ (us|ms|s)\b")


@dataclass(frozen=True)
class Example:
    command: str
    output_start: int  # first line of the output (after the opening fence)
    output_stop: int  # the closing fence's line


def examples(lines: list[str]) -> list[Example]:
    """Every (command, output block) pair of the README, in order."""
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            stop = lines.index("```", i + 1)
            body = [ln for ln in lines[i + 1:stop] if ln.strip() and not ln.lstrip().startswith("#")]
            j = stop + 1
            while j < len(lines) and j <= stop + 3 and lines[j].strip() != "```":
                j += 1
            if len(body) == 1 and j < len(lines) and lines[j] == "```" and "synth-reduce" in body[0]:
                command = body[0].split("&&")[-1].strip()
                close = lines.index("```", j + 1)
                found.append(Example(command, j + 1, close))
                i = close + 1
                continue
            i = stop + 1
        else:
            i += 1
    return found


def run(command: str) -> str:
    """The command's stdout, run from a temporary directory; SystemExit if it fails."""
    argv = shlex.split(command)
    if argv[0] != "synth-reduce":
        raise SystemExit(f"readme_examples: not a synth-reduce command: {command}")
    argv = [str(REPO / a) if a.startswith(("topologies/", "examples/", "models/")) else a for a in argv[1:]]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "synth.cli", *argv], cwd=tmp, env=env, capture_output=True,
                              text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"readme_examples: `{command}` exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def runnable_blocks(lines: list[str]) -> list[list[str]]:
    """The commands of every runnable block (module docstring), in order."""
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            stop = lines.index("```", i + 1)
            body = [ln.split("  #")[0].strip() for ln in lines[i + 1:stop]
                    if ln.strip() and not ln.lstrip().startswith("#")]
            if (len(body) > 1 and all(ln.startswith(("synth-reduce ", "torchrun ")) for ln in body)
                    and not any("<" in ln or "..." in ln for ln in body)):
                blocks.append(body)
            i = stop + 1
        else:
            i += 1
    return blocks


def run_block(commands: list[str]) -> None:
    """Run one block's commands in one temporary directory; SystemExit naming
    the command that fails."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        for command in commands:
            argv = [str(REPO / a) if a.startswith(("topologies/", "examples/", "models/")) else a
                    for a in shlex.split(command)]
            if argv[0] == "synth-reduce":
                argv = [sys.executable, "-m", "synth.cli", *argv[1:]]
            else:
                argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", *argv[1:]]
            print(f"running: {command}", file=sys.stderr, flush=True)
            done = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise SystemExit(f"readme_examples: `{command}` exited {done.returncode}: "
                                 f"{done.stderr.strip()[-1500:]}")


def without_durations(text: str) -> str:
    return DURATION.sub(r"\1 in <duration>", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of rewriting; exit 1 if an output is stale")
    p.add_argument("--run-blocks", action="store_true", help="run every runnable block of several commands")
    args = p.parse_args(argv)
    lines = README.read_text().split("\n")
    if args.run_blocks:
        for block in runnable_blocks(lines):
            run_block(block)
        return 0
    stale = 0
    for example in reversed(examples(lines)):  # from the end, so that earlier line numbers stay valid
        print(f"running: {example.command}", file=sys.stderr, flush=True)
        new = run(example.command).rstrip("\n").split("\n")
        old = lines[example.output_start:example.output_stop]
        if args.check:
            if without_durations("\n".join(old)) != without_durations("\n".join(new)):
                stale += 1
                sys.stdout.writelines(difflib.unified_diff(
                    [ln + "\n" for ln in old], [ln + "\n" for ln in new], "README.md", example.command))
        else:
            lines[example.output_start:example.output_stop] = new
    if args.check:
        if stale:
            print(f"readme_examples: {stale} output(s) in README.md are stale; run scripts/readme_examples.py",
                  file=sys.stderr)
        return 1 if stale else 0
    README.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
