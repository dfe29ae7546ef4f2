"""``synth-reduce emulate``: an emulated cluster on this machine (see
:mod:`synth.testbed`)."""

from __future__ import annotations

from typing import Sequence


def run(argv: Sequence[str]) -> int:
    from ..testbed import emulate_main

    return emulate_main(list(argv))
