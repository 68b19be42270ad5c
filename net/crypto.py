"""Real cryptography for the Byzantine cores: Ed25519 signatures and HMAC-SHA256 authenticators.

Owns: `Ed25519Crypto` (implements `phalanx.consensus.crypto.Crypto`) and `ed25519_cluster`, a
helper that derives a cluster's keys for tests and local clusters.
Must not import: trio, sockets, clocks. Canonical bytes come from the codec
(`phalanx.net.wire.canonical_bytes`) unless an encoder is injected.

Choice (see `phalanx.consensus.pbft.messages`): messages that travel as proofs are Ed25519
signed; normal-case commits use HMAC-SHA256 over pairwise keys, which is two orders of
magnitude cheaper than a signature. Invariant: `verify`/`verify_mac` never raise.

Keys arrive as `cryptography` objects (PEM files, certificates and key derivation stay
there); signing and verification run in libsodium through PyNaCl (`nacl.bindings`), which
on this project's 2-core benchmark machine verifies in 76-98 us against 161-169 us for
`cryptography`'s OpenSSL backend (sign 22-39 us against 47-53): a PBFT batch at n=4 costs
8 verifications and 4 signatures, on a path whose throughput is CPU-bound. Ed25519 is
deterministic (RFC 8032), so both libraries give the same signature for the same key and
bytes (a test checks it); libsodium also refuses non-canonical and small-order encodings.

What is covered: with the codec (the default), the canonical bytes of the message without
its top-level `signature`/`auth` fields (`canonical_bytes(obj, omit=...)`: no blanked copy of
the message is built); with an injected encoder, `encode(signing_view(obj))`. Either way a
signature or MAC never covers itself, and equal messages give equal bytes. A MAC of the
object just MACed for another peer reuses its bytes (one commit, three receivers: one encode).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from nacl import bindings as sodium
from nacl.exceptions import BadSignatureError, CryptoError

from phalanx.consensus.crypto import Encoder, signing_view
from phalanx.consensus.types import NodeId
from phalanx.net.codec import EncodeError

_SIGNATURE_BYTES = 64


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@functools.cache
def _canonical_bytes() -> Callable[..., bytes]:
    """`phalanx.net.wire.canonical_bytes`, with the PBFT messages registered once per process
    on first use (imported late: the PBFT messages module imports the consensus layer)."""
    from phalanx.consensus.pbft.messages import PBFT_MESSAGES
    from phalanx.net import wire

    wire.register_all(PBFT_MESSAGES)
    return wire.canonical_bytes


_AUTH_FIELDS = ("signature", "auth")
_OMITTED: dict[type, tuple[str, ...]] = {}
"""Per class, which of `_AUTH_FIELDS` it has (computed once per type: a hot path)."""


def _omitted(cls: type) -> tuple[str, ...]:
    found = _OMITTED.get(cls)
    if found is None:
        names = getattr(cls, "__dataclass_fields__", {})
        found = _OMITTED[cls] = tuple(n for n in _AUTH_FIELDS if n in names)
    return found


def _codec_signed_bytes(obj: object) -> bytes:
    """What a signature or MAC covers under the codec: `obj` without its own tags."""
    omit = _omitted(type(obj)) if not isinstance(obj, tuple) else ()
    if not omit:
        return _codec_bytes(obj)
    return _canonical_bytes()(obj, omit=omit)


def _codec_bytes(obj: object) -> bytes:
    canonical = _canonical_bytes()
    if isinstance(obj, tuple):
        # A batch: the length-prefixed canonical bytes of its elements (prefix-free).
        parts = [canonical(x) for x in obj]
        return b"T" + b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    return canonical(obj)


class Ed25519Crypto:
    """Ed25519 signatures, HMAC-SHA256 MACs, SHA-256 digests."""

    __slots__ = ("_encode", "_mac_keys", "_mac_memo", "_node_id", "_private", "_public",
                 "_signed_bytes")

    def __init__(
        self,
        node_id: NodeId,
        *,
        private_key: Ed25519PrivateKey,
        public_keys: Mapping[NodeId, Ed25519PublicKey],
        mac_keys: Mapping[NodeId, bytes],
        encode: Encoder | None = None,
    ) -> None:
        self._node_id = node_id
        # libsodium's secret key: the 32-byte seed followed by the public key.
        seed = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        self._private = seed + _raw_public(private_key.public_key())
        self._public = {n: _raw_public(k) for n, k in public_keys.items()}
        self._mac_keys = dict(mac_keys)
        self._encode = encode if encode is not None else _codec_bytes
        self._signed_bytes: Callable[[object], bytes] = (
            _codec_signed_bytes if encode is None else self._view_bytes
        )
        # The object last MACed and its covered bytes (held, so identity cannot be reused).
        self._mac_memo: tuple[object, bytes] | None = None

    @property
    def node_id(self) -> NodeId:
        return self._node_id

    def _view_bytes(self, obj: object) -> bytes:
        return self._encode(signing_view(obj))

    def sign(self, obj: object) -> bytes:
        return sodium.crypto_sign(self._signed_bytes(obj), self._private)[:_SIGNATURE_BYTES]

    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        key = self._public.get(node)
        if key is None or type(signature) is not bytes or len(signature) != _SIGNATURE_BYTES:
            return False
        try:
            sodium.crypto_sign_open(signature + self._signed_bytes(obj), key)
        except (BadSignatureError, CryptoError, EncodeError, ValueError, TypeError):
            return False
        return True

    def mac(self, peer: NodeId, obj: object) -> bytes:
        key = self._mac_keys.get(peer)
        if key is None:
            raise KeyError(f"no MAC key shared with {peer!r}")
        memo = self._mac_memo
        if memo is not None and memo[0] is obj:
            data = memo[1]
        else:
            data = self._signed_bytes(obj)
            self._mac_memo = (obj, data)
        return hmac.new(key, data, hashlib.sha256).digest()

    def verify_mac(self, peer: NodeId, obj: object, tag: bytes) -> bool:
        key = self._mac_keys.get(peer)
        if key is None:
            return False
        try:
            expected = hmac.new(key, self._signed_bytes(obj), hashlib.sha256).digest()
        except (EncodeError, ValueError, TypeError):
            return False
        return hmac.compare_digest(expected, tag)

    def digest(self, data: bytes) -> bytes:
        return hashlib.sha256(data).digest()

    def encode(self, obj: object) -> bytes:
        return self._encode(obj)


def ed25519_cluster(
    nodes: tuple[NodeId, ...], *, seed: bytes, encode: Encoder | None = None
) -> dict[NodeId, Ed25519Crypto]:
    """Keys for every node derived from `seed` (tests and local clusters only: anyone with the
    seed can sign as anyone)."""
    private = {
        n: Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed + b"sk:" + n.encode()).digest())
        for n in nodes
    }
    public = {n: k.public_key() for n, k in private.items()}

    def pair(a: NodeId, b: NodeId) -> bytes:
        lo, hi = sorted((a, b))
        return hashlib.sha256(seed + b"mac:" + lo.encode() + b"\x00" + hi.encode()).digest()

    return {
        n: Ed25519Crypto(
            n,
            private_key=private[n],
            public_keys=public,
            mac_keys={m: pair(n, m) for m in nodes if m != n},
            encode=encode,
        )
        for n in nodes
    }
