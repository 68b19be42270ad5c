"""`phalanx cert show|rotate|rotate-ca|reload`: certificate expiry and rotation without
downtime (`phalanx.ops.cert_rotation` has the procedure and why it needs none).

Owns: the four subcommands' parsers and handlers, and `expiry_warnings` (what `phalanx
status` prints about certificates expiring within 30 days). Exit status: 0 done; 1 `show`
found a certificate expiring within --days, or a node did not reload; 2 usage or file
problems (one line).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from phalanx.cli.cluster_arg import CLUSTER_ENV
from phalanx.cli.errors import EXIT_NEGATIVE, EXIT_OK, EXIT_USAGE, print_error

_EPILOG = f"""\
examples:
  phalanx cert show --cluster ./c                 # every certificate and its expiry
  phalanx cert rotate --node n2 --cluster ./c     # new key and certificate; n2 reloads
  phalanx cert rotate-ca begin --cluster ./c      # 1. new CA, trusted beside the old one
  phalanx cert rotate-ca reissue --cluster ./c    # 2. every certificate from the new CA
  phalanx cert rotate-ca finish --cluster ./c     # 3. only the new CA; restart each node
  phalanx cert reload --cluster ./c               # nodes load their files again (= SIGHUP)

Nodes reload their certificate, key and CA bundle without a restart (a reload call, or
`kill -HUP PID`): new connections use them, open ones keep theirs. Between `begin` and
`reissue`, re-open long-running clients so they trust the new CA. docs/OPERATIONS.md,
"Certificates", has the whole procedure. --cluster defaults to ${CLUSTER_ENV}.
"""


def add_rotation_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``show``, ``rotate``, ``rotate-ca`` and ``reload`` under ``phalanx cert``."""

    def parser(name: str, helptext: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext, description=helptext[0].upper()
                           + helptext[1:] + ".", epilog=_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--cluster", metavar="DIR", default=os.environ.get(CLUSTER_ENV),
                       help=f"the cluster directory (default: ${CLUSTER_ENV})")
        return p

    show = parser("show", "show every CA, node and client certificate and when it expires")
    show.add_argument("--days", type=float, default=30.0,
                      help="warn (exit 1) about certificates expiring within this many days "
                           "(default: %(default)g)")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=_run_show)
    rotate = parser("rotate", "give a node a new key and certificate, and have it reload")
    rotate.add_argument("--node", metavar="NODE", required=True, help="the node, e.g. n2")
    rotate.set_defaults(handler=_run_rotate)
    ca = parser("rotate-ca", "replace the cluster CA in three steps, without downtime")
    ca.add_argument("step", choices=("begin", "reissue", "finish"),
                    help="begin: new CA trusted beside the old; reissue: every certificate "
                         "from the new CA; finish: only the new CA trusted")
    ca.set_defaults(handler=_run_rotate_ca)
    reload = parser("reload", "ask running nodes to load their certificate files again")
    reload.add_argument("--node", metavar="NODE", help="only this node (default: all)")
    reload.set_defaults(handler=_run_reload)


def expiry_warnings(directory: str | Path, *, days: float = 30.0) -> list[str]:
    """One line per certificate of the cluster at `directory` expiring within `days`
    (what `phalanx status` prints); [] when none does or the files cannot be read."""
    from phalanx.ops.cert_rotation import cluster_certificates, expiring
    from phalanx.ops.processes import ClusterError

    now = datetime.datetime.now(datetime.UTC)
    try:
        rows = expiring(cluster_certificates(directory), days=days, now=now)
    except ClusterError:
        return []
    return [f"WARNING: certificate {r.path} ({r.kind} {r.name}) expires "
            f"{r.not_after:%Y-%m-%d} ({r.days_left(now):.0f} days): `phalanx cert "
            + ("rotate-ca begin`" if r.kind == "ca" else f"rotate --node {r.name}`"
               if r.kind == "node" else f"issue-client` a new one for {r.name}")
            for r in rows]


def _cluster_dir(args: argparse.Namespace, prog: str) -> str | None:
    if not args.cluster:
        print_error(prog, f"no cluster given (use --cluster DIR or set ${CLUSTER_ENV})")
        return None
    return str(args.cluster)


