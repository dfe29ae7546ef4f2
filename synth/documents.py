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
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

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


STDOUT_REFUSED = ("'-' is not a file name here: give a file name (on Linux, /dev/stdout writes on standard "
                  "output)")


def check_writable(path: str | Path, option: str) -> None:
    """SynthError unless a file can be written at ``path`` (its folder exists
    and is writable; an existing file is a writable file). Creates nothing.
    ``-`` is refused (it is not standard output here); an existing FIFO,
    device or a link to one (``/dev/null``, ``/dev/stdout``) is fine: it is
    written through, never replaced (:func:`write_text`)."""
    if str(path) == "-":
        raise SynthError(f"{option} -: {STDOUT_REFUSED}")
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise SynthError(f"{option} {path}: is a folder; give a file name")
    if written_through(target):
        if not os.access(target, os.W_OK):
            raise SynthError(f"{option} {path}: the {file_kind(target)} is not writable")
        return
    if not folder.is_dir():
        raise SynthError(f"{option} {path}: the folder {folder} does not exist; create it or write elsewhere")
    if target.exists() and not os.access(target, os.W_OK):
        raise SynthError(f"{option} {path}: the file is not writable")
    if not target.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise SynthError(f"{option} {path}: the folder {folder} is not writable")


def check_appendable(path: str | Path, option: str) -> None:
    """:func:`check_writable` for a file that records are appended to
    (:func:`append_lines`), which also refuses a symbolic link at ``path``
    (other than a link to a FIFO or device such as ``/dev/null``)."""
    check_writable(path, option)
    if os.path.islink(path) and not written_through(path):
        raise SynthError(f"{option} {path}: is a symbolic link; records are not appended through links: give the "
                         "file itself")


def file_kind(path: str | Path) -> str:
    """What ``path`` is, for messages: ``file``, ``folder``, ``FIFO``,
    ``character device``, ``block device``, ``socket`` or ``missing``
    (links followed)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "missing"
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def path_problem(path: str | Path, kind: str, wanted: str) -> str | None:
    """Why ``path`` cannot be read as a ``kind`` file, saying what it is
    (standard input, a folder, a FIFO, a device), or None for a regular file
    or a missing path (the caller words that)."""
    if str(path) == "-":
        return f"{kind} '-': standard input is not read here; give {wanted}"
    found = file_kind(path)
    if found in ("file", "missing"):
        return None
    article = "an" if found[0] in "aeiou" else "a"
    return f"{kind} '{path}' is {article} {found}, not a file; give {wanted}"


def _via_descriptor(path: str | Path) -> bool:
    """Whether ``path`` is a chain of links that passes through a process's
    file descriptors (``/dev/stdout`` -> ``/proc/self/fd/1``): writing there
    means writing to that descriptor's file, not replacing the link."""
    current = str(path)
    for _ in range(40):  # the kernel's own limit on links followed
        if not os.path.islink(current):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
        if current.startswith(("/proc/", "/dev/fd/")):
            return True
    return False


def written_through(path: str | Path) -> bool:
    """Whether an output at ``path`` is written into what is there rather
    than replaced by a new file: an existing FIFO, device or socket (or a link
    to one, such as ``/dev/null``), or a link through a file descriptor
    (``/dev/stdout``). Replacing those would destroy a system file or write
    nowhere."""
    kind = file_kind(path)
    return kind not in ("file", "folder", "missing") or (kind == "file" and _via_descriptor(path))


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
    if file_kind(path) in ("folder", "socket"):
        raise SynthError(f"{source}: is a {file_kind(path)}, not a {kind} file; give the {kind}'s JSON file")
    try:
        text = read_limited(path, kind, MAX_DOCUMENT_BYTES)
    except FileNotFoundError:
        raise SynthError(f"{source}: no such {kind} file") from None
    except OSError as exc:
        raise SynthError(f"{source}: cannot read {kind} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SynthError(f"{source}: not a valid {kind}: not a text file (JSON must be UTF-8)") from None
    shown = "standard input" if source == "-" else source
    if not text.strip():
        raise SynthError(f"{shown}: not a valid {kind}: it is empty")
    if text.lstrip().startswith("<"):
        raise SynthError(f"{shown}: not a valid {kind}: it is XML (an MSCCL algorithm?), not JSON; give the "
                         f"{kind}'s JSON file")
    try:
        doc = parse_json(text)
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
    replaced, its target never written); an existing file's permissions are
    kept. What :func:`written_through` says is written into, never replaced:
    a FIFO (refused at once when no process reads it), a device such as
    ``/dev/null``, ``/dev/stdout``. ``-`` is refused. SynthError naming
    ``kind`` if it cannot be written; no temporary file is left behind."""
    if str(path) == "-":
        raise SynthError(f"-: cannot write {kind}: {STDOUT_REFUSED}")
    if written_through(path):
        _write_into(path, kind, text)
        return
    target = Path(path)
    try:
        existing = os.lstat(target)
        mode = stat.S_IMODE(existing.st_mode) if stat.S_ISREG(existing.st_mode) else None
    except OSError:
        mode = None
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    temporary = None
    try:
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
        temporary = None
    except OSError as exc:
        raise SynthError(f"{path}: cannot write {kind} ({exc.strerror or exc})") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _write_into(path: str | Path, kind: str, text: str) -> None:
    """``text`` written into the existing special file at ``path`` (appended:
    a descriptor's regular file keeps what is there)."""
    fifo = file_kind(path) == "FIFO"
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | (os.O_NONBLOCK if fifo else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if fifo and exc.errno == errno.ENXIO:
            raise SynthError(f"{path}: cannot write {kind}: it is a FIFO that no process reads") from None
        raise SynthError(f"{path}: cannot write {kind} to the {file_kind(path)} ({exc.strerror or exc})") from None
    try:
        if fifo:
            os.set_blocking(fd, True)
        _write_all(fd, text)
    except OSError as exc:
        raise SynthError(f"{path}: cannot write {kind} to the {file_kind(path)} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _write_all(fd: int, text: str) -> None:
    """Write all of ``text`` to ``fd`` (a short write continues where it stopped)."""
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]


def append_lines(path: str | Path, kind: str, lines: Sequence[str]) -> None:
    """Append ``lines`` (each ending in a newline) to the JSON-lines file
    ``path``, safe against other processes appending to it at once: the file
    is opened with ``O_APPEND``, held under an exclusive ``fcntl`` lock, and
    each line is one ``write``, so no line is lost or torn. A symlink at
    ``path`` is refused (``O_NOFOLLOW``), as are folders; a FIFO or device
    (``/dev/null``) is written into. SynthError naming ``kind`` otherwise."""
    import fcntl

    if str(path) == "-":
        raise SynthError(f"-: cannot write {kind}: {STDOUT_REFUSED}")
    special = written_through(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOCTTY | (0 if special else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags | (os.O_NONBLOCK if file_kind(path) == "FIFO" else 0), 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SynthError(f"{path}: is a symbolic link; {kind} are not written through links: give the file "
                             "itself") from None
        raise SynthError(f"{path}: cannot write {kind} ({exc.strerror or exc})") from None
    try:
        os.set_blocking(fd, True)
        if not special:
            fcntl.flock(fd, fcntl.LOCK_EX)
        for line in lines:
            _write_all(fd, line)  # one line, one write where the system takes it whole
    except OSError as exc:
        raise SynthError(f"{path}: cannot write {kind} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)  # releases the lock


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
