"""Checkpoint views: the runtime hands cores a view of the checkpoint file, not its bytes.

`FileRange` must read exactly what a `bytes` slice would, keep working after the checkpoint is
superseded and removed, and refuse what `bytes` would do differently (steps, integer indexes).
`CheckpointStore.read_view` must return the data that was saved, on every backend, and the
threaded writer must hand the replica such a view (so a node holds no copy of its newest
checkpoint in memory).
"""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.apps.writer import ThreadedCheckpointWriter
from phalanx.consensus.core import snapshot_bytes
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    NodeId,
)
from phalanx.storage.checkpoint import FileCheckpointStore, checkpoint_name, encode_header
from phalanx.storage.directory import FileRange, OsDirectory
from phalanx.storage.interface import StorageError, StoredCheckpoint, SyncPolicy
from phalanx.storage.memory import MemoryDirectory
from phalanx.storage.packs import PackView
from phalanx.storage.volatile import VolatileDirectory

PAYLOAD = bytes(range(256)) * 40 + b"tail"


def _file(tmp: pathlib.Path, data: bytes) -> str:
    path = tmp / "blob"
    path.write_bytes(data)
    return str(path)


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, len(PAYLOAD)),
    lo=st.one_of(st.none(), st.integers(-len(PAYLOAD) - 5, len(PAYLOAD) + 5)),
    hi=st.one_of(st.none(), st.integers(-len(PAYLOAD) - 5, len(PAYLOAD) + 5)),
)
def test_file_range_slices_like_bytes(
    tmp_path_factory: pytest.TempPathFactory, start: int, lo: int | None, hi: int | None
) -> None:
    path = _file(tmp_path_factory.mktemp("r"), PAYLOAD)
    expected = PAYLOAD[start:]
    view = FileRange(path, start, len(expected))
    try:
        assert len(view) == len(expected)
        assert view[lo:hi] == expected[lo:hi]
        assert snapshot_bytes(view) == expected
    finally:
        view.close()


def test_file_range_outlives_rename_and_removal(tmp_path: pathlib.Path) -> None:
    path = _file(tmp_path, PAYLOAD)
    view = FileRange(path, 10, 100)
    other = tmp_path / "newer"
    other.write_bytes(b"x" * 500)
    os.replace(other, path)  # a newer checkpoint renamed over it
    assert view[:] == PAYLOAD[10:110]
    os.remove(path)  # and then removed by `keep`
    assert view[5:7] == PAYLOAD[15:17]
    view.close()
    with pytest.raises(ValueError, match="closed"):
        view[:1]


def test_file_range_refuses_what_bytes_would_do_differently(tmp_path: pathlib.Path) -> None:
    path = _file(tmp_path, PAYLOAD)
    with pytest.raises(ValueError, match="past the end"):
        FileRange(path, 10, len(PAYLOAD))
    with pytest.raises(ValueError, match="bad file range"):
        FileRange(path, -1, 3)
    view = FileRange(path, 0, 50)
    with pytest.raises(ValueError, match="contiguous"):
        view[::2]
    with pytest.raises(TypeError):
        view[3]  # type: ignore[call-overload]
    view.close()


def _stores(tmp: pathlib.Path) -> list[FileCheckpointStore]:
    return [
        FileCheckpointStore(OsDirectory(str(tmp / "os")), keep=1),
        FileCheckpointStore(MemoryDirectory("m"), keep=1),
        FileCheckpointStore(VolatileDirectory(str(tmp / "vol")), keep=1),
        FileCheckpointStore(VolatileDirectory(str(tmp / "vol-off")), keep=1,
                            sync=SyncPolicy.OFF),
    ]


def test_read_view_returns_the_saved_data_on_every_backend(tmp_path: pathlib.Path) -> None:
    for store in _stores(tmp_path):
        store.save(StoredCheckpoint(7, PAYLOAD, b"meta bytes"))
        view = store.read_view(7)
        assert len(view) == len(PAYLOAD)
        assert view[:] == PAYLOAD
        assert view[100:164] == PAYLOAD[100:164]
        store.save(StoredCheckpoint(9, b"newer", b""))  # keep=1: checkpoint 7 is removed
        assert store.indexes() == [9]
        assert view[:] == PAYLOAD, store
        assert store.read_view(9)[:] == b"newer"
        with pytest.raises(StorageError, match="checkpoint 7"):
            store.read_view(7)


def test_read_view_refuses_a_file_that_is_not_the_checkpoint(tmp_path: pathlib.Path) -> None:
    directory = OsDirectory(str(tmp_path))
    store = FileCheckpointStore(directory)
    store.save(StoredCheckpoint(3, PAYLOAD, b""))
    os.rename(directory.path("checkpoint-00000000000000000003.ckpt"),
              directory.path("checkpoint-00000000000000000004.ckpt"))
    with pytest.raises(StorageError, match="not checkpoint 4"):
        store.read_view(4)


