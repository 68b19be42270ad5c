"""Targeted Byzantine attacks on PBFT: what <= f colluding replicas do to break a weakened rule.

Owns: `ATTACKS` (the names), `Collusion` (what colluders share: the replica order, who
colludes, the slots they attacked) and `AttackCore`, an honest PBFT core wrapped so that a
Byzantine replica observes its input and lies on the wire in a targeted way. Each attack is
harmless to an honest cluster (at most f liars: the PBFT safety theorem) and breaks agreement
once one deliberate bug (`phalanx.consensus.pbft.bugs.PbftBugs`) weakens a rule:

- ``collude`` (``commit_on_2f``, n >= 7): the colluders are the primaries of consecutive views
  v, v+1 (and more). As primary of v, a colluder pre-prepares only to f+1 honest backups S
  (and the colluders); colluding backups send their prepares to S minus one member W. So
  f honest replicas (S \\ W) prepare while W never does, and they reach 2f matching commits
  with the colluders' commits: a commit under the bug, never with 2f+1. Every colluder's
  ViewChange leaves out the attacked slots' certificates (re-signed: a replica's own view
  change may omit anything). As primary of v+1, a colluder builds its NewView from 2f+1
  valid ViewChanges that carry no certificate for an attacked slot (W's, the outsiders',
  the colluders'; relayed beside it), waiting until it holds that many, and re-issues the
  null request there: the honest replicas outside S \\ W execute null where S \\ W executed
  the request.
- ``forge_new_view`` (``accept_unsigned_view_change``): on seeing a prepare or commit for
  (v, s), the replica sends, as primary of the next view it leads, a NewView over 2f+1
  ViewChanges it forged for other replicas (bad signatures, no certificates; the NewView
  names them by digest, and it relays them beside it) and a null pre-prepare at s, with its
  commit. It withholds its own votes, so honest replicas race:
  some execute the request at s in view v, others enter the forged view and execute null.
- ``cross_view`` (``skip_view_check``): on seeing the pre-prepare (v, s, m), the replica sends
  a null pre-prepare for s in the next view it leads, with its commits, and withholds its own
  view-v votes. A correct replica buffers that future-view pre-prepare (a later legitimate
  NewView supersedes it); a replica that skips the view check races the two slots.

Must not import: the simulator (`phalanx.jepsen.sim`), trio, clocks, global random. Every
choice comes from the injected `random.Random`; the attacks are a pure function of the seed
and the inputs, reusable by real-cluster node modes.

Invariants: the wrapper never touches the inner core's persistence, executions or
rejections; only messages change (some are dropped, some rewritten and re-signed, some
added, signed with the replica's own key except the deliberately forged ViewChanges).
Nothing here raises on peer input.
"""

from __future__ import annotations

import dataclasses
import random

from phalanx.consensus.core import Core, CoreStatus, Input, Ready, Receive, Send
from phalanx.consensus.crypto import Crypto, digest_of
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.messages import (
    Commit,
    NewView,
    Prepare,
    PrePrepare,
    RelayedViewChange,
    ViewChange,
    ViewChangeRef,
    signed_part,
)
from phalanx.consensus.pbft.view_change import (
    check_view_change,
    compute_new_view,
    view_change_digest,
)
from phalanx.consensus.types import LocalProtocolError, Message, NodeId

ATTACKS: tuple[str, ...] = ("collude", "cross_view", "forge_new_view")


