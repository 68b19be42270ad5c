"""`phalanx kv`'s ``--client-key`` / ``--client-name``: the signing key a leaderless
cluster's transactions are signed with (`phalanx.ops.signing_keys`).

Owns: `signer_from_args`. Imports the signing keys only when one is asked for.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx.ops.node_config import ClusterConfig
    from phalanx.ops.signing_keys import TransactionSigner


def signer_from_args(args: argparse.Namespace, cluster: ClusterConfig) -> TransactionSigner | None:
    """The signing key --client-key / --client-name pick, or None (the cluster's default).
    Raises ValueError (one line) when the protocol does not sign or the key will not load."""
    path_text: str | None = getattr(args, "client_key", None)
    name: str | None = getattr(args, "client_name_key", None)
    if path_text is None and name is None:
        return None
    if path_text is not None and name is not None:
        raise ValueError("give --client-key or --client-name, not both")
    from pathlib import Path

    from phalanx.ops.signing_keys import SigningKeyError, TransactionSigner, client_key_path
    from phalanx.protocols import CallStrategy
    from phalanx.protocols import get as protocol_spec

    if protocol_spec(cluster.protocol).call_strategy is not CallStrategy.ENDORSEMENT:
        raise ValueError(f"protocol {cluster.protocol} does not use client signing keys")
    path = Path(path_text) if path_text is not None else client_key_path(
        cluster.directory, name or "")
    try:
        return TransactionSigner.from_file(path, name)
    except SigningKeyError as e:
        raise ValueError(str(e)) from None
