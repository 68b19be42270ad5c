"""The block-certifier service on real in-process chain clusters (trio, mTLS, loopback).

PBFT n=4 (`cluster init --app chain` enables the service): every node stores a certificate
of 3 valid signatures for every block; a Byzantine replica whose signatures are forged on
the wire is dropped and counted at its peers (the blocks are certified without it); the
light client talking to ONE replica trusts a header by its certificate, and refuses a
tampered one (control: a check that trusted any attached certificate would accept it);
a restarted node keeps its stored certificates. Raft n=3: majority certificates."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
import trio
from runtime_helpers import wait_for

from phalanx.apps.chain.block import chain_id, decode_header
from phalanx.apps.chain.certificate import BlockCertificate, BlockSignature, verify_certificate
from phalanx.apps.chain.tx import public_key
from phalanx.appspec.chain_app import account_key, key_path, read_genesis
from phalanx.client import chain_light
from phalanx.client.async_client import open_client
from phalanx.client.chain import ChainClient
from phalanx.consensus.types import Message, NodeId
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig, NodeConfig, load_node_config
from phalanx.runtime.node import Node, open_node
from phalanx.services.block_cert_api import CertificateAnswer, CertificateQuery
from phalanx.services.block_certifier import BlockCertifierService

SERVICE = "block-certifier"


class Nodes:
    def __init__(self, cluster: ClusterConfig, nursery: trio.Nursery) -> None:
        self.cluster = cluster
        self.configs: dict[str, NodeConfig] = {
            n.id: load_node_config(cluster.node_config_path(n.id)) for n in cluster.nodes}
        self.nursery = nursery
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.stopped: dict[str, trio.Event] = {}

    async def start(self, node_id: str) -> None:
        stopped = self.stopped[node_id] = trio.Event()

        async def run(task_status: trio.TaskStatus[Node]) -> None:
            try:
                with trio.CancelScope() as scope:
                    self.scopes[node_id] = scope
                    async with open_node(self.configs[node_id],
                                         rng=random.Random(node_id)) as node:
                        task_status.started(node)
                        await trio.sleep_forever()
            finally:
                stopped.set()

        self.nodes[node_id] = await self.nursery.start(run)

    async def stop(self, node_id: str) -> None:
        self.scopes.pop(node_id).cancel()
        del self.nodes[node_id]
        await self.stopped[node_id].wait()

    def certifier(self, node_id: str) -> BlockCertifierService:
        return cast(BlockCertifierService, self.nodes[node_id].services[SERVICE])


@contextlib.asynccontextmanager
async def running(cluster: ClusterConfig) -> AsyncIterator[Nodes]:
    async with trio.open_nursery() as nursery:
        nodes = Nodes(cluster, nursery)
        for n in cluster.nodes:
            await nodes.start(n.id)
        try:
            yield nodes
        finally:
            nursery.cancel_scope.cancel()


async def transfers(cluster: ClusterConfig, count: int) -> int:
    """`count` signed transfers a1 -> a2; the height of the last one's block."""
    genesis = read_genesis(cluster.app_files["genesis"])
    key = account_key(key_path(cluster.directory, "a1"))
    to = public_key(account_key(key_path(cluster.directory, "a2")))
    height = 0
    async with open_client(cluster, timeout=10) as client:
        chain = ChainClient(client, chain_id(genesis))
        for _ in range(count):
            height = (await chain.transfer(key, to, 5)).height
    return height


def certified_everywhere(c: Nodes, heights: range) -> bool:
    return all(c.certifier(n).store.get(h) is not None for n in c.nodes for h in heights)


@pytest.fixture
def pbft(tmp_path: Path) -> ClusterConfig:
    return init_cluster(tmp_path / "c", protocol="pbft", nodes=4, app="chain",
                        base_port=find_free_base_port(4))


def forge_on_the_wire(service: BlockCertifierService) -> None:
    """Make `service`'s node a Byzantine signer: every signature it sends is garbage."""
    send = service._send

    def forged(peer: NodeId, message: Message) -> bool:
        assert isinstance(message, BlockSignature)
        return send(peer, dataclasses.replace(message, signature=bytes(64)))

    service._send = forged


def assert_block_stamps(machine: object, top: int) -> None:
    """Blocks on a real cluster carry the consensus block stamp: the proposer's wall clock
    (within a minute of this test's) and a member as proposer, time never going back."""
    now = time.time() * 1000
    stamps = [decode_header(machine.block(h).header)  # type: ignore[attr-defined]
              for h in range(1, top + 1)]
    assert all(abs(h.timestamp - now) < 60_000 for h in stamps), stamps
    assert all(h.proposer in ("n1", "n2", "n3", "n4") for h in stamps), stamps
    assert [h.timestamp for h in stamps] == sorted(h.timestamp for h in stamps)