class Collusion:
    """What colluding replicas share (a side channel outside the protocol).

    Args:
        config: any replica's config (the replica order, f, the quorum).
        colluders: the colluding replicas.
        rng: seeded; draws the order of honest replicas the split primary uses.
    """

    def __init__(
        self, config: PbftConfig, colluders: frozenset[NodeId], rng: random.Random
    ) -> None:
        self.config = config
        self.colluders = colluders
        honest = [r for r in config.replicas if r not in colluders]
        rng.shuffle(honest)
        self._honest = tuple(honest)
        self.attacked: set[tuple[int, int]] = set()
        """(view, seq) slots pre-prepared to the split set only."""

    def split(self, view: int) -> tuple[frozenset[NodeId], NodeId] | None:
        """(S, W) for an attack in `view`, or None when the attack does not apply: the primary
        of `view` and of `view + 1` must collude, and S = f+1 honest replicas must prepare
        with the colluding backups while W cannot (needs a colluding backup: f >= 2)."""
        cfg = self.config
        if cfg.primary(view) not in self.colluders or cfg.primary(view + 1) not in self.colluders:
            return None
        backups = len(self.colluders) - 1  # colluders other than the primary of `view`
        size = 2 * cfg.f - backups
        if backups < 1 or size < 1 or size > len(self._honest):
            return None
        chosen = self._honest[:size]
        return frozenset(chosen), chosen[-1]

    def covers(self, view: int, seq: int) -> bool:
        return (view, seq) in self.attacked


