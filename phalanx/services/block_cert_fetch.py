"""Fetching block certificates a node lacks from its peers (the block-certifier service).

Owns: `CertificateFetcher`, sans-IO: which heights to ask which peer for (`tick`), which
of a peer's certificates to keep (`answer`), and what to answer a peer's request
(`serve`). The service (`phalanx.services.block_certifier`) sends and stores.

Why: a node that was down while a block was signed never saw its peers' signatures (they
are sent once), so its own certifier cannot complete that block's certificate; after it
catches up (log replay, retransmission or state transfer) it asks peers for the stored
certificates of heights it holds blocks for but no certificate.

Invariants:
- Never trusts the sender: a fetched certificate is kept only when it verifies against the
  node's OWN block at that height (`BlockStream.block_hash_at`), the cluster's node keys
  and quorum (`verify_block_certificate`). Anything else is dropped and counted by reason
  (`malformed`, `unknown_block`, `divergent`: a quorum certified a block other than this
  node's, `bad_certificate`), never raised.
- Bounded: one `CertificateFetch` of at most `MAX_FETCH` heights per tick, round-robin over
  the peers; a height is asked only once it has lacked a certificate for `patience` ticks
  (the signatures of a fresh block are normally still arriving); after `max_tries` asks
  (default: twice per peer) a height is given up (`gave_up`: no peer holds it, e.g. blocks
  closed before the service was enabled). Held state is O(keep + MAX_FETCH).
- Deterministic: no clocks or randomness; the peer order is the configured one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from phalanx.apps.chain.certificate import BlockCertificate, verify_block_certificate
from phalanx.consensus.types import NodeId
from phalanx.services.block_cert_api import MAX_FETCH, CertificateBatch, CertificateFetch

Have = Callable[[int], bool]
"""Whether the node stores a certificate of this height."""
HashAt = Callable[[int], "bytes | None"]
"""The hash of the node's own block at this height (None: it holds none)."""


class CertificateFetcher:
    """One node's certificate fetching (see the module docstring)."""

    def __init__(self, *, peers: tuple[NodeId, ...], node_keys: Mapping[str, bytes],
                 quorum: int, chain_id: bytes, keep: int, patience: int = 5,
                 max_tries: int | None = None) -> None:
        if keep < 1 or patience < 0:
            raise ValueError("keep must be >= 1 and patience >= 0")
        self._peers = peers
        self._keys = dict(node_keys)
        self._quorum, self._chain_id, self._keep = quorum, chain_id, keep
        self._patience = patience
        self._max_tries = max_tries if max_tries is not None else 2 * max(1, len(peers))
        self._heights: deque[int] = deque(maxlen=patience + 1)
        """The node's height at each of the last `patience` + 1 ticks."""
        self._done = 0
        """Every height <= this one is stored or given up (or below the kept range)."""
        self._tries: dict[int, int] = {}
        self._gave_up: set[int] = set()
        self._next_peer = 0
        self.counts: dict[str, int] = {}

    def tick(self, height: int, have: Have) -> tuple[NodeId, CertificateFetch] | None:
        """The request to send this tick (peer, message), or None: the node is at block
        `height`; `have` tells which heights it stores a certificate of."""
        self._heights.append(height)
        floor = max(0, height - self._keep)
        if self._done < floor:
            self._done = floor
            self._tries = {h: n for h, n in self._tries.items() if h > floor}
            self._gave_up = {h for h in self._gave_up if h > floor}
        while self._done < height and (have(self._done + 1) or self._done + 1 in self._gave_up):
            self._tries.pop(self._done + 1, None)
            self._gave_up.discard(self._done + 1)
            self._done += 1
        if not self._peers or len(self._heights) <= self._patience:
            return None
        limit = min(self._heights[0], height)  # lacking for `patience` ticks at least
        wanted: list[int] = []
        h = self._done
        while h < limit and len(wanted) < MAX_FETCH:
            h += 1
            if h in self._gave_up or have(h):
                continue
            tries = self._tries.get(h, 0) + 1
            if tries > self._max_tries:
                self._gave_up.add(h)
                self._count("gave_up")
                continue
            self._tries[h] = tries
            wanted.append(h)
        if not wanted:
            return None
        peer = self._peers[self._next_peer % len(self._peers)]
        self._next_peer += 1
        self._count("requests")
        return peer, CertificateFetch(heights=tuple(wanted))

    def answer(self, batch: CertificateBatch, have: Have, hash_at: HashAt
               ) -> list[BlockCertificate]:
        """The certificates of a peer's `batch` to store: each verified against this node's
        own block at its height. The rest is dropped and counted."""
        certs = batch.certificates
        if type(certs) is not tuple or len(certs) > MAX_FETCH:
            self._count("dropped:malformed")
            return []
        out: list[BlockCertificate] = []
        for cert in certs:
            if not isinstance(cert, BlockCertificate) or type(cert.height) is not int:
                self._count("dropped:malformed")
                continue
            if have(cert.height) or any(c.height == cert.height for c in out):
                self._count("duplicate")
                continue
            own = hash_at(cert.height) if cert.height >= 1 else None
            if own is None:
                self._count("dropped:unknown_block")
            elif cert.block_hash != own:
                self._count("dropped:divergent")
            elif not verify_block_certificate(cert, cert.height, own, self._keys,
                                              self._quorum, chain_id=self._chain_id):
                self._count("dropped:bad_certificate")
            else:
                self._count("fetched")
                out.append(cert)
        return out

    def serve(self, request: CertificateFetch,
              get: Callable[[int], BlockCertificate | None]) -> CertificateBatch | None:
        """The answer to a `CertificateFetch` (the stored certificates of its heights), or
        None when it is malformed (counted)."""
        heights = request.heights
        if (type(heights) is not tuple or len(heights) > MAX_FETCH
                or not all(type(h) is int and h >= 1 for h in heights)):
            self._count("dropped:malformed_fetch")
            return None
        found = (get(h) for h in sorted(set(heights)))
        self._count("served")
        return CertificateBatch(certificates=tuple(c for c in found if c is not None))

    @property
    def done(self) -> int:
        """Every height up to this one is certified here (or given up)."""
        return self._done

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
