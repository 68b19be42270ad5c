"""`phalanx kv` / `phalanx status` without a cluster: argument handling, result printing and
exit codes, the status table and its JSON. (Against real nodes: test_cli_e2e.py.)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from phalanx.apps.kv_ops import encode_set
from phalanx.apps.kv_types import (
    Add,
    CasResult,
    CompareAndSet,
    Concat,
    Deleted,
    Done,
    Get,
    GetVersion,
    KvError,
    KvErrorCode,
    Mul,
    Put,
    SAdd,
    Scan,
    ScanResult,
    SRem,
    Value,
    VersionResult,
)
from phalanx.cli.kv import (
    EXIT_NEGATIVE,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    add_kv_command,
    build_command,
)
from phalanx.cli.kv_output import print_result as _print_result
from phalanx.cli.status import NodeStatus, add_status_command, format_status_table
from phalanx.net.client_protocol import StatusReply
from phalanx.ops.local_cluster import init_cluster


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phalanx")
    sub = parser.add_subparsers(dest="command")
    add_kv_command(sub)
    add_status_command(sub)
    return parser


def _kv(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["kv", "--cluster", "somewhere", *argv])


def test_build_command_for_every_subcommand() -> None:
    assert build_command(_kv("put", "k", "v")) == (Put(key="k", value=b"v"), False)
    assert build_command(_kv("get", "k")) == (Get(key="k"), True)
    assert build_command(_kv("cas", "k", "a", "b")) == (
        CompareAndSet(key="k", expected=b"a", new=b"b"), False)
    assert build_command(_kv("cas", "--if-absent", "k", "b")) == (
        CompareAndSet(key="k", expected=None, new=b"b"), False)
    assert build_command(_kv("scan", "user/", "--limit", "7")) == (
        Scan(prefix="user/", limit=7), True)
    assert build_command(_kv("scan")) == (Scan(prefix="", limit=1000), True)
    cmd, read_only = build_command(_kv("delete", "k"))
    assert cmd.key == "k"
    assert not read_only


def test_build_command_for_the_updates_and_versions() -> None:
    assert build_command(_kv("add", "n", "-3")) == (Add(key="n", amount=-3), False)
    assert build_command(_kv("mul", "n", "7")) == (Mul(key="n", factor=7), False)
    assert build_command(_kv("sadd", "s", "m")) == (SAdd(key="s", member=b"m"), False)
    assert build_command(_kv("srem", "s", "m")) == (SRem(key="s", member=b"m"), False)
    assert build_command(_kv("concat", "c", "xy")) == (Concat(key="c", suffix=b"xy"), False)
    assert build_command(_kv("version", "k")) == (GetVersion(key="k"), True)
    assert build_command(_kv("smembers", "s", "--stale")) == (Get(key="s"), True)


@pytest.mark.parametrize("operand", ["abc", "1.5", "9223372036854775808", "-9223372036854775809"])
def test_add_operand_must_be_a_64_bit_integer(
    operand: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _kv("add", "n", operand)
    assert exc.value.code == EXIT_USAGE
    assert "argument N" in capsys.readouterr().err


def test_versions_and_sets_print(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    version = GetVersion(key="k")
    digest = bytes(range(64))
    assert _exit(version, VersionResult(version=digest), capsysbinary)[:2] == (
        EXIT_OK, digest.hex().encode() + b"\n")
    code, out, err = _exit(version, VersionResult(version=b""), capsysbinary)
    assert (code, out) == (EXIT_NEGATIVE, b"")
    assert b"not found: k" in err
    get = Get(key="s")
    code = _print_result(get, Value(value=encode_set({b"b", b"a"})), as_set=True)
    assert (code, capsysbinary.readouterr().out) == (EXIT_OK, b"a\nb\n")
    assert _print_result(get, Value(value=None), as_set=True) == EXIT_OK  # the empty set
    assert capsysbinary.readouterr().out == b""
    assert _print_result(get, Value(value=b"plain"), as_set=True) == EXIT_REJECTED
    assert b"is not a set" in capsysbinary.readouterr().err
    assert _exit(Add(key="n", amount=1), Done(), capsysbinary) == (EXIT_OK, b"", b"")


def test_values_keep_arbitrary_bytes_through_argv() -> None:
    import os

    raw = b"caf\xc3\xa9 \xff"
    cmd, _ = build_command(_kv("put", "k", os.fsdecode(raw)))
    assert isinstance(cmd, Put)
    assert cmd.value == raw


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cas", "k", "only-one"], "KEY OLD NEW"),
        (["cas", "k", "a", "b", "c"], "KEY OLD NEW"),
        (["cas", "--if-absent", "k", "a", "b"], "--if-absent takes KEY NEW"),
    ],
)
def test_build_command_rejects_bad_shapes(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_command(_kv(*argv))


def _exit(command: object, result: object, capsys: pytest.CaptureFixture[bytes]) -> tuple[
        int, bytes, bytes]:
    code = _print_result(command, result)  # type: ignore[arg-type]
    out = capsys.readouterr()
    return code, out.out, out.err


def test_results_map_to_output_and_exit_codes(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    get = Get(key="k")
    assert _exit(get, Value(value=b"hello"), capsysbinary)[:2] == (EXIT_OK, b"hello\n")
    code, out, err = _exit(get, Value(value=None), capsysbinary)
    assert (code, out) == (EXIT_NEGATIVE, b"")
    assert b"not found: k" in err
    assert _exit(Put(key="k", value=b"v"), Done(), capsysbinary) == (EXIT_OK, b"", b"")
    assert _exit(get, Deleted(existed=True), capsysbinary)[0] == EXIT_OK
    assert _exit(get, Deleted(existed=False), capsysbinary)[0] == EXIT_NEGATIVE
    assert _exit(get, CasResult(succeeded=True, current=b"n"), capsysbinary)[0] == EXIT_OK
    code, _, err = _exit(get, CasResult(succeeded=False, current=b"other"), capsysbinary)
    assert code == EXIT_NEGATIVE
    assert b"current value is other" in err
    code, _, err = _exit(get, CasResult(succeeded=False, current=None), capsysbinary)
    assert b"current value is (absent)" in err
    code, out, err = _exit(
        Scan(prefix="", limit=2),
        ScanResult(items=(("a", b"1"), ("b", b"2")), more=True), capsysbinary)
    assert (code, out) == (EXIT_OK, b"a\t1\nb\t2\n")
    assert b"raise --limit" in err
    code, _, err = _exit(
        get, KvError(code=KvErrorCode.KEY_TOO_LARGE, message="key too large"), capsysbinary)
    assert code == EXIT_REJECTED
    assert b"key too large" in err


def test_missing_or_absent_cluster_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PHALANX_CLUSTER", raising=False)
    parser = _parser()
    args = parser.parse_args(["kv", "get", "k"])
    assert args.handler(args) == EXIT_USAGE
    assert "no cluster given" in capsys.readouterr().err
    args = parser.parse_args(["kv", "--cluster", str(tmp_path), "get", "k"])
    assert args.handler(args) == EXIT_USAGE
    assert f"no cluster at {tmp_path}" in capsys.readouterr().err
    args = parser.parse_args(["status", "--cluster", str(tmp_path / "x")])
    assert args.handler(args) == EXIT_USAGE
    args = parser.parse_args(["kv", "--cluster", str(tmp_path), "cas", "k", "v"])
    assert args.handler(args) == EXIT_USAGE


def test_cluster_option_defaults_to_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHALANX_CLUSTER", str(tmp_path))
    assert _parser().parse_args(["kv", "get", "k"]).cluster == str(tmp_path)


def test_status_against_stopped_nodes_reports_every_node_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.ops.local_cluster import find_free_base_port

    d = tmp_path / "c"
    init_cluster(d, nodes=3, base_port=find_free_base_port(3))
    args = _parser().parse_args(["status", "--cluster", str(d), "--json", "--timeout", "0.5"])
    assert args.handler(args) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["node"] for r in rows] == ["n1", "n2", "n3"]
    assert all(r["role"] == "unreachable" and r["term"] is None and r["error"] for r in rows)


def _reply(node: str, role: str, connected: tuple[str, ...]) -> StatusReply:
    return StatusReply(nonce=1, node=node, protocol="raft", role=role, term=3, leader="n1",
                       commit_index=42, applied_index=41, last_checkpoint=40,
                       peers=("n2", "n3") if node == "n1" else ("n1", "n3"),
                       connected_peers=connected)


def test_status_table_and_json() -> None:
    rows = [
        NodeStatus(node="n1", reply=_reply("n1", "leader", ("n2",))),
        NodeStatus(node="n2", reply=_reply("n2", "follower", ("n1", "n3"))),
        NodeStatus(node="n3", reply=None, error="no status from n3"),
    ]
    lines = format_status_table(rows).splitlines()
    assert lines[0].split() == ["NODE", "ROLE", "TERM", "LEADER", "COMMIT", "APPLIED",
                                "CHECKPOINT", "PEERS"]
    assert lines[1].split() == ["n1", "leader", "3", "n1", "42", "41", "40", "n2", "n3(down)"]
    assert lines[2].split() == ["n2", "follower", "3", "n1", "42", "41", "40", "n1", "n3"]
    assert lines[3].split()[:2] == ["n3", "unreachable"]
    assert lines[1].index("leader") == lines[0].index("ROLE")  # columns line up
    doc = [r.to_json() for r in rows]
    assert json.loads(json.dumps(doc)) == doc
    assert {k: doc[0][k] for k in ("node", "role", "term", "commit_index")} == {
        "node": "n1", "role": "leader", "term": 3, "commit_index": 42}
    assert doc[0]["connected_peers"] == ["n2"]
    assert doc[2]["role"] == "unreachable"


def test_help_texts_have_examples_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["kv", "--help"], ["status", "--help"]):
        with pytest.raises(SystemExit) as exc:
            _parser().parse_args(argv)
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out
        assert "exit status" in out.lower()


# --------------------------------------------------------------------------------------------
# leaderless (a protocol whose clients sign transactions)


@pytest.fixture
def signing_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cluster directory of a test-only protocol whose clients sign (PBFT's spec with
    `CallStrategy.ENDORSEMENT`), plus a second key "alice"."""
    from dataclasses import replace

    from phalanx.ops.local_cluster import add_client_key
    from phalanx.protocols import CallStrategy, get, registry

    spec = replace(get("pbft"), name="endorse-test", call_strategy=CallStrategy.ENDORSEMENT)
    monkeypatch.setitem(registry._TABLE.specs, spec.name, spec)
    init_cluster(tmp_path / "c", protocol=spec.name, nodes=4, base_port=21000)
    add_client_key(tmp_path / "c", "alice")
    return tmp_path / "c"