async def test_pbft_certificates_byzantine_signer_light_client_and_restart(
        pbft: ClusterConfig) -> None:
    genesis = read_genesis(pbft.app_files["genesis"])
    keys = chain_light.cluster_keys(pbft)
    assert keys is not None
    assert sorted(keys) == ["n1", "n2", "n3", "n4"]
    assert chain_light.cluster_quorum(pbft) == 3
    account = public_key(account_key(key_path(pbft.directory, "a2")))
    async with running(pbft) as c:
        forge_on_the_wire(c.certifier("n4"))
        top = await transfers(pbft, 3)
        blocks = range(1, top + 1)
        await wait_for(lambda: certified_everywhere(c, blocks), within=15,
                       what=f"every node stored certificates for blocks 1..{top}")
        for n in c.nodes:
            svc = c.certifier(n)
            machine = c.nodes[n].replica.machine
            for h in blocks:
                cert = svc.store.get(h)
                header = machine.block(h).header  # type: ignore[attr-defined]
                assert cert is not None
                assert verify_certificate(cert, decode_header(header), keys, 3,
                                          chain_id=chain_id(genesis)), (n, h)
                assert "n4" not in dict(cert.signatures) or n == "n4", (n, h)
            assert_block_stamps(machine, top)
            if n != "n4":  # n4's forged signatures were dropped (as forged, or as late when
                # the block was certified before they arrived): one per block at least
                dropped = svc.certifier.dropped
                assert dropped.get("bad_signature", 0) + dropped.get("late", 0) >= top, n
        # a forged signature of a block not certified yet, over the wire: dropped as forged
        n4 = c.certifier("n4")
        ahead = BlockSignature(chain_id=chain_id(genesis), height=top + 1,
                               block_hash=bytes(32), node="n4", signature=bytes(64))
        for peer in ("n1", "n2", "n3"):
            n4._send(NodeId(peer), ahead)  # type: ignore[arg-type]
        await wait_for(lambda: all(c.certifier(n).counters().get("dropped:bad_signature", 0)
                                   >= 1 for n in ("n1", "n2", "n3")),
                       within=5, what="the honest nodes dropped n4's forgery as bad_signature")
        # the light client talks to ONE replica and trusts its header by the certificate
        v = await chain_light.verify_from_replica(pbft, genesis, account, "n2", within=5)
        assert v.ok, v.reason
        assert v.trusted_by.startswith("certificate (3 of 4"), v.trusted_by
        assert v.balance == 1_000_000 + 15
        # a Byzantine replica serving a tampered certificate (one signature flipped) is
        # refused; the control: a check that trusted any attached certificate accepts it
        real = c.certifier("n3").call
        answer = real(CertificateQuery(height=top))
        assert isinstance(answer, CertificateAnswer)
        assert answer.certificate is not None
        (node, sig), *rest = answer.certificate.signatures
        tampered = dataclasses.replace(answer.certificate, signatures=(
            (node, bytes([sig[0] ^ 1]) + sig[1:]), *rest))
        c.certifier("n3").call = (  # type: ignore[method-assign]
            lambda request: dataclasses.replace(answer, certificate=tampered))
        v = await chain_light.verify_from_replica(pbft, genesis, account, "n3", within=5)
        assert not v.ok, v
        assert "does not verify" in v.reason, v
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(chain_light, "certificate_check",
                       lambda header, genesis, cluster: bool(header.consensus_proof))
            v = await chain_light.verify_from_replica(pbft, genesis, account, "n3", within=5)
            assert v.ok, v
            assert v.trusted_by.startswith("certificate"), v
        # restart keeps the stored certificates (and re-applying the log re-signs them)
        stored = {h: c.certifier("n1").store.get(h) for h in blocks}
        await c.stop("n1")
        await c.start("n1")
        assert {h: c.certifier("n1").store.get(h) for h in blocks} == stored
        assert c.certifier("n1").store.torn == 0


async def test_raft_majority_certificates(tmp_path: Path) -> None:
    raft = init_cluster(tmp_path / "r", protocol="raft", nodes=3, app="chain",
                        base_port=find_free_base_port(3))
    genesis = read_genesis(raft.app_files["genesis"])
    keys = chain_light.cluster_keys(raft)
    assert keys is not None
    assert chain_light.cluster_quorum(raft) == 2
    async with running(raft) as c:
        top = await transfers(raft, 2)
        await wait_for(lambda: certified_everywhere(c, range(1, top + 1)), within=15,
                       what="every node stored majority certificates")
        for n in c.nodes:
            assert_block_stamps(c.nodes[n].replica.machine, top)
        cert = c.certifier("n1").store.get(top)
        assert isinstance(cert, BlockCertificate)
        assert len(cert.signatures) >= 2
        account = public_key(account_key(key_path(raft.directory, "a1")))
        v = await chain_light.verify_from_replica(raft, genesis, account, "n3", within=5)
        assert v.ok, v
        assert v.trusted_by.startswith("certificate"), v


