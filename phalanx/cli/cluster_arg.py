"""The `--cluster DIR` option the client commands share (`phalanx kv`, `status`, `gossip`,
`announce`): `add_cluster_option` (``--cluster``, ``--timeout``, ``--as``) and
`open_cluster_arg` (the cluster with its client credentials checked, or None after one line on
stderr saying what to do).

Imports nothing heavy at module level: `--help` and usage errors stay fast.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from phalanx.cli.errors import positive_float, print_error

if TYPE_CHECKING:
    from phalanx.ops.node_config import ClusterConfig

CLUSTER_ENV: Final = "PHALANX_CLUSTER"
DEFAULT_TIMEOUT: Final = 5.0


def add_cluster_option(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """``--cluster``, ``--timeout`` and ``--as`` on `parser`. `suppress`: no defaults (for a
    subcommand that repeats its parent's options: a value given before the subcommand is
    then not overwritten by the subcommand's default)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--cluster", metavar="DIR", default=default(os.environ.get(CLUSTER_ENV)),
        help=f"the cluster directory (default: ${CLUSTER_ENV})",
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=default(DEFAULT_TIMEOUT), metavar="SECONDS",
        help=f"give up after this long, a finite number > 0 (default: {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--as", dest="client_name", metavar="NAME", default=default(None),
        help="act as client NAME: use DIR/clients/NAME.pem and NAME.key (default: the "
        "cluster's client certificate)",
    )


def open_cluster_arg(args: argparse.Namespace, prog: str) -> ClusterConfig | None:
    """The cluster at --cluster with its client credential files present, or None after
    printing why not (one line)."""
    # (Light on purpose: not `ops.local_cluster` nor `ops.pki`, which import process
    # management and `cryptography`; a `phalanx kv` call must start fast.)
    from pathlib import Path

    from phalanx.ops.node_config import ConfigError, check_cluster_files, load_cluster_config

    if not args.cluster:
        print_error(prog, f"no cluster given (use --cluster DIR or set ${CLUSTER_ENV})")
        return None
    path = Path(args.cluster)
    if not (path / "cluster.toml").is_file() and not path.is_file():
        print_error(prog, f"no cluster at {args.cluster} (run `phalanx cluster init "
                    f"{args.cluster}` first)")
        return None
    try:
        cluster = load_cluster_config(path)
    except ConfigError as e:
        print_error(prog, str(e))
        return None
    name = getattr(args, "client_name", None)
    if name is not None:
        cert = cluster.directory / "clients" / f"{name}.pem"
        key = cert.with_suffix(".key")
        if not (cert.is_file() and key.is_file()):
            print_error(prog, f"no client {name!r}: {cert} and {key} must exist (issue one "
                        f"with `phalanx cert issue-client {name} --cluster {args.cluster}`)")
            return None
        cluster = replace(cluster, client_cert=cert, client_key=key)
    try:
        check_cluster_files(cluster)
    except ConfigError as e:
        print_error(prog, str(e))
        return None
    from phalanx.client.quick import client_identity

    try:
        identity = client_identity(cluster.client_cert)
    except (OSError, ValueError) as e:
        identity = None
        why = f"cannot read it ({getattr(e, 'strerror', None) or e})"
    else:
        why = "it names no phalanx client"
    if identity is None:
        print_error(prog, f"{cluster.client_cert} is not a usable client certificate: {why}")
        return None
    return cluster
