"""`phalanx member list|add|promote|remove` and `phalanx leader transfer`: change a running
Raft cluster's membership and move its leader (`phalanx.client.admin_calls`).

Owns: the two commands' parsers and handlers; they print one table or one line, and wait
(up to --timeout) until the change took effect, reading the membership back from the leader.
Uses the cluster's admin certificate (``DIR/clients/admin.pem``; `--as NAME` another one).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from phalanx.cli.cluster_arg import add_cluster_option, open_cluster_arg
from phalanx.cli.errors import (
    EXIT_FORBIDDEN,
    EXIT_INDETERMINATE,
    EXIT_OK,
    EXIT_REFUSED,
    print_error,
)

_MEMBER_EPILOG = """\
examples:
  phalanx cluster add-node ./c                 # lays out n4 (config, certificate, ports)
  phalanx member list --cluster ./c
  phalanx member add n4 --cluster ./c          # as a learner: it receives the log, no vote
  phalanx member promote n4 --cluster ./c      # a voter, once it has caught up
  phalanx member remove n1 --cluster ./c       # joint consensus; n1 may be the leader

Every change goes through the leader by joint consensus, one at a time; the command waits
until it has taken effect (the joint configuration left). Raft only: PBFT's membership is
static. docs/OPERATIONS.md, "Changing the membership", has the whole procedure.

exit status: 0 done; 3 refused (nothing changed: the reason is printed, e.g. "learner n4
has not caught up"); 4 no answer or not done in time (the change MAY be under way: run
`member list`); 6 forbidden (not an admin certificate); 2 usage error.
"""

_LEADER_EPILOG = """\
examples:
  phalanx leader transfer --to n2 --cluster ./c

Asks the leader to hand leadership to voter NODE (Raft §3.10: it brings NODE up to date,
then tells it to campaign at once) and waits until NODE leads.

exit status: 0 NODE leads; 3 refused; 4 not done in time; 6 forbidden; 2 usage error.
"""


def add_member_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx member``."""
    member = subparsers.add_parser(
        "member", help="list, add, promote and remove members of a running Raft cluster",
        description="List and change the membership of a running Raft cluster (joint "
                    "consensus; learners first).",
        epilog=_MEMBER_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = member.add_subparsers(dest="member_command", metavar="SUBCOMMAND", required=True)
    for name, helptext in (("list", "show voters, learners, the leader and how far each "
                                    "member has caught up"),
                           ("add", "add NODE as a learner (it must be laid out: "
                                   "`cluster add-node`, and running)"),
                           ("promote", "make learner NODE a voter (once caught up)"),
                           ("remove", "remove voter or learner NODE")):
        p = sub.add_parser(name, help=helptext, description=helptext[0].upper() + helptext[1:]
                           + ".", epilog=_MEMBER_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if name != "list":
            p.add_argument("node", metavar="NODE", help="the node id, e.g. n4")
        add_cluster_option(p)
        p.set_defaults(handler=_run_member, admin_op=name)


def add_leader_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx leader transfer``."""
    leader = subparsers.add_parser(
        "leader", help="move the leadership of a running Raft cluster",
        description="Move the leadership of a running Raft cluster.",
        epilog=_LEADER_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    lsub = leader.add_subparsers(dest="leader_command", metavar="SUBCOMMAND", required=True)
    transfer = lsub.add_parser("transfer", help="hand leadership to voter --to NODE",
                               description="Hand leadership to voter NODE and wait until it "
                               "leads.", epilog=_LEADER_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    transfer.add_argument("--to", required=True, metavar="NODE", dest="node",
                          help="the voter to lead")
    add_cluster_option(transfer)
    transfer.set_defaults(handler=_run_member, admin_op="transfer")


def _table(reply: object) -> str:
    from phalanx.ops.admin_messages import AdminReply

    assert isinstance(reply, AdminReply)
    lines = [f"{'NODE':<8} {'ROLE':<10} {'MATCHED':>8}"]
    matched = dict(zip(reply.members, reply.matched, strict=True))
    for node in reply.members:
        role = ("leader" if node == reply.leader else
                "voter" if node in reply.voters else
                "outgoing" if node in reply.voters_outgoing else "learner")
        lines.append(f"{node:<8} {role:<10} {matched.get(node, 0):>8}")
    joint = " (joint: a change is under way)" if reply.voters_outgoing else ""
    lines.append(f"term {reply.term}, commit index {reply.commit_index}{joint}")
    return "\n".join(lines)


def _run_member(args: argparse.Namespace) -> int:
    import trio

    from phalanx.client import admin_calls
    from phalanx.client.errors import ClientTimeout, Forbidden, RequestRejected
    from phalanx.ops.admin_messages import AdminReply

    prog = f"phalanx {'leader' if args.admin_op == 'transfer' else 'member'} {args.admin_op}"
    cluster = open_cluster_arg(args, prog)
    if cluster is None:
        return 2
    name = args.client_name or admin_calls.ADMIN_NAME
    cert = cluster.directory / "clients" / f"{name}.pem"
    if not (cert.is_file() and cert.with_suffix(".key").is_file()):
        print_error(prog, f"no admin certificate {cert} (and .key): `cluster init` issues "
                    f"clients/admin.pem; issue one with `phalanx cert issue-client NAME --role "
                    f"admin --cluster {args.cluster}` and pass --as NAME")
        return 2
    node: str = getattr(args, "node", "")
    op = {"add": "add-learner"}.get(args.admin_op, args.admin_op)
    done: dict[str, Callable[[AdminReply], bool]] = {
        "add-learner": lambda r: node in r.learners and not r.voters_outgoing,
        "promote": lambda r: node in r.voters and not r.voters_outgoing,
        "remove": lambda r: node not in r.members and not r.voters_outgoing,
        "transfer": lambda r: r.leader == node,
    }

    async def run() -> AdminReply:
        if op == "list":
            return await admin_calls.member_list(cluster, seconds=args.timeout, name=name)
        if op == "add-learner":  # with its peer address: running nodes link to it
            await admin_calls.member_add(cluster, node, seconds=args.timeout, name=name)
        else:
            await admin_calls.admin_call(cluster, op, node, seconds=args.timeout, name=name)
        return await admin_calls.wait_for(cluster, done[op], seconds=args.timeout, name=name)

    try:
        reply = trio.run(run)
    except Forbidden as e:
        print_error(prog, str(e))
        return EXIT_FORBIDDEN
    except RequestRejected as e:
        print_error(prog, f"refused: {e}")
        return EXIT_REFUSED
    except ClientTimeout as e:
        print_error(prog, f"{e}; is the cluster up?" if op == "list" else
                    f"{e}; the change may be under way: run `phalanx member list`")
        return EXIT_INDETERMINATE
    if op == "list":
        print(_table(reply))
    elif op == "transfer":
        print(f"{node} leads (term {reply.term})")
    else:
        print(f"{args.admin_op} {node}: done; voters {', '.join(reply.voters)}"
              + (f"; learners {', '.join(reply.learners)}" if reply.learners else ""))
    sys.stdout.flush()
    return EXIT_OK
