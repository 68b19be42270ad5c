"""Node-local durable storage of block certificates (the block-certifier service's files).

Owns: `CertificateStore`, the directory ``DATA/services/block-certificates/`` of append-only
segment files ``seg-NNNNNNNN.log`` (NNNNNNNN: the segment's sequence number). A record is
``length (u32 BE) || SHA-256(payload) (32) || payload``, the payload the certificate's
codec bytes (`phalanx.apps.chain.certificate.encode_certificate`).

Invariants:
- A torn write never loads: a record whose length runs past the file, whose checksum does
  not match or whose payload does not decode ends the segment; the file is truncated there
  on open (counted in `torn`) and appends continue after the last whole record.
- One certificate per height: `put` of a stored height is ignored.
- Bounded: at most `keep` certificates (plus one segment) are held, in memory and on disk;
  the oldest segment is deleted whole when the count exceeds `keep`.
- Durability: `put` writes the record (unbuffered `os.write`); `sync` fsyncs the segment
  (the service calls it every tick). A crash loses at most the certificates of the last
  tick: a lost certificate is not a safety problem (a light client then falls back to f+1
  identical headers); a corrupt one cannot load.

Must not import: trio, the runtime. Raises `OSError` only for our own disk failing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from phalanx.apps.chain.certificate import (
    BlockCertificate,
    decode_certificate,
    encode_certificate,
)

DIRECTORY = "block-certificates"
_HEADER = 4 + 32
_MAX_RECORD = 1 << 20


def _segment_name(seq: int) -> str:
    return f"seg-{seq:08d}.log"


class CertificateStore:
    """Certificates by height, durable under `directory` (see the module docstring)."""

    def __init__(self, directory: Path, *, keep: int = 10_000, segment_records: int = 1_000
                 ) -> None:
        if keep < 1 or segment_records < 1:
            raise ValueError("keep and segment_records must be >= 1")
        self._dir = directory
        self._keep, self._per_segment = keep, segment_records
        self._dir.mkdir(parents=True, exist_ok=True)
        self._certs: dict[int, BlockCertificate] = {}
        self._segments: dict[int, list[int]] = {}
        """segment sequence number -> the heights it holds, in write order."""
        self.torn = 0
        """Segments whose tail was torn or corrupt (truncated on open)."""
        self.bytes_written = 0
        self._fd: int | None = None
        self._seq = 0
        self._dirty = False
        self._load()

    # -- reading ------------------------------------------------------------------------

    def get(self, height: int) -> BlockCertificate | None:
        return self._certs.get(height)

    def __len__(self) -> int:
        return len(self._certs)

    @property
    def newest(self) -> int:
        """The highest stored height (0: none)."""
        return max(self._certs, default=0)

    def _load(self) -> None:
        seqs = sorted(int(p.name[4:12]) for p in self._dir.glob("seg-*.log")
                      if p.name[4:12].isdigit() and len(p.name) == 16)
        for seq in seqs:
            heights: list[int] = []
            path = self._dir / _segment_name(seq)
            data = path.read_bytes()
            good = 0
            while good + _HEADER <= len(data):
                length = int.from_bytes(data[good:good + 4], "big")
                end = good + _HEADER + length
                payload = data[good + _HEADER:end]
                if (length > _MAX_RECORD or end > len(data)
                        or hashlib.sha256(payload).digest() != data[good + 4:good + _HEADER]):
                    break
                cert = decode_certificate(payload)
                if cert is None:
                    break
                if cert.height not in self._certs:
                    self._certs[cert.height] = cert
                    heights.append(cert.height)
                good = end
            if good != len(data):
                self.torn += 1
                with path.open("r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
            self._segments[seq] = heights
        self._seq = seqs[-1] if seqs else 0
        self._trim()

    # -- writing ------------------------------------------------------------------------

    def put(self, cert: BlockCertificate) -> bool:
        """Store `cert` (durable after the next `sync`); False when its height is stored."""
        if cert.height in self._certs:
            return False
        current = self._segments.get(self._seq)
        if current is None or len(current) >= self._per_segment:
            self._roll()
        payload = encode_certificate(cert)
        record = len(payload).to_bytes(4, "big") + hashlib.sha256(payload).digest() + payload
        fd = self._open()
        written = 0
        while written < len(record):
            written += os.write(fd, record[written:])
        self.bytes_written += len(record)
        self._certs[cert.height] = cert
        self._segments[self._seq].append(cert.height)
        self._dirty = True
        self._trim()
        return True

    def sync(self) -> None:
        """fsync what `put` wrote since the last sync (no-op when nothing was)."""
        if self._dirty and self._fd is not None:
            os.fsync(self._fd)
        self._dirty = False

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._dir / _segment_name(self._seq),
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _roll(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None
        self._seq += 1
        self._segments[self._seq] = []
        self._open()
        dfd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _trim(self) -> None:
        while len(self._certs) > self._keep + self._per_segment and len(self._segments) > 1:
            oldest = min(self._segments)
            for h in self._segments.pop(oldest):
                self._certs.pop(h, None)
            (self._dir / _segment_name(oldest)).unlink(missing_ok=True)
