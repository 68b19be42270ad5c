"""File descriptors of a node process: raise the soft limit, keep a reserve for storage.

Owns: `raise_nofile_limit` (RLIMIT_NOFILE soft -> hard, once at node start), `open_descriptors`
and `client_connection_cap`, which sizes the client port so that every socket the node may
hold plus `FD_RESERVE` fit under the soft limit. The point: a flood of connections must never
make a hard-state save, a WAL segment or a checkpoint fail with "Too many open files" (with
the common limit of 1,024, 1,100 idle TLS connections once made a node exit that way).

Must not import: trio, sockets, consensus, storage. Process-global (rlimits); no clocks.
"""

from __future__ import annotations

import logging
import os
import resource

logger = logging.getLogger(__name__)

FD_RESERVE = 64
"""Descriptors kept free for storage and housekeeping: WAL segments (open, rotate, read on
replay), checkpoint files written on the writer thread, hard-state and core-state saves
(write + rename + directory fsync), log files, the metrics endpoint's sockets."""

NOFILE_CEILING = 1 << 20
"""The highest soft limit asked for when the hard limit is unlimited."""


class DescriptorError(Exception):
    """The descriptor limit is too low to run a node with its reserve."""


def raise_nofile_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit (capped at `NOFILE_CEILING`);
    return the soft limit in force afterwards. Never lowers it; a refusal is logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_CEILING if hard == resource.RLIM_INFINITY else min(hard, NOFILE_CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, target,
                           exc)
    return NOFILE_CEILING if soft == resource.RLIM_INFINITY else int(soft)


def open_descriptors() -> int:
    """Descriptors this process has open now (0 when the platform cannot tell)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(path)) - 1)  # (the listing's own descriptor)
        except OSError:
            continue
    return 0


def client_connection_cap(*, soft_limit: int, in_use: int, other_sockets: int,
                          wanted: int) -> int:
    """The client port's connection cap: `wanted`, lowered so that ``in_use + other_sockets
    + cap + FD_RESERVE <= soft_limit``.

    Raises:
        DescriptorError: not even one client connection fits.
    """
    room = soft_limit - in_use - other_sockets - FD_RESERVE
    if room < 1:
        raise DescriptorError(
            f"the open-file limit ({soft_limit}) leaves no room for client connections: "
            f"{in_use} open, {other_sockets} for peers, {FD_RESERVE} reserved for storage; "
            "raise `ulimit -n`")
    return min(wanted, room)
