"""Node signing keys for real clusters of a protocol that signs (`ProtocolSpec.signing_keys`,
e.g. PBFT): generation (`phalanx cluster init`),
the public halves written into every node's config, and loading a node's `Ed25519Crypto`;
and client signing keys for a protocol whose call strategy is ENDORSEMENT (the leaderless
core): `TransactionSigner` (the client's side) and `client_verifier` (the nodes' side, over
the keyring `NodeConfig.client_keys`).

Owns: the key file format, the pairwise MAC key derivation, and what a client signature
covers.

- A node's key file (`DIR/nodes/<id>.signing.key`, mode 0600; `<id>.pbft.key` in
  older cluster directories) holds one line: the hex of a
  32-byte random seed. The Ed25519 signing key is the seed itself; the X25519 key that
  agrees the MAC keys is derived from it (SHA-256 with a domain tag), so one secret file
  per node is enough.
- The public halves travel as hex in the config: `[[peers]] signing_public_key` (Ed25519)
  and `mac_public_key` (X25519).
- The MAC key shared by nodes a and b is SHA-256 over a domain tag, the X25519 shared
  secret and both ids in sorted order: both ends compute the same key, nobody else can.
- A client's key file (`DIR/clients/<name>.signing.key`, mode 0600) has the same format (the
  seed is the Ed25519 key); the keyring in every node config is `[keys.clients]`,
  ``name = "<hex of the raw public key>"``.
- A client signature covers exactly what a node signature covers (`Ed25519Crypto` with the
  codec): the canonical codec bytes of the object without its `signature` field, i.e. the
  encoding of `phalanx.consensus.crypto.signing_view(obj)`'s fields. So a node's
  `Ed25519Crypto` holding a client's public key verifies a client signature too.

Must not import: trio, sockets, the runtime (`phalanx.runtime.node`, `phalanx.runtime.driver`).
Errors: unreadable or malformed key material raises `SigningKeyError` (never an assert).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from nacl import bindings as sodium
from nacl.exceptions import BadSignatureError, CryptoError

from phalanx.consensus.crypto import Verifier
from phalanx.consensus.leaderless.messages import LEADERLESS_MESSAGES, Transaction
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.codec import EncodeError
from phalanx.net.crypto import Ed25519Crypto
from phalanx.ops.node_config import NodeConfig

_SEED_BYTES = 32
_X25519_TAG = b"phalanx-pbft-x25519:"
_MAC_TAG = b"phalanx-pbft-mac:"
_SIGNATURE_BYTES = 64
_SIGNATURE_FIELDS = ("signature",)


class SigningKeyError(Exception):
    """A PBFT key file or public key in a config is missing or malformed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicKeys:
    """The public halves of one node's PBFT keys, as written into the configs (hex)."""

    signing_public_key: str
    mac_public_key: str


def _signing(seed: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed)


