"""The emulated cluster (synth.testbed): the pure description (names, addresses,
rates, racks, commands, launcher agent), the dry run and the refusals without
root, then real clusters as root: a 2-node x 2-rank bench with #wrong 0, and
teardown on success, failure and SIGTERM. The real-cluster tests are skipped,
with the reason printed as a warning, where root, network namespaces or MPI are
missing; every one has a subprocess timeout and a finalizer that removes leftovers."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from helpers import usage_error
from processes import limit_s

import synth.testbed
from synth.cli.emulate import emulate_main
from synth.errors import SynthError
from synth.testbed import commands, description, namespaces
from synth.testbed.commands import RANK_GUARD, agent_script, build_commands, hostfile_text, mpiexec_command
from synth.testbed.description import SUBNET, describe_cluster, describe_text
from synth.testbed.names import Names, link_owner, namespace_owner, workdir_owner
from synth.testbed.namespaces import Leftovers, down, find_mpiexec, scan
from synth.testbed.watch import JobWatch, Process
from synth.topology import load_topology, topology_from_dict

REPO = Path(__file__).resolve().parents[2]
BIGGEST_PID = 4194304  # Linux's pid_max limit


def topology(*levels: tuple[str, int, float], ports: int = 1):
    return topology_from_dict({"name": "t", "levels": [
        {"name": n, "count": c, "bandwidth_GBps": bw, "latency_us": 10.0, "ports": ports} for n, c, bw in levels
    ]}, "test")


RACKS = topology(("rack", 3, 0.0625), ("node", 4, 0.125), ("rank", 2, 2.0))


# ---------------------------------------------------------------- the description


@pytest.mark.parametrize("topo", [load_topology("testbed-2x4"), load_topology("dgx-a100"), RACKS],
                         ids=["testbed-2x4", "dgx-a100", "racks"])
def test_names_are_short_unique_and_found_by_down(topo):
    c = describe_cluster(topo, BIGGEST_PID)
    assert all(len(name) <= 15 for name in c.links)
    assert len(set(c.links)) == len(c.links) and len(set(c.namespaces)) == len(c.namespaces)
    assert all(link_owner(name) == BIGGEST_PID for name in c.links)
    assert all(namespace_owner(ns) == BIGGEST_PID for ns in c.namespaces)
    assert workdir_owner(c.workdir.name) == BIGGEST_PID and c.tag == c.workdir.name
    assert all(n.namespace.startswith(f"sr-{BIGGEST_PID}-") for n in c.nodes)


def test_each_kind_of_name_is_recognised_only_as_that_kind():
    n = Names(42)
    links = [n.top_bridge, n.rack_bridge(2), n.rack_link(2), n.rack_peer(2), n.node_link(7), n.node_peer(7)]
    assert links == ["sr42b", "sr42b2", "sr42r2", "sr42u2", "sr42n7", "sr42s7"]
    assert (n.switch_namespace, n.node_namespace(7), n.workdir(Path("/t"))) == ("sr-42-sw", "sr-42-n7",
                                                                               Path("/t/sr-42"))
    assert {link_owner(x) for x in links} == {42} and {namespace_owner(x) for x in links} == {None}
    assert namespace_owner("sr-42-n7") == namespace_owner("sr-42-sw") == 42 == workdir_owner("sr-42")
    for foreign in ("eth0", "sr-42", "sr-42-x", "sr42", "sr42x1", "sr-42-n", "xsr42b", "sr42b-"):
        assert link_owner(foreign) is None and namespace_owner(foreign) is None
    assert workdir_owner("sr-42-sw") is None and workdir_owner("sr42") is None


def test_the_package_re_exports_its_layers():
    assert synth.testbed.describe_cluster is description.describe_cluster
    assert synth.testbed.mpiexec_command is commands.mpiexec_command
    assert synth.testbed.find_mpiexec is namespaces.find_mpiexec
    assert {name for name in synth.testbed.__all__ if not hasattr(synth.testbed, name)} == set()


def test_addresses_are_distinct_hosts_of_the_private_subnet():
    c = describe_cluster(RACKS, 42)
    addresses = [c.launcher_address] + [n.address for n in c.nodes]
    assert SUBNET.is_private and SUBNET.prefixlen == 24
    assert len(set(addresses)) == len(addresses) == 13
    assert all(a in {str(h) for h in SUBNET.hosts()} for a in addresses)


def test_nodes_and_ranks_follow_the_device_order():
    c = describe_cluster(load_topology("testbed-2x4"), 42)
    assert [(n.index, n.ranks) for n in c.nodes] == [(0, 4), (1, 4)] and c.ranks == 8
    assert hostfile_text(c) == "10.213.0.2 slots=4\n10.213.0.3 slots=4\n"
    assert describe_cluster(load_topology("testbed-2x4"), 42, ranks_per_node=2).ranks == 4


@pytest.mark.parametrize("name, kwargs, scale, node_bit_s", [
    ("testbed-2x4", {}, 1.0, 1e9),                        # 0.125 GB/s = 1 Gbit/s: applied as-is
    ("p2-a100", {}, 1 / 64, 1e9),                         # auto: 8 GB/s scaled to 1 Gbit/s
    ("dgx-a100", {}, 0.125 / 192, 1e9),                   # 24 GB/s x 8 ports is one uplink
    ("testbed-2x4", {"rate_scale": 0.5}, 0.5, 5e8),
    ("p2-a100", {"node_rate_gbit": 2.0}, 2 / 64, 2e9),
])
def test_rates_are_the_topology_bandwidths_times_the_documented_scale(name, kwargs, scale, node_bit_s):
    c = describe_cluster(load_topology(name), 42, **kwargs)
    assert c.rate_scale == pytest.approx(scale)
    assert c.node_shaping.rate_bit_s == pytest.approx(node_bit_s, rel=1e-9)
    assert c.node_shaping.burst_bytes == max(128 * 1024, round(node_bit_s / 8 * 0.002))
    assert c.node_shaping.latency_ms == 50 and c.rack_shaping is None


def test_racks_get_their_own_bridge_and_shaped_uplink():
    c = describe_cluster(RACKS, 42)
    assert len(c.racks) == 3 and len(c.nodes) == 12
    assert [n.rack for n in c.nodes] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(n.bridge == c.racks[n.rack].bridge != c.top_bridge for n in c.nodes)
    assert c.rack_shaping.rate_bit_s == 5e8 and c.node_shaping.rate_bit_s == 1e9  # auto keeps them as-is
    shaped = {cmd[cmd.index("dev") + 1] for cmd in build_commands(c) if cmd[0] == "tc"}
    assert shaped == {name for r in c.racks for name in (r.link, r.peer)} | {
        name for n in c.nodes for name in (n.link, n.peer)}
    # auto scaling looks at the fastest shaped level, the rack here
    fast_racks = topology(("rack", 2, 1.0), ("node", 2, 0.25), ("rank", 2, 2.0))
    c = describe_cluster(fast_racks, 42)
    assert (c.rack_shaping.rate_bit_s, c.node_shaping.rate_bit_s) == (1e9, 2.5e8)


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_every_link_and_bridge_gets_the_mtu(mtu):
    """Both ends of every veth and every bridge carry the MTU (a path takes the
    smallest of its links'), and the description names it."""
    c = describe_cluster(RACKS, 42, mtu_bytes=mtu)
    created = [cmd for cmd in build_commands(c) if "add" in cmd and "type" in cmd]
    bridges = [cmd for cmd in created if cmd[-1] == "bridge"]
    veths = [cmd for cmd in created if "veth" in cmd]
    assert len(bridges) == 1 + len(c.racks) and len(veths) == len(c.racks) + len(c.nodes)
    for cmd in bridges:
        assert cmd[cmd.index("mtu") + 1] == str(mtu)
    for cmd in veths:  # the link's own end, then the peer's
        ends = [i for i, word in enumerate(cmd) if word == "mtu"]
        assert len(ends) == 2 and ends[0] < cmd.index("peer") < ends[1]
        assert all(cmd[i + 1] == str(mtu) for i in ends)
    assert f"links: MTU {mtu} bytes" in describe_text(c)


@pytest.mark.parametrize("mtu", [0, 576, 65536])
def test_an_mtu_out_of_range_is_refused_with_the_range(mtu):
    with pytest.raises(SynthError, match=rf"--mtu {mtu}: must be between 1280 and 65535 bytes"):
        describe_cluster(RACKS, 42, mtu_bytes=mtu)


def test_commands_touch_only_the_clusters_own_namespaces():
    c = describe_cluster(RACKS, 42)
    ours = set(c.namespaces)
    for cmd in build_commands(c):
        if cmd[:3] == ("ip", "netns", "add"):
            assert cmd[3] in ours
        elif "-n" in cmd:
            assert cmd[cmd.index("-n") + 1] in ours, cmd
        else:  # a node's veth pair, created with both ends inside our namespaces
            assert cmd[:3] == ("ip", "link", "add") and cmd.count("netns") == 2, cmd
            assert {cmd[i + 1] for i, word in enumerate(cmd) if word == "netns"} <= ours


@pytest.mark.parametrize("levels, expected", [
    ([("rank", 4, 1.0)], "has 1 level(s); the emulator takes [node, rank] or [rack, node, rank]"),
    ([("rack", 2, 1.0), ("node", 2, 1.0), ("cpu", 2, 1.0), ("gpu", 2, 1.0)], "has 4 level(s)"),
    ([("node", 254, 0.125), ("rank", 1, 1.0)], "has 254 nodes; the emulator's /24 holds at most 253"),
    ([("node", 2, 0.0001), ("rank", 1, 1.0)], "shaped to 800000 bit/s, below 1 Mbit/s"),
])
def test_topologies_it_cannot_emulate_are_refused(levels, expected):
    with pytest.raises(SynthError, match=re.escape(expected)):
        describe_cluster(topology(*levels), 42)


def test_the_agent_runs_the_command_in_the_hosts_node(tmp_path):
    """The agent under sh with a stand-in 'ip' that prints its arguments."""
    c = describe_cluster(load_topology("testbed-2x4"), 42)
    (tmp_path / "agent").write_text(agent_script(c))
    (tmp_path / "ip").write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    (tmp_path / "ip").chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["sh", str(tmp_path / "agent"), "-x", "10.213.0.3", "prted --x 1"],
                          capture_output=True, text=True, env=env, timeout=limit_s(10))
    assert done.returncode == 0, done.stderr
    words = [w[1:-1] for w in done.stdout.split("\n") if w]
    assert words[:3] == ["netns", "exec", "sr-42-n1"]
    assert words[-5:] == ["sr-42-n1", str(c.nodes[1].tmpdir), "sh", "-c", "prted --x 1"]
    assert "unshare" in words and "--uts" in words and "--mount" in words
    unknown = subprocess.run(["sh", str(tmp_path / "agent"), "10.213.0.9", "true"], capture_output=True,
                             text=True, env=env, timeout=limit_s(10))
    assert unknown.returncode == 255 and "no node 10.213.0.9" in unknown.stderr


