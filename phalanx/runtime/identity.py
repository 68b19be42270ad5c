"""A node's durable identity and the amnesia verdict: has this data directory lost state?

Owns: the `IDENTITY` file in a node's data directory (JSON: the cluster it belongs to, the
node id, and its life-cycle state), `prepare_data_dir` (what `phalanx cluster init` and test
helpers call for a brand-new node), `read_identity` / `write_identity`, and `amnesia`, the
pure decision the runtime and the simulator share.

Why (Protocol-Aware Recovery for Consensus-Based Storage, FAST'18): a member that restarts
with an empty data directory (a typo in `data_dir`, a replaced disk) or without its hard
state may have voted, or acknowledged entries, that it no longer remembers. If it voted and
counted toward quorums at once, it could elect a leader that lacks an acknowledged write.
Such a node starts in recovery mode (`RaftRestoredState.recovering`): no votes, no
campaigns, until it has caught up from a leader.

States of the file, in order:
- ``new``: written by `prepare_data_dir` into an empty directory of a new cluster's node.
  An empty directory with this file starts as a normal voter (the cluster's bootstrap).
- ``member``: written (durably) once the node has a term (so it may have voted or
  acknowledged entries): from then on an empty directory, or a missing hard state, means
  amnesia. Until then an empty directory holds nothing anyone relies on, so a new cluster
  whose nodes all stop before electing anyone still starts.
- ``recovering``: written before a recovering node's core starts and replaced by ``member``
  once the core reports it caught up; a crash in between starts recovery again.

A data directory without the file is either from before this file existed (it holds state:
adopted as ``member``) or was never prepared (empty: amnesia, unless the caller says this
is a brand-new cluster).

A CA rotation (`phalanx cert rotate --ca`) puts a bundle, old CA then new, in the CA file:
a directory whose IDENTITY names any certificate of the bundle is this cluster's, and the
node records the bundle's last (newest) certificate as the cluster's identity at start-up
and on a certificate reload (`adopt_rotated_identity`).

Invariants: the file is replaced atomically (write, fsync, rename, fsync the directory);
identity mismatches (another node's or another cluster's directory) are refused, never
repaired.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

IDENTITY_NAME = "IDENTITY"
FORMAT = 1

State = Literal["new", "member", "recovering"]
_STATES: tuple[State, ...] = ("new", "member", "recovering")


class IdentityError(Exception):
    """The data directory belongs to another node or cluster, or its IDENTITY is unreadable.
    The message is one line that says what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    cluster: str
    """A fingerprint of the cluster's CA certificate (`cluster_fingerprint`)."""
    node: str
    state: State


def cluster_fingerprint(ca_certificate: Path) -> str:
    """The cluster's identity: the first 32 hex digits of SHA-256 over its CA certificate
    file. Every node and client of a cluster trusts that one CA, so a data directory moved to
    another cluster is recognised."""
    try:
        data = ca_certificate.read_bytes()
    except OSError as e:
        raise IdentityError(f"cannot read the CA certificate {ca_certificate}: "
                            f"{e.strerror or e}") from None
    return hashlib.sha256(data).hexdigest()[:32]


_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\n?", re.DOTALL)


def trusted_fingerprints(ca_certificate: Path) -> tuple[str, ...]:
    """The cluster identities a CA file vouches for: the whole file's fingerprint, then each
    certificate's in it, in order (a bundle mid-rotation: old CA, then new). The last one is
    the cluster's current identity; for a file of one certificate all of them are equal."""
    try:
        data = ca_certificate.read_bytes()
    except OSError as e:
        raise IdentityError(f"cannot read the CA certificate {ca_certificate}: "
                            f"{e.strerror or e}") from None
    return (hashlib.sha256(data).hexdigest()[:32],
            *(hashlib.sha256(b).hexdigest()[:32] for b in _PEM_BLOCK.findall(data)))


def adopt_rotated_identity(data_dir: Path, ca_certificate: Path) -> bool:
    """After a CA rotation put a bundle in `ca_certificate`: record its current identity
    (the last certificate's) in `data_dir`'s IDENTITY if that names another certificate of
    the bundle, so the directory is still recognised once the old CA leaves the file.
    Whether it was rewritten. Raises `IdentityError`."""
    identity = read_identity(data_dir)
    known = trusted_fingerprints(ca_certificate)
    if identity is None or identity.cluster == known[-1] or identity.cluster not in known:
        return False
    write_identity(data_dir, Identity(cluster=known[-1], node=identity.node,
                                      state=identity.state))
    return True


