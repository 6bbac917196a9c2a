"""smddp on a cluster on one machine (smddp.cluster): hosts as network
namespaces with their own hostname and /dev/shm, two NICs each on one bridge,
one torchrun per host, as on separate machines.

One cluster of 3 hosts serves the module; each test starts one torchrun per
host (this file, run as a script, is every rank's program) and reads what
each rank wrote. Cases:

- every native collective, every dtype class and reduce op, odd sizes, on
  2 hosts x 2 ranks and 3 hosts x 2 ranks, against float64 references (the
  cases of test_collectives.py, many in one group);
- each rail on its own NIC: the NICs' byte counters (/sys/class/net inside
  the hosts) show a rail's AllGather on its NIC and nothing on the other, and
  the flat ring's crossings leaving from the sending rank's NIC;
- a NIC taken down during a loop of AllReduce, and a host whose processes
  are all killed: every rank (every survivor) raises DistBackendError within
  the group's timeout plus 5 s, naming the peer and the NIC;
- a path between two hosts that drops what is sent on it when a group is
  created: every rank raises DistBackendError well within the group's
  timeout, naming the rank, the path, and what to check;
- FSDP2 and HSDP (examples/train_fsdp.py) train with gloo's losses (slow);
- ``smddp-bench --cluster`` brings up a shaped cluster of its own, names its
  hosts, NICs, rate and each rank's NIC, puts the links' limit beside each
  backend, records it all, and removes the cluster;
- after ``down``: no namespace, bridge, veth, mount or /dev/shm of the
  cluster is left.

The links are unshaped: these are correctness tests. Skipped, with the
reason, where namespaces cannot be made (CI runs as root and runs them).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAME = "smddpt"
# The group's timeout of the failure cases: every rank must raise within it
# plus 5 s of the failure.
FAIL_TIMEOUT_S = 10
# The timeout of a group whose set-up meets a broken path: its connections'
# patience is half of it.
SETUP_TIMEOUT_S = 20
RAIL_BYTES = 8 << 20
# Sizes of the cases: 0, 1, odd and prime; the large one spans several
# chunks of every schedule.
SIZES = (0, 1, 97, 4099)
LARGE = 300_007

# ---------------------------------------------------------------- the ranks' side


def _counters() -> dict[str, dict[str, int]]:
    """This host's NICs' byte counters, as the host sees them."""
    out = {}
    for name in sorted(os.listdir("/sys/class/net")):
        if not name.startswith("nic"):
            continue
        stats = f"/sys/class/net/{name}/statistics"
        out[name] = {k: int(open(f"{stats}/{k}").read()) for k in ("tx_bytes", "rx_bytes")}
    return out


def _collectives(world: int) -> dict[str, Any]:
    import test_collectives as tc

    few_reduce = ("float32", "bfloat16", "int64", "bool")
    few_move = ("float32", "int8", "bool", "complex64")
    cases = {}
    for api in tc.REDUCE_APIS:
        full = api in ("all_reduce", "reduce_scatter_tensor")
        dtypes = tc.REDUCE_DTYPES if full else few_reduce
        sizes = SIZES if full else (1, 97)
        cases[api] = tc.case_reduce(api, f"cluster-{api}", dtypes=dtypes, sizes=sizes, gloo_sizes=())
    for api in tc.MOVE_APIS:
        full = api == "all_gather_into_tensor"
        dtypes = tc.MOVE_DTYPES if full else few_move
        sizes = SIZES + ((3, 5),) if full else (1, 97, (3, 5))
        cases[api] = tc.case_move(api, f"cluster-{api}", dtypes=dtypes, sizes=sizes, gloo_sizes=())
    for api in ("all_reduce", "reduce_scatter_tensor"):
        cases[f"{api}-large"] = tc.case_reduce(
            api, f"cluster-{api}-large", dtypes=("float32", "bfloat16"), ops=("SUM", "AVG"), sizes=(LARGE,),
            gloo_sizes=(),
        )
    cases["all_gather_into_tensor-large"] = tc.case_move(
        "all_gather_into_tensor", "cluster-ag-large", dtypes=("float32",), sizes=(LARGE,), gloo_sizes=()
    )
    return {"cases": cases, "barrier": tc.case_barrier(0.1)}


def _rails(rank: int, world: int, local_rank: int, local_size: int) -> dict[str, Any]:
    """Each rail's AllGather alone, then the flat ring's, with this host's
    NIC counters around each (from local rank 0)."""
    import torch
    import torch.distributed as dist

    hosts = world // local_size
    rails = [[h * local_size + r for h in range(hosts)] for r in range(local_size)]
    groups = [dist.new_group(r, backend="smddp") for r in rails]
    os.environ["SMDDP_ALGO"] = "ring"
    ring = dist.new_group(list(range(world)), backend="smddp")
    del os.environ["SMDDP_ALGO"]
    phases = {}
    for name, group, members in [(f"rail{r}", groups[r], rails[r]) for r in range(local_size)] + [
        ("ring", ring, list(range(world)))
    ]:
        dist.barrier()
        before = _counters()
        dist.barrier()
        if rank in members:
            x = torch.full((RAIL_BYTES // 4,), float(rank))
            out = torch.empty(len(members) * x.numel())
            dist.all_gather_into_tensor(out, x, group=group)
            want = torch.cat([torch.full_like(x, float(m)) for m in members])
            assert torch.equal(out, want), f"{name}: wrong AllGather output"
        dist.barrier()
        after = _counters()
        phases[name] = {
            nic: {k: after[nic][k] - before[nic][k] for k in after[nic]} for nic in after
        } if local_rank == 0 else None
    return {"phases": phases}


def _failing_loop(out_dir: str, rank: int) -> dict[str, Any]:
    """AllReduce until it fails, on a group of FAIL_TIMEOUT_S (the world's
    allows for slow starts); says when it is under way."""
    import torch
    import torch.distributed as dist

    group = dist.new_group(backend="smddp", timeout=datetime.timedelta(seconds=FAIL_TIMEOUT_S))
    x = torch.ones(1 << 18)
    n = 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            x.fill_(1.0)
            dist.all_reduce(x, group=group)
            n += 1
            if n == 3:
                open(os.path.join(out_dir, f"ready{rank}"), "w").close()
    except Exception as e:  # noqa: BLE001 - what it raised is the result
        return {
            "raised": type(e).__name__, "is_dist": isinstance(e, dist.DistBackendError),
            "message": str(e)[:6000], "time": time.time(), "iterations": n,
        }
    return {"raised": None, "iterations": n}


def _failing_set_up(out_dir: str, rank: int) -> dict[str, Any]:
    """Creates a group of SETUP_TIMEOUT_S once the test says go (it has
    broken a path between the hosts meanwhile); what that raised, and when."""
    import torch.distributed as dist

    open(os.path.join(out_dir, f"ready{rank}"), "w").close()
    go = os.path.join(out_dir, "go")
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        dist.new_group(backend="smddp", timeout=datetime.timedelta(seconds=SETUP_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - what it raised is the result
        return {"raised": type(e).__name__, "is_dist": isinstance(e, dist.DistBackendError),
                "message": str(e)[:6000], "time": time.time()}  # fmt: skip
    return {"raised": None}


def rank_main(mode: str, out_dir: str) -> None:  # pragma: no cover - runs in the cluster
    sys.path.insert(0, HERE)
    import torch
    import torch.distributed as dist

    import smddp  # noqa: F401

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=120))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    result: dict[str, Any] = {
        "rank": rank,
        "local_rank": local_rank,
        "hostname": socket.gethostname(),
        "nic": backend.nic(),
        "describe": backend.describe(),
        "topology": backend.topology(),
    }
    if mode == "collectives":
        result.update(_collectives(world))
        if world // local_size == 2:
            result.update(_rails(rank, world, local_rank, local_size))
    elif mode == "setup":
        result.update(_failing_set_up(out_dir, rank))
    else:
        result.update(_failing_loop(out_dir, rank))
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    if mode in ("fail", "setup"):
        os._exit(0)  # the group is broken: nothing to tear down
    dist.destroy_process_group()


if __name__ == "__main__":
    rank_main(sys.argv[1], sys.argv[2])
    sys.exit(0)

# ---------------------------------------------------------------- the test side

from smddp.cluster import Cluster, ClusterError, ClusterRun, unavailable_reason  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    c = Cluster(hosts=3, nics=2, rate=None, name=NAME)
    c.up()
    yield c
    c.down()


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": ROOT + (os.pathsep + path if path else ""), "SMDDP_LOG_LEVEL": "warn"}


def _read(out_dir: str) -> dict[int, dict]:
    ranks = {}
    for name in os.listdir(out_dir):
        m = re.fullmatch(r"rank(\d+)\.json", name)
        if m:
            with open(os.path.join(out_dir, name)) as f:
                ranks[int(m.group(1))] = json.load(f)
    return ranks


def _collective_run(cluster: Cluster, tmp_path_factory, hosts: int) -> dict[int, dict]:
    out = str(tmp_path_factory.mktemp(f"collectives{hosts}"))
    res = cluster.run([__file__, "collectives", out], hosts=hosts, env=_env(), timeout=240)
    ranks = _read(out)
    assert res.returncode == 0 and len(ranks) == 2 * hosts, (
        f"exit status {res.host_codes}, results of ranks {sorted(ranks)}\n{res.text()[-6000:]}"
    )
    return ranks


@pytest.fixture(scope="module")
def two_hosts(cluster, tmp_path_factory) -> dict[int, dict]:
    return _collective_run(cluster, tmp_path_factory, 2)


def _check_cases(ranks: dict[int, dict]) -> None:
    import test_collectives as tc

    world = len(ranks)
    for api in ranks[0]["cases"]:
        tc.check_results([ranks[r]["cases"][api] for r in range(world)])
    last_in = max(ranks[r]["barrier"]["entered"] for r in range(world))
    for r in range(world):
        assert ranks[r]["barrier"]["left"] >= last_in - 0.002, f"rank {r} left the barrier before all entered"


@pytest.mark.timeout(300, func_only=True)
def test_collectives_on_two_hosts(cluster, two_hosts) -> None:
    assert two_hosts[0]["describe"].startswith("hierarchical"), two_hosts[0]["describe"]
    _check_cases(two_hosts)


@pytest.mark.timeout(60, func_only=True)
def test_each_rank_on_its_host_and_nic(cluster, two_hosts) -> None:
    for r, got in two_hosts.items():
        h, local = divmod(r, 2)
        assert got["hostname"] == cluster.hostname(h), got["hostname"]
        assert got["topology"]["nodes"] == 2 and got["topology"]["node"] == h, got["topology"]
        # Local rank l of 2 with 2 NICs: nic l.
        assert got["nic"] == {"name": f"nic{local}", "address": cluster.address(h, local)}, got["nic"]


@pytest.mark.timeout(60, func_only=True)
def test_rails_on_their_own_nics(cluster, two_hosts) -> None:
    for h in range(2):
        phases = two_hosts[2 * h]["phases"]
        for rail in range(2):
            moved = phases[f"rail{rail}"]
            mine, other = moved[f"nic{rail}"], moved[f"nic{1 - rail}"]
            # A rail's AllGather between 2 hosts: each sends its block once.
            assert mine["tx_bytes"] >= RAIL_BYTES and mine["rx_bytes"] >= RAIL_BYTES, (h, rail, moved)
            assert other["tx_bytes"] < RAIL_BYTES // 16 and other["rx_bytes"] < RAIL_BYTES // 16, (h, rail, moved)


@pytest.mark.timeout(60, func_only=True)
def test_ring_crossings_leave_from_the_senders_nic(cluster, two_hosts) -> None:
    # Ranks 0 1 | 2 3: the crossings 1->2 and 3->0 each carry 3 blocks, sent
    # by local rank 1 (nic1) and received on local rank 0's NIC (nic0).
    for h in range(2):
        moved = two_hosts[2 * h]["phases"]["ring"]
        assert moved["nic1"]["tx_bytes"] >= 3 * RAIL_BYTES, (h, moved)
        assert moved["nic0"]["rx_bytes"] >= 3 * RAIL_BYTES, (h, moved)
        assert moved["nic0"]["tx_bytes"] < RAIL_BYTES // 16, (h, moved)
        assert moved["nic1"]["rx_bytes"] < RAIL_BYTES // 16, (h, moved)


@pytest.mark.timeout(300, func_only=True)
def test_collectives_on_three_hosts(cluster, tmp_path_factory) -> None:
    ranks = _collective_run(cluster, tmp_path_factory, 3)
    assert ranks[0]["describe"].startswith("hierarchical"), ranks[0]["describe"]
    _check_cases(ranks)


def _start_failing(cluster: Cluster, out: str, hosts: int, mode: str = "fail") -> ClusterRun:
    run = cluster.start([__file__, mode, out], hosts=hosts, env=_env())
    deadline = time.monotonic() + 150
    while not all(os.path.exists(os.path.join(out, f"ready{r}")) for r in range(2 * hosts)):
        if run.done() or time.monotonic() > deadline:
            res = run.stop()
            pytest.fail(f"the ranks did not get going: exit status {res.host_codes}\n{res.text()[-6000:]}")
        time.sleep(0.1)
    return run


def _await_failures(run: ClusterRun, out: str, ranks: list[int], since: float) -> dict[int, dict]:
    deadline = time.monotonic() + FAIL_TIMEOUT_S + 15
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(out, f"rank{r}.json")) for r in ranks):
        time.sleep(0.1)
    # The launchers of the broken job wait for one another: stop them.
    res = run.stop()
    got = _read(out)
    missing = [r for r in ranks if r not in got]
    assert not missing, f"ranks {missing} never raised\n{res.text()[-6000:]}"
    for r in ranks:
        g = got[r]
        assert g["raised"] is not None and g["is_dist"], f"rank {r}: {g}"
        took = g["time"] - since
        assert took <= FAIL_TIMEOUT_S + 5, f"rank {r} raised {took:.1f} s after the failure: {g['message'][:800]}"
    return got


@pytest.mark.timeout(240, func_only=True)
def test_nic_down_fails_every_rank_naming_the_peer_and_nic(cluster, tmp_path) -> None:
    out = str(tmp_path)
    run = _start_failing(cluster, out, 2)
    cut = time.time()
    cluster.set_nic(1, 0, up=False)  # rank 2's NIC, the rail of local rank 0
    try:
        got = _await_failures(run, out, [0, 1, 2, 3], cut)
    finally:
        cluster.set_nic(1, 0, up=True)
    for r, g in got.items():
        msg = g["message"]
        # The connection that broke: a peer (rank, address) and a NIC.
        assert re.search(r"rank \d \(other node, 198\.18\.0\.\d+:\d+\) from nic0 \(198\.18\.0\.\d+\)", msg), (
            f"rank {r} does not name the peer and the NIC: {msg[:1500]}"
        )
    assert "interface nic0 is down" in got[2]["message"], got[2]["message"][:1500]


@pytest.mark.timeout(240, func_only=True)
def test_dead_host_fails_every_survivor(cluster, tmp_path) -> None:
    out = str(tmp_path)
    run = _start_failing(cluster, out, 3)
    killed = time.time()
    cluster.kill_host(1)
    got = _await_failures(run, out, [0, 1, 4, 5], killed)
    for r, g in got.items():
        assert re.search(r"rank [23] \(other node, 198\.18\.\d\.2:\d+\)", g["message"]), (
            f"rank {r} does not name the dead host's rank: {g['message'][:1500]}"
        )


@pytest.mark.timeout(240, func_only=True)
def test_a_path_that_does_not_answer_fails_every_rank_at_set_up(cluster, tmp_path) -> None:
    """A firewall that silently drops one rail's traffic between two hosts
    (host 1 discards what it sends to host 0's second NIC): creating a group
    fails on every rank within the connections' patience (half the group's
    timeout) and a few seconds, naming the rank, the address, the NIC, that
    nothing answered and what to check; neither at the group's timeout nor
    after the kernel's SYN retries (minutes)."""
    out = str(tmp_path)
    run = _start_failing(cluster, out, 2, mode="setup")
    try:
        # The command a user would type (smddp-cluster path 1 0 1 drop).
        subprocess.run([sys.executable, "-m", "smddp.cluster", "--name", NAME, "path", "1", "0", "1", "drop"],
                       check=True, env={**os.environ, **_env()})  # fmt: skip
        go = time.time()
        open(os.path.join(out, "go"), "w").close()
        deadline = time.monotonic() + SETUP_TIMEOUT_S + 20
        while time.monotonic() < deadline and not all(os.path.exists(os.path.join(out, f"rank{r}.json")) for r in range(4)):
            time.sleep(0.1)
    finally:
        cluster.set_path(1, 0, nic=1, open=True)
        res = run.stop()
    got = _read(out)
    assert sorted(got) == [0, 1, 2, 3], f"ranks {sorted(got)} reported\n{res.text()[-6000:]}"
    for r, g in sorted(got.items()):
        assert g["raised"] == "DistBackendError", f"rank {r}: {g}"
        took = g["time"] - go
        assert took < SETUP_TIMEOUT_S - 4, f"rank {r} raised {took:.1f} s after go: {g['message'][:1500]}"
        msg = g["message"]
        # Rank 1 (host 0's second NIC) could not reach rank 3 (host 1's).
        assert re.search(r"connecting to rank 3 at 198\.18\.1\.2:\d+ from nic1 \(198\.18\.1\.1\)", msg), (
            f"rank {r} does not name the path: {msg[:1500]}"
        )
        assert "nothing answered" in msg and "firewall" in msg, f"rank {r}: {msg[:1500]}"
        if r != 1:
            assert "rank 1 could not" in msg, f"rank {r} does not name rank 1: {msg[:1500]}"


