"""Injected cryptography for the Byzantine cores: protocols and a fast deterministic stand-in.

Owns: the `Signer`, `Verifier`, `Authenticator`, `Hasher` protocols (and `Crypto`, all four
together) that a Byzantine core receives at construction, `signing_view` (what a signature
or a MAC covers), and `FastCrypto`, a cheap deterministic implementation for the simulator
and unit tests (with `FastCryptoMemo`, the protocol of a memo its instances may share: the
simulator's `phalanx.jepsen.sim.crypto_memo`).

Must not import: `phalanx.net` (the real Ed25519/HMAC implementation lives in
`phalanx.net.crypto` and plugs in through these protocols), trio, clocks, global random.

Invariants:
- A signature or a MAC covers the canonical encoding of the object with its `signature` and
  `auth` fields emptied (`signing_view`), so a message can carry its own signature.
- `verify` and `verify_mac` never raise on any input: a malformed signature is just invalid.
- `FastCrypto` is deterministic: same keys, same object, same bytes. It is NOT secure
  against anyone who knows the cluster secret (every simulated node does); in simulation a
  Byzantine node is scripted by the simulator, which only signs as the nodes it controls.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Callable
from typing import ClassVar, Protocol

from phalanx.consensus.types import NodeId

Encoder = Callable[[object], bytes]
"""Canonical bytes of a frozen dataclass: equal values give equal bytes."""

_COVERED_OUT = ("signature", "auth")


_COVERED_BY_TYPE: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}
"""Per dataclass type, which of `_COVERED_OUT` it has and all its field names (a hot path:
computed once per type)."""


def signing_view(obj: object) -> object:
    """`obj` with its `signature`/`auth` fields (when it has them) set to ``b""``."""
    cls = type(obj)
    known = _COVERED_BY_TYPE.get(cls)
    if known is None:
        if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
            return obj
        names = tuple(f.name for f in dataclasses.fields(obj))
        known = _COVERED_BY_TYPE[cls] = (tuple(n for n in _COVERED_OUT if n in names), names)
    covered, names = known
    blank = [name for name in covered if getattr(obj, name) != b""]
    if not blank:
        return obj
    # `dataclasses.replace(obj, **{name: b""})`, without its per-call field walk and
    # `__init__` (~2.5x cheaper on a Commit): the same field values, so an equal object
    # with the same encoding. (`__post_init__` already accepted them on `obj`; b"" is every
    # covered field's default.)
    view = object.__new__(cls)
    for name in names:
        object.__setattr__(view, name, getattr(obj, name))
    for name in blank:
        object.__setattr__(view, name, b"")
    return view


def uncovered_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass type `cls` that `signing_view` keeps (all but `signature` and
    `auth`), in declaration order; () for a type that is not a dataclass. Two objects of
    `cls` whose kept fields are equal have equal signing views."""
    if not dataclasses.is_dataclass(cls):
        return ()
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _COVERED_OUT)


def repr_encoding(obj: object) -> bytes:
    """A canonical stand-in encoding for frozen dataclasses of ints, strs, bytes, bools,
    tuples and IntEnums: their `repr`. Deterministic, not a wire format."""
    return repr(obj).encode("utf-8")


class Signer(Protocol):
    @property
    def node_id(self) -> NodeId: ...

    def sign(self, obj: object) -> bytes:
        """This node's signature over `signing_view(obj)`."""
        ...


class Verifier(Protocol):
    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        """Whether `signature` is `node`'s signature over `signing_view(obj)`; never raises."""
        ...


class Authenticator(Protocol):
    def mac(self, peer: NodeId, obj: object) -> bytes:
        """A MAC over `signing_view(obj)` with the key this node shares with `peer`."""
        ...

    def verify_mac(self, peer: NodeId, obj: object, tag: bytes) -> bool:
        """Whether `tag` is `peer`'s MAC for this node over `signing_view(obj)`."""
        ...


class Hasher(Protocol):
    def digest(self, data: bytes) -> bytes:
        """A collision-resistant digest of `data`."""
        ...

    def encode(self, obj: object) -> bytes:
        """The canonical bytes of `obj` (what gets hashed for a batch digest)."""
        ...


class Crypto(Signer, Verifier, Authenticator, Hasher, Protocol):
    """Everything a Byzantine core needs; the simulator injects `FastCrypto`, the runtime
    `phalanx.net.crypto.Ed25519Crypto`."""


class FastCryptoMemo(Protocol):
    """A memo of `FastCrypto`'s pure functions that its instances may share (the simulator's
    `phalanx.jepsen.sim.crypto_memo.CryptoMemo`): each method returns exactly what the
    uncached computation returns, with `encoding` as the encoder."""

    @property
    def encoding(self) -> Encoder: ...

    def tag(self, key: bytes, obj: object) -> bytes:
        """``blake2b(encoding(signing_view(obj)), key=key)`` (32 bytes)."""
        ...

    def encode(self, obj: object) -> bytes:
        """``encoding(obj)``."""
        ...

    def digest(self, data: bytes) -> bytes:
        """``blake2b(data)`` (32 bytes)."""
        ...

    def tag_by_value(self, key: bytes, obj: object) -> bytes:
        """``blake2b(encoding(signing_view(obj)), key=key)`` (32 bytes), for an object met once
        (a MAC'd message: one per receiver): the covered bytes remembered by the value of
        the signing view, not by the object, and the tag not remembered."""
        ...


