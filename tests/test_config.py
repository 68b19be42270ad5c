"""Node and cluster config files: round trip through the writer, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.config import (
    Address,
    CheckpointConfig,
    ConfigError,
    NodeConfig,
    PeerConfig,
    TlsFiles,
    dumps_toml,
    load_cluster_config,
    load_node_config,
    node_config_dict,
)


def _node(tmp_path: Path) -> NodeConfig:
    return NodeConfig(
        id="n1",
        protocol="raft",
        data_dir=tmp_path / "data" / "n1",
        peer_listen=Address(host="127.0.0.1", port=7101),
        client_listen=Address(host="127.0.0.1", port=7201),
        metrics_listen=Address(host="127.0.0.1", port=7301),
        tls=TlsFiles(
            ca=tmp_path / "ca" / "ca.pem",
            cert=tmp_path / "nodes" / "n1.pem",
            key=tmp_path / "nodes" / "n1.key",
        ),
        peers=(
            PeerConfig(
                id="n2",
                peer_addr=Address(host="127.0.0.1", port=7102),
                client_addr=Address(host="127.0.0.1", port=7202),
            ),
        ),
    )


def test_node_config_round_trips_with_relative_paths(tmp_path: Path) -> None:
    cfg = _node(tmp_path)
    path = tmp_path / "nodes" / "n1.toml"
    path.parent.mkdir(parents=True)
    text = dumps_toml(node_config_dict(cfg, relative_to=path.parent))
    assert str(tmp_path) not in text  # relative: the directory can be moved
    path.write_text(text)
    loaded = load_node_config(path)
    assert loaded == NodeConfig(**{**_asdict(cfg), "source": path.resolve()})
    assert loaded.members() == ("n1", "n2")


def _asdict(cfg: NodeConfig) -> dict[str, object]:
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}


def test_moved_cluster_directory_still_loads(tmp_path: Path) -> None:
    cfg = _node(tmp_path / "a")
    path = tmp_path / "a" / "nodes" / "n1.toml"
    path.parent.mkdir(parents=True)
    path.write_text(dumps_toml(node_config_dict(cfg, relative_to=path.parent)))
    (tmp_path / "a").rename(tmp_path / "b")
    loaded = load_node_config(tmp_path / "b" / "nodes" / "n1.toml")
    assert loaded.data_dir == (tmp_path / "b" / "data" / "n1").resolve()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[node\n", "not valid TOML"),
        ("[node]\nid = 'n1'\n", "missing key 'protocol'"),
        (
            "[node]\nid='n1'\nprotocol='paxos'\ndata_dir='d'\npeer_listen='h:1'\nclient_listen='h:2'\n"
            "[tls]\nca='a'\ncert='b'\nkey='c'\n",
            "expected one of raft, pbft",
        ),
        (
            "[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='nope'\nclient_listen='h:2'\n",
            "expected HOST:PORT",
        ),
        (
            "[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\nclient_listen='h:2'\n"
            "[tls]\nca='a'\ncert='b'\nkey='c'\n[timing]\ntick_ms=true\n",
            "timing.tick_ms: expected int, got bool",
        ),
        (
            "[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\nclient_listen='h:2'\n"
            "[tls]\nca='a'\ncert='b'\nkey='c'\n[timing]\nelection_ticks=3\nheartbeat_ticks=3\n",
            "heartbeat_ticks must be < timing.election_ticks",
        ),
        (
            "[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\nclient_listen='h:2'\n"
            "[tls]\nca='a'\ncert='b'\nkey='c'\n[[peers]]\nid='n1'\npeer_addr='h:3'\nclient_addr='h:4'\n",
            "exclude the node itself",
        ),
    ],
)
def test_invalid_node_configs_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as exc:
        load_node_config(path)
    assert str(path) in str(exc.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_node_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="no such file"):
        load_cluster_config(tmp_path)


def test_cluster_config_loads(tmp_path: Path) -> None:
    (tmp_path / "cluster.toml").write_text(
        dumps_toml(
            {
                "cluster": {"protocol": "raft"},
                "client": {"ca": "ca/ca.pem", "cert": "clients/c.pem", "key": "clients/c.key"},
                "nodes": [
                    {"id": f"n{i}", "peer_addr": f"127.0.0.1:{7100 + i}",
                     "client_addr": f"127.0.0.1:{7200 + i}"}
                    for i in (1, 2, 3)
                ],
            }
        )
    )
    cluster = load_cluster_config(tmp_path)
    assert [n.id for n in cluster.nodes] == ["n1", "n2", "n3"]
    assert cluster.nodes[2].client_addr == Address(host="127.0.0.1", port=7203)
    assert cluster.ca == (tmp_path / "ca" / "ca.pem").resolve()
    assert cluster.node_config_path("n2") == tmp_path.resolve() / "nodes" / "n2.toml"


def test_toml_writer_escapes_strings() -> None:
    import tomllib

    doc = {"a": {"s": 'quote " and \\ backslash', "n": 3, "b": True, "l": ["x", "y"]}}
    assert tomllib.loads(dumps_toml(doc)) == doc


def test_a_config_without_a_checkpoint_table_gets_the_documented_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "n1.toml"
    path.write_text("[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\n"
                    "client_listen='h:2'\n[tls]\nca='a'\ncert='b'\nkey='c'\n")
    checkpoint = load_node_config(path).checkpoint
    assert (checkpoint.every_entries, checkpoint.every_bytes, checkpoint.keep) == (
        10_000, 16 << 20, 3)
    assert checkpoint == CheckpointConfig()


def test_client_auth_is_required_unless_the_config_says_none(tmp_path: Path) -> None:
    path = tmp_path / "n1.toml"
    base = ("[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\n"
            "client_listen='h:2'\n[tls]\nca='a'\ncert='b'\nkey='c'\n")
    path.write_text(base)
    config = load_node_config(path)
    assert config.client_auth == "required"
    path.write_text(base + "[client]\nauth='none'\n")
    insecure = load_node_config(path)
    assert insecure.client_auth == "none"
    doc = node_config_dict(insecure, relative_to=tmp_path)
    assert doc["client"] == {"auth": "none"}
    assert "client" not in node_config_dict(config, relative_to=tmp_path)
    path.write_text(base + "[client]\nauth='optional'\n")
    with pytest.raises(ConfigError, match=r"client\.auth: expected one of required, none"):
        load_node_config(path)
