"""ENDORSEMENT mode of phalanx.client.Client (the leaderless core) against fake nodes (real
loopback TLS, pytest-trio).

What is pinned here: every write is one client-signed `Transaction` (verifiable with the
keyring's `client_verifier`) carried in `ClientRequest.command` and sent to every node; f+1
matching OK answers decide it, f+1 ABORTED answers raise `TransactionAborted` (a definite
failure), anything less is retried with the SAME signed bytes and ends indeterminate; the KV
helpers require the version f+1 nodes report when the caller gives none. The protocol is a
test-only spec (PBFT's with `CallStrategy.ENDORSEMENT`), so these tests do not depend on the
leaderless core.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator

import pytest
import trio
from client_fakes import Action, Certs, FakeNode, KvBackend, Silent, cluster, make_certs, reply

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.kv_ops import version_of
from phalanx.apps.kv_types import Done, GetBaseVersion, GetVersion, Put, SAdd, VersionResult
from phalanx.client.endorsement_calls import MatchingReplies
from phalanx.client.errors import ClientTimeout, RequestRejected, TransactionAborted
from phalanx.client.kv import BaseVersion
from phalanx.consensus.leaderless.messages import LEADERLESS_MESSAGES, Requirement, Transaction
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.client_protocol import ClientCall, ClientReply, ReadConsistency, ReplyStatus
from phalanx.ops.signing_keys import TransactionSigner, client_verifier
from phalanx.protocols import CallStrategy, get, registry

NAMES = ("n1", "n2", "n3", "n4")
SIGNER = TransactionSigner("tester", hashlib.sha256(b"tester").digest())
VERIFIER = client_verifier({"tester": SIGNER.public_key})
DONE = kv_wire.encode_result(Done())
wire.register_all(LEADERLESS_MESSAGES)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"), NAMES)


@pytest.fixture(autouse=True)
def endorsement_protocol() -> Iterator[str]:
    spec = dataclasses.replace(get("pbft"), name="endorse-test",
                               call_strategy=CallStrategy.ENDORSEMENT)
    registry._TABLE.specs[spec.name] = spec
    yield spec.name
    del registry._TABLE.specs[spec.name]


def _options(**more: object) -> dict[str, object]:
    return {"protocol": "endorse-test", "signer": SIGNER, "timeout": 1.0,
            "abort_grace": 0.3, "attempt_timeout": 0.2, **more}


BASE_K = {"k": BaseVersion(b"")}
"""A base requirement given by the caller: the helper reads nothing first."""


def _tx(call: ClientCall) -> Transaction:
    """The signed transaction a call carries, checked as a node would."""
    tx = wire.decode(call.request.command, expected=Transaction)
    assert VERIFIER.verify(NodeId(tx.client), tx, tx.signature)
    assert (tx.client_id, tx.request_no) == (call.request.client_id, call.request.request_no)
    assert tx.read_only == call.request.read_only
    return tx


def answering(status: ReplyStatus, result: bytes = b"", message: str = "") -> object:
    async def behaviour(node: FakeNode, call: ClientCall) -> Action:
        _tx(call)
        return reply(node, call, status, result=result, message=message)
    return behaviour


async def silent(node: FakeNode, call: ClientCall) -> Action:
    return Silent()


def _versions_then(status: ReplyStatus, backend: KvBackend) -> object:
    """A node over `backend`: STALE reads answered from it, transactions with `status`
    (OK: applied to the backend)."""
    async def behaviour(node: FakeNode, call: ClientCall) -> Action:
        if call.consistency is ReadConsistency.STALE:
            return reply(node, call, ReplyStatus.OK,
                         result=backend.machine.query(call.request.command))
        tx = _tx(call)
        if status is not ReplyStatus.OK:
            return reply(node, call, status, message="requirement failed")
        if tx.read_only:
            return reply(node, call, status, result=backend.machine.query(tx.command))
        return reply(node, call, status, result=backend.machine.apply(tx.command))
    return behaviour


async def test_f_plus_one_matching_ok_is_accepted_and_every_node_gets_the_transaction(
        certs: Certs) -> None:
    behaviours = {"n1": answering(ReplyStatus.OK, DONE), "n2": answering(ReplyStatus.OK, DONE),
                  "n3": silent, "n4": silent}
    before = time.time()
    # one attempt spans the whole call: a slow machine cannot make it retry
    async with cluster(certs, behaviours, **_options(attempt_timeout=5.0)) as (client, nodes):
        await client.put("k", b"v", requirements={"k": b""})
    for node in nodes.values():
        assert len(node.received) == 1  # every node, once: no retry was needed
    tx = _tx(nodes["n3"].received[0])
    assert tx.client == "tester"
    assert tx.requirements == (Requirement(key="k", version=b""),)
    assert kv_wire.decode_command(tx.command) == Put(key="k", value=b"v")
    assert before + 1.0 <= tx.deadline_ms / 1000 + 0.001 <= time.time() + 1.0


async def test_f_plus_one_aborted_raise_transaction_aborted(certs: Certs) -> None:
    behaviours = {"n1": answering(ReplyStatus.ABORTED, message="version mismatch on k"),
                  "n2": answering(ReplyStatus.OK, DONE),
                  "n3": answering(ReplyStatus.ABORTED, message="dropped"), "n4": silent}
    async with cluster(certs, behaviours, **_options()) as (client, _):
        with pytest.raises(TransactionAborted) as exc:
            await client.add("k", 1, requirements=BASE_K)
    assert isinstance(exc.value, RequestRejected)  # a definite failure: no effect
    assert exc.value.replicas == ("n1", "n3")
    assert exc.value.reason in ("version mismatch on k", "dropped")


async def test_mixed_answers_are_retried_with_the_same_transaction_then_indeterminate(
        certs: Certs) -> None:
    behaviours = {"n1": answering(ReplyStatus.OK, DONE),
                  "n2": answering(ReplyStatus.ABORTED, message="dropped"),
                  "n3": answering(ReplyStatus.RETRY), "n4": silent}
    async with cluster(certs, behaviours, **_options()) as (client, nodes):
        with pytest.raises(ClientTimeout, match="may or may not"):
            await client.add("k", 1, requirements=BASE_K)
    sent = [call.request.command for node in nodes.values() for call in node.received]
    assert len(sent) > len(NAMES)  # retried
    assert len(set(sent)) == 1  # the same signed transaction every time, to every node


async def test_a_late_majority_decides_after_a_retry(certs: Certs) -> None:
    """The first attempt gets nothing; the retry (same bytes) gets f+1 OKs."""
    async def second_time(node: FakeNode, call: ClientCall) -> Action:
        _tx(call)
        if len(node.received) < 2:
            return Silent()
        return reply(node, call, ReplyStatus.OK, result=DONE)

    behaviours = {n: second_time for n in NAMES}
    async with cluster(certs, behaviours, **_options()) as (client, nodes):
        await client.sadd("s", b"x", requirements={"s": BaseVersion(b"")})
    for node in nodes.values():
        assert len({c.request.command for c in node.received}) == 1


async def test_one_lying_node_cannot_decide(certs: Certs) -> None:
    other = kv_wire.encode_result(VersionResult(version=b"lie"))
    behaviours = {"n1": answering(ReplyStatus.OK, other), "n2": answering(ReplyStatus.OK, DONE),
                  "n3": silent, "n4": answering(ReplyStatus.OK, DONE)}
    async with cluster(certs, behaviours, **_options()) as (client, _):
        await client.mul("k", 3, requirements=BASE_K)  # decided by n2 and n4's matching Done


async def test_put_without_requirements_reads_the_agreed_version_first(certs: Certs) -> None:
    backend = KvBackend()
    backend.machine.apply(kv_wire.encode_command(Put(key="k", value=b"old")))
    behaviours = {n: _versions_then(ReplyStatus.OK, backend) for n in NAMES}
    async with cluster(certs, behaviours, **_options()) as (client, nodes):
        await client.put("k", b"new")
        assert await client.get("k") == b"new"
        assert await client.get("k", stale=True) == b"new"
    calls = [c for node in nodes.values() for c in node.received]
    reads = [c for c in calls if c.consistency is ReadConsistency.STALE]
    assert {kv_wire.decode_command(c.request.command) for c in reads} >= {GetVersion(key="k")}
    txs = [_tx(c) for c in calls if c.consistency is ReadConsistency.LINEARIZABLE]
    writes = [t for t in txs if not t.read_only]
    assert {t.requirements for t in writes} == {(Requirement(key="k",
                                                             version=version_of(b"old")),)}
    gets = [t for t in txs if t.read_only]
    assert {t.requirements for t in gets} == {(Requirement(key="k",
                                                           version=version_of(b"new")),)}
    # the stale read asked one node only
    stale_gets = [c for c in reads if kv_wire.decode_command(c.request.command) != GetVersion(
        key="k")]
    assert len(stale_gets) == 1


async def test_an_aborted_put_is_retried_only_when_asked(certs: Certs) -> None:
    backend = KvBackend()
    aborts = {"left": 1}

    def flaky() -> object:
        inner = _versions_then(ReplyStatus.OK, backend)

        async def behaviour(node: FakeNode, call: ClientCall) -> Action:
            if call.consistency is ReadConsistency.LINEARIZABLE and aborts["left"] > 0:
                return reply(node, call, ReplyStatus.ABORTED, message="stale version")
            return await inner(node, call)  # type: ignore[operator, no-any-return]
        return behaviour

    behaviours = {n: flaky() for n in NAMES}
    async with cluster(certs, behaviours, **_options()) as (client, nodes):
        with pytest.raises(TransactionAborted, match="stale version"):
            await client.put("k", b"v")
        first = {c.request.request_no for n in nodes.values() for c in n.received}

        async def heal() -> None:
            await trio.sleep(0.05)
            aborts["left"] = 0

        aborts["left"] = 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(heal)
            await client.put("k", b"v", retry_aborted=True)
    txs = {_tx(c).request_no for n in nodes.values() for c in n.received
           if c.consistency is ReadConsistency.LINEARIZABLE}
    assert len(txs - first) >= 2  # a fresh transaction after the abort
    assert backend.machine.query(kv_wire.encode_command(GetVersion(key="k"))) == \
        kv_wire.encode_result(VersionResult(version=version_of(b"v")))


async def test_f_plus_one_first_when_asked(certs: Certs) -> None:
    behaviours = {n: answering(ReplyStatus.OK, DONE) for n in NAMES}
    async with cluster(certs, behaviours, **_options(endorse_all=False,
                                                        attempt_timeout=5.0)) as (client, nodes):
        await client.add("k", 2, requirements=BASE_K)
    assert sum(len(n.received) for n in nodes.values()) == 2  # f+1 = 2 of 4


async def test_requirements_are_refused_by_a_raft_client(certs: Certs) -> None:
    behaviours = {n: silent for n in NAMES}
    async with cluster(certs, behaviours, protocol="raft") as (client, _):
        with pytest.raises(ValueError, match="sign transactions"):
            await client.add("k", 1, requirements={"k": b""})


async def test_no_signer_is_a_clear_error(certs: Certs) -> None:
    behaviours = {n: silent for n in NAMES}
    async with cluster(certs, behaviours, **_options(signer=None)) as (client, _):
        with pytest.raises(ValueError, match="signing key"):
            await client.add("k", 1, requirements=BASE_K)


def _reply(node: str, status: ReplyStatus, result: bytes = b"") -> ClientReply:
    return ClientReply(client_id="c", request_no=1, status=status, replica=node, result=result)


def test_matching_replies_counts_distinct_nodes_latest_answer() -> None:
    replies = MatchingReplies(faults=1)
    assert replies.add("n1", _reply("n1", ReplyStatus.OK, b"a")) is None
    assert replies.add("n1", _reply("n1", ReplyStatus.OK, b"a")) is None  # one node, once
    assert replies.add("n2", _reply("n2", ReplyStatus.OK, b"b")) is None
    assert replies.add("n3", _reply("n3", ReplyStatus.RETRY)) is None
    assert replies.add("n1", _reply("n1", ReplyStatus.OK, b"b")) is not None  # n1 now says b
    aborts = MatchingReplies(faults=1)
    aborts.add("n1", ClientReply(client_id="c", request_no=1, status=ReplyStatus.ABORTED,
                                 replica="n1", message="x"))
    decision = aborts.add("n2", ClientReply(client_id="c", request_no=1,
                                            status=ReplyStatus.ABORTED, replica="n2",
                                            message="y"))
    assert decision is not None
    assert decision.status is ReplyStatus.ABORTED  # reasons may differ
    assert decision.nodes == ("n1", "n2")


def _tx_mode_node(backend: KvBackend, done: dict[bytes, bytes], *, refuse_base: bool
                  ) -> object:
    """A node over `backend` in transaction mode: STALE reads from it; a transaction on a
    base requirement is ABORTED when `refuse_base` (as a switch of the run is), else applied
    (`apply_tx`, once per transaction: `done` is shared by the nodes)."""

    async def behaviour(node: FakeNode, call: ClientCall) -> Action:
        if call.consistency is ReadConsistency.STALE:
            return reply(node, call, ReplyStatus.OK,
                         result=backend.machine.query(call.request.command))
        tx = _tx(call)
        if refuse_base and any(r.base for r in tx.requirements):
            return reply(node, call, ReplyStatus.ABORTED, message="switches the run")
        tx_id = bytes([tx.request_no]) * 32  # one transaction, applied once (the table)
        if tx_id not in done:
            done[tx_id] = backend.machine.apply_tx(tx_id, tx.command)
        return reply(node, call, ReplyStatus.OK, result=done[tx_id])
    return behaviour


async def test_an_update_without_requirements_requires_the_agreed_base_version(
        certs: Certs) -> None:
    backend = KvBackend()
    backend.machine.apply_tx(b"p" * 32, kv_wire.encode_command(Put(key="k", value=b"5")))
    base = backend.machine.base_versions(["k"])[0]
    assert base
    assert base == backend.machine.versions(["k"])[0]
    done: dict[bytes, bytes] = {}
    behaviours = {n: _tx_mode_node(backend, done, refuse_base=False) for n in NAMES}
    async with cluster(certs, behaviours, **_options()) as (client, nodes):
        await client.add("k", 2)
    calls = [c for node in nodes.values() for c in node.received]
    reads = {kv_wire.decode_command(c.request.command) for c in calls
             if c.consistency is ReadConsistency.STALE}
    assert reads == {GetBaseVersion(key="k")}
    writes = {_tx(c).requirements for c in calls
              if c.consistency is ReadConsistency.LINEARIZABLE}
    assert writes == {(Requirement(key="k", version=base, base=True),)}
    assert backend.machine.get("k") == b"7"
    assert backend.machine.base_versions(["k"])[0] == base  # a commuting update


async def test_an_aborted_update_retries_on_the_full_version_when_asked(certs: Certs) -> None:
    backend = KvBackend()
    backend.machine.apply_tx(b"a" * 32, kv_wire.encode_command(SAdd(key="s", member=b"m")))
    full = backend.machine.versions(["s"])[0]
    done: dict[bytes, bytes] = {}
    behaviours = {n: _tx_mode_node(backend, done, refuse_base=True) for n in NAMES}
    async with cluster(certs, behaviours, **_options()) as (client, nodes):
        with pytest.raises(TransactionAborted, match="switches the run"):
            await client.srem("s", b"m")
        await client.srem("s", b"m", retry_aborted=True)
    txs = [_tx(c) for node in nodes.values() for c in node.received
           if c.consistency is ReadConsistency.LINEARIZABLE]
    assert {t.requirements for t in txs} == {
        (Requirement(key="s", version=b"", base=True),),
        (Requirement(key="s", version=full),)}
    assert backend.machine.get("s") == kv_ops.EMPTY_SET
    assert backend.machine.base_versions(["s"])[0] != b""  # the srem moved the base
