"""Operator calls on the client port beside membership (`phalanx.ops.ops_messages`): backups
(`BackupCall`) and certificate reloads (`ReloadCall`), answered by the node's runtime.

Owns: `OperatorOps.answer`, `reload_contexts` (the same files loaded again into the node's
live TLS contexts) and `BACKUP_DIR`.

Backups: the node waits until its replica applied the asked index, takes the replica's O(1)
snapshot (`Replica.backup_job`: the state, session and transaction tables at the applied
index, exactly what a checkpoint holds) and serialises it on a checkpoint writer's thread
(`ThreadedCheckpointWriter`: it yields the GIL to apply every millisecond) into a
checkpoint store of its own, ``DATA_DIR/backup/`` (`FileCheckpointStore`, keep 1: v3
manifest and content-addressed packs: a second backup writes only what changed), while
apply goes on, then hashes it (SHA-256) and keeps a view of it that `BackupCall(index,
offset, length)` reads piecewise (`phalanx snapshot save` fetches it that way, from any
host). It is not one of the node's checkpoints: neither the core, nor the WAL, nor the
checkpoint policy hear of it. One backup operation at a time per node; a new backup
replaces the previous one (reads of that one are then refused).

Reloads: `ssl.SSLContext.load_cert_chain` replaces a live context's certificate and key, and
`load_verify_locations` adds the CA bundle's certificates to its trust store; connections
made afterwards use them, open ones keep theirs. The files are first loaded into fresh
contexts, so a bad file is answered ERROR and changes nothing. A context never forgets a
CA it trusted: dropping an old CA after a rotation takes one restart per node
(docs/OPERATIONS.md "Certificates").

Rules: both need the admin role (FORBIDDEN otherwise); peer and client input is never
trusted for a path (the backup directory is fixed).
"""

from __future__ import annotations

import datetime
import hashlib
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import trio
from cryptography import x509

from phalanx.apps.replica import Replica
from phalanx.apps.writer import ThreadedCheckpointWriter
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops import pki
from phalanx.ops.ops_messages import (
    MAX_BACKUP_CHUNK,
    BackupCall,
    BackupReply,
    OpsCall,
    OpsReply,
    ReloadReply,
)
from phalanx.ops.ops_messages import refusal as refuse
from phalanx.runtime.client_auth import ADMIN, Principal
from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import ByteView, OsDirectory

BACKUP_DIR: Final = "backup"
"""The backup checkpoint store's directory, under the node's data directory."""
BACKUP_WAIT_SECONDS: Final = 10.0
"""How long a `BackupCall` waits for the replica to apply its `min_index`."""


def certificate_not_after(path: Path) -> datetime.datetime:
    """The expiry of the first certificate in PEM file `path` (UTC). Raises `ValueError`
    or `OSError`."""
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc


def reload_contexts(contexts: Sequence[ssl.SSLContext], paths: pki.CredentialPaths) -> str:
    """Load `paths` into every live context (module docstring); the certificate's expiry
    (ISO 8601). Raises `ValueError` (with the file's name) when a file does not load; the
    contexts are then unchanged."""
    try:
        pki.peer_server_context(paths)  # a trial load: every file parses and key fits cert
        not_after = certificate_not_after(paths.certificate)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ValueError(f"cannot load {paths.certificate}, {paths.private_key} or "
                         f"{paths.ca_certificate}: {e}") from None
    try:
        for context in contexts:
            context.load_verify_locations(cafile=paths.ca_certificate)
            pki.load_pair(context, paths.certificate, paths.private_key)
    except (OSError, ssl.SSLError) as e:  # replaced again since the trial: try once more
        raise ValueError(f"{paths.certificate} changed while it was loaded ({e}); reload "
                         "again") from None
    return not_after.isoformat()