def digest_of(crypto: Hasher, obj: object) -> bytes:
    """The digest of an object's canonical encoding."""
    return crypto.digest(crypto.encode(obj))


class FastCrypto:
    """Deterministic keyed-BLAKE2b signatures and MACs, for simulation and tests.

    Every node's signing key is derived from `cluster_secret` and its id, so any instance
    can verify any node's signature. Forged or mutated signatures fail verification.
    """

    __slots__ = ("_encode", "_keys", "_memo", "_node_id", "_pairs", "_secret", "_signers")

    OPS: ClassVar[list[int]] = [0, 0, 0]
    """Signatures made, signatures verified, MACs made or checked, by every instance: the
    simulator's CPU model (`phalanx.jepsen.sim.cpu`) charges a node for the ones its core
    performed while handling a message. Write-only here: nothing reads it to decide."""

    def __init__(
        self,
        node_id: NodeId,
        *,
        cluster_secret: bytes = b"phalanx-sim",
        encode: Encoder = repr_encoding,
        memo: FastCryptoMemo | None = None,
    ) -> None:
        """`memo`: where to remember encodings and tags (shared by the instances of one
        simulated cluster; same results, less CPU); it must use `encode`."""
        if memo is not None and memo.encoding is not encode:
            raise ValueError("FastCrypto: the memo must use the same encoding")
        self._node_id = node_id
        self._memo = memo
        self._secret = cluster_secret
        self._encode = encode
        self._keys: dict[bytes, bytes] = {}
        """Derived keys by label (a key is a pure function of the secret and the label)."""
        self._pairs: dict[NodeId, bytes] = {}
        """The MAC key shared with each peer (`_pair_key`, a pure function of the peer)."""
        self._signers: dict[NodeId, bytes] = {}
        """Each node's signing key (`_sig_key`, a pure function of the node)."""

    @property
    def node_id(self) -> NodeId:
        return self._node_id

    def _key(self, label: bytes) -> bytes:
        key = self._keys.get(label)
        if key is None:
            key = hashlib.blake2b(self._secret + b"\x00" + label, digest_size=32).digest()
            if len(self._keys) < 4_096:  # (labels are node ids: bounded, but be safe)
                self._keys[label] = key
        return key

    def _tag(self, key: bytes, obj: object) -> bytes:
        if self._memo is not None:
            return self._memo.tag(key, obj)
        data = self._encode(signing_view(obj))
        return hashlib.blake2b(data, key=key, digest_size=32).digest()

    def _sig_key(self, node: NodeId) -> bytes:
        key = self._signers.get(node)
        if key is None:
            key = self._key(b"sig:" + node.encode())
            if len(self._signers) < 4_096:
                self._signers[node] = key
        return key

    def sign(self, obj: object) -> bytes:
        _OPS[0] += 1
        return self._tag(self._sig_key(self._node_id), obj)

    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        _OPS[1] += 1
        try:
            key = self._signers.get(node)
            if key is None:
                key = self._sig_key(node)
            memo = self._memo
            expected = self._tag(key, obj) if memo is None else memo.tag(key, obj)
        except (TypeError, ValueError):
            return False
        return hmac.compare_digest(expected, signature)

    def _pair_key(self, peer: NodeId) -> bytes:
        key = self._pairs.get(peer)
        if key is None:
            me = self._node_id
            a, b = (me, peer) if me <= peer else (peer, me)
            key = self._key(b"mac:" + a.encode() + b"\x00" + b.encode())
            if len(self._pairs) < 4_096:
                self._pairs[peer] = key
        return key

    def mac(self, peer: NodeId, obj: object) -> bytes:
        _OPS[2] += 1
        return self._tag(self._pair_key(peer), obj)

    def verify_mac(self, peer: NodeId, obj: object, tag: bytes) -> bool:
        _OPS[2] += 1
        try:
            # Not through the memo's objects: a MAC'd message reaches one receiver (its tag
            # differs per peer), so it would only fill the memo with objects never seen
            # again; but the n-1 copies a sender MACs differ in their tag only, so their
            # signing views are equal: the memo keeps their covered bytes by value.
            key = self._pair_key(peer)
            memo = self._memo
            expected = self._tag(key, obj) if memo is None else memo.tag_by_value(key, obj)
        except (TypeError, ValueError):
            return False
        return hmac.compare_digest(expected, tag)

    def digest(self, data: bytes) -> bytes:
        if self._memo is not None:
            return self._memo.digest(data)
        return hashlib.blake2b(data, digest_size=32).digest()

    def encode(self, obj: object) -> bytes:
        if self._memo is not None:
            return self._memo.encode(obj)
        return self._encode(obj)


_OPS = FastCrypto.OPS
