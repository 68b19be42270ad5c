"""The errors of the client library (`phalanx.client.async_client`), each with what it promises.

Owns: `ClientError` and its subclasses. `phalanx.client.async_client` re-exports them; see its
docstring
for the outcome each one means (certainly no effect, or indeterminate).
Must not import: trio, the network, consensus cores.
"""

from __future__ import annotations

from phalanx.apps.kv_types import KvError, KvErrorCode


class ClientError(Exception):
    """Base class of every error this module raises for a call."""


class ClientTimeout(ClientError, TimeoutError):
    """The operation's deadline passed. It MAY OR MAY NOT have taken effect (indeterminate)."""

    def __init__(self, message: str, *, last_error: str | None = None) -> None:
        super().__init__(message if last_error is None else f"{message} (last: {last_error})")
        self.last_error = last_error


class StorageUnavailable(ClientTimeout):
    """The deadline passed and the last node tried answered that its storage cannot take
    writes now (`ReplyStatus.UNAVAILABLE`: disk full, broken storage; the message says why).
    Indeterminate like any timeout (an earlier attempt may have taken effect); the client
    tried the other nodes meanwhile."""


class ClientClosed(ClientError):
    """The client was closed while (or before) the call ran. Indeterminate, like a timeout."""


class InvalidArgument(ClientError, TypeError):
    """A call's arguments do not fit the app's command types (a key that is not `str`, a
    value that is not `bytes`, a number out of range): nothing was sent. The message names
    the field and the type it needs."""


class ClusterUnreachable(ClientError):
    """No node accepted a connection: every node's address refused it (nothing listens
    there) and no connection was open or opened during the call, so the request was never
    sent anywhere: it certainly had NO effect. Raised at once, not after the timeout."""


class RequestRejected(ClientError):
    """A node refused the request as invalid (`ReplyStatus.ERROR`). It certainly had no effect."""

    def __init__(self, message: str, *, replica: str | None = None) -> None:
        super().__init__(message)
        self.replica = replica


class Forbidden(RequestRejected):
    """The cluster refused the call for this client (`ReplyStatus.FORBIDDEN`): its
    certificate's role does not allow it, or the session id is not the certificate's. It
    certainly had no effect; retrying with the same certificate will not help."""


class KvCommandError(RequestRejected):
    """The KV state machine refused the command (a `KvError` result). It had no effect."""

    def __init__(self, error: KvError) -> None:
        super().__init__(f"{error.code.name}: {error.message}")
        self.code: KvErrorCode = error.code


class ProtocolViolation(ClientError):
    """A reply's result is not what the command can produce (a buggy or faulty server)."""



class TransactionAborted(RequestRejected):
    """f+1 nodes answered that the signed transaction was aborted (`ReplyStatus.ABORTED`:
    dropped by a checkpoint, or refused by enough nodes once its deadline passed, e.g. a
    requirement on a version that did not hold). It certainly had no effect, and never will:
    no correct node applies it. `reason` is one node's account of why; `replicas` the nodes
    that agreed. Retrying needs a new transaction (fresh versions, a new deadline)."""

    def __init__(self, reason: str, *, call: str = "transaction",
                 replicas: tuple[str, ...] = ()) -> None:
        super().__init__(f"{call} aborted: {reason}", replica=replicas[0] if replicas else None)
        self.reason = reason
        self.replicas = replicas
