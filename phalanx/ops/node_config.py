"""Node and cluster configuration files (TOML): what `phalanx cluster init` writes and what
`phalanx node run`, `phalanx cluster up`, the client and `phalanx status` read.

Layout of a cluster directory made by `phalanx cluster init DIR`:

    DIR/cluster.toml          the cluster: protocol, every node's addresses, client credentials
    DIR/nodes/<node>.toml     one node's full configuration (`NodeConfig`)
    DIR/ca/ca.pem, ca.key     the cluster CA (keep ca.key offline in production)
    DIR/nodes/<node>.pem/.key the node's certificate and key
    DIR/clients/<name>.pem/.key  client credentials
    DIR/clients/<name>.signing.key  a client's transaction signing key (protocols whose
                              call strategy is ENDORSEMENT; `phalanx.ops.signing_keys`)
    DIR/data/<node>/          the node's durable storage
    DIR/logs/<node>.log       logs written by `phalanx cluster up`

Rules:
- Relative paths in a file are resolved against the directory holding that file, so a cluster
  directory can be moved as a whole.
- Loading validates everything and raises `ConfigError` naming the file and the key; nothing
  else escapes `load_*`. Loading is strict: a key or table the loader does not know (a typo
  such as ``tickms``) is an error naming the file, the table and the key, with the closest
  known key as a suggestion; it is never silently ignored.
- `check_files` / `check_cluster_files`: every certificate, key and PBFT key file a config
  names exists and is readable (an error names the file and the key that names it). A node
  checks them at start-up before it opens its storage.
- `[keys.clients]` of a node config is the client keyring: ``name = "hex"`` (a raw 32-byte
  Ed25519 public key per client signing key); names are `CLIENT_NAME` (letters, digits,
  ``_``, ``-``). Nodes of a protocol whose call strategy is ENDORSEMENT verify signed client
  transactions against it; it is read at start-up only.
- Only stdlib `tomllib` reads; `phalanx.ops.config_toml` writes (`dumps_toml`,
  `node_config_dict`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.appspec import DEFAULT_APP, UnknownApp
from phalanx.appspec import get as app_spec
from phalanx.cli.errors import OperatorError
from phalanx.protocols import UnknownProtocol
from phalanx.protocols import get as protocol_spec

if TYPE_CHECKING:  # (loaded by `load_node_config`: a client reading cluster.toml skips it)
    from phalanx.services.config import ServiceTables

FSYNC_MODES = ("every-write", "group", "off")
CLIENT_AUTH_MODES = ("required", "none")
KEYS_TABLE = "keys"
"""The node config's table of signing key files (`KeyFiles`)."""
LEGACY_KEYS_TABLE = "pbft"
"""What `KEYS_TABLE` was called before protocols were pluggable; still read."""
"""`[client] auth` of a node: ``required`` (default: client certificates and roles,
`phalanx.runtime.client_auth`) or ``none`` (insecure, for local experiments: anyone who can reach
the
client port may read and write)."""


CLIENT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a client signing key's name may be (a TOML bare key and a file name)."""
CLIENT_PUBLIC_KEY_BYTES = 32


