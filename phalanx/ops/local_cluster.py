"""`phalanx cluster init` and `phalanx cluster up`: make a local cluster directory, run it.

Owns:
    * `init_cluster(directory, ...)`: the CA, node and client credentials, one TOML config per
      node and ``cluster.toml``, laid out as `phalanx.ops.node_config` documents. The directory is
      built under a temporary sibling and renamed into place, so an interrupted init leaves
      nothing half-written behind.
    * Re-exported from `phalanx.ops.processes` (where they live): `NodeProcesses` (node
      subprocesses, their logs and pid files), `supervise` (`cluster up`'s loop),
      `node_command`, `ClusterError`. The command line of both subcommands is
      `phalanx.ops.cluster_command`.

Port layout (``--base-port P``): node i (0-based) listens for peers on P+i, for clients on
P+100+i and serves metrics on P+200+i, so at most 100 nodes. `find_free_base_port` probes for
a base where every one of those ports can be bound (tests and the demo run in parallel), outside
the kernel's ephemeral port range so a killed node can always bind its ports again on restart
(`phalanx.ops.ports`); `cluster init` warns when an explicit ``--base-port`` overlaps that range.

Rules:
    * Never imports the runtime (`phalanx.runtime.node`) or the client: nodes are separate processes
      started as ``python -m phalanx node run CONFIG``.
    * The PKI, signing keys and data-directory identity are imported by `init_cluster` only:
      `cluster up`, `cluster --help` and `phalanx kv` (which opens clusters) do not load them.
    * Errors the operator can fix (no cluster, non-empty directory, a directory that cannot
      be created, bad --nodes/--base-port/--host) raise `ClusterError`, which the CLI prints
      as one line on stderr with exit status 2 (`phalanx.cli.errors`).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from phalanx.appspec import DEFAULT_APP, AppSpec, UnknownApp
from phalanx.appspec import get as get_app
from phalanx.ops.config_toml import dumps_toml, node_config_dict
from phalanx.ops.node_config import (
    CLIENT_NAME,
    Address,
    ClusterConfig,
    ConfigError,
    KeyFiles,
    NodeConfig,
    PeerConfig,
    TimingConfig,
    TlsFiles,
    load_cluster_config,
    load_node_config,
    valid_host,
)
from phalanx.ops.ports import ephemeral_port_range, listen_window, ports_free
from phalanx.ops.processes import (  # re-exported: their historical home
    DEFAULT_GRACE as DEFAULT_GRACE,
)
from phalanx.ops.processes import (
    ClusterError as ClusterError,
)
from phalanx.ops.processes import (
    NodeProcesses as NodeProcesses,
)
from phalanx.ops.processes import (
    node_command as node_command,
)
from phalanx.ops.processes import (
    supervise as supervise,
)
from phalanx.protocols import DEFAULT_PROTOCOL, CallStrategy, UnknownProtocol
from phalanx.protocols import get as protocol_spec
from phalanx.services import UnknownService
from phalanx.services import get as get_service
from phalanx.services.spec import OptionValue

DEFAULT_BASE_PORT: Final = 7100
DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_CLIENT: Final = "client"
ROLE_CLIENTS: Final = (("admin", "admin"), ("client", "read-write"), ("reader", "read-only"))
"""The client certificates `cluster init` issues, (name, role): one per role
(`phalanx.runtime.client_auth`). ``cluster.toml`` names the read-write one unless told otherwise."""
MAX_NODES: Final = 100
CLIENT_PORT_OFFSET: Final = 100
METRICS_PORT_OFFSET: Final = 200


def node_ids(count: int) -> tuple[str, ...]:
    """The node ids `init_cluster` assigns: ``n1`` .. ``n<count>``."""
    return tuple(f"n{i + 1}" for i in range(count))


def cluster_config_dict(cluster: ClusterConfig) -> dict[str, object]:
    """The ``cluster.toml`` document for `cluster`, paths relative to its directory."""

    def rel(p: Path) -> str:
        return os.path.relpath(p.resolve(), cluster.directory.resolve())

    client = {"ca": rel(cluster.ca), "cert": rel(cluster.client_cert),
              "key": rel(cluster.client_key)}
    if cluster.client_signing_key is not None:
        client["signing_key"] = rel(cluster.client_signing_key)
    doc: dict[str, object] = {
        "cluster": {"protocol": cluster.protocol, "app": cluster.app},
        "client": client,
        "nodes": [
            {"id": n.id, "peer_addr": str(n.peer_addr), "client_addr": str(n.client_addr),
             **({"joined": True} if n.joined else {}),
             # a light client verifies block certificates against these
             **({"signing_public_key": n.signing_public_key}
                if n.signing_public_key is not None else {})}
            for n in cluster.nodes
        ],
    }
    if cluster.app_files:
        doc["app"] = {k: rel(v) for k, v in sorted(cluster.app_files.items())}
    return doc


def cluster_ports(base_port: int, nodes: int) -> list[int]:
    """Every port a cluster of `nodes` nodes at `base_port` listens on."""
    return [
        base_port + offset + i
        for offset in (0, CLIENT_PORT_OFFSET, METRICS_PORT_OFFSET)
        for i in range(nodes)
    ]


def find_free_base_port(
    nodes: int, *, host: str = DEFAULT_HOST, rng: random.Random | None = None, attempts: int = 200
) -> int:
    """A base port whose whole layout (see module docstring) is bindable on `host` right now.

    The layout is kept out of the kernel's ephemeral port range (`phalanx.ops.ports` says why: a
    restarted node must be able to bind its port again), and bases are drawn at random so
    concurrent callers rarely race for the same one; a race is still possible between this
    probe and the nodes binding.
    """
    chooser = rng if rng is not None else random.Random()
    first, last = listen_window(METRICS_PORT_OFFSET + nodes)
    for _ in range(attempts):
        base = chooser.randint(first, last)
        if ports_free(host, cluster_ports(base, nodes)):
            return base
    raise ClusterError(f"no free port range found for {nodes} nodes on {host}")


def ephemeral_overlap_warning(base_port: int, nodes: int) -> str | None:
    """A warning when a cluster layout at `base_port` uses ports the kernel may hand out."""
    low, high = ephemeral_port_range()
    clash = [p for p in cluster_ports(base_port, nodes) if low <= p <= high]
    if not clash:
        return None
    return (f"warning: ports {min(clash)}-{max(clash)} lie in this machine's ephemeral port "
            f"range {low}-{high}; an outbound connection may take a stopped node's port and "
            f"keep it from restarting (choose a --base-port below "
            f"{low - METRICS_PORT_OFFSET - nodes})")


def busy_ports(base_port: int, nodes: int, *, host: str = DEFAULT_HOST) -> list[int]:
    """The ports of a cluster layout at `base_port` that cannot be bound on `host` right now
    (another process listens there). Advisory: `cluster init` refuses them."""
    return [p for p in cluster_ports(base_port, nodes) if not ports_free(host, (p,))]


def fault_tolerance_warning(protocol: str, nodes: int) -> str | None:
    """A warning when `nodes` nodes of `protocol` tolerate no fault although there are
    several of them (2 Raft nodes: a majority of 2 is both; 3 PBFT replicas: 2f+1 of 3f+1
    with f = 0), naming the smallest size that tolerates one. A single node is a
    deliberate experiment and gets none."""
    spec = protocol_spec(protocol)
    if nodes < 2 or spec.max_faults(nodes) > 0:
        return None
    return (f"warning: {nodes} {protocol} nodes tolerate no fault ({spec.fault_model.value} "
            f"faults: losing any one node stops the cluster); {spec.default_nodes} nodes "
            f"tolerate one")


def _check_empty(directory: Path) -> None:
    if directory.exists():
        if not directory.is_dir():
            raise ClusterError(f"{directory} exists and is not a directory")
        if any(directory.iterdir()):
            raise ClusterError(f"{directory} is not empty; refusing to overwrite it")


def init_cluster(
    directory: str | Path,
    *,
    protocol: str = DEFAULT_PROTOCOL,
    nodes: int = 3,
    base_port: int = DEFAULT_BASE_PORT,
    host: str = DEFAULT_HOST,
    fsync: str = "group",
    timing: TimingConfig | None = None,
    client_name: str = DEFAULT_CLIENT,
    checkpoint_every: int | None = None,
    app: str = DEFAULT_APP,
    services: Sequence[str] = (),
    service_options: Mapping[str, Mapping[str, OptionValue]] | None = None,
    protocol_options: Mapping[str, str] | None = None,
    refuse_busy_ports: bool = False,
) -> ClusterConfig:
    """Create a cluster directory (see `phalanx.ops.node_config` for its layout) and return its
    config. `app` (`phalanx.appspec`) is what the nodes run; its `AppSpec.init` writes the
    app's files (the chain: DIR/chain/) and every config names them in ``[app]``.
    `services` (`phalanx.services`), and the app's own (`AppSpec.services`: the chain's
    block certifier), get their table in every node config, at their
    defaults overridden by `service_options[name]`; a service that signs gets every node a
    signing key.
    `protocol_options` go into every config's ``[protocol]`` table, checked first by the
    protocol's node (its `options_problem`; a protocol without one takes none).
    `refuse_busy_ports` (`phalanx cluster init`): refuse a layout with a port that another
    process listens on now (`busy_ports`).

    Raises:
        ClusterError: `directory` exists and is not empty, or the arguments are invalid.
    """
    from phalanx.ops import pki

    try:
        spec = protocol_spec(protocol)
        app_spec = get_app(app)
        tables = {name: {**get_service(name).defaults(),
                         **(service_options or {}).get(name, {})}
                  for name in dict.fromkeys((*app_spec.services, *services))}
    except (UnknownProtocol, UnknownApp, UnknownService) as e:
        raise ClusterError(str(e)) from None
    problem = app_spec.protocol_problem(spec)
    if problem is not None:
        raise ClusterError(problem)
    options = dict(protocol_options or {})
    if options:
        check = getattr(spec.node.load(), "options_problem", None)
        problem = (f"protocol {protocol} takes no --option" if check is None
                   else check(options))
        if problem is not None:
            raise ClusterError(f"--option: {problem}")
    if not 1 <= nodes <= MAX_NODES:
        raise ClusterError(f"--nodes must be between 1 and {MAX_NODES}, got {nodes}")
    if base_port < 1 or base_port + METRICS_PORT_OFFSET + nodes > 65_536:
        raise ClusterError(f"--base-port {base_port} leaves no room for {nodes} nodes")
    if not valid_host(host):
        raise ClusterError(f"--host {host!r} is not a host name or IP address")
    try:
        pki.validate_name(client_name)
    except ValueError as e:
        raise ClusterError(str(e)) from None
    target = Path(directory).absolute()
    _check_empty(target)
    busy = busy_ports(base_port, nodes, host=host) if refuse_busy_ports else []
    if busy:
        raise ClusterError(
            f"port {busy[0]} on {host} is in use"
            + (f" (and {len(busy) - 1} more of the layout)" if len(busy) > 1 else "")
            + f"; the nodes of --base-port {base_port} listen on {base_port}+i, +100+i and "
            f"+200+i: choose another --base-port")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.init-", dir=target.parent))
    except OSError as e:
        raise ClusterError(f"cannot create {target}: {e.strerror}") from None
    try:
        _write_cluster(
            staging, protocol=protocol,
            signing_keys=spec.signing_keys or any(get_service(n).signing_keys for n in tables),
            client_signing=spec.call_strategy is CallStrategy.ENDORSEMENT, nodes=nodes,
            base_port=base_port, host=host,
            fsync=fsync, timing=timing or TimingConfig(), client_name=client_name,
            checkpoint_every=checkpoint_every, app=app_spec, services=tables,
            options=options,
        )
        _check_empty(target)
        os.replace(staging, target)  # an existing empty directory is replaced atomically
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        return load_cluster_config(target)
    except ConfigError as e:  # pragma: no cover - we just wrote it
        raise ClusterError(str(e)) from None


def _write_cluster(
    root: Path,
    *,
    protocol: str,
    signing_keys: bool,
    client_signing: bool,
    nodes: int,
    base_port: int,
    host: str,
    fsync: str,
    timing: TimingConfig,
    client_name: str,
    checkpoint_every: int | None,
    app: AppSpec,
    services: Mapping[str, Mapping[str, OptionValue]],
    options: Mapping[str, str],
) -> None:
    from phalanx.ops import pki
    from phalanx.ops.signing_keys import client_key_path, generate_client_key, generate_key_file
    from phalanx.runtime.identity import prepare_data_dir

    ca = pki.create_ca()
    pki.write_ca(ca, root / "ca")
    app_files = app.init.load()(root) if app.init is not None else {}
    ids = node_ids(nodes)
    members = tuple(
        PeerConfig(
            id=node_id,
            peer_addr=Address(host=host, port=base_port + i),
            client_addr=Address(host=host, port=base_port + CLIENT_PORT_OFFSET + i),
        )
        for i, node_id in enumerate(ids)
    )
    hosts = tuple(dict.fromkeys((host, *pki.DEFAULT_HOSTS)))
    nodes_dir = root / "nodes"
    nodes_dir.mkdir(parents=True, exist_ok=True)
    key_files: dict[str, Path] = {}
    if signing_keys:
        # One signing key per node; every node's config carries every peer's public keys.
        keyed = []
        for member in members:
            key_files[member.id] = nodes_dir / f"{member.id}.signing.key"
            public = generate_key_file(key_files[member.id])
            keyed.append(replace(member, signing_public_key=public.signing_public_key,
                                 mac_public_key=public.mac_public_key))
        members = tuple(keyed)
    client_keys: dict[str, bytes] = {}
    client_signing_key: Path | None = None
    if client_signing:
        # The client signs its transactions; every node's config carries the keyring.
        (root / "clients").mkdir(parents=True, exist_ok=True)
        client_signing_key = client_key_path(root, client_name)
        client_keys[client_name] = generate_client_key(client_signing_key)
    for i, me in enumerate(members):
        paths = pki.write_credentials(pki.issue_node_cert(ca, me.id, hosts=hosts), nodes_dir)
        prepare_data_dir(root / "data" / me.id, node=me.id, ca_certificate=paths.ca_certificate)
        cfg = NodeConfig(
            id=me.id,
            protocol=protocol,
            data_dir=root / "data" / me.id,
            peer_listen=me.peer_addr,
            client_listen=me.client_addr,
            metrics_listen=Address(host=host, port=base_port + METRICS_PORT_OFFSET + i),
            tls=TlsFiles(ca=paths.ca_certificate, cert=paths.certificate, key=paths.private_key),
            peers=tuple(p for p in members if p.id != me.id),
            fsync=fsync,
            timing=timing,
            keys=KeyFiles(signing_key=key_files[me.id]) if me.id in key_files else None,
            client_keys=client_keys,
            app=app.name,
            app_files=app_files,
            services=services,
            protocol_options=options,
        )
        if checkpoint_every is not None:
            cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, every_entries=checkpoint_every))
        doc = node_config_dict(cfg, relative_to=nodes_dir)
        (nodes_dir / f"{me.id}.toml").write_text(dumps_toml(doc))
    issued = {}
    for name, role in (*ROLE_CLIENTS, (client_name, pki.DEFAULT_CLIENT_ROLE)):
        if name not in issued:
            issued[name] = pki.write_credentials(pki.issue_client_cert(ca, name, role=role),
                                                 root / "clients")
    client = issued[client_name]
    (root / "logs").mkdir()
    (root / "run").mkdir()
    cluster = ClusterConfig(
        protocol=protocol,
        nodes=members,
        ca=client.ca_certificate,
        client_cert=client.certificate,
        client_key=client.private_key,
        directory=root,
        client_signing_key=client_signing_key,
        app=app.name,
        app_files=app_files,
    )
    (root / "cluster.toml").write_text(dumps_toml(cluster_config_dict(cluster)))


def add_client_key(directory: str | Path, name: str) -> Path:
    """`phalanx cluster client-key DIR NAME`: a new client signing key
    ``DIR/clients/NAME.signing.key`` (mode 0600), its public half added to every node
    config's keyring (`[keys.clients]`). Running nodes read their config at start-up only:
    they accept the key after a restart. Returns the key file.

    Raises:
        ClusterError: no cluster at `directory`, a protocol that does not sign client
            transactions, a bad name, a key of that name already there, or a node config
            that does not load.
    """
    from phalanx.ops.signing_keys import client_key_path, generate_client_key

    cluster = open_cluster(directory)
    if protocol_spec(cluster.protocol).call_strategy is not CallStrategy.ENDORSEMENT:
        raise ClusterError(f"protocol {cluster.protocol} does not use client signing keys "
                           f"(only protocols whose clients sign transactions do)")
    if CLIENT_NAME.fullmatch(name) is None:
        raise ClusterError(f"client key name {name!r}: 1-64 letters, digits, '_' or '-'")
    try:
        configs = [load_node_config(cluster.node_config_path(n.id)) for n in cluster.nodes]
    except ConfigError as e:
        raise ClusterError(str(e)) from None
    path = client_key_path(cluster.directory, name)
    if path.exists() or any(name in c.client_keys for c in configs):
        raise ClusterError(f"a client key named {name!r} already exists in {directory}")
    path.parent.mkdir(parents=True, exist_ok=True)
    public = generate_client_key(path)
    for cfg in configs:
        target = cluster.node_config_path(cfg.id)
        updated = replace(cfg, client_keys={**cfg.client_keys, name: public})
        staging = target.with_name(f".{target.name}.tmp")
        staging.write_text(dumps_toml(node_config_dict(updated, relative_to=target.parent)))
        os.replace(staging, target)
    return path


def open_cluster(directory: str | Path) -> ClusterConfig:
    """Load ``DIR/cluster.toml`` with an operator-friendly error when there is none."""
    path = Path(directory)
    if not (path / "cluster.toml").is_file() and not path.is_file():
        raise ClusterError(
            f"no cluster at {directory} (run `phalanx cluster init {directory}` first)"
        )
    try:
        return load_cluster_config(path)
    except ConfigError as e:
        raise ClusterError(str(e)) from None