def test_mpiexec_runs_in_the_switch_namespace_with_the_testbed_flags():
    c = describe_cluster(load_topology("testbed-2x4"), 42)
    cmd = mpiexec_command(c, "/x/mpiexec", ["hostname"])
    assert cmd[:4] == ("ip", "netns", "exec", c.switch_namespace)
    flags = " ".join(cmd[cmd.index("/x/mpiexec"):])
    for flag in ("-n 8 ", f"--hostfile {c.hostfile_path}", f"plm_ssh_agent {c.agent_path}",
                 "oob_tcp_if_include 10.213.0.0/24", "btl_tcp_if_include 10.213.0.0/24",
                 "mpi_yield_when_idle 1", "--bind-to none", "--oversubscribe", "--map-by slot"):
        assert flag in flags
    assert cmd[-4:] == ("sh", "-c", RANK_GUARD, "hostname")  # see RANK_PAUSE_S


def test_the_rank_guard_keeps_the_exit_status():
    done = subprocess.run(["sh", "-c", RANK_GUARD, "sh", "-c", "echo $0 $1; exit 3", "a b", "c"],
                          capture_output=True, text=True, timeout=limit_s(10))
    assert (done.returncode, done.stdout) == (3, "a b c\n")


# ---------------------------------------------------------------- watching the ranks


