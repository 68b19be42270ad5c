"""The sparse Merkle tree: canonical roots, proofs for present and absent keys, tampering."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.smt import (
    EMPTY,
    Proof,
    SparseMerkleTree,
    decode_proof,
    encode_proof,
    verify_proof,
)

keys = st.binary(min_size=0, max_size=6)
values = st.binary(min_size=0, max_size=8)
contents = st.dictionaries(keys, values, max_size=40)
# A sequence of batches: each maps a key to a value or None (delete).
batches = st.lists(st.dictionaries(keys, st.none() | values, max_size=12), max_size=6)


@settings(max_examples=150, deadline=None)
@given(batches)
def test_incremental_root_equals_root_built_from_scratch(steps: list[dict[bytes, bytes | None]]
                                                         ) -> None:
    tree = SparseMerkleTree()
    model: dict[bytes, bytes] = {}
    for batch in steps:
        tree = tree.update_batch(batch.items())
        for k, v in batch.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        scratch = SparseMerkleTree.from_items(model.items())
        assert tree.root == scratch.root == _reference_root(model)
        assert len(tree) == len(model)
        assert dict(tree.items()) == model
        # items() is in key-hash order: deterministic whatever the insertion order
        assert [k for k, _ in tree.items()] == sorted(model, key=lambda k: hashlib.sha256(k)
                                                      .digest())


def _reference_root(model: dict[bytes, bytes]) -> bytes:
    """The root straight from the definition (module docstring), sharing no code with the
    tree: a subtree with no leaf is EMPTY, with one leaf is that leaf, else an inner node."""
    def root(items: list[tuple[int, bytes, bytes]], depth: int) -> bytes:
        if not items:
            return EMPTY
        if len(items) == 1:
            _, kh, value = items[0]
            return hashlib.sha256(b"\x00" + kh + hashlib.sha256(value).digest()).digest()
        bit = 255 - depth
        left = [i for i in items if not (i[0] >> bit) & 1]
        right = [i for i in items if (i[0] >> bit) & 1]
        return hashlib.sha256(b"\x01" + root(left, depth + 1) + root(right, depth + 1)).digest()

    hashed = [(int.from_bytes(hashlib.sha256(k).digest(), "big"), hashlib.sha256(k).digest(), v)
              for k, v in model.items()]
    return root(hashed, 0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.dictionaries(keys, st.none() | values, min_size=1, max_size=3), max_size=20))
def test_small_batches_give_the_root_of_the_definition(
        steps: list[dict[bytes, bytes | None]]) -> None:
    """Batches of 1-3 changes take the single-path update; each root matches the definition."""
    tree = SparseMerkleTree()
    model: dict[bytes, bytes] = {}
    for batch in steps:
        tree = tree.update_batch(batch.items())
        for k, v in batch.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        assert tree.root == _reference_root(model)
        assert len(tree) == len(model)
        assert all(tree.get(k) == v for k, v in model.items())


@settings(max_examples=100, deadline=None)
@given(contents, st.lists(keys, max_size=8))
def test_proofs_verify_for_every_key_and_every_absent_key(
        model: dict[bytes, bytes], probes: list[bytes]) -> None:
    tree = SparseMerkleTree.from_items(model.items())
    for k in [*model, *probes]:
        proof = tree.prove(k)
        value = model.get(k)
        assert tree.get(k) == value
        assert verify_proof(tree.root, k, value, proof)
        # the opposite claim never verifies with the same proof
        wrong: bytes | None = None if value is not None else b"x"
        assert not verify_proof(tree.root, k, wrong, proof)
        if value is not None:
            assert not verify_proof(tree.root, k, value + b"\x00", proof)


@settings(max_examples=100, deadline=None)
@given(contents.filter(bool), st.data())
def test_a_tampered_proof_never_verifies(model: dict[bytes, bytes], data: st.DataObject) -> None:
    tree = SparseMerkleTree.from_items(model.items())
    k = data.draw(st.sampled_from(sorted(model)))
    proof = tree.prove(k)
    i = data.draw(st.integers(0, len(proof) - 1))
    bit = data.draw(st.integers(0, 7))
    tampered = proof[:i] + bytes([proof[i] ^ (1 << bit)]) + proof[i + 1:]
    assert not verify_proof(tree.root, k, model[k], tampered)
    assert not verify_proof(tree.root, k, model[k], proof[:-1])
    assert not verify_proof(tree.root, k, model[k], proof + b"\x00")
    other_root = hashlib.sha256(tree.root).digest()
    assert not verify_proof(other_root, k, model[k], proof)


@given(st.binary(max_size=200), keys, st.none() | values)
def test_verify_never_raises_on_junk(junk: bytes, k: bytes, v: bytes | None) -> None:
    assert verify_proof(EMPTY, k, v, junk) in (True, False)
    decoded = decode_proof(junk)
    if decoded is not None:  # anything that decodes re-encodes to the same bytes
        assert encode_proof(decoded) == junk


def test_updates_never_change_an_older_tree() -> None:
    old = SparseMerkleTree.from_items([(b"a", b"1"), (b"b", b"2")])
    root = old.root
    new = old.update_batch([(b"a", b"9"), (b"c", b"3"), (b"b", None)])
    assert old.root == root
    assert old.get(b"a") == b"1"
    assert old.get(b"b") == b"2"
    assert new.get(b"a") == b"9"
    assert new.get(b"b") is None
    assert len(new) == 2


def test_empty_tree_and_deleting_everything() -> None:
    tree = SparseMerkleTree()
    assert tree.root == EMPTY
    assert verify_proof(EMPTY, b"k", None, tree.prove(b"k"))
    full = tree.update_batch([(b"k", b"v")])
    assert full.update_batch([(b"k", None)]).root == EMPTY
    assert full.update_batch([(b"absent", None)]).root == full.root


def test_a_key_twice_in_one_batch_is_our_misuse() -> None:
    with pytest.raises(ValueError, match="twice"):
        SparseMerkleTree().update_batch([(b"k", b"1"), (b"k", b"2")])


def test_proof_is_compressed_and_non_inclusion_names_the_blocking_leaf() -> None:
    tree = SparseMerkleTree.from_items((bytes([i]), b"v") for i in range(64))
    proof = decode_proof(tree.prove(bytes([3])))
    assert proof is not None
    assert proof.other is None
    assert len(tree.prove(bytes([3]))) == 2 + (proof.depth + 7) // 8 + 1 + 32 * sum(
        s is not None for s in proof.siblings)
    # some absent key ends at another key's leaf (kind 1) and still verifies as absent
    kinds = {decode_proof(tree.prove(bytes([i, 1]))).other is not None  # type: ignore[union-attr]
             for i in range(64)}
    assert kinds == {True, False}


def test_a_leaf_cannot_be_claimed_as_absent_by_its_own_key() -> None:
    tree = SparseMerkleTree.from_items([(b"a", b"1"), (b"b", b"2")])
    honest = decode_proof(tree.prove(b"a"))
    assert honest is not None
    kh = hashlib.sha256(b"a").digest()
    forged = Proof(depth=honest.depth, siblings=honest.siblings,
                   other=(kh, hashlib.sha256(b"1").digest()))
    assert not verify_proof(tree.root, b"a", None, encode_proof(forged))
