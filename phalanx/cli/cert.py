"""`phalanx cert issue-client`: issue a client certificate for a cluster directory.

Owns: `issue_client` (writes ``DIR/clients/<name>.pem`` and ``<name>.key`` signed by the
cluster CA in ``DIR/ca/``) and its argparse wiring (`add_cert_command`).

Rules:
- The role is carried by the certificate (``urn:phalanx:role:<role>``; `phalanx.runtime.client_auth`
  says what each role may do), so a new client needs no change on the nodes.
- An existing certificate of that name is never overwritten (a new key for a name that is in
  use would silently change who that client is); operator errors are one line on stderr,
  exit status 1 (2 for usage errors, from argparse).
- Never imports the runtime or the client library.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from phalanx.ops import pki

_EPILOG = """\
roles (carried by the certificate; every node checks each request against it):
  read-only   reads (linearizable and --stale) and status
  read-write  also writes (the default; `cluster init` issues clients/client.pem)
  admin       also operator operations (clients/admin.pem)

examples:
  phalanx cert issue-client dashboard --role read-only --cluster ./demo-cluster
  phalanx kv --cluster ./demo-cluster --as dashboard get greeting

A client owns the session ids NAME, NAME/... and NAME#... (the client library picks
NAME/<random> itself). Keep NAME.key secret: whoever holds it is that client. A role cannot
be revoked short of replacing the cluster CA, so issue the weakest role that will do.
"""


class CertError(Exception):
    """An operator-fixable problem (no CA, a name already issued, a bad name or role)."""


def issue_client(cluster_dir: Path, name: str, role: str) -> pki.CredentialPaths:
    """Issue client `name` with `role` under `cluster_dir` (see the module docstring).

    Raises:
        CertError: no CA under ``DIR/ca``, `name` or `role` invalid, or `name` already issued.
    """
    try:
        pki.validate_name(name)
        pki.validate_role(role)
    except ValueError as e:
        raise CertError(str(e)) from None
    ca_dir = cluster_dir / "ca"
    if not (ca_dir / "ca.pem").is_file() or not (ca_dir / "ca.key").is_file():
        raise CertError(f"no cluster CA at {ca_dir} (ca.pem and ca.key; run "
                        f"`phalanx cluster init {cluster_dir}` first)")
    clients = cluster_dir / "clients"
    for existing in (clients / f"{name}.pem", clients / f"{name}.key"):
        if existing.exists():
            raise CertError(f"{existing} exists; refusing to replace client {name!r} "
                            "(choose another name)")
    try:
        ca = pki.load_ca(ca_dir)
    except (OSError, ValueError) as e:
        raise CertError(f"cannot load the cluster CA from {ca_dir}: {e}") from None
    return pki.write_credentials(pki.issue_client_cert(ca, name, role=role), clients)


def _run_issue_client(args: argparse.Namespace) -> int:
    if not args.cluster:
        print("phalanx cert issue-client: no cluster given (use --cluster DIR or set "
              "$PHALANX_CLUSTER)", file=sys.stderr)
        return 2
    try:
        paths = issue_client(Path(args.cluster), args.name, args.role)
    except CertError as e:
        print(f"phalanx cert issue-client: {e}", file=sys.stderr)
        return 1
    print(f"issued client {args.name!r} (role {args.role}): {paths.certificate}, "
          f"{paths.private_key}")
    return 0


def add_cert_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx cert issue-client`` (and show, rotate, rotate-ca, reload:
    `phalanx.cli.cert_rotate`) on `subparsers`."""
    cert = subparsers.add_parser(
        "cert", help="issue client certificates; show, rotate and reload certificates",
        description="Manage the certificates of a cluster directory.")
    sub = cert.add_subparsers(dest="cert_command", metavar="SUBCOMMAND", required=True)
    issue = sub.add_parser(
        "issue-client", help="issue a client certificate with a role",
        description="Issue DIR/clients/NAME.pem and NAME.key, signed by the cluster CA "
                    "(DIR/ca/ca.key), naming client NAME with ROLE.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    issue.add_argument("name", metavar="NAME", help="the client's name ([A-Za-z0-9._-]{1,64})")
    issue.add_argument("--role", choices=pki.CLIENT_ROLES, default=pki.DEFAULT_CLIENT_ROLE,
                       help="what the client may do (default: %(default)s)")
    issue.add_argument("--cluster", metavar="DIR", default=os.environ.get("PHALANX_CLUSTER"),
                       help="the cluster directory (default: $PHALANX_CLUSTER)")
    issue.set_defaults(handler=_run_issue_client)
    from phalanx.cli.cert_rotate import add_rotation_commands

    add_rotation_commands(sub)