PRTED = Process(5, ("/venv/bin/prted", "--daemonize"))


def rank(pid: int, r: int, guard: bool = True) -> Process:
    """A rank's guard shell, or (``guard=False``) its command."""
    return Process(pid, ("sh", "-c", RANK_GUARD, "/usr/bin/sleep", "300") if guard else ("/usr/bin/sleep", "300"), r)


def test_the_watch_stops_a_job_only_when_no_rank_has_run_for_the_grace_period():
    c = describe_cluster(load_topology("testbed-2x4"), 42, ranks_per_node=1)
    n0, n1 = (n.namespace for n in c.nodes)
    watch = JobWatch(c.nodes, grace_s=10)
    running = {n0: [PRTED, rank(10, 0), rank(11, 0, guard=False)], n1: [PRTED, rank(20, 1), rank(21, 1, False)]}
    assert watch.observe(0, {n0: [PRTED], n1: [PRTED]}) is None
    assert watch.observe(100, {n0: [PRTED], n1: []}) is None  # no rank started yet: no stall, however long
    assert watch.observe(101, running) is None
    assert watch.observe(102, {n0: running[n0], n1: [PRTED]}) is None  # n1's ranks ended first: n0's still run
    assert watch.observe(500, {n0: running[n0], n1: [PRTED]}) is None
    stalled = {n0: [PRTED, rank(11, 0, guard=False)], n1: [PRTED]}  # rank 0's guard died, its command did not
    assert watch.observe(501, stalled) is None
    assert watch.observe(510.9, stalled) is None  # the grace period counts from the last rank's end
    assert watch.observe(511, stalled) == (
        f"node {n0}: the guard shell of rank 0 is gone but its sleep (pid 11) still runs; "
        "mpiexec has waited 10 s since the last rank's guard ended: stopping the job")

    watch = JobWatch(c.nodes, grace_s=10)  # nothing left of the ranks: the node whose ranks ended first
    for now, snapshot in [(0, running), (1, {n0: running[n0], n1: []}), (2, {}), (3, running), (4, {}),
                          (5, {n0: [PRTED], n1: running[n1]}), (6, {})]:
        assert watch.observe(now, snapshot) is None  # ranks that run again reset the clock
    assert watch.observe(16, {}) == (
        f"every rank has ended (first those of node {n0}) but mpiexec has waited 10 s since the last rank's "
        "guard ended: stopping the job")


