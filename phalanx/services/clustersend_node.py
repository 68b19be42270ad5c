"""The cluster-sending service on a real node: `ClusterSendMachine` between linked clusters.

Owns: `ClusterSendService` (the `NodeService` the host ticks and feeds), `build` (the
registry's factory), `KvMailbox` (where the values live in the KV app's replicated state)
and `CsSign` (wire id 612: one member's signature over a `SendStatement`, inside a cluster).

The value to send is the local cluster's COMMITTED state: an application-level outbox in
the KV store. A client writes value k for cluster D at ``cs/out/<D>/<k, 10 digits>`` (put
if absent, k = 0, 1, 2, ...: `outbox_command`); every member's service reads its applied
state each tick, and the first time it sees value k it signs ``SendStatement(us, D, 0, k,
digest)`` with its node signing key and sends the signature (`CsSign`) to the other
members. With `ClusterInfo.cert_quorum` of them (2f+1 for a Byzantine cluster, a majority
for a crash one) a member has the certificate and hands ``Outbound(value, certificate)`` to
its machine, which sends it (PCS pairs) to D. Why an outbox and not a client command's
result: a member signs only what it applied itself, so a certificate needs nothing but the
replicated state; the outbox is also what a restarted member re-reads to resume sending.

Receiving: each certified value the machine delivers (``Inbound``) is submitted to our own
consensus as the KV command `CsDeliver` (`delivery_command`): "if ``cs/in/<src>/<k>`` is
absent, put the value there", with the sending cluster's certificate. Every replica checks
the certificate WHEN IT APPLIES (`phalanx.apps.kv_inbox`, with the `ApplyCheck` of
`phalanx.services.clustersend_apply` this module's `build` installs in the KV machine from
the link files), so a forged inbox write ordered by a Byzantine proposer changes nothing;
copies submitted by several members apply once: dedup by (sending cluster, seq) in the
replicated state. A `credit_value`'s increment is derived from the certified value at apply
(never from the submitter). Until the state shows it, the member resubmits every
``resubmit`` ticks (a follower's refusal, a lost proposal or a leader change are normal).

Garbage collection (option ``gc``, off by default): a member whose machine confirms our
seq-k send submits `CsCompact` with the receiver's acknowledgement proof (in seq order; every
replica verifies it at apply, deletes the outbox slot and moves the compaction mark), and
every ``gc_batch`` delivered values of a source submits `CsPrune` (entries below a mark that
keeps dedup). The outbox and inbox are read from their marks.

Crash-kind certificates (Raft): the machine's format wants a leader's `CommitNotice`. Here
every signer signs only after APPLYING the entry, so under crash faults a majority of
signatures alone proves the entry committed; the member that assembles the certificate
signs the notice as "leader" with term 0. Against a Byzantine member this proves nothing
more than "these members signed" (docs/CLUSTER_SENDING.md).

Ids: the machine sees every node by its qualified id ``<node>@<cluster id>`` (ours too); the
transport names our own members plainly (`phalanx.net.intercluster`). Peer input is
Byzantine: a bad `CsSign` (not a member, bad signature, another value) is dropped and
counted; the machine drops and counts the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from phalanx.apps.kv_inbox import (
    CREDIT,
    DeliveryCheck,
    credit_value,
    in_mark_key,
    inbox_key,
    out_mark_key,
    outbox_key,
    parse_credit,
    read_mark,
)
from phalanx.apps.kv_types import Compare, Put, Txn
from phalanx.apps.kv_wire import encode_command
from phalanx.clustersend import (
    CLUSTERSEND_MESSAGES,
    Certificate,
    CertKind,
    ClusterInfo,
    ClusterSendConfig,
    ClusterSendMachine,
    ClusterSendReady,
    CommitNotice,
    Confirmed,
    Inbound,
    MemberSignature,
    Mode,
    Outbound,
    Receive,
    SendStatement,
    Tick,
    value_digest,
)
from phalanx.consensus.types import Message, NodeId
from phalanx.net.crypto import Ed25519Crypto
from phalanx.net.intercluster import qualify, split_qualified
from phalanx.protocols import get as protocol_spec
from phalanx.protocols.spec import CallStrategy
from phalanx.services.clustersend_apply import (
    ApplyCheck,
    compact_command,
    delivery_command,
    prune_command,
)
from phalanx.services.linked_keys import load_linked_keys, send_qualified
from phalanx.services.spec import SendFn as ServiceSend
from phalanx.services.spec import ServiceContext, ServiceError

SubmitFn = Callable[[bytes], bool]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class CsSign(Message):
    """A sending-cluster member's signature over `statement` (inside the sending cluster)."""

    statement: SendStatement
    signature: MemberSignature


