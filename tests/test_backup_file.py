"""The backup file (`phalanx.ops.backup_file`): what is written reads back exactly, and any
damage (a flipped byte anywhere, a cut) is refused with a message naming the file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.ops.backup_file import BackupFileError, BackupHeader, read_backup, write_backup
from phalanx.storage.interface import StoredCheckpoint


def _header(data: bytes, index: int) -> BackupHeader:
    return BackupHeader(protocol="raft", app="kv", index=index, term=3, node="n1",
                        cluster="ab" * 16, voters=("n1", "n2", "n3"),
                        created="2026-12-02T08:00:00+00:00", data_bytes=len(data),
                        data_sha256=hashlib.sha256(data).hexdigest())


@settings(max_examples=25, deadline=None)
@given(data=st.binary(max_size=3000), meta=st.binary(max_size=40),
       index=st.integers(0, 2**40), flip=st.integers(0, 10**6))
def test_round_trip_and_every_flipped_byte_is_refused(
        tmp_path_factory: pytest.TempPathFactory, data: bytes, meta: bytes, index: int,
        flip: int) -> None:
    path = tmp_path_factory.mktemp("b") / "x.phx"
    header = _header(data, index)
    write_backup(path, header, StoredCheckpoint(index=index, data=data, meta=meta))
    assert read_backup(path) == (header, StoredCheckpoint(index=index, data=data, meta=meta))
    raw = bytearray(path.read_bytes())
    at = flip % len(raw)
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(BackupFileError, match=r"x\.phx"):
        read_backup(path)
    path.write_bytes(bytes(raw[:at]))  # cut short anywhere
    with pytest.raises(BackupFileError, match=r"x\.phx"):
        read_backup(path)


def test_a_header_that_lies_about_the_data_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.phx"
    write_backup(path, _header(b"other", 7), StoredCheckpoint(index=7, data=b"state", meta=b""))
    with pytest.raises(BackupFileError, match="does not match its header"):
        read_backup(path)
