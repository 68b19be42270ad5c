"""The announce service: each cluster tells the nodes of every linked cluster its newest
certified stable checkpoint (issue 16 item 5b).

Owns: `AnnounceService` (the `NodeService` the host ticks and feeds), `build` (the
registry's factory), `announce_digest`, and the wire types `AnnounceSign` (620, inside the
announcing cluster) and `Announcement` (621, to linked clusters' nodes and inside the
receiving cluster). Its client operation (`phalanx announce status`) is
`phalanx.services.announce_api`'s.

What is announced: the node's newest durable checkpoint, (index, SHA-256 of its bytes), as
`phalanx.runtime.stable_checkpoints.StableCheckpoints` reads it (hashed off the event
loop). Each member signs it, once per linked cluster D, as a cluster-sending
`SendStatement(us, D, 0, index, announce_digest(index, state digest))` and sends the
signature (`AnnounceSign`) to its members; `cert_quorum` matching signatures (2f+1
Byzantine, a majority crash) make a `Certificate` of `phalanx.clustersend` (no new
signature scheme; the crash kind's notice is signed by the assembling member with term 0,
like clustersend's). The statement's digest is domain-separated (`phalanx-announce-v1`), so
a certified announcement never verifies as a cluster-sent value or the other way round.
Certificates need members to checkpoint at the SAME indexes: PBFT's aligned checkpoint
policy guarantees it; Raft's does not (it did in our runs with steady writes; idle
checkpoints and restarts can shift a member), see docs/GOSSIP.md.

How it spreads: every `interval` ticks EVERY member holding a certified announcement sends
it to `fanout` members of each linked cluster, rotating through them by round and by the
member's rank, so no one announcer matters (the f+1 or more honest members keep announcing
when some are dead or silent). A receiver that accepts a new highest announcement from a
linked node spreads it inside its own cluster: as a rumor of the node's gossip service when
it runs one (any service of the node that is a `RumorChannel`, found through the host's
`ServiceContext.services`: GP's n-1 contacts spread over the cluster instead of n-1 sends
from one node, and anti-entropy as the backstop), otherwise relayed once to every member
(n-1 sends). Either way one direct receipt covers the live cluster, and the rotation
reaches members a silent relay skipped at the next rounds. A rumor's payload is
`RUMOR_TAG` + the `Announcement`'s wire bytes; receivers verify it like any announcement
(rumors of other uses are ignored, an undecodable tagged one is ``dropped:bad_rumor``).

Receiving (Byzantine input is normal input): per linked cluster the service keeps the
highest verified announcement (monotonic). Stale ones (lower index) are dropped before
any signature check; malformed, uncertified or forged ones (`check_certificate` against
the linked cluster's public material only) are dropped and counted by reason
(``dropped:<reason>``); a second certified digest for the held index means the linked
cluster exceeded its fault bound: counted (``conflicting``), the first kept. Nothing is
persisted: after a restart the next round's announcements restore the view.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from phalanx.clustersend import (
    CLUSTERSEND_MESSAGES,
    Certificate,
    CertKind,
    ClusterInfo,
    CommitNotice,
    MemberSignature,
    SendStatement,
)
from phalanx.clustersend.certificates import check_certificate
from phalanx.consensus.types import Message, NodeId
from phalanx.gossip.messages import Rumor
from phalanx.net import wire
from phalanx.net.codec import DecodeError, EncodeError
from phalanx.net.crypto import Ed25519Crypto
from phalanx.net.intercluster import qualify, split_qualified
from phalanx.ops.pki import CLIENT_ROLES
from phalanx.protocols import get as protocol_spec
from phalanx.services.announce_api import AnnouncedCheckpoint, AnnounceStatus, AnnounceStatusCall
from phalanx.services.linked_keys import load_linked_keys, send_qualified
from phalanx.services.spec import SendFn, ServiceContext, ServiceError

logger = logging.getLogger(__name__)

CheckpointFn = Callable[[], "tuple[int, bytes] | None"]
"""The node's newest durable checkpoint: (index, SHA-256 of its bytes), or None."""

_DOMAIN = b"phalanx-announce-v1\x00"
_MAX_INDEX = 2**63 - 1
RUMOR_TAG = b"phalanx-announce-rumor-v1\x00"
"""Prefix of a gossip rumor that carries an `Announcement` (its wire bytes follow)."""


@runtime_checkable
class RumorChannel(Protocol):
    """A node service that spreads rumors inside the cluster (the gossip service,
    `phalanx.services.gossip_node.GossipService`)."""

    def publish(self, payload: bytes) -> object: ...

    def on_deliver(self, callback: Callable[[Rumor], None]) -> None: ...