TRAIN = os.path.join(ROOT, "examples", "train_fsdp.py")
TRAIN_FLAGS = ["--steps", "4", "--layers", "2", "--width", "64", "--seq-len", "32", "--batch", "4"]


@pytest.mark.slow
@pytest.mark.timeout(300, func_only=True)
@pytest.mark.parametrize("strategy", ["hsdp", "fsdp2"])
def test_fsdp2_trains_as_with_gloo(cluster, strategy: str) -> None:
    """examples/train_fsdp.py on 2 hosts x 2 ranks (hsdp: shard inside a
    host, replicate across): the same losses as gloo's, step by step."""
    backends = ("smddp", "gloo")
    runs = {
        b: cluster.start([TRAIN, "--backend", b, "--strategy", strategy, *TRAIN_FLAGS], hosts=2, env=_env(),
                         master_port=29500 + i)
        for i, b in enumerate(backends)
    }
    losses = {}
    for b, run in runs.items():
        res = run.wait(timeout=240)
        losses[b] = re.findall(r"step +\d+ \| loss ([0-9.]+)", res.text(0))
        assert res.returncode == 0 and len(losses[b]) == 4, f"{b}: exit status {res.host_codes}\n{res.text()[-4000:]}"
    assert losses["smddp"] == losses["gloo"], losses