def _put(index: int) -> Entry:
    command = kv_wire.encode_command(Put(key=f"k{index % 17}", value=b"v" * 50))
    request = ClientRequest(client_id="c", request_no=index, command=command)
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=(request,))


def test_threaded_writer_hands_the_core_a_file_view(tmp_path: pathlib.Path) -> None:
    store = FileCheckpointStore(OsDirectory(str(tmp_path)), keep=1)
    writer = ThreadedCheckpointWriter(store)
    replica = Replica(KvStateMachine(), checkpoints=store, writer=writer,
                      policy=CheckpointPolicy(every_entries=20, every_bytes=0),
                      config=Configuration(voters=(NodeId("n1"),)))
    taken = []
    for i in range(1, 61):
        replica.apply(_put(i))
        writer.wait()
        taken.extend(replica.poll())
    replica.close()
    assert [t.index for t in taken] == [20, 40, 60]
    assert all(isinstance(t.data, FileRange | PackView) for t in taken)
    loaded = store.load_latest().checkpoint
    assert loaded is not None
    assert store.indexes() == [60]
    assert snapshot_bytes(taken[-1].data) == loaded.data
    # The older views still read their (removed) checkpoints, which differ from the newest.
    assert snapshot_bytes(taken[0].data) != loaded.data
    assert len(taken[0].data) > 0


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.binary(max_size=3000), max_size=12),
    meta=st.binary(max_size=64),
    step=st.sampled_from([1, 7, 4096]),
)
def test_streamed_checkpoints_round_trip(parts: list[bytes], meta: bytes, step: int) -> None:
    store = FileCheckpointStore(MemoryDirectory("s"), keep=2)
    written = store.save_stream(5, meta, iter(parts), write_bytes=step)
    assert written == len(b"".join(parts))
    loaded = store.load_latest()
    assert loaded.problems == ()
    assert loaded.checkpoint == StoredCheckpoint(5, b"".join(parts), meta)
    assert store.read_view(5)[:] == b"".join(parts)


def _stream_file(tmp: pathlib.Path) -> tuple[OsDirectory, FileCheckpointStore, str]:
    directory = OsDirectory(str(tmp))
    store = FileCheckpointStore(directory, keep=3, layout=2)  # the previous writer
    legacy = StoredCheckpoint(1, b"old v1 data", b"m1")  # as earlier versions wrote it
    with open(directory.path(checkpoint_name(1)), "wb") as f:
        f.write(encode_header(legacy) + legacy.meta + legacy.data)
    store.save_stream(2, b"meta", iter([PAYLOAD[:5000], PAYLOAD[5000:]]))
    return directory, store, directory.path("checkpoint-00000000000000000002.ckpt")


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda raw: raw[:-3], "no end marker"),
        (lambda raw: raw[:26] + bytes([raw[26] ^ 1]) + raw[27:], "header checksum"),
        (lambda raw: raw[:500] + bytes([raw[500] ^ 4]) + raw[501:], "checksum mismatch"),
        (lambda raw: raw[:-20] + (1).to_bytes(8, "little") + raw[-12:], "trailer says 1"),
        (lambda raw: raw[:16] + b"\xff\xff\xff\x00" + raw[20:], "does not fit"),
        (lambda raw: raw[:10], "only 10 bytes"),
        (lambda raw: b"PHXCKP09" + raw[8:], "bad magic"),
    ],
)
def test_a_damaged_streamed_checkpoint_is_reported_and_the_older_one_loads(
    tmp_path: pathlib.Path, damage: object, problem: str
) -> None:
    _, store, path = _stream_file(tmp_path)
    raw = pathlib.Path(path).read_bytes()
    assert callable(damage)
    pathlib.Path(path).write_bytes(damage(raw))
    loaded = store.load_latest()
    assert loaded.checkpoint == StoredCheckpoint(1, b"old v1 data", b"m1")
    assert len(loaded.problems) == 1
    assert problem in loaded.problems[0]
    assert path in loaded.problems[0]


def test_both_layouts_load_and_view(tmp_path: pathlib.Path) -> None:
    _, store, _ = _stream_file(tmp_path)
    assert store.load_latest().checkpoint == StoredCheckpoint(2, PAYLOAD, b"meta")
    assert store.read_view(1)[:] == b"old v1 data"
    assert store.read_view(2)[:] == PAYLOAD


def test_a_failing_stream_stores_nothing(tmp_path: pathlib.Path) -> None:
    directory, store, _ = _stream_file(tmp_path)

    def broken() -> object:
        yield b"some data"
        raise RuntimeError("serialiser failed")

    with pytest.raises(RuntimeError, match="serialiser failed"):
        store.save_stream(3, b"", broken())  # type: ignore[arg-type]
    assert store.indexes() == [1, 2]
    loaded = store.load_latest()
    assert loaded.checkpoint is not None
    assert loaded.checkpoint.index == 2
    store.save_stream(4, b"", iter([b"next"]))  # the stray temp file is cleaned up
    assert not [n for n in directory.list() if n.endswith(".tmp")]
