"""Choosing listen ports that a killed and restarted node can bind again.

Owns:
    * `ephemeral_port_range()`: the range the kernel draws automatically assigned (outbound)
      source ports from (Linux: ``/proc/sys/net/ipv4/ip_local_port_range``).
    * `listen_window(span)`: the first and last base port from which `span` consecutive
      ports all lie outside that range.
    * `ports_free(host, ports)` and `free_ports(count)`: probes by binding.

Why listen ports stay out of the ephemeral range: between a node's SIGKILL and its restart,
any outbound connection on the machine (peers redialling, clients, the Jepsen proxies) may be
handed the dead node's port number as its *source* port. The port then stays taken for as
long as that connection lives, and the restarted node fails with ``EADDRINUSE``. The kernel
never assigns a port outside the range on its own, so a listen port there can only be taken
by another listener. (A port inside the range can also make a peer that redials it connect
to itself; the transport drops such a self-connection, see `net.transport`.)

Rules:
    * Probes are advisory: a port found free can be taken before it is bound.
    * Randomness is injected (`rng`) so tests can replay a choice; by default each call
      draws afresh so concurrent callers rarely pick the same ports.
"""

from __future__ import annotations

import random
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Final

LOWEST_PORT: Final = 10_000
"""Never choose below this: the low ports are where well-known services live."""

LINUX_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_RANGE: Final = (32_768, 60_999)
IANA_RANGE: Final = (49_152, 65_535)  # the BSDs', macOS' and Windows' default


def ephemeral_port_range(
    range_file: Path = LINUX_RANGE_FILE, platform: str = sys.platform
) -> tuple[int, int]:
    """The inclusive range of automatically assigned source ports on this machine."""
    if platform.startswith("linux"):
        try:
            low, high = (int(part) for part in range_file.read_text().split())
        except (OSError, ValueError):
            return LINUX_DEFAULT_RANGE
        return (low, high)
    return IANA_RANGE


def in_ephemeral_range(port: int, ephemeral: tuple[int, int] | None = None) -> bool:
    low, high = ephemeral if ephemeral is not None else ephemeral_port_range()
    return low <= port <= high


def listen_window(span: int, ephemeral: tuple[int, int] | None = None) -> tuple[int, int]:
    """Inclusive (first, last) base port such that base .. base+span-1 avoid the ephemeral range.

    Prefers the room below the range, then above it. When neither holds `span` ports (a
    machine configured to hand out nearly every port), returns the whole usable range: the
    restart hazard described in the module docstring then cannot be avoided by choice.
    """
    low, high = ephemeral if ephemeral is not None else ephemeral_port_range()
    if low - span >= LOWEST_PORT + 100:
        return (LOWEST_PORT, low - span)
    if 65_535 - span >= high + 100:
        return (high + 1, 65_536 - span)
    return (LOWEST_PORT, 65_536 - span)


def ports_free(host: str, ports: Iterable[int]) -> bool:
    """Whether every port in `ports` can be bound on `host` right now."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_ports(
    count: int, *, host: str = "127.0.0.1", rng: random.Random | None = None,
    attempts: int = 1_000,
) -> list[int]:
    """`count` distinct ports outside the ephemeral range, each bindable on `host` just now."""
    chooser = rng if rng is not None else random.Random()
    first, last = listen_window(1)
    chosen: list[int] = []
    for _ in range(attempts):
        if len(chosen) == count:
            return chosen
        port = chooser.randint(first, last)
        if port not in chosen and ports_free(host, (port,)):
            chosen.append(port)
    if len(chosen) == count:
        return chosen
    raise OSError(f"found only {len(chosen)} of {count} free ports on {host} "
                  f"in {first}-{last} after {attempts} attempts")
