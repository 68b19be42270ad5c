"""A tiny in-memory cluster of leaderless cores for unit tests.

`KvApp` is a fake application over a dict (commands are ``set k v``, ``add k n``, ``get k``)
that applies released entries in index order, once per transaction id, and answers the
`AppView` questions. `Cluster` runs n cores with FastCrypto, delivering messages in a
seeded random order, applying `Ready`s in contract order (persist = remember core_state).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace

from phalanx.consensus.core import Abort, Input, Persisted, Ready, Receive, Send, Submit, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.endorsement_batch import expand, sign_one
from phalanx.consensus.leaderless.messages import (
    LEADERLESS_MESSAGES,
    Endorsement,
    EndorsementBatch,
    LeaderlessDurableState,
    Requirement,
    SignatureResend,
    Transaction,
    TxId,
    transaction_id,
)
from phalanx.consensus.types import ClientRequest, Entry, NodeId
from phalanx.net.codec import Registry
from phalanx.net.wire import register_all

REGISTRY = Registry()
register_all(LEADERLESS_MESSAGES, registry=REGISTRY)
CLIENT_SECRET = b"clients"
EPOCH = 1_000_000


class WireCodec:
    def encode(self, tx: Transaction) -> bytes:
        return REGISTRY.encode(tx)

    def decode(self, data: bytes) -> Transaction | None:
        try:
            obj = REGISTRY.decode(data)
        except Exception:
            return None
        return obj if isinstance(obj, Transaction) else None


CODEC = WireCodec()


def tx_id(tx: Transaction) -> TxId:
    return transaction_id(tx, CODEC.encode)


def client_keys() -> FastCrypto:
    return FastCrypto(NodeId("verifier"), cluster_secret=CLIENT_SECRET)


def sign_tx(client: str, tx: Transaction) -> Transaction:
    signer = FastCrypto(NodeId(client), cluster_secret=CLIENT_SECRET)
    return replace(tx, signature=signer.sign(tx))


def version(value: bytes | None) -> bytes:
    return b"" if value is None else hashlib.sha512(value).digest()


def make_tx(command: str, *, client: str = "c1", no: int = 1, deadline: int = EPOCH + 5000,
            reqs: dict[str, bytes] | None = None, policy: str = "",
            read_only: bool = False) -> Transaction:
    requirements = tuple(Requirement(key=k, version=v) for k, v in sorted((reqs or {}).items()))
    tx = Transaction(client=client, client_id=client, request_no=no, deadline_ms=deadline,
                     requirements=requirements, command=command.encode(), policy=policy,
                     read_only=read_only)
    return sign_tx(client, tx)


def submit_of(tx: Transaction) -> Submit:
    return Submit(request=ClientRequest(client_id=tx.client_id, request_no=tx.request_no,
                                        command=CODEC.encode(tx), read_only=tx.read_only))


def _parse(command: bytes) -> tuple[str, str, bytes]:
    op, key, *rest = command.decode().split(" ", 2)
    return op, key, (rest[0].encode() if rest else b"")


class KvApp:
    """A dict KV with PnyxDB's conflict matrix for set/add/get (an `AppView`)."""

    def __init__(self, refuse_policy: str | None = None) -> None:
        self.data: dict[str, bytes] = {}
        self.log: list[Entry] = []
        self.applied_ids: list[TxId] = []
        self._applied = 0
        self.refuse_policy = refuse_policy
        self.bases: dict[str, bytes] = {}
        """Each key's base version: a hash chain over its sets (never the same twice)."""
        self.adds: dict[str, int] = {}
        """The XOR of the ids of the adds applied since the key's base changed."""
        self.base_required = False
        """Whether an add must carry a base requirement (`needs_base`); then `versions` is
        the ABA-free full version (the base and the adds since it) instead of the value's
        hash, as docs/LEADERLESS.md "Mixing update kinds on one key" asks of an app."""
        self.pinned_moves_base = True
        """Whether an add whose transaction requires its key by FULL version moves the base
        (`TransactionAware.apply_tx`'s `pinned`; False: the old rule, for a control)."""

    def conflicts(self, a: bytes, b: bytes) -> bool:
        (oa, ka, da), (ob, kb, db) = _parse(a), _parse(b)
        if ka != kb or (oa == "get" and ob == "get"):
            return False
        if oa == ob == "add":
            return False
        return not (oa == ob == "set" and da == db)

    def keys(self, command: bytes) -> tuple[str, ...] | None:
        return (_parse(command)[1],)

    def writes(self, command: bytes) -> tuple[str, ...]:
        op, key, _ = _parse(command)
        return () if op == "get" else (key,)

    def needs_requirements(self, command: bytes) -> tuple[str, ...]:
        op, key, _ = _parse(command)
        return () if op == "add" else (key,)

    def needs_base(self, command: bytes) -> tuple[str, ...]:
        op, key, _ = _parse(command)
        return (key,) if op == "add" and self.base_required else ()

    def base_versions(self, keys: object) -> tuple[bytes, ...]:
        return tuple(self.bases.get(k, b"") for k in keys)  # type: ignore[attr-defined]

    def accepts(self, command: bytes, policy: str) -> bool:
        return policy != self.refuse_policy

    def fits_run(self, command: bytes, keys: object) -> bool:
        return True  # one commuting kind (add): every run fits

    def versions(self, keys: object) -> tuple[bytes, ...]:
        if self.base_required:  # the ABA-free full version: base and the adds since it
            return tuple(b"" if k not in self.bases and k not in self.adds else
                         hashlib.sha256(self.bases.get(k, b"") + self.adds.get(k, 0)
                                        .to_bytes(32, "big")).digest()
                         for k in keys)  # type: ignore[attr-defined]
        return tuple(version(self.data.get(k)) for k in keys)  # type: ignore[attr-defined]

    def applied(self) -> int:
        return self._applied

    def apply(self, entry: Entry) -> None:
        assert entry.index == self._applied + 1, (entry.index, self._applied)
        self._applied = entry.index
        tx = CODEC.decode(entry.requests[0].command)
        assert tx is not None
        tid = tx_id(tx)
        if tid in self.applied_ids or tx.read_only:
            return
        self.applied_ids.append(tid)
        op, key, data = _parse(tx.command)
        if op == "set":
            self.data[key] = data
            self.bases[key] = hashlib.sha256(self.bases.get(key, b"") + tid).digest()
            self.adds.pop(key, None)
        elif op == "add":
            if self.pinned_moves_base and any(r.key == key and not r.base
                                              for r in tx.requirements):
                self.bases[key] = hashlib.sha256(self.bases.get(key, b"") + tid).digest()
                self.adds.pop(key, None)
            else:
                self.adds[key] = self.adds.get(key, 0) ^ int.from_bytes(tid, "big")
            self.data[key] = str(int(self.data.get(key, b"0")) + int(data)).encode()


