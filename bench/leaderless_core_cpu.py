"""In-process micro-benchmark of the leaderless core's hot path (no sockets, no disk).

Four `LeaderlessCore`s with `FastCrypto` and a dict app, an instant in-memory network, 10 ms
simulated ticks; every tick each of `--clients` clients sends one signed transaction (an `add`
to one of 16 keys: commuting, no requirements) to every node. The driver applies what each
Ready releases and feeds `Persisted` back at once. Reported, over the measured window:

- CPU per committed transaction of the four cores' `step` and the applies;
- the journal's CPU per committed transaction and bytes appended per Ready that carried a
  `core_state`: with `LeaderlessDeltaRules` (diff, encode the delta), else as the old
  `_WholeRecords` journal did (compare with the last record, encode the whole record);
  and the whole record's size (sampled).

`--stack node` runs a real node's application stack instead of the dict app: per node a
`Replica` in transaction mode over a `KvStateMachine` (`TxLayer`, in-memory storage), the
core reading it through `ReplicaAppView`, transactions as `WireTxCodec` frames; each client
write is a `put` of a fresh key that requires the key absent (as `bench/leaderless.py` at
0% conflicts), admitted by the replica (`Replica.admit`, `applied_result`, as the driver
does) and stepped as the runtime's `propose_batch` (one `SubmitBatch` per tick and node).
The CPU then includes the admission, the app's questions and the replica's apply.

Runs in a few seconds; compare two commits by running it from each (it works before the
delta journal too: then only the whole-record size is shown).

    .venv/bin/python bench/leaderless_core_cpu.py [--clients 8] [--seconds 10] [--stack node]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import time
from collections import deque
from collections.abc import Sequence

from phalanx.consensus.core import Persisted, Ready, Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.messages import LEADERLESS_MESSAGES, Requirement, Transaction
from phalanx.consensus.types import ClientRequest, Entry, NodeId
from phalanx.net import wire

EPOCH = 1_700_000_000_000
CLIENT_SECRET = b"bench-clients"


class Codec:
    def __init__(self) -> None:
        wire.register_all(LEADERLESS_MESSAGES)
        self.registry = wire.default_registry()

    def encode(self, tx: Transaction) -> bytes:
        return self.registry.encode(tx)

    def decode(self, data: bytes) -> Transaction | None:
        try:
            obj = self.registry.decode(data)
        except Exception:
            return None
        return obj if isinstance(obj, Transaction) else None


class App:
    """`add KEY N` only: commuting updates, no requirements."""

    def __init__(self, codec: Codec) -> None:
        self.data: dict[str, int] = {}
        self.index = 0
        self._codec = codec

    def conflicts(self, a: bytes, b: bytes) -> bool:
        return False

    def keys(self, command: bytes) -> tuple[str, ...] | None:
        return self.writes(command)

    def writes(self, command: bytes) -> tuple[str, ...]:
        return (command.split()[1].decode(),)

    def needs_requirements(self, command: bytes) -> tuple[str, ...]:
        return ()

    def accepts(self, command: bytes, policy: str) -> bool:
        return True

    def versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        return tuple(hashlib.sha256(str(self.data.get(k)).encode()).digest() for k in keys)

    def base_versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        return self.versions(keys)

    def needs_base(self, command: bytes) -> tuple[str, ...]:
        return ()

    def applied(self) -> int:
        return self.index

    def apply(self, entry: Entry) -> None:
        self.index = entry.index
        tx = self._codec.decode(entry.requests[0].command)
        assert tx is not None
        _, key, n = tx.command.split()
        self.data[key.decode()] = self.data.get(key.decode(), 0) + int(n)


class KvNode:
    """`--stack node`: a real node's application stack (module docstring)."""

    def __init__(self) -> None:
        from phalanx.apps.kv import KvStateMachine
        from phalanx.apps.replica import Replica
        from phalanx.protocols.leaderless_node import ReplicaAppView, TxLayer, WireTxCodec
        from phalanx.storage.memory import MemoryDisk
        storage = MemoryDisk().open()
        self.codec = WireTxCodec()  # the replica's layer and the core share it (a real node)
        self.replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints,
                               transactions=TxLayer(self.codec))
        self.view = ReplicaAppView(self.replica)

    @property
    def index(self) -> int:
        return self.replica.applied_index

    def admit(self, request: ClientRequest) -> bool:
        """The driver's arrival checks (`driver_calls._on_call`)."""
        replica = self.replica
        return (replica.admit(request.client_id, request.command, request.read_only) is None
                and replica.applied_result(request.command) is None)

    def apply(self, entry: Entry) -> None:
        self.replica.apply(entry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="transactions per tick")
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="simulated seconds not measured")
    parser.add_argument("--stack", choices=("toy", "node"), default="toy",
                        help="toy: the dict app; node: a real node's replica, KV app and "
                             "wire codec (module docstring)")
    parser.add_argument("--value-size", type=int, default=100, help="--stack node: value bytes")
    args = parser.parse_args()
    try:
        from phalanx.consensus.leaderless.durable import LeaderlessDeltaRules
        rules: LeaderlessDeltaRules | None = LeaderlessDeltaRules()
    except ImportError:
        rules = None
    codec = Codec()
    ids = tuple(NodeId(f"n{i}") for i in range(1, 5))
    kv = args.stack == "node"
    apps: dict[NodeId, App | KvNode] = {
        n: KvNode() if kv else App(codec) for n in ids}
    views = {n: a.view if isinstance(a, KvNode) else a for n, a in apps.items()}
    codecs = {n: a.codec if isinstance(a, KvNode) else codec for n, a in apps.items()}
    if kv:
        from phalanx.apps.kv_types import Put
        from phalanx.apps.kv_wire import encode_command
        from phalanx.consensus.leaderless.batching import SubmitBatch
    client_keys = FastCrypto(NodeId("verifier"), cluster_secret=CLIENT_SECRET)
    signer = FastCrypto(NodeId("c1"), cluster_secret=CLIENT_SECRET)
    # As a real node (`leaderless_node.build_core`): growth notes for the journal's diff,
    # where this revision has them (docs/LEADERLESS.md "Round 7").
    notes = ({"growth_notes": True} if "growth_notes" in inspect.signature(
        LeaderlessCore.__init__).parameters else {})
    cores = {n: LeaderlessCore(LeaderlessConfig(node_id=n, nodes=ids), crypto=FastCrypto(n),
                               client_keys=client_keys, app=views[n], codec=codecs[n],
                               **notes)  # type: ignore[arg-type]
             for n in ids}
    last: dict[NodeId, object] = {}
    stats: dict[str, float] = {"records": 0, "sampled": 0, "whole": 0, "appended": 0,
                               "readys": 0, "journal_cpu": 0.0}
    cpu = 0.0
    queue: deque[tuple[NodeId, object]] = deque()

    def handle(node: NodeId, ready: Ready, measure: bool) -> None:
        state = ready.core_state
        if state is not None and measure:
            stats["records"] += 1
            start = time.process_time()
            if rules is not None:  # what the journal does now: diff, encode the delta
                delta = rules.diff(last[node], state) if node in last else state
                size = len(codec.registry.encode(delta)) if delta is not None else 0
            else:  # what `_WholeRecords` did: compare, encode the whole record
                size = 0 if last.get(node) == state else len(codec.registry.encode(state))
            stats["journal_cpu"] += time.process_time() - start
            stats["appended"] += size
            if stats["records"] % 25 == 1:  # the whole record, sampled
                stats["sampled"] += 1
                stats["whole"] += len(codec.registry.encode(state))
        if state is not None:
            last[node] = state
        stats["readys"] += 1
        for send in ready.messages:
            queue.append((send.to, Receive(src=node, message=send.message)))
        if ready.number:
            queue.append((node, Persisted(number=ready.number)))

    ticks = int(args.seconds * 100)
    warm = int(args.warmup * 100)
    no = 0
    committed0 = 0.0
    for t in range(ticks):
        measure = t >= warm
        if t == warm:
            committed0 = sum(a.index for a in apps.values()) / len(apps)
        now = EPOCH + 10 * t
        for node in ids:
            queue.append((node, Tick(now_ms=now)))
        batch: list[ClientRequest] = []
        for c in range(args.clients):
            no += 1
            if kv:
                key = f"b{c}-{no}"
                value = (f"{key}|".encode() + b"v" * args.value_size)[:args.value_size]
                body = Transaction(client="c1", client_id=f"c{c}", request_no=no,
                                   deadline_ms=now + 5_000,
                                   requirements=(Requirement(key=key, version=b""),),
                                   command=encode_command(Put(key=key, value=value)))
            else:
                body = Transaction(client="c1", client_id="c1", request_no=no,
                                   deadline_ms=now + 5_000, requirements=(),
                                   command=f"add k{no % 16} 1".encode())
            tx = dataclasses.replace(body, signature=signer.sign(body))
            if kv:  # as a client: one call to every node
                batch.append(ClientRequest(client_id=tx.client_id, request_no=no,
                                           command=codec.encode(tx)))
                continue
            for node in ids:
                queue.append((node, Receive(src=ids[(ids.index(node) + 1) % 4], message=tx)))
        if kv:
            for node in ids:
                start = time.process_time()
                admitted = tuple(r for r in batch if apps[node].admit(r))  # type: ignore[union-attr]
                if measure:
                    cpu += time.process_time() - start
                queue.append((node, SubmitBatch(requests=admitted)))
        while queue:
            node, inp = queue.popleft()
            start = time.process_time()
            ready = cores[node].step(inp)  # type: ignore[arg-type]
            for entry in ready.committed:
                apps[node].apply(entry)
            if measure:
                cpu += time.process_time() - start
            handle(node, ready, measure)
    committed = sum(a.index for a in apps.values()) / len(apps) - committed0
    records = max(stats["records"], 1)
    print(f"stack={args.stack} clients/tick={args.clients} "
          f"simulated={args.seconds - args.warmup:.0f}s committed={committed:.0f} (of {no} sent)")
    journal = stats["journal_cpu"]
    print(f"CPU per committed tx: cores {cpu / max(committed, 1) * 1e6:.0f} us, journal "
          f"(diff/compare + encode) {journal / max(committed, 1) * 1e6:.0f} us")
    whole = stats["whole"] / max(stats["sampled"], 1)
    print(f"core_state per Ready that carried one: whole record {whole:.0f} B, journal "
          f"appends {stats['appended'] / records:.0f} B "
          f"({'delta' if rules is not None else 'whole record when changed'})")


if __name__ == "__main__":
    main()
