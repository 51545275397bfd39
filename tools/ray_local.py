"""A throwaway multi-node Ray cluster on this machine's loopback, for tests and benchmarks.

Each node is a real ``ray start --block`` process (its own raylet, object store and
worker processes), so killing a node's raylet is what losing a machine looks like to
Ray. Nodes talk over loopback addresses only: the head is ``127.0.0.2``, node ``k``
``127.0.0.{k + 2}`` (in multi-node mode Ray rewrites ``127.0.0.1`` to the host's outward
address, the rest of ``127.0.0.0/8`` it leaves alone; its GCS and raylets still listen on
all interfaces, on random ports, for the cluster's lifetime). Authentication is off,
usage statistics are off and no dashboard is started. Every process is started in its
own session, so :meth:`LocalRayCluster.stop` ends exactly the processes this object
started (by process group), never other Ray clusters of the machine (which
``ray stop --force`` would).

Example:
    >>> with LocalRayCluster(nodes=2, cpus_per_node=1) as cluster:     # doctest: +SKIP
    ...     pack("train", "packed", engine="ray", ray_address=cluster.address)
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from fastfeed.errors import FastfeedError

__all__ = ["LocalRayCluster", "RAY_ENV"]

#: Environment for the nodes and for drivers connecting to them.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
_HEAD_IP = "127.0.0.2"
_STARTED = "Ray runtime started"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ray_cli() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else (shutil.which("ray") or "ray")


class _Node:
    """One ``ray start --block`` process group and its log."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.args = args
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")
        self.proc = subprocess.Popen(
            args, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_started(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _STARTED in self.log_path.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = self.log_path.read_text(errors="replace")[-2000:]
        raise FastfeedError(f"`{' '.join(self.args)}` did not start within {timeout:.0f}s:\n{tail}")

    def raylet_pid(self) -> int | None:
        """Pid of this node's raylet (a child of the ``ray start`` process)."""
        for pid, (_, _, ppid, _) in _live().items():
            if ppid == self.proc.pid and _comm(pid) == "raylet":
                return pid
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM the node's process group, SIGKILL what is left after ``grace`` seconds.

        Ray's worker processes run in sessions of their own: they are found as
        descendants of the node's process and killed by pid if they outlive the node.
        """
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        family = _descendants(self.proc.pid)
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.1)
            if not _group_alive(pgid):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
            pass
        for pid, start in family.items():
            st = _proc_stat(pid)
            if st is not None and st[1] == start:  # the same process, still alive
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._log.close()


def _proc_stat(pid: int) -> tuple[str, str, int, int] | None:
    """(state, start time, ppid, pgid) of a live process, or None (gone or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return fields[0], fields[19], int(fields[1]), int(fields[2])


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _live() -> dict[int, tuple[str, str, int, int]]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and (st := _proc_stat(int(p.name))) is not None:
            out[int(p.name)] = st
    return out


def _descendants(root: int) -> dict[int, str]:
    """Live descendants of ``root``: pid -> start time (to recognise a reused pid)."""
    procs = _live()
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, (_, start, ppid, _) in procs.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process of group ``pgid`` exists."""
    return any(st[3] == pgid for st in _live().values())


class LocalRayCluster:
    """``nodes`` Ray nodes of ``cpus_per_node`` CPUs each, on loopback; see the module doc.

    Args:
        nodes: number of nodes (the head counts as one).
        cpus_per_node: ``--num-cpus`` of each node.
        object_store_memory: bytes of object store per node.
        start_timeout: seconds a node may take to start.
        env: extra environment of the nodes (what a real cluster's nodes would have, e.g.
            ``AWS_ENDPOINT_URL`` and credentials for an object store).
    """

    def __init__(
        self, *, nodes: int = 2, cpus_per_node: int = 1, object_store_memory: int = 200 << 20,
        start_timeout: float = 120.0, env: dict[str, str] | None = None,
    ) -> None:
        self.num_nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.object_store_memory = object_store_memory
        self.start_timeout = start_timeout
        self.port = _free_port(_HEAD_IP)
        self.address = f"{_HEAD_IP}:{self.port}"
        # short path: Ray's unix socket paths live under it
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ffray-"))
        self.env = {**os.environ, **RAY_ENV, **(env or {})}
        self.nodes: list[_Node] = []

    def _node_args(self, k: int) -> list[str]:
        common = [
            "--block", "--num-cpus", str(self.cpus_per_node), "--disable-usage-stats",
            "--object-store-memory", str(self.object_store_memory),
        ]
        if k == 0:
            return [_ray_cli(), "start", "--head", "--port", str(self.port), "--node-ip-address", _HEAD_IP,
                    "--include-dashboard=false", "--temp-dir", str(self.temp_dir), *common]
        return [_ray_cli(), "start", "--address", self.address, "--node-ip-address", f"127.0.0.{k + 2}",
                *common]

    def start_node(self, k: int, *, wait: bool = True) -> None:
        """Start node ``k`` (0 is the head); wait until it runs unless ``wait`` is False."""
        node = _Node(self._node_args(k), self.temp_dir / f"node{k}.log", self.env)
        if k < len(self.nodes):
            self.nodes[k] = node
        else:
            self.nodes.append(node)
        if wait:
            node.wait_started(self.start_timeout)

    def _wait_for_gcs(self) -> None:
        """Until the head's GCS accepts connections (other nodes can start joining then)."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self.nodes[0].alive():
            try:
                socket.create_connection((_HEAD_IP, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.2)
        self.nodes[0].wait_started(0)  # raises with the head's log

    def start(self) -> "LocalRayCluster":
        """Start every node (the others as soon as the head's GCS listens); on failure stop
        what was started and raise."""
        atexit.register(self.stop)  # also when the program ends without calling stop()
        try:
            self.start_node(0, wait=False)
            self._wait_for_gcs()
            for k in range(1, self.num_nodes):
                self.start_node(k, wait=False)
            for node in self.nodes:
                node.wait_started(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def busy(self, k: int, task: str) -> bool:
        """True while a worker of node ``k`` executes a task named ``task`` (its process title)."""
        for pid in _descendants(self.nodes[k].proc.pid):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title.startswith(f"ray::{task}"):
                return True
        return False

    def kill_raylet(self, k: int) -> int:
        """SIGKILL node ``k``'s raylet, as a lost machine; returns its pid."""
        pid = self.nodes[k].raylet_pid()
        if pid is None:
            raise FastfeedError(f"node {k} has no raylet process (already dead?)")
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        """Stop every node this object started (workers first, then the head); idempotent."""
        atexit.unregister(self.stop)
        for node in reversed(self.nodes):
            node.stop()
        self.nodes = []
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRayCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
