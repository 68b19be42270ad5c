"""Block certificates: a quorum of replicas' Ed25519 signatures over an executed block.

Owns: `BlockSignature` (one node's signature of (chain id, height, block hash), what a node
broadcasts after `end_batch`), `BlockCertificate` (a quorum of them, the block's consensus
proof), `BlockCertifier` (collects signatures into certificates), `verify_certificate`, the
quorum sizes, the encoding into `BlockHeader.consensus_proof`, and the codec type ids 466-467.

Must not import: consensus cores, storage, trio, clocks. Sans-IO: keys come in as a signing
callable and a map of raw 32-byte public keys, messages go out as return values.

What is signed: ``b"phalanx.chain.block.v1\\x00" || chain_id (32) || height (u64 BE) ||
block_hash (32)``: fixed-length fields, so the bytes name exactly one (chain, height,
block); the domain prefix keeps them from being any other signed structure of the project.
An honest node signs only the block it executed itself at that height (`local_block`), so it
signs at most one hash per height.

What a certificate proves (`quorum` is the caller's, from the fault model):
- Byzantine protocols (PBFT): `byzantine_quorum(n)` = n - f signatures, 2f+1 when n = 3f+1.
  With at most f faulty nodes, at least f+1 honest replicas executed this block at this
  height; two such quorums share at least one honest node, which signs one hash per height,
  so no certificate for another block at this height can exist.
- Crash-fault protocols (Raft): `crash_quorum(n)`, a majority. It proves that a majority of
  the nodes applied the block, so it survives the loss of any minority. It proves nothing
  against a lying node: under Raft a Byzantine leader can make followers apply (and sign)
  whatever it ordered, and the signers are trusted to be honest.

Invariants:
- `verify_certificate` and `BlockCertifier.add` never raise on any input (peers' messages are
  input): forged, unknown-node, wrong-chain, wrong-height, out-of-window, duplicate or
  equivocating signatures never count; each is dropped and counted in `BlockCertifier.dropped`.
- A certificate is canonical: its (node, signature) pairs are sorted by node, unique, every
  signature valid; `verify_certificate` refuses any other form.
- The certificate is NOT part of `block_hash` (it attests the hash); `attach` puts its
  encoding in `BlockHeader.consensus_proof`. Certificates differ between nodes (which quorum
  answered first), so they are node-local data, never replicated state.
- Bounded memory: the certifier keeps signatures only for heights within `window` of its
  own last executed block (ahead and behind) and of its last certificate (behind):
  O(window * n) entries whatever peers send.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from nacl import bindings as sodium
from nacl.exceptions import BadSignatureError, CryptoError

from phalanx.apps.chain.block import BlockHeader, block_hash
from phalanx.consensus.quorum import byzantine_quorum, majority
from phalanx.net.codec import DecodeError
from phalanx.net.wire import default_registry, register_all

_DOMAIN = b"phalanx.chain.block.v1\x00"
SIGNATURE_BYTES = 64
HASH_BYTES = 32
DEFAULT_WINDOW = 256
"""Heights the certifier keeps signatures for, ahead of (and behind) its last executed
block and behind its last certificate."""

Sign = Callable[[bytes], bytes]
"""A node's signing key as a callable: message bytes -> 64-byte Ed25519 signature."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockSignature:
    """Node `node` executed block `block_hash` at `height` of chain `chain_id`."""

    chain_id: bytes
    height: int
    block_hash: bytes
    node: str
    signature: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCertificate:
    """A quorum's signatures of (chain id, `height`, `block_hash`): (node, signature) pairs
    sorted by node. The chain id is not carried: the verifier supplies its own."""

    height: int
    block_hash: bytes
    signatures: tuple[tuple[str, bytes], ...]


CERTIFICATE_TYPE_IDS: dict[int, type] = {466: BlockSignature, 467: BlockCertificate}
_REGISTRY = default_registry()
register_all(CERTIFICATE_TYPE_IDS)


# --- quorums ---------------------------------------------------------------------------

