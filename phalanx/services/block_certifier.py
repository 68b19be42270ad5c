"""The block-certifier node service: signed block certificates collected on a real cluster.

Owns: `BlockCertifierService` (the `NodeService` the runtime host drives) and `build` (the
factory `phalanx.services.builtin.BLOCK_CERTIFIER` names).

How it runs: the node's application must be a `phalanx.apps.interface.BlockStream` (the
chain app); the service subscribes to it, so after every block the node's replica closes,
the node signs (chain id, height, block hash) with its node signing key (`[keys]
signing_key`) and sends the `BlockSignature` (466) to every peer over the existing mTLS
links. Every node's `phalanx.apps.chain.certificate.BlockCertifier` counts its own and its
peers' signatures; when one block reaches the quorum (`certificate_quorum` of the protocol
registry's fault model: n - f under Byzantine faults, a majority under crash faults) the
certificate goes to the node-local `CertificateStore` (``DATA/services/
block-certificates/``, fsynced every tick, bounded by ``keep``). Clients fetch it with a
`CertificateQuery` (`ServiceCall`, read-only role).

Peer input is normal input: forged, unknown-node, wrong-chain, stale, equivocating or
malformed signatures are dropped and counted (``dropped:<reason>`` on the metrics page),
never raised. A node whose machine is not a `BlockStream` (e.g. wrapped by a Byzantine test
mode) runs passive: it signs nothing and, not knowing the chain id, collects nothing
(peers' signatures drop as ``wrong_chain``); gauge ``signing`` = 0, logged.

Restarts: the store reloads (a torn tail never loads); the certifier restarts empty at the
checkpoint's height and re-signs the blocks the runtime re-applies from the log (peers
drop those as late or stale). A state transfer or checkpoint restore closes no block, so
every tick moves the certifier's window to the app's height (`BlockCertifier.reached`):
a node that caught up that way collects its peers' signatures of the new blocks.
Certificates of heights a node slept through (its peers' signatures were sent while it was
down) are fetched from peers (`phalanx.services.block_cert_fetch`): every tick it may ask
one peer for the stored certificates of up to 32 heights it holds blocks for but no
certificate, and keeps each one that verifies against its own block, the cluster's keys
and quorum (``fetched``; the rest ``dropped:<reason>``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.chain.certificate import (
    DEFAULT_WINDOW,
    BlockCertificate,
    BlockCertifier,
    BlockSignature,
    ed25519_signer,
    raw_public_key,
)
from phalanx.apps.interface import BlockStream
from phalanx.consensus.types import Message, NodeId
from phalanx.net.codec import EncodeError
from phalanx.ops.pki import CLIENT_ROLES
from phalanx.protocols import get as protocol_spec
from phalanx.services.block_cert_api import (
    CertificateAnswer,
    CertificateBatch,
    CertificateFetch,
    CertificateQuery,
    MissingNodeKey,
    certificate_quorum,
    node_public_keys,
)
from phalanx.services.block_cert_fetch import CertificateFetcher
from phalanx.services.block_cert_store import DIRECTORY, CertificateStore
from phalanx.services.spec import NodeService, SendFn, ServiceContext, ServiceError

logger = logging.getLogger(__name__)

READ_ONLY = CLIENT_ROLES[0]


class BlockCertifierService:
    """One node's block certifier (see the module docstring). `node.services[NAME]`."""

    def __init__(self, certifier: BlockCertifier, store: CertificateStore, *,
                 peers: tuple[NodeId, ...], send: SendFn, tick_seconds: float,
                 stream: BlockStream | None, fetcher: CertificateFetcher) -> None:
        self.certifier = certifier
        self.fetcher = fetcher
        self._stream = stream
        self.signing = stream is not None
        self.store = store
        self._peers = peers
        self._send = send
        self._tick_seconds = tick_seconds
        self._counts: dict[str, int] = {}

    # -- the block stream ---------------------------------------------------------------

    def on_block(self, height: int, block_hash: bytes) -> None:
        """The node closed block `height` (`BlockStream` listener): sign, send, count."""
        try:
            own, cert = self.certifier.local_block(height, block_hash)
        except ValueError:  # a height below the window after a long replay: nothing to do
            self._count("local_too_old")
            return
        self._count("signed")
        for peer in self._peers:
            try:
                if not self._send(peer, own):  # type: ignore[arg-type]  # a wire type
                    self._count("send_refused")
            except (ValueError, EncodeError):
                self._count("send_failed")
        if cert is not None:
            self._keep(cert)

    def _keep(self, cert: BlockCertificate) -> None:
        self._count("certified")
        try:
            if self.store.put(cert):
                self._count("stored")
        except OSError as e:
            self._count("store_errors")
            logger.error("block-certifier: cannot store the certificate of block %d: %s",
                         cert.height, e)

    # -- NodeService --------------------------------------------------------------------

    @property
    def tick_seconds(self) -> float:
        return self._tick_seconds

    def tick(self) -> None:
        if self._stream is not None:  # a checkpoint restore or state transfer calls no
            self.certifier.reached(self._stream.height)  # listener: follow the height
            request = self.fetcher.tick(self._stream.height, self._have)
            if request is not None:
                self._send_to(*request)
        try:
            self.store.sync()
        except OSError as e:
            self._count("store_errors")
            logger.error("block-certifier: fsync failed: %s", e)

    def receive(self, src: NodeId, message: Message) -> None:
        self._count("received")
        if isinstance(message, CertificateFetch):
            answer = self.fetcher.serve(message, self.store.get)
            if answer is not None and answer.certificates:
                self._send_to(src, answer)
            return
        if isinstance(message, CertificateBatch):
            if self._stream is None:
                self._count("fetch:dropped:passive")
                return
            for fetched in self.fetcher.answer(message, self._have, self._stream.block_hash_at):
                self._keep(fetched)
            return
        if not isinstance(message, BlockSignature):
            self.certifier.dropped["malformed"] = self.certifier.dropped.get("malformed", 0) + 1
            return
        cert = self.certifier.add(message)
        if cert is not None:
            self._keep(cert)

    def _have(self, height: int) -> bool:
        return self.store.get(height) is not None

    def _send_to(self, peer: NodeId, message: Message) -> None:
        try:
            if not self._send(peer, message):
                self._count("send_refused")
        except (ValueError, EncodeError):
            self._count("send_failed")

    def call(self, request: Message) -> Message:
        if isinstance(request, CertificateFetch):  # e.g. `phalanx chain export`
            answer = self.fetcher.serve(request, self.store.get)
            if answer is None:
                raise ValueError("a certificate fetch names at most 32 heights, each >= 1")
            return answer
        if not isinstance(request, CertificateQuery):
            raise ValueError(f"the block-certifier service does not serve "
                             f"{type(request).__name__}")
        if type(request.height) is not int or request.height < 0:
            raise ValueError("a certificate query names a height >= 0 (0: the newest)")
        height = request.height or self.store.newest
        return CertificateAnswer(height=height, certificate=self.store.get(height),
                                 quorum=self.certifier.quorum, newest=self.store.newest)

    def needed_role(self, request: Message) -> str:
        return READ_ONLY

    def counters(self) -> Mapping[str, int]:
        out = {f"dropped:{reason}": n for reason, n in self.certifier.dropped.items()}
        out.update(self._counts)
        out.update({f"fetch:{name}": n for name, n in self.fetcher.counts.items()})
        out["divergent"] = self.certifier.divergent
        out["torn_segments"] = self.store.torn
        out["bytes_stored"] = self.store.bytes_written
        return out

    def gauges(self) -> Mapping[str, int]:
        return {"certificates_stored": len(self.store), "newest_certified": self.store.newest,
                "held": self.certifier.held, "quorum": self.certifier.quorum,
                "signing": int(self.signing)}

    def close(self) -> None:
        self.store.close()

    def _count(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1


def build(context: ServiceContext) -> NodeService:
    """The registry's factory: the node's certifier from its config, keys and app."""
    from phalanx.ops.signing_keys import SigningKeyError, read_seed

    config, options = context.config, context.options
    hint = "(make the cluster with `phalanx cluster init --app chain`)"
    if config.keys is None:
        raise ServiceError(f"[block-certifier] needs the node's signing key ([keys] "
                           f"signing_key) {hint}")
    try:
        key = Ed25519PrivateKey.from_private_bytes(read_seed(config.keys.signing_key))
        keys = node_public_keys(config.peers)
    except (SigningKeyError, MissingNodeKey) as e:
        raise ServiceError(f"[block-certifier] needs every node's signing key: {e} {hint}"
                           ) from None
    keys[config.id] = raw_public_key(key.public_key())
    machine = context.machine
    stream = machine if isinstance(machine, BlockStream) else None
    chain_id = stream.block_id if stream is not None else bytes(32)
    quorum = certificate_quorum(protocol_spec(config.protocol).fault_model, len(keys))
    certifier = BlockCertifier(node=config.id, sign=ed25519_signer(key), chain_id=chain_id,
                               node_keys=keys, quorum=quorum,
                               window=int(options.get("window", DEFAULT_WINDOW)))
    store = CertificateStore(context.state_dir / DIRECTORY, keep=int(options["keep"]))
    peers = tuple(NodeId(p.id) for p in config.peers)
    fetcher = CertificateFetcher(peers=peers, node_keys=keys, quorum=quorum,
                                 chain_id=chain_id, keep=int(options["keep"]))
    service = BlockCertifierService(
        certifier, store, peers=peers, send=context.send,
        tick_seconds=int(options["tick_ms"]) / 1000, stream=stream, fetcher=fetcher)
    if stream is None:
        logger.warning("%s: block-certifier: the app's machine is not a BlockStream; this "
                       "node collects and serves certificates but signs no block", config.id)
    else:
        stream.on_block(service.on_block)
        certifier.reached(stream.height)  # restored from a checkpoint: collect around it
    logger.info("%s: block-certifier: quorum %d of %d, %d certificates stored (newest %d)",
                config.id, quorum, len(keys), len(store), store.newest)
    return service
