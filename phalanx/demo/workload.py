"""The demo's KV workload: register clients recorded as a Jepsen history, and a ledger.

Owns:
    * `Workload`: `workers` concurrent register clients doing read / write / cas on a few
      keys (``reg/<i>``) through one `phalanx.client.Client`, each operation recorded in a
      `HistoryRecorder` (Jepsen's rules: a timed-out or otherwise indeterminate operation
      completes ``info`` and its process continues under a fresh id; a cas whose comparison
      failed, or a refused command, completes ``fail``). Written values are unique integers,
      so the linearizability checker can tell every write apart. One more client appends
      unique ledger keys (``ledger/<n>``) and remembers which were acknowledged.
    * `ledger_keys`: read every ledger key back, from the leader (linearizable) or from one
      given node's applied state (stale), to show that nothing acknowledged was lost.

Must not import: the runtime, consensus cores. Uses the real clock (trio's), so it is not
deterministic and not for the simulator; given the same seed it makes the same choices.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import trio

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import (
    CasResult,
    CompareAndSet,
    Done,
    Get,
    KvCommand,
    KvError,
    KvResult,
    Put,
    Scan,
    ScanResult,
    Value,
)
from phalanx.client.async_client import Client, ClientError, RequestRejected, open_client
from phalanx.jepsen.history import (
    FAIL,
    INFO,
    OK,
    History,
    HistoryRecorder,
    OpType,
    Process,
    value_from_json,
)
from phalanx.jepsen.history import Value as HistoryValue
from phalanx.net.client_protocol import ReadConsistency
from phalanx.ops import pki
from phalanx.ops.node_config import ClusterConfig

LEDGER_PREFIX = "ledger/"
REGISTER_PREFIX = "reg/"
_LEDGER_PAGE = 1000  # ledger keys per scan: ledger/<n // 1000 as 3 digits><n % 1000 as 3>


Value_ = list[int | None] | int | None


def _json(value: Value_) -> HistoryValue:
    return value_from_json(value)


def ledger_key(n: int) -> str:
    return f"{LEDGER_PREFIX}{n:06d}"


@dataclass(slots=True)
class _Ack:
    invoked: float
    acked: float


class _Outcome(Exception):
    """An operation's non-ok completion, raised out of `_op` (type is FAIL or INFO)."""

    def __init__(self, type: str, error: str) -> None:
        super().__init__(error)
        self.type = type
        self.error = error


class Workload:
    """The demo workload over `client`; start it with ``await nursery.start(w.run)``."""

    def __init__(
        self, client: Client, *, rng: random.Random, workers: int, keys: int
    ) -> None:
        if workers < 1 or keys < 1:
            raise ValueError("workers and keys must be >= 1")
        self._client = client
        self._rng = rng
        self._workers = workers
        self._keys = [f"{REGISTER_PREFIX}{i}" for i in range(keys)]
        self._recorder = HistoryRecorder()
        self._t0 = trio.current_time()
        self._stopped = False
        self._next_value = 1
        self._next_process = workers
        self._acks: list[_Ack] = []
        self.ok = 0
        self.fail = 0
        self.info = 0
        self.writes_acked = 0
        self.ledger_acked: set[str] = set()
        self.ledger_written = 0
        self.duration = 0.0

    @property
    def completed(self) -> int:
        return self.ok + self.fail + self.info

    def _now(self) -> int:
        return int((trio.current_time() - self._t0) * 1e9)

    def history(self) -> History:
        return self._recorder.history()

    def nemesis(self, f: str, node: str) -> None:
        """Record a fault (``kill`` / ``start`` of `node`) in the history."""
        self._recorder.nemesis(f=f, value=node, time=self._now())

    def stop(self) -> None:
        """Ask every client to stop after its current operation; `run` then reads every
        register once more and returns."""
        self._stopped = True

    def first_write_ack_after(self, t: float) -> float | None:
        """trio time of the first acknowledged write invoked after trio time `t`, if any."""
        best: float | None = None
        for ack in reversed(self._acks):
            if ack.acked < t:
                break
            if ack.invoked > t and (best is None or ack.acked < best):
                best = ack.acked
        return best

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._t0 = trio.current_time()
        start = self._t0
        async with trio.open_nursery() as nursery:
            for w in range(self._workers):
                nursery.start_soon(self._register_client, w)
            nursery.start_soon(self._ledger_client)
            task_status.started()
        self.duration = trio.current_time() - start
        final = self._next_process
        self._next_process += len(self._keys)
        for i, key in enumerate(self._keys):  # a final read of every key, in the history
            await self._record(final + i, "read", key, None, None)

    # ---------------------------------------------------------------- register clients

    async def _register_client(self, worker: int) -> None:
        process: Process = worker
        last_seen: dict[str, int | None] = {}
        while not self._stopped:
            key = self._rng.choice(self._keys)
            dice = self._rng.random()
            written: int | None = None
            if dice < 0.4:
                outcome, observed = await self._record(process, "read", key, None, None)
            elif dice < 0.8:
                written = self._fresh()
                outcome, observed = await self._record(process, "write", key, None, written)
            else:
                written = self._fresh()
                outcome, observed = await self._record(
                    process, "cas", key, last_seen.get(key), written)
            if outcome == OK:
                last_seen[key] = observed if written is None else written
            elif outcome == INFO:
                process = self._next_process  # Jepsen: an info retires the process
                self._next_process += 1

    def _fresh(self) -> int:
        v = self._next_value
        self._next_value += 1
        return v

    async def _record(
        self, process: Process, f: str, key: str, expected: int | None, new: int | None
    ) -> tuple[str, int | None]:
        """Invoke, run and complete one register operation; returns (type, value read).

        read: `new` is None; write: `new` is the value; cas: `expected` (None: absent) -> `new`.
        """
        value: Value_ = [expected, new] if f == "cas" else new
        self._recorder.invoke(process=process, f=f, key=key, value=_json(value),
                              time=self._now())
        invoked = trio.current_time()
        try:
            observed = await self._op(f, key, expected, new)
        except _Outcome as e:
            kind: OpType = FAIL if e.type == FAIL else INFO
            self._recorder.complete(process=process, type=kind, time=self._now(),
                                    error=e.error)
            if kind == FAIL:
                self.fail += 1
            else:
                self.info += 1
            return kind, None
        if f == "read":
            self._recorder.complete(process=process, type=OK, time=self._now(), value=observed)
        else:
            self._recorder.complete(process=process, type=OK, time=self._now())
            self.writes_acked += 1
            self._acks.append(_Ack(invoked=invoked, acked=trio.current_time()))
        self.ok += 1
        return OK, observed

    async def _op(self, f: str, key: str, expected: int | None, new: int | None) -> int | None:
        command: KvCommand
        if f == "read":
            command = Get(key=key)
        elif f == "write":
            command = Put(key=key, value=str(new).encode())
        else:
            command = CompareAndSet(key=key, new=str(new).encode(),
                                    expected=None if expected is None else str(expected).encode())
        result = await _call(self._client, command, read_only=f == "read")
        match result:
            case Value(value=None):
                return None
            case Value(value=bytes() as raw):
                try:
                    return int(raw)
                except ValueError:
                    raise _Outcome(INFO, f"unexpected value {raw!r}") from None
            case Done():
                return None
            case CasResult(succeeded=True):
                return None
            case CasResult(succeeded=False):
                raise _Outcome(FAIL, "cas comparison failed")
        raise _Outcome(FAIL, f"unexpected result {result!r}")

    # ---------------------------------------------------------------- ledger

    async def _ledger_client(self) -> None:
        n = 0
        while not self._stopped:
            invoked = trio.current_time()
            key = ledger_key(n)
            n += 1
            self.ledger_written = n
            try:
                result = await _call(self._client, Put(key=key, value=b"1"), read_only=False)
            except _Outcome:
                continue
            if isinstance(result, Done):
                self.ledger_acked.add(key)
                self._acks.append(_Ack(invoked=invoked, acked=trio.current_time()))


