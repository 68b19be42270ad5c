"""A light client trusting headers by block certificate, talking to one Byzantine replica.

The cluster is 4 nodes (f = 1, quorum 3). The honest replicas executed the chain in `HONEST`;
the liar (n3) holds its own node key and can run any state it likes, but cannot sign for
the others.
"""

from __future__ import annotations

import dataclasses

import msgpack  # type: ignore[import-untyped]  # no stubs shipped
import pytest
from chain_helpers import (
    ACCOUNTS,
    CHAIN_ID,
    NODE_KEYS,
    NODES,
    QUORUM,
    START,
    certify,
    genesis,
    transfer,
)

from phalanx.apps.chain.block import BlockHeader, decode_header
from phalanx.apps.chain.light import trust_by_certificate, verify_balance
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.types import AccountProof, GetAccountProof, decode_result, encode

LIAR = "n3"
TRUST = trust_by_certificate(NODE_KEYS, QUORUM, chain_id=CHAIN_ID)


def _run(raws: list[bytes], **kwargs: bool) -> tuple[ChainStateMachine, BlockHeader]:
    m = ChainStateMachine(genesis(), **kwargs)
    for raw in raws:
        m.apply(raw)
    block = m.block(m.height)
    assert block is not None
    return m, decode_header(block.header)


def _reply(m: ChainStateMachine, account: bytes) -> AccountProof:
    reply = decode_result(m.query(encode(GetAccountProof(account=account))))
    assert isinstance(reply, AccountProof)
    return reply


HONEST, HEADER = _run([transfer(1, 1, 4, 10), transfer(1, 2, 4, 5)])
CERTIFIED = certify(HEADER, ("n0", "n1", LIAR))


def _verify(header: BlockHeader, account: bytes, balance: int, reply: AccountProof) -> bool:
    return verify_balance(header=header, account=account, balance=balance, reply=reply,
                          trust_header=TRUST)


def test_an_honest_answer_under_a_quorum_certificate_verifies() -> None:
    for account, balance in ((ACCOUNTS[1], START - 15), (ACCOUNTS[4], 15), (bytes(32), 0)):
        assert _verify(CERTIFIED, account, balance, _reply(HONEST, account))
    assert _verify(certify(HEADER, NODES), ACCOUNTS[4], 15, _reply(HONEST, ACCOUNTS[4]))


def test_a_lie_about_the_balance_is_refused() -> None:
    reply = _reply(HONEST, ACCOUNTS[4])
    assert not _verify(CERTIFIED, ACCOUNTS[4], 1_000, reply)
    # another account's value under the asked-for account's name
    other = _reply(HONEST, ACCOUNTS[1])
    assert not _verify(CERTIFIED, ACCOUNTS[4], START - 15,
                       dataclasses.replace(other, account=ACCOUNTS[4]))


def test_a_lie_about_the_header_is_refused() -> None:
    """The liar runs a state where account 4 is richer (it applied a forged transfer): its
    proof verifies against its own header, but only its own key signs that header."""
    body, sig = msgpack.unpackb(transfer(2, 1, 4, 500))
    forged = msgpack.packb([body, bytes([sig[0] ^ 1]) + sig[1:]], use_bin_type=True)
    liar, liar_header = _run([transfer(1, 1, 4, 10), forged], trust_leader_admission=True)
    reply = _reply(liar, ACCOUNTS[4])
    assert verify_balance(header=liar_header, account=ACCOUNTS[4], balance=510, reply=reply,
                          trust_header=lambda h: True)  # consistent, were it trusted
    assert not _verify(certify(liar_header, (LIAR,)), ACCOUNTS[4], 510, reply)
    # its key in the others' names
    assert not _verify(certify(liar_header, ("n0", "n1", LIAR), forger=LIAR), ACCOUNTS[4],
                       510, reply)
    # what the liar can build: the honest certificate copied onto its header
    copied = dataclasses.replace(liar_header, consensus_proof=CERTIFIED.consensus_proof)
    assert not _verify(copied, ACCOUNTS[4], 510, reply)
    # or the honest header's fields with its state root swapped in
    swapped = dataclasses.replace(CERTIFIED, state_root=liar_header.state_root)
    assert not _verify(swapped, ACCOUNTS[4], 510, reply)


def test_a_lie_about_the_certificate_is_refused() -> None:
    reply = _reply(HONEST, ACCOUNTS[4])
    below_quorum = certify(HEADER, ("n0", LIAR))
    other_chain = certify(HEADER, ("n0", "n1", LIAR), chain=bytes(32))
    older = certify(_run([transfer(1, 1, 4, 10)])[1], ("n0", "n1", "n2"))
    for header in (
        below_quorum,
        other_chain,
        dataclasses.replace(HEADER, consensus_proof=older.consensus_proof),  # another height
        dataclasses.replace(HEADER, consensus_proof=b"\x93junk"),
        HEADER,  # no proof at all
    ):
        assert not _verify(header, ACCOUNTS[4], 15, reply)


def test_a_meaningless_quorum_is_refused_when_the_client_is_built() -> None:
    for quorum in (0, len(NODES) + 1):
        with pytest.raises(ValueError, match="quorum"):
            trust_by_certificate(NODE_KEYS, quorum, chain_id=CHAIN_ID)
