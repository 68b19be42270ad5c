"""Hostile operator input to every `phalanx` subcommand: ONE line on stderr, the right exit code.

Runs the real CLI in-process (`phalanx.cli.main.main([...])`, argv exactly as a shell would pass
it: a non-UTF-8 byte arrives surrogate-escaped) and asserts, for each mistake, exit 2 (usage:
the only meaning of 2) and a single ``phalanx ...: error: ...`` line naming the problem, with
no traceback. One real process: a node whose listen port is taken. The exit-code table:
`phalanx.cli.errors`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from phalanx.cli import errors as cli_errors
from phalanx.cli.errors import EXIT_INTERNAL, EXIT_USAGE
from phalanx.cli.main import main
from phalanx.ops.local_cluster import find_free_base_port, init_cluster

NOT_UTF8 = os.fsdecode(b"caf\xe9")  # Latin-1 bytes on a UTF-8 command line


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster directory nobody runs (the errors happen before any node is dialled)."""
    d = tmp_path_factory.mktemp("errors") / "c"
    init_cluster(d, nodes=3, base_port=find_free_base_port(3))
    return d


def _copy(cluster: Path, tmp_path: Path) -> Path:
    d = tmp_path / "copy"
    shutil.copytree(cluster, d)
    return d


def _run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, *needles: str, expected: int = EXIT_USAGE) -> None:
    assert code == expected, err
    assert err.endswith("\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err, err
    assert ": error: " in err, err
    for needle in needles:
        assert needle in err, err


# --------------------------------------------------------------------------------------------
# phalanx kv / status


@pytest.mark.parametrize("argv", [
    ["get", NOT_UTF8], ["put", NOT_UTF8, "v"], ["delete", NOT_UTF8],
    ["cas", NOT_UTF8, "a", "b"], ["scan", NOT_UTF8],
])
def test_kv_refuses_a_key_that_is_not_utf8(
    argv: list[str], cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["kv", "--cluster", str(cluster), *argv], capsys)
    _one_line(code, err, "not valid UTF-8", "caf\\xe9")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "soon", "1e999"])
def test_kv_and_status_refuse_a_timeout_that_is_not_a_finite_positive_number(
    value: str, cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["kv", "--cluster", str(cluster), "--timeout", value, "get", "k"], capsys)
    _one_line(code, err, "--timeout")
    code, err = _run(["status", "--cluster", str(cluster), "--timeout", value], capsys)
    _one_line(code, err, "--timeout")


@pytest.mark.parametrize("limit", ["0", "-5", "10001", "100000000000000000000", "many"])
def test_kv_scan_limit_is_bounded(
    limit: str, cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["kv", "--cluster", str(cluster), "scan", "--limit", limit], capsys)
    _one_line(code, err, "--limit")


def test_kv_without_a_cluster_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PHALANX_CLUSTER", raising=False)
    _one_line(*_run(["kv", "get", "k"], capsys), "no cluster given")
    _one_line(*_run(["kv", "--cluster", str(tmp_path / "none"), "get", "k"], capsys),
              "no cluster at", "phalanx cluster init")
    _one_line(*_run(["status", "--cluster", str(tmp_path / "none")], capsys), "no cluster at")
    weird = str(tmp_path / NOT_UTF8)
    _one_line(*_run(["kv", "--cluster", weird, "get", "k"], capsys), "no cluster at")


