"""``ssdmpi-cluster``: a multi-node cluster on one machine out of Linux namespaces.

  ssdmpi-cluster [--name NAME] up --nodes N [--nic RATE] [--latency MS]
  ssdmpi-cluster [--name NAME] exec NODE -- COMMAND [ARGS...]
  ssdmpi-cluster [--name NAME] mpirun --ranks-per-node R [--nodes K] -- COMMAND [ARGS...]
  ssdmpi-cluster [--name NAME] run --nodes N --ranks-per-node R [--nic RATE] [--latency MS] -- COMMAND
  ssdmpi-cluster [--name NAME] status
  ssdmpi-cluster [--name NAME] down

``up`` makes N nodes (``NAME-n0``..) on a private switch, each NIC limited to RATE in each
direction (a tc rate: 100mbit, 1gbit, ...; default unlimited) with tbf latency MS (default
10: the longest a packet may queue). ``exec`` runs a command on a node (0, n0 or its host
name). ``mpirun`` starts COMMAND as R MPI ranks per node with MPICH's ``mpiexec``, launched
from node 0, MPI over TCP between nodes. ``run`` is up + mpirun + down, and takes the
cluster down on exit, Ctrl-C or SIGTERM too. ``down`` removes every namespace, link and
process of the cluster, and is safe to repeat. NAME defaults to ``ssdmpi``.

Exit status: the command's for exec/mpirun/run; 2 for bad input, or without root/iproute2.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from ssdmpi.cluster.mpi import mpi_env, mpiexec_argv
from ssdmpi.cluster.nodes import Cluster, ClusterError, check_host

PROG = "ssdmpi-cluster"
GRACE = 10.0      # seconds `run` lets the command end after Ctrl-C/SIGTERM before taking the cluster down


class Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line (exit 2) instead of usage + error, and takes
    no abbreviations (``--node`` is not ``--nodes``)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise ClusterError(f"{message} (see {PROG} --help)")


def _positive(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _ms(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None


def build_parser() -> Parser:
    common = Parser(add_help=False)
    common.add_argument("--name", default=argparse.SUPPRESS, help="cluster name (default: ssdmpi)")
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0], parents=[common],
                    formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = parser.add_subparsers(dest="action", required=True, parser_class=Parser)
    for action in ("up", "run"):
        p = sub.add_parser(action, parents=[common])
        p.add_argument("--nodes", type=_positive, required=True)
        p.add_argument("--nic", default="unlimited", help="rate of each NIC, each way (tc units: 1gbit)")
        p.add_argument("--latency", type=_ms, default=10.0, help="tbf latency, ms")
        if action == "run":
            p.add_argument("--ranks-per-node", type=_positive, required=True)
    p = sub.add_parser("exec", parents=[common])
    p.add_argument("node")
    p = sub.add_parser("mpirun", parents=[common])
    p.add_argument("--ranks-per-node", type=_positive, required=True)
    p.add_argument("--nodes", type=_positive, default=None, help="the first K nodes (default: all)")
    sub.add_parser("status", parents=[common])
    sub.add_parser("down", parents=[common])
    return parser


def _wait_forwarding(proc: subprocess.Popen, grace: float | None = None) -> int:
    """Wait for ``proc``, passing SIGINT/SIGTERM on to it; return its exit status.

    With ``grace``, stop waiting that many seconds after a signal and return 128 + signal
    (``run`` then takes the cluster down, which kills whatever still runs on it)."""
    signalled = []

    def forward(signum, _frame):
        signalled.append((signum, time.monotonic()))
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if grace is not None and signalled and time.monotonic() - signalled[0][1] > grace:
                    return 128 + signalled[0][0]
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(signum)


def run(cluster: Cluster, args, cmd: list[str]) -> int:
    """up, mpirun, down: down also on any error, Ctrl-C or SIGTERM (but never a cluster
    of the same name that was up before)."""
    cluster.check_free()
    old = signal.signal(signal.SIGTERM, _interrupt)      # SIGTERM during up: still take it down
    try:
        cluster.up()
        argv = mpiexec_argv(cluster, args.ranks_per_node, cmd)
        print(f"{PROG}: {len(cluster.nodes)} node(s) x {args.ranks_per_node} rank(s), NIC {cluster.nic}",
              file=sys.stderr, flush=True)
        return _wait_forwarding(subprocess.Popen(argv, env=mpi_env()), grace=GRACE)
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
        cluster.down()


def dispatch(args, cmd: list[str]) -> int:
    name = getattr(args, "name", "ssdmpi")
    if args.action in ("up", "run"):
        cluster = Cluster(name, args.nodes, args.nic, args.latency)
        if args.action == "run":
            return run(cluster, args, cmd)
        cluster.up()
        print(cluster.status())
        return 0
    check_host()
    if args.action == "down":
        found = Cluster(name, 1).down()
        print(f"{PROG}: cluster {name} {'is down' if found else 'was not up (nothing to remove)'}")
        return 0
    cluster = Cluster.load(name)
    if args.action == "status":
        print(cluster.status())
        return 0
    cluster.check_alive()
    if args.action == "exec":
        if not cmd:
            raise ClusterError(f"no command given: {PROG} exec NODE -- COMMAND [ARGS...]")
        os.execvp("nsenter", cluster.enter(cluster.node(args.node), cmd))
    argv = mpiexec_argv(cluster, args.ranks_per_node, cmd, args.nodes)
    return _wait_forwarding(subprocess.Popen(argv, env=mpi_env()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cmd: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1:]
    try:
        args = build_parser().parse_args(argv)
        if args.action in ("up", "status", "down") and cmd:
            raise ClusterError(f"{args.action} takes no command after --")
        return dispatch(args, cmd)
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
