"""A tiny hand-driven PBFT cluster for tests: cores, an in-flight message list, FastCrypto.

Each Ready is carried out by the shared `ReadyExecutor`
(tests/consensus/conformance/ready_executor.py) through this module's hooks: queue the early
messages, record `core_state` (the "disk"), install a snapshot, queue the messages, apply
committed entries (the app is a list of commands), feed `Persisted`, then a checkpoint every
K seqs. Client answers (reads, rejections) are not modelled. Byzantine nodes have no core:
tests script their messages with `byz_sign` / `inject`.
"""

from __future__ import annotations

import ast
import dataclasses
import random
import sys
from collections.abc import Callable
from pathlib import Path

from phalanx.consensus.core import Input, Ready, Receive, Snapshot, Submit, Tick, snapshot_bytes
from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.pbft import (
    PbftBugs,
    PbftConfig,
    PbftCore,
    PbftDurableState,
    PbftRestoredState,
)
from phalanx.consensus.pbft.messages import signed_part
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, Message, NodeId

_CONFORMANCE = str(Path(__file__).resolve().parents[1] / "conformance")
if _CONFORMANCE not in sys.path:
    sys.path.insert(0, _CONFORMANCE)
from ready_executor import ReadyExecutor  # noqa: E402  (the shared Ready order)

Filter = Callable[[NodeId, NodeId, Message], bool]


def req(client: str, no: int) -> ClientRequest:
    return ClientRequest(client_id=client, request_no=no, command=f"{client}:{no}".encode())