def test_the_watch_names_the_ranks_left_running_after_mpiexec_ended():
    c = describe_cluster(load_topology("testbed-2x4"), 42, ranks_per_node=2)
    n0, n1 = (n.namespace for n in c.nodes)
    watch = JobWatch(c.nodes)
    assert watch.left_running({n0: [PRTED, rank(11, 0, guard=False)], n1: []}) is None  # no guard: no rank runs
    assert watch.left_running({n0: [PRTED, rank(12, 1), rank(10, 0)], n1: [rank(20, 2), rank(21, 2, False)]}) == (
        f"mpiexec ended while ranks still ran: 0, 1 on node {n0}; 2 on node {n1}, whose daemon (prted) is gone")


# ---------------------------------------------------------------- the command without root


def test_plan_is_a_dry_run_that_needs_no_root(cli, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out, err = cli("emulate", "plan", "--topology", "testbed-2x4")
    assert code == 0, err
    pid = os.getpid()
    assert f"cluster sr-{pid} emulating testbed-2x4: 2 nodes x 4 ranks = 8 MPI ranks" in out
    assert "node uplink shaped to 1 Gbit/s per direction" in out
    assert f"  ip netns add sr-{pid}-n1\n" in out
    assert f"tc -n sr-{pid}-sw qdisc add dev sr{pid}s1 root tbf rate 1000000000bit burst 250000 latency 50ms" in out
    assert "mpiexec -n 8 --hostfile" in out
    assert not Path(describe_cluster(load_topology("testbed-2x4"), pid).workdir).exists()


@pytest.mark.parametrize("argv, usage", [
    (["--help"], "usage: synth-reduce emulate --topology T [options] -- COMMAND..."),
    (["plan", "--help"], "usage: synth-reduce emulate plan [-h] --topology TOPOLOGY"),
    (["down", "--help"], "usage: synth-reduce emulate down [-h] [--all] [--verbose]"),
], ids=["job", "plan", "down"])
def test_help_shows_how_each_form_is_called(capsys, argv, usage):
    with pytest.raises(SystemExit) as stopped:
        emulate_main(argv)
    out = capsys.readouterr().out
    assert stopped.value.code == 0 and out.startswith(usage), out
    if argv == ["--help"]:  # the whole usage line; the options are still listed below it
        assert out.startswith(usage + "\n\n"), out
        assert all(option in out for option in ("--topology", "--ranks-per-node", "--rate-scale", "--verbose"))


@pytest.mark.parametrize("argv, expected", [
    (["--topology", "testbed-2x4", "--", "true"], "synth-reduce emulate needs root (network namespaces, tc); "
     "run it as root, or 'synth-reduce emulate plan' for a dry run"),
    (["down"], "synth-reduce emulate needs root"),
    (["--topology", "testbed-2x4"], "give the command to run after '--'"),
    (["--topology", "rack", "--", "true"], "topology rack has 4 level(s)"),
    (["plan", "--topology", "testbed-2x4", "--rate-scale", "x"], "--rate-scale x: expected a number or 'auto'"),
    (["plan", "--topology", "p2-a100", "--rate-scale", "1", "--node-rate-gbit", "1"],
     "give --rate-scale or --node-rate-gbit, not both"),
])
def test_refusals_are_one_line(cli, monkeypatch, argv, expected):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert usage_error(cli, "emulate", *argv).startswith(expected)


# ---------------------------------------------------------------- real clusters (root)


def unavailable() -> str | None:
    """Why real clusters cannot be built here, or None."""
    if sys.platform != "linux":
        return "the emulator needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the emulator needs root (network namespaces, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (iproute2 / util-linux)"
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True, timeout=limit_s(10))
    if probe.returncode != 0:
        return f"cannot create network namespaces here: {probe.stderr.strip()}"
    try:
        import mpi4py  # noqa: F401
        find_mpiexec()
    except (ImportError, SynthError) as exc:
        return f"MPI is not installed ({exc}): pip install '.[test]'"
    return None