@pytest.mark.timeout(300, func_only=True)
def test_the_benchmark_on_a_cluster_of_its_own(tmp_path) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    from smddp.bench import record

    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "smddp.bench", "--cluster", "2x1", "--nics", "1", "--rate", "1gbit",
           "--cluster-name", "smddpb", "--backends", "smddp,gloo", "--op", "all_gather", "--sizes", "1M",
           "-n", "3", "-w", "1", "--rounds", "2", "--json", str(out), "--plot", ""]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, **_env()}, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    text = p.stdout
    assert "2 hosts x 1 ranks, 1 NICs per host at 1gbit (125 MB/s) per direction" in text, text
    assert "h1 (hostname smddpb-h1): nic0 198.18.0.2" in text, text
    assert "each rank's NIC: rank 0 h0 nic0 (198.18.0.1), rank 1 h1 nic0 (198.18.0.2)" in text, text
    # AllGather of 1M between 2 hosts: each receives 512K through one NIC.
    limit_us = (1 << 19) / 125e6 * 1e6
    (row,) = [ln for ln in text.splitlines() if ln.startswith(" ") and f"{limit_us:.1f}" in ln]
    assert len(re.findall(r" \d+% ", row)) == 2, row
    rec = record.read(str(out))
    topo = rec["topology"]
    assert topo["launcher"] == "smddp-cluster" and topo["hosts"] == 2 and topo["nodes"] == 2, topo
    assert topo["rank_hosts"] == ["smddpb-h0", "smddpb-h1"], topo
    facts = topo["facts"]
    assert (facts["hosts"], facts["nics"], facts["rate_bytes_per_s"]) == (2, 1, 125_000_000), facts
    assert facts["tcp"] and f"TCP {facts['tcp']}" in text, facts  # the hosts' congestion control, named
    assert [n["nic"] for n in facts["rank_nics"]] == ["nic0", "nic0"], facts
    (limit,) = facts["limits"]
    assert abs(limit["limit_us"] - limit_us) < 0.1 and limit["fraction"]["smddp"] > 0, limit
    assert rec["summary"]["wrong"] == 0
    # It brought the cluster up, so it took it down.
    assert Cluster(hosts=1, nics=1, name="smddpb").leftovers() == []


