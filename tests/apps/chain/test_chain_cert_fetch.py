"""Fetching missing block certificates from peers (`CertificateFetcher`), without a network.

The fetcher asks for heights the node lacks only after `patience` ticks, round-robin over
peers, at most 32 a request, and gives a height up after `max_tries`; of a peer's answer
it keeps only certificates that verify against the node's OWN block (a forged signature, a
certificate of another block, of a block the node does not hold, or garbage: dropped and
counted). Control: a fetcher that trusted the sender would store the forged one."""

from __future__ import annotations

import dataclasses
import random

from chain_helpers import CHAIN_ID, NODE_KEYS, NODE_SECRETS, NODES, QUORUM
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.certificate import BlockCertificate, sign_block
from phalanx.consensus.types import NodeId
from phalanx.services.block_cert_api import MAX_FETCH, CertificateBatch, CertificateFetch
from phalanx.services.block_cert_fetch import CertificateFetcher

HASHES = {h: random.Random(h).randbytes(32) for h in range(1, 101)}
PEERS = tuple(NodeId(n) for n in NODES[1:])


def certificate(height: int, block: bytes | None = None,
                signers: tuple[str, ...] = NODES[:QUORUM]) -> BlockCertificate:
    block = block if block is not None else HASHES[height]
    sigs = [sign_block(node=n, chain_id=CHAIN_ID, height=height, block_hash=block,
                       sign=NODE_SECRETS[n].sign) for n in sorted(signers)]
    return BlockCertificate(height=height, block_hash=block,
                            signatures=tuple((s.node, s.signature) for s in sigs))


def fetcher(**kw: int) -> CertificateFetcher:
    return CertificateFetcher(peers=PEERS, node_keys=NODE_KEYS, quorum=QUORUM,
                              chain_id=CHAIN_ID, keep=kw.pop("keep", 1000), **kw)


def test_asks_for_lacking_heights_after_patience_round_robin_bounded_and_gives_up() -> None:
    stored = {1, 2, 5}
    f = fetcher(patience=2, max_tries=4)
    have = stored.__contains__
    assert f.tick(60, have) is None
    assert f.tick(60, have) is None
    requests = []
    while (r := f.tick(60, have)) is not None:
        requests.append(r)
        assert len(requests) < 100, "the fetcher never gives up"
    lacking = tuple(h for h in range(1, 61) if h not in stored)
    assert [r[0] for r in requests[:6]] == [*PEERS, *PEERS]
    assert [r[1].heights for r in requests[:4]] == [lacking[:MAX_FETCH]] * 4  # max_tries
    assert requests[4][1].heights == lacking[MAX_FETCH:]  # the first ones were given up
    assert len(requests) == 8
    assert f.counts["gave_up"] == len(lacking)
    assert f.tick(60, have) is None
    assert f.done == 60  # given up heights count as done: the pointer moves past them
    assert f.tick(61, have) is None  # a new block: patience again


def test_a_fresh_block_is_not_asked_for_while_its_signatures_arrive() -> None:
    f = fetcher(patience=3)
    have = set(range(1, 11)).__contains__
    for _ in range(4):
        assert f.tick(10, have) is None
    assert f.tick(11, have) is None  # block 11 is new: lacking for less than 3 ticks
    assert f.tick(11, have) is None
    assert f.tick(11, have) is None
    r = f.tick(11, have)
    assert r is not None
    assert r[1].heights == (11,)


def test_keeps_only_certificates_of_its_own_blocks_that_verify() -> None:
    f = fetcher()
    good = certificate(3)
    forged = dataclasses.replace(certificate(4), signatures=(
        *certificate(4).signatures[:-1], (certificate(4).signatures[-1][0], bytes(64))))
    other_block = certificate(5, block=bytes(32))
    too_few = certificate(6, signers=NODES[:QUORUM - 1])
    unknown = certificate(7)  # the node holds no block 7
    batch = CertificateBatch(certificates=(good, forged, other_block, too_few, unknown,
                                           good, "junk"))  # type: ignore[arg-type]
    own = {h: HASHES[h] for h in range(1, 7)}
    kept = f.answer(batch, have=lambda h: False, hash_at=own.get)
    assert kept == [good]
    assert f.counts == {"fetched": 1, "dropped:bad_certificate": 2, "dropped:divergent": 1,
                        "dropped:unknown_block": 1, "duplicate": 1, "dropped:malformed": 1}
    # control: trusting the sender (no verification) would have kept the forged one
    trusting = [c for c in batch.certificates
                if isinstance(c, BlockCertificate) and own.get(c.height) == c.block_hash]
    assert forged in trusting
    # already stored: not re-stored; an oversized batch is dropped whole
    assert f.answer(CertificateBatch(certificates=(good,)), have=lambda h: h == 3,
                    hash_at=own.get) == []
    assert f.answer(CertificateBatch(certificates=(good,) * (MAX_FETCH + 1)),
                    have=lambda h: False, hash_at=own.get) == []


def test_serves_stored_certificates_and_refuses_malformed_requests() -> None:
    f = fetcher()
    stored = {h: certificate(h) for h in (2, 4)}
    answer = f.serve(CertificateFetch(heights=(4, 3, 2, 4)), stored.get)
    assert answer == CertificateBatch(certificates=(stored[2], stored[4]))
    assert f.serve(CertificateFetch(heights=tuple(range(1, MAX_FETCH + 2))), stored.get) is None
    assert f.serve(CertificateFetch(heights=(0,)), stored.get) is None
    assert f.counts["dropped:malformed_fetch"] == 2


@settings(max_examples=40, deadline=None)
@given(height=st.integers(min_value=0, max_value=120),
       stored=st.sets(st.integers(min_value=1, max_value=120)),
       keep=st.integers(min_value=1, max_value=150), patience=st.integers(0, 4))
def test_requests_name_only_lacking_kept_heights_and_stop(height: int, stored: set[int],
                                                         keep: int, patience: int) -> None:
    """Whatever is stored: every request names heights the node lacks, within the kept
    range, sorted, at most MAX_FETCH; and the requests stop (every height given up)."""
    f = fetcher(keep=keep, patience=patience)
    have = stored.__contains__
    lacking = {h for h in range(max(1, height - keep + 1), height + 1) if h not in stored}
    asked: set[int] = set()
    for tick in range(200):
        r = f.tick(height, have)
        if r is None and tick > patience:
            break
        if r is not None:
            heights = r[1].heights
            assert list(heights) == sorted(set(heights))
            assert 1 <= len(heights) <= MAX_FETCH
            assert set(heights) <= lacking, (height, keep, sorted(set(heights) - lacking))
            asked |= set(heights)
    else:
        raise AssertionError("the fetcher never stops asking")
    assert asked == lacking
    assert f.counts.get("gave_up", 0) == len(lacking)
