"""The sans-IO cluster-sending machine: one replica's sending and receiving side of PCS.

Owns: `ClusterSendConfig`, the inputs `Outbound` (plus `phalanx.consensus.core`'s `Receive`
and `Tick`), the output bundle `ClusterSendReady`, `Confirmed`, and `ClusterSendMachine`, which
a driver runs beside the replica's consensus core (the simulator `phalanx.clustersend.sim`,
later the trio runtime, over the codec types of `phalanx.clustersend.messages`).

Contract (as the cores', `phalanx.consensus.core`): ``ready = machine.step(input)``.
- `Outbound(value, certificate)`: our cluster's ordering committed "send `value` to the
  certificate's receiving cluster as its seq"; every member of the sending cluster inputs it.
- `Receive(src, msg)`: a message of a member of our cluster or of a linked cluster,
  authenticated by the transport; may be Byzantine.
- `Tick()`: one logical tick; timeouts are counted in ticks.
Output `ClusterSendReady`: `sends` (any order, best effort), `deliver` (certified values of
other clusters for our ordering: each (sending cluster, seq) once, in seq order per sending
cluster), `confirmed` (our sends proven received), `counters` (this step's increments).
Nothing to persist beyond what the ordering persists: after a restart the driver feeds the
committed-but-unconfirmed `Outbound`s again and tells the machine how far its ordering
already holds each linked cluster's values (`resume_delivery`).

Protocol (protocols.md §2.5-2.7): attempt i of (dst, seq) names its pairs by
`pairs.schedule`; a member that is the sender of a pair sends `CsSend` to its receiver. A
receiver verifies the certificate, delivers, echoes it to its cluster (`CsEcho`) and
broadcasts a signed `CsAck`; f2+1 acks form an `AckProof`, sent back (`CsConfirm`) to the
sender, which relays it inside its cluster. Any member without the proof after
`attempt_timeout` ticks asks its peers for it (`CsQuery`) and moves to attempt i+1
(doubling the timeout, up to `max_timeout`, after `backoff_after` attempts). A receiver
that already holds the proof answers a `CsSend` with it at once. A member re-echoes a held
value to members whose ack it has not seen (doubling, capped), and answers a repeated echo
with its ack, so loss inside the receiving cluster heals.

Delivery rule: a receiving member delivers the seq-k value of a sending cluster after
every seq < k of that cluster; later ones wait in a buffer (the sending cluster sends every
seq until it is confirmed, so a gap always fills).

Rules: no I/O, clocks or randomness (pairs come from SHA-256 of the certified statement);
deterministic for a given input sequence; a bad message is dropped and counted by reason
(`status()["dropped:<reason>"]`), never raised. Our misuse (a bad config, an `Outbound`
whose certificate our own cluster did not make) raises `ValueError`.

Bug switches (test-only, `BUGS`; the simulator's checker must catch each):
``accept_uncertified`` (a receiver that skips certificate verification) and
``never_retry`` (a sender that makes only attempt 0).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.clustersend.certificates import (
    ClusterInfo,
    ack_statement,
    check_certificate,
    check_proof,
    sign_as,
)
from phalanx.clustersend.messages import (
    AckProof,
    AckStatement,
    Certificate,
    CsAck,
    CsConfirm,
    CsEcho,
    CsQuery,
    CsSend,
    Inbound,
    MemberSignature,
    value_digest,
)
from phalanx.clustersend.pairs import Mode, link_seed, schedule
from phalanx.consensus.core import Receive, Send, Tick
from phalanx.consensus.crypto import Signer, Verifier
from phalanx.consensus.types import Message, NodeId

BUGS = frozenset({"accept_uncertified", "never_retry"})
"""Test-only bug switches (the simulator's checker must catch each)."""

MAX_ATTEMPT = 1 << 20
"""A claimed attempt number above this is malformed (no correct sender gets there)."""

MAX_AHEAD = 1024
"""Acks are kept only for seqs below a sending cluster's next undelivered seq plus this:
Byzantine members could otherwise fill the table with acks for seqs that will never come."""

MAX_ACK_DIGESTS = 4
"""Distinct digests whose acks a member keeps per (sending cluster, seq): one is honest;
Byzantine members could otherwise grow the table without bound."""


class SendCrypto(Signer, Verifier, Protocol):
    """What the machine needs: sign our acks, verify both clusters' members (`FastCrypto` in
    the simulator; `Ed25519Crypto` holding the linked cluster's public keys in the runtime)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSendConfig:
    """Knobs, in ticks. `attempt_timeout` should cover two inter-cluster latencies plus the
    receiving cluster's echo and ack round (the simulator's default latencies: 10 and 1).

    Attributes:
        mode: how pairs are drawn (`pairs.Mode`).
        attempt_timeout: ticks without a proof before the next attempt.
        backoff_after: attempts after which the timeout doubles (0: 2*(f1+f2+1)).
        max_timeout: the cap of the doubling.
        echo_retry: first re-echo interval inside the receiving cluster (doubles, capped at
            `max_timeout`).
        bugs: test-only bug switches (`BUGS`).
    """

    mode: Mode = Mode.PCS
    attempt_timeout: int = 28
    backoff_after: int = 0
    max_timeout: int = 400
    echo_retry: int = 6
    bugs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.attempt_timeout < 1 or self.echo_retry < 1 or self.backoff_after < 0:
            raise ValueError("attempt_timeout and echo_retry must be >= 1, backoff_after >= 0")
        if self.max_timeout < self.attempt_timeout:
            raise ValueError("max_timeout must be >= attempt_timeout")
        if not self.bugs <= BUGS:
            raise ValueError(f"unknown bugs {sorted(self.bugs - BUGS)}; known: {sorted(BUGS)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Outbound:
    """Input: our cluster committed "send `value`" with this certificate (made by our cluster,
    e.g. from the commit's signatures: `certificates.certify`)."""

    value: bytes
    certificate: Certificate


@dataclass(frozen=True, slots=True, kw_only=True)
class Confirmed:
    """Output: our `seq`-th value to `dst_cluster` is proven received there (`proof`)."""

    dst_cluster: str
    seq: int
    proof: AckProof


ClusterSendInput = Receive | Tick | Outbound


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSendReady:
    sends: tuple[Send, ...] = ()
    deliver: tuple[Inbound, ...] = ()
    confirmed: tuple[Confirmed, ...] = ()
    counters: tuple[tuple[str, int], ...] = ()


_EMPTY = ClusterSendReady()
_Key = tuple[str, int]  # (the other cluster, seq)


@dataclass(slots=True)
class _Out:
    """One of our values being sent."""

    value: bytes
    cert: Certificate
    digest: bytes
    seed: bytes
    attempt: int = 0
    timeout: int = 0
    deadline: int = 0
    proof: AckProof | None = None


@dataclass(slots=True)
class _Held:
    """One certified value of another cluster we delivered (or hold for delivery)."""

    value: bytes
    cert: Certificate
    digest: bytes
    unacked: dict[NodeId, None]  # members we have not seen ack it (insertion order)
    echo_every: int
    proof: AckProof | None = None
    waiting: dict[NodeId, None] = field(default_factory=dict)  # senders owed a CsConfirm


class ClusterSendMachine:
    """One replica's cluster-sending. See the module docstring for the contract."""

    def __init__(self, node_id: NodeId, cluster_id: str, clusters: Mapping[str, ClusterInfo],
                 *, crypto: SendCrypto, config: ClusterSendConfig | None = None) -> None:
        me = clusters.get(cluster_id)
        if me is None or node_id not in me.members:
            raise ValueError(f"{node_id!r} is not a member of cluster {cluster_id!r}")
        self.node_id = node_id
        self.cluster = me
        self.clusters = dict(clusters)
        self.config = cfg = config or ClusterSendConfig()
        self._crypto = crypto
        self._cluster_of: dict[NodeId, str] = {}
        for info in clusters.values():
            for m in info.members:
                if self._cluster_of.setdefault(m, info.cluster_id) != info.cluster_id:
                    raise ValueError(f"{m!r} is a member of two clusters")
        self._peers = tuple(m for m in me.members if m != node_id)
        self._verify_certs = "accept_uncertified" not in cfg.bugs
        self._retry = "never_retry" not in cfg.bugs
        self._now = 0
        self._outs: dict[_Key, _Out] = {}  # by (dst cluster, seq)
        self._early: dict[_Key, AckProof] = {}  # verified proofs before their Outbound
        self._held: dict[_Key, _Held] = {}  # by (src cluster, seq)
        self._acks: dict[_Key, dict[bytes, dict[NodeId, bytes]]] = {}
        self._next: dict[str, int] = {}  # next seq to deliver, per sending cluster
        self._timers: list[tuple[int, int, str, _Key]] = []
        self._timer_seq = 0
        self._counters: dict[str, int] = {}
        self._step_counts: dict[str, int] = {}
        self._sends: list[Send] = []
        self._deliver: list[Inbound] = []
        self._confirmed: list[Confirmed] = []

    # -- plumbing ----------------------------------------------------------------------------

    def _count(self, name: str, by: int = 1) -> None:
        self._counters[name] = self._counters.get(name, 0) + by
        self._step_counts[name] = self._step_counts.get(name, 0) + by

    def _drop(self, reason: str) -> None:
        self._count("dropped:" + reason)

    def _send(self, to: NodeId, message: Message) -> None:
        self._sends.append(Send(to=to, message=message))
        self._count("sent:" + type(message).__name__)

    def _timer(self, at: int, kind: str, key: _Key) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (at, self._timer_seq, kind, key))

    def _flush(self) -> ClusterSendReady:
        if not (self._sends or self._deliver or self._confirmed or self._step_counts):
            return _EMPTY
        ready = ClusterSendReady(sends=tuple(self._sends), deliver=tuple(self._deliver),
                                 confirmed=tuple(self._confirmed),
                                 counters=tuple(sorted(self._step_counts.items())))
        self._sends.clear()
        self._deliver.clear()
        self._confirmed.clear()
        self._step_counts.clear()
        return ready

    # -- the one entry point -----------------------------------------------------------------

    def step(self, inp: ClusterSendInput) -> ClusterSendReady:
        match inp:
            case Tick():
                self._tick()
            case Receive(src=src, message=message):
                self._receive(src, message)
            case Outbound(value=value, certificate=cert):
                self._outbound(value, cert)
            case _:
                raise TypeError(f"not a cluster-sending input: {inp!r}")
        return self._flush()

    def status(self) -> dict[str, int]:
        """Counters (`sent:<type>`, `dropped:<reason>`, `attempts`, `delivered`,
        `confirmed`, ...) and sizes (`outstanding`, `held`), for metrics."""
        out = dict(self._counters)
        out["outstanding"] = sum(1 for o in self._outs.values() if o.proof is None)
        out["held"] = len(self._held)
        return out

    @property
    def now(self) -> int:
        return self._now

    def resume_delivery(self, src_cluster: str, next_seq: int) -> ClusterSendReady:
        """Our ordering already holds `src_cluster`'s values below `next_seq` (a restarted
        member reads that from its replicated state; a lagging one learns it as its state
        catches up): deliver from `next_seq` on, never those again. Never moves backwards.
        Returns the deliveries that were waiting only for that (in seq order)."""
        if src_cluster not in self.clusters or src_cluster == self.cluster.cluster_id:
            raise ValueError(f"resume_delivery: {src_cluster!r} is not a linked cluster")
        if next_seq > self._next.get(src_cluster, 0):
            self._next[src_cluster] = next_seq
            self._deliver_in_order(src_cluster)
        return self._flush()

    def attempt_of(self, dst_cluster: str, seq: int) -> int | None:
        """The attempt our send of `seq` to `dst_cluster` is at (None: no such send)."""
        out = self._outs.get((dst_cluster, seq))
        return None if out is None else out.attempt

    # -- sending side ------------------------------------------------------------------------

    def _outbound(self, value: bytes, cert: Certificate) -> None:
        st = cert.statement
        if st.src_cluster != self.cluster.cluster_id:
            raise ValueError(f"an Outbound of cluster {st.src_cluster!r} given to a member "
                             f"of {self.cluster.cluster_id!r}")
        digest = value_digest(value)
        reason = check_certificate(cert, value_digest=digest, dst_cluster=st.dst_cluster,
                                   clusters=self.clusters, verifier=self._crypto)
        if reason is None and st.dst_cluster not in self.clusters:
            reason = "unknown_cluster"
        if reason is not None:
            raise ValueError(f"Outbound certificate does not verify: {reason}")
        key = (st.dst_cluster, st.seq)
        if key in self._outs:
            return  # a replay of the ordering after a restart
        out = self._outs[key] = _Out(value=value, cert=cert, digest=digest,
                                     seed=link_seed(st.src_cluster, st.dst_cluster, st.epoch,
                                                    st.seq),
                                     timeout=self.config.attempt_timeout)
        early = self._early.pop(key, None)
        if early is not None and early.statement.digest == digest:
            self._confirm(key, out, early, relay=False)
            return
        self._attempt(key, out)

    def _pairs(self, out_cluster: ClusterInfo, dst: ClusterInfo, seed: bytes,
               attempt: int) -> tuple[tuple[NodeId, NodeId], ...]:
        return tuple((out_cluster.members[i], dst.members[j]) for i, j in
                     schedule(self.config.mode, seed, attempt, out_cluster.n, dst.n,
                              out_cluster.f, dst.f))

    def _attempt(self, key: _Key, out: _Out) -> None:
        dst = self.clusters[key[0]]
        self._count("attempts")
        for sender, receiver in self._pairs(self.cluster, dst, out.seed, out.attempt):
            if sender == self.node_id:
                self._send(receiver, CsSend(attempt=out.attempt, value=out.value,
                                            certificate=out.cert))
                self._count("inter_sent")
        out.deadline = self._now + out.timeout
        self._timer(out.deadline, "retry", key)

    def _retry_due(self, key: _Key) -> None:
        out = self._outs.get(key)
        if out is None or out.proof is not None or self._now < out.deadline:
            return
        if not self._retry:
            return
        out.attempt += 1
        dst = self.clusters[key[0]]
        after = self.config.backoff_after or 2 * (self.cluster.f + dst.f + 1)
        if out.attempt >= after:
            out.timeout = min(out.timeout * 2, self.config.max_timeout)
        query = CsQuery(dst_cluster=key[0], seq=key[1])
        for peer in self._peers:  # maybe a peer holds the proof and its relay was lost
            self._send(peer, query)
        self._attempt(key, out)

    def _on_query(self, src: NodeId, msg: CsQuery) -> None:
        out = self._outs.get((msg.dst_cluster, msg.seq))
        if out is not None and out.proof is not None:
            self._send(src, CsConfirm(proof=out.proof))

    def _confirm(self, key: _Key, out: _Out, proof: AckProof, *, relay: bool) -> None:
        out.proof = proof
        self._confirmed.append(Confirmed(dst_cluster=key[0], seq=key[1], proof=proof))
        self._count("confirmed")
        if relay:
            for peer in self._peers:
                self._send(peer, CsConfirm(proof=proof))

    def _on_confirm(self, src: NodeId, src_cluster: str, proof: AckProof) -> None:
        st = proof.statement
        inter = src_cluster != self.cluster.cluster_id
        if inter and st.dst_cluster != src_cluster:
            self._drop("wrong_cluster")
            return
        key = (st.dst_cluster, st.seq)
        out = self._outs.get(key)
        if out is not None and out.proof is not None:
            self._count("duplicate_confirm")
            return
        digest = out.digest if out is not None else st.digest
        reason = check_proof(proof, src_cluster=self.cluster.cluster_id, seq=st.seq,
                             value_digest=digest, clusters=self.clusters,
                             verifier=self._crypto)
        if reason is not None:
            self._drop("proof_" + reason)
            return
        if out is None:
            if key not in self._early:
                self._early[key] = proof
            return
        self._confirm(key, out, proof, relay=inter)

    # -- receiving side ----------------------------------------------------------------------

    def _check(self, value: bytes, cert: Certificate) -> str | None:
        if not self._verify_certs:
            return None
        return check_certificate(cert, value_digest=value_digest(value),
                                 dst_cluster=self.cluster.cluster_id, clusters=self.clusters,
                                 verifier=self._crypto)

    def _on_send(self, src: NodeId, src_cluster: str, msg: CsSend) -> None:
        st = msg.certificate.statement
        if src_cluster != st.src_cluster:
            self._drop("sender_not_in_cluster")
            return
        if msg.attempt > MAX_ATTEMPT:
            self._drop("attempt_out_of_range")
            return
        if st.dst_cluster != self.cluster.cluster_id:
            self._drop("wrong_cluster")
            return
        seed = link_seed(st.src_cluster, st.dst_cluster, st.epoch, st.seq)
        pairs = self._pairs(self.clusters[src_cluster], self.cluster, seed, msg.attempt)
        if (src, self.node_id) not in pairs:  # before the (costly) certificate check
            self._drop("not_my_pair")
            return
        key = (st.src_cluster, st.seq)
        held = self._held.get(key)
        if held is None or held.digest != value_digest(msg.value):  # else: verified before
            reason = self._check(msg.value, msg.certificate)
            if reason is not None:
                self._drop(reason)
                return
        self._count("inter_received")
        held = self._accept(key, msg.value, msg.certificate)
        if held is None:
            return
        if held.proof is not None:
            self._send(src, CsConfirm(proof=held.proof))
            self._count("inter_sent")
        else:
            held.waiting[src] = None

    def _on_echo(self, src: NodeId, msg: CsEcho) -> None:
        st = msg.certificate.statement
        key = (st.src_cluster, st.seq)
        held = self._held.get(key)
        if held is not None and held.digest == value_digest(msg.value):
            # A repeated echo: the echoer may have missed our ack.
            self._send(src, CsAck(statement=ack_statement(held.cert, self.cluster),
                                  signed=self._my_ack(held)))
            return
        reason = self._check(msg.value, msg.certificate)
        if reason is not None:
            self._drop(reason)
            return
        self._accept(key, msg.value, msg.certificate)

    def _my_ack(self, held: _Held) -> MemberSignature:
        return sign_as(self._crypto, ack_statement(held.cert, self.cluster))

    def _accept(self, key: _Key, value: bytes, cert: Certificate) -> _Held | None:
        """Deliver (in seq order), echo and ack a verified value; the held record, or None
        for a conflicting one (a sending cluster beyond its fault bound)."""
        digest = value_digest(value)
        held = self._held.get(key)
        if held is not None:
            if held.digest != digest:
                self._drop("conflicting_value")
                return None
            return held
        held = self._held[key] = _Held(value=value, cert=cert, digest=digest,
                                       unacked=dict.fromkeys(self._peers),
                                       echo_every=self.config.echo_retry)
        echo = CsEcho(value=value, certificate=cert)
        for peer in self._peers:
            self._send(peer, echo)
        statement = ack_statement(cert, self.cluster)
        signed = sign_as(self._crypto, statement)
        for peer in self._peers:
            self._send(peer, CsAck(statement=statement, signed=signed))
        self._timer(self._now + held.echo_every, "echo", key)
        self._deliver_in_order(key[0])
        self._add_ack(key, statement, signed)
        return held

    def _deliver_in_order(self, src_cluster: str) -> None:
        seq = self._next.get(src_cluster, 0)
        while (held := self._held.get((src_cluster, seq))) is not None:
            self._deliver.append(Inbound(src_cluster=src_cluster, seq=seq, value=held.value,
                                         certificate=held.cert))
            self._count("delivered")
            seq += 1
        self._next[src_cluster] = seq

    def _on_ack(self, src: NodeId, msg: CsAck) -> None:
        st = msg.statement
        if msg.signed.signer != src:
            self._drop("ack_signer_mismatch")
            return
        if st.dst_cluster != self.cluster.cluster_id or st.dst_epoch != self.cluster.epoch \
                or st.src_cluster not in self.clusters or st.src_cluster == st.dst_cluster:
            self._drop("ack_wrong_cluster")
            return
        if st.seq >= self._next.get(st.src_cluster, 0) + MAX_AHEAD:
            self._drop("ack_too_far_ahead")
            return
        if not self._crypto.verify(src, st, msg.signed.sig):
            self._drop("ack_bad_signature")
            return
        self._add_ack((st.src_cluster, st.seq), st, msg.signed)

    def _add_ack(self, key: _Key, st: AckStatement, signed: MemberSignature) -> None:
        by_digest = self._acks.setdefault(key, {})
        if st.digest not in by_digest and len(by_digest) >= MAX_ACK_DIGESTS:
            self._drop("ack_flood")
            return
        acks = by_digest.setdefault(st.digest, {})
        acks.setdefault(signed.signer, signed.sig)
        held = self._held.get(key)
        if held is None or held.digest != st.digest:
            return
        held.unacked.pop(signed.signer, None)
        if held.proof is None and len(acks) >= self.cluster.ack_quorum:
            sigs = tuple(MemberSignature(signer=s, sig=g) for s, g in sorted(acks.items()))
            held.proof = AckProof(statement=st, signatures=sigs[:self.cluster.ack_quorum])
            for sender in held.waiting:
                self._send(sender, CsConfirm(proof=held.proof))
                self._count("inter_sent")
            held.waiting.clear()

    def _echo_due(self, key: _Key) -> None:
        held = self._held[key]
        if not held.unacked:
            return
        echo = CsEcho(value=held.value, certificate=held.cert)
        for peer in held.unacked:
            self._send(peer, echo)
        self._count("re_echoes")
        held.echo_every = min(held.echo_every * 2, self.config.max_timeout)
        self._timer(self._now + held.echo_every, "echo", key)

    # -- inputs ------------------------------------------------------------------------------

    def _tick(self) -> None:
        self._now += 1
        timers = self._timers
        while timers and timers[0][0] <= self._now:
            _, _, kind, key = heapq.heappop(timers)
            if kind == "retry":
                self._retry_due(key)
            else:
                self._echo_due(key)

    def _receive(self, src: NodeId, message: Message) -> None:
        src_cluster = self._cluster_of.get(src)
        if src_cluster is None or src == self.node_id:
            self._drop("unknown_sender")
            return
        own = src_cluster == self.cluster.cluster_id
        match message:
            case CsSend() if not own:
                self._on_send(src, src_cluster, message)
            case CsEcho() if own:
                self._on_echo(src, message)
            case CsAck() if own:
                self._on_ack(src, message)
            case CsQuery() if own:
                self._on_query(src, message)
            case CsConfirm(proof=proof):
                self._on_confirm(src, src_cluster, proof)
            case CsSend() | CsEcho() | CsAck() | CsQuery():
                self._drop("wrong_path")  # inter-cluster types only across, intra only inside
            case _:
                self._drop("unknown_message")


__all__ = ["BUGS", "ClusterSendConfig", "ClusterSendInput", "ClusterSendMachine",
           "ClusterSendReady", "Confirmed", "Outbound", "SendCrypto"]
