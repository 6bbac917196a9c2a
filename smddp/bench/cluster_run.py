"""The benchmarks on a cluster of namespaces (smddp.cluster): ``--cluster HxR``.

    smddp-bench --cluster 2x2 --nics 2 --rate 1gbit --backends smddp:hierarchical,smddp:ring,gloo
    smddp-bench model --preset cluster --cluster 2x2 --nics 2 --rate 1gbit --calibrate
    smddp-bench step --cluster 2x2 --nics 2 --rate 1gbit

The command uses the cluster of ``--cluster-name`` that is up, when it has
the hosts, NICs and rate asked for, or brings one up (and removes it at the
end, unless ``--keep-cluster``); a cluster that is up with other NICs or
another rate is an error, never silently replaced. It then starts one
torchrun per host with R ranks each (``launch.Ranks.command``, one log per
host, host 0's copied to the output as it comes), exactly as on separate
machines: every rank runs the same command line under the launcher, finds
RANK and WORLD_SIZE set, and reads the cluster's facts from
``SMDDP_BENCH_CLUSTER``. The sweep's header names the hosts, their NICs and
the rate; rank 0 prints each rank's NIC (as smddp chose it, ``nic()`` on its
process group); every table gives the links' limit (smddp.bench.links) and
each backend's fraction of it, and the JSON record keeps all of it in
``topology.facts``.

The step benchmark drives its ranks through pipes from one process, so its
ranks are spawned as always and each enters its host's namespaces (network,
UTS, mount) first thing, while it runs a single thread (before any group or
thread pool of torch exists).

Needs what smddp-cluster needs: root (or CAP_NET_ADMIN and CAP_SYS_ADMIN),
iproute2 and util-linux.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import re
import sys
import threading
import time
from typing import IO, Any, Callable

from smddp.bench import launch, links
from smddp.bench.units import at_least

CLUSTER_ENV = "SMDDP_BENCH_CLUSTER"  # the cluster's facts (JSON), for the ranks
LAUNCHER = "smddp-cluster"


def add_arguments(p: argparse.ArgumentParser, nics: bool = True) -> None:
    """The options of every benchmark that can run on the cluster (``nics``:
    also --nics, where the command has none of its own)."""
    g = p.add_argument_group("on a cluster of namespaces (smddp-cluster; needs root)")
    g.add_argument("--cluster", metavar="HxR",
                   help="run on H emulated hosts of R ranks each, one torchrun per host, using the "
                   "cluster that is up or bringing up `smddp-cluster up --hosts H --nics K --rate "
                   "RATE`")  # fmt: skip
    if nics:
        g.add_argument("--nics", type=at_least(1), help="NICs per host [the cluster that is up, else R]")
    g.add_argument("--rate",
                   help="each NIC's rate per direction, as tc writes it: 1gbit, 100mbit; none: "
                   "unshaped [the cluster that is up, else none]")  # fmt: skip
    g.add_argument("--cluster-name", default="smddp", help="the cluster's name (smddp-cluster --name)")
    g.add_argument("--keep-cluster", action="store_true",
                   help="leave up a cluster this command brought up")


def parse_shape(text: str) -> tuple[int, int]:
    """``"2x2"`` -> (hosts, ranks per host)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text or "")
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"--cluster {text!r}: give hosts x ranks per host, e.g. 2x2")
    return int(m.group(1)), int(m.group(2))


def check_arguments(ns: argparse.Namespace, parser: argparse.ArgumentParser,
                    sweep: bool = True) -> tuple[int, int]:  # fmt: skip
    """(hosts, ranks per host) of ``--cluster``; usage errors for what
    contradicts it (``sweep``: the sweep's --nodes and --nproc too)."""
    try:
        hosts, per_host = parse_shape(ns.cluster)
    except ValueError as e:
        parser.error(str(e))
    if sweep and ns.nodes is not None:
        parser.error("--nodes emulates nodes on one host; with --cluster every host is a node")
    if sweep and ns.nproc not in (None, hosts * per_host):
        parser.error(f"--nproc {ns.nproc} disagrees with --cluster {ns.cluster} ({hosts * per_host} ranks)")
    return hosts, per_host


# -- the cluster ----------------------------------------------------------------


