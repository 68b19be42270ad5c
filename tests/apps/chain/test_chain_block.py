"""Block headers and the tx root: what the hash covers, and that distinct lists differ."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from phalanx.apps.chain.block import (
    EMPTY_TX_ROOT,
    BlockHeader,
    block_hash,
    decode_header,
    encode_header,
    tx_root,
)

HEADER = BlockHeader(height=3, prev_hash=b"p" * 32, tx_root=b"t" * 32, state_root=b"s" * 32,
                     timestamp=17, proposer="n1")
ids = st.lists(st.binary(min_size=32, max_size=32), max_size=9)


def test_the_hash_covers_every_field_but_the_consensus_proof() -> None:
    h = block_hash(HEADER)
    assert block_hash(dataclasses.replace(HEADER, consensus_proof=b"cert")) == h
    for change in ({"height": 4}, {"prev_hash": b"q" * 32}, {"tx_root": b"u" * 32},
                   {"state_root": b"r" * 32}, {"timestamp": 18}, {"proposer": "n2"}):
        assert block_hash(dataclasses.replace(HEADER, **change)) != h  # type: ignore[arg-type]
    assert decode_header(encode_header(HEADER)) == HEADER


@given(ids, ids)
def test_distinct_tx_lists_have_distinct_roots(a: list[bytes], b: list[bytes]) -> None:
    assert (tx_root(a) == tx_root(b)) == (a == b)


def test_tx_root_shape() -> None:
    assert tx_root([]) == EMPTY_TX_ROOT
    one = [b"a" * 32]
    assert tx_root(one) != one[0]  # leaves are domain-separated from ids
    three = [b"a" * 32, b"b" * 32, b"c" * 32]
    assert tx_root(three) != tx_root([*three, three[-1]])  # odd nodes are not duplicated
