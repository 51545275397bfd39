"""tools/faultproxy.py against a real TCP echo server: it passes, holds (and then delivers), crawls and cuts."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import Iterator

import pytest

from tools.faultproxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address  # type: ignore[misc]
    server.shutdown()
    server.server_close()


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def test_passes_then_holds_open_connections_and_new_ones_then_delivers(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy:
        assert proxy.endpoint == f"http://127.0.0.1:{proxy.address[1]}" and proxy.mode == "pass"
        with socket.create_connection(proxy.address, timeout=2) as s:
            s.sendall(b"hello")
            assert _recv(s, 5) == b"hello"
            proxy.hold()
            s.sendall(b"frozen")
            s.settimeout(0.3)
            with pytest.raises(TimeoutError):  # open, silent: nothing back, nothing closed
                s.recv(6)
            with socket.create_connection(proxy.address, timeout=2) as fresh:  # accepted, never answered
                fresh.sendall(b"new")
                fresh.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    fresh.recv(3)
                proxy.passthrough()  # held bytes go on
                fresh.settimeout(2)
                assert _recv(fresh, 3) == b"new"
            s.settimeout(2)
            assert _recv(s, 6) == b"frozen"
        assert proxy.stats.connections == 2


def test_slow_answers_a_chunk_at_a_time(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy, socket.create_connection(proxy.address, timeout=5) as s:
        proxy.slow(delay=0.1, chunk=100)
        t0 = time.monotonic()
        s.sendall(b"x" * 500)
        assert _recv(s, 500) == b"x" * 500
        assert time.monotonic() - t0 >= 0.4  # five chunks, 0.1 s apart
        with pytest.raises(ValueError):
            proxy.slow(delay=-1)


def test_cut_resets_open_and_new_connections(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy, socket.create_connection(proxy.address, timeout=2) as s:
        s.sendall(b"a")
        assert _recv(s, 1) == b"a"
        proxy.cut()
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            s.sendall(b"b")
            if not s.recv(1):  # an orderly close would give b""; a reset raises
                raise AssertionError("closed with FIN, not reset")
        with pytest.raises(ConnectionResetError):  # at connect, or at the first send or receive
            with socket.create_connection(proxy.address, timeout=2) as fresh:
                time.sleep(0.1)
                fresh.sendall(b"c")
                fresh.recv(1)
        assert proxy.stats.reset >= 2


def test_hold_after_stops_a_transfer_in_its_middle(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy, socket.create_connection(proxy.address, timeout=2) as s:
        proxy.hold_after(to_client=1000)
        s.sendall(b"y" * 3000)
        assert _recv(s, 1000) == b"y" * 1000
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):
            s.recv(1)
        assert proxy.mode == "hold"
        proxy.passthrough()
        s.settimeout(2)
        assert _recv(s, 2000) == b"y" * 2000
