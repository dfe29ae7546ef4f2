"""User files: versioned JSON documents (plans, profiles), JSON-lines files
(measurement and step records) and YAML files (topologies, models): read,
check and write them.

Every error names the file and says what is wrong, never a traceback.
:func:`parse_json` is the one JSON parser of user files (plans, profiles,
measurement records): a document nested deeper than :data:`MAX_DEPTH` is
refused (Python's parser and the code that walks a document recurse).
:func:`check_writable` lets a command check an output path before its work.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .caches import memoised
from .errors import SynthError

MAX_DEPTH = 32  # nesting of lists and objects; a plan's deepest is its mesh: one level per axis, plus one


def too_deep(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON or YAML) nests lists and mappings more
    than ``max_depth`` deep. Iterative, so any depth is safe to ask about, and
    linear in the containers: one shared by YAML aliases is walked again only
    when reached deeper (a cycle is too deep)."""
    deepest: dict[int, int] = {}
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)) or deepest.get(id(item), 0) >= depth:
            continue
        if depth > max_depth:
            return True
        deepest[id(item)] = depth
        stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"


def parse_json(text: str) -> Any:
    """``json.loads`` for user files; every problem is a ValueError whose
    message says what is wrong: malformed JSON, an integer of more digits than
    Python converts, or nesting deeper than :data:`MAX_DEPTH`."""
    try:
        value = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or int() of too many digits
        raise ValueError(str(exc)) from None
    except RecursionError:  # deeper than the parser recurses
        raise ValueError(TOO_DEEP) from None
    if too_deep(value):
        raise ValueError(TOO_DEEP)
    return value


def check_writable(path: str | Path, option: str) -> None:
    """SynthError unless a file can be written at ``path`` (its folder exists
    and is writable; an existing file is a writable file). Creates nothing."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise SynthError(f"{option} {path}: is a folder; give a file name")
    if not folder.is_dir():
        raise SynthError(f"{option} {path}: the folder {folder} does not exist; create it or write elsewhere")
    if target.exists() and not os.access(target, os.W_OK):
        raise SynthError(f"{option} {path}: the file is not writable")
    if not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise SynthError(f"{option} {path}: the folder {folder} is not writable")


# the largest input files read: far above any real one (the largest plan shipped or written in the tests is a
# few MB; a topology or model file a few KB), so that a wrong path (/dev/zero, a data set) is one error line
MAX_DOCUMENT_BYTES = 256 * 2**20  # plans, profiles, measurements, step records
MAX_YAML_BYTES = 2**20  # topologies, models
MAX_PROGRAM_BYTES = 2**20  # program text files (check)


def read_limited(path: str | Path, kind: str, limit_bytes: int) -> str:
    """The UTF-8 text of ``path`` (``-``: standard input), refused with one
    SynthError when longer than ``limit_bytes`` (read no further: a device such
    as /dev/zero ends too); errors name the file and ``kind``. Raises
    FileNotFoundError and UnicodeDecodeError for the caller to word."""
    if str(path) == "-":
        import sys

        stream = getattr(sys.stdin, "buffer", None)  # a replaced stdin (tests) may have text only
        data = stream.read(limit_bytes + 1) if stream is not None else sys.stdin.read(limit_bytes + 1).encode()
    else:
        with open(path, "rb") as f:
            data = f.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise SynthError(f"{path}: larger than {limit_bytes:,} bytes, the most a {kind} file may hold; is it the "
                         f"right file?")
    return data.decode("utf-8")


def read_document(
    path: str | Path, kind: str, schema: str, version: int | tuple[int, ...], fix: str = ""
) -> dict[str, Any]:
    """The JSON object in ``path`` if its ``schema`` matches and its ``version``
    is ``version`` (or one of them).

    ``kind`` names the document in messages ("plan"); ``fix`` is appended to the
    version error (e.g. how to re-create the document)."""
    source = str(path)
    try:
        doc = parse_json(read_limited(path, kind, MAX_DOCUMENT_BYTES))
    except FileNotFoundError:
        raise SynthError(f"{source}: no such {kind} file") from None
    except OSError as exc:
        raise SynthError(f"{source}: cannot read {kind} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SynthError(f"{source}: not a valid {kind}: not a text file (JSON must be UTF-8)") from None
    except ValueError as exc:
        raise SynthError(f"{source}: not a valid {kind}: corrupted JSON ({exc})") from None
    return check_schema(doc, source, kind, schema, version, fix)


def check_schema(
    doc: Any, where: str, kind: str, schema: str, version: int | tuple[int, ...], fix: str = "",
    required: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``doc`` if it is an object of ``schema`` in ``version`` (or one of them)
    holding every ``required`` field; else a SynthError naming ``where`` (a file,
    or file:line) and what is wrong. ``fix`` is appended to the version error."""
    versions = (version,) if isinstance(version, int) else version
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise SynthError(f'{where}: not a synth-reduce {kind} (expected "schema": "{schema}")')
    if doc.get("version") not in versions or isinstance(doc.get("version"), bool):
        readable = " and ".join(str(v) for v in versions)
        raise SynthError(
            f"{where}: {kind} version {doc.get('version')!r} is not supported; this synth-reduce "
            f"reads version {readable}{f' ({fix})' if fix else ''}"
        )
    missing = [k for k in required if k not in doc]
    if missing:
        raise SynthError(f"{where}: missing field(s) {', '.join(missing)}")
    return doc