CLUSTERSEND_SERVICE_MESSAGES: Mapping[int, type] = {**CLUSTERSEND_MESSAGES, 612: CsSign}
"""The service's peer wire types: the machine's (600-611) and `CsSign` (612)."""


def outbox_command(dst_cluster: str, seq: int, value: bytes) -> bytes:
    """The KV command a client submits to send `value` as our `seq`-th value to `dst_cluster`
    (put if absent: a retry or a second writer of the same seq changes nothing)."""
    key = outbox_key(dst_cluster, seq)
    return encode_command(Txn(compares=(Compare(key=key, expected=None),),
                              success=(Put(key=key, value=value),)))


@runtime_checkable
class KvReader(Protocol):
    def get(self, key: str) -> bytes | None: ...


@runtime_checkable
class DeliveryHost(KvReader, Protocol):
    """The KV machine side the service needs to make inbox writes certified at apply."""

    refused: dict[str, int]

    def install_delivery_check(self, check: DeliveryCheck | None) -> None: ...


class Mailbox:
    """The KV layout of the outbox and the inbox (see the module docstring)."""

    def __init__(self, state: KvReader) -> None:
        self.state = state

    def outbox(self, dst_cluster: str, seq: int) -> bytes | None:
        return self.state.get(outbox_key(dst_cluster, seq))

    def received(self, src_cluster: str, seq: int) -> bool:
        return (seq < self.inbox_mark(src_cluster)
                or self.state.get(inbox_key(src_cluster, seq)) is not None)

    def outbox_mark(self, dst_cluster: str) -> int:
        """Our outbox slots to `dst_cluster` below this were confirmed and compacted."""
        return read_mark(self.state.get, out_mark_key(dst_cluster))

    def inbox_mark(self, src_cluster: str) -> int:
        """`src_cluster`'s values below this were delivered and their entries pruned."""
        return read_mark(self.state.get, in_mark_key(src_cluster))

    def inbox_command(self, inbound: Inbound) -> bytes:
        """The `CsDeliver` that records `inbound` (its certificate is checked at apply)."""
        return delivery_command(inbound)


@dataclass(slots=True)
class _Sending:
    """One of our outbox values being certified."""

    statement: SendStatement
    value: bytes
    signatures: dict[NodeId, bytes]
    handed: bool = False
    handed_at: int = 0


