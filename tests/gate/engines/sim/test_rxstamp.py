"""Kernel receive stamps: a request's arrival does not move when the reader is late."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from gate.engines.sim import rxstamp

needs_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's"
)


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listening = rxstamp.listener(socket.AF_INET, socket.SOCK_STREAM, 0)
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    client = socket.create_connection(listening.getsockname())
    server, _ = listening.accept()
    return listening, client, server


@needs_linux
def test_a_late_read_still_gets_the_time_the_bytes_arrived() -> None:
    listening, client, server = _pair()
    try:
        assert isinstance(server, rxstamp.StampedSocket)
        assert rxstamp.last_rx_ns(server.fileno()) == 0  # nothing read yet
        before = time.monotonic_ns()
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        after = time.monotonic_ns()  # loopback: the bytes arrived inside sendall
        time.sleep(0.05)  # the reader is 50 ms late
        assert server.recv(1024) == b"GET / HTTP/1.1\r\n\r\n"
        read = time.monotonic_ns()
        stamp = rxstamp.last_rx_ns(server.fileno())
        # at the send, not the read (1 ms for the realtime-to-monotonic conversion), however
        # long this process was descheduled around the send
        assert before - 1_000_000 < stamp < after + 1_000_000
        assert read - stamp > 40_000_000

        client.sendall(b"second")
        time.sleep(0.02)
        assert server.recv(1024) == b"second"
        later = rxstamp.last_rx_ns(server.fileno())
        assert later > stamp + 15_000_000  # each read carries its own stamp
    finally:
        for s in (client, server, listening):
            s.close()


@needs_linux
def test_unknown_descriptors_have_no_stamp() -> None:
    with socket.socket() as plain:
        assert rxstamp.last_rx_ns(plain.fileno()) == 0


def test_without_the_option_the_listener_is_a_plain_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rxstamp, "SO_TIMESTAMPNS", None)
    with rxstamp.listener(socket.AF_INET, socket.SOCK_STREAM, 0) as sock:
        assert type(sock) is socket.socket
