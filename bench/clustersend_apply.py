"""What the apply-time cluster-sending checks cost one replica (`phalanx.apps.kv_inbox`).

Prints microseconds per applied command on one `KvStateMachine` with the `ApplyCheck` the
clustersend service installs (Ed25519 via libsodium): a certified `CsDeliver` (Byzantine
certificate of a PBFT 4 cluster: 3 signatures; crash certificate of a Raft 3 cluster: 2
signatures plus the leader's), a duplicate copy (what the n-1 other members' submissions
cost), a forged one refused (bad signature), a `CsCompact` with f+1 = 2 acknowledgements,
a `CsPrune` of 32 entries, and a plain `Put` (the KV fast path, which now also tests the
``cs/`` prefix) against a `Put` under ``cs/out/`` (the guarded slow path).

Usage: `python bench/clustersend_apply.py [--n 2000]` (a few seconds).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import CsCompact, CsDeliver, CsPrune, KvCommand, Put
from phalanx.apps.kv_wire import encode_command
from phalanx.clustersend import (
    AckProof,
    AckStatement,
    ClusterInfo,
    SendStatement,
    certify,
    value_digest,
)
from phalanx.clustersend.certificates import sign_as
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.crypto import Ed25519Crypto
from phalanx.protocols.spec import FaultModel
from phalanx.services.clustersend_apply import ApplyCheck
from phalanx.services.clustersend_node import CLUSTERSEND_SERVICE_MESSAGES
from phalanx.services.linked_keys import cluster_info

A, R, B = "clusterA", "clusterR", "clusterB"
PBFT = cluster_info(A, ("n1", "n2", "n3", "n4"), FaultModel.BYZANTINE)
RAFT = cluster_info(R, ("n1", "n2", "n3"), FaultModel.CRASH)
DST = cluster_info(B, ("n1", "n2", "n3", "n4"), FaultModel.BYZANTINE)
KEYS = {m: Ed25519PrivateKey.generate() for c in (PBFT, RAFT, DST) for m in c.members}


def crypto(me: NodeId) -> Ed25519Crypto:
    return Ed25519Crypto(me, private_key=KEYS[me], public_keys={
        m: k.public_key() for m, k in KEYS.items()}, mac_keys={})


def machine(own: str, linked: tuple[ClusterInfo, ...]) -> KvStateMachine:
    m = KvStateMachine()
    m.install_delivery_check(ApplyCheck(own=own, linked={c.cluster_id: c for c in linked},
                                        verifier=crypto(NodeId(f"n1@{own}"))))
    return m


def delivery(info: ClusterInfo, seq: int, value: bytes, *, forge: bool = False) -> bytes:
    st = SendStatement(src_cluster=info.cluster_id, dst_cluster=B, epoch=0, seq=seq,
                       digest=value_digest(value))
    signers = [crypto(m) for m in info.members]
    cert = certify(info, st, signers, leader=signers[0])
    if forge:
        bad = tuple(type(s)(signer=s.signer, sig=bytes(64)) for s in cert.signatures)
        cert = type(cert)(kind=cert.kind, statement=st, signatures=bad, term=cert.term,
                          leader=cert.leader, leader_sig=cert.leader_sig)
    return encode_command(CsDeliver(src_cluster=info.cluster_id, seq=seq, value=value,
                                    certificate=wire.encode(cert)))


def timed(label: str, commands: list[bytes], apply: Callable[[bytes], bytes]) -> None:
    start = time.perf_counter()
    for c in commands:
        apply(c)
    us = (time.perf_counter() - start) / len(commands) * 1e6
    print(f"  {label:<52} {us:9.1f} us/apply  ({len(commands)} applies)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="commands per row")
    n = parser.parse_args().n
    wire.register_all(CLUSTERSEND_SERVICE_MESSAGES)
    print(f"== apply-time cluster-sending checks, one replica, {n} commands a row")
    signer = crypto(PBFT.members[0])
    st = SendStatement(src_cluster=A, dst_cluster=B, epoch=0, seq=0, digest=bytes(32))
    sig = signer.sign(st)
    start = time.perf_counter()
    for _ in range(n):
        signer.verify(PBFT.members[0], st, sig)
    print(f"  {'(one Ed25519 verification, for scale)':<52} "
          f"{(time.perf_counter() - start) / n * 1e6:9.1f} us")
    for info, name in ((PBFT, "Byzantine cert, PBFT 4 (3 sigs)"),
                       (RAFT, "crash cert, Raft 3 (2 sigs + leader)")):
        m = machine(B, (info,))
        value = b"x" * 64
        cmds = [delivery(info, seq, value) for seq in range(n)]
        timed(f"CsDeliver certified, {name}", cmds, m.apply)
        timed(f"CsDeliver duplicate copy, {name}", cmds, m.apply)
        forged = [delivery(info, n + seq, value, forge=True) for seq in range(n)]
        timed(f"CsDeliver forged, refused, {name}", forged, m.apply)
    prune = machine(B, (PBFT,))
    for c in [delivery(PBFT, seq, b"v") for seq in range(32 * (n // 32))]:
        prune.apply(c)
    timed("CsPrune of 32 delivered entries",
          [encode_command(CsPrune(src_cluster=A, below=32 * (k + 1))) for k in range(n // 32)],
          prune.apply)
    sender = machine(A, (DST,))
    compacts = []
    for seq in range(n):
        sender.apply(encode_command(Put(key=f"cs/out/{B}/{seq:010d}", value=b"v")))
        st = AckStatement(src_cluster=A, dst_cluster=B, dst_epoch=0, seq=seq,
                          digest=value_digest(b"v"))
        proof = AckProof(statement=st, signatures=tuple(sign_as(crypto(m), st)
                                                        for m in DST.members[:2]))
        compacts.append(encode_command(CsCompact(dst_cluster=B, seq=seq,
                                                 proof=wire.encode(proof))))
    timed("CsCompact with f+1 = 2 acknowledgements", compacts, sender.apply)
    kv = KvStateMachine()
    puts: list[KvCommand] = [Put(key=f"user/{i:08d}", value=b"v" * 32) for i in range(n * 20)]
    timed("Put (fast path)", [encode_command(p) for p in puts], kv.apply)
    outs: list[KvCommand] = [Put(key=f"cs/out/{B}/{i:010d}", value=b"v" * 32)
                             for i in range(n * 20)]
    timed("Put under cs/out/ (guarded path)", [encode_command(p) for p in outs], kv.apply)


if __name__ == "__main__":
    main()
