"""`phalanx gossip` without a running cluster: help, usage errors (one line, exit 2), the
status table's layout, and `cluster init --service` choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.gossip import format_gossip_status
from phalanx.cli.main import main
from phalanx.client.errors import ClientTimeout
from phalanx.services.gossip_api import GossipDelivery, GossipMember, GossipStatus


def test_help_names_both_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["gossip", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "publish" in out
    assert "status" in out
    assert "--service gossip" in out


def test_usage_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHALANX_CLUSTER", raising=False)
    assert main(["gossip", "publish", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--cluster" in err
    assert main(["gossip", "status", "--cluster", str(tmp_path / "none")]) == 2
    assert "no cluster at" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["cluster", "init", str(tmp_path / "c"), "--service", "nope"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_status_table_lists_views_and_who_holds_each_rumor() -> None:
    hello = GossipDelivery(origin="n1", incarnation=7, seq=0, payload=b"hello", unix_ms=1)
    rows = {
        "n1": GossipStatus(node="n1", incarnation=7, deliveries=(hello,),
                           members=(GossipMember(node="n2", status="ALIVE", incarnation=3),
                                    GossipMember(node="n3", status="DEAD", incarnation=0)),
                           counters=()),
        "n2": GossipStatus(node="n2", incarnation=3, deliveries=(hello,),
                           members=(GossipMember(node="n1", status="ALIVE", incarnation=7),
                                    GossipMember(node="n3", status="SUSPECT", incarnation=0)),
                           counters=()),
        "n3": ClientTimeout("n3: no answer"),
    }
    lines = format_gossip_status(rows).splitlines()
    assert lines[1].split() == ["n1", "7", "1", "n2", "alive,", "n3", "DEAD"]
    assert lines[2].split()[-2:] == ["n3", "SUSPECT"]
    assert "no answer" in lines[3]
    assert lines[-1].split() == ["n1/7/0", '"hello"', "n1", "n2"]