def announce_digest(index: int, state_digest: bytes) -> bytes:
    """What a member's `SendStatement.digest` is for checkpoint `index` with `state_digest`."""
    return hashlib.sha256(_DOMAIN + index.to_bytes(8, "big") + state_digest).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnounceSign(Message):
    """A member's signature over its cluster's checkpoint statement (inside the cluster)."""

    statement: SendStatement
    state_digest: bytes
    signature: MemberSignature


@dataclass(frozen=True, slots=True, kw_only=True)
class Announcement(Message):
    """A cluster's certified stable checkpoint: the state after `index` has `state_digest`
    (the certificate's statement names the announcing and the receiving cluster)."""

    index: int
    state_digest: bytes
    certificate: Certificate


ANNOUNCE_MESSAGES: Mapping[int, type] = {620: AnnounceSign, 621: Announcement}
"""The service's peer wire types (the certificate's types are clustersend's, 600-605)."""


@dataclass(frozen=True, slots=True)
class Verified:
    """The highest verified announcement of one linked cluster, and when it arrived here."""

    index: int
    state_digest: bytes
    certificate: Certificate
    tick: int
    wall: float


@dataclass(slots=True)
class _Collecting:
    statement: SendStatement
    state_digest: bytes
    signatures: dict[NodeId, bytes]