@pytest.fixture
def emulate(tmp_path):
    """Start ``synth-reduce emulate`` subprocesses; the finalizer stops any
    still running and removes whatever their clusters left (down)."""
    reason = unavailable()
    if reason:
        warnings.warn(f"emulated-cluster tests skipped: {reason}")
        pytest.skip(reason)
    started: list[subprocess.Popen] = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))

    def start(*argv: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "synth.cli", "emulate", *argv], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    down()


def finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str, str]:
    """Wait for ``proc``; a hang fails the test (after SIGTERM, which tears down)."""
    limit = limit_s(timeout_s)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=limit_s(30))
        pytest.fail(f"emulate did not finish in {limit:.0f} s\n{out}\n{err}")
    return proc.returncode, out, err


def assert_nothing_left(pid: int) -> None:
    assert scan().get(pid) is None
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    assert f"sr-{pid}-" not in namespaces and f"sr{pid}" not in links


TWO_BY_TWO = """\
name: testbed-2x2
levels:
  - {name: node, count: 2, bandwidth_GBps: 0.125, latency_us: 100.0}
  - {name: rank, count: 2, bandwidth_GBps: 2.0, latency_us: 10.0}
"""


@pytest.mark.mpi
def test_bench_on_a_two_node_cluster_is_exact_and_leaves_nothing(emulate, tmp_path):
    (tmp_path / "2x2.yaml").write_text(TWO_BY_TWO)
    proc = emulate("--topology", "2x2.yaml", "--", sys.executable, "-m", "synth.cli", "bench",
                   "--topology", "2x2.yaml", "--axes", "dp=4", "--sizes", "64K", "--iters", "3", "--warmup", "1",
                   "--top", "2")
    code, out, err = finish(proc, timeout_s=120)
    assert code == 0, out + err
    assert "node uplink shaped to 1 Gbit/s per direction" in err
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    timed = [row for row in rows if len(row) == 10]
    assert len(timed) >= 2, out  # the default and the best predicted other program
    assert all(row[-1] == "0" for row in timed), out
    assert_nothing_left(proc.pid)