async def _call(client: Client, command: KvCommand, *, read_only: bool,
                stale: bool = False) -> KvResult:
    """One KV command; a refusal is `_Outcome(FAIL)`, anything indeterminate `_Outcome(INFO)`."""
    try:
        raw = await client.call(
            kv_wire.encode_command(command), read_only=read_only,
            consistency=ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE)
    except RequestRejected as e:
        raise _Outcome(FAIL, f"rejected: {e}") from None
    except ClientError as e:
        raise _Outcome(INFO, f"{type(e).__name__}: {e}") from None
    result = kv_wire.decode_result(raw)
    if isinstance(result, KvError):
        raise _Outcome(FAIL, result.message)
    return result


async def ledger_keys(
    cluster: ClusterConfig, *, written: int, node: str | None = None,
    client_timeout: float = 5.0
) -> set[str]:
    """Every ledger key present: through the leader (linearizable), or, with `node`, in that
    node's applied state (stale reads served by that node alone). `written` bounds the keys.

    Raises:
        ClientError: the cluster (or `node`) did not answer.
    """
    found: set[str] = set()

    async def scan_all(client: Client) -> None:
        for page in range(written // _LEDGER_PAGE + 1):
            prefix = f"{LEDGER_PREFIX}{page:03d}"
            try:
                result = await _call(client, Scan(prefix=prefix, limit=_LEDGER_PAGE),
                                     read_only=True, stale=node is not None)
            except _Outcome as e:
                raise ClientError(f"ledger scan {prefix!r} failed: {e.error}") from None
            if not isinstance(result, ScanResult):
                raise ClientError(f"ledger scan {prefix!r} returned {result!r}")
            found.update(k for k, _ in result.items)

    failure: ClientError | None = None

    async def scan_or_note(client: Client) -> None:
        nonlocal failure
        try:
            await scan_all(client)
        except ClientError as e:  # raise it bare, not wrapped in the client's ExceptionGroup
            failure = e

    if node is None:
        async with open_client(cluster, timeout=client_timeout) as client:
            await scan_or_note(client)
    else:
        addr = next(n.client_addr for n in cluster.nodes if n.id == node)
        context = pki.client_context(cluster.ca, certificate=cluster.client_cert,
                                     private_key=cluster.client_key, check_hostname=False)
        async with open_client([(node, addr.host, addr.port)], ssl_context=context,
                               client_id=pki.new_client_id(cluster.client_cert),
                               protocol=cluster.protocol, timeout=client_timeout) as client:
            await scan_or_note(client)
    if failure is not None:
        raise failure
    return found