@dataclass
class Node:
    core: LeaderlessCore
    app: KvApp
    crypto: FastCrypto
    durable: LeaderlessDurableState | None = None
    aborted: list[Abort] = field(default_factory=list)
    readys: list[Ready] = field(default_factory=list)


class Cluster:
    def __init__(self, n: int = 4, *, seed: int = 0, bugs: dict[str, frozenset[str]] | None = None,
                 apps: dict[str, KvApp] | None = None, **config: object) -> None:
        self.ids = tuple(NodeId(f"n{i}") for i in range(1, n + 1))
        self.rng = random.Random(seed)
        self.config = config
        self.bugs = bugs or {}
        self.nodes: dict[NodeId, Node] = {}
        self.net: list[tuple[NodeId, Send]] = []
        self.now = EPOCH
        self.down: set[NodeId] = set()
        self.cut: set[tuple[NodeId, NodeId]] = set()
        for node in self.ids:
            app = (apps or {}).get(node, KvApp())
            self.nodes[node] = self._make(node, app, None)

    def _make(self, node: NodeId, app: KvApp, durable: LeaderlessDurableState | None,
              recovering: bool = False) -> Node:
        crypto = FastCrypto(node)
        cfg = LeaderlessConfig(node_id=node, nodes=self.ids, **self.config)  # type: ignore[arg-type]
        core = LeaderlessCore(cfg, crypto=crypto, client_keys=client_keys(), app=app,
                              codec=CODEC, restored=durable,
                              bugs=self.bugs.get(node, frozenset()), recovering=recovering)
        return Node(core=core, app=app, crypto=crypto, durable=durable)

    def restart(self, node: NodeId) -> None:
        """Crash and restart `node` from its durable record (in-flight messages to it are
        lost), keeping its applied app state."""
        old = self.nodes[node]
        durable = old.durable
        if durable is not None:  # the record must survive the wire codec
            durable = REGISTRY.decode(REGISTRY.encode(durable), expected=LeaderlessDurableState)
        self.net = [(src, s) for src, s in self.net if s.to != node]
        self.nodes[node] = self._make(node, old.app, durable)

    def lose_disk(self, node: NodeId, *, recovering: bool = True) -> None:
        """Crash `node` and restart it with an empty record and an empty app (amnesia; the
        runtime's verdict says `recovering`)."""
        self.net = [(src, s) for src, s in self.net if s.to != node]
        self.nodes[node] = self._make(node, KvApp(), None, recovering=recovering)
    def step(self, node: NodeId, inp: Input) -> Ready:
        n = self.nodes[node]
        ready = n.core.step(inp)
        n.readys.append(ready)
        assert not ready.early_messages
        if ready.core_state is not None:
            assert isinstance(ready.core_state, LeaderlessDurableState)
            n.durable = ready.core_state
        assert ready.entries == ready.committed
        for entry in ready.committed:
            n.app.apply(entry)
        n.aborted += ready.aborted
        for send in ready.messages:
            if (node, send.to) not in self.cut:
                self.net.append((node, send))
        if ready.number:  # durable at once (GC waits for it: `TickWork._wal_unsynced`)
            self.step(node, Persisted(number=ready.number))
        return ready

    def submit(self, tx: Transaction, to: tuple[NodeId, ...] | None = None) -> None:
        for node in to or self.ids[:1]:
            self.step(node, submit_of(tx))

    def deliver(self, limit: int = 100_000) -> int:
        count = 0
        while self.net and count < limit:
            i = self.rng.randrange(len(self.net))
            src, send = self.net.pop(i)
            if send.to in self.down:
                continue
            self.step(send.to, Receive(src=src, message=send.message))
            count += 1
        return count

    def tick(self, ms: int = 100, rounds: int = 1) -> None:
        for _ in range(rounds):
            self.now += ms
            for node in self.ids:
                if node not in self.down:
                    self.step(node, Tick(now_ms=self.now))
            self.deliver()

    def states(self) -> list[dict[str, bytes]]:
        return [self.nodes[n].app.data for n in self.ids]


