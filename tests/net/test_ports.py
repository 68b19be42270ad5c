"""`phalanx.ops.ports`: listen ports are chosen outside the kernel's ephemeral range, and a dial
that reaches itself (TCP simultaneous open on a port nobody listens on) is refused."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
import trio

from phalanx.net import transport
from phalanx.ops.ports import (
    IANA_RANGE,
    LINUX_DEFAULT_RANGE,
    LOWEST_PORT,
    ephemeral_port_range,
    free_ports,
    in_ephemeral_range,
    listen_window,
)


def test_range_is_read_from_the_kernel_file_with_fallbacks(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("20000\t40000\n")
    assert ephemeral_port_range(f, platform="linux") == (20_000, 40_000)
    f.write_text("garbage")
    assert ephemeral_port_range(f, platform="linux") == LINUX_DEFAULT_RANGE
    assert ephemeral_port_range(tmp_path / "missing", platform="linux") == LINUX_DEFAULT_RANGE
    assert ephemeral_port_range(f, platform="darwin") == IANA_RANGE


@pytest.mark.parametrize("ephemeral", [(32_768, 60_999), (15_000, 30_000), (10_050, 65_000),
                                       (1_024, 65_535)])
@pytest.mark.parametrize("span", [1, 203, 400])
def test_listen_window_keeps_the_whole_span_out_of_the_range_when_it_can(
        ephemeral: tuple[int, int], span: int) -> None:
    first, last = listen_window(span, ephemeral)
    assert LOWEST_PORT <= first <= last <= 65_536 - span
    room = (ephemeral[0] - LOWEST_PORT) + (65_535 - ephemeral[1])
    if room >= span + 200:
        for base in (first, last):
            assert not any(in_ephemeral_range(p, ephemeral) for p in range(base, base + span))


def test_free_ports_are_distinct_bindable_and_not_ephemeral() -> None:
    ports = free_ports(12, rng=random.Random(5))
    assert len(set(ports)) == 12
    assert not any(in_ephemeral_range(p) for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


async def test_a_dial_that_reaches_itself_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await sock.connect(("127.0.0.1", port))  # simultaneous open: the socket meets itself
    assert sock.getsockname() == sock.getpeername()
    stream = trio.SocketStream(sock)

    async def fake_open(host: str, p: int) -> trio.SocketStream:
        assert (host, p) == ("127.0.0.1", port)
        return stream

    monkeypatch.setattr(transport.trio, "open_tcp_stream", fake_open)
    with pytest.raises(OSError, match="reached itself"):
        await transport.open_tcp_stream_to_other("127.0.0.1", port)
    assert sock.fileno() == -1  # closed, so the port is free again
