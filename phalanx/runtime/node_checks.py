"""A node's start-up checks and its identity bookkeeping, run by `phalanx.runtime.node`.

Owns: `NodeError` (the node cannot start: one line naming the config and what to fix),
`check_node_certificate` (the certificate names this node), `check_tls_credentials` (the
CA, certificate and key load, belong together, and the CA signed the certificate: checked
before storage is opened, each error naming its file), `check_identity` (the data
directory belongs to this node of this cluster), `record_verdict` (log the amnesia verdict
and write IDENTITY before serving), `record_membership` (keep IDENTITY in step with the
core). The decisions themselves are `phalanx.runtime.identity`'s (pure); this module does
the I/O and the logging around them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import ssl

import trio

from phalanx.ops.node_config import NodeConfig
from phalanx.ops.pki import identity_from_certificate
from phalanx.runtime.driver import Driver
from phalanx.runtime.identity import (
    Identity,
    IdentityError,
    Verdict,
    read_identity,
    trusted_fingerprints,
    write_identity,
)
from phalanx.runtime.persistence import ReadyPersister
from phalanx.storage.volatile import piece_memory_bytes

logger = logging.getLogger("phalanx.runtime.node")


class NodeError(Exception):
    """The node cannot start with this configuration (unsupported protocol, bad storage)."""


def check_node_certificate(config: NodeConfig) -> None:
    """Refuse to start when the node's certificate does not name this node.

    A node running with another node's certificate would pass as that node to its peers
    (their links are pinned by certificate), so the two would keep replacing each other's
    connections. Checked before storage is opened.

    Raises:
        NodeError: the certificate cannot be read or names another identity.
    """
    where = config.source or config.id
    try:
        identity = identity_from_certificate(config.tls.cert)
    except (OSError, ValueError) as e:
        raise NodeError(f"{where}: cannot read the node certificate {config.tls.cert}: "
                        f"{getattr(e, 'strerror', None) or e}") from None
    if identity is None or identity.kind != "node" or identity.name != config.id:
        named = ("no phalanx node" if identity is None
                 else f"{identity.kind} {identity.name!r}")
        raise NodeError(f"{where}: the certificate {config.tls.cert} names {named}, not this "
                        f"node {config.id!r}; refusing to start")


def check_tls_credentials(config: NodeConfig) -> None:
    """Refuse to start, in one line naming the file, unless ``tls.ca`` is a PEM CA
    certificate, ``tls.cert`` and ``tls.key`` load as a certificate and its private key, and
    the CA signed the certificate (else every peer would refuse this node's handshakes, and
    the node theirs). Checked before storage is opened: a bad file otherwise surfaced only
    when the listeners were built.

    Raises:
        NodeError: one of the three does not load or they do not belong together.
    """
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    where = config.source or config.id
    tls = config.tls
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=str(tls.ca))
        ca = x509.load_pem_x509_certificate(tls.ca.read_bytes())
    except (ssl.SSLError, OSError, ValueError) as e:
        raise NodeError(f"{where}: tls.ca {tls.ca} is not a PEM CA certificate "
                        f"({getattr(e, 'strerror', None) or e})") from None
    try:
        context.load_cert_chain(certfile=str(tls.cert), keyfile=str(tls.key))
    except (ssl.SSLError, OSError, ValueError) as e:
        raise NodeError(f"{where}: tls.cert {tls.cert} and tls.key {tls.key} do not load as a "
                        f"certificate and its private key ({getattr(e, 'strerror', None) or e})"
                        ) from None
    try:
        x509.load_pem_x509_certificate(tls.cert.read_bytes()).verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError, OSError):
        raise NodeError(f"{where}: tls.cert {tls.cert} is not signed by the CA in tls.ca "
                        f"{tls.ca}; peers would refuse it (issue it again with this cluster's "
                        "CA, or fix the tls paths)") from None


def check_piece_memory(config: NodeConfig) -> int:
    """The node's piece-memory budget in bytes: ``PHALANX_PIECE_MEMORY_MB`` when set, else
    ``[checkpoint] piece_memory_mb``; a bad variable is a one-line `NodeError`."""
    try:
        return piece_memory_bytes(default_mb=config.checkpoint.piece_memory_mb)
    except ValueError as e:
        raise NodeError(f"{config.source or config.id}: {e}") from None


def check_identity(config: NodeConfig) -> tuple[Identity | None, str]:
    """The data directory's IDENTITY (None if it has none) and this cluster's fingerprint.
    Raises `NodeError` (one line) for another node's or another cluster's directory."""
    where = config.source or config.id
    try:
        known = trusted_fingerprints(config.tls.ca)  # a CA bundle mid-rotation: old, new
        identity = read_identity(config.data_dir)
    except IdentityError as e:
        raise NodeError(f"{where}: {e}") from None
    cluster_id = known[-1]
    if identity is not None and identity.node != config.id:
        raise NodeError(f"{where}: data directory {config.data_dir} belongs to node "
                        f"{identity.node}, not {config.id}; fix data_dir in the config")
    if identity is not None and identity.cluster not in known:
        raise NodeError(f"{where}: data directory {config.data_dir} belongs to another "
                        f"cluster (its CA differs from {config.tls.ca}); fix data_dir or the "
                        "tls paths in the config")
    return identity, cluster_id


def record_verdict(config: NodeConfig, cluster_id: str, identity: Identity | None,
                    verdict: Verdict, *, recovering: bool) -> Verdict:
    """Say what the amnesia verdict found, in one ERROR line, and record its state in
    IDENTITY before the node serves. `recovering` is what the core made of the verdict: a
    core without a recovery mode starts as an ordinary member."""
    if verdict.recovering and not recovering:
        logger.error("%s: %s. The %s core has no recovery mode: until state transfer has "
                     "caught it up, this replica counts as one of the faulty replicas the "
                     "cluster tolerates", config.id, verdict.reason, config.protocol)
        verdict = dataclasses.replace(verdict, recovering=False, next_state="member")
    elif verdict.recovering:
        logger.error(
            "%s: %s. Starting in RECOVERY MODE: this node will not vote or campaign until it "
            "has caught up from the leader (`phalanx status` shows 'recovering'); a majority "
            "of the other nodes must be up. If this really is a new node of a new cluster, "
            "stop it and start it with --bootstrap.", config.id, verdict.reason)
    elif verdict.reason:
        logger.error("%s: %s", config.id, verdict.reason)
    if identity is None or (identity.state, identity.cluster) != (verdict.next_state,
                                                                  cluster_id):
        write_identity(config.data_dir, Identity(cluster=cluster_id, node=config.id,
                                                 state=verdict.next_state))
    return verdict


IDENTITY_POLL_SECONDS = 0.2


async def record_membership(config: NodeConfig, cluster_id: str, driver: Driver,
                             state: str, persister: ReadyPersister) -> None:
    """Keep IDENTITY's state in step with the core: ``member`` once a new node has a term
    or a commit index (it may have voted or acknowledged since; a PBFT replica's term is its
    view, which may stay 0), ``member`` once a recovering node caught up (and then the
    storage's lost-log mark goes: what the log lost is back)."""
    while state != "member":
        await trio.sleep(IDENTITY_POLL_SECONDS)
        status = driver.status()
        if status.recovering or (state == "new" and status.term == 0
                                 and status.commit_index == 0):
            continue
        with contextlib.suppress(IdentityError):  # the CA file's newest certificate: a CA
            cluster_id = trusted_fingerprints(config.tls.ca)[-1]  # rotation may have begun
        await trio.to_thread.run_sync(write_identity, config.data_dir, Identity(
            cluster=cluster_id, node=config.id, state="member"))
        if state == "recovering":
            await trio.to_thread.run_sync(persister.clear_log_lost)
            logger.warning("%s: recovered: caught up from leader %s at index %d; voting "
                           "again", config.id, status.leader, status.commit_index)
        state = "member"