class ClusterSendService:
    """See the module docstring. One machine for all linked clusters (it keys by cluster)."""

    def __init__(self, *, me: NodeId, cluster: ClusterInfo, linked: tuple[ClusterInfo, ...],
                 crypto: Ed25519Crypto, send: ServiceSend, submit: SubmitFn,
                 mailbox: Mailbox, tick_seconds: float, config: ClusterSendConfig,
                 resubmit: int, gc: bool = False, gc_batch: int = 32) -> None:
        self.me = me
        self.cluster = cluster
        self.linked = {c.cluster_id: c for c in linked}
        self._crypto = crypto
        self._send = send
        self._submit = submit
        self.mailbox = mailbox
        self._tick_seconds = tick_seconds
        self._resubmit = resubmit
        self._gc = gc
        self._gc_batch = gc_batch
        self._compact: dict[tuple[str, int], tuple[Confirmed, int]] = {}
        """With gc: confirmed sends not yet compacted, and the tick we last submitted each."""
        self._pruned_at: dict[str, int] = {}
        self.machine = ClusterSendMachine(
            me, cluster.cluster_id, {cluster.cluster_id: cluster, **self.linked},
            crypto=crypto, config=config)
        self._members = frozenset(cluster.members)
        self._next_out: dict[str, int] = dict.fromkeys(self.linked, 0)
        self._next_in: dict[str, int] = dict.fromkeys(self.linked, 0)
        """Per linked cluster: the first seq whose inbox entry our applied state lacks (the
        machine delivers from there: after a restart it must not wait for old values)."""
        """Per linked cluster: the next outbox seq not yet seen in our applied state."""
        self._sending: dict[tuple[str, int], _Sending] = {}
        self._early: dict[tuple[str, int], dict[NodeId, tuple[SendStatement, bytes]]] = {}
        """Signatures that arrived before we applied the value (bounded per key by n)."""
        self._inbox: dict[tuple[str, int], tuple[Inbound, int]] = {}
        """Delivered values not yet in our state, and the tick we last submitted each."""
        self._ticks = 0
        self._counters: dict[str, int] = {}
        self.confirmed: dict[tuple[str, int], int] = {}
        """(destination, seq) -> the tick its proof arrived (latency probes)."""
        self.received: dict[tuple[str, int], int] = {}
        """(source, seq) -> the tick we saw it applied in our state."""

    # -- the NodeService protocol ------------------------------------------------------------

    @property
    def tick_seconds(self) -> float:
        return self._tick_seconds

    def tick(self) -> None:
        self._ticks += 1
        self._poll_outbox()
        self._poll_inbox()
        if self._gc:
            self._collect()
        self._carry_out(self.machine.step(Tick()))

    def receive(self, src: NodeId, message: Message) -> None:
        name, cluster = split_qualified(src)
        qualified = qualify(name, cluster or self.cluster.cluster_id)
        if isinstance(message, CsSign):
            self._on_sign(qualified, message)
            return
        self._carry_out(self.machine.step(Receive(src=qualified, message=message)))

    def call(self, request: Message) -> Message:
        raise ValueError("the clustersend service answers no client calls; read "
                         "cs/in/<cluster>/<seq> in the KV store")

    def needed_role(self, request: Message) -> str:
        return "admin"

    def counters(self) -> Mapping[str, int]:
        out = dict(self._counters)
        for name, value in self.machine.status().items():
            out[f"machine:{name}"] = value
        if isinstance(self.mailbox.state, DeliveryHost):  # refused by every replica's apply
            for name, value in self.mailbox.state.refused.items():
                out[f"apply_refused:{name}"] = value
        return out

    def gauges(self) -> Mapping[str, int]:
        return {"certifying": sum(1 for s in self._sending.values() if not s.handed),
                "inbox_pending": len(self._inbox)}

    def close(self) -> None:
        pass

    # -- sending: outbox -> signatures -> certificate -> machine ----------------------------

    def _count(self, name: str, by: int = 1) -> None:
        self._counters[name] = self._counters.get(name, 0) + by

    def _poll_outbox(self) -> None:
        for dst in sorted(self.linked):
            self._next_out[dst] = max(self._next_out[dst], self.mailbox.outbox_mark(dst))
            while (value := self.mailbox.outbox(dst, self._next_out[dst])) is not None:
                seq = self._next_out[dst]
                self._next_out[dst] = seq + 1
                self._start(dst, seq, value)

    def _start(self, dst: str, seq: int, value: bytes) -> None:
        st = SendStatement(src_cluster=self.cluster.cluster_id, dst_cluster=dst, epoch=0,
                           seq=seq, digest=value_digest(value))
        mine = self._crypto.sign(st)
        sending = self._sending[(dst, seq)] = _Sending(statement=st, value=value,
                                                       signatures={self.me: mine})
        self._count("signed")
        sign = CsSign(statement=st, signature=MemberSignature(signer=self.me, sig=mine))
        for member in self.cluster.members:
            if member != self.me:
                self._send_to(member, sign)
        for signer, (statement, sig) in sorted(self._early.pop((dst, seq), {}).items()):
            self._add_signature(sending, signer, statement, sig)
        self._maybe_certify(sending)

    def _on_sign(self, src: NodeId, message: CsSign) -> None:
        st, signature = message.statement, message.signature
        if src not in self._members or signature.signer != src:
            self._count("dropped:sign_not_member")
            return
        if st.src_cluster != self.cluster.cluster_id or st.dst_cluster not in self.linked:
            self._count("dropped:sign_wrong_cluster")
            return
        sending = self._sending.get((st.dst_cluster, st.seq))
        if sending is None:
            if st.seq >= self._next_out[st.dst_cluster] + 1024:
                self._count("dropped:sign_too_far")
                return
            self._early.setdefault((st.dst_cluster, st.seq), {})[src] = (st, signature.sig)
            return
        late = sending.handed and self._ticks - sending.handed_at >= self._resubmit
        if self._add_signature(sending, src, st, signature.sig) and late:
            # A signature long after we certified: that member missed ours (it restarted,
            # or started late): answer with ours, so it can certify too.
            self._send_to(src, CsSign(statement=sending.statement, signature=MemberSignature(
                signer=self.me, sig=sending.signatures[self.me])))
        self._maybe_certify(sending)

    def _add_signature(self, sending: _Sending, signer: NodeId, st: SendStatement,
                       sig: bytes) -> bool:
        """Whether `sig` is a new valid signature (dropped and counted when invalid)."""
        if st != sending.statement:
            self._count("dropped:sign_other_value")
            return False
        if signer in sending.signatures:
            return False
        if not self._crypto.verify(signer, st, sig):
            self._count("dropped:sign_bad_signature")
            return False
        sending.signatures[signer] = sig
        return True

    def _maybe_certify(self, sending: _Sending) -> None:
        info = self.cluster
        if sending.handed or len(sending.signatures) < info.cert_quorum:
            return
        st = sending.statement
        sigs = tuple(MemberSignature(signer=s, sig=sending.signatures[s])
                     for s in sorted(sending.signatures)[:info.cert_quorum])
        if info.kind == CertKind.BYZANTINE:
            cert = Certificate(kind=info.kind, statement=st, signatures=sigs)
        else:  # see the module docstring: the assembler signs the notice, term 0
            notice = CommitNotice(statement=st, term=0, leader=self.me)
            cert = Certificate(kind=info.kind, statement=st, signatures=sigs, term=0,
                               leader=self.me, leader_sig=self._crypto.sign(notice))
        sending.handed = True
        sending.handed_at = self._ticks
        self._count("certified")
        self._carry_out(self.machine.step(Outbound(value=sending.value, certificate=cert)))

    # -- receiving: machine -> our consensus, once ------------------------------------------

    def _poll_inbox(self) -> None:
        for src in sorted(self.linked):
            k = self._next_in[src]
            while self.mailbox.received(src, k):
                k += 1
            if k > self._next_in[src]:
                self._next_in[src] = k
                self._carry_out(self.machine.resume_delivery(src, k))
        for key in sorted(self._inbox):
            inbound, last = self._inbox[key]
            if self.mailbox.received(*key):
                del self._inbox[key]
                self.received.setdefault(key, self._ticks)
                self._count("applied")
            elif self._ticks - last >= self._resubmit:
                self._propose(inbound)

    def _propose(self, inbound: Inbound) -> None:
        key = (inbound.src_cluster, inbound.seq)
        if self._submit(self.mailbox.inbox_command(inbound)):
            self._count("submitted")
            self._inbox[key] = (inbound, self._ticks)
        else:
            self._inbox[key] = (inbound, self._ticks - self._resubmit + 1)  # next tick

    def _carry_out(self, ready: ClusterSendReady) -> None:
        for send in ready.sends:
            self._send_to(send.to, send.message)
        for inbound in ready.deliver:
            self._count("delivered")
            if not self.mailbox.received(inbound.src_cluster, inbound.seq):
                self._propose(inbound)
        for confirmed in ready.confirmed:
            self.confirmed.setdefault((confirmed.dst_cluster, confirmed.seq), self._ticks)
            self._count("confirmed")
            if self._gc:
                self._compact.setdefault((confirmed.dst_cluster, confirmed.seq),
                                         (confirmed, self._ticks - self._resubmit))

    # -- garbage collection (option gc): checked at apply like the inbox -------------------

    def _collect(self) -> None:
        """Submit the next compaction of each outbox (in seq order: the mark moves one slot
        at a time) and, every `gc_batch` delivered values, a prune of each inbox."""
        for dst in sorted(self.linked):
            mark = self.mailbox.outbox_mark(dst)
            for key in [k for k in self._sending if k[0] == dst and k[1] < mark]:
                del self._sending[key]  # compacted (by our submission or another member's)
                self._count("compacted")
            for key in [k for k in self._compact if k[0] == dst and k[1] < mark]:
                del self._compact[key]
            pending = self._compact.get((dst, mark))
            if (pending is not None and self._ticks - pending[1] >= self._resubmit
                    and self._submit(compact_command(pending[0]))):
                self._compact[(dst, mark)] = (pending[0], self._ticks)
                self._count("submitted_compact")
        for src in sorted(self.linked):
            below = self._next_in[src]
            if (below - self.mailbox.inbox_mark(src) >= self._gc_batch
                    and self._ticks - self._pruned_at.get(src, -self._resubmit)
                    >= self._resubmit and self._submit(prune_command(src, below))):
                self._pruned_at[src] = self._ticks
                self._count("submitted_prune")

    def _send_to(self, node: NodeId, message: Message) -> None:
        if send_qualified(self._send, self.cluster.cluster_id, node, message, self._count):
            self._count(f"sent:{type(message).__name__}")
            if split_qualified(node)[1] != self.cluster.cluster_id:
                self._count("sent_intercluster")