class Cluster:
    def __init__(
        self,
        n: int,
        *,
        byzantine: tuple[int, ...] = (),
        bugs: frozenset[str] = frozenset(),
        **config: int,
    ) -> None:
        self.ids = tuple(NodeId(f"n{i}") for i in range(n))
        self.crypto = {i: FastCrypto(i) for i in self.ids}
        self.byzantine = tuple(self.ids[b] for b in byzantine)
        self.bugs = PbftBugs.from_names(bugs)
        self.config_kw = config
        self.cores: dict[NodeId, PbftCore] = {}
        self.durable: dict[NodeId, PbftDurableState] = {}
        self.app: dict[NodeId, list[bytes]] = {}
        self.entries: dict[NodeId, list[Entry]] = {}
        self.checkpoints: dict[NodeId, dict[int, bytes]] = {}
        self.net: list[tuple[NodeId, NodeId, Message]] = []
        self.byz_inbox: list[tuple[NodeId, NodeId, Message]] = []
        self.filter: Filter | None = None
        self.down: set[NodeId] = set()
        for i in self.ids:
            if i not in self.byzantine:
                self.cores[i] = PbftCore(self.config(i), crypto=self.crypto[i], bugs=self.bugs)
                self.app[i] = []
                self.entries[i] = []
                self.checkpoints[i] = {}
        self.executor = ReadyExecutor(
            feed=lambda n, inp: self.step(n, inp), persist=self._persist,
            install=self._install, send=lambda n, s: self.net.append((n, s.to, s.message)),
            apply=self._apply, checkpoint=self._checkpoint, checkpoint_every=self.k)
        """Carries out every Ready in the contract's order through the hooks below."""

    def config(self, node: NodeId) -> PbftConfig:
        return PbftConfig(node_id=node, replicas=self.ids, **self.config_kw)  # type: ignore[arg-type]

    @property
    def k(self) -> int:
        return self.config(self.ids[0]).checkpoint_interval

    def honest(self) -> list[NodeId]:
        return [i for i in self.ids if i in self.cores]

    # Driving ---------------------------------------------------------------------------

    def step(self, node: NodeId, inp: Input) -> None:
        if node in self.down:
            return
        self.handle(node, self.cores[node].step(inp))

    def handle(self, node: NodeId, ready: Ready) -> None:
        self.executor.run(node, ready)

    # The executor's hooks (the Ready order itself lives in `ready_executor`).

    def _persist(self, node: NodeId, ready: Ready) -> None:
        if ready.core_state is not None:
            assert isinstance(ready.core_state, PbftDurableState)
            self.durable[node] = ready.core_state

    def _install(self, node: NodeId, snapshot: Snapshot) -> None:
        self.app[node] = list(ast.literal_eval(snapshot_bytes(snapshot.data).decode()))
        assert len(self.app[node]) == snapshot.meta.index

    def _apply(self, node: NodeId, e: Entry) -> None:
        assert e.index == len(self.app[node]) + 1, (node, e.index, len(self.app[node]))
        self.entries[node].append(e)
        self.app[node].append(b"|".join(r.command for r in e.requests) or b"null")

    def _checkpoint(self, node: NodeId, index: int) -> bytes:
        data = repr(tuple(self.app[node][:index])).encode()
        self.checkpoints[node][index] = data
        return data

    def submit(self, node: NodeId, request: ClientRequest) -> None:
        self.step(node, Submit(request=request))

    def submit_all(self, request: ClientRequest) -> None:
        for i in self.honest():
            self.submit(i, request)

    def tick(self, times: int = 1, nodes: list[NodeId] | None = None) -> None:
        for _ in range(times):
            for i in nodes or self.honest():
                self.step(i, Tick())

    def inject(self, src: NodeId, dst: NodeId, msg: Message) -> None:
        self.net.append((src, dst, msg))

    def byz_sign(self, node: NodeId, msg: Message) -> Message:
        """`msg` signed by (Byzantine) `node`, bypassing any SafetyRules."""
        sig = self.crypto[node].sign(signed_part(msg))
        return dataclasses.replace(msg, signature=sig)  # type: ignore[type-var]

    def deliver(self, rng: random.Random | None = None, max_messages: int = 200_000) -> int:
        """Deliver until the network is empty (FIFO, or random order with `rng`)."""
        count = 0
        while self.net and count < max_messages:
            index = rng.randrange(len(self.net)) if rng is not None else 0
            src, dst, msg = self.net.pop(index)
            count += 1
            if self.filter is not None and not self.filter(src, dst, msg):
                continue
            if dst in self.byzantine:
                self.byz_inbox.append((src, dst, msg))
            elif dst not in self.down:
                self.step(dst, Receive(src=src, message=msg))
        return count

    def crash(self, node: NodeId) -> None:
        self.down.add(node)
        self.net = [m for m in self.net if m[0] != node]

    def restart(self, node: NodeId) -> None:
        """Rebuild `node` from its durable state and its latest checkpoint."""
        self.down.discard(node)
        durable = self.durable.get(node, PbftDurableState())
        cps = self.checkpoints[node]
        index = max(cps, default=0)
        data = cps.get(index)
        self.app[node] = list(ast.literal_eval(data.decode())) if data else []
        self.entries[node] = self.entries[node][:index]
        restored = PbftRestoredState(durable=durable, executed=index, checkpoint_data=data)
        self.cores[node] = PbftCore(
            self.config(node), crypto=self.crypto[node], restored=restored, bugs=self.bugs
        )

    # Checks --------------------------------------------------------------------------

    def assert_agreement(self) -> None:
        """No two honest replicas executed different batches at one seq."""
        by_seq: dict[int, tuple[tuple[ClientRequest, ...], NodeId]] = {}
        for node, app in self.app.items():
            for seq, cmd in enumerate(app, start=1):
                seen = by_seq.setdefault(seq, (cmd, node))  # type: ignore[arg-type]
                assert seen[0] == cmd, f"divergence at seq {seq}: {node} vs {seen[1]}"

    def diverged(self) -> bool:
        try:
            self.assert_agreement()
        except AssertionError:
            return True
        return False

    def dropped(self, node: NodeId) -> dict[str, int]:
        return dict(self.cores[node].status().dropped)


def null_digest(crypto: FastCrypto) -> bytes:
    return digest_of(crypto, ())


__all__ = ["Cluster", "EntryKind", "null_digest", "req"]