def byzantine_certificate_quorum(n: int) -> int:
    """Signatures a certificate needs under Byzantine faults: n - f (2f+1 when n = 3f+1)."""
    return byzantine_quorum(n)


def crash_certificate_quorum(n: int) -> int:
    """Signatures a certificate needs under crash faults (Raft): a majority."""
    return majority(n)


# --- signing and verifying one signature -----------------------------------------------

def signed_bytes(chain_id: bytes, height: int, block_hash: bytes) -> bytes:
    """What a `BlockSignature` signs. Raises ValueError on values no block has."""
    if len(chain_id) != HASH_BYTES or len(block_hash) != HASH_BYTES:
        raise ValueError("chain id and block hash are 32 bytes")
    if not 1 <= height < 1 << 64:
        raise ValueError(f"height {height} is not a block height")
    return _DOMAIN + chain_id + height.to_bytes(8, "big") + block_hash


def ed25519_signer(private_key: Ed25519PrivateKey) -> Sign:
    """A `Sign` callable over a node's Ed25519 private key."""
    return private_key.sign


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    """The raw 32 bytes `node_keys` maps node ids to."""
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def sign_block(*, node: str, chain_id: bytes, height: int, block_hash: bytes, sign: Sign
               ) -> BlockSignature:
    return BlockSignature(chain_id=chain_id, height=height, block_hash=block_hash, node=node,
                          signature=sign(signed_bytes(chain_id, height, block_hash)))


def _valid(public_key: bytes | None, signature: object, message: bytes) -> bool:
    if public_key is None or type(signature) is not bytes or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        sodium.crypto_sign_open(signature + message, public_key)
    except (BadSignatureError, CryptoError, ValueError, TypeError):
        return False
    return True


def _message(chain_id: object, height: object, block: object) -> bytes | None:
    """`signed_bytes` of peer-supplied values, or None when they cannot name a block."""
    if not (type(chain_id) is bytes and type(height) is int and type(block) is bytes):
        return None
    try:
        return signed_bytes(chain_id, height, block)
    except ValueError:
        return None


# --- certificates ----------------------------------------------------------------------

def verify_certificate(cert: object, header: object, node_public_keys: Mapping[str, bytes],
                       quorum: int, *, chain_id: bytes) -> bool:
    """Whether `cert` holds at least `quorum` valid signatures, by distinct nodes of
    `node_public_keys` (node id -> raw Ed25519 key), of (`chain_id`, `header.height`,
    `block_hash(header)`), in canonical form (sorted by node, every signature valid).

    Never raises on `cert`/`header` (input); raises ValueError when `quorum` < 1 or exceeds
    the number of keys (our misuse: such a quorum proves nothing or can never be met)."""
    check_quorum(quorum, node_public_keys)
    if not isinstance(header, BlockHeader):
        return False
    return verify_block_certificate(cert, header.height, _hash_or_none(header),
                                    node_public_keys, quorum, chain_id=chain_id)


def verify_block_certificate(cert: object, height: int, block_hash: bytes | None,
                             node_public_keys: Mapping[str, bytes], quorum: int, *,
                             chain_id: bytes) -> bool:
    """`verify_certificate` against a block known by its `height` and `block_hash` (e.g. a
    node's own block, when a peer sends it a certificate). Never raises on `cert`; raises
    ValueError on a quorum outside 1..len(node_public_keys) (our misuse)."""
    check_quorum(quorum, node_public_keys)
    if not isinstance(cert, BlockCertificate) or block_hash is None:
        return False
    if cert.height != height or cert.block_hash != block_hash:
        return False
    message = _message(chain_id, cert.height, cert.block_hash)
    sigs = cert.signatures
    if message is None or type(sigs) is not tuple or len(sigs) < quorum:
        return False
    last = None
    for pair in sigs:
        if not (type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str):
            return False
        node, signature = pair
        if last is not None and node <= last:
            return False  # not sorted, or a node twice
        last = node
        if not _valid(node_public_keys.get(node), signature, message):
            return False
    return True


