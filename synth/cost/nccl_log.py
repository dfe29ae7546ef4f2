"""What NCCL says it chose: the tuning lines of its debug log, parsed.

With ``NCCL_DEBUG=INFO`` and the ``TUNING`` subsystem, NCCL logs one line per
collective call on rank 0 of the communicator, naming the algorithm and
protocol its tuner picked. Three forms occur, newest first (NCCL's
``src/enqueue.cc``, ``INFO(NCCL_TUNING, ...)``)::

    host:pid:tid [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}
    host:pid:tid [0] NCCL INFO AllGather: 37756928 Bytes -> Algo 1 proto 2 time 2860.208008
    host:pid:tid [0] NCCL INFO 262144 Bytes -> Algo 0 proto 1 time 54.707825

Newer versions may append `` comm 0x...``. Numbers are NCCL's enum values
(``NCCL_ALGO_*``: TREE 0, RING 1, COLLNET_DIRECT 2, COLLNET_CHAIN 3, NVLS 4,
NVLS_TREE 5, PAT 6; ``NCCL_PROTO_*``: LL 0, LL128 1, SIMPLE 2, as in NCCL's
``nccl_common.h`` and tuner plugin headers); names are upper-cased as
``ncclAlgoToString``/``ncclProtoToString`` print them. :func:`parse` and
:func:`summarize` are pure; :class:`Capture` points this process's NCCL log at a
private temporary file and reads the lines that arrived since the last read.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

ALGORITHMS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOCOLS = ("LL", "LL128", "SIMPLE")

_TUNING = re.compile(
    r"NCCL INFO (?:(?P<collective>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?"
)
_VERSION = re.compile(r"NCCL INFO NCCL version (\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class LoggedChoice:
    """NCCL's choice for collective calls of one size: ``collective``
    (``AllReduce``, ...; None in the oldest log form, which omits it),
    ``size_bytes`` (the call's bytes as NCCL logs them: count x element size),
    ``algorithm`` and ``protocol`` (NCCL's names), ``channels`` (when logged) and
    the number of ``calls`` it was logged for."""

    collective: str | None
    size_bytes: int
    algorithm: str
    protocol: str
    channels: int | None = None
    calls: int = 1

    def to_dict(self) -> dict:
        return {"collective": self.collective, "size_bytes": self.size_bytes, "algorithm": self.algorithm,
                "protocol": self.protocol, "channels": self.channels, "calls": self.calls}


def _name(value: str, names: tuple[str, ...]) -> str:
    if value.isdigit():
        index = int(value)
        return names[index] if index < len(names) else f"#{index}"
    return value.upper()


def parse_line(line: str) -> LoggedChoice | None:
    """The choice a tuning line reports, or None for any other line."""
    m = _TUNING.search(line)
    if m is None:
        return None
    channels = int(m["hi"]) - int(m["lo"]) + 1 if m["lo"] is not None else None
    return LoggedChoice(m["collective"], int(m["bytes"]), _name(m["algo"], ALGORITHMS), _name(m["proto"], PROTOCOLS),
                  channels)


def parse(lines: Iterable[str]) -> tuple[LoggedChoice, ...]:
    """Every tuning line's choice, in order."""
    return tuple(c for c in map(parse_line, lines) if c is not None)


def summarize(choices: Iterable[LoggedChoice]) -> tuple[LoggedChoice, ...]:
    """Equal choices merged (their ``calls`` added), in order of first appearance."""
    merged: dict[LoggedChoice, int] = {}
    for c in choices:
        key = replace(c, calls=1)
        merged[key] = merged.get(key, 0) + c.calls
    return tuple(replace(c, calls=n) for c, n in merged.items())


def logged_version(lines: Iterable[str]) -> str | None:
    """The version in a ``NCCL version 2.21.5+cuda12.4`` line, if any."""
    for line in lines:
        m = _VERSION.search(line)
        if m:
            return m[1]
    return None


def version_text(code: int) -> str:
    """``ncclGetVersion``'s integer as text: ``22105`` -> ``2.21.5`` (codes of
    NCCL >= 2.9 are major*10000 + minor*100 + patch; older ones major*1000 +
    minor*100 + patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


class Capture:
    """NCCL's debug log of this process, in a private temporary file.

    Sets ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,TUNING`` and
    ``NCCL_DEBUG_FILE`` (NCCL reads them when it first logs, so create the
    capture before the first NCCL communicator of the process). :meth:`read`
    returns the lines that arrived since the previous read (NCCL writes the file
    unbuffered). :meth:`close` restores the environment and removes the file.
    """

    VARIABLES = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,TUNING"}

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="synth-nccl-"))
        self.path = self.directory / "nccl.log"
        settings = dict(self.VARIABLES, NCCL_DEBUG_FILE=str(self.path))
        self._saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        self._offset = 0

    def read(self) -> list[str]:
        """Complete lines logged since the previous read."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:  # NCCL has not logged yet (or never initialized)
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode(errors="replace").splitlines()

    def close(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "Capture":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