class ConfigError(OperatorError):
    """A configuration file is missing, unreadable or invalid."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, where: str) -> Address:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"{where}: expected HOST:PORT, got {text!r}")
        host = host.strip("[]")
        if not valid_host(host):
            raise ConfigError(f"{where}: {host!r} is not a host name or IP address")
        return cls(host=host, port=int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


_HOST = re.compile(r"[A-Za-z0-9._:%-]+")


def valid_host(host: str) -> bool:
    """Whether `host` can be a host name or an IP address (ASCII letters, digits, ``.-_:%``:
    no spaces, no empty name; an internationalised name must be given in its ASCII form)."""
    return _HOST.fullmatch(host) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerConfig:
    """Another member of the cluster, as seen by a node or a client."""

    id: str
    peer_addr: Address
    client_addr: Address
    signing_public_key: str | None = None
    """PBFT: the member's Ed25519 public key (hex); `phalanx.ops.signing_keys` reads it."""
    mac_public_key: str | None = None
    """PBFT: the member's X25519 public key (hex) for the pairwise MAC keys."""
    joined: bool = False
    """Added after the cluster was created (`phalanx cluster add-node`): not in the bootstrap
    configuration's voters but its learners. The log's configuration entries decide after
    that (`phalanx member promote`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingConfig:
    """Protocol timing: one tick is `tick_ms` of wall time (the core only counts ticks).

    Defaults: a Raft election timeout of 100-200 ms and heartbeats every 30 ms (every tick would
    be 200+ messages per second at the leader for no gain in failure detection)."""

    tick_ms: int = 10
    election_ticks: int = 10
    heartbeat_ticks: int = 3


CHECKPOINT_EVERY_ENTRIES = 10_000
CHECKPOINT_EVERY_BYTES = 16 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
    """When a node checkpoints (`phalanx.apps.replica.CheckpointPolicy`) and how many it keeps.

    `every_bytes` also bounds memory: a Raft core keeps every entry since its newest checkpoint
    in memory, so the log costs about `every_bytes` (plus what arrives while a checkpoint is
    written) on top of the state. 16 MiB is about etcd's default of 100,000 entries of small
    writes; raise it to checkpoint a very large state less often."""

    every_entries: int = CHECKPOINT_EVERY_ENTRIES
    every_bytes: int = CHECKPOINT_EVERY_BYTES
    keep: int = 3
    recovery_target: float | None = None
    """`recovery_target = "2s"`: seconds a restart may take to load the newest checkpoint and
    replay the log after it. Set, it replaces `every_entries` and `every_bytes`: the node
    measures its load and replay rates and checkpoints as rarely as keeps load plus replay
    under it (`phalanx.apps.recovery_target`, docs/KV_STORAGE.md "Recovery-time objective").
    Protocols that checkpoint at fixed sequence numbers (PBFT) keep their own interval."""
    piece_memory_mb: int = 16
    """MiB of the newest checkpoint pieces kept in memory to serve peers' state transfer (0:
    from disk only; `storage.volatile.PIECE_MEMORY_MB`; ``PHALANX_PIECE_MEMORY_MB`` overrides)."""

    def __post_init__(self) -> None:
        target = self.recovery_target
        if target is not None and not (MIN_RECOVERY_TARGET <= target <= MAX_RECOVERY_TARGET):
            raise ValueError(f"checkpoint recovery_target must be {MIN_RECOVERY_TARGET:g} to "
                             f"{MAX_RECOVERY_TARGET:g} seconds, got {target!r}")


MIN_RECOVERY_TARGET = 0.001
MAX_RECOVERY_TARGET = 86_400.0
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|m|min)\s*")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0}


def parse_duration(text: str, *, where: str) -> float:
    """Seconds from ``"2s"``, ``"500ms"``, ``"1.5m"``; `ConfigError` naming `where`."""
    match = _DURATION.fullmatch(text)
    seconds = (float(match.group(1)) * _DURATION_UNITS[match.group(2)]
               if match is not None else 0.0)
    if not MIN_RECOVERY_TARGET <= seconds <= MAX_RECOVERY_TARGET:
        raise ConfigError(f"{where}: expected a duration like \"2s\" or \"500ms\" "
                          f"(1 ms to 24 h), got {text!r}")
    return seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyFiles:
    """`[keys]`: `signing_key` is the node's private signing key file
    (`phalanx.ops.signing_keys`), for a protocol whose spec asks for signing keys."""

    signing_key: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """Everything one node needs to run (`phalanx node run DIR/nodes/<id>.toml`)."""

    id: str
    protocol: str
    data_dir: Path
    peer_listen: Address
    client_listen: Address
    metrics_listen: Address | None
    tls: TlsFiles
    peers: tuple[PeerConfig, ...]
    fsync: str = "group"
    timing: TimingConfig = field(default_factory=TimingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    source: Path | None = None
    keys: KeyFiles | None = None
    """`[keys]` (``[pbft]`` in older configs): required when the protocol's spec asks for
    signing keys (`ProtocolSpec.signing_keys`), with every peer's public keys."""
    client_auth: str = "required"
    """`[client] auth`: one of `CLIENT_AUTH_MODES`."""
    client_keys: Mapping[str, bytes] = field(default_factory=dict)
    """`[keys.clients]`: the client keyring, client key name -> raw 32-byte Ed25519 public
    key (`phalanx.ops.signing_keys.client_verifier` checks transactions against it)."""
    app: str = DEFAULT_APP
    """`[node] app`: the replicated application (`phalanx.appspec`; default ``kv``)."""
    app_files: Mapping[str, Path] = field(default_factory=dict)
    """`[app]`: the files the app reads (`AppSpec.files`), absolute."""
    services: ServiceTables = field(default_factory=dict)
    """Node services' tables (`phalanx.services`: ``[gossip]``...), validated."""
    protocol_options: Mapping[str, str] = field(default_factory=dict)
    """`[protocol]`: options of the protocol's core (e.g. the leaderless core's
    ``stuck_resolution``), checked by its `ProtocolNode` at start-up and `cluster init`."""
    joined: bool = False
    """`[node] joined`: this node was added after the cluster was created (`PeerConfig.joined`)."""

    def members(self) -> tuple[str, ...]:
        """Every node id of the cluster (this node and its peers), sorted."""
        return tuple(sorted({self.id, *(p.id for p in self.peers)}))

    def bootstrap_voters(self) -> tuple[str, ...]:
        """The voters of the bootstrap configuration (what a core starts from before its
        log says otherwise), sorted: the members that did not join later (`joined`)."""
        joined = {p.id for p in self.peers if p.joined} | ({self.id} if self.joined else set())
        return tuple(m for m in self.members() if m not in joined)

    def bootstrap_learners(self) -> tuple[str, ...]:
        """The learners of the bootstrap configuration: this node alone if it joined later
        (so it never campaigns before the leader's log says what it is); a peer that joined
        later is in no one's bootstrap configuration: `phalanx member add` adds it."""
        return (self.id,) if self.joined else ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """What a client or an operator tool needs: the nodes and the client credentials."""

    protocol: str
    nodes: tuple[PeerConfig, ...]
    ca: Path
    client_cert: Path
    client_key: Path
    directory: Path
    client_signing_key: Path | None = None
    """`[client] signing_key`: the default client signing key (protocols whose call strategy
    is ENDORSEMENT sign every transaction with it), or None."""
    app: str = DEFAULT_APP
    """`[cluster] app`: the application the nodes run (`phalanx.appspec`)."""
    app_files: Mapping[str, Path] = field(default_factory=dict)
    """`[app]`: the app's files (the chain's genesis), absolute."""

    def node_config_path(self, node_id: str) -> Path:
        return self.directory / "nodes" / f"{node_id}.toml"