def encode_certificate(cert: BlockCertificate) -> bytes:
    return _REGISTRY.encode(cert)


def decode_certificate(data: object) -> BlockCertificate | None:
    """The certificate `data` encodes, or None (never raises)."""
    if type(data) is not bytes:
        return None
    try:
        cert = _REGISTRY.decode(data, expected=BlockCertificate)
    except DecodeError:
        return None
    return cert if isinstance(cert, BlockCertificate) else None


def attach(header: BlockHeader, cert: BlockCertificate) -> BlockHeader:
    """`header` with `cert` as its consensus proof (its `block_hash` is unchanged). Raises
    ValueError when `cert` is for another block (our misuse)."""
    if cert.height != header.height or cert.block_hash != block_hash(header):
        raise ValueError("the certificate is for another block")
    return dataclasses.replace(header, consensus_proof=encode_certificate(cert))


def certificate_of(header: BlockHeader) -> BlockCertificate | None:
    """The certificate in `header.consensus_proof`, or None."""
    return decode_certificate(header.consensus_proof)


def verify_header(header: object, node_public_keys: Mapping[str, bytes], quorum: int, *,
                  chain_id: bytes) -> bool:
    """Whether `header.consensus_proof` is a certificate of `header` (`verify_certificate`)."""
    if not isinstance(header, BlockHeader):
        return False
    return verify_certificate(decode_certificate(header.consensus_proof), header,
                              node_public_keys, quorum, chain_id=chain_id)


def _hash_or_none(header: BlockHeader) -> bytes | None:
    try:
        return block_hash(header)
    except Exception:  # a hostile header with ill-typed fields does not encode
        return None


def check_quorum(quorum: int, node_public_keys: Mapping[str, bytes]) -> None:
    """Raises ValueError unless 1 <= quorum <= len(node_public_keys)."""
    if type(quorum) is not int or not 1 <= quorum <= len(node_public_keys):
        raise ValueError(f"quorum {quorum!r} must be in 1..{len(node_public_keys)} (the "
                         "number of node keys)")


# --- collecting signatures -------------------------------------------------------------

