"""The simulator's shared `FastCrypto` memo (`phalanx.jepsen.sim.crypto_memo`) is transparent:
every signature, MAC, verdict and digest is the one `FastCrypto` computes without it, for any
object and any number of repeats, across the instances that share it and past its bounds;
and a PBFT run (view changes included) is the same run, trace hash for trace hash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.crypto import FastCrypto, digest_of, repr_encoding
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    Commit,
    Prepare,
    PreparedProof,
    PrePrepare,
    ViewChange,
)
from phalanx.consensus.types import NodeId
from phalanx.jepsen.sim import pbft as sim_pbft
from phalanx.jepsen.sim.crypto_memo import CryptoMemo
from phalanx.jepsen.sim.run import RunConfig, run

NODES = tuple(NodeId(f"n{i}") for i in range(1, 5))


def _prepare(view: int, seq: int, replica: NodeId, signature: bytes = b"") -> Prepare:
    return Prepare(view=view, seq=seq, digest=bytes([seq % 256]) * 32, replica=replica,
                   signature=signature)


def _view_change(seq: int, replica: NodeId) -> ViewChange:
    pp = PrePrepare(view=0, seq=seq, digest=b"d" * 32, batch=(), replica=NODES[0],
                    signature=b"s" * 32)
    proof = PreparedProof(pre_prepare=pp, prepares=tuple(
        _prepare(0, seq, r, b"p" * 32) for r in NODES[1:]))
    return ViewChange(new_view=1, stable_seq=0, checkpoint_proof=(),
                      prepared_proofs=(proof,), replica=replica, signature=b"v" * 32)


@settings(max_examples=60, deadline=None)
@given(view=st.integers(0, 5), seq=st.integers(0, 300), signer=st.sampled_from(NODES),
       repeats=st.integers(1, 4), max_entries=st.integers(1, 4))
def test_memo_is_transparent(view: int, seq: int, signer: NodeId, repeats: int,
                             max_entries: int) -> None:
    memo = CryptoMemo(max_entries=max_entries)
    plain = {n: FastCrypto(n) for n in NODES}
    cached = {n: FastCrypto(n, memo=memo) for n in NODES}
    objects: list[object] = [_prepare(view, seq, signer), Checkpoint(
        seq=seq, digest=b"c" * 32, replica=signer), _view_change(seq + 1, signer)]
    for _ in range(repeats):  # the same objects again: memo hits (or, when small, evictions)
        for obj in objects:
            sig = plain[signer].sign(obj)
            assert cached[signer].sign(obj) == sig
            for n in NODES:
                assert cached[n].verify(signer, obj, sig)
                assert not cached[n].verify(signer, obj, bytes([sig[0] ^ 1]) + sig[1:])
                other = NODES[(NODES.index(signer) + 1) % len(NODES)]
                assert cached[n].verify(other, obj, sig) == plain[n].verify(other, obj, sig)
                assert digest_of(cached[n], obj) == digest_of(plain[n], obj)
                for peer in NODES:
                    assert cached[n].mac(peer, obj) == plain[n].mac(peer, obj)
        commit = Commit(view=view, seq=seq, digest=b"d" * 32, replica=signer)
        for peer in NODES:
            tag = plain[signer].mac(peer, commit)
            sent = Commit(view=view, seq=seq, digest=b"d" * 32, replica=signer, auth=tag)
            assert cached[peer].verify_mac(signer, sent, tag)
            assert cached[signer].mac(peer, commit) == tag
    assert memo.hits > 0 or max_entries < 4


def test_memo_hits_the_same_object_and_stays_bounded() -> None:
    memo = CryptoMemo(max_entries=2)
    a, b, c = (FastCrypto(n, memo=memo) for n in NODES[:3])
    vc = _view_change(1, NODES[0])
    sig = FastCrypto(NODES[0]).sign(vc)
    assert b.verify(NODES[0], vc, sig)
    assert c.verify(NODES[0], vc, sig)
    assert (memo.hits, memo.misses) == (1, 1)  # one encoding and tag for both replicas
    for seq in range(10):  # past the bound: cleared, never wrong
        p = _prepare(0, seq, NODES[1])
        assert a.verify(NODES[1], p, FastCrypto(NODES[1]).sign(p))
    assert len(memo._entries) <= 2


def test_mac_checks_share_a_flat_view_by_value_and_nothing_else() -> None:
    """A sender's n-1 MAC'd copies of one commit are distinct objects with equal signing
    views: their covered bytes are encoded once (by value). The verdicts are the plain
    ones, including for a tampered copy and for `view=True` (equal to 1 but not the same
    encoding: never confused with the `view=1` commit remembered before it)."""
    memo = CryptoMemo()
    plain = {n: FastCrypto(n) for n in NODES}
    cached = {n: FastCrypto(n, memo=memo) for n in NODES}
    signer = NODES[0]

    def copies(view: int) -> list[tuple[NodeId, Commit, bytes]]:
        commit = Commit(view=view, seq=7, digest=b"d" * 32, replica=signer)
        out = []
        for peer in NODES[1:]:
            tag = plain[signer].mac(peer, commit)
            # a new object per receiver, as the network decodes each frame
            out.append((peer, Commit(view=view, seq=7, digest=bytes(bytearray(b"d" * 32)),
                                     replica=NodeId(str(signer)), auth=tag), tag))
        return out

    for peer, copy, tag in copies(1):
        assert cached[peer].verify_mac(signer, copy, tag)
        forged = Commit(view=1, seq=8, digest=copy.digest, replica=signer, auth=tag)
        assert not cached[peer].verify_mac(signer, forged, tag)
        other = NODES[2] if peer != NODES[2] else NODES[3]  # not the sender: another key
        assert not cached[peer].verify_mac(other, copy, tag)
    assert len(memo._views) == 2  # seq 7 once for its 3 copies, seq 8 once
    assert memo.hits == memo.misses == 0  # (the object memo is not involved)
    for peer, copy, tag in copies(True):  # 1 == True, repr differs: not by value
        assert cached[peer].verify_mac(signer, copy, tag) == plain[peer].verify_mac(
            signer, copy, tag) is True
        as_int = Commit(view=1, seq=7, digest=copy.digest, replica=signer, auth=tag)
        assert cached[peer].verify_mac(signer, as_int, tag) is plain[peer].verify_mac(
            signer, as_int, tag) is False
    assert len(memo._views) == 2


def test_memo_must_share_the_encoding() -> None:
    with pytest.raises(ValueError, match="same encoding"):
        FastCrypto(NODES[0], encode=lambda obj: repr_encoding(obj) + b"!", memo=CryptoMemo())


@pytest.mark.parametrize(("nodes", "byzantine", "seed"), [(4, 1, 3), (7, 2, 5)])
def test_pbft_run_is_the_same_with_and_without_memo(
    monkeypatch: pytest.MonkeyPatch, nodes: int, byzantine: int, seed: int
) -> None:
    cfg = RunConfig(seed=seed, protocol="pbft", nodes=nodes, byzantine=byzantine,
                    time_ns=3_000_000_000, liveness_ns=3_000_000_000)
    with_memo = run(cfg)
    monkeypatch.setattr(sim_pbft, "CryptoMemo", lambda: None)
    without = run(cfg)
    assert with_memo.trace_hash == without.trace_hash, f"replay: {cfg}"
    assert with_memo.ops_ok == without.ops_ok