@pytest.mark.mpi
def test_the_links_a_rank_sees_carry_the_requested_mtu(emulate, tmp_path):
    (tmp_path / "2x2.yaml").write_text(TWO_BY_TWO)
    proc = emulate("--topology", "2x2.yaml", "--mtu", "9000", "--", "ip", "-o", "link", "show")
    code, out, err = finish(proc, timeout_s=60)
    assert code == 0, out + err
    assert "links: MTU 9000 bytes" in err
    links = [line for line in out.splitlines() if ": lo:" not in line and " mtu " in line]
    assert len(links) == 4, out  # each rank sees its node's end of the uplink, nothing else
    assert all(" mtu 9000 " in line for line in links), out
    assert_nothing_left(proc.pid)


@pytest.mark.mpi
def test_the_uplink_benchmark_runs_across_two_nodes(emulate, tmp_path):
    """scripts/bench_uplink.py (docs/testbed.md): a raw TCP stream and MPI
    pairs across the emulated nodes, each row with its ratio to the bound."""
    (tmp_path / "2x2.yaml").write_text(TWO_BY_TWO)
    proc = emulate("--topology", "2x2.yaml", "--mtu", "9000", "--", sys.executable,
                   str(REPO / "scripts" / "bench_uplink.py"), "--size", "2M", "--iters", "1")
    code, out, err = finish(proc, timeout_s=90)
    assert code == 0, out + err
    rows = [line for line in out.splitlines() if "ratio" in line]
    assert [row.split("  ")[0].strip() for row in rows] == [
        "raw TCP, one stream", "MPI_Sendrecv, 2 pair(s) at once", "MPI_Sendrecv, 1 pair(s) at once"], out
    assert all(float(re.search(r"ratio (\d+\.\d+)", row).group(1)) > 0 for row in rows), out
    assert "bound 16.8 ms" in rows[0], out  # 2 MiB at 1 Gbit/s
    assert_nothing_left(proc.pid)


