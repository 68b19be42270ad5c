"""The register workload for real-cluster runs: read / write / cas on independent keys.

Owns:
    `RegisterWorkload`: the operation generator (40 % reads, 40 % writes, 20 % cas; unique
    written values; at most `ops_per_key` operations per key, after which the key is retired
    and a fresh one takes its place, Jepsen's ``independent`` generator, so checking each key
    stays tractable), one operation's execution through a `Client`, the final reads and the
    check (per-key linearizability, `phalanx.jepsen.linearizability`).

Outcome rules (Jepsen): an acknowledged operation is ``ok``; a refused command or a cas whose
comparison failed is ``fail`` (it certainly did not happen); a timeout or any other client
error is ``info`` (it may have happened) and the caller continues under a new process id.

Must not import the runtime or consensus cores. Seeded choices (`random.Random`), but the
interleaving is real time, so runs are not reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import (
    CasResult,
    CompareAndSet,
    Done,
    Get,
    KvCommand,
    KvError,
    Put,
    Value,
)
from phalanx.client import Client, ClientError, RequestRejected
from phalanx.jepsen.history import FAIL, INFO, OK, History, HistoryRecorder, OpType, Process
from phalanx.jepsen.linearizability import check

KEY_PREFIX = "jr/"
FUNCTIONS = ("read", "write", "cas")


class RegisterWorkload:
    """See the module docstring. `recorder` and `now` (ns since the run started) are shared
    with the runner; one instance serves every worker task of a run."""

    name = "register"
    functions = FUNCTIONS

    def __init__(
        self,
        *,
        recorder: HistoryRecorder,
        now: Callable[[], int],
        rng: random.Random,
        keys: int = 5,
        ops_per_key: int = 150,
    ) -> None:
        if keys < 1 or ops_per_key < 1:
            raise ValueError("keys and ops_per_key must be >= 1")
        self._recorder = recorder
        self._now = now
        self._rng = rng
        self._ops_per_key = ops_per_key
        self._next_key = keys
        self._active = [f"{KEY_PREFIX}{i}" for i in range(keys)]
        self._used: dict[str, int] = {}
        self._next_value = 1
        self._last_seen: dict[str, int | None] = {}

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key an operation was invoked on, in first-use order."""
        return tuple(self._used)

    def _pick_key(self) -> str:
        i = self._rng.randrange(len(self._active))
        key = self._active[i]
        self._used[key] = self._used.get(key, 0) + 1
        if self._used[key] >= self._ops_per_key:  # retire it; a fresh key takes its slot
            self._active[i] = f"{KEY_PREFIX}{self._next_key}"
            self._next_key += 1
        return key

    async def operate(self, process: Process, client: Client) -> tuple[str, OpType]:
        """Generate, invoke, execute and complete one operation of `process`; returns its
        ``f`` and completion type."""
        key = self._pick_key()
        dice = self._rng.random()
        if dice < 0.4:
            return "read", await self.invoke(process, client, "read", key, None, None)
        value = self._next_value
        self._next_value += 1
        if dice < 0.8:
            return "write", await self.invoke(process, client, "write", key, None, value)
        expected = self._last_seen.get(key)
        return "cas", await self.invoke(process, client, "cas", key, expected, value)

    async def final_read(self, process: Process, client: Client, key: str) -> OpType:
        return await self.invoke(process, client, "read", key, None, None)

    async def invoke(
        self, process: Process, client: Client, f: str, key: str,
        expected: int | None, new: int | None,
    ) -> OpType:
        value: list[int | None] | int | None = [expected, new] if f == "cas" else new
        self._recorder.invoke(process=process, f=f, key=key,
                              value=tuple(value) if isinstance(value, list) else value,
                              time=self._now())
        command: KvCommand
        if f == "read":
            command = Get(key=key)
        elif f == "write":
            command = Put(key=key, value=str(new).encode())
        else:
            command = CompareAndSet(key=key, new=str(new).encode(),
                                    expected=None if expected is None else str(expected).encode())
        try:
            raw = await client.call(kv_wire.encode_command(command), read_only=f == "read")
        except RequestRejected as e:
            return self._complete(process, FAIL, error=f"rejected: {e}")
        except ClientError as e:
            return self._complete(process, INFO, error=f"{type(e).__name__}: {e}")
        result = kv_wire.decode_result(raw)
        match result:
            case Value(value=None) if f == "read":
                self._last_seen[key] = None
                return self._complete(process, OK, read=(None,))
            case Value(value=bytes() as data) if f == "read":
                try:
                    observed = int(data)
                except ValueError:
                    return self._complete(process, INFO, error=f"unexpected value {data!r}")
                self._last_seen[key] = observed
                return self._complete(process, OK, read=(observed,))
            case Done() if f == "write":
                self._last_seen[key] = new
                return self._complete(process, OK)
            case CasResult(succeeded=True) if f == "cas":
                self._last_seen[key] = new
                return self._complete(process, OK)
            case CasResult(succeeded=False) if f == "cas":
                return self._complete(process, FAIL, error="cas comparison failed")
            case KvError(message=message):
                return self._complete(process, FAIL, error=message)
        return self._complete(process, INFO, error=f"unexpected result {result!r}")

    def _complete(
        self, process: Process, kind: OpType, *, read: tuple[int | None] | None = None,
        error: str | None = None,
    ) -> OpType:
        """Record the completion; `read` is ``(value,)`` for a read, None otherwise (a write
        or cas completion echoes its invoke's value)."""
        if kind == OK and read is not None:
            self._recorder.complete(process=process, type=OK, time=self._now(), value=read[0])
        elif kind == OK:
            self._recorder.complete(process=process, type=OK, time=self._now())
        elif kind == FAIL:
            self._recorder.complete(process=process, type=FAIL, time=self._now(), error=error)
        else:
            self._recorder.complete(process=process, type=INFO, time=self._now(), error=error)
        return kind

    def check(self, history: History, *, time_limit: float) -> dict[str, object]:
        """Per-key linearizability; the verdict's JSON (``valid``: true, false, "unknown")."""
        return check(history, time_limit=time_limit).to_json()
