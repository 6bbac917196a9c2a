"""A cluster on one machine: hosts as namespaces, NICs as shaped links.

    smddp-cluster up --hosts 2 --nics 2 --rate 1gbit
    smddp-cluster run -- examples/check_collectives.py
    smddp-cluster down

Each host is a network namespace with its own hostname (UTS namespace) and
its own ``/dev/shm`` (mount namespace), so smddp sees separate nodes exactly
as on separate machines. Host h has K NICs ``nic0..nic{K-1}``, veth links to
one bridge that lives in a namespace of its own (the switch); NIC k of host h
has the address ``198.18.k.(h+1)`` in 198.18.0.0/15, the range set aside for
benchmarks. Each NIC has a routing table of its own, chosen by the source
address, that sends everything from its address through it and nowhere else
(a down NIC does not fail over to another), as the rails of a p4d's EFAs do.
``--rate`` shapes every NIC's egress on both ends of its link (``tc tbf``),
so a host sends and receives at most K x rate. The hosts' TCP congestion
control is cubic, a stock Linux host's, whatever this machine's default
(``--tcp-congestion``). Nothing reaches outside the machine: there is no
uplink, no NAT and no default route.

``run`` starts one torchrun per host with ``--node-rank h``, rendezvous on
host 0's first NIC, ``SMDDP_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` set to
all the host's NICs, and prints every host's output prefixed by the host; its
exit status is the worst host's. Everything the cluster made is recorded in
one state file (``/run/smddp-cluster/<name>/state.json``), so ``run`` and
``down`` need no arguments, and ``up`` first removes what an earlier run left.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 (``ip``, ``tc``) and
util-linux (``nsenter``, ``unshare``).
"""

from smddp.cluster._cluster import (
    ADDRESS_RANGE,
    Cluster,
    ClusterError,
    ClusterRun,
    RunResult,
    parse_rate,
    unavailable_reason,
)

__all__ = [
    "ADDRESS_RANGE",
    "Cluster",
    "ClusterError",
    "ClusterRun",
    "RunResult",
    "parse_rate",
    "unavailable_reason",
]