def read_identity(data_dir: Path) -> Identity | None:
    """The identity recorded in `data_dir`, None when it has none."""
    path = data_dir / IDENTITY_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise IdentityError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        obj = json.loads(raw)
        state = obj["state"]
        if obj.get("format") != FORMAT or state not in _STATES:
            raise ValueError(f"format {obj.get('format')!r}, state {state!r}")
        return Identity(cluster=str(obj["cluster"]), node=str(obj["node"]), state=state)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise IdentityError(f"{path} is corrupt ({e}); if this directory is this node's, "
                            f"delete the file and restart: the node then recovers from its "
                            f"peers") from None


def write_identity(data_dir: Path, identity: Identity, *, durable: bool = True) -> None:
    """Replace `data_dir`'s IDENTITY atomically (and durably unless `durable` is False)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / IDENTITY_NAME
    tmp = data_dir / (IDENTITY_NAME + ".tmp")
    body = json.dumps({"format": FORMAT, "cluster": identity.cluster, "node": identity.node,
                       "state": identity.state}, sort_keys=True).encode() + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        dfd = os.open(data_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def prepare_data_dir(data_dir: Path, *, node: str, ca_certificate: Path) -> None:
    """Mark `data_dir` as the (empty) directory of brand-new node `node`: it then starts as
    a voter of a new cluster. `phalanx cluster init` calls this for every node; call it
    yourself when you lay out a new cluster by hand. Raises `IdentityError` if the directory
    already holds anything but an IDENTITY of `new`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    existing = read_identity(data_dir)
    others = [p.name for p in data_dir.iterdir() if p.name != IDENTITY_NAME]
    if others or (existing is not None and existing.state != "new"):
        raise IdentityError(f"{data_dir} is not a new node's empty data directory; "
                            "refusing to mark it new")
    write_identity(data_dir, Identity(cluster=cluster_fingerprint(ca_certificate), node=node,
                                      state="new"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    recovering: bool
    """Start the core in recovery mode (no votes until caught up)."""
    reason: str
    """Why, for the start-up message ('' when nothing was lost)."""
    next_state: State
    """What to record in IDENTITY before the core starts."""


def amnesia(*, identity: Identity | None, has_state: bool, has_hard_state: bool,
            state_lost: str | None = None, bootstrap: bool = False,
            single_voter: bool = False) -> Verdict:
    """Decide whether a node starts in recovery mode. Pure (the simulator uses it too).

    Args:
        identity: the IDENTITY found (already checked to be this node's), or None.
        has_state: the directory holds any durable consensus state (hard state, log
            entries, a checkpoint).
        has_hard_state: the hard state (term and vote) was found.
        state_lost: the storage layer's reason when it cut or dropped durable state it had
            (a repaired log, unreadable checkpoints), else None.
        bootstrap: the caller asserts this is a brand-new cluster (`--bootstrap`).
        single_voter: the node is its configuration's only voter: there is no one to recover
            from, so a loss is reported but never waits.
    """
    def recover(reason: str) -> Verdict:
        if single_voter:
            return Verdict(recovering=False, reason=reason + " (single-node cluster: there is "
                           "no peer to recover from; starting with what is left)",
                           next_state="member")
        return Verdict(recovering=True, reason=reason, next_state="recovering")

    if identity is not None and identity.state == "recovering":
        return recover("a recovery from peers was interrupted")
    if state_lost is not None:
        return recover(state_lost)
    if identity is None:
        if not has_state:
            if bootstrap:
                return Verdict(recovering=False, reason="", next_state="new")
            return recover("the data directory is empty and has no IDENTITY file (a lost or "
                           "replaced disk, or a wrong data_dir)")
        if not has_hard_state:
            return recover("the hard state (term and vote) is missing")
        return Verdict(recovering=False, reason="", next_state="member")
    if identity.state == "new":
        return Verdict(recovering=False, reason="",
                       next_state="member" if has_state else "new")
    if not has_state:
        return recover("the data directory lost all its state (IDENTITY says this node "
                       "was already a member)")
    if not has_hard_state:
        return recover("the hard state (term and vote) is missing")
    return Verdict(recovering=False, reason="", next_state="member")
