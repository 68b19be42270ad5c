"""Forged inbox writes submitted straight to a real PBFT cluster are refused at apply.

Cluster B (PBFT 4, `--service clustersend`) is linked with cluster A (Raft 3; A's nodes are
not even started: B knows A's public material from its link files). A client of B submits,
through B's own consensus, what a Byzantine member or primary could order: a plain put under
``cs/in/``, a `CsDeliver` whose certificate carries made-up signatures, and one properly
signed by A's real members but over another value. Every replica refuses each at apply (the
client gets the typed error from f+1 matching replies), nothing lands in any replica's inbox,
and each replica counts the refusals. A certified value then applies once everywhere.
Deliberate-bug control: with `APPLY_UNCHECKED` installed in every replica, the forged
delivery lands and `forged_in`, the detector this test relies on, reports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from linked_clusters import LinkedNodes, running, two_linked_clusters
from runtime_helpers import wait_for

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import (
    CsDeliver,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Put,
    TxnResult,
)
from phalanx.apps.kv_wire import decode_result, encode_command
from phalanx.client.async_client import open_client
from phalanx.clustersend import Certificate, MemberSignature, SendStatement, certify, value_digest
from phalanx.net import wire
from phalanx.net.crypto import Ed25519Crypto
from phalanx.net.intercluster import qualify
from phalanx.ops.node_config import ClusterConfig, load_node_config
from phalanx.ops.signing_keys import read_seed
from phalanx.services.clustersend_apply import APPLY_UNCHECKED, ApplyCheck
from phalanx.services.clustersend_node import ClusterSendService

GUARD = 40.0


class Cluster(LinkedNodes):
    def cs(self, node: str) -> ClusterSendService:
        return cast(ClusterSendService, self.service("b", node, "clustersend"))

    def state(self, node: str) -> KvStateMachine:
        machine = self.cs(node).mailbox.state
        assert isinstance(machine, KvStateMachine)
        return machine


def signers_of(cluster: ClusterConfig, cluster_id: str) -> list[Ed25519Crypto]:
    """Cluster A's members as signers, with their real signing keys."""
    out = []
    for node in cluster.nodes:
        config = load_node_config(cluster.node_config_path(node.id))
        assert config.keys is not None
        key = Ed25519PrivateKey.from_private_bytes(read_seed(config.keys.signing_key))
        out.append(Ed25519Crypto(qualify(node.id, cluster_id), private_key=key,
                                 public_keys={}, mac_keys={}))
    return out


def forged_in(c: Cluster, src: str, certified: dict[int, bytes]) -> dict[str, bytes]:
    """Inbox entries of `src` at any replica of B that A never certified (must be empty)."""
    found = {}
    for i in range(1, 5):
        state = c.state(f"n{i}")
        for seq in range(4):
            value = state.get(f"cs/in/{src}/{seq:010d}")
            if value is not None and certified.get(seq) != value:
                found[f"n{i}:{seq}"] = value
    return found


async def test_forged_inbox_writes_are_refused_at_apply_by_every_replica(tmp_path: Path
                                                                         ) -> None:
    raft, pbft, ida, idb = two_linked_clusters(tmp_path, ("raft", 3), ("pbft", 4),
                                               services=("clustersend",))
    signers = signers_of(raft, ida)
    with trio.fail_after(GUARD):
        async with running(Cluster, ("b", pbft)) as c, \
                open_client(pbft, timeout=15) as client:
            raft_info = c.cs("n1").linked[ida]

            async def submit(command: KvCommand) -> KvResult:
                return decode_result(await client.call(encode_command(command)))

            def statement(seq: int, value: bytes) -> SendStatement:
                return SendStatement(src_cluster=ida, dst_cluster=idb, epoch=0, seq=seq,
                                     digest=value_digest(value))

            def certified(seq: int, value: bytes) -> bytes:
                return wire.encode(certify(raft_info, statement(seq, value), signers,
                                           leader=signers[0]))

            made_up = Certificate(kind=raft_info.kind, statement=statement(0, b"forged"),
                                  signatures=tuple(MemberSignature(signer=m, sig=b"x" * 64)
                                                   for m in raft_info.members[:2]),
                                  term=0, leader=raft_info.members[0],
                                  leader_sig=signers[0].sign(statement(0, b"forged")))
            forgeries = [
                (Put(key=f"cs/in/{ida}/{0:010d}", value=b"forged"), "reserved_key"),
                (CsDeliver(src_cluster=ida, seq=0, value=b"forged",
                           certificate=wire.encode(made_up)), "bad_leader_signature"),
                (CsDeliver(src_cluster=ida, seq=0, value=b"forged",
                           certificate=certified(0, b"agreed")), "digest_mismatch"),
            ]
            for command, reason in forgeries:
                result = await submit(command)
                assert isinstance(result, KvError), (command, result)
                assert reason in result.message or result.code is KvErrorCode.RESERVED_KEY
            expected = {"apply_refused:reserved_key": 1,
                        "apply_refused:uncertified:bad_leader_signature": 1,
                        "apply_refused:uncertified:digest_mismatch": 1}

            def refusals(node: str) -> dict[str, int]:
                return {k: v for k, v in c.cs(node).counters().items()
                        if k.startswith("apply_refused")}

            await wait_for(lambda: all(refusals(f"n{i}") == expected for i in range(1, 5)),
                           within=GUARD, what="every replica refused and counted each")
            assert forged_in(c, ida, {}) == {}
            # A value A's members did certify applies, once, everywhere.
            good = CsDeliver(src_cluster=ida, seq=0, value=b"agreed",
                             certificate=certified(0, b"agreed"))
            assert await submit(good) == TxnResult(succeeded=True, observed=(None,))
            assert await submit(good) == TxnResult(succeeded=False, observed=(b"agreed",))
            await wait_for(lambda: all(c.state(f"n{i}").get(f"cs/in/{ida}/{0:010d}")
                                       == b"agreed" for i in range(1, 5)), within=GUARD)
            assert forged_in(c, ida, {0: b"agreed"}) == {}

            # Deliberate-bug control: the check disabled in every replica lets a forged
            # delivery land, and the detector above sees it.
            for i in range(1, 5):
                state = c.state(f"n{i}")
                assert isinstance(state.delivery_check, ApplyCheck)
                state.install_delivery_check(state.delivery_check.with_bugs(
                    frozenset({APPLY_UNCHECKED})))
            landed = await submit(CsDeliver(src_cluster=ida, seq=1, value=b"forged",
                                            certificate=wire.encode(made_up)))
            assert landed == TxnResult(succeeded=True, observed=(None,))
            await wait_for(lambda: len(forged_in(c, ida, {0: b"agreed"})) == 4, within=GUARD)
            assert set(forged_in(c, ida, {0: b"agreed"}).values()) == {b"forged"}