class AttackCore:
    """An honest PBFT core (possibly wrapped for durability) driven by one attack.

    Args:
        inner: the honest core.
        attack: one of `ATTACKS`; unknown names raise `ValueError`.
        config: this replica's PBFT config (the same as the inner core's).
        crypto: this replica's crypto (its own key signs what it rewrites).
        rng: the seeded source of every decision.
        collusion: shared by every ``collude`` replica of a run (required for it).
    """

    def __init__(
        self,
        inner: Core,
        *,
        attack: str,
        config: PbftConfig,
        crypto: Crypto,
        rng: random.Random,
        collusion: Collusion | None = None,
    ) -> None:
        if attack not in ATTACKS:
            raise ValueError(f"unknown attack {attack!r}; known: {ATTACKS}")
        if attack == "collude" and collusion is None:
            raise ValueError("the collude attack needs a Collusion")
        if not (crypto.node_id == inner.node_id == config.node_id):
            raise LocalProtocolError("crypto, config and core belong to different nodes")
        self.inner = inner
        self.attack = attack
        self._cfg = config
        self._me = config.node_id
        self._crypto = crypto
        self._rng = rng
        self._collusion = collusion
        self._null = digest_of(crypto, ())
        self._done: set[tuple[int, int]] = set()
        self._views_used: set[int] = set()
        self._trigger = rng.choice(("prepare", "commit"))
        self._vcs: dict[tuple[int, NodeId], ViewChange] = {}
        self._held: NewView | None = None
        self._new_views: set[int] = set()
        self.launched = 0
        """Attacks sent (a NewView, a cross-view pre-prepare, a split slot)."""

    @property
    def node_id(self) -> NodeId:
        return self.inner.node_id

    def status(self) -> CoreStatus:
        return self.inner.status()

    def step(self, inp: Input, /) -> Ready:
        extra: list[Send] = []
        if isinstance(inp, Receive):
            self._observe(inp.src, inp.message, extra)
        ready = self.inner.step(inp)
        if not (ready.messages or ready.early_messages or extra):
            return ready
        return dataclasses.replace(
            ready,
            early_messages=self._transform(ready.early_messages, extra),
            messages=self._transform(ready.messages, extra) + tuple(extra),
        )

    # ------------------------------------------------------------------------------------
    # Observation: what the attacks react to

    def _observe(self, src: NodeId, msg: Message, extra: list[Send]) -> None:
        if self.attack == "collude":
            if (
                isinstance(msg, ViewChange)
                and msg.replica == src
                and check_view_change(self._cfg, self._crypto, msg) is None
            ):
                self._vcs[(msg.new_view, msg.replica)] = msg
                if self._held is not None and self._held.view == msg.new_view:
                    self._release(self._held, extra)
            return
        if not isinstance(msg, PrePrepare | Prepare | Commit) or msg.replica != src:
            return
        if msg.view != self.inner.status().term:
            return  # only the view this replica is in (not another attacker's lure)
        kind = {PrePrepare: "pre_prepare", Prepare: "prepare", Commit: "commit"}[type(msg)]
        if self.attack == "cross_view" and kind == "pre_prepare":
            if src == self._cfg.primary(msg.view) and src != self._me:
                self._null_slot(msg.view, msg.seq, extra, new_view=None)
        elif self.attack == "forge_new_view" and kind == self._trigger:
            self._forge(msg.view, msg.seq, extra)

    def _next_led_view(self, above: int) -> int:
        """The smallest view above `above` whose primary is this replica."""
        n = self._cfg.n
        index = self._cfg.replicas.index(self._me)
        view = above + 1
        return view + (index - view) % n

    def _null_slot(self, view: int, seq: int, extra: list[Send], *, new_view: int | None) -> None:
        """A null pre-prepare for `seq` in the next view this replica leads (or `new_view`),
        with this replica's commits for it, to every peer."""
        if (view, seq) in self._done:
            return
        self._done.add((view, seq))
        target = self._next_led_view(view) if new_view is None else new_view
        pp = self._null_pp(target, seq)
        for peer in self._cfg.peers():
            extra.append(Send(to=peer, message=pp))
        self._commit_all(target, seq, self._null, extra)
        self.launched += 1

    def _null_pp(self, view: int, seq: int) -> PrePrepare:
        pp = PrePrepare(view=view, seq=seq, digest=self._null, batch=(), replica=self._me)
        return dataclasses.replace(pp, signature=self._crypto.sign(signed_part(pp)))

    def _commit_all(self, view: int, seq: int, digest: bytes, extra: list[Send]) -> None:
        commit = Commit(view=view, seq=seq, digest=digest, replica=self._me)
        for peer in self._cfg.peers():
            tagged = dataclasses.replace(commit, auth=self._crypto.mac(peer, commit))
            extra.append(Send(to=peer, message=tagged))

    def _forge(self, view: int, seq: int, extra: list[Send]) -> None:
        if (view, seq) in self._done:
            return
        target = self._next_led_view(view)
        if target in self._views_used:
            return
        self._views_used.add(target)
        cfg = self._cfg
        others = [r for r in cfg.replicas if r != self._me]
        forged: list[ViewChange] = []
        for replica in sorted([self._me, *others[: cfg.quorum - 1]]):
            vc = ViewChange(
                new_view=target, stable_seq=0, checkpoint_proof=(), prepared_proofs=(),
                replica=replica,
            )
            if replica == self._me:
                signature = self._crypto.sign(vc)
            else:
                signature = bytes(self._rng.randrange(256) for _ in range(32))
            forged.append(dataclasses.replace(vc, signature=signature))
        nv = NewView(
            view=target, view_changes=self._refs(forged), pre_prepares=(), replica=self._me
        )
        nv = dataclasses.replace(nv, signature=self._crypto.sign(nv))
        peers = list(cfg.peers())
        if self._rng.random() < 0.5:
            peers.remove(self._rng.choice(peers))  # one replica stays behind in view `view`
        for peer in peers:
            extra.append(Send(to=peer, message=nv))
            self._relay(forged, peer, extra)
        self._null_slot(view, seq, extra, new_view=target)

    def _refs(self, vcs: list[ViewChange] | tuple[ViewChange, ...]) -> tuple[ViewChangeRef, ...]:
        return tuple(
            ViewChangeRef(replica=vc.replica, digest=view_change_digest(self._crypto, vc))
            for vc in vcs
        )

    def _relay(
        self, vcs: list[ViewChange] | tuple[ViewChange, ...], to: NodeId, extra: list[Send]
    ) -> None:
        """Send `to` the view changes a NewView names (the NewView names them by digest)."""
        for vc in vcs:
            extra.append(Send(to=to, message=RelayedViewChange(view_change=vc, replica=self._me)))

    # ------------------------------------------------------------------------------------
    # Rewriting the honest core's output

    def _transform(self, sends: tuple[Send, ...], extra: list[Send]) -> tuple[Send, ...]:
        out: list[Send] = []
        for send in sends:
            msg = send.message
            if self.attack == "collude":
                kept = self._collude(send, extra)
                if kept is not None:
                    out.append(kept)
            elif isinstance(msg, Prepare | Commit) and msg.replica == self._me:
                continue  # withhold own votes: honest replicas must race without them
            else:
                out.append(send)
        return tuple(out)

    def _collude(self, send: Send, extra: list[Send]) -> Send | None:
        msg, to = send.message, send.to
        assert self._collusion is not None  # checked at construction
        coll = self._collusion
        if isinstance(msg, PrePrepare) and msg.replica == self._me:
            plan = coll.split(msg.view)
            if plan is None:
                return send
            chosen, _ = plan
            if (msg.view, msg.seq) not in coll.attacked:
                coll.attacked.add((msg.view, msg.seq))
                self.launched += 1
            return send if to in chosen or to in coll.colluders else None
        if isinstance(msg, Prepare) and coll.covers(msg.view, msg.seq):
            plan = coll.split(msg.view)
            if plan is None:
                return send
            chosen, shadow = plan
            return send if (to in chosen and to != shadow) or to in coll.colluders else None
        if isinstance(msg, ViewChange) and msg.replica == self._me:
            kept = tuple(
                p for p in msg.prepared_proofs
                if not coll.covers(p.pre_prepare.view, p.pre_prepare.seq)
            )
            if kept != msg.prepared_proofs:
                blank = dataclasses.replace(msg, prepared_proofs=kept, signature=b"")
                msg = dataclasses.replace(blank, signature=self._crypto.sign(blank))
            self._vcs[(msg.new_view, self._me)] = msg
            return Send(to=to, message=msg)
        if isinstance(msg, NewView) and msg.replica == self._me:
            if msg.view not in self._new_views:  # one Send per peer: handle the first only
                self._new_views.add(msg.view)
                self._held = msg
                self._release(msg, extra)
            return None
        return send

    def _release(self, nv: NewView, extra: list[Send]) -> None:
        """Send a NewView for `nv.view` built from ViewChanges that carry no certificate for
        an attacked slot, once 2f+1 of them are at hand; then null pre-prepares at the
        attacked slots the O set leaves out. Unattacked views get the honest NewView."""
        coll = self._collusion
        assert coll is not None
        cfg = self._cfg
        if not any(v < nv.view for v, _ in coll.attacked):
            self._held = None
            for peer in cfg.peers():
                extra.append(Send(to=peer, message=nv))
            return
        clean = [
            vc for (view, replica), vc in sorted(self._vcs.items())
            if view == nv.view and not any(
                coll.covers(p.pre_prepare.view, p.pre_prepare.seq) for p in vc.prepared_proofs
            )
        ]
        if len(clean) < cfg.quorum:
            return
        self._held = None
        chosen = tuple(clean[: cfg.quorum])
        plan = compute_new_view(cfg, self._crypto, nv.view, chosen)
        o_set = tuple(
            dataclasses.replace(pp, signature=self._crypto.sign(signed_part(pp)))
            for pp in plan.pre_prepares
        )
        forged = NewView(
            view=nv.view, view_changes=self._refs(chosen), pre_prepares=o_set, replica=self._me
        )
        forged = dataclasses.replace(forged, signature=self._crypto.sign(forged))
        for peer in cfg.peers():
            extra.append(Send(to=peer, message=forged))
            self._relay(chosen, peer, extra)
        self.launched += 1
        for view, seq in sorted(coll.attacked):
            if view < nv.view and seq > plan.max_seq:
                self._null_slot(view, seq, extra, new_view=nv.view)