def _agreement(seed: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(hashlib.sha256(_X25519_TAG + seed).digest())


def _raw(key: Ed25519PublicKey | X25519PublicKey) -> str:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def public_keys(seed: bytes) -> PublicKeys:
    """The public halves of the keys derived from `seed`."""
    return PublicKeys(signing_public_key=_raw(_signing(seed).public_key()),
                      mac_public_key=_raw(_agreement(seed).public_key()))


def generate_key_file(path: Path) -> PublicKeys:
    """Write a fresh random node key to `path` (mode 0600, refusing to overwrite)."""
    seed = secrets.token_bytes(_SEED_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(seed.hex() + "\n")
    return public_keys(seed)


def read_seed(path: Path) -> bytes:
    """The seed in key file `path`. Raises `SigningKeyError`."""
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise SigningKeyError(f"{path}: cannot read the signing key: {e.strerror}") from None
    try:
        seed = bytes.fromhex(text)
    except ValueError:
        raise SigningKeyError(f"{path}: the signing key is not hex") from None
    if len(seed) != _SEED_BYTES:
        raise SigningKeyError(
            f"{path}: the signing key must be {_SEED_BYTES} bytes, got {len(seed)}")
    return seed


def _public_bytes(text: str | None, where: str) -> bytes:
    if text is None:
        raise SigningKeyError(f"{where}: missing")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise SigningKeyError(f"{where}: not hex") from None
    if len(raw) != 32:
        raise SigningKeyError(f"{where}: expected 32 bytes, got {len(raw)}")
    return raw


def mac_key(me: NodeId, my_agreement: X25519PrivateKey, peer: NodeId,
            peer_public: X25519PublicKey) -> bytes:
    """The pairwise MAC key of `me` and `peer` (the same at both ends)."""
    lo, hi = sorted((me, peer))
    shared = my_agreement.exchange(peer_public)
    return hashlib.sha256(_MAC_TAG + shared + lo.encode() + b"\x00" + hi.encode()).digest()


def load_crypto(config: NodeConfig) -> Ed25519Crypto:
    """This node's `Ed25519Crypto`: its key file plus every peer's public keys.

    Raises:
        SigningKeyError: no `[keys]` signing_key, or bad key material.
    """
    if config.keys is None:
        raise SigningKeyError(f"{config.source or config.id}: no [keys] signing_key")
    seed = read_seed(config.keys.signing_key)
    me = NodeId(config.id)
    signing = _signing(seed)
    agreement = _agreement(seed)
    public: dict[NodeId, Ed25519PublicKey] = {me: signing.public_key()}
    macs: dict[NodeId, bytes] = {}
    for peer in config.peers:
        where = f"{config.source or config.id}: peer {peer.id!r}"
        try:
            public[NodeId(peer.id)] = Ed25519PublicKey.from_public_bytes(
                _public_bytes(peer.signing_public_key, f"{where} signing_public_key"))
            peer_x = X25519PublicKey.from_public_bytes(
                _public_bytes(peer.mac_public_key, f"{where} mac_public_key"))
        except ValueError as e:
            raise SigningKeyError(f"{where}: bad public key: {e}") from None
        macs[NodeId(peer.id)] = mac_key(me, agreement, NodeId(peer.id), peer_x)
    return Ed25519Crypto(me, private_key=signing, public_keys=public, mac_keys=macs)


# --------------------------------------------------------------------------------------------
# Client signing keys (protocols whose call strategy is ENDORSEMENT)


def client_key_path(cluster_dir: Path, name: str) -> Path:
    """Where `phalanx cluster init` / `cluster client-key` put client `name`'s signing key."""
    return cluster_dir / "clients" / f"{name}.signing.key"


def generate_client_key(path: Path) -> bytes:
    """Write a fresh client signing key to `path` (mode 0600, refusing to overwrite); return
    its raw 32-byte Ed25519 public key (what the keyring holds)."""
    seed = secrets.token_bytes(_SEED_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(seed.hex() + "\n")
    return client_public_key(seed)


def client_public_key(seed: bytes) -> bytes:
    """The raw Ed25519 public key of the client key `seed`."""
    return _signing(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


_registered: list[bool] = []
"""Non-empty once `LEADERLESS_MESSAGES` are in the (process-wide, never reset) default
registry: registering checks every id and class again, ~0.3 ms a call (it ran per
signature check: a node checks every transaction's)."""


def _signed_bytes(obj: object) -> bytes:
    """What a client (and a node's `Ed25519Crypto`) signs: the codec's canonical bytes of
    `obj` without its signature."""
    if not _registered:
        wire.register_all(LEADERLESS_MESSAGES)  # idempotent
        _registered.append(True)
    return wire.canonical_bytes(obj, omit=_SIGNATURE_FIELDS)


class TransactionSigner:
    """A client's signing key: signs `Transaction`s as keyring entry `name`.

    Construct from a seed (`from_file` reads a key file)."""

    __slots__ = ("_name", "_secret", "public_key")

    def __init__(self, name: str, seed: bytes) -> None:
        if len(seed) != _SEED_BYTES:
            raise SigningKeyError(f"a client signing key is {_SEED_BYTES} bytes, got {len(seed)}")
        self._name = name
        self.public_key = client_public_key(seed)
        # libsodium's secret key: the seed followed by the public key.
        self._secret = seed + self.public_key

    @classmethod
    def from_file(cls, path: Path, name: str | None = None) -> TransactionSigner:
        """The key in `path`, named `name` (default: the file name before
        ``.signing.key``). Raises `SigningKeyError`."""
        if name is None:
            name = path.name.removesuffix(".signing.key")
        return cls(name, read_seed(path))

    @property
    def name(self) -> str:
        return self._name

    def signature(self, tx: Transaction) -> bytes:
        """The signature of `tx` (its own `signature` field is not covered)."""
        return sodium.crypto_sign(_signed_bytes(tx), self._secret)[:_SIGNATURE_BYTES]

    def sign(self, tx: Transaction) -> Transaction:
        """`tx` as this client, signed: `client` set to this key's name, `signature` filled."""
        named = tx if tx.client == self._name else dataclasses.replace(tx, client=self._name)
        return dataclasses.replace(named, signature=self.signature(named))


class _ClientVerifier:
    """`Verifier` over a client keyring (see `client_verifier`)."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = {name: bytes(key) for name, key in keys.items()}

    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        key = self._keys.get(node)
        if key is None or type(signature) is not bytes or len(signature) != _SIGNATURE_BYTES:
            return False
        try:
            sodium.crypto_sign_open(signature + _signed_bytes(obj), key)
        except (BadSignatureError, CryptoError, EncodeError, ValueError, TypeError):
            return False
        return True


def client_verifier(keys: Mapping[str, bytes]) -> Verifier:
    """A `Verifier` of client signatures: ``verify(NodeId(name), tx, tx.signature)`` is true
    when `name` is in the keyring `keys` (name -> raw Ed25519 public key, as
    `NodeConfig.client_keys`) and signed `tx` (what `TransactionSigner` signs). Never raises:
    an unknown name, a malformed key or signature, or an object the codec cannot encode is
    simply not verified."""
    return _ClientVerifier(keys)