def _run_show(args: argparse.Namespace) -> int:
    from phalanx.ops.cert_rotation import cluster_certificates

    directory = _cluster_dir(args, "phalanx cert show")
    if directory is None:
        return EXIT_USAGE
    now = datetime.datetime.now(datetime.UTC)
    rows = cluster_certificates(directory)
    soon = [r for r in rows if r.days_left(now) < args.days]
    if args.json:
        print(json.dumps([{"kind": r.kind, "name": r.name, "path": str(r.path),
                           "not_after": r.not_after.isoformat(), "issuer": r.issuer,
                           "days_left": round(r.days_left(now), 1)} for r in rows], indent=2))
    else:
        table = [("KIND", "NAME", "EXPIRES (UTC)", "DAYS", "ISSUER", "FILE")] + [
            (r.kind, r.name, f"{r.not_after:%Y-%m-%d %H:%M}", f"{r.days_left(now):.0f}"
             + (" !" if r in soon else ""), r.issuer, str(r.path)) for r in rows]
        widths = [max(len(t[i]) for t in table) for i in range(5)]
        for t in table:
            print("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=False)) + "  " + t[5])
    for r in soon:
        print(f"WARNING: {r.kind} {r.name} ({r.path}) expires within {args.days:g} days",
              file=sys.stderr)
    return EXIT_NEGATIVE if soon else EXIT_OK


def _reload(directory: str, nodes: list[str] | None, prog: str) -> int:
    import trio

    from phalanx.ops.cert_rotation import reload_nodes
    from phalanx.ops.local_cluster import open_cluster

    cluster = open_cluster(directory)
    answers = trio.run(lambda: reload_nodes(cluster, nodes))
    failed = 0
    for node, answer in answers.items():
        if answer.startswith("!"):
            failed += 1
            print(f"{node}: not reloaded ({answer[1:]}); a node that is not running reads "
                  "the new files when it starts", file=sys.stderr)
        else:
            print(f"{node}: reloaded (certificate expires {answer})")
    return EXIT_NEGATIVE if failed else EXIT_OK


def _run_rotate(args: argparse.Namespace) -> int:
    from phalanx.ops.cert_rotation import rotate_node_cert

    directory = _cluster_dir(args, "phalanx cert rotate")
    if directory is None:
        return EXIT_USAGE
    config = rotate_node_cert(directory, args.node)
    print(f"{args.node}: new certificate {config.tls.cert} and key {config.tls.key}")
    return _reload(directory, [args.node], "phalanx cert rotate")


def _run_rotate_ca(args: argparse.Namespace) -> int:
    from phalanx.ops import cert_rotation

    prog = "phalanx cert rotate-ca"
    directory = _cluster_dir(args, prog)
    if directory is None:
        return EXIT_USAGE
    if args.step == "begin":
        cert_rotation.begin_ca_rotation(directory)
        print("a new CA is trusted beside the old one in every CA file (the old key is in "
              "ca/ca.key.old); re-open long-running clients, then run `phalanx cert "
              "rotate-ca reissue`")
    elif args.step == "reissue":
        names = cert_rotation.reissue_all(directory)
        print(f"reissued {len(names)} certificates from the new CA: {', '.join(names)}; "
              "hand clients their new certificates, then run `phalanx cert rotate-ca finish`")
    else:
        unknown = cert_rotation.finish_ca_rotation(directory)
        if unknown:
            print(f"could not read the IDENTITY of {', '.join(unknown)} here: make sure they "
                  "reloaded before restarting them", file=sys.stderr)
        print("only the new CA is in the CA files; restart each node once, one at a time "
              "(`phalanx cluster up DIR --node N`), so none trusts the old CA any more")
    return _reload(directory, None, prog)


def _run_reload(args: argparse.Namespace) -> int:
    directory = _cluster_dir(args, "phalanx cert reload")
    if directory is None:
        return EXIT_USAGE
    return _reload(directory, [args.node] if args.node else None, "phalanx cert reload")