# --------------------------------------------------------------------------------------------
# Loading


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None


class _Table:
    """Typed access to one TOML table, with errors naming file, table and key.

    Every key asked for is remembered (present or not), so `check_unknown` can refuse the
    keys nobody asked for, suggesting the closest known one."""

    def __init__(self, data: Mapping[str, Any], file: str, name: str = "") -> None:
        self._data = data
        self._file = file
        self._name = name
        self._known: set[str] = set()
        self._children: list[_Table] = []

    def _get(self, key: str, kind: type, default: Any) -> Any:
        self._known.add(key)
        if key not in self._data:
            if default is _REQUIRED:
                raise ConfigError(f"{self.where}: missing key {key!r}")
            return default
        value = self._data[key]
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise ConfigError(
                f"{self.at(key)}: expected {kind.__name__}, got {type(value).__name__}"
            )
        return value

    def at(self, key: str) -> str:
        return f"{self._file}: {self._name}.{key}" if self._name else f"{self._file}: {key}"

    def text(self, key: str, default: Any = None) -> Any:
        return self._get(key, str, _REQUIRED if default is None else default)

    def opt_str(self, key: str) -> str | None:
        value: str | None = self._get(key, str, None)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value: bool = self._get(key, bool, default)
        return value

    def integer(self, key: str, default: int, *, minimum: int = 1) -> int:
        value: int = self._get(key, int, default)
        if value < minimum:
            raise ConfigError(f"{self.at(key)}: must be >= {minimum}, got {value}")
        return value

    def has(self, key: str) -> bool:
        return key in self._data

    def keys(self) -> list[str]:
        """Every key of this table (for tables whose keys are names, not settings)."""
        return list(self._data)

    def table(self, key: str) -> _Table:
        value = self._get(key, dict, {})
        child = _Table(value, self._file, f"{self._name}.{key}" if self._name else key)
        self._children.append(child)
        return child

    def tables(self, key: str) -> list[_Table]:
        value = self._get(key, list, [])
        out = []
        for i, item in enumerate(value):
            name = f"{self._name}.{key}[{i}]" if self._name else f"{key}[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(f"{self._file}: {name}: expected a table")
            out.append(_Table(item, self._file, name))
        self._children.extend(out)
        return out

    def check_unknown(self) -> None:
        """Raise `ConfigError` for the first key of this table or a table read from it that
        the loader never asked for (a typo, or a setting this version does not have)."""
        for key in self._data:
            if key not in self._known:
                where = f"[{self._name}]" if self._name else "the top level"
                kind = "table" if isinstance(self._data[key], dict) else "key"
                import difflib  # (only for the error's suggestion)

                close = difflib.get_close_matches(key, sorted(self._known), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else (
                    f" (known: {', '.join(sorted(self._known))})" if self._known else "")
                raise ConfigError(f"{self._file}: unknown {kind} {key!r} in {where}{hint}")
        for child in self._children:
            child.check_unknown()

    @property
    def where(self) -> str:
        return f"{self._file}: [{self._name}]" if self._name else self._file


_REQUIRED: Any = object()


def _protocol(value: str, where: str) -> str:
    """`value` if a protocol of that name is registered (`phalanx.protocols`)."""
    try:
        protocol_spec(value)
    except UnknownProtocol as e:
        raise ConfigError(f"{where}: {e}") from None
    return value


def _app(t: _Table, files: _Table, base: Path) -> tuple[str, dict[str, Path]]:
    """`app` of table `t` (default `DEFAULT_APP`) if registered, and the `[app]` files it
    reads (exactly the spec's `AppSpec.files`, resolved against `base`)."""
    name = t.text("app", DEFAULT_APP)
    try:
        spec = app_spec(name)
    except UnknownApp as e:
        raise ConfigError(f"{t.at('app')}: {e}") from None
    found = {key: (base / files.text(key)).resolve() for key in spec.files}
    return name, found


def _choice(value: str, choices: Sequence[str], where: str) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def _peer(t: _Table) -> PeerConfig:
    return PeerConfig(
        id=t.text("id"),
        peer_addr=Address.parse(t.text("peer_addr"), where=t.at("peer_addr")),
        client_addr=Address.parse(t.text("client_addr"), where=t.at("client_addr")),
        signing_public_key=t.opt_str("signing_public_key"),
        mac_public_key=t.opt_str("mac_public_key"),
        joined=t.boolean("joined", False),
    )


def _client_keys(t: _Table) -> dict[str, bytes]:
    """`[keys.clients]`: every entry a valid name and the hex of a 32-byte public key."""
    keys: dict[str, bytes] = {}
    for name in sorted(t.keys()):
        text = t.text(name)
        if CLIENT_NAME.fullmatch(name) is None:
            raise ConfigError(f"{t.at(name)}: a client key name is 1-64 letters, digits, "
                              f"'_' or '-'")
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raise ConfigError(f"{t.at(name)}: the public key is not hex") from None
        if len(raw) != CLIENT_PUBLIC_KEY_BYTES:
            raise ConfigError(f"{t.at(name)}: the public key must be "
                              f"{CLIENT_PUBLIC_KEY_BYTES} bytes, got {len(raw)}")
        keys[name] = raw
    return keys


def _duration(t: _Table, key: str) -> float | None:
    """An optional duration (`parse_duration`); a number without a unit is an error too."""
    value = t._get(key, object, None)
    if value is None:
        return None
    return parse_duration(value if isinstance(value, str) else repr(value), where=t.at(key))


def _options(t: _Table) -> dict[str, str]:
    """`[protocol]`: option name -> text (its protocol's node checks them)."""
    return {name: t.text(name) for name in sorted(t.keys())}


def load_node_config(path: str | Path) -> NodeConfig:
    """Read and validate `DIR/nodes/<id>.toml`."""
    path = Path(path).resolve()
    base = path.parent
    root = _Table(_read(path), str(path))
    node = root.table("node")
    tls = root.table("tls")
    timing = root.table("timing")
    ckpt = root.table("checkpoint")
    metrics = node.opt_str("metrics_listen")
    peers = tuple(_peer(t) for t in root.tables("peers"))
    node_id = node.text("id")
    ids = [p.id for p in peers]
    if node_id in ids or len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: peer ids must be unique and exclude the node itself")
    timing_cfg = TimingConfig(
        tick_ms=timing.integer("tick_ms", 10),
        election_ticks=timing.integer("election_ticks", 10, minimum=2),
        heartbeat_ticks=timing.integer("heartbeat_ticks", 3),
    )
    if timing_cfg.heartbeat_ticks >= timing_cfg.election_ticks:
        raise ConfigError(f"{path}: timing.heartbeat_ticks must be < timing.election_ticks")
    protocol = _protocol(node.text("protocol"), f"{path}: node.protocol")
    app, app_files = _app(node, root.table("app"), base)
    keys: KeyFiles | None = None
    # `[keys]`, or `[pbft]` as cluster directories made before protocols were pluggable
    # call it; known beside any protocol, required by one with signing keys.
    key_table = root.table(LEGACY_KEYS_TABLE if root.has(LEGACY_KEYS_TABLE) else KEYS_TABLE)
    key_table.opt_str("signing_key")
    client_keys = _client_keys(key_table.table("clients"))
    from phalanx.services.config import needs_signing_keys, read_service_tables

    services = read_service_tables(root)
    if protocol_spec(protocol).signing_keys or needs_signing_keys(services):
        keys = KeyFiles(signing_key=(base / key_table.text("signing_key")).resolve())
        for p in peers:
            if not p.signing_public_key or not p.mac_public_key:
                raise ConfigError(f"{path}: peer {p.id!r} needs signing_public_key and "
                                  f"mac_public_key (protocol {protocol} or a service)")
    config = NodeConfig(
        id=node_id,
        protocol=protocol,
        data_dir=(base / node.text("data_dir")).resolve(),
        peer_listen=Address.parse(node.text("peer_listen"), where=f"{path}: node.peer_listen"),
        client_listen=Address.parse(
            node.text("client_listen"), where=f"{path}: node.client_listen"
        ),
        metrics_listen=(
            Address.parse(metrics, where=f"{path}: node.metrics_listen") if metrics else None
        ),
        fsync=_choice(node.text("fsync", "group"), FSYNC_MODES, f"{path}: node.fsync"),
        tls=TlsFiles(
            ca=(base / tls.text("ca")).resolve(),
            cert=(base / tls.text("cert")).resolve(),
            key=(base / tls.text("key")).resolve(),
        ),
        peers=peers,
        timing=timing_cfg,
        checkpoint=CheckpointConfig(
            every_entries=ckpt.integer("every_entries", CHECKPOINT_EVERY_ENTRIES),
            every_bytes=ckpt.integer("every_bytes", CHECKPOINT_EVERY_BYTES),
            keep=ckpt.integer("keep", 3),
            recovery_target=_duration(ckpt, "recovery_target"),
            piece_memory_mb=ckpt.integer("piece_memory_mb", 16, minimum=0),
        ),
        source=path,
        keys=keys,
        client_auth=_choice(root.table("client").text("auth", "required"), CLIENT_AUTH_MODES,
                            f"{path}: client.auth"),
        client_keys=client_keys,
        app=app,
        app_files=app_files,
        services=services,
        protocol_options=_options(root.table("protocol")),
        joined=node.boolean("joined", False),
    )
    root.check_unknown()
    return config


def load_cluster_config(directory: str | Path) -> ClusterConfig:
    """Read `DIR/cluster.toml` (DIR may also name the file itself)."""
    path = Path(directory).resolve()
    if path.is_dir():
        path = path / "cluster.toml"
    base = path.parent
    root = _Table(_read(path), str(path))
    cluster = root.table("cluster")
    client = root.table("client")
    nodes = tuple(_peer(t) for t in root.tables("nodes"))
    if not nodes:
        raise ConfigError(f"{path}: no [[nodes]]")
    if len({n.id for n in nodes}) != len(nodes):
        raise ConfigError(f"{path}: node ids must be unique")
    app, app_files = _app(cluster, root.table("app"), base)
    config = ClusterConfig(
        protocol=_protocol(cluster.text("protocol"), f"{path}: cluster.protocol"),
        nodes=nodes,
        ca=(base / client.text("ca")).resolve(),
        client_cert=(base / client.text("cert")).resolve(),
        client_key=(base / client.text("key")).resolve(),
        directory=base,
        client_signing_key=(
            (base / signing).resolve() if (signing := client.opt_str("signing_key")) else None
        ),
        app=app,
        app_files=app_files,
    )
    root.check_unknown()
    return config


def _check_file(source: object, key: str, path: Path) -> None:
    try:
        with path.open("rb") as f:
            empty = not f.read(1)
    except FileNotFoundError:
        raise ConfigError(f"{source}: {key}: {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: {key}: {path}: is a directory, not a file") from None
    except OSError as e:
        raise ConfigError(f"{source}: {key}: {path}: cannot read: {e.strerror}") from None
    if empty:
        raise ConfigError(f"{source}: {key}: {path}: the file is empty")


def check_files(config: NodeConfig) -> None:
    """Raise `ConfigError` naming the file and its key unless every credential file of
    `config` (TLS CA, certificate and key; the signing key) is a readable, non-empty
    file, and so is every file of its ``[app]`` table. A node calls it at start-up, before
    opening its storage."""
    source = config.source or config.id
    files = [("tls.ca", config.tls.ca), ("tls.cert", config.tls.cert),
             ("tls.key", config.tls.key)]
    if config.keys is not None:
        files.append((f"{KEYS_TABLE}.signing_key", config.keys.signing_key))
    files += [(f"app.{key}", path) for key, path in sorted(config.app_files.items())]
    for key, path in files:
        _check_file(source, key, path)


def check_cluster_files(cluster: ClusterConfig) -> None:
    """`check_files` for a client: the CA, certificate and key ``cluster.toml`` names."""
    source = cluster.directory / "cluster.toml"
    for key, path in (("client.ca", cluster.ca), ("client.cert", cluster.client_cert),
                      ("client.key", cluster.client_key)):
        _check_file(source, key, path)
