"""The errors of the client library (`phalanx.client`), each with what it promises.

Owns: `ClientError` and its subclasses. `phalanx.client` re-exports them; see its docstring
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


class ClientClosed(ClientError):
    """The client was closed while (or before) the call ran. Indeterminate, like a timeout."""


class RequestRejected(ClientError):
    """A node refused the request as invalid (`ReplyStatus.ERROR`). It certainly had no effect."""

    def __init__(self, message: str, *, replica: str | None = None) -> None:
        super().__init__(message)
        self.replica = replica


class KvCommandError(RequestRejected):
    """The KV state machine refused the command (a `KvError` result). It had no effect."""

    def __init__(self, error: KvError) -> None:
        super().__init__(f"{error.code.name}: {error.message}")
        self.code: KvErrorCode = error.code


class ProtocolViolation(ClientError):
    """A reply's result is not what the command can produce (a buggy or faulty server)."""


class Forbidden(ClientError):
    """A node refused this client the request (`ReplyStatus.FORBIDDEN`: its certificate is
    not allowed to run it). It certainly had no effect."""

    def __init__(self, message: str, *, replica: str | None = None) -> None:
        super().__init__(message)
        self.replica = replica


class StorageUnavailable(ClientError):
    """A node answered that its storage cannot take the request (`ReplyStatus.UNAVAILABLE`:
    a full or failing disk). The node did not apply it; retrying later may succeed."""

    def __init__(self, message: str, *, replica: str | None = None) -> None:
        super().__init__(message)
        self.replica = replica
