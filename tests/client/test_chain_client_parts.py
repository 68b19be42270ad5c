"""The chain's client-side pieces that need no running cluster: the typed errors, the
export file format, the proposer rule, and the harness workload's block verification."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.chain.block import chain_id
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.tx import TxBody, public_key, sign
from phalanx.apps.chain.types import BlockData, ChainError, ChainErrorCode, Genesis
from phalanx.apps.interface import BatchInfo
from phalanx.appspec.chain_app import account_key, key_path, read_genesis
from phalanx.client.chain import ERRORS, ChainCommandError, StaleNonce, error_for, expect
from phalanx.client.chain_export import ExportFormatError, read_export, write_export
from phalanx.client.errors import ProtocolViolation, RequestRejected
from phalanx.jepsen.chain_bank import ChainBankWorkload
from phalanx.jepsen.workloads import WorkloadConfig
from phalanx.ops.local_cluster import init_cluster
from phalanx.protocols import ProposerRule
from phalanx.protocols import get as protocol_spec


def test_every_chain_error_code_has_its_own_exception() -> None:
    assert set(ERRORS) == set(ChainErrorCode)
    assert len(set(ERRORS.values())) == len(ChainErrorCode)
    e = error_for(ChainError(code=ChainErrorCode.STALE_NONCE, message="nonce 1 <= last 1"))
    assert isinstance(e, StaleNonce)
    assert isinstance(e, ChainCommandError)
    assert isinstance(e, RequestRejected)  # no effect, like every refusal
    assert e.code is ChainErrorCode.STALE_NONCE
    assert "stale_nonce" in str(e)
    with pytest.raises(ProtocolViolation):
        expect(b"\xc1garbage", BlockData)


def test_the_term_round_robin_rule_names_a_member() -> None:
    spec = dataclasses.replace(protocol_spec("pbft"),
                               proposer_rule=ProposerRule.TERM_ROUND_ROBIN)
    nodes = ("n3", "n1", "n2", "n4")
    assert [spec.proposer_of(v, nodes) for v in range(5)] == ["n1", "n2", "n3", "n4", "n1"]
    assert spec.proposer_function(nodes)(6) == "n3"


@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_cluster(tmp_path_factory.mktemp("c") / "c", nodes=1, app="chain").directory


def _blocks(cluster: Path, count: int) -> tuple[Genesis, list[BlockData]]:
    genesis = read_genesis(cluster / "chain" / "genesis.bin")
    a1, a2 = (account_key(key_path(cluster, n)) for n in ("a1", "a2"))
    machine = ChainStateMachine(genesis)
    for h in range(1, count + 1):
        machine.begin_batch(BatchInfo(index=h, timestamp=0, proposer=""))
        machine.apply(sign(a1, TxBody(chain_id=chain_id(genesis), sender=public_key(a1),
                                      nonce=h, method="transfer",
                                      args=(public_key(a2), h))).raw)
        machine.end_batch()
    return genesis, [b for h in range(1, count + 1) if (b := machine.block(h)) is not None]


@settings(max_examples=10, deadline=None)
@given(cut=st.integers(min_value=1, max_value=400), flip=st.integers(min_value=0))
def test_export_round_trips_and_a_damaged_file_is_refused(
        chain_dir: Path, tmp_path_factory: pytest.TempPathFactory, cut: int, flip: int) -> None:
    genesis, blocks = _blocks(chain_dir, 3)
    path = tmp_path_factory.mktemp("x") / "chain.bin"
    write_export(path, genesis, blocks)
    assert read_export(path) == (genesis, blocks)
    data = path.read_bytes()
    path.write_bytes(data[:-min(cut, len(data) - 1)])
    with pytest.raises(ExportFormatError):
        read_export(path)
    damaged = bytearray(data)
    damaged[flip % 16] ^= 0xFF  # inside the magic
    path.write_bytes(bytes(damaged))
    with pytest.raises(ExportFormatError, match="magic"):
        read_export(path)


def test_an_export_cut_at_a_frame_boundary_is_refused_not_read_as_a_shorter_chain(
        chain_dir: Path, tmp_path: Path) -> None:
    """Every frame boundary: without the end mark (version 1) a cut there read as a valid
    chain of fewer blocks (hypothesis found one: cut = 309 of the test above)."""
    from phalanx.client.chain_export import END, MAGIC, MAGIC_V1

    genesis, blocks = _blocks(chain_dir, 3)
    path = tmp_path / "chain.bin"
    write_export(path, genesis, blocks)
    data = path.read_bytes()
    assert data.startswith(MAGIC)
    assert data[-12:-8] == END
    boundaries, pos = [], len(MAGIC)
    while data[pos:pos + 4] != END:
        pos += 4 + int.from_bytes(data[pos:pos + 4], "big")
        boundaries.append(pos)
    assert len(boundaries) == 1 + len(blocks)
    for cut in boundaries:
        path.write_bytes(data[:cut])
        with pytest.raises(ExportFormatError, match="no end mark"):
            read_export(path)
    path.write_bytes(data[:-12] + END + (len(blocks) + 1).to_bytes(8, "big"))
    with pytest.raises(ExportFormatError, match="end mark names"):
        read_export(path)
    path.write_bytes(data + b"x")
    with pytest.raises(ExportFormatError, match="after it"):
        read_export(path)
    path.write_bytes(MAGIC_V1 + data[len(MAGIC):-12])  # a version-1 file: still read
    assert read_export(path) == (genesis, blocks)


def test_the_bank_workload_verifies_blocks_and_stops_at_a_bad_one(chain_dir: Path) -> None:
    from phalanx.ops.node_config import load_cluster_config

    w = ChainBankWorkload(WorkloadConfig(), load_cluster_config(chain_dir))
    assert w.accounts == ("a1", "a2", "a3", "a4", "a5")
    _, blocks = _blocks(chain_dir, 3)
    assert w._extend(blocks[0]) is None
    assert w._extend(blocks[2]) is not None
    forged = dataclasses.replace(blocks[1], txs=())  # tx root and state root now wrong
    assert "state root" in (w._extend(forged) or "")
    assert w.blocks_verified == 1
