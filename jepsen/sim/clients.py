"""Simulated closed-loop KV clients that record a Jepsen history.

Owns: `SimClient`, one logical client issuing read / write / compare-and-set operations on a
few keys, one at a time, and recording each as invoke + completion with the shared
`HistoryRecorder` (register workload: values are unique ints per key, cas is
`[expected, new]`).

Protocol:
- An operation is a `ClientRequest` sent to the node the client believes leads. A rejection
  with a leader hint retries there at once; a rejection without one, or no answer within
  `attempt_timeout_ns`, retries at the next node. Retries reuse the SAME request number, so
  the replica layer's session table answers a duplicate instead of applying it twice.
- `ok` when a result arrives; `fail` only for a cas whose comparison failed or an operation
  the cluster aborted (`on_aborted`: either way it certainly did not take effect); `info`
  when the operation's deadline passes (it may or may not have happened). After `info`
  the client continues as a fresh process with a fresh session.
- In the liveness phase (`enter_liveness`) the current and later operations share one final
  deadline; an operation still pending when it passes is reported by `stuck()`.

Rules: all randomness from the injected `random.Random`; time from the `EventLoop`; must not
import consensus cores, storage or the replica layer (requests and results cross a small
`ClientTransport` seam).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from phalanx.apps.kv_types import CasResult, CompareAndSet, Done, Get, KvCommand, KvResult, Put
from phalanx.apps.kv_types import Value as KvValue
from phalanx.consensus.types import ClientRequest
from phalanx.jepsen.history import FAIL, INFO, OK, HistoryRecorder
from phalanx.jepsen.sim.loop import EventLoop


class ClientTransport(Protocol):
    def submit(self, client: SimClient, node: str, request: ClientRequest) -> None:
        """Deliver `request` to `node` (after some latency, unless the node is down)."""
        ...


EncodeCommand = Callable[[KvCommand], bytes]


@dataclass(slots=True, kw_only=True)
class ClientConfig:
    attempt_timeout_ns: int = 60_000_000
    op_timeout_ns: int = 600_000_000
    think_ns: int = 10_000_000
    read_weight: int = 4
    write_weight: int = 4
    cas_weight: int = 2


class ValueCounter:
    """Unique written values per key, shared by every client of a run."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def next(self, key: str) -> int:
        value = self._next.get(key, 0) + 1
        self._next[key] = value
        return value


@dataclass(slots=True)
class _Pending:
    f: str
    key: str
    request: ClientRequest
    target: str
    attempt: int
    deadline_ns: int
    cas_new: int | None = None