@pytest.mark.mpi
def test_a_failing_command_or_sigterm_still_tears_down(emulate, tmp_path):
    (tmp_path / "2x2.yaml").write_text(TWO_BY_TWO)
    failing = emulate("--topology", "2x2.yaml", "--", "false")
    code, _, err = finish(failing, timeout_s=60)
    assert code != 0 and "torn down" in err
    assert_nothing_left(failing.pid)

    waiting = emulate("--topology", "2x2.yaml", "--", "sleep", "60")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(scan().get(waiting.pid, Leftovers(0)).namespaces) < 3:
        time.sleep(0.1)
    time.sleep(1.0)  # mpiexec started the ranks
    waiting.send_signal(signal.SIGTERM)
    code, _, err = finish(waiting, timeout_s=60)
    assert code == 128 + signal.SIGTERM, err
    assert_nothing_left(waiting.pid)


def node_processes(namespace: str) -> list[tuple[int, list[str], dict[str, str]]]:
    """(pid, argv, environment) of each process in ``namespace``, read independently of the package."""
    found = []
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=limit_s(10)).stdout
    for pid in map(int, pids.split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
            env = dict(item.partition("=")[::2] for item in
                       Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if item)
        except OSError:  # gone meanwhile
            continue
        found.append((pid, argv, env))
    return found


def rank_guards(namespace: str) -> dict[int, int]:
    """{rank: pid} of the rank guard shells running in a node's namespace."""
    return {int(env["OMPI_COMM_WORLD_RANK"]): pid for pid, argv, env in node_processes(namespace)
            if argv[1:3] == ["-c", RANK_GUARD]}


def sleeping_job(emulate, tmp_path) -> tuple[subprocess.Popen, str]:
    """``emulate`` running ``sleep 300`` on the 2x2 cluster, once the guards of
    all 4 ranks run; with its second node's namespace."""
    (tmp_path / "2x2.yaml").write_text(TWO_BY_TWO)
    job = emulate("--topology", "2x2.yaml", "--", "sleep", "300")
    nodes = [f"sr-{job.pid}-n{i}" for i in range(2)]
    deadline = time.monotonic() + 60
    while sum(len(rank_guards(ns)) for ns in nodes) < 4:
        assert job.poll() is None, job.communicate()
        if time.monotonic() > deadline:
            pytest.fail("the ranks did not start within 60 s")  # the fixture stops the job
        time.sleep(0.2)
    return job, nodes[1]


@pytest.mark.mpi
@pytest.mark.slow
def test_a_rank_whose_guard_dies_ends_the_job_with_a_message_naming_its_node(emulate, tmp_path):
    """Killing a rank's guard shell leaves its command running outside MPI's
    control: mpiexec would wait for it (here 300 s). emulate notices that no
    rank runs any more, names the node and stops the job within a bounded time."""
    job, n1 = sleeping_job(emulate, tmp_path)
    time.sleep(1.0)  # emulate has seen the ranks of both nodes running
    rank, victim = sorted(rank_guards(n1).items())[0]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    code, _, err = finish(job, timeout_s=120)
    took = time.monotonic() - killed
    assert took < 60, err  # the stopped job and its teardown; without the watch mpiexec waits the 300 s
    assert code != 0, err
    ours = [line for line in err.splitlines() if line.startswith("synth-reduce emulate:") and n1 in line]
    assert len(ours) == 1, err
    assert f"rank {rank}" in ours[0] and "guard" in ours[0] and "sleep" in ours[0], ours[0]
    assert_nothing_left(job.pid)


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.mpi
def test_a_node_whose_daemon_dies_fails_the_job_with_a_message_naming_it(emulate, tmp_path):
    """When a node's daemon (prted) dies, mpiexec ends the job at once with exit
    code 0 and leaves the ranks running; emulate says so and exits nonzero."""
    job, n1 = sleeping_job(emulate, tmp_path)
    daemon = parent(min(rank_guards(n1).values()))
    os.kill(daemon, signal.SIGKILL)
    code, _, err = finish(job, timeout_s=60)
    assert code != 0, err
    ours = [line for line in err.replace("\0", "").splitlines()
            if line.startswith("synth-reduce emulate:") and f"{n1}, whose daemon (prted) is gone" in line]
    assert len(ours) == 1, err
    assert_nothing_left(job.pid)
