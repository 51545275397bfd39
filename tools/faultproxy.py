"""A fault-injecting TCP proxy on 127.0.0.1: put it in front of a server to make it freeze, crawl or drop.

Tests point a client at :attr:`FaultProxy.endpoint` instead of the server, then change what
the proxy does while the client works:

- :meth:`~FaultProxy.passthrough` (the start): bytes pass both ways;
- :meth:`~FaultProxy.hold`: the server "freezes" as a stopped process does: new connections
  are accepted and never answered, open ones stop passing bytes in either direction, and
  nothing is closed (the client sees an open, silent socket);
- :meth:`~FaultProxy.slow`: bytes toward the client pass ``chunk`` at a time, ``delay``
  seconds apart (a server that answers, slowly);
- :meth:`~FaultProxy.cut`: every open connection is reset (TCP RST), and so is every new
  one as it arrives (the server died);
- :meth:`~FaultProxy.hold_after`: hold once so many more bytes have passed toward the
  server or the client, i.e. in the middle of an upload or a download.

Held bytes are delivered when the proxy passes again. The proxy is a few threads per
connection: fine for tests, not for load. Not part of the fastfeed package (``tools/`` is
the repository's tooling); the library never imports it.

Example:
    >>> import socket, socketserver, threading
    >>> class Echo(socketserver.BaseRequestHandler):
    ...     def handle(self):
    ...         while data := self.request.recv(1024):
    ...             self.request.sendall(data)
    >>> server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    >>> threading.Thread(target=server.serve_forever, daemon=True).start()
    >>> with FaultProxy(server.server_address) as proxy:
    ...     with socket.create_connection(proxy.address, timeout=2) as s:
    ...         s.sendall(b"ping"); echoed = s.recv(4)
    ...         proxy.hold(); s.sendall(b"lost?"); s.settimeout(0.2)
    ...         try:
    ...             s.recv(5)
    ...         except TimeoutError:
    ...             print(echoed, "then silence")
    b'ping' then silence
    >>> server.shutdown(); server.server_close()

From a shell, in front of a server on port 9000 (``kill -USR1`` holds, ``-USR2`` passes)::

    python -m tools.faultproxy 127.0.0.1:9000 --port 9001 --mode hold
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

__all__ = ["FaultProxy", "ProxyStats", "main"]

log = logging.getLogger(__name__)

MODES = ("pass", "hold", "slow", "cut")
_BUFFER = 64 * 1024
_POLL_S = 0.05  # how often blocked threads look at the mode and at close()


@dataclass
class ProxyStats:
    """What the proxy saw (counters over its life)."""

    connections: int = 0  # accepted
    reset: int = 0  # closed with a TCP reset by cut()
    to_server: int = 0  # bytes forwarded
    to_client: int = 0


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0), not an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """A TCP proxy on ``host`` in front of ``target`` whose behaviour tests switch at any time.

    Args:
        target: the server, ``(host, port)`` or ``"host:port"``.
        host: where the proxy listens (loopback by default).
        port: its port (0: any free one; see :attr:`address`).

    The proxy starts passing bytes when built; use it as a context manager (or call
    :meth:`close`) to stop it.
    """

    def __init__(self, target: tuple[str, int] | Sequence[object] | str, *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if isinstance(target, str):
            h, _, p = target.rpartition(":")
            target = (h or "127.0.0.1", int(p))
        self.target = (str(target[0]), int(target[1]))  # type: ignore[call-overload]
        self.stats = ProxyStats()
        self._mode = "pass"
        self._delay, self._chunk = 0.0, 1
        self._limits: dict[bool, int | None] = {False: None, True: None}  # to_client -> hold at this count
        self._changed = threading.Condition()
        self._closed = False
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, port), backlog=64)
        self._listener.settimeout(_POLL_S)
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop, "faultproxy-accept")

    # ------------------------------------------------------------------ public
    @property
    def address(self) -> tuple[str, int]:
        """(host, port) clients connect to."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def endpoint(self) -> str:
        """``http://host:port`` of the proxy (an ``endpoint_url`` for an HTTP server behind it)."""
        host, port = self.address
        return f"http://{host}:{port}"

    @property
    def mode(self) -> str:
        """What the proxy does now: ``"pass"``, ``"hold"``, ``"slow"`` or ``"cut"``."""
        return self._mode

    def passthrough(self) -> None:
        """Pass bytes both ways again (held bytes go on)."""
        self._set("pass")

    def hold(self) -> None:
        """Freeze: accept connections, answer nothing, close nothing."""
        self._set("hold")

    def slow(self, delay: float = 0.5, chunk: int = 1024) -> None:
        """Pass bytes toward the client ``chunk`` bytes at a time, ``delay`` seconds apart."""
        if delay < 0 or chunk < 1:
            raise ValueError(f"slow(delay={delay}, chunk={chunk}): a delay >= 0 and a chunk >= 1 byte")
        self._delay, self._chunk = float(delay), int(chunk)
        self._set("slow")

    def hold_after(self, *, to_server: int | None = None, to_client: int | None = None) -> None:
        """Hold (see :meth:`hold`) once ``to_server`` / ``to_client`` more bytes have passed that way.

        The bytes that cross the mark are forwarded only up to it, so a transfer stops in
        its middle.
        """
        with self._changed:
            self._limits[False] = None if to_server is None else self.stats.to_server + int(to_server)
            self._limits[True] = None if to_client is None else self.stats.to_client + int(to_client)

    def cut(self) -> None:
        """Reset every open connection and each new one (until another mode is set)."""
        self._set("cut")
        with self._lock:
            socks = list(self._socks)
            self._socks.clear()
        for s in socks:
            _reset(s)
        self.stats.reset += len(socks)

    def close(self) -> None:
        """Stop listening and close every connection (threads end within a moment)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
            self._socks.clear()
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FaultProxy({self.address[0]}:{self.address[1]} -> {self.target[0]}:{self.target[1]}, {self._mode})"

    # ------------------------------------------------------------------ internals
    def _set(self, mode: str) -> None:
        with self._changed:
            self._mode = mode
            self._changed.notify_all()
        log.debug("%r", self)

    def _spawn(self, target: object, name: str, *args: object) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._socks.update(socks)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            self.stats.connections += 1
            if self._mode == "cut":
                _reset(client)
                self.stats.reset += 1
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError as e:
                log.debug("faultproxy: cannot reach %s:%d (%s)", *self.target, e)
                _reset(client)
                continue
            self._track(client, server)
            self._spawn(self._pump, "faultproxy-up", client, server, False)
            self._spawn(self._pump, "faultproxy-down", server, client, True)

    def _gate(self) -> str | None:
        """Wait while the proxy holds; the mode to pass under, or None when closed."""
        with self._changed:
            while self._mode == "hold" and not self._closed:
                self._changed.wait(_POLL_S)
            return None if self._closed else self._mode

    def _pump(self, src: socket.socket, dst: socket.socket, to_client: bool) -> None:
        try:
            while True:
                if self._gate() in (None, "cut"):
                    return
                ready, _, _ = select.select([src], [], [], _POLL_S)
                if not ready:
                    continue
                data = src.recv(_BUFFER)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                if not self._forward(data, dst, to_client):
                    return
        except OSError:  # reset or closed under us: the connection is over
            return

    def _forward(self, data: bytes, dst: socket.socket, to_client: bool) -> bool:
        pos = 0
        while pos < len(data):
            mode = self._gate()
            if mode in (None, "cut"):
                return False
            if mode == "slow" and to_client:
                end = min(len(data), pos + self._chunk)
                time.sleep(self._delay)
            else:
                end = len(data)
            with self._changed:
                limit = self._limits[to_client]
                done = self.stats.to_client if to_client else self.stats.to_server
                if limit is not None:
                    end = min(end, pos + max(0, limit - done))
                if to_client:
                    self.stats.to_client += end - pos
                else:
                    self.stats.to_server += end - pos
                if limit is not None and done + (end - pos) >= limit:
                    self._limits = {False: None, True: None}
                    self._mode = "hold"
                    self._changed.notify_all()
            if end > pos:
                dst.sendall(data[pos:end])
            pos = end
        return True


@contextlib.contextmanager
def _signals(proxy: FaultProxy) -> Iterator[None]:
    old = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    signal.signal(signal.SIGUSR1, lambda *_: proxy.hold())
    signal.signal(signal.SIGUSR2, lambda *_: proxy.passthrough())
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a proxy from the command line until interrupted (SIGUSR1: hold, SIGUSR2: pass)."""
    p = argparse.ArgumentParser(prog="python -m tools.faultproxy", description=__doc__.split("\n")[0])
    p.add_argument("target", help="the server, HOST:PORT")
    p.add_argument("--port", type=int, default=0, help="where to listen on 127.0.0.1 (default: any free port)")
    p.add_argument("--mode", choices=("pass", "hold", "cut"), default="pass", help="what to do at the start")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with FaultProxy(args.target, port=args.port) as proxy, _signals(proxy):
        getattr(proxy, {"pass": "passthrough"}.get(args.mode, args.mode))()
        log.info("%r (kill -USR1 %s: hold, -USR2: pass; Ctrl-C stops)", proxy, os.getpid())
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