def with_cluster(ns: argparse.Namespace, hosts: int, per_host: int, what: str,
                 body: Callable[[Any, dict[str, Any]], int]) -> int:  # fmt: skip
    """``body(cluster, facts)`` on the cluster ``obtain`` gives; one that this
    command brought up is removed after it (unless --keep-cluster). Returns
    its exit status, or 2 when there is no such cluster."""
    from smddp.cluster import ClusterError

    say = lambda msg: print(f"# {msg}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        c, made = obtain(ns, hosts, per_host, say)
    except ClusterError as e:
        print(f"{what}: {e}", file=sys.stderr)
        return 2
    try:
        return body(c, facts_of(c, hosts, per_host))
    finally:
        if made and not ns.keep_cluster:
            c.down()
            say(f"cluster {c.name!r} removed (--keep-cluster leaves it up)")


def obtain(ns: argparse.Namespace, hosts: int, per_host: int, say: Callable[[str], None]) -> tuple[Any, bool]:
    """The cluster to run on, and whether this command brought it up.
    ClusterError when it cannot be made, or one is up with other NICs or rate."""
    from smddp.cluster import Cluster, ClusterError, parse_rate, unavailable_reason

    try:
        c = Cluster.load(ns.cluster_name)
    except ClusterError:
        c = None
    if c is not None:
        differs = []
        if c.hosts < hosts:
            differs.append(f"{c.hosts} hosts, not {hosts}")
        if ns.nics is not None and ns.nics != c.nics:
            differs.append(f"{c.nics} NICs per host, not {ns.nics}")
        if ns.rate is not None and parse_rate(ns.rate) != c.rate_bytes_per_s:
            differs.append(f"rate {c.rate or 'none'}, not {ns.rate}")
        if differs:
            raise ClusterError(
                f"cluster {c.name!r} is up with {'; '.join(differs)}: remove it first "
                f"(smddp-cluster --name {c.name} down), or name another (--cluster-name)")  # fmt: skip
        say(f"using cluster {c.name!r}, which is up")
        return c, False
    reason = unavailable_reason()
    if reason:
        raise ClusterError(reason)
    c = Cluster(hosts=hosts, nics=ns.nics or per_host, rate=ns.rate, name=ns.cluster_name)
    say(f"bringing up cluster {c.name!r}: smddp-cluster --name {c.name} up --hosts {hosts} "
        f"--nics {c.nics} --rate {c.rate or 'none'}")  # fmt: skip
    c.up()
    return c, True


def facts_of(c: Any, hosts: int, per_host: int) -> dict[str, Any]:
    """What the benchmark records of the cluster (``topology.facts``)."""
    return {
        "cluster": c.name, "hosts": hosts, "ranks_per_host": per_host, "nics": c.nics,
        "rate": c.rate, "rate_bytes_per_s": c.rate_bytes_per_s, "mtu": c.mtu, "tcp": c.tcp,
        "host_nics": [{"host": f"h{h}", "hostname": c.hostname(h),
                       "nics": [{"name": c.nic_name(k), "address": c.address(h, k)}
                                for k in range(c.nics)]} for h in range(hosts)],
    }  # fmt: skip


def header(facts: dict[str, Any], rule: bool = True) -> str:
    """The cluster, each host's NICs and (``rule``) how the links' limit is defined."""
    lines = [f"# cluster {facts['cluster']!r} (smddp-cluster): {links.describe_cluster(facts)}; "
             "one torchrun per host"]  # fmt: skip
    for h in facts["host_nics"]:
        nics = ", ".join(f"{n['name']} {n['address']}" for n in h["nics"])
        lines.append(f"#   {h['host']} (hostname {h['hostname']}): {nics}")
    return "\n".join(lines + ([f"# {links.RULE}"] if rule else []))


def rank_env(c: Any, facts: dict[str, Any]) -> dict[str, str]:
    """The environment of every rank on the cluster."""
    import smddp

    env = {k: v for k, v in os.environ.items() if k != "SMDDP_RANKS_PER_NODE"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(smddp.__file__)))
    path = env.get("PYTHONPATH", "")
    env.update({
        "SMDDP_SOCKET_IFNAME": c.socket_ifname(), "GLOO_SOCKET_IFNAME": c.socket_ifname(),
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        "PYTHONPATH": root + (os.pathsep + path if path else ""), CLUSTER_ENV: json.dumps(facts),
    })  # fmt: skip
    return env


# -- one torchrun per host ------------------------------------------------------