def _run_kv_capturing(monkeypatch: pytest.MonkeyPatch, outcome: object) -> dict[str, object]:
    """Replace `run_kv` by a stub that records its arguments and returns or raises `outcome`."""
    import phalanx.cli.kv as cli_kv

    seen: dict[str, object] = {}

    async def fake_run_kv(cluster: object, command: object, **kwargs: object) -> object:
        seen.update(kwargs, command=command)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(cli_kv, "run_kv", fake_run_kv)
    return seen


def test_an_aborted_transaction_prints_one_line_and_exits_3(
        signing_cluster: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from phalanx.client.errors import TransactionAborted

    _run_kv_capturing(monkeypatch, TransactionAborted("version of k changed",
                                                      replicas=("n1", "n2")))
    args = _parser().parse_args(["kv", "--cluster", str(signing_cluster), "put", "k", "v"])
    assert args.handler(args) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert err == "aborted: version of k changed\n"
    _run_kv_capturing(monkeypatch, TransactionAborted("aborted: dropped"))
    assert args.handler(args) == EXIT_REJECTED
    assert capsys.readouterr().err == "aborted: dropped\n"


def test_requirements_and_the_signing_key_reach_the_client(
        signing_cluster: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.ops.signing_keys import TransactionSigner

    seen = _run_kv_capturing(monkeypatch, Done())
    args = _parser().parse_args(["kv", "--cluster", str(signing_cluster), "--client-name",
                                 "alice", "--require", "k=00ff", "--require", "j=",
                                 "--retry-aborted", "add", "k", "1"])
    assert args.handler(args) == EXIT_OK
    assert seen["requirements"] == {"k": b"\x00\xff", "j": b""}
    assert seen["retry_aborted"] is True
    signer = seen["signer"]
    assert isinstance(signer, TransactionSigner)
    assert signer.name == "alice"
    key = signing_cluster / "clients" / "client.signing.key"
    args = _parser().parse_args(["kv", "--cluster", str(signing_cluster), "--client-key",
                                 str(key), "get", "k"])
    assert args.handler(args) == EXIT_OK
    assert isinstance(seen["signer"], TransactionSigner)
    assert seen["signer"].name == "client"
    args = _parser().parse_args(["kv", "--cluster", str(signing_cluster), "get", "k"])
    assert args.handler(args) == EXIT_OK
    assert seen["signer"] is None  # the client library loads the cluster's default key


def test_bad_signing_options_are_usage_errors(
        signing_cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _run_kv_capturing(monkeypatch, Done())
    base = ["kv", "--cluster", str(signing_cluster)]
    for extra, message in (
        (["--client-name", "bob"], "bob.signing.key: cannot read"),
        (["--client-name", "alice", "--client-key", "x"], "not both"),
    ):
        args = _parser().parse_args([*base, *extra, "add", "k", "1"])
        assert args.handler(args) == EXIT_USAGE
        assert message in capsys.readouterr().err
    raft = init_cluster(tmp_path / "raft", nodes=3, base_port=22000).directory
    args = _parser().parse_args(["kv", "--cluster", str(raft), "--client-name", "alice",
                                 "add", "k", "1"])
    assert args.handler(args) == EXIT_USAGE
    assert "does not use client signing keys" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args([*base, "--require", "nohex", "add", "k", "1"])


def test_help_explains_versions_for_leaderless(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["kv", "--help"])
    out = capsys.readouterr().out
    assert "--require KEY=HEX" in out
    assert "aborted: <reason>" in out
    assert "cluster client-key" in out


def test_required_keys_follow_the_kv_conflict_rules() -> None:
    from phalanx.client.kv import required_keys

    assert required_keys(Add(key="k", amount=1)) == ()
    assert required_keys(SAdd(key="k", member=b"x")) == ()
    assert required_keys(Put(key="k", value=b"v")) == ("k",)
    assert required_keys(Concat(key="k", suffix=b"v")) == ("k",)
    assert required_keys(CompareAndSet(key="k", expected=None, new=b"v")) == ("k",)
    assert required_keys(Get(key="k")) == ("k",)
    with pytest.raises(ValueError, match="stale"):
        required_keys(Scan(prefix="", limit=1))
