"""`phalanx.storage.volatile`: un-fsynced appends live only in process memory.

A "crash" here is abandoning the `VolatileDirectory` object (what SIGKILL does to a node's
memory) and reopening the same path: only fsynced bytes may survive, and every fsynced byte
must.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.storage.directory import OsDirectory
from phalanx.storage.files import Storage
from phalanx.storage.volatile import (
    VolatileDirectory,
    open_node_storage,
    open_volatile_storage,
    volatile_selected,
)

NAMES = ("a", "b")
_op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(NAMES), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("fsync"), st.sampled_from(NAMES), st.just(b"")),
    st.tuples(st.just("truncate"), st.sampled_from(NAMES), st.integers(0, 40).map(
        lambda n: n.to_bytes(1, "big"))),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, max_size=30))
def test_reads_see_every_write_and_a_crash_keeps_exactly_the_fsynced_contents(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str, bytes]]
) -> None:
    root = tmp_path_factory.mktemp("v")
    d = VolatileDirectory(str(root))
    logical = {n: b"" for n in NAMES}
    durable = {n: b"" for n in NAMES}
    for n in NAMES:
        d.create(n)
        d.fsync(n)
    for op, name, arg in ops:
        if op == "append":
            d.append(name, arg)
            logical[name] += arg
        elif op == "fsync":
            d.fsync(name)
            durable[name] = logical[name]
        else:
            length = min(arg[0], len(logical[name]))
            d.truncate(name, length)
            logical[name] = logical[name][:length]
            # A truncate below the disk length acts on the real file at once.
            durable[name] = durable[name][:length]
        assert d.read(name) == logical[name]
        assert d.size(name) == len(logical[name])
        assert d.read_at(name, 2, 5) == logical[name][2:7]
    after_crash = OsDirectory(str(root))  # `d` is abandoned, its buffers with it
    for n in NAMES:
        assert after_crash.read(n) == durable[n]
    after_crash.close()


def test_rename_moves_the_buffer_and_close_writes_it_without_losing_anything(
    tmp_path: Path,
) -> None:
    d = VolatileDirectory(str(tmp_path))
    d.create("x.tmp")
    d.append("x.tmp", b"hello")
    assert d.pending() == 5
    d.rename("x.tmp", "x")
    assert d.read("x") == b"hello"
    assert d.list() == ["x"]
    d.close()
    assert (tmp_path / "x").read_bytes() == b"hello"


def test_append_to_a_missing_file_raises_like_the_os(tmp_path: Path) -> None:
    d = VolatileDirectory(str(tmp_path))
    try:
        d.append("nope", b"x")
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("append to a missing file must raise FileNotFoundError")


def test_a_wal_over_the_volatile_directory_loses_only_unsynced_records(tmp_path: Path) -> None:
    st_ = open_volatile_storage(str(tmp_path))
    st_.wal.append_many([(i, b"synced %d" % i) for i in range(1, 11)])
    st_.wal.sync()
    st_.wal.append_many([(i, b"lost %d" % i) for i in range(11, 21)])
    assert st_.wal.last_index() == 20
    # crash: abandon `st_` without close
    again = open_volatile_storage(str(tmp_path))
    assert again.wal.last_index() == 10
    again.close()


def test_selection_needs_both_switches(tmp_path: Path) -> None:
    assert volatile_selected({"PHALANX_TEST_HOOKS": "1", "PHALANX_VOLATILE_WRITES": "1"})
    assert not volatile_selected({"PHALANX_VOLATILE_WRITES": "1"})
    assert not volatile_selected({"PHALANX_TEST_HOOKS": "1"})
    on = open_node_storage(str(tmp_path / "on"), environ={
        "PHALANX_TEST_HOOKS": "1", "PHALANX_VOLATILE_WRITES": "1"})
    off = open_node_storage(str(tmp_path / "off"), environ={"PHALANX_VOLATILE_WRITES": "1"})
    assert isinstance(on, Storage)
    assert isinstance(on.directory, VolatileDirectory)
    assert isinstance(off.directory, OsDirectory)
    on.close()
    off.close()
