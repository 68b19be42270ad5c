"""Node and cluster config files: round trip through the writer, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.ops.config_toml import dumps_toml, node_config_dict
from phalanx.ops.node_config import (
    Address,
    CheckpointConfig,
    ConfigError,
    NodeConfig,
    PeerConfig,
    TlsFiles,
    load_cluster_config,
    load_node_config,
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
            "unknown protocol .paxos.; registered: .*pbft, raft",
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
    # control characters (the hand-written writer tomli-w replaced left them raw)
    tricky = {"t": {"path": "a\nb\tc\x00d\x1b\x7f", "k": "\u2028 é"},
              "nested": {"sub": {"weird key\n": "v"}}}
    assert tomllib.loads(dumps_toml(tricky)) == tricky


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


# --------------------------------------------------------------------------------------------
# Strictness: an unknown key is an error naming file, table and key (never silently ignored)


_MINIMAL = ("[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\n"
            "client_listen='h:2'\n[tls]\nca='a'\ncert='b'\nkey='c'\n")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[timing]\ntickms = 5\n", "unknown key 'tickms' in [timing] (did you mean 'tick_ms'?)"),
        ("[timing]\nelection_tick = 5\n", "'election_tick' in [timing] (did you mean "
                                          "'election_ticks'?)"),
        ("[checkpoint]\nevery_entry = 5\n", "in [checkpoint] (did you mean 'every_entries'?)"),
        ("[checkpoint]\nzzz = 5\n", "unknown key 'zzz' in [checkpoint] (known: every_bytes, "
                                    "every_entries, keep, piece_memory_mb, recovery_target)"),
        ("[checkpoint]\nrecovery_targt = '2s'\n", "(did you mean 'recovery_target'?)"),
        ("[pbft]\nsigning_kye = 'k'\n", "'signing_kye' in [pbft] (did you mean 'signing_key'?)"),
        ("[[peers]]\nid='n2'\npeer_addr='h:3'\nclient_addr='h:4'\nclient_adr='h:5'\n",
         "'client_adr' in [peers[0]] (did you mean 'client_addr'?)"),
        ("[timeing]\ntick_ms = 5\n", "unknown table 'timeing' in the top level (did you mean "
                                     "'timing'?)"),
        ("[metrics]\nlisten = 'h:9'\n", "unknown table 'metrics' in the top level"),
    ],
)
def test_an_unknown_key_is_an_error_with_a_suggestion(
    tmp_path: Path, extra: str, message: str
) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(_MINIMAL + extra)
    with pytest.raises(ConfigError) as exc:
        load_node_config(path)
    assert str(exc.value).startswith(f"{path}: ")
    assert message in str(exc.value)


def test_an_unknown_key_in_node_or_tls_tables(tmp_path: Path) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(_MINIMAL.replace("fsync", "x").replace("[node]", "[node]\nfsynk='off'")
                    .replace("[tls]", "[tls]\ncertfile='x'"))
    with pytest.raises(ConfigError, match=r"unknown key 'fsynk' in \[node\] \(did you mean "
                                          r"'fsync'\?\)"):
        load_node_config(path)
    path.write_text(_MINIMAL.replace("[tls]", "[tls]\ncrt='x'"))
    with pytest.raises(ConfigError, match=r"'crt' in \[tls\] \(did you mean 'cert'\?\)"):
        load_node_config(path)


def test_cluster_toml_is_strict_too(tmp_path: Path) -> None:
    (tmp_path / "cluster.toml").write_text(
        "[cluster]\nprotocol='raft'\nnodes=3\n[client]\nca='a'\ncert='b'\nkey='c'\n"
        "[[nodes]]\nid='n1'\npeer_addr='h:1'\nclient_addr='h:2'\n")
    with pytest.raises(ConfigError, match=r"unknown key 'nodes' in \[cluster\]"):
        load_cluster_config(tmp_path)


@pytest.mark.parametrize("protocol", ["raft", "pbft"])
def test_configs_written_by_cluster_init_and_the_harness_load_strictly(
    tmp_path: Path, protocol: str
) -> None:
    from dataclasses import replace

    from phalanx.ops.local_cluster import init_cluster
    from phalanx.ops.node_config import check_cluster_files, check_files

    cluster = init_cluster(tmp_path / "c", protocol=protocol, nodes=4, base_port=20000)
    check_cluster_files(load_cluster_config(tmp_path / "c"))
    for n in cluster.nodes:
        path = cluster.node_config_path(n.id)
        cfg = load_node_config(path)
        check_files(cfg)
        # the Jepsen harness rewrites each config through node_config_dict (new peer ports)
        peers = tuple(replace(p, peer_addr=Address(host="127.0.0.1", port=30000 + i))
                      for i, p in enumerate(cfg.peers))
        path.write_text(dumps_toml(node_config_dict(replace(cfg, peers=peers),
                                                    relative_to=path.parent)))
        assert load_node_config(path).peers == peers


def test_check_files_names_the_missing_or_empty_file(tmp_path: Path) -> None:
    from phalanx.ops.node_config import check_files

    cfg = _node(tmp_path)
    for p in (cfg.tls.ca, cfg.tls.cert, cfg.tls.key):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("-----BEGIN X-----\n")
    check_files(cfg)
    cfg.tls.key.unlink()
    with pytest.raises(ConfigError, match=rf"tls.key: {cfg.tls.key}: no such file"):
        check_files(cfg)
    cfg.tls.key.write_text("")
    with pytest.raises(ConfigError, match=r"tls\.key: .* is empty"):
        check_files(cfg)
    cfg.tls.key.unlink()
    cfg.tls.key.mkdir()
    with pytest.raises(ConfigError, match=r"tls\.key: .* is a directory"):
        check_files(cfg)


def test_open_node_checks_credential_files_before_opening_storage(tmp_path: Path) -> None:
    import trio

    from phalanx.runtime.node import open_node

    cfg = _node(tmp_path)  # no certificate files exist

    async def start() -> None:
        async with open_node(cfg):
            raise AssertionError("the node started without its certificate")

    with pytest.raises(ConfigError, match=r"tls\.ca: .*ca\.pem: no such file"):
        trio.run(start)
    assert not cfg.data_dir.exists()


@pytest.mark.parametrize("host", ["bad host", "", "h\tx", "caf\u00e9.example"])
def test_a_host_that_cannot_be_a_host_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=r"is not a host name or IP address|HOST:PORT"):
        Address.parse(f"{host}:7000", where="x")
    for good in ("127.0.0.1:1", "[::1]:2", "node-1.example.com:3", "fe80::1%eth0:4"):
        Address.parse(good, where="x")


# --------------------------------------------------------------------------------------------
# The client keyring `[keys.clients]`

_RAFT_NODE = ("[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\n"
              "client_listen='h:2'\n[tls]\nca='a'\ncert='b'\nkey='c'\n")


def test_the_client_keyring_round_trips(tmp_path: Path) -> None:
    from dataclasses import replace

    cfg = replace(_node(tmp_path), client_keys={"client": b"\x01" * 32, "alice-2": b"\xff" * 32})
    path = tmp_path / "nodes" / "n1.toml"
    path.parent.mkdir(parents=True)
    text = dumps_toml(node_config_dict(cfg, relative_to=path.parent))
    assert "[keys.clients]" in text
    path.write_text(text)
    assert load_node_config(path).client_keys == cfg.client_keys


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[keys.clients]\nclient = 'zz'\n", r"keys\.clients\.client: the public key is not hex"),
        ("[keys.clients]\nclient = 'abcd'\n", r"keys\.clients\.client: .*32 bytes, got 2"),
        ("[keys.clients]\nclient = 3\n", r"keys\.clients\.client: expected str, got int"),
        (f"[keys.clients]\n'a b' = '{'00' * 32}'\n", r"a client key name is"),
        ("[keys]\nclients = 'x'\n", r"keys\.clients: expected dict, got str"),
    ],
)
def test_keyring_errors_name_the_file_and_the_entry(tmp_path: Path, table: str,
                                                    message: str) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(_RAFT_NODE + table)
    with pytest.raises(ConfigError, match=message) as exc:
        load_node_config(path)
    assert str(path) in str(exc.value)
    assert "\n" not in str(exc.value)


def test_cluster_toml_names_the_client_signing_key(tmp_path: Path) -> None:
    (tmp_path / "cluster.toml").write_text(
        "[cluster]\nprotocol='raft'\n[client]\nca='a'\ncert='b'\nkey='c'\n"
        "signing_key='clients/client.signing.key'\n"
        "[[nodes]]\nid='n1'\npeer_addr='h:1'\nclient_addr='h:2'\n")
    cluster = load_cluster_config(tmp_path)
    assert cluster.client_signing_key == (tmp_path / "clients" / "client.signing.key").resolve()
