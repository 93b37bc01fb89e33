"""Kernel receive stamps: a request's arrival does not move when the reader is late."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from simengine import rxstamp

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
        # The first stamped socket in a while switches the kernel's timestamping on lazily
        # (the listener asks at creation); once on, every read is stamped.
        deadline = time.monotonic() + 2
        while rxstamp.last_rx_ns(server.fileno()) == 0 and time.monotonic() < deadline:
            client.sendall(b"x")
            assert server.recv(16) == b"x"
        assert rxstamp.last_rx_ns(server.fileno()) > 0
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


def test_the_clock_offset_is_read_around_one_instant() -> None:
    """Monotonic minus realtime, as the stamps use it: stable to microseconds across calls
    (both clocks tick together; only a preemption between the reads could move it, and the
    bracket is read again then)."""
    offsets = [rxstamp.mono_minus_real() for _ in range(200)]
    assert max(offsets) - min(offsets) < 200_000
    direct = time.monotonic_ns() - time.time_ns()
    assert abs(offsets[-1] - direct) < 5_000_000


@needs_linux
def test_an_unstamped_read_never_keeps_an_earlier_stamp() -> None:
    listening, client, server = _pair()
    try:
        deadline = time.monotonic() + 2
        while rxstamp.last_rx_ns(server.fileno()) == 0 and time.monotonic() < deadline:
            client.sendall(b"x")
            assert server.recv(16) == b"x"
        assert rxstamp.last_rx_ns(server.fileno()) > 0
        assert rxstamp.SO_TIMESTAMPNS is not None
        server.setsockopt(socket.SOL_SOCKET, rxstamp.SO_TIMESTAMPNS, 0)
        client.sendall(b"y")
        assert server.recv(16) == b"y"
        assert rxstamp.last_rx_ns(server.fileno()) == 0  # the reader falls back to its clock
    finally:
        for s in (client, server, listening):
            s.close()