def test_kv_with_a_broken_cluster_toml(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _copy(cluster, tmp_path)
    toml = d / "cluster.toml"
    good = toml.read_text()
    toml.write_text(good + "[[[\n")
    _one_line(*_run(["kv", "--cluster", str(d), "get", "k"], capsys),
              str(toml.resolve()), "not valid TOML")
    toml.write_text(good.replace("[client]", "[client]\ncertt = 'x.pem'"))
    _one_line(*_run(["status", "--cluster", str(d)], capsys),
              "unknown key 'certt' in [client]", "did you mean 'cert'")


@pytest.mark.parametrize("name", ["clients/ca.pem", "clients/client.pem", "clients/client.key"])
def test_kv_names_a_missing_client_credential_file(
    name: str, cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _copy(cluster, tmp_path)
    (d / name).unlink()
    code, err = _run(["kv", "--cluster", str(d), "get", "k"], capsys)
    _one_line(code, err, str((d / name).resolve()), "no such file")
    _one_line(*_run(["status", "--cluster", str(d)], capsys), str((d / name).resolve()))


# --------------------------------------------------------------------------------------------
# phalanx cluster init / up


@pytest.mark.parametrize(("option", "value"), [
    ("--nodes", "nan"), ("--nodes", "0"), ("--nodes", "-3"), ("--nodes", "101"),
    ("--base-port", "0"), ("--base-port", "70000"), ("--base-port", "65500"),
    ("--host", "bad host"), ("--host", NOT_UTF8), ("--host", ""),
])
def test_cluster_init_refuses_bad_options_and_creates_nothing(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["cluster", "init", str(tmp_path / "d"), option, value], capsys)
    _one_line(code, err, option)
    assert not (tmp_path / "d").exists()


def test_cluster_init_where_it_cannot(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _one_line(*_run(["cluster", "init", str(cluster)], capsys), "not empty")
    (tmp_path / "file").write_text("")
    _one_line(*_run(["cluster", "init", str(tmp_path / "file" / "d")], capsys),
              f"cannot create {tmp_path / 'file' / 'd'}")


def test_cluster_up_refuses_before_starting_any_node(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _one_line(*_run(["cluster", "up", str(tmp_path / "none")], capsys), "no cluster at")
    for grace in ("nan", "inf", "-1"):
        _one_line(*_run(["cluster", "up", str(cluster), "--grace", grace], capsys), "--grace")
    _one_line(*_run(["cluster", "up", str(cluster), "--node", NOT_UTF8], capsys),
              "no node", "n1, n2, n3")
    d = _copy(cluster, tmp_path)
    (d / "nodes" / "n2.key").unlink()
    _one_line(*_run(["cluster", "up", str(d)], capsys), "tls.key", "n2.key", "no such file")
    n3 = d / "nodes" / "n3.toml"
    n3.write_text(n3.read_text().replace("keep = ", "kepe = "))
    _one_line(*_run(["cluster", "up", str(d), "--node", "n3"], capsys),
              "unknown key 'kepe' in [checkpoint]", "did you mean 'keep'")
    assert not list((d / "run").iterdir())  # no node was started


# --------------------------------------------------------------------------------------------
# phalanx node run


def _node_toml(cluster: Path, tmp_path: Path, node: str = "n1") -> Path:
    return _copy(cluster, tmp_path) / "nodes" / f"{node}.toml"


@pytest.mark.parametrize(("edit", "needles"), [
    (lambda t: t.replace("tick_ms", "tickms"),
     ("unknown key 'tickms' in [timing]", "did you mean 'tick_ms'")),
    (lambda t: t + "\n[timming]\nx = 1\n", ("unknown table 'timming'", "did you mean 'timing'")),
    (lambda t: t.replace("[node]", "[node]\nfsycn = 'off'"), ("'fsycn' in [node]", "'fsync'")),
    (lambda t: t.replace('{ id = "n2",', '{ peer_adr = "x:1", id = "n2",', 1),
     ("'peer_adr' in [peers[0]]", "'peer_addr'")),
    (lambda t: t + "\ngarbage = = 3\n", ("not valid TOML",)),
    (lambda t: t.replace('peer_listen = "127.0.0.1:', 'peer_listen = "127.0.0.1:9'),
     ("node.peer_listen", "expected HOST:PORT")),
    (lambda t: t.replace('peer_listen = "127.0.0.1', 'peer_listen = "bad host'),
     ("not a host name or IP address",)),
    (lambda t: t.replace("tick_ms = 10", "tick_ms = 0"), ("timing.tick_ms: must be >= 1",)),
])
def test_node_run_refuses_a_bad_config_naming_file_table_and_key(
    edit: object, needles: tuple[str, ...], cluster: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _node_toml(cluster, tmp_path)
    original = path.read_text()
    edited = edit(original)  # type: ignore[operator]
    assert edited != original  # else the node would just run (the writer's layout changed?)
    path.write_text(edited)
    code, err = _run(["node", "run", str(path)], capsys)
    _one_line(code, err, str(path.resolve()), *needles)


@pytest.mark.parametrize(("name", "key"), [("n1.pem", "tls.cert"), ("n1.key", "tls.key"),
                                           ("ca.pem", "tls.ca")])
def test_node_run_names_a_missing_credential_file_before_opening_storage(
    name: str, key: str, cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _node_toml(cluster, tmp_path)
    data = path.parent.parent / "data" / "n1"
    shutil.rmtree(data)
    (path.parent / name).unlink()
    code, err = _run(["node", "run", str(path)], capsys)
    _one_line(code, err, key, str((path.parent / name).resolve()), "no such file")
    assert not data.exists()  # storage was not opened


def test_node_run_without_a_readable_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _one_line(*_run(["node", "run", str(tmp_path / "none.toml")], capsys), "no such file")
    _one_line(*_run(["node", "run", str(tmp_path)], capsys), str(tmp_path))
    _one_line(*_run(["node", "run", str(tmp_path / NOT_UTF8)], capsys), "no such file")


def test_node_run_names_a_listen_address_in_use(cluster: Path, tmp_path: Path) -> None:
    path = _node_toml(cluster, tmp_path)
    port = next(int(line.split(":")[-1].rstrip('"')) for line in path.read_text().splitlines()
                if line.startswith("client_listen"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run([sys.executable, "-m", "phalanx", "node", "run", str(path)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert errors == [f"phalanx node run: error: {path.resolve()}: cannot listen on "
                      f"node.client_listen 127.0.0.1:{port}: Address already in use; is "
                      "another node running?"], done.stderr
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------------------------
# phalanx sim / jepsen


@pytest.mark.parametrize("argv", [
    ["sim", "--time", "nan"], ["sim", "--time", "inf"], ["sim", "--liveness", "-1"],
    ["sim", "--seeds", "0"], ["sim", "--jobs", "0"], ["sim", "--nodes", "0"],
    ["sim", "--byzantine", "-1"], ["sim", "--max-events", "nan"],
    ["jepsen", "run", "--time", "inf"], ["jepsen", "run", "--rate", "nan"],
    ["jepsen", "run", "--nodes", "0"], ["jepsen", "run", "--nodes", "1000"],
    ["jepsen", "check", "--time-limit", "nan", "h.jsonl"],
    ["jepsen", "check", "--time-limit", "inf", "h.jsonl"],
    ["jepsen", "check", "--step-limit", "-1", "h.jsonl"],
])
def test_sim_and_jepsen_refuse_numbers_that_are_not_finite_or_in_range(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    _one_line(*_run(argv, capsys), argv[-3] if argv[-1] == "h.jsonl" else argv[-2])


def test_sim_trace_into_a_missing_directory_is_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "none" / "t.txt"
    _one_line(*_run(["sim", "--seeds", "1", "--trace", str(trace)], capsys), "--trace")


def test_jepsen_run_refuses_a_configuration_it_cannot_run_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "s")
    for argv in (["--protocol", "pbft", "--nodes", "5"], ["--nemesis", "kill,bogus"],
                 ["--nodes", "3", "--byzantine", "silent"]):
        _one_line(*_run(["jepsen", "run", *argv, "--store", store], capsys))
    assert not (tmp_path / "s").exists()


def test_jepsen_check_of_a_missing_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["jepsen", "check", str(tmp_path / "none.jsonl")], capsys)
    _one_line(code, err, f"{tmp_path / 'none.jsonl'}: No such file", expected=3)


# --------------------------------------------------------------------------------------------
# the top level: usage, help, our own bugs, Ctrl-C, a closed stdout


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["kv"], ["cluster"], ["--bogus"],
                                  ["kv", "--cluster", "x", "get"]])
def test_usage_errors_are_one_line_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(argv, capsys)
    _one_line(code, err, "--help")


@pytest.mark.parametrize("argv", [["--help"], ["kv", "--help"]])
def test_help_documents_the_exit_codes(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "exit status" in out
    for code in (0, 1, 2, 3, 4, 5, 6, 70):
        assert re.search(rf"^ +{code} +\S", out, re.MULTILINE), (code, out)
    assert re.search(r"^ +2 +usage", out, re.MULTILINE), out


def _broken(exc: BaseException) -> object:
    def handler(args: object) -> int:
        raise exc
    return handler


def test_our_own_bug_is_one_line_exit_70_and_a_traceback_on_request(
    cluster: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from phalanx.cli import status as kv_cli  # `phalanx status`'s handler

    monkeypatch.setattr(kv_cli, "_status_main", _broken(RuntimeError("boom")))
    monkeypatch.delenv("PHALANX_DEBUG", raising=False)
    code, err = _run(["status", "--cluster", str(cluster)], capsys)
    _one_line(code, err, "internal error", "RuntimeError: boom", "PHALANX_DEBUG=1",
              expected=EXIT_INTERNAL)
    monkeypatch.setenv("PHALANX_DEBUG", "1")
    code, err = _run(["status", "--cluster", str(cluster)], capsys)
    assert code == EXIT_INTERNAL
    assert "Traceback" in err
    assert err.splitlines()[-1].startswith("phalanx status: error: ")


def test_ctrl_c_and_a_closed_stdout(
    cluster: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from phalanx.cli import status as kv_cli  # `phalanx status`'s handler

    monkeypatch.setattr(kv_cli, "_status_main", _broken(KeyboardInterrupt()))
    _one_line(*_run(["status", "--cluster", str(cluster)], capsys), "interrupted",
              expected=cli_errors.EXIT_INTERRUPTED)
    monkeypatch.setattr(kv_cli, "_status_main", _broken(BrokenPipeError()))
    monkeypatch.setattr(cli_errors, "_silence_stdout", lambda: None)
    code, err = _run(["status", "--cluster", str(cluster)], capsys)
    assert (code, err) == (cli_errors.EXIT_BROKEN_PIPE, "")