def build(context: ServiceContext) -> ClusterSendService:
    """The registry's factory (see the module docstring)."""
    config = context.config
    spec = protocol_spec(config.protocol)
    if spec.call_strategy is CallStrategy.ENDORSEMENT:
        raise ServiceError(f"[clustersend] cannot submit to {config.protocol} (its clients "
                           "sign each transaction); run it on raft or pbft")
    keys = load_linked_keys(config, "clustersend", spec.fault_model,
                            CLUSTERSEND_SERVICE_MESSAGES)
    if context.submit is None or not isinstance(context.machine, DeliveryHost):
        raise ServiceError(f"[clustersend] runs on the kv app (its outbox and inbox are KV "
                           f"keys); this node runs {config.app!r}")
    cluster, linked, crypto, me = keys.cluster, keys.linked, keys.crypto, keys.me
    # Before anything applies (the driver starts after the services are built): every
    # replica checks inbox writes at apply against the same link files.
    context.machine.install_delivery_check(ApplyCheck(
        own=cluster.cluster_id, linked={c.cluster_id: c for c in linked}, verifier=crypto))
    options = context.options
    try:
        machine_config = ClusterSendConfig(mode=Mode(str(options["mode"])),
                                           attempt_timeout=int(options["attempt_timeout"]),
                                           max_timeout=max(int(options["attempt_timeout"]),
                                                           400))
    except ValueError as e:
        raise ServiceError(f"[clustersend]: {e} (mode: one of "
                           f"{', '.join(m.value for m in Mode)})") from None
    logger.info("%s: clustersend: cluster %s (%s, n=%d, f=%d), linked with %s", config.id,
                cluster.cluster_id, cluster.kind.name.lower(), cluster.n, cluster.f,
                ", ".join(c.cluster_id for c in linked) or "no cluster")
    return ClusterSendService(me=me, cluster=cluster, linked=tuple(linked), crypto=crypto,
                              send=context.send, submit=context.submit,
                              mailbox=Mailbox(context.machine),
                              tick_seconds=int(options["tick_ms"]) / 1000,
                              config=machine_config, resubmit=int(options["resubmit"]),
                              gc=bool(options["gc"]), gc_batch=int(options["gc_batch"]))


__all__ = ["CLUSTERSEND_SERVICE_MESSAGES", "CREDIT", "ClusterSendService", "CsSign",
           "DeliveryHost", "KvReader", "Mailbox", "build", "credit_value", "outbox_command",
           "parse_credit"]