def write_document(path: str | Path, kind: str, document: dict[str, Any]) -> None:
    write_text(path, kind, json.dumps(document, indent=1) + "\n")


def write_text(path: str | Path, kind: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file in
    the same folder, then renamed into place (a symlink at ``path`` is
    replaced, its target never written). SynthError naming ``kind`` if it
    cannot be written; no temporary file is left behind."""
    target = Path(path)
    temporary = None
    try:
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, target)
        temporary = None
    except OSError as exc:
        raise SynthError(f"{path}: cannot write {kind} ({exc.strerror or exc})") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def json_lines(path: str | Path, kind: str) -> Iterator[tuple[str, int, Any]]:
    """``(where, line number, value)`` of each non-blank line of a JSON-lines
    file, ``where`` = ``file:line``; SynthError naming the file (and line) if
    it cannot be read or a line is not JSON. ``kind`` names the records
    ("measurements")."""
    source = str(path)
    try:
        lines = read_limited(path, kind, MAX_DOCUMENT_BYTES).splitlines()
    except FileNotFoundError:
        raise SynthError(f"{source}: no such {kind} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SynthError(f"{source}: cannot read {kind} ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            value = parse_json(line)
        except ValueError as exc:
            raise SynthError(f"{where}: not valid JSON ({exc})") from None
        yield where, number, value


@memoised(maxsize=1)
def _strict_yaml_loader() -> type:
    """A yaml SafeLoader that rejects a key given twice in one mapping (yaml is
    imported here, not at module import: executing a plan needs no yaml)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):  # PyYAML hook
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key '{key}' is given twice", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def read_yaml(path: str | Path, kind: str) -> Any:
    """The value of a YAML file, safely loaded (no object construction, a key
    given twice refused, nesting deeper than :data:`MAX_DEPTH` refused); errors
    name the file, the line and column where known, and the problem. ``kind``
    names the file in messages ("topology")."""
    import yaml

    try:
        data = yaml.load(read_limited(path, kind, MAX_YAML_BYTES), Loader=_strict_yaml_loader())
    except FileNotFoundError:
        raise SynthError(f"{path}: no such {kind} file") from None
    except UnicodeDecodeError:
        raise SynthError(f"{path}: not a text file (YAML must be UTF-8)") from None
    except OSError as exc:
        raise SynthError(f"{path}: cannot read {kind} ({exc.strerror})") from None
    except RecursionError:  # deeper than the YAML composer recurses
        raise SynthError(f"{path}: malformed YAML: {TOO_DEEP}") from None
    except ValueError as exc:  # a number beyond what int() converts (thousands of digits)
        raise SynthError(f"{path}: malformed YAML: {str(exc).splitlines()[0]}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SynthError(f"{path}: malformed YAML{at}: {problem}") from None
    if too_deep(data):
        raise SynthError(f"{path}: malformed YAML: {TOO_DEEP}")
    return data
