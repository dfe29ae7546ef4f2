"""The ``sr-<pid>`` naming scheme: every namespace, link, bridge and work folder
of a cluster carries the pid of the ``emulate`` process that owns it, so runs
never collide and ``down`` recognises leftovers exactly (and nothing else).

    namespaces   sr-<pid>-sw (the switch), sr-<pid>-n<i> (node i; also its hostname)
    links        sr<pid>b (top bridge), sr<pid>b<r> (rack r's bridge),
                 sr<pid>n<i> / sr<pid>s<i> (node / switch end of node i's veth),
                 sr<pid>r<r> / sr<pid>u<r> (rack / top end of rack r's uplink)
    work folder  $TMPDIR/sr-<pid>

Links have no dash: a link name holds at most ``MAX_LINK_NAME`` characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_LINK_NAME = 15  # IFNAMSIZ - 1

_NAMESPACE = re.compile(r"^sr-(\d+)-(sw|n\d+)$")
_LINK = re.compile(r"^sr(\d+)(b\d*|[nsru]\d+)$")
_WORKDIR = re.compile(r"^sr-(\d+)$")


@dataclass(frozen=True)
class Names:
    """The names of the cluster owned by process ``owner_pid``."""

    owner_pid: int

    @property
    def tag(self) -> str:
        """The cluster's name in messages, and its work folder's."""
        return f"sr-{self.owner_pid}"

    def workdir(self, root: Path) -> Path:
        return root / self.tag

    @property
    def switch_namespace(self) -> str:
        return f"{self.tag}-sw"

    def node_namespace(self, i: int) -> str:
        return f"{self.tag}-n{i}"

    @property
    def top_bridge(self) -> str:
        return self._link("b")

    def rack_bridge(self, r: int) -> str:
        return self._link("b", r)

    def rack_link(self, r: int) -> str:
        """The rack's end of its uplink, a port of the rack's bridge."""
        return self._link("r", r)

    def rack_peer(self, r: int) -> str:
        """The top end of rack ``r``'s uplink, a port of the top bridge."""
        return self._link("u", r)

    def node_link(self, i: int) -> str:
        """Node ``i``'s end of its veth pair, inside its namespace."""
        return self._link("n", i)

    def node_peer(self, i: int) -> str:
        """The switch's end of node ``i``'s veth pair, a port of a bridge."""
        return self._link("s", i)

    def _link(self, kind: str, index: int | None = None) -> str:
        return f"sr{self.owner_pid}{kind}{'' if index is None else index}"


def _owner(pattern: re.Pattern[str], name: str) -> int | None:
    m = pattern.match(name)
    return int(m.group(1)) if m else None


def namespace_owner(name: str) -> int | None:
    """The owner pid of a namespace named by this scheme, else None."""
    return _owner(_NAMESPACE, name)


def link_owner(name: str) -> int | None:
    """The owner pid of a link or bridge named by this scheme, else None."""
    return _owner(_LINK, name)


def workdir_owner(name: str) -> int | None:
    """The owner pid of a work folder (its last path component) named by this scheme, else None."""
    return _owner(_WORKDIR, name)