def _follow(path: str, out: IO[str], done: threading.Event) -> None:
    """Copies the lines the log ``path`` gains to ``out`` until ``done`` is set
    (the command's own first line, ``$ ...``, is left out)."""
    while not os.path.exists(path) and not done.wait(0.05):
        pass
    with open(path, errors="replace") as f:
        first = True
        while True:
            line = f.readline()
            if line:
                if not (first and line.startswith("$ ")):
                    out.write(line)
                    out.flush()
                first = False
            elif done.is_set():
                return
            else:
                time.sleep(0.05)


def run_hosts(c: Any, facts: dict[str, Any], argv: list[str], timeout: float, what: str) -> int:
    """The cluster's header, then ``python ARGV`` under one torchrun per host,
    every rank in ``rank_env``; host 0's output goes to stdout as it comes, a
    failed host's log to stderr, the wall time last. The run's exit status."""
    import tempfile

    print(header(facts), flush=True)
    hosts, per_host, env = facts["hosts"], facts["ranks_per_host"], rank_env(c, facts)
    logs, port = tempfile.mkdtemp(prefix="smddp-bench-cluster-"), launch.free_port()
    started = time.monotonic()
    paths = [os.path.join(logs, f"h{h}.log") for h in range(hosts)]
    done = threading.Event()
    follow = threading.Thread(target=_follow, args=(paths[0], sys.stdout, done), name="follow-h0", daemon=True)
    follow.start()
    try:
        with launch.Ranks(what) as ranks:
            for h in range(hosts):
                cmd = c.enter(h) + c.torchrun_command(h, argv, per_host, hosts, port)
                ranks.command(cmd, env, paths[h], f"h{h} (torchrun)")
            code = ranks.wait(timeout)
    finally:
        done.set()
        follow.join(timeout=10)
    if code != 0:
        for h, path in enumerate(paths[1:], start=1):
            with open(path, errors="replace") as f:
                tail = f.read().splitlines()[-40:]
            sys.stderr.write("".join(f"[h{h}] {line}\n" for line in tail))
        print(f"{what}: the hosts' logs are in {logs}", file=sys.stderr)
    else:
        for path in paths:
            os.unlink(path)
        os.rmdir(logs)
    print(f"# wall time: {time.monotonic() - started:.1f} s", flush=True)
    return code


def run(ns: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str], hosts: int,
        per_host: int) -> int:  # fmt: skip
    """``smddp-bench --cluster HxR``: the launching side."""
    from smddp.bench import cli

    settings, world, _ = cli.resolve(ns, parser, argv, hosts * per_host)

    def sweep(c: Any, facts: dict[str, Any]) -> int:
        print(cli.describe(settings, world, None), flush=True)
        rank_argv = ["-m", "smddp.bench", *argv, *([] if "--no-progress" in argv else ["--no-progress"])]
        return run_hosts(c, facts, rank_argv, ns.timeout, "smddp-bench")

    return with_cluster(ns, hosts, per_host, "smddp-bench", sweep)