class BlockCertifier:
    """Collects `BlockSignature`s into `BlockCertificate`s for one node (sans-IO).

    Inputs: `local_block(height, block_hash)` after this node's `end_batch` (returns this
    node's signature to broadcast, and a certificate if peers' signatures already made a
    quorum); `add(signature)` for each peer's message (returns a certificate when this
    signature completes a quorum for its block, once per height). Outputs are return values.

    Args:
        node: this node's id (a key of `node_keys`).
        sign: this node's signing key.
        chain_id: the chain's id (`block.chain_id(genesis)`).
        node_keys: every replica's raw Ed25519 public key, by node id.
        quorum: `byzantine_certificate_quorum(n)` or `crash_certificate_quorum(n)`.
        window: how many heights ahead of its own last block (and behind its last
            certificate) it keeps signatures for: memory is O(window * n).
    """

    def __init__(self, *, node: str, sign: Sign, chain_id: bytes,
                 node_keys: Mapping[str, bytes], quorum: int,
                 window: int = DEFAULT_WINDOW) -> None:
        check_quorum(quorum, node_keys)
        if node not in node_keys or len(chain_id) != HASH_BYTES or window < 1:
            raise ValueError("node must be a key of node_keys, chain_id 32 bytes, window >= 1")
        self._node, self._sign, self._chain_id = node, sign, chain_id
        self._keys = dict(node_keys)
        self._quorum, self._window = quorum, window
        self._local_height = 0
        self._floor = 0
        """Heights <= floor are forgotten (dropped as stale)."""
        self._local: dict[int, bytes] = {}
        self._by_node: dict[int, dict[str, bytes]] = {}
        """height -> node -> the block hash it signed (one per node and height)."""
        self._pending: dict[tuple[int, bytes], dict[str, bytes]] = {}
        """(height, block hash) -> node -> signature."""
        self._certified: dict[int, BlockCertificate] = {}
        self.dropped: dict[str, int] = {}
        """Signatures that did not count, by reason: malformed, wrong_chain, unknown_node,
        stale, ahead, bad_signature, duplicate, equivocation, late (statistics)."""
        self.divergent = 0
        """Certificates formed for a block other than the one this node executed at that
        height (this node diverged from a quorum: a bug or a disk fault worth alarming)."""

    @property
    def quorum(self) -> int:
        return self._quorum

    @property
    def held(self) -> int:
        """Entries held (heights and signatures): O(window * n) whatever peers send."""
        return (len(self._local) + len(self._certified)
                + sum(len(v) for v in self._by_node.values())
                + sum(len(v) for v in self._pending.values()))

    def certificate(self, height: int) -> BlockCertificate | None:
        """The certificate formed at `height`, while it is inside the window."""
        return self._certified.get(height)

    def local_block(self, height: int, block_hash: bytes
                    ) -> tuple[BlockSignature, BlockCertificate | None]:
        """This node executed `block_hash` at `height`: sign it (the message to broadcast)
        and count the signature. Raises ValueError when called twice for a height with
        different hashes or for a height at or below the forgotten floor (our misuse)."""
        if self._local.get(height, block_hash) != block_hash or height <= self._floor:
            raise ValueError(f"local_block({height}) again with another hash, or too old")
        own = sign_block(node=self._node, chain_id=self._chain_id, height=height,
                         block_hash=block_hash, sign=self._sign)
        self._local[height] = block_hash
        self._local_height = max(self._local_height, height)
        cert = self._certified.get(height)
        if cert is not None and cert.block_hash != block_hash:
            self.divergent += 1
        result = self.add(own)
        self._advance_floor(self._local_height - self._window)
        return own, result

    def reached(self, height: int) -> None:
        """This node's state is at block `height` without it having executed every block up
        to it here (restored from a checkpoint, installed by state transfer): collect
        peers' signatures around `height` (the window moves) without signing anything."""
        if height > self._local_height:
            self._local_height = height
            self._advance_floor(height - self._window)

    def add(self, sig: object) -> BlockCertificate | None:
        """Count a peer's (or this node's) signature; the certificate it completes, if any."""
        reason = self._check(sig)
        if reason is not None:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1
            return None
        assert isinstance(sig, BlockSignature)  # _check returned None
        height, block = sig.height, sig.block_hash
        self._by_node.setdefault(height, {})[sig.node] = block
        signers = self._pending.setdefault((height, block), {})
        signers[sig.node] = sig.signature
        if len(signers) < self._quorum:
            return None
        cert = BlockCertificate(height=height, block_hash=block,
                                signatures=tuple(sorted(signers.items())))
        self._certified[height] = cert
        if self._local.get(height, block) != block:
            self.divergent += 1
        for key in [k for k in self._pending if k[0] == height]:
            del self._pending[key]
        self._advance_floor(height - self._window)
        return cert

    def _check(self, sig: object) -> str | None:
        if not isinstance(sig, BlockSignature) or type(sig.node) is not str:
            return "malformed"
        message = _message(sig.chain_id, sig.height, sig.block_hash)
        if message is None:
            return "malformed"
        if sig.chain_id != self._chain_id:
            return "wrong_chain"
        key = self._keys.get(sig.node)
        if key is None:
            return "unknown_node"
        if sig.height <= self._floor:
            return "stale"
        if sig.height > self._local_height + self._window:
            return "ahead"
        if sig.height in self._certified:
            return "late"
        signed = self._by_node.get(sig.height, {}).get(sig.node)
        if signed == sig.block_hash:
            return "duplicate"  # counted already (checked before the costly verification)
        if not _valid(key, sig.signature, message):
            return "bad_signature"
        return None if signed is None else "equivocation"

    def _advance_floor(self, floor: int) -> None:
        if floor <= self._floor:
            return
        self._floor = floor
        for table in (self._local, self._by_node, self._certified):
            for h in [h for h in table if h <= floor]:
                del table[h]
        for key in [k for k in self._pending if k[0] <= floor]:
            del self._pending[key]
