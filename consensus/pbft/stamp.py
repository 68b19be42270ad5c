"""Block stamps in PBFT: the primary's clock and its id, agreed with the batch.

Owns: `batch_digest` (the digest d a pre-prepare, a prepared certificate, a NewView and a
`CommittedBatch` carry), `fresh_stamp` (what the primary puts into a new pre-prepare) and
`check_stamp` (what a backup refuses). Enabled by `PbftConfig.block_stamp_skew_ms` > 0,
which the node sets only for an app that asks for block time (a machine with `BatchHooks`).

Rules:
- d covers the stamp: ``d = D(m)`` without one (exactly today's digest, so an unstamped
  cluster's messages, traces and checkpoints are unchanged), else
  ``d = H("phalanx.pbft.stamp.v1\\0" || D(m) || timestamp u64 BE || proposer utf-8)``.
  So 2f+1 agree on the stamp with the batch, a relay cannot change it, and a prepared
  batch re-proposed by a new primary in its NewView keeps its timestamp and its original
  proposer (the O set re-issues the prepared pre-prepare's batch, stamp and digest).
- The proposer is the replica that signed the original pre-prepare: a fresh pre-prepare's
  `proposer` must be its sender. With stamps on, every fresh pre-prepare carries one
  (the NewView's null requests carry none: they make no block).
- A backup refuses (drops and counts, never raises) a fresh stamped pre-prepare whose
  timestamp is more than the skew bound away from its own clock (the newest `Tick.now_ms`;
  no reading yet: refused), below the timestamp of the last batch it executed, or out of
  order with the pre-prepares of the same view it accepted at neighbouring sequence numbers.
  A batch commits with 2f+1 prepares, so f+1 honest replicas checked its stamp.

Pure: no clocks (the time is an input), no I/O; must not import `phalanx.net`.
"""

from __future__ import annotations

from phalanx.consensus.crypto import Hasher, digest_of
from phalanx.consensus.pbft.log import MessageLog
from phalanx.consensus.pbft.messages import PrePrepare
from phalanx.consensus.types import ClientRequest

_TAG = b"phalanx.pbft.stamp.v1\x00"
MAX_TIMESTAMP = 2**63 - 1


def batch_digest(
    crypto: Hasher, batch: tuple[ClientRequest, ...], timestamp: int = 0, proposer: str = ""
) -> bytes:
    """The digest d of a batch with its stamp (module docstring); D(m) when unstamped."""
    plain = digest_of(crypto, batch)
    if not timestamp and not proposer:
        return plain
    ts = min(max(timestamp, 0), MAX_TIMESTAMP).to_bytes(8, "big")
    return crypto.digest(_TAG + plain + ts + proposer.encode("utf-8"))


def pp_digest_ok(crypto: Hasher, pp: PrePrepare) -> bool:
    """Whether `pp.digest` is the digest of its batch and stamp."""
    return pp.digest == batch_digest(crypto, pp.batch, pp.timestamp, pp.proposer)


def fresh_stamp(*, now_ms: int, floor: int) -> int | None:
    """The timestamp a primary gives its next pre-prepare: its clock, never below `floor`
    (its previous proposal's or the last executed one's); None while it has no clock."""
    if now_ms <= 0:
        return None
    return max(now_ms, floor)


def check_stamp(
    pp: PrePrepare, *, stamps: bool, skew_ms: int, now_ms: int, executed_ts: int,
    log: MessageLog,
) -> str | None:
    """Why a backup refuses the fresh pre-prepare `pp` (digest and signature already
    checked), or None."""
    if not stamps:
        return "unexpected_stamp" if (pp.timestamp or pp.proposer) else None
    if pp.proposer != pp.replica or pp.timestamp <= 0 or pp.timestamp > MAX_TIMESTAMP:
        return "bad_stamp"
    if now_ms <= 0 or abs(pp.timestamp - now_ms) > skew_ms:
        return "stamp_off_clock"
    if pp.timestamp < executed_ts:
        return "stamp_backwards"
    lo, hi = log.stamp_bounds(pp.view, pp.seq)
    if pp.timestamp < lo or pp.timestamp > hi:
        return "stamp_backwards"
    return None

