"""Outputs never replace what is not theirs to replace: a FIFO, a device or a
link through a file descriptor (``/dev/stdout``) is written into, never
replaced by a regular file; ``-`` is refused; a rewritten file keeps its
permissions; records appended by several processes at once are all kept, and
never written through a symbolic link. Everything happens in a temporary
folder (a FIFO, links), never in the real /dev."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat

import pytest
from helpers import usage_error

from synth.documents import append_lines, check_appendable, check_writable, write_text
from synth.errors import SynthError


class FifoReader:
    """The read end of a FIFO, opened without blocking before anything is
    written (a writer then finds a reader at once); ``read()`` after the
    writer is done (what is written fits the pipe's buffer)."""

    def __init__(self, path) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def read(self) -> bytes:
        chunks = []
        try:
            while chunk := os.read(self.fd, 1 << 16):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        os.close(self.fd)
        return b"".join(chunks)


def test_a_fifo_is_written_into_never_replaced(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    write_text(fifo, "plan", "hello\n")
    assert reader.read() == b"hello\n"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary file left either


def test_a_fifo_nobody_reads_is_one_error_not_a_hang(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    with pytest.raises(SynthError, match=f"^{fifo}: cannot write plan: it is a FIFO that no process reads$"):
        write_text(fifo, "plan", "hello\n")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_link_to_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    reader = FifoReader(fifo)
    write_text(link, "plan", "through\n")
    assert reader.read() == b"through\n" and link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_link_through_a_file_descriptor_writes_to_its_file_like_dev_stdout(tmp_path):
    # /dev/stdout is a link to /proc/self/fd/1; here a link to this process's descriptor of a regular file
    real = tmp_path / "captured.txt"
    real.write_text("before\n")
    with open(real, "a") as held:
        link = tmp_path / "stdout"
        descriptor = f"/proc/self/fd/{held.fileno()}"
        link.symlink_to(descriptor)
        check_writable(link, "--out")
        write_text(link, "plan", "after\n")
    assert link.is_symlink() and os.readlink(link) == descriptor
    assert real.read_text() == "before\nafter\n"


def test_a_link_to_a_regular_file_is_replaced_its_target_untouched(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("keep\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_text(link, "plan", "new\n")
    assert not link.is_symlink() and link.read_text() == "new\n" and target.read_text() == "keep\n"


def test_rewriting_keeps_the_files_permissions(tmp_path):
    private = tmp_path / "plan.json"
    private.write_text("old\n")
    private.chmod(0o600)
    write_text(private, "plan", "new\n")
    assert private.read_text() == "new\n" and stat.S_IMODE(private.stat().st_mode) == 0o600
    shared = tmp_path / "shared.json"
    shared.write_text("old\n")
    shared.chmod(0o664)
    write_text(shared, "plan", "new\n")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o664


def test_dash_is_refused_clearly_and_creates_nothing(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = "'-' is not a file name here: give a file name (on Linux, /dev/stdout writes on standard output)"
    assert usage_error(cli, "--topology", "testbed-2x4", "--axes", "dp=8", "--out", "-") == f"--out -: {message}"
    with pytest.raises(SynthError, match="^-: cannot write plan: '-' is not a file name here"):
        write_text("-", "plan", "x\n")
    with pytest.raises(SynthError, match="^-: cannot write measurements: '-' is not a file name here"):
        append_lines("-", "measurements", ["x\n"])
    assert list(tmp_path.iterdir()) == []


def test_the_cli_writes_a_plan_into_a_fifo(cli, tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    code, _, err = cli("--topology", "testbed-2x4", "--axes", "dp=8", "--out", fifo)
    assert code == 0, err
    assert json.loads(reader.read())["schema"] == "synth-reduce/plan" and stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ---------------------------------------------------------------- appended records


def record_line(job: int, i: int) -> str:
    return json.dumps({"job": job, "i": i, "pad": "x" * 3000}) + "\n"  # larger than a pipe's atomic write


def _append_many(path: str, job: int, count: int) -> None:
    for i in range(count):
        append_lines(path, "measurements", [record_line(job, i)])


def test_processes_appending_at_once_keep_every_record(tmp_path):
    path = str(tmp_path / "m.jsonl")
    jobs, count = 4, 50
    context = multiprocessing.get_context("spawn")  # a fresh interpreter each: forking a process that holds threads (JAX, torch) may deadlock
    workers = [context.Process(target=_append_many, args=(path, job, count)) for job in range(jobs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert all(w.exitcode == 0 for w in workers)
    lines = open(path).read().splitlines()
    assert sorted((r["job"], r["i"]) for r in map(json.loads, lines)) == [
        (job, i) for job in range(jobs) for i in range(count)]


def test_records_are_never_appended_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("")
    link = tmp_path / "m.jsonl"
    link.symlink_to(target)
    with pytest.raises(SynthError, match=f"^{link}: is a symbolic link; measurements are not written through links"):
        append_lines(link, "measurements", ["{}\n"])
    with pytest.raises(SynthError, match=f"^--jsonl {link}: is a symbolic link; records are not appended"):
        check_appendable(link, "--jsonl")
    assert target.read_text() == ""




def character_device(path, minor: int):
    """A character device node in the temporary folder (1, minor: the
    kernel's memory devices, 3 = null, 7 = full); skipped where nodes cannot
    be made (not root, a nodev mount)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        with open(path, "wb"):
            pass
    except OSError as exc:
        if path.exists():
            path.unlink()
        pytest.skip(f"cannot make a device node here ({exc.strerror})")
    return path


def test_a_character_device_is_written_into_never_replaced(tmp_path):
    null = character_device(tmp_path / "null", 3)
    write_text(null, "plan", "gone\n")
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    full = character_device(tmp_path / "full", 7)
    with pytest.raises(SynthError, match=f"^{full}: cannot write plan to the character device "
                                         r"\(No space left on device\)$"):
        write_text(full, "plan", "x\n")
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "null"]
