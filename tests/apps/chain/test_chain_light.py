"""Light-client verification: a balance claim against a trusted header and an SMT proof."""

from __future__ import annotations

import dataclasses

from chain_helpers import ACCOUNTS, START, genesis, transfer
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.block import BlockHeader, block_hash, decode_header
from phalanx.apps.chain.light import verify_account, verify_balance
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.types import AccountProof, GetAccountProof, decode_result, encode

M = ChainStateMachine(genesis())
for _nonce, _to, _amount in ((1, 4, 10), (2, 5, 3), (3, 4, 7)):
    M.apply(transfer(1, _nonce, _to, _amount))
_BLOCK = M.block(M.height)
assert _BLOCK is not None
HEADER = decode_header(_BLOCK.header)
TRUSTED = {block_hash(HEADER)}
BALANCES = {a: M.balance(a) for a in ACCOUNTS}


def trust(header: BlockHeader) -> bool:
    return block_hash(header) in TRUSTED


def reply_for(account: bytes) -> AccountProof:
    reply = decode_result(M.query(encode(GetAccountProof(account=account))))
    assert isinstance(reply, AccountProof)
    return reply


def test_honest_replies_verify_for_present_and_absent_accounts() -> None:
    for account in [*ACCOUNTS, bytes(32)]:
        reply = reply_for(account)
        assert verify_balance(header=HEADER, account=account, balance=BALANCES.get(account, 0),
                              reply=reply, trust_header=trust)
    assert BALANCES[ACCOUNTS[1]] == START - 20
    assert verify_account(header=HEADER, account=ACCOUNTS[1], value=reply_for(ACCOUNTS[1]).value,
                          proof=reply_for(ACCOUNTS[1]).proof, trust_header=trust) == (
        START - 20, 3)


def test_an_untrusted_header_never_verifies() -> None:
    reply = reply_for(ACCOUNTS[4])
    assert not verify_balance(header=HEADER, account=ACCOUNTS[4], balance=17, reply=reply,
                              trust_header=lambda h: False)

    def broken(h: BlockHeader) -> bool:
        raise ValueError("hostile proof")

    assert not verify_balance(header=HEADER, account=ACCOUNTS[4], balance=17, reply=reply,
                              trust_header=broken)
    # a header with another state root, trusted by a careless callback, still needs the proof
    other = dataclasses.replace(HEADER, state_root=bytes(32))
    assert not verify_balance(header=other, account=ACCOUNTS[4], balance=17,
                              reply=dataclasses.replace(reply, state_root=bytes(32)),
                              trust_header=lambda h: True)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ACCOUNTS), st.integers(-5, 2 * START),
       st.sampled_from([*ACCOUNTS, bytes(32)]), st.binary(min_size=32, max_size=32))
def test_a_wrong_balance_key_or_root_never_verifies(
        account: bytes, balance: int, asked: bytes, root: bytes) -> None:
    reply = reply_for(asked)
    ok = verify_balance(header=HEADER, account=account, balance=balance, reply=reply,
                        trust_header=trust)
    assert ok == (asked == account and balance == BALANCES[account])
    # the same reply under another root (a header the client trusts blindly) never verifies
    if root != HEADER.state_root:
        forged = dataclasses.replace(HEADER, state_root=root)
        assert not verify_balance(header=forged, account=account, balance=balance,
                                  reply=dataclasses.replace(reply, state_root=root),
                                  trust_header=lambda h: True)
    # a proof for one key never proves another key's value
    if asked != account:
        assert verify_account(header=HEADER, account=account, value=reply.value,
                              proof=reply.proof, trust_header=trust) is None


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=120), st.none() | st.binary(max_size=20))
def test_junk_proofs_and_values_never_verify(proof: bytes, value: bytes | None) -> None:
    assert verify_account(header=HEADER, account=ACCOUNTS[1], value=value, proof=proof,
                          trust_header=trust) is None