def as_rank(settings: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The settings of one rank of a sweep under the cluster's torchrun."""
    facts = json.loads(os.environ.get(CLUSTER_ENV) or "{}")
    if not facts:
        parser.error(f"--cluster under a launcher: {CLUSTER_ENV} is not set; start it without "
                     "torchrun, smddp-bench starts one per host")  # fmt: skip
    settings.launcher, settings.facts, settings.no_progress = LAUNCHER, facts, True


def on_cluster(s: Any, groups: dict[str, Any], comm: Any) -> links.LinksView:
    """In every rank of a sweep on the cluster, once the groups exist: each
    rank's NIC (from an smddp group) into the facts, printed by rank 0; the
    view that adds the links' limit to the tables."""
    import socket

    import torch
    import torch.distributed as dist

    nic = None
    for name, group in groups.items():
        if name.split(":")[0] == "smddp":
            nic = group._get_backend(torch.device("cpu")).nic()
            break
    hostname = socket.gethostname()
    host = next((h["host"] for h in s.facts.get("host_nics", []) if h["hostname"] == hostname), hostname)
    me = {"rank": comm.rank, "host": host, "nic": nic and nic["name"], "address": nic and nic["address"]}
    everyone: list[Any] = [None] * comm.world
    dist.all_gather_object(everyone, me, group=comm.ctrl)
    s.facts["rank_nics"] = everyone
    if comm.rank == 0:
        print(f"# each rank's NIC: {links.rank_nics(s.facts)}", flush=True)
    return links.LinksView(s.facts)


# -- spawned ranks that enter their hosts ------------------------------------------

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000


def enter_host(paths: dict[str, str]) -> None:
    """Moves this process (single-threaded: the kernel refuses a mount
    namespace to a process with threads) into a host's network, UTS and mount
    namespaces, keeping its working directory."""
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise RuntimeError(f"cannot enter a host with {threads} threads running (set {SPAWN_ENV})")
    libc = ctypes.CDLL(None, use_errno=True)
    cwd = os.getcwd()
    for kind, flag in (("net", _CLONE_NEWNET), ("uts", _CLONE_NEWUTS), ("mnt", _CLONE_NEWNS)):
        fd = os.open(paths[kind], os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, flag) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({paths[kind]}): {os.strerror(err)}")
        finally:
            os.close(fd)
    os.chdir(cwd)


def host_paths(c: Any, host: int) -> dict[str, str]:
    """The namespace files of ``host`` (what ``Cluster.enter`` hands nsenter)."""
    args = dict(a[2:].split("=", 1) for a in c.enter(host) if a.startswith("--") and "=" in a)
    return {"net": args["net"], "uts": args["uts"], "mnt": args["mount"]}


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """Where each spawned rank runs: rank r on host r // per_host. With an
    ``entry`` (``in_hosts``), the entry point for ``launch.Ranks.spawn`` that
    runs it there."""

    per_host: int
    paths: tuple[dict[str, str], ...]  # per host
    env: dict[str, str]  # added to every rank's environment
    entry: Callable[..., int] | None = None

    def __call__(self, *args: Any, rank: int, world: int, init_method: str, local_rank: int,
                 **kw: Any) -> int:  # pragma: no cover - a child  # fmt: skip
        enter_host(self.paths[rank // self.per_host])
        local = rank % self.per_host
        os.environ.update(self.env)
        os.environ.update(LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(self.per_host),
                          GROUP_RANK=str(rank // self.per_host))  # fmt: skip
        return self.entry(*args, rank=rank, world=world, init_method=init_method, local_rank=local, **kw)


def layout(c: Any, hosts: int, per_host: int, facts: dict[str, Any]) -> HostLayout:
    env = {k: v for k, v in rank_env(c, facts).items() if os.environ.get(k) != v}
    return HostLayout(per_host, tuple(host_paths(c, h) for h in range(hosts)), env)


def in_hosts(entry: Callable[..., int], where: HostLayout) -> HostLayout:
    """``entry`` for ``launch.Ranks.spawn``, run inside the rank's host."""
    return dataclasses.replace(where, entry=entry)


# Spawned ranks enter their host first thing, single-threaded: numpy's
# OpenBLAS must not start its threads at import (a rank imports numpy and
# torch as it unpickles its entry), or the kernel refuses to move the process
# into a mount namespace.
SPAWN_ENV = {"OPENBLAS_NUM_THREADS": "1"}


def step_shape(s: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``smddp-bench step --cluster HxR``: H x R ranks; hsdp replicates over hosts."""
    hosts, per_host = check_arguments(s, parser, sweep=False)
    if s.ranks_per_node:
        parser.error("--ranks-per-node emulates nodes on one host; with --cluster every host is a node")
    s.world = hosts * per_host
    s.replicate_size = s.replicate_size or hosts


def step(s: argparse.Namespace, measure: Callable[[argparse.Namespace], int]) -> int:
    """``measure(s)`` with every rank spawned into its host of the cluster
    (``s.hosts``, the layout; ``s.cluster_facts``, for the record)."""
    hosts, per_host = parse_shape(s.cluster)

    def run(c: Any, facts: dict[str, Any]) -> int:
        facts["rank_nics"] = [
            {"rank": r, "host": f"h{r // per_host}", **_nic_of(facts, r // per_host, r % per_host)}
            for r in range(hosts * per_host)
        ]  # fmt: skip
        print(header(facts, rule=False), flush=True)
        print(f"# each rank's NIC (as SMDDP_SOCKET_IFNAME and LOCAL_RANK choose it): {links.rank_nics(facts)}",
              flush=True)  # fmt: skip
        s.hosts, s.cluster_facts = layout(c, hosts, per_host, facts), facts
        return measure(s)

    return with_cluster(s, hosts, per_host, "smddp-bench step", run)


def _nic_of(facts: dict[str, Any], host: int, local: int) -> dict[str, str]:
    """The NIC smddp gives local rank ``local`` (transport::nicIndex)."""
    nics = facts["host_nics"][host]["nics"]
    k = min(len(nics) - 1, local * len(nics) // facts["ranks_per_host"])
    return {"nic": nics[k]["name"], "address": nics[k]["address"]}
