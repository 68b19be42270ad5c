"""End to end without a network: four replicas execute the same batches, exchange block
signatures through their `BlockCertifier`s (one Byzantine replica signs forks and forges),
attach the certificates, and a verifier validates the exported chain and a balance.

This is the flow the replica wiring follows: `end_batch` -> `local_block` -> broadcast the
signature -> `add` each peer's -> keep the certificate returned -> serve it with the block.
"""

from __future__ import annotations

import dataclasses

from chain_helpers import (
    ACCOUNTS,
    CHAIN_ID,
    NODE_KEYS,
    NODE_SECRETS,
    NODES,
    QUORUM,
    genesis,
    transfer,
)

from phalanx.apps.chain.block import block_hash, decode_header
from phalanx.apps.chain.certificate import (
    BlockCertificate,
    BlockCertifier,
    BlockSignature,
    attach,
    ed25519_signer,
    sign_block,
)
from phalanx.apps.chain.light import trust_by_certificate, verify_balance
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.types import AccountProof, GetAccountProof, decode_result, encode
from phalanx.apps.chain.validate import ChainValid, decode_blocks, validate_chain
from phalanx.apps.interface import BatchInfo

BYZANTINE = "n3"
BATCHES = [[transfer(1, 1, 4, 100)], [transfer(2, 1, 4, 50), transfer(4, 1, 5, 20)], []]


def test_replicas_certify_every_block_and_a_verifier_accepts_the_export() -> None:
    machines = {n: ChainStateMachine(genesis()) for n in NODES}
    certifiers = {n: BlockCertifier(node=n, sign=ed25519_signer(NODE_SECRETS[n]),
                                    chain_id=CHAIN_ID, node_keys=NODE_KEYS, quorum=QUORUM)
                  for n in NODES}
    certificates: dict[str, dict[int, BlockCertificate]] = {n: {} for n in NODES}
    for index, batch in enumerate(BATCHES, start=1):
        outbox: list[BlockSignature] = []
        for node, m in machines.items():
            m.begin_batch(BatchInfo(index=index, timestamp=index, proposer="n0"))
            for raw in batch:
                m.apply(raw)
            m.end_batch()
            signature, cert = certifiers[node].local_block(m.height, m.head_hash)
            assert cert is None  # nobody else has signed yet
            if node == BYZANTINE:  # signs a fork instead, and forges the others' signatures
                fake = bytes(32)
                signature = sign_block(node=node, chain_id=CHAIN_ID, height=m.height,
                                       block_hash=fake, sign=NODE_SECRETS[node].sign)
                outbox[:0] = [dataclasses.replace(signature, node=n) for n in NODES[:2]]
                outbox.insert(0, signature)  # the liar's messages arrive first
            else:
                outbox.append(signature)
        for node in NODES:
            for sig in outbox:
                cert = certifiers[node].add(sig)
                if cert is not None:
                    certificates[node][cert.height] = cert
    honest = machines["n0"]
    for node in NODES:
        assert sorted(certificates[node]) == [1, 2, 3]
        assert all(c.block_hash == _header_hash(honest, h)
                   for h, c in certificates[node].items())
    # per block: the 2 forgeries, and n0's own signature echoed back
    assert certifiers["n0"].dropped == {"bad_signature": 6, "duplicate": 3}
    # a verifier holding only the genesis and the node keys validates any node's export
    blocks = decode_blocks([b for h in range(1, 4) if (b := honest.block(h)) is not None])
    assert isinstance(blocks, list)
    exported = [(attach(header, certificates[BYZANTINE][header.height]), txs)
                for header, txs in blocks]
    assert validate_chain(genesis(), exported, node_keys=NODE_KEYS, quorum=QUORUM) == (
        ChainValid(height=3, head_hash=honest.head_hash, state_root=honest.state_root,
                   certified=3))
    # and a light client checks a balance against the certified head
    reply = decode_result(honest.query(encode(GetAccountProof(account=ACCOUNTS[4]))))
    assert isinstance(reply, AccountProof)
    assert verify_balance(header=exported[-1][0], account=ACCOUNTS[4], balance=130,
                          reply=reply, trust_header=trust_by_certificate(
                              NODE_KEYS, QUORUM, chain_id=CHAIN_ID))


def _header_hash(m: ChainStateMachine, height: int) -> bytes:
    block = m.block(height)
    assert block is not None
    return block_hash(decode_header(block.header))
