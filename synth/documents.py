"""Versioned JSON documents (plans, profiles) and JSON-lines files (measurement
and step records): read, check and write them.

Every error names the file and says what is wrong, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from .errors import SynthError


def read_document(
    path: str | Path, kind: str, schema: str, version: int | tuple[int, ...], fix: str = ""
) -> dict[str, Any]:
    """The JSON object in ``path`` if its ``schema`` matches and its ``version``
    is ``version`` (or one of them).

    ``kind`` names the document in messages ("plan"); ``fix`` is appended to the
    version error (e.g. how to re-create the document)."""
    versions = (version,) if isinstance(version, int) else version
    source = str(path)
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SynthError(f"{source}: no such {kind} file") from None
    except OSError as exc:
        raise SynthError(f"{source}: cannot read {kind} ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SynthError(f"{source}: not a valid {kind}: corrupted JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise SynthError(f'{source}: not a synth-reduce {kind} (expected "schema": "{schema}")')
    if doc.get("version") not in versions or isinstance(doc.get("version"), bool):
        readable = " and ".join(str(v) for v in versions)
        raise SynthError(
            f"{source}: {kind} version {doc.get('version')!r} is not supported; this synth-reduce "
            f"reads version {readable}{f' ({fix})' if fix else ''}"
        )
    return doc


def write_document(path: str | Path, kind: str, document: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(document, indent=1) + "\n")
    except OSError as exc:
        raise SynthError(f"{path}: cannot write {kind} ({exc.strerror})") from None


def json_lines(path: str | Path, kind: str) -> Iterator[tuple[str, int, Any]]:
    """``(where, line number, value)`` of each non-blank line of a JSON-lines
    file, ``where`` = ``file:line``; SynthError naming the file (and line) if
    it cannot be read or a line is not JSON. ``kind`` names the records
    ("measurements")."""
    source = str(path)
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise SynthError(f"{source}: no such {kind} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SynthError(f"{source}: cannot read {kind} ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            yield where, number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise SynthError(f"{where}: not valid JSON ({exc.msg})") from None