@pytest.mark.timeout(60, func_only=True)
def test_hosts_run_the_stock_tcp_whatever_the_machines_default(cluster) -> None:
    with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
        allowed = f.read().split()
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        machine = f.read().strip()
    # A namespace may only choose among the allowed ones; else it keeps the machine's.
    want = "cubic" if "cubic" in allowed else machine
    for h in range(cluster.hosts):
        assert cluster.exec(h, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"]).stdout.strip() == want
    assert cluster.tcp == want and f"TCP {want}," in cluster.describe()
    assert Cluster.load(NAME).tcp == want
    with pytest.raises(ClusterError, match=r"--tcp-congestion nosuch: this kernel has .*reno"):
        Cluster(hosts=1, nics=1, name="smddpc", tcp_congestion="nosuch")


@pytest.mark.timeout(60, func_only=True)
def test_down_leaves_nothing(cluster, two_hosts) -> None:
    # Each host's /dev/shm is its own (a tmpfs that ends with the host).
    marker = "/dev/shm/smddp-cluster-marker"
    for h in range(cluster.hosts):
        cluster.exec(h, ["sh", "-c", f"echo {h} > {marker}"])
        assert cluster.exec(h, ["cat", marker]).stdout.strip() == str(h)
    assert not os.path.exists(marker), "a host's /dev/shm is the machine's"
    cluster.down()
    assert cluster.leftovers() == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [line for line in namespaces.splitlines() if line.startswith(f"{NAME}-")], namespaces
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    ours = [line for line in links.splitlines() if re.search(r": (h\d+n\d+|nic\d+)[@:]", line)]
    assert not ours, ours
    assert not os.path.exists(marker)
    # No process is left in the hosts' namespaces, and no bind mount holds
    # them: their /dev/shm went with them.
    mounts = open("/proc/self/mountinfo").read()
    assert cluster.state_dir not in mounts
    assert not os.path.exists(cluster.state_dir)