def test_cluster_init_app_chain_enables_the_certifier_and_writes_node_keys(
        tmp_path: Path) -> None:
    chain = init_cluster(tmp_path / "ch", protocol="raft", nodes=3, app="chain",
                         base_port=find_free_base_port(3), services=("gossip",),
                         service_options={SERVICE: {"keep": 50}})
    config = load_node_config(chain.node_config_path("n2"))
    assert sorted(config.services) == [SERVICE, "gossip"]
    assert config.services[SERVICE]["keep"] == 50
    assert config.keys is not None  # Raft signs nothing else: the service asked for keys
    assert chain_light.cluster_keys(chain) is not None
    kv = init_cluster(tmp_path / "kv", protocol="raft", nodes=3,
                      base_port=find_free_base_port(3))
    assert load_node_config(kv.node_config_path("n1")).services == {}
    assert chain_light.cluster_keys(kv) is None  # a light client then falls back to f+1


def lose_signatures_to(service: BlockCertifierService, lost: str) -> None:
    """`service`'s block signatures to node `lost` are lost (the rest goes out)."""
    send = service._send

    def lossy(peer: NodeId, message: Message) -> bool:
        return True if peer == lost and isinstance(message, BlockSignature) else send(
            peer, message)

    service._send = lossy


def run_cli(*argv: str) -> int:
    from phalanx.cli.main import main

    return main(list(argv))


async def test_export_validate_certificates_and_a_restarted_node_fetches_missed_ones(
        pbft: ClusterConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`chain export` carries each block's certificate, `chain validate --cluster` checks
    them (a tampered one: INVALID, one line; control: unchecked without --cluster); n4,
    down while blocks were signed, fetches their certificates from peers after it restarts
    and holds verified ones (it could not have collected them: the signatures sent while it
    was down are lost; the control is `fetch:fetched`, which counts what came by fetching)."""
    genesis = read_genesis(pbft.app_files["genesis"])
    keys = chain_light.cluster_keys(pbft)
    assert keys is not None
    monkeypatch.delenv("PHALANX_CLUSTER", raising=False)
    honest = ("n1", "n2", "n3")
    async with running(pbft) as c:
        await c.stop("n4")
        for n in honest:  # the peer links queue messages for a node that is down (up to a
            lose_signatures_to(c.certifier(n), "n4")  # bound): lose them, as a long outage
        top = await transfers(pbft, 3)
        await wait_for(lambda: all(c.certifier(n).store.get(h) is not None for n in honest
                                   for h in range(1, top + 1)),
                       within=15, what=f"n1..n3 certified blocks 1..{top}")
        exported = tmp_path / "chain.bin"
        directory = str(pbft.directory)
        assert await trio.to_thread.run_sync(
            run_cli, "chain", "--cluster", directory, "export", str(exported)) == 0
        assert f"({top} with a certificate)" in capsys.readouterr().out
        assert run_cli("chain", "--cluster", directory, "validate", str(exported)) == 0
        out = capsys.readouterr().out
        assert f"{top} of {top} blocks certified (quorum 3 of 4 node keys" in out, out

        # a tampered certificate (one signature bit) fails validation with one line
        from phalanx.apps.chain.block import encode_header
        from phalanx.apps.chain.certificate import attach, certificate_of
        from phalanx.client.chain_export import read_export, write_export

        _, blocks = read_export(exported)
        header = decode_header(blocks[1].header)
        cert = certificate_of(header)
        assert cert is not None
        (node, sig), *rest = cert.signatures
        bad = dataclasses.replace(cert, signatures=((node, bytes([sig[0] ^ 1]) + sig[1:]),
                                                    *rest))
        blocks[1] = dataclasses.replace(blocks[1], header=encode_header(
            attach(dataclasses.replace(header, consensus_proof=b""), bad)))
        tampered = tmp_path / "tampered.bin"
        write_export(tampered, genesis, blocks)
        assert run_cli("chain", "--cluster", directory, "validate", str(tampered)) == 1
        err = capsys.readouterr().err
        assert err.strip() == "INVALID: block 2: consensus_proof: the consensus proof does " \
                              "not verify", err
        assert run_cli("chain", "validate", str(tampered)) == 0  # control: unchecked
        assert f"{top} blocks carry a certificate, not checked" in capsys.readouterr().out

        # n4 missed blocks 1..top: after its restart it fetches their certificates
        await c.start("n4")
        top = await transfers(pbft, 1)  # traffic for n4 to catch up on
        n4 = c.nodes["n4"].replica.machine
        await wait_for(lambda: n4.height >= top, within=20,  # type: ignore[attr-defined]
                       what="n4 caught up")
        svc = c.certifier("n4")
        await wait_for(lambda: all(svc.store.get(h) is not None for h in range(1, top + 1)),
                       within=15, what=f"n4 holds certificates of blocks 1..{top}")
        for h in range(1, top + 1):
            stored = svc.store.get(h)
            header = decode_header(n4.block(h).header)  # type: ignore[attr-defined]
            assert verify_certificate(stored, header, keys, 3, chain_id=chain_id(genesis)), h
        assert svc.counters().get("fetch:fetched", 0) >= top - 1, svc.counters()