def submit_split_pairs(c: Cluster, pairs: int) -> list[tuple[Transaction, Transaction]]:
    """A backlog nobody can decide without n4: `pairs` conflicting puts, the first of each
    pair to n1 and n2, the second to n3, n3 cut off from n1 and n2 meanwhile (neither reaches
    Q = 3 at n = 4 with n4 down); the cut is healed before returning."""
    side = {NodeId("n1"), NodeId("n2"), NodeId("n3")}
    c.cut = {(a, b) for a in side for b in side if (a == "n3") != (b == "n3")}
    made = []
    for k in range(pairs):
        key = f"k{k}"
        t1 = make_tx(f"set {key} a", no=k + 1, reqs={key: version(None)}, deadline=EPOCH + 400)
        t2 = make_tx(f"set {key} b", client="c2", no=k + 1, reqs={key: version(None)},
                     deadline=EPOCH + 400)
        c.submit(t1, to=(NodeId("n1"), NodeId("n2")))
        c.submit(t2, to=(NodeId("n3"),))
        made.append((t1, t2))
    c.deliver()
    c.cut.clear()
    return made


def sent_endorsements(ready: Ready) -> list[Endorsement]:
    """The endorsements `ready` sends, one per send: bare ones, the items of batches and
    of re-sends."""
    out: list[Endorsement] = []
    for send in ready.messages:
        if isinstance(send.message, Endorsement):
            out.append(send.message)
        elif isinstance(send.message, SignatureResend):
            out += send.message.endorsements
        elif isinstance(send.message, EndorsementBatch):
            expanded = expand(send.message)
            assert expanded is not None
            out += expanded[1]
    return out


def endorsement(node: str, tx: Transaction, conditions: tuple[TxId, ...] = ()) -> Endorsement:
    """`node`'s signed endorsement of `tx` (tests play the other nodes)."""
    return sign_one(FastCrypto(NodeId(node)), NodeId(node), tx_id(tx), tuple(sorted(conditions)))


def solo(node: str = "n1", *, bugs: frozenset[str] = frozenset(), app: KvApp | None = None,
         restored: LeaderlessDurableState | None = None, recovering: bool = False,
         **config: object) -> tuple[LeaderlessCore, KvApp]:
    """One core of a 4-node cluster, driven by hand."""
    app = app or KvApp()
    ids = tuple(NodeId(f"n{i}") for i in range(1, 5))
    cfg = LeaderlessConfig(node_id=NodeId(node), nodes=ids, **config)  # type: ignore[arg-type]
    core = LeaderlessCore(cfg, crypto=FastCrypto(NodeId(node)), client_keys=client_keys(),
                          app=app, codec=CODEC, restored=restored, bugs=bugs,
                          recovering=recovering)
    return core, app


def run(core: LeaderlessCore, app: KvApp, inp: Input) -> Ready:
    """Step `core` and apply what it releases to `app`, then feed `Persisted` back (the
    driver's job: GC takes a released proof out of the record only once a `Persisted`
    covered an fsync after its release). Returns the Ready of `inp`."""
    first = ready = core.step(inp)
    while True:
        for entry in ready.committed:
            app.apply(entry)
        if not ready.number:
            return first
        ready = core.step(Persisted(number=ready.number))
        assert not ready.messages, "a Persisted step sent messages: run() would lose them"


def pending_at_n1() -> tuple[LeaderlessCore, KvApp, Transaction]:
    """A solo n1 holding `add x 1` with its own and n2's endorsements (2 < Q = 3: pending)."""
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    run(core, app, submit_of(tx))
    run(core, app, Receive(src=NodeId("n2"), message=endorsement("n2", tx)))
    assert core.status().pending == 1
    return core, app, tx