class AnnounceService:
    """See the module docstring. `node.services["announce"]`; `highest` is the view of the
    linked clusters, `certified` our own newest certified announcement per linked cluster."""

    def __init__(self, *, me: NodeId, cluster: ClusterInfo, linked: tuple[ClusterInfo, ...],
                 crypto: Ed25519Crypto, send: SendFn, checkpoint: CheckpointFn,
                 wall_clock: Callable[[], float], tick_seconds: float, interval: int,
                 fanout: int, services: Mapping[str, object] | None = None) -> None:
        self.me = me
        self.cluster = cluster
        self.linked = {c.cluster_id: c for c in linked}
        self._crypto = crypto
        self._send = send
        self._checkpoint = checkpoint
        self._wall = wall_clock
        self._tick_seconds = tick_seconds
        self._interval = interval
        self._fanout = fanout
        self._rank = sorted(cluster.members).index(me)
        self._members = frozenset(cluster.members)
        self._ticks = 0
        self._round = 0
        self._signed_index = -1
        self._collecting: dict[tuple[str, int], _Collecting] = {}
        self._early: dict[tuple[str, NodeId], AnnounceSign] = {}
        """Each member's newest signature for an index we have not signed (one per member
        and linked cluster: bounded)."""
        self.certified: dict[str, Announcement] = {}
        self.certified_at: dict[tuple[str, int], float] = {}
        """(linked cluster, index) -> wall time we certified it (latency probes)."""
        self.highest: dict[str, Verified] = {}
        self._counters: dict[str, int] = {}
        self._services = services
        self._channel: RumorChannel | None = None
        self._looked = False

    # -- the NodeService protocol ------------------------------------------------------------

    @property
    def tick_seconds(self) -> float:
        return self._tick_seconds

    def tick(self) -> None:
        self._ticks += 1
        if not self._looked:  # every service is built by the first tick
            self._looked = True
            self._attach()
        newest = self._checkpoint()
        if newest is not None and newest[0] > self._signed_index:
            self._sign(*newest)
        if self._ticks % self._interval == 0:
            self._announce_all()

    def receive(self, src: NodeId, message: Message) -> None:
        name, cluster = split_qualified(src)
        qualified = qualify(name, cluster or self.cluster.cluster_id)
        if isinstance(message, AnnounceSign):
            self._on_sign(qualified, message)
        elif isinstance(message, Announcement):
            self._on_announcement(qualified, message, from_linked=cluster is not None)

    def call(self, request: Message) -> Message:
        if not isinstance(request, AnnounceStatusCall):
            raise ValueError(f"the announce service does not serve {type(request).__name__}")
        return self.status()

    def needed_role(self, request: Message) -> str:
        return CLIENT_ROLES[0]  # read-only

    def counters(self) -> Mapping[str, int]:
        return dict(self._counters)

    def gauges(self) -> Mapping[str, int]:
        out = {"signed_index": self._signed_index}
        for dst, ann in self.certified.items():
            out[f"certified_index:{dst}"] = ann.index
        for src, v in self.highest.items():
            out[f"highest_index:{src}"] = v.index
        return out

    def close(self) -> None:
        close = getattr(self._checkpoint, "close", None)  # StableCheckpoints' hashing thread
        if callable(close):
            close()

    def status(self) -> AnnounceStatus:
        """What `phalanx announce status` shows for this node."""
        certified = tuple(AnnouncedCheckpoint(
            cluster=dst, index=a.index, state_digest=a.state_digest,
            unix_ms=int(1000 * self.certified_at.get((dst, a.index), 0.0)))
            for dst, a in sorted(self.certified.items()))
        received = tuple(AnnouncedCheckpoint(cluster=src, index=v.index,
                                             state_digest=v.state_digest,
                                             unix_ms=int(1000 * v.wall))
                         for src, v in sorted(self.highest.items()))
        return AnnounceStatus(node=split_qualified(self.me)[0],
                              cluster=self.cluster.cluster_id,
                              signed_index=self._signed_index, certified=certified,
                              received=received, counters=tuple(sorted(self._counters.items())))

    # -- announcing: checkpoint -> signatures -> certificate -> linked clusters -------------

    def _count(self, name: str) -> None:
        self._counters[name] = self._counters.get(name, 0) + 1

    def _sign(self, index: int, state_digest: bytes) -> None:
        self._signed_index = index
        self._count("signed")
        for dst in sorted(self.linked):
            st = SendStatement(src_cluster=self.cluster.cluster_id, dst_cluster=dst, epoch=0,
                               seq=index, digest=announce_digest(index, state_digest))
            mine = self._crypto.sign(st)
            coll = self._collecting[(dst, index)] = _Collecting(st, state_digest,
                                                                {self.me: mine})
            sign = AnnounceSign(statement=st, state_digest=state_digest,
                                signature=MemberSignature(signer=self.me, sig=mine))
            for member in sorted(self._members - {self.me}):
                self._send_to(member, sign)
            for member in sorted(self._members):
                early = self._early.get((dst, member))
                if early is not None and early.statement.seq == index:
                    del self._early[(dst, member)]
                    self._add(coll, member, early)
            self._maybe_certify(dst, coll)
        for key in [k for k in self._collecting if k[1] < index]:
            del self._collecting[key]  # a newer checkpoint supersedes an uncertified one

    def _on_sign(self, src: NodeId, message: AnnounceSign) -> None:
        st = message.statement
        if src not in self._members or message.signature.signer != src:
            self._count("dropped:sign_not_member")
            return
        if st.src_cluster != self.cluster.cluster_id or st.dst_cluster not in self.linked:
            self._count("dropped:sign_wrong_cluster")
            return
        coll = self._collecting.get((st.dst_cluster, st.seq))
        if coll is None:
            if st.seq > self._signed_index:
                self._early[(st.dst_cluster, src)] = message  # we have not got there yet
            return  # else: an index we skipped or already superseded
        self._add(coll, src, message)
        self._maybe_certify(st.dst_cluster, coll)

    def _add(self, coll: _Collecting, src: NodeId, message: AnnounceSign) -> None:
        if message.statement != coll.statement:
            self._count("dropped:sign_other_digest")
            return
        if src in coll.signatures:
            return
        if not self._crypto.verify(src, coll.statement, message.signature.sig):
            self._count("dropped:sign_bad_signature")
            return
        coll.signatures[src] = message.signature.sig

    def _maybe_certify(self, dst: str, coll: _Collecting) -> None:
        info = self.cluster
        index = coll.statement.seq
        held = self.certified.get(dst)
        if len(coll.signatures) < info.cert_quorum or (held is not None and held.index >= index):
            return
        st = coll.statement
        sigs = tuple(MemberSignature(signer=s, sig=coll.signatures[s])
                     for s in sorted(coll.signatures)[:info.cert_quorum])
        if info.kind == CertKind.BYZANTINE:
            cert = Certificate(kind=info.kind, statement=st, signatures=sigs)
        else:  # the assembler signs the crash kind's notice, term 0 (see clustersend_node)
            notice = CommitNotice(statement=st, term=0, leader=self.me)
            cert = Certificate(kind=info.kind, statement=st, signatures=sigs, term=0,
                               leader=self.me, leader_sig=self._crypto.sign(notice))
        ann = Announcement(index=index, state_digest=coll.state_digest, certificate=cert)
        self.certified[dst] = ann
        self.certified_at.setdefault((dst, index), self._wall())
        self._count("certified")
        self._announce(dst, ann)  # at once: the periodic rounds are the backstop

    def _announce_all(self) -> None:
        self._round += 1
        for dst in sorted(self.certified):
            self._announce(dst, self.certified[dst])

    def _announce(self, dst: str, ann: Announcement) -> None:
        members = sorted(self.linked[dst].members)
        n = len(members)
        start = (self._round + self._rank) * self._fanout
        for to in sorted({members[(start + j) % n] for j in range(min(self._fanout, n))}):
            self._send_to(to, ann)
            self._count("announced")

    # -- receiving ---------------------------------------------------------------------------

    def _on_announcement(self, src: NodeId, ann: Announcement, *, from_linked: bool) -> None:
        st = ann.certificate.statement
        origin = st.src_cluster
        if origin not in self.linked:
            self._count("dropped:unknown_cluster")
            return
        if not 0 <= ann.index <= _MAX_INDEX or st.seq != ann.index:
            self._count("dropped:bad_index")
            return
        if len(ann.state_digest) != 32:
            self._count("dropped:bad_digest")
            return
        held = self.highest.get(origin)
        if held is not None and ann.index < held.index:
            self._count("dropped:stale")
            return
        if held is not None and ann.index == held.index and ann.state_digest == held.state_digest:
            self._count("duplicate")
            return
        reason = check_certificate(
            ann.certificate, value_digest=announce_digest(ann.index, ann.state_digest),
            dst_cluster=self.cluster.cluster_id, clusters=self.linked, verifier=self._crypto)
        if reason is not None:
            self._count(f"dropped:{reason}")
            return
        if held is not None and ann.index == held.index:
            self._count("conflicting")  # two certified digests: the origin broke its bound
            return
        self.highest[origin] = Verified(ann.index, ann.state_digest, ann.certificate,
                                        self._ticks, self._wall())
        self._count("accepted")
        if from_linked:
            self._spread(ann)

    # -- spreading inside our cluster: gossip when the node runs it, else n-1 sends ----------

    def _attach(self) -> None:
        """Find the node's rumor-spreading service, if any, and listen to its rumors."""
        for name in sorted(self._services or {}):
            service = (self._services or {})[name]
            if service is not self and isinstance(service, RumorChannel):
                self._channel = service
                service.on_deliver(self._on_rumor)
                logger.info("%s: announce: spreading inside the cluster through %s",
                            self.me, name)
                return

    def _spread(self, ann: Announcement) -> None:
        if self._channel is not None:
            try:
                self._channel.publish(RUMOR_TAG + wire.encode(ann))
                self._count("gossiped")
                return
            except (ValueError, EncodeError):  # larger than the service's max_payload
                self._count("gossip_refused")
        for member in sorted(self._members - {self.me}):
            self._send_to(member, ann)
            self._count("relayed")

    def _on_rumor(self, rumor: Rumor) -> None:
        """A rumor delivered by the gossip service: ours if tagged, verified like any."""
        if not rumor.payload.startswith(RUMOR_TAG):
            return  # another use of gossip
        try:
            ann = wire.decode(rumor.payload[len(RUMOR_TAG):], expected=Announcement)
        except DecodeError:
            self._count("dropped:bad_rumor")
            return
        self._count("rumor_received")
        self._on_announcement(qualify(rumor.origin, self.cluster.cluster_id), ann,
                              from_linked=False)

    def _send_to(self, node: NodeId, message: Message) -> None:
        send_qualified(self._send, self.cluster.cluster_id, node, message, self._count)


def build(context: ServiceContext) -> AnnounceService:
    """The registry's factory (see the module docstring)."""
    config = context.config
    if context.checkpoint is None:
        raise ServiceError("[announce] needs the node's checkpoints (run it in a node)")
    keys = load_linked_keys(config, "announce", protocol_spec(config.protocol).fault_model,
                            {**CLUSTERSEND_MESSAGES, **ANNOUNCE_MESSAGES})
    cluster, linked, crypto, me = keys.cluster, keys.linked, keys.crypto, keys.me
    options = context.options
    logger.info("%s: announce: cluster %s (n=%d, f=%d) to %s", config.id, cluster.cluster_id,
                cluster.n, cluster.f,
                ", ".join(c.cluster_id for c in linked) or "no linked cluster")
    return AnnounceService(me=me, cluster=cluster, linked=tuple(linked), crypto=crypto,
                           send=context.send, checkpoint=context.checkpoint,
                           wall_clock=context.wall_clock,
                           tick_seconds=int(options["tick_ms"]) / 1000,
                           interval=int(options["interval"]), fanout=int(options["fanout"]),
                           services=context.services)
