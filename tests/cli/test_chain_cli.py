"""`phalanx chain` on a real 3-node Raft chain cluster (node processes; the CLI in-process):
transfers, reads, blocks, tail, proofs, the light client against one replica, export and
validate; bad input is one line with its exit code and changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.cli.main import main
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("chain") / "c"
    config = init_cluster(directory, nodes=3, app="chain", base_port=find_free_base_port(3))
    with NodeProcesses(config) as procs:
        procs.start()
        yield directory


def run(capsys: pytest.CaptureFixture[str], cluster: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["chain", "--cluster", str(cluster), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def wait_ready(capsys: pytest.CaptureFixture[str], cluster: Path) -> None:
    deadline = time.monotonic() + 20
    while run(capsys, cluster, "--timeout", "2", "head")[0] != 0:
        assert time.monotonic() < deadline, "the cluster never answered"


def test_transfer_read_blocks_verify_export_validate(
        capsys: pytest.CaptureFixture[str], cluster: Path, tmp_path: Path) -> None:
    wait_ready(capsys, cluster)
    code, out, _ = run(capsys, cluster, "keygen", "bob")
    assert code == 0
    bob = out.split()[1]
    assert len(bytes.fromhex(bob)) == 32
    assert run(capsys, cluster, "transfer", "--from", "a1", "bob", "250")[0] == 0
    code, out, _ = run(capsys, cluster, "transfer", "--from", "a1", bob, "50")
    assert code == 0
    height = int(out.split()[-1])
    assert run(capsys, cluster, "balance", "bob")[1] == "300\n"
    assert run(capsys, cluster, "balance", "a1")[1] == "999700\n"
    assert run(capsys, cluster, "nonce", "a1")[1] == "2\n"
    code, out, _ = run(capsys, cluster, "block", str(height))
    assert code == 0
    assert f"block {height} " in out
    assert "transfer" in out
    assert "  certificate " in out  # 2 of 3 on Raft once the signatures arrived
    code, out, _ = run(capsys, cluster, "tail", "--from-height", "1", "--count", "2")
    assert code == 0
    assert out.count("\nblock ") + out.startswith("block ") == 2
    code, out, _ = run(capsys, cluster, "proof", "bob")
    assert code == 0
    assert out.startswith("height ")
    code, out, err = run(capsys, cluster, "verify", "bob", "--replica", "n2")
    assert code == 0, err
    assert "verified: balance 300 nonce 0" in out
    assert "header trusted by certificate (" in out  # the block-certifier's, from n2 alone
    exported = tmp_path / "chain.bin"
    code, out, _ = run(capsys, cluster, "export", str(exported))
    assert code == 0
    assert "with a certificate) to " in out
    code, out, _ = run(capsys, cluster, "validate", str(exported))
    assert code == 0
    assert out.startswith("valid: ")
    assert "blocks certified (quorum 2 of 3 node keys, every certificate verified)" in out
    data = bytearray(exported.read_bytes())
    data[-22] ^= 0x01  # inside the last block's last transaction (before the 12-byte end mark)
    tampered = tmp_path / "tampered.bin"
    tampered.write_bytes(bytes(data))
    code, _, err = run(capsys, cluster, "validate", str(tampered))
    assert code == 1
    assert err.startswith("INVALID: ")


@pytest.mark.parametrize(("argv", "code", "message"), [
    (("transfer", "--from", "a2", "a3", "2000000"), 3, "insufficient_balance"),
    (("transfer", "--from", "a2", "a3", "5", "--nonce", "0"), 2, "must be between"),
    (("balance", "zz"), 2, "neither a key name"),
    (("transfer", "--from", "nokey", "a3", "5"), 2, "cannot read the signing key"),
    (("transfer", "--from", "a2", "a3", "-5"), 2, "error"),
])
def test_bad_input_is_one_line_and_changes_nothing(
        capsys: pytest.CaptureFixture[str], cluster: Path, argv: tuple[str, ...], code: int,
        message: str) -> None:
    wait_ready(capsys, cluster)
    before = [run(capsys, cluster, "balance", a)[1] for a in ("a2", "a3")]
    head = run(capsys, cluster, "head")[1]
    try:
        got, _, err = run(capsys, cluster, *argv)
    except SystemExit as e:  # argparse's usage errors
        got, err = int(str(e.code)), capsys.readouterr().err
    assert got == code
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert [run(capsys, cluster, "balance", a)[1] for a in ("a2", "a3")] == before
    assert run(capsys, cluster, "head")[1] == head  # nothing was even sent


def test_stale_nonce_is_refused_with_no_effect(
        capsys: pytest.CaptureFixture[str], cluster: Path) -> None:
    wait_ready(capsys, cluster)
    assert run(capsys, cluster, "transfer", "--from", "a4", "a5", "1", "--nonce", "7")[0] == 0
    code, _, err = run(capsys, cluster, "transfer", "--from", "a4", "a5", "1", "--nonce", "7")
    assert code == 3
    assert "stale_nonce" in err
    assert run(capsys, cluster, "balance", "a5")[1] == "1000001\n"


def test_a_kv_cluster_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    init_cluster(tmp_path / "kv", nodes=1)
    code, _, err = run(capsys, tmp_path / "kv", "head")
    assert code == 2
    assert "runs the kv app, not a chain" in err


def test_kv_refuses_a_chain_cluster(capsys: pytest.CaptureFixture[str], cluster: Path) -> None:
    assert main(["kv", "--cluster", str(cluster), "get", "k"]) == 2
    assert "runs the chain app, not a KV store" in capsys.readouterr().err


@pytest.mark.parametrize(("verdict", "code", "says"), [
    (True, 0, "header trusted by certificate"),
    (False, 1, "certificate from n3 does not verify"),
])
def test_a_certificate_check_decides_alone_when_it_has_a_verdict(
        capsys: pytest.CaptureFixture[str], cluster: Path, monkeypatch: pytest.MonkeyPatch,
        verdict: bool, code: int, says: str) -> None:
    from phalanx.client import chain_light

    wait_ready(capsys, cluster)
    assert run(capsys, cluster, "transfer", "--from", "a3", "a4", "1")[0] == 0
    monkeypatch.setattr(chain_light, "certificate_check",
                        lambda header, genesis, cluster: verdict)
    got, out, err = run(capsys, cluster, "verify", "a3", "--replica", "n3")
    assert got == code
    assert says in out + err


def test_a_malformed_key_file_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], cluster: Path) -> None:
    bad = cluster / "chain" / "keys" / "bad.key"
    bad.write_text("not a key\n")
    code, _, err = run(capsys, cluster, "transfer", "--from", "bad", "a1", "5")
    assert code == 2
    assert "the signing key is not hex" in err
    code, _, err = run(capsys, cluster, "balance", "bad")
    assert code == 2
    bad.unlink()
