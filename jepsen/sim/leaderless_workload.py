"""Simulated signing clients for the leaderless core, and the history they record.

Owns: `WorkloadConfig` (the mix and its knobs), `TxRecord` (one transaction's history: what
was issued, every node's commit or abort notice, the client's verdict), `TxTransport` (the
seam to the cluster) and `LeaderlessWorkload` (closed-loop clients, one transaction
outstanding each).

The mix (every written value, amount and member is unique in the run, so a committed
command's bytes name its transaction):
- ``add``: `Add` of a unique amount to a counter key; commutes, requires the key's BASE
  version (f+1 matching nodes; docs/LEADERLESS.md "Mixing update kinds on one key").
- ``sadd``: `SAdd` of a unique member to a set key; commutes, requires the base version.
- ``srem``: `SRem` of a member this client added earlier and saw committed (else an sadd):
  it does not commute with that member's sadd on the same base, so it requires the FULL
  version (and moves the base where it applies).
- mixed keys (`mixed_pct` percent of operations): ``x0`` takes puts of numbers, adds and muls,
  ``y0`` sadds of unique members and srems of members whose sadd committed (one member's
  sadd and srem do not commute): commuting ones require the base version, or
  (`full_pct` percent) the full one; a switch of kind on a base-only requirement is refused
  by correct nodes (it aborts).
- ``put``: `Put` of a unique value to a register key, carrying a requirement on the key's
  version read from f+1 matching nodes (a versioned write: PnyxDB's "checks on versions").
  `conflict_pct` percent of all operations are puts on the HOT register (``r0``): concurrent
  ones conflict and all but one must abort.
Deadlines are spread (`deadline_min_ms`..`deadline_max_ms`; `short_pct` percent get a
deadline of at most `short_max_ms`, so short that they may expire before they commit).

Outcomes, as a client of the real system decides them: ``ok`` once f+1 nodes sent the same
result, ``fail`` once f+1 nodes sent an abort notice, ``info`` when neither happened by the
transaction's deadline plus `grace_ns` (or by the end of the run). Notices arriving after an
``info`` are still tallied (`TxRecord.committed_by`, `aborted_by`): the checker judges the
tallies, not the client's patience.

Rules: deterministic (the injected `random.Random` and the event loop's virtual time only);
imports no core, storage or replica: transactions are signed and encoded by injected
functions, versions read through `TxTransport`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Add, KvCommand, Mul, Put, SAdd, SRem
from phalanx.consensus.leaderless.messages import Requirement, Transaction
from phalanx.consensus.types import ClientRequest
from phalanx.jepsen.sim.loop import EventLoop

OK, FAIL, INFO = "ok", "fail", "info"
_MS = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadConfig:
    clients: int = 3
    ops_per_client: int = 8
    counters: int = 1
    sets: int = 1
    registers: int = 2
    conflict_pct: int = 30
    """Percent of operations that are versioned puts on the hot register ``r0``."""
    srem_pct: int = 10
    chain_pct: int = 30
    """After a put of its commits, a client puts the same key again at once with this
    probability (a chain of versions: a lagging replica sees the second commit early)."""
    burst: int = 2
    """A hot put comes with up to this many more puts on ``r0`` issued with it (requiring
    the same version: at most one of them may commit)."""
    deadline_min_ms: int = 300
    deadline_max_ms: int = 1_500
    short_pct: int = 10
    """Percent of transactions with a deadline of 1..`short_max_ms` ms."""
    short_max_ms: int = 20
    """The longest short deadline: 20 ms usually expires before a commit; around a commit's
    latency (~80 ms) a transaction expires while its endorsements are in flight, so
    conflicting ones get endorsed on condition of it (what the conditional-endorsement
    bugs need)."""
    hot_jitter_ms: int = 0
    """Each hot put reaches each node after its own extra 0..`hot_jitter_ms` ms, so nodes
    see concurrent hot puts in different orders and their endorsements split (0: none,
    and no random draw)."""
    think_ns: int = 120 * _MS
    grace_ns: int = 1_500 * _MS
    """How long past its deadline a client waits for f+1 notices before recording info."""
    mixed_pct: int = 0
    """Percent of operations on the mixed keys ``x0`` (put, add, mul) and ``y0`` (sadd, and
    srem of a member added before)."""
    full_pct: int = 30
    """Percent of the mixed keys' commuting updates that require the full version."""
    submit_to: int = 0
    """Nodes each transaction goes to (0: all; else the first `submit_to` of a seeded
    rotation, e.g. f+1)."""

    @property
    def keys(self) -> tuple[str, ...]:
        return (tuple(f"a{i}" for i in range(self.counters))
                + tuple(f"s{i}" for i in range(self.sets))
                + tuple(f"r{i}" for i in range(self.registers))
                + (("x0", "y0") if self.mixed_pct else ()))


