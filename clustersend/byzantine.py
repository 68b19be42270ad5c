"""Scripted Byzantine replicas for the cluster-sending simulator.

Owns: `BEHAVIOURS` and `Byzantine`, which wraps an honest `ClusterSendMachine` and rewrites
what it sends (and adds messages of its own). A Byzantine replica signs only as itself (its
own key); anything else it "signs" is garbage or a copy, as a real attacker's would be.

- ``drop``: receives, never sends anything.
- ``forge``: every `CsSend`, `CsEcho` and `CsConfirm` it would send is replaced by a forgery:
  a short certificate, a certificate repeating its own signature, garbage signatures in other
  members' names, or a genuine certificate over another value; a proof of its own signature
  repeated f+1 times.
- ``ack_blind``: never echoes; acknowledges every statement it hears acknowledged, before
  having the value (and a made-up digest for the next seq, to fill the ack table).
- ``wrong_receiver``: sends its `CsSend`s to a member that is not the attempt's receiver.
- ``replay``: honest, but re-sends old messages it received to random nodes of any cluster.

Invariants: deterministic for a given injected `random.Random`; never touches the honest
machines' state (everything goes through messages).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping

from phalanx.clustersend.certificates import ClusterInfo, sign_as
from phalanx.clustersend.messages import (
    AckProof,
    Certificate,
    CsAck,
    CsConfirm,
    CsEcho,
    CsSend,
    MemberSignature,
    value_digest,
)
from phalanx.consensus.core import Send
from phalanx.consensus.crypto import Signer
from phalanx.consensus.types import Message, NodeId

BEHAVIOURS: tuple[str, ...] = ("drop", "forge", "ack_blind", "wrong_receiver", "replay")

REPLAY_HISTORY = 64


def forged_value(value: bytes) -> bytes:
    return b"FORGED:" + value


class Byzantine:
    """One scripted replica of cluster `info`: feed it the honest machine's sends and what it
    receives; it returns what it actually sends."""

    def __init__(self, node: NodeId, behaviour: str, info: ClusterInfo,
                 clusters: Mapping[str, ClusterInfo], signer: Signer,
                 rng: random.Random) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown Byzantine behaviour {behaviour!r}; known: {BEHAVIOURS}")
        self.node = node
        self.behaviour = behaviour
        self.info = info
        self.clusters = dict(clusters)
        self._signer = signer
        self._rng = rng
        self._acked: set[tuple[str, int, bytes]] = set()
        self._history: list[Message] = []
        self._everyone = tuple(m for c in sorted(clusters) for m in clusters[c].members
                               if m != node)

    # -- forgeries ---------------------------------------------------------------------------

    def _forged_cert(self, cert: Certificate, value: bytes, variant: int) -> Certificate:
        st = dataclasses.replace(cert.statement, digest=value_digest(value))
        src = self.clusters[st.src_cluster]
        own = sign_as(self._signer, st)
        if variant == 0:  # short: only our own signature
            sigs: tuple[MemberSignature, ...] = (own,)
        elif variant == 1:  # our signature, repeated up to the quorum
            sigs = (own,) * src.cert_quorum
        elif variant == 2:  # garbage in other members' names
            others = [m for m in src.members if m != self.node][:src.cert_quorum - 1]
            sigs = (own, *(MemberSignature(signer=m, sig=self._rng.randbytes(64))
                           for m in others))
        else:  # a genuine certificate, another value
            return cert
        return dataclasses.replace(cert, statement=st, signatures=sigs)

    def _forge(self, msg: Message) -> Message:
        if isinstance(msg, CsSend | CsEcho):
            cert = msg.certificate
            value = forged_value(msg.value)
            variant = (cert.statement.seq + getattr(msg, "attempt", 0)) % 4
            forged = self._forged_cert(cert, value, variant)
            return dataclasses.replace(msg, value=value, certificate=forged)
        if isinstance(msg, CsConfirm):
            st = msg.proof.statement
            own = sign_as(self._signer, st)
            dst = self.clusters[st.dst_cluster]
            return CsConfirm(proof=AckProof(statement=st, signatures=(own,) * dst.ack_quorum))
        return msg

    # -- the three hooks ---------------------------------------------------------------------

    def outgoing(self, sends: tuple[Send, ...]) -> list[Send]:
        b = self.behaviour
        if b == "drop":
            return []
        out: list[Send] = []
        for s in sends:
            msg = s.message
            if b == "forge":
                out.append(Send(to=s.to, message=self._forge(msg)))
            elif b == "ack_blind" and isinstance(msg, CsEcho):
                continue
            elif b == "wrong_receiver" and isinstance(msg, CsSend):
                dst = self.clusters[msg.certificate.statement.dst_cluster]
                i = dst.members.index(s.to)
                out.append(Send(to=dst.members[(i + 1) % dst.n], message=msg))
            else:
                out.append(s)
        return out

    def incoming(self, msg: Message) -> list[Send]:
        if self.behaviour == "replay":
            if len(self._history) >= REPLAY_HISTORY:
                self._history[self._rng.randrange(REPLAY_HISTORY)] = msg
            else:
                self._history.append(msg)
            return []
        if self.behaviour != "ack_blind" or not isinstance(msg, CsAck):
            return []
        out: list[Send] = []
        st = msg.statement
        made_up = dataclasses.replace(st, seq=st.seq + 1,
                                      digest=hashlib.sha256(b"made up" + st.digest).digest())
        for statement in (st, made_up):
            key = (statement.src_cluster, statement.seq, statement.digest)
            if key in self._acked:
                continue
            self._acked.add(key)
            ack = CsAck(statement=statement, signed=sign_as(self._signer, statement))
            out += [Send(to=m, message=ack) for m in self.info.members if m != self.node]
        return out

    def tick(self) -> list[Send]:
        if self.behaviour != "replay" or not self._history or self._rng.random() > 0.3:
            return []
        msg = self._rng.choice(self._history)
        return [Send(to=self._rng.choice(self._everyone), message=msg)]


__all__ = ["BEHAVIOURS", "Byzantine", "forged_value"]