class OperatorOps:
    """Answers `BackupCall` and `ReloadCall` for one node (module docstring). `close()`
    when the node stops."""

    def __init__(self, *, node_id: str, replica: Replica, data_dir: Path,
                 reload: Callable[[], str]) -> None:
        self._node = node_id
        self._replica = replica
        self.backup_dir = data_dir / BACKUP_DIR
        self._reload = reload
        self._lock = trio.Lock()
        self._directory: OsDirectory | None = None
        self._store: FileCheckpointStore | None = None
        self._view: tuple[int, ByteView] | None = None  # the newest backup's data

    def close(self) -> None:
        self._view = None
        if self._directory is not None:
            self._directory.close()

    async def answer(self, call: OpsCall, principal: Principal | None) -> OpsReply:
        if principal is not None and not principal.may(ADMIN):
            return refuse(call, self._node, f"operator calls need role {ADMIN} (this "
                          f"client's certificate has {principal.role})", ReplyStatus.FORBIDDEN)
        if isinstance(call, BackupCall):
            if call.index:
                return await self._read(call)
            return await self._backup(call)
        try:
            not_after = self._reload()
        except ValueError as e:
            return refuse(call, self._node, str(e))
        return ReloadReply(nonce=call.nonce, status=ReplyStatus.OK, node=self._node,
                           not_after=not_after, message="certificates reloaded")

    def _open_store(self) -> FileCheckpointStore:
        if self._store is None:
            self._directory = OsDirectory(str(self.backup_dir))
            self._store = FileCheckpointStore(self._directory, keep=1)
        return self._store

    async def _backup(self, call: BackupCall) -> OpsReply:
        replica = self._replica
        with trio.move_on_after(BACKUP_WAIT_SECONDS):
            while replica.applied_index < call.min_index:  # noqa: ASYNC110 (no apply event)
                await trio.sleep(0.01)
        if replica.applied_index < call.min_index:
            return refuse(call, self._node, f"applied index {replica.applied_index} did not "
                          f"reach {call.min_index} within {BACKUP_WAIT_SECONDS:g}s")
        async with self._lock:
            try:
                store = self._open_store()
            except OSError as e:
                return refuse(call, self._node, f"cannot create {self.backup_dir}: {e}")
            meta = replica.snapshot_meta()
            job = replica.backup_job()  # on the trio thread, between two applies
            self._view = None
            # the checkpoint writer's thread: it hands the GIL back to apply every 1 ms
            writer = ThreadedCheckpointWriter(store)
            try:
                writer.start(job)
                while (done := writer.poll()) is None:  # noqa: ASYNC110 (a thread's result)
                    await trio.sleep(0.01)
            finally:
                await trio.to_thread.run_sync(writer.close)
            if done.error is not None or isinstance(done.data, bytes):
                return refuse(call, self._node, f"writing the backup into {self.backup_dir} "
                              f"failed: {done.error}")
            view = done.data
            digest = await trio.to_thread.run_sync(_sha256, view)
            self._view = (job.index, view)
        return BackupReply(nonce=call.nonce, status=ReplyStatus.OK, node=self._node,
                           index=job.index, term=meta.term if meta is not None else 0,
                           meta=job.meta, data_bytes=len(view), data_sha256=digest)

    async def _read(self, call: BackupCall) -> OpsReply:
        async with self._lock:
            if self._view is None or self._view[0] != call.index:
                return refuse(call, self._node, f"backup {call.index} is gone (a newer backup "
                              "replaced it, or the node restarted): take the backup again")
            view = self._view[1]
            if not 0 <= call.offset <= len(view) or call.length < 0:
                return refuse(call, self._node, f"offset {call.offset} is outside backup "
                              f"{call.index} ({len(view)} bytes)")
            end = min(len(view), call.offset + min(call.length, MAX_BACKUP_CHUNK))
            try:
                chunk = await trio.to_thread.run_sync(lambda: view[call.offset:end])
            except (OSError, ValueError) as e:
                return refuse(call, self._node, f"reading backup {call.index} failed: {e}")
        return BackupReply(nonce=call.nonce, status=ReplyStatus.OK, node=self._node,
                           index=call.index, offset=call.offset, chunk=bytes(chunk))


def _sha256(view: ByteView) -> str:
    h = hashlib.sha256()
    for at in range(0, len(view), MAX_BACKUP_CHUNK):
        h.update(view[at:at + MAX_BACKUP_CHUNK])
    return h.hexdigest()


async def reload_on_sighup(node_id: str, reload: Callable[[], str]) -> None:
    """Reload the certificates on every SIGHUP (`kill -HUP PID`) until cancelled; a failure
    is logged and changes nothing. Only in the main thread (where signals are delivered);
    elsewhere it returns at once."""
    import logging
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    logger = logging.getLogger("phalanx.runtime.node")
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            try:
                logger.info("%s: SIGHUP: certificates reloaded (expires %s)", node_id,
                            reload())
            except ValueError as e:
                logger.error("%s: SIGHUP: certificates not reloaded: %s", node_id, e)
