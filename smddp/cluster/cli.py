"""``smddp-cluster``: make, use and remove a cluster on one machine.

    smddp-cluster up --hosts 2 --nics 2 --rate 1gbit
    smddp-cluster run -- examples/check_collectives.py
    smddp-cluster run --nproc-per-node 4 -- smddp-bench --op all_gather
    smddp-cluster exec 1 -- ip -s link
    smddp-cluster nic 0 1 down
    smddp-cluster path 1 0 1 drop
    smddp-cluster down
"""

from __future__ import annotations

import argparse
import sys

from smddp.cluster._cluster import (
    DEFAULT_NAME,
    MASTER_PORT,
    TCP_CONGESTION,
    Cluster,
    ClusterError,
    unavailable_reason,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smddp-cluster",
        description=(
            "A cluster on one machine: hosts as network namespaces (each with its own hostname and\n"
            "/dev/shm), NICs as veth links on one bridge, shaped with tc tbf, in 198.18.0.0/15 and\n"
            "reaching nothing outside the machine. Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--name", default=DEFAULT_NAME, help="cluster name: several can coexist (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="make the cluster (removing what an earlier one left)")
    up.add_argument("--hosts", type=int, default=2, help="hosts (default: %(default)s)")
    up.add_argument("--nics", type=int, default=2, help="NICs per host (default: %(default)s)")
    up.add_argument(
        "--rate", default="none",
        help="each NIC's rate per direction, as tc writes it: 1gbit, 100mbit, 10gbit; none: unshaped "
        "(default: %(default)s)",
    )
    up.add_argument("--mtu", type=int, default=9000, help="MTU of every link (default: %(default)s)")
    up.add_argument(
        "--tcp-congestion", default=TCP_CONGESTION,
        help="the hosts' TCP congestion control, as a stock Linux host has it whatever this machine's "
        "default; system: this machine's (default: %(default)s)",
    )

    run = sub.add_parser("run", help="one torchrun per host: smddp-cluster run [options] -- SCRIPT ARGS")
    run.add_argument("--nproc-per-node", type=int, default=None, help="ranks per host (default: one per NIC)")
    run.add_argument("--hosts", type=int, default=None, help="use the first N hosts (default: all)")
    run.add_argument("--timeout", type=float, default=None, help="seconds before every host's processes are killed")
    run.add_argument(
        "--grace", type=float, default=30,
        help="seconds the other hosts get once one failed, before they are stopped (default: %(default)s)",
    )
    run.add_argument(
        "--master-port", type=int, default=MASTER_PORT, help="rendezvous port on host 0 (default: %(default)s)"
    )
    run.add_argument(
        "argv", nargs=argparse.REMAINDER, help="-- then the script (or -m module, or a command) and its arguments"
    )

    ex = sub.add_parser("exec", help="run a command on one host: smddp-cluster exec HOST -- CMD")
    ex.add_argument("host", type=int)
    ex.add_argument("argv", nargs=argparse.REMAINDER)

    nic = sub.add_parser("nic", help="take a NIC of a host down (a cut link) or up again")
    nic.add_argument("host", type=int)
    nic.add_argument("nic", type=int)
    nic.add_argument("state", choices=("up", "down"))

    path = sub.add_parser("path", help="make a host drop what it sends to a NIC of another (a firewall that drops "
                                       "that path) or send it again: smddp-cluster path HOST PEER NIC drop|open")
    path.add_argument("host", type=int)
    path.add_argument("peer", type=int)
    path.add_argument("nic", type=int)
    path.add_argument("state", choices=("drop", "open"))

    sub.add_parser("status", help="the cluster that is up: hosts, NICs, addresses")
    sub.add_parser("down", help="remove everything the cluster made")
    sub.add_parser("check", help="say whether a cluster can be made here, and what is missing")
    return p


def _strip_dashes(argv: list[str]) -> list[str]:
    return argv[1:] if argv and argv[0] == "--" else argv


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            reason = unavailable_reason(probe=True)
            print(reason or "a cluster can be made here")
            return 1 if reason else 0
        if args.command == "up":
            c = Cluster(
                hosts=args.hosts, nics=args.nics, rate=args.rate, mtu=args.mtu, name=args.name,
                tcp_congestion=args.tcp_congestion,
            )
            c.up()
            print(c.describe())
            return 0
        if args.command == "down":
            c = _existing(args.name)
            removed = c.down()
            print(f"cluster {args.name!r}: " + (f"removed {len(removed)} items" if removed else "nothing to remove"))
            left = c.leftovers()
            if left:
                print(f"smddp-cluster: could not remove: {', '.join(left)}", file=sys.stderr)
                return 1
            return 0
        c = Cluster.load(args.name)
        if args.command == "status":
            print(c.describe())
            return 0
        if args.command == "nic":
            c.set_nic(args.host, args.nic, args.state == "up")
            return 0
        if args.command == "path":
            c.set_path(args.host, args.peer, args.nic, open=args.state == "open")
            return 0
        if args.command == "exec":
            cmd = _strip_dashes(args.argv) or ["sh"]
            return c.exec(args.host, cmd, check=False, timeout=None, capture=False).returncode
        result = c.run(
            _strip_dashes(args.argv), nproc_per_node=args.nproc_per_node, hosts=args.hosts,
            timeout=args.timeout, echo=sys.stdout, master_port=args.master_port, grace=args.grace,
        )
        if result.timed_out:
            print(f"smddp-cluster: the run did not finish within {args.timeout:.0f} s (--timeout); every "
                  "host's processes were killed", file=sys.stderr)
        for h, code in enumerate(result.host_codes):
            if h in result.stopped:
                print(f"smddp-cluster: h{h} was stopped {args.grace:.0f} s after another host failed",
                      file=sys.stderr)
            elif code != 0:
                print(f"smddp-cluster: h{h} exited with status {code}", file=sys.stderr)
        return result.returncode
    except ClusterError as e:
        print(f"smddp-cluster: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("smddp-cluster: interrupted", file=sys.stderr)
        return 130


def _existing(name: str) -> Cluster:
    """The cluster to remove: from its state, or by name alone when its state
    is gone or broken (down must work on any leftovers)."""
    try:
        return Cluster.load(name)
    except ClusterError:
        return Cluster(hosts=1, nics=1, name=name)


if __name__ == "__main__":
    sys.exit(main())
