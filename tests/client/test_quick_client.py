"""The blocking one-shot client of `phalanx kv` / `phalanx call` (`phalanx.client.quick`)
against fake nodes (real loopback TLS): leader redirects, f+1 matching replies under PBFT
(a liar outvoted, refusals, too few), refused connections at once, a node presenting another
node's certificate; and its duplicated TLS settings and certificate names agree with
`phalanx.ops.pki`. No test asserts on elapsed time (`trio.fail_after` guards hangs)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio
from client_fakes import (
    GUARD,
    HOST,
    Action,
    Behaviour,
    Certs,
    FakeNode,
    KvBackend,
    Silent,
    make_certs,
    redirect_to,
    reply,
    serve_kv,
    start_nodes,
)

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Done, Get, Put
from phalanx.client import quick
from phalanx.client.errors import (
    ClientTimeout,
    ClusterUnreachable,
    Forbidden,
    RequestRejected,
)
from phalanx.net.client_protocol import ClientCall, ReplyStatus
from phalanx.ops import pki
from phalanx.ops.node_config import Address, ClusterConfig, PeerConfig

NAMES = ("n1", "n2", "n3", "n4")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"), NAMES)


def config(certs: Certs, ports: Mapping[str, int], protocol: str) -> ClusterConfig:
    nodes = tuple(PeerConfig(id=n, peer_addr=Address(host=HOST, port=1),
                             client_addr=Address(host=HOST, port=p)) for n, p in ports.items())
    return ClusterConfig(protocol=protocol, nodes=nodes, ca=certs.ca,
                         client_cert=certs.client.certificate,
                         client_key=certs.client.private_key, directory=certs.ca.parent)


async def call_fakes(certs: Certs, behaviours: Mapping[str, Behaviour], protocol: str,
                     command: bytes, *, limit: float = 3.0, read_only: bool = False,
                     cert_of: dict[str, str] | None = None) -> tuple[bytes, dict[str, FakeNode]]:
    outcome: list[bytes | Exception] = []
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nodes = await start_nodes(nursery, certs, behaviours, KvBackend(), cert_of=cert_of)
            cluster = config(certs, {n: node.port for n, node in nodes.items()}, protocol)

            def call() -> bytes | Exception:
                try:
                    return quick.quick_call(cluster, command, read_only=read_only,
                                            timeout=limit)
                except Exception as e:  # raised below, outside the nursery
                    return e

            outcome.append(await trio.to_thread.run_sync(call))
            nursery.cancel_scope.cancel()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0], nodes


PUT = kv_wire.encode_command(Put(key="k", value=b"v"))


async def test_raft_follows_the_leader_hint_with_the_same_request(certs: Certs) -> None:
    behaviours = {"n1": redirect_to("n3"), "n2": redirect_to("n3"), "n3": serve_kv}
    result, nodes = await call_fakes(certs, behaviours, "raft", PUT)
    assert kv_wire.decode_result(result) == Done()
    assert nodes["n1"].request_ids() == nodes["n3"].request_ids()  # the same ids, once each
    assert nodes["n2"].received == []


async def test_pbft_needs_f_plus_one_matching_and_outvotes_a_liar(certs: Certs) -> None:
    async def liar(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.OK, result=b"\x00forged", replica="n1")

    async def silent(node: FakeNode, call: ClientCall) -> Action:
        return Silent()

    async def fixed(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.OK, result=b"honest")

    result, nodes = await call_fakes(certs, {"n1": fixed, "n2": liar, "n3": fixed,
                                             "n4": silent}, "pbft", b"cmd")
    assert result == b"honest"
    assert all(node.hellos for node in nodes.values())  # subscribed before the call
    with pytest.raises(ClientTimeout):  # one honest answer is not f+1
        await call_fakes(certs, {"n1": fixed, "n2": liar, "n3": silent, "n4": silent},
                         "pbft", b"cmd", limit=0.5)


async def test_refusals_and_forbidden_are_definite(certs: Certs) -> None:
    async def refuse(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.ERROR, message="malformed")

    async def forbid(node: FakeNode, call: ClientCall) -> Action:
        return reply(node, call, ReplyStatus.FORBIDDEN, message="needs read-write")

    with pytest.raises(RequestRejected, match="malformed"):
        await call_fakes(certs, {n: refuse for n in NAMES}, "pbft", b"cmd")
    with pytest.raises(Forbidden, match="read-write"):
        await call_fakes(certs, {"n1": forbid, "n2": forbid, "n3": forbid}, "raft", b"cmd")


async def test_a_node_presenting_another_nodes_certificate_is_not_believed(
        certs: Certs) -> None:
    behaviours = {"n1": serve_kv, "n2": serve_kv, "n3": serve_kv}
    # n1 presents n3's certificate: its answer is never read; n2 serves.
    result, nodes = await call_fakes(certs, behaviours, "raft", PUT, cert_of={"n1": "n3"})
    assert nodes["n1"].received == []
    assert len(nodes["n2"].received) == 1
    assert kv_wire.decode_result(result) == Done()


def _closed_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind((HOST, 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.parametrize("protocol", ["raft", "pbft"])
def test_every_node_refusing_is_unreachable_at_once(certs: Certs, protocol: str) -> None:
    cluster = config(certs, dict(zip(NAMES, _closed_ports(4), strict=True)), protocol)
    with pytest.raises(ClusterUnreachable, match="connection refused by every node: n1"):
        quick.quick_call(cluster, kv_wire.encode_command(Get(key="k")), read_only=True,
                         timeout=30.0)


def test_tls_settings_and_certificate_names_match_the_pki(certs: Certs, tmp_path: Path) -> None:
    assert (quick.NODE_URN_PREFIX, quick.CLIENT_URN_PREFIX) == (pki.NODE_URN_PREFIX,
                                                                 pki.CLIENT_URN_PREFIX)
    ours = quick.tls_context(config(certs, {"n1": 1}, "raft"))
    theirs = certs.client_context()
    for attribute in ("minimum_version", "maximum_version", "verify_flags", "verify_mode",
                      "check_hostname", "options"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    identity = pki.identity_from_certificate(certs.client.certificate)
    assert identity is not None
    assert quick.client_identity(certs.client.certificate) == identity.name == "tester"
    assert quick.client_identity(certs.nodes["n1"].certificate) is None  # a node's
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ValueError, match="not a PEM certificate"):
        quick.client_identity(junk)


async def test_a_garbled_answer_is_input_not_a_crash(certs: Certs) -> None:
    async def garbled(node: FakeNode, call: ClientCall) -> Action:
        return b"\x93\xff\xff"  # a frame, not a message

    behaviours = {"n1": garbled, "n2": serve_kv, "n3": serve_kv}
    result, nodes = await call_fakes(certs, behaviours, "raft", PUT)
    assert kv_wire.decode_result(result) == Done()
    assert len(nodes["n2"].received) == 1