@dataclass(slots=True, kw_only=True)
class TxRecord:
    """One issued transaction and what the nodes said of it."""

    client: str
    kind: str
    key: str
    tx: Transaction
    invoked_ns: int
    outcome: str | None = None
    completed_ns: int | None = None
    results: dict[str, bytes] = field(default_factory=dict)
    """node -> the result it answered (its commit notice)."""
    aborted_by: set[str] = field(default_factory=set)

    @property
    def command(self) -> bytes:
        return self.tx.command

    def committed_by(self, result: bytes) -> int:
        return sum(1 for r in self.results.values() if r == result)

    def describe(self) -> str:
        return (f"{self.tx.client_id}#{self.tx.request_no} {self.kind} {self.key} "
                f"(client: {self.outcome or 'pending'})")


class TxTransport(Protocol):
    def submit(self, node: str, request: ClientRequest) -> None:
        """Deliver `request` to `node` (after some latency, unless the node is down)."""
        ...

    def versions(self, node: str, keys: Sequence[str], *, base: bool = False
                 ) -> tuple[bytes, ...] | None:
        """`node`'s current (`base`: base) versions of `keys` (a local read), or None when
        it is down."""
        ...


class LeaderlessWorkload:
    """The clients of one run; see the module docstring."""

    def __init__(
        self,
        config: WorkloadConfig,
        *,
        loop: EventLoop,
        rng: random.Random,
        nodes: Sequence[str],
        faults: int,
        transport: TxTransport,
        sign: Callable[[Transaction], Transaction],
        encode_tx: Callable[[Transaction], bytes],
        now_ms: Callable[[], int],
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.loop = loop
        self.rng = rng
        self.nodes = tuple(nodes)
        self.f = faults
        self.transport = transport
        self.sign = sign
        self.encode_tx = encode_tx
        self.now_ms = now_ms
        self.trace = trace
        self.records: list[TxRecord] = []
        self._by_id: dict[tuple[str, int], TxRecord] = {}
        self._pending: dict[str, list[TxRecord]] = {}
        self._issued: dict[str, int] = {}
        self._request_no: dict[str, int] = {}
        self._chained: dict[str, tuple[str, str]] = {}
        self._members: dict[str, list[tuple[str, bytes]]] = {}
        self._y_members: list[bytes] = []
        """Members of ``y0`` whose sadd committed (an srem of ``y0`` removes the first)."""
        self._unique = 0
        self.running = False
        self.final_ns: int | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.running = True
        for i in range(self.config.clients):
            name = f"c{i}"
            self._pending[name] = []
            self._issued[name] = 0
            self.loop.call_later(self.rng.randrange(self.config.think_ns + 1),
                                 lambda n=name: self._next(n))  # type: ignore[misc]

    def stop(self, final_ns: int) -> None:
        """Issue nothing new; outstanding transactions may wait for notices until
        `final_ns`, then are recorded info."""
        self.running = False
        self.final_ns = final_ns
        for record in self.records:
            if record.outcome is None:
                self.loop.call_at(final_ns, lambda r=record: self._give_up(r))  # type: ignore[misc]

    @property
    def ok(self) -> int:
        return sum(1 for r in self.records if r.outcome == OK)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.records if r.outcome == FAIL)

    @property
    def infos(self) -> int:
        return sum(1 for r in self.records if r.outcome == INFO)

    # -- issuing --------------------------------------------------------------------------

    def _next(self, client: str) -> None:
        cfg = self.config
        if (not self.running or self._pending[client]
                or self._issued[client] >= cfg.ops_per_client):
            return
        self._issued[client] += 1
        op = self._chained.pop(client, None) or self._choose(client)
        self.issue(client, op)
        if op == ("put", "r0"):  # a burst of conflicting puts, all requiring one version
            for _ in range(self.rng.randint(0, cfg.burst)):
                self.issue(client, op)

    def _choose(self, client: str) -> tuple[str, str]:
        cfg, rng = self.config, self.rng
        if cfg.mixed_pct and rng.randrange(100) < cfg.mixed_pct:
            return rng.choice((("put", "x0"), ("add", "x0"), ("add", "x0"), ("mul", "x0"),
                               ("sadd", "y0"), ("srem", "y0")))
        if cfg.registers and rng.randrange(100) < cfg.conflict_pct:
            return "put", "r0"
        if cfg.sets and self._members.get(client) and rng.randrange(100) < cfg.srem_pct:
            return "srem", self._members[client][0][0]
        kinds = ([("add", f"a{i}") for i in range(cfg.counters)]
                 + [("sadd", f"s{i}") for i in range(cfg.sets)]
                 + [("put", f"r{i}") for i in range(1, cfg.registers)])
        if not kinds:
            return "put", "r0"
        return rng.choice(kinds)

    def issue(self, client: str, op: tuple[str, str]) -> TxRecord:
        """Sign and submit one transaction of `client` now."""
        kind, key = op
        self._unique += 1
        unique = self._unique
        request_no = self._request_no[client] = self._request_no.get(client, 0) + 1
        cfg, rng = self.config, self.rng
        command: KvCommand
        full = (kind == "put" or (kind == "srem" and key != "y0")
                or (key in ("x0", "y0") and rng.randrange(100) < cfg.full_pct))
        if key == "y0" and kind == "srem" and self._y_members:
            command = SRem(key=key, member=self._y_members.pop(0))
        elif key == "y0":
            kind = "sadd"
            command = SAdd(key=key, member=f"m{unique}".encode())
        elif kind == "add":
            command = Add(key=key, amount=unique)
        elif kind == "mul":
            command = Mul(key=key, factor=2 * unique + 1)  # unique bytes; odd: invertible
        elif kind == "sadd":
            command = SAdd(key=key, member=f"m{unique}".encode())
        elif kind == "srem":
            key, member = self._members[client].pop(0)
            command = SRem(key=key, member=member)
        elif key == "x0":
            command = Put(key=key, value=str(unique).encode())
        else:
            command = Put(key=key, value=f"v{unique}".encode())
        requirements = (Requirement(key=key, version=self._read_version(key, base=not full),
                                    base=not full),)
        if rng.randrange(100) < cfg.short_pct:
            spread = rng.randint(1, cfg.short_max_ms)
        else:
            spread = rng.randint(cfg.deadline_min_ms, cfg.deadline_max_ms)
        body = Transaction(client=client, client_id=client, request_no=request_no,
                           deadline_ms=self.now_ms() + spread, requirements=requirements,
                           command=kv_wire.encode_command(command))
        tx = self.sign(body)
        record = TxRecord(client=client, kind=kind, key=key, tx=tx, invoked_ns=self.loop.now)
        self.records.append(record)
        self._by_id[(client, request_no)] = record
        self._pending.setdefault(client, []).append(record)
        self._members.setdefault(client, [])
        request = ClientRequest(client_id=client, request_no=request_no,
                                command=self.encode_tx(tx))
        jitter = cfg.hot_jitter_ms * _MS if key == "r0" and kind == "put" else 0
        for node in self._targets():
            if jitter:
                self.loop.call_later(rng.randrange(jitter + 1),
                                     lambda n=node: self.transport.submit(n, request))  # type: ignore[misc]
            else:
                self.transport.submit(node, request)
        give_up = self.loop.now + spread * _MS + cfg.grace_ns
        self.loop.call_at(give_up, lambda: self._give_up(record))
        return record

    def _targets(self) -> tuple[str, ...]:
        want = self.config.submit_to
        if not want or want >= len(self.nodes):
            return self.nodes
        start = self.rng.randrange(len(self.nodes))
        return tuple(self.nodes[(start + i) % len(self.nodes)] for i in range(want))

    def _read_version(self, key: str, *, base: bool = False) -> bytes:
        """The (`base`: base) version f+1 nodes agree on (else the most common one; b"" if
        none answer)."""
        seen: Counter[bytes] = Counter()
        for node in self.nodes:
            got = self.transport.versions(node, (key,), base=base)
            if got is not None:
                seen[got[0]] += 1
        if not seen:
            return b""
        best = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        return best[0]

    # -- notices ------------------------------------------------------------------------

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None:
        """`node` applied the transaction and answered `result` (a commit notice)."""
        record = self._by_id.get((client_id, request_no))
        if record is None or node in record.results:
            return
        record.results[node] = result
        if record.outcome is None and record.committed_by(result) >= self.f + 1:
            if (record.kind == "put" and record.key != "x0"
                    and self.rng.randrange(100) < self.config.chain_pct):
                self._chained[record.client] = ("put", record.key)
            self._finish(record, OK)
            if record.kind == "sadd" and record.key == "y0":
                member = kv_wire.decode_command(record.command)
                assert isinstance(member, SAdd)
                self._y_members.append(member.member)
            elif record.kind == "sadd":
                member = kv_wire.decode_command(record.command)
                assert isinstance(member, SAdd)
                self._members[record.client].append((record.key, member.member))

    def abort(self, node: str, client_id: str, request_no: int) -> None:
        """`node` says the transaction will never be applied (an abort notice)."""
        record = self._by_id.get((client_id, request_no))
        if record is None:
            return
        record.aborted_by.add(node)
        if record.outcome is None and len(record.aborted_by) >= self.f + 1:
            self._finish(record, FAIL)

    def _give_up(self, record: TxRecord) -> None:
        if record.outcome is not None:
            return
        if self.final_ns is not None and self.loop.now < self.final_ns:
            return  # the liveness phase: wait for the end of the run
        self._finish(record, INFO)

    def _finish(self, record: TxRecord, outcome: str) -> None:
        record.outcome = outcome
        record.completed_ns = self.loop.now
        if self.trace is not None:
            self.trace(f"CLIENT {record.describe()}")
        pending = self._pending.get(record.client, [])
        if record in pending:
            pending.remove(record)
            if self.running and not pending:
                think = 0 if record.client in self._chained else self.config.think_ns
                self.loop.call_later(self.rng.randrange(think + 1),
                                     lambda: self._next(record.client))