class SimClient:
    """One closed-loop client; see the module docstring for the protocol."""

    def __init__(
        self,
        index: int,
        *,
        loop: EventLoop,
        rng: random.Random,
        nodes: Sequence[str],
        keys: Sequence[str],
        recorder: HistoryRecorder,
        transport: ClientTransport,
        encode: EncodeCommand,
        values: ValueCounter,
        config: ClientConfig | None = None,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.index = index
        self.loop = loop
        self.rng = rng
        self.nodes = tuple(nodes)
        self.keys = tuple(keys)
        self.recorder = recorder
        self.transport = transport
        self.encode = encode
        self.values = values
        self.config = config if config is not None else ClientConfig()
        self.trace = trace
        self.process = index
        self._generation = 0
        self._request_no = 0
        self.leader_guess = self.nodes[index % len(self.nodes)]
        self.pending: _Pending | None = None
        self.running = False
        self.final_deadline_ns: int | None = None
        self.completed = 0
        self.ok = 0
        self.infos = 0
        self._stuck: list[str] = []

    @property
    def session(self) -> str:
        return f"c{self.index}.{self._generation}"

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.running = True
        self.loop.call_later(self.rng.randrange(self.config.think_ns + 1), self._next_op)

    def stop(self) -> None:
        """Issue no new operations (the outstanding one, if any, still completes)."""
        self.running = False

    def enter_liveness(self, deadline_ns: int) -> None:
        """From now on every operation must complete by `deadline_ns`."""
        self.final_deadline_ns = deadline_ns
        if self.pending is not None:
            self.pending.deadline_ns = deadline_ns
            self.loop.call_at(deadline_ns, self._check_deadline(self.pending))

    def stuck(self) -> list[str]:
        return list(self._stuck)

    # -- issuing ----------------------------------------------------------------------------

    def _next_op(self) -> None:
        if not self.running or self.pending is not None:
            return
        cfg = self.config
        key = self.rng.choice(self.keys)
        roll = self.rng.randrange(cfg.read_weight + cfg.write_weight + cfg.cas_weight)
        self.issue(self._choose(roll, key), key)

    def _choose(self, roll: int, key: str) -> str:
        cfg = self.config
        if roll < cfg.read_weight:
            return "read"
        if roll < cfg.read_weight + cfg.write_weight:
            return "write"
        return "cas"

    def issue(self, f: str, key: str) -> None:
        """Invoke one operation now (also used for the final reads)."""
        if self.pending is not None:
            raise RuntimeError(f"client {self.index} already has an outstanding operation")
        command: KvCommand
        cas_new: int | None = None
        if f == "read":
            command = Get(key=key)
            value: object = None
        elif f == "write":
            v = self.values.next(key)
            command = Put(key=key, value=str(v).encode())
            value = v
        else:
            expected = self.rng.randint(0, self.values.next(key) - 1) or None
            cas_new = self.values.next(key)
            command = CompareAndSet(
                key=key,
                expected=None if expected is None else str(expected).encode(),
                new=str(cas_new).encode(),
            )
            value = (expected, cas_new)
        self._request_no += 1
        request = ClientRequest(
            client_id=self.session,
            request_no=self._request_no,
            command=self.encode(command),
            read_only=f == "read",
        )
        now = self.loop.now
        deadline = (
            self.final_deadline_ns
            if self.final_deadline_ns is not None
            else now + self.config.op_timeout_ns
        )
        self.recorder.invoke(
            process=self.process, f=f, key=key, value=value, time=now  # type: ignore[arg-type]
        )
        pending = _Pending(
            f=f,
            key=key,
            request=request,
            target=self.leader_guess,
            attempt=0,
            deadline_ns=deadline,
            cas_new=cas_new,
        )
        self.pending = pending
        self.loop.call_at(deadline, self._check_deadline(pending))
        self._send(pending)

    def _send(self, pending: _Pending) -> None:
        pending.attempt += 1
        attempt = pending.attempt
        self.transport.submit(self, pending.target, pending.request)
        self.loop.call_later(
            self.config.attempt_timeout_ns, lambda: self._attempt_timeout(pending, attempt)
        )

    def _attempt_timeout(self, pending: _Pending, attempt: int) -> None:
        if self.pending is not pending or pending.attempt != attempt:
            return
        pending.target = self._other_node(pending.target)
        self._send(pending)

    def _other_node(self, node: str) -> str:
        i = self.nodes.index(node) if node in self.nodes else 0
        return self.nodes[(i + 1 + self.rng.randrange(len(self.nodes) - 1 or 1)) % len(self.nodes)]

    def _check_deadline(self, pending: _Pending) -> Callable[[], None]:
        def fire() -> None:
            if self.pending is not pending or self.loop.now < pending.deadline_ns:
                return
            if self.final_deadline_ns is not None:
                self._stuck.append(
                    f"client {self.session} {pending.f} {pending.key} "
                    f"req#{pending.request.request_no} still pending at the liveness deadline"
                )
            # An indeterminate write or cas keeps its invoke value: it may still take effect.
            self._finish(INFO, None if pending.f == "read" else _SAME, error="timeout")

        return fire

    # -- answers ----------------------------------------------------------------------------

    def on_result(self, node: str, request_no: int, result: KvResult) -> None:
        pending = self.pending
        if pending is None or request_no != pending.request.request_no:
            return  # a late duplicate answer
        self.leader_guess = node
        if pending.f == "read":
            if not isinstance(result, KvValue):
                self._finish(INFO, None, error=f"unexpected result {result!r}")
                return
            raw = result.value
            self._finish(OK, None if raw is None else int(raw))
        elif pending.f == "write":
            if isinstance(result, Done):
                self._finish(OK, _SAME)
            else:
                self._finish(INFO, _SAME, error=f"unexpected result {result!r}")
        elif isinstance(result, CasResult):
            self._finish(OK if result.succeeded else FAIL, _SAME)
        else:
            self._finish(INFO, _SAME, error=f"unexpected result {result!r}")

    def on_rejected(self, node: str, request_no: int, leader_hint: str | None) -> None:
        pending = self.pending
        if pending is None or request_no != pending.request.request_no:
            return
        if leader_hint is not None and leader_hint != node and leader_hint in self.nodes:
            pending.target = leader_hint
            self._send(pending)
            return
        pending.target = self._other_node(node)
        attempt = pending.attempt
        # Back off briefly: during an election nobody leads, so retrying at once would spin.
        self.loop.call_later(
            self.config.attempt_timeout_ns // 4,
            lambda: self._retry_after_backoff(pending, attempt),
        )

    def on_aborted(self, node: str, request_no: int, reason: str) -> None:
        """The cluster says the operation will never take effect (`Abort`): `fail`."""
        pending = self.pending
        if pending is None or request_no != pending.request.request_no:
            return
        self._finish(FAIL, _SAME, error=f"aborted: {reason}")

    def _retry_after_backoff(self, pending: _Pending, attempt: int) -> None:
        if self.pending is pending and pending.attempt == attempt:
            self._send(pending)

    def _finish(self, type_: str, value: object, *, error: str | None = None) -> None:
        pending = self.pending
        assert pending is not None  # callers checked; our own invariant, not peer input
        kwargs: dict[str, object] = {}
        if value is not _SAME:
            kwargs["value"] = value
        self.recorder.complete(
            process=self.process,
            type=type_,  # type: ignore[arg-type]
            time=self.loop.now,
            error=error,
            node=pending.target,
            **kwargs,  # type: ignore[arg-type]
        )
        self.pending = None
        self.completed += 1
        if type_ == OK:
            self.ok += 1
        elif type_ == INFO:
            self.infos += 1
            self.process += 1_000  # a fresh process id after info (Jepsen's rule)
            self._generation += 1  # and a fresh session: the old request may still apply
            self._request_no = 0
        if self.running:
            self.loop.call_later(self.rng.randrange(self.config.think_ns + 1), self._next_op)


_SAME = object()
