"""How users reach smddp: registration (with and without ``import smddp``),
every init method, the knob table, what a group reports about itself, the
shared memory it leaves behind (none), and the example launched by torchrun.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV_BIN = os.path.dirname(sys.executable)
SHM_DIR = "/dev/shm"
# smddp-<uid>-<creator pid>-<creator start time>-<token>
SEGMENT = re.compile(r"^smddp-(\d+)-(\d+)-(\d+)-(\S+)$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env() -> dict[str, str]:
    """The environment without SMDDP_* settings or torchrun's variables."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDDP_") and k not in drop}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _segments(pids: set[int] | None = None) -> list[str]:
    """This user's smddp entries in /dev/shm, of creators in ``pids`` if given."""
    out = []
    for name in os.listdir(SHM_DIR):
        m = SEGMENT.match(name)
        if m and int(m.group(1)) == os.getuid() and (pids is None or int(m.group(2)) in pids):
            out.append(name)
    return out


# ---------------------------------------------------------------- the knob table


@pytest.mark.timeout(30, func_only=True)
def test_the_configuration_doc_is_the_code_s_table() -> None:
    """docs/configuration.md's knob table is generated from the native table:
    a knob added, changed or documented by hand fails here."""
    import smddp

    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        doc = f.read()
    begin = "<!-- knobs:begin (generated: python -m smddp.config) -->\n"
    assert begin in doc and "<!-- knobs:end -->" in doc, "the generated block's markers are missing"
    table = doc.split(begin, 1)[1].split("<!-- knobs:end -->", 1)[0]
    assert table.strip() == smddp.config.markdown_table().strip(), (
        "docs/configuration.md is stale: regenerate its table with python -m smddp.config"
    )
    assert "{" not in smddp.config.markdown_table(), "a knob's help names a constant that was not interpolated"


# ---------------------------------------------------------------- init methods

_INIT_SCRIPT = r"""
import datetime, os, sys
import torch
import torch.distributed as dist
if os.environ.get("IMPORT_SMDDP") == "1":
    import smddp  # noqa: F401

torch.set_num_threads(1)
rank, world = int(sys.argv[1]), int(sys.argv[2])
for method in sys.argv[3:]:
    kwargs = {"rank": rank, "world_size": world} if not method.startswith("env") else {}
    if method.startswith("env"):
        # env://MASTER_PORT: take the port from the argument, the rest from RANK etc.
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=method.split("//")[1],
                          RANK=str(rank), WORLD_SIZE=str(world))
        method = "env://"
    dist.init_process_group("smddp", init_method=method, timeout=datetime.timedelta(seconds=60), **kwargs)
    assert dist.get_backend() == "smddp", dist.get_backend()
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert type(be).__name__ == "ProcessGroupSMDDP", type(be)
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t)
    want = [world * i + world * (world - 1) / 2 for i in range(4)]
    assert t.tolist() == want, (method, t.tolist(), want)
    out = torch.empty(2 * world, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.full((2,), rank, dtype=torch.int64))
    assert out.tolist() == [r for r in range(world) for _ in range(2)], (method, out.tolist())
    o = torch.empty(3)
    dist.reduce_scatter_tensor(o, torch.ones(3 * world) * (rank + 1), op=dist.ReduceOp.AVG)
    assert o.tolist() == [(world + 1) / 2] * 3, (method, o.tolist())
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=world - 1)
    assert b.tolist() == [float(world - 1)] * 5, (method, b.tolist())
    dist.barrier()
    dist.destroy_process_group()
    print(f"OK {method} rank {rank}", flush=True)
print("IMPORTED" if "smddp" in sys.modules else "NOT-IMPORTED", flush=True)
"""


def _run_ranks(world: int, methods: list[str], import_smddp: bool, timeout: float) -> list[str]:
    env = _clean_env()
    env["IMPORT_SMDDP"] = "1" if import_smddp else "0"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _INIT_SCRIPT, str(rank), str(world), *methods],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for rank, p in enumerate(procs):
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.mark.timeout(120, func_only=True)
def test_every_init_method(tmp_path) -> None:
    """env://, tcp:// and file:// in one pair of processes, one after the other."""
    methods = [f"env://{_free_port()}", f"tcp://127.0.0.1:{_free_port()}", f"file://{tmp_path / 'init'}"]
    outs = _run_ranks(2, methods, import_smddp=True, timeout=100)
    for rank, out in enumerate(outs):
        for method in ("env://", "tcp://", "file://"):
            assert f"OK {method}" in out, f"rank {rank}: {method} did not finish:\n{out}"


@pytest.mark.timeout(90, func_only=True)
def test_world_size_one_without_import(tmp_path) -> None:
    """torch >= 2.14 finds backend="smddp" through the torch.distributed.backends
    entry point; at world size 1 with every init method."""
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="torch.distributed.backends") if e.name == "smddp"]
    assert [e.value for e in eps] == ["smddp:register"], f"entry points named smddp: {eps}"
    methods = [f"env://{_free_port()}", f"tcp://127.0.0.1:{_free_port()}", f"file://{tmp_path / 'init1'}"]
    (out,) = _run_ranks(1, methods, import_smddp=False, timeout=80)
    for method in ("env://", "tcp://", "file://"):
        assert f"OK {method}" in out, f"{method} did not finish:\n{out}"
    # The script never imported smddp itself: torch did, through the entry point.
    assert "IMPORTED" in out and "NOT-IMPORTED" not in out, out


@pytest.mark.timeout(30, func_only=True)
def test_registered_for_cpu_and_cuda() -> None:
    import smddp

    assert smddp.is_registered()
    smddp.register()  # idempotent
    assert dist.is_backend_available("smddp")
    assert dist.Backend("smddp") == "smddp"
    assert set(dist.Backend.backend_capability["smddp"]) == {"cpu", "cuda"}, dist.Backend.backend_capability["smddp"]


# ---------------------------------------------------------------- what a group says


def case_describe() -> dict:
    torch.set_num_threads(1)
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    fb = be.fallback("cpu")
    return {
        "get_backend": dist.get_backend(),
        "class": type(be).__name__,
        "name": be.name(),
        "describe": be.describe(),
        "topology": be.topology(),
        "fallback": type(fb).__name__ if fb is not None else None,
    }


def _expected_topology(rank: int, world: int, per_node: int) -> dict:
    nodes = [list(range(n, min(n + per_node, world))) for n in range(0, world, per_node)]
    node = rank // per_node
    return {
        "nodes": len(nodes),
        "node": node,
        "local_rank": rank % per_node,
        "local_size": len(nodes[node]),
        "uniform": len({len(n) for n in nodes}) == 1,
        "node_ranks": nodes,
    }


@pytest.mark.timeout(90, func_only=True)
@pytest.mark.parametrize(
    "world, env",
    [(4, {}), (4, {"SMDDP_RANKS_PER_NODE": "2"}), (3, {"SMDDP_RANKS_PER_NODE": "2"})],
    ids=["w4", "w4-2-per-node", "w3-2-per-node"],
)
def test_describe_and_topology(pools, world: int, env: dict) -> None:
    results = pools(world, **env).run(case_describe, timeout=60)
    per_node = int(env.get("SMDDP_RANKS_PER_NODE", world))
    nodes = -(-world // per_node)
    for rank, r in enumerate(results):
        assert r["get_backend"] == "smddp" and r["class"] == "ProcessGroupSMDDP" and r["name"] == "smddp", r
        assert r["topology"] == _expected_topology(rank, world, per_node), f"rank {rank}: {r['topology']}"
        d = r["describe"]
        assert re.search(rf"\b{nodes} nodes?\b", d), f"rank {rank}: describe() does not say {nodes} node(s): {d!r}"
        if nodes == 1:
            assert f"{world} ranks" in d and d.startswith("shm"), f"rank {rank}: {d!r}"
        assert r["fallback"] == "ProcessGroupGloo", f"rank {rank}: CPU fallback is {r['fallback']}"
    assert len({r["describe"] for r in results}) == 1, [r["describe"] for r in results]


_APART_SCRIPT = r"""
import datetime, sys
import torch
import torch.distributed as dist
import smddp  # noqa: F401

torch.set_num_threads(1)
rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("smddp", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
be = dist.group.WORLD._get_backend(torch.device("cpu"))
t = torch.arange(1 << 16, dtype=torch.float32) + rank
dist.all_reduce(t)
assert t[:3].tolist() == [1.0, 3.0, 5.0], t[:3]
out = torch.empty(2, dtype=torch.int64)
dist.all_gather_into_tensor(out, torch.tensor([rank]))
assert out.tolist() == [0, 1], out
dist.barrier()
print("DESCRIBE", be.describe(), "NODES", be.topology()["nodes"], flush=True)
dist.destroy_process_group()
"""

_APART = {
    # A container of its own /dev/shm (Docker without --ipc=host).
    "own-dev-shm": ["unshare", "--mount", "sh", "-c",
                    'mount -t tmpfs -o size=64m,mode=1777 smddp-apart /dev/shm && exec "$0" "$@"'],
    # A container of its own pid namespace (Docker without --pid=host): the
    # pids a rank publishes mean nothing to the other.
    "own-pids": ["unshare", "--pid", "--fork", "--mount-proc"],
}


@pytest.mark.timeout(150, func_only=True)
@pytest.mark.parametrize("apart", sorted(_APART))
def test_ranks_of_one_host_that_cannot_share_memory_are_two_nodes(tmp_path, apart: str) -> None:
    """Containers on one host with host networking share its name, but not
    always its /dev/shm or its pids: ranks that cannot share a node arena
    are two nodes, joined by TCP, and their collectives work."""
    if subprocess.run([*_APART[apart], "true"], capture_output=True).returncode != 0:
        pytest.skip(f"needs {_APART[apart][:2]} (root) to put a rank apart")
    init = f"file://{tmp_path / 'init'}"
    procs = [
        subprocess.Popen(
            [*prefix, sys.executable, "-c", _APART_SCRIPT, str(rank), init],
            env=_clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank, prefix in enumerate([[], _APART[apart]])
    ]
    try:
        for rank, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
            assert "NODES 2" in out, f"rank {rank}: {out}"
            # The machine's first rank says why, once, and what to change.
            said = err.count("cannot share memory")
            assert said == (1 if rank == 0 else 0) and ("--ipc=host --pid=host" in err or rank), f"rank {rank}: {err}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def case_fallback_connections() -> dict:
    """Sockets a new group opens: smddp's own (none inside one node) and its
    gloo fallback's, before and after the fallback first serves a call."""
    torch.set_num_threads(1)
    world = dist.get_world_size()
    out = {}
    before = _sockets()
    g = dist.new_group(backend="smddp")
    out["created"] = _sockets() - before
    # No peer connects (its first fallback call) before every rank counted.
    dist.barrier()
    got = torch.empty(world)
    dist.all_to_all_single(got, torch.full((world,), float(dist.get_rank())), group=g)  # the fallback's
    out["all_to_all"] = got.tolist()
    out["after_use"] = _sockets() - before
    # A user's own gloo group still connects every pair when created.
    before = _sockets()
    mine = dist.new_group(backend="gloo")
    out["own_gloo"] = _sockets() - before
    out["lazy_left_set"] = os.environ.get("TORCH_GLOO_LAZY_INIT")
    dist.destroy_process_group(mine)
    dist.destroy_process_group(g)
    return out


@pytest.mark.timeout(90, func_only=True)
def test_the_fallback_connects_a_pair_of_ranks_when_it_first_serves_it(pools) -> None:
    """gloo connects every pair of a group when it is created: at a thousand
    ranks that is a thousand sockets and store round trips per rank and
    group, past the usual limit of open files, for a fallback that may never
    serve a call. smddp's fallback connects a pair on its first message."""
    world = 6
    results = pools(world).run(case_fallback_connections, timeout=60)
    for rank, r in enumerate(results):
        assert r["all_to_all"] == [float(p) for p in range(world)], r
        # A listening socket, not a connection to each of the 5 peers.
        assert r["created"] <= 1, f"rank {rank}: {r}"
        assert r["after_use"] > r["created"], f"rank {rank}: {r}"
        # A user's own gloo group still connects pairs when it is created
        # (how many of its peers' connections are counted yet varies).
        assert r["own_gloo"] > r["created"], f"rank {rank}: {r}"
        assert r["lazy_left_set"] is None, f"rank {rank}: {r}"


def _tcp_ports() -> list[tuple[int, int]]:
    """(local port, remote port) of each established TCP connection this
    process holds."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    out = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "01" and cols[9] in inodes:  # ESTABLISHED, ours
                    out.append((int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)))
    return out


def case_socket_ports(low: int, high: int) -> dict:
    """A group of 2 emulated nodes x 2 whose sockets listen on [low, high]:
    its collectives, and the ports of the connections it made."""
    torch.set_num_threads(1)
    before = set(_tcp_ports())
    os.environ.update({"SMDDP_SOCKET_PORTS": f"{low}-{high}", "SMDDP_RANKS_PER_NODE": "2"})
    try:
        g = dist.new_group(backend="smddp")
    finally:
        for k in ("SMDDP_SOCKET_PORTS", "SMDDP_RANKS_PER_NODE"):
            del os.environ[k]
    made = [p for p in _tcp_ports() if p not in before]
    x = torch.full((1000,), float(dist.get_rank()))
    dist.all_reduce(x, group=g)
    out = {"sum": x[0].item(), "made": made, "topology": g._get_backend(torch.device("cpu")).topology()["nodes"]}
    dist.destroy_process_group(g)
    return out


@pytest.mark.timeout(90, func_only=True)
def test_sockets_listen_on_the_ports_a_firewall_admits(pools) -> None:
    """SMDDP_SOCKET_PORTS: every connection between the emulated nodes is
    made to a port of the range (the connecting end's port is the kernel's
    choice), and the group works."""
    low = 20000 + os.getpid() % 20000  # another test run's range is likely elsewhere
    results = pools(4).run(case_socket_ports, low, low + 15, timeout=60)
    for rank, r in enumerate(results):
        assert r["sum"] == 6.0 and r["topology"] == 2, r
        # The rail peer on the other node: its streams, each with one end
        # in the range.
        assert r["made"], f"rank {rank} made no connection: {r}"
        for local, remote in r["made"]:
            assert low <= local <= low + 15 or low <= remote <= low + 15, f"rank {rank}: {r}"


def case_subgroup_topology(members: list[int]) -> dict | None:
    torch.set_num_threads(1)
    g = dist.new_group(ranks=members, backend="smddp")
    if dist.get_rank() not in members:
        return None
    be = g._get_backend(torch.device("cpu"))
    out = {"topology": be.topology(), "describe": be.describe(), "rank": dist.get_rank(g)}
    dist.destroy_process_group(g)
    return out


@pytest.mark.timeout(60, func_only=True)
def test_subgroup_topology(pools) -> None:
    results = pools(4).run(case_subgroup_topology, [3, 1], timeout=40)
    assert results[0] is None and results[2] is None
    for rank in (1, 3):
        r = results[rank]
        want = _expected_topology(r["rank"], 2, 2)
        assert r["topology"] == want, f"rank {rank}: {r['topology']}"
        assert "2 ranks" in r["describe"], r["describe"]


def _new_group_with_factory(members: list[int], factory) -> tuple[Any, BaseException | None]:
    """new_group(members) with `factory` making the fallbacks, and with
    torch's own barrier after group creation off (it would hide ours)."""
    from smddp import _C, _registry

    torch.set_num_threads(1)
    saved = os.environ.pop("TORCH_DIST_INIT_BARRIER", None)
    _C.set_fallback_factory(factory)
    try:
        return dist.new_group(ranks=members, backend="smddp"), None
    except Exception as e:  # noqa: BLE001 - returned to the test
        return None, e
    finally:
        _C.set_fallback_factory(_registry._make_fallbacks)
        if saved is not None:
            os.environ["TORCH_DIST_INIT_BARRIER"] = saved


def case_member_returns_after_every_fallback(members: list[int], slow: int) -> dict | None:
    """Rank `slow` finishes creating its fallback group a second late; when
    did that happen, and when did each member's new_group return?"""
    from smddp import _registry

    done: list[float] = []

    def factory(*args):
        out = _registry._make_fallbacks(*args)
        if dist.get_rank() == slow:
            time.sleep(1.0)
        done.append(time.time())
        return out

    g, error = _new_group_with_factory(members, factory)
    returned = time.time()
    if error is not None:
        raise error
    if dist.get_rank() not in members:
        return None
    dist.destroy_process_group(g)  # at once: what a peer still connecting must survive
    return {"fallback_done": done[-1], "returned": returned}


def case_fallback_fails_on_one_rank(members: list[int], failing: int) -> dict | None:
    """Rank `failing` connects its gloo fallback, then fails (as a missing
    nccl would); what does every member's new_group raise, how fast?"""
    from smddp import _registry

    def factory(*args):
        out = _registry._make_fallbacks(*args)
        if dist.get_rank() == failing:
            raise RuntimeError("no fallback for this rank")
        return out

    start = time.monotonic()
    g, error = _new_group_with_factory(members, factory)
    if dist.get_rank() not in members:
        return None
    assert g is None, f"rank {dist.get_rank()}: new_group succeeded"
    return {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


@pytest.mark.timeout(60, func_only=True)
def test_no_member_returns_before_every_fallback_is_connected(pools) -> None:
    # A member that returned early could destroy the group while a peer's
    # gloo fallback still completed its connection to it.
    results = pools(4).run(case_member_returns_after_every_fallback, [3, 1], 1, timeout=40)
    slow_done = results[1]["fallback_done"]
    for rank in (1, 3):
        assert results[rank]["returned"] >= slow_done, (
            f"rank {rank} returned from new_group {slow_done - results[rank]['returned']:.3f} s "
            "before rank 1 had its fallback group"
        )


@pytest.mark.timeout(60, func_only=True)
def test_a_failed_fallback_fails_every_member_at_once(pools) -> None:
    # The pool's groups time out after 60 s: failing within 20 s means the
    # other member learnt of the failure instead of waiting for rank 1.
    results = pools(4).run(case_fallback_fails_on_one_rank, [3, 1], 1, timeout=40)
    assert "no fallback for this rank" in results[1]["message"], results[1]
    other = results[3]
    assert other["type"] == "DistBackendError", other
    # new_group([3, 1]) orders its ranks: global rank 1 is its rank 0.
    for part in ("rank 0 (global rank 1) could not create the fallback group (SMDDP_FALLBACK=auto): ",
                 "no fallback for this rank", "SMDDP_FALLBACK=none", "rank 1 (global rank 3) of 2"):
        assert part in other["message"], f"{part!r} not in: {other['message']}"
    assert other["seconds"] < 20, other


# ---------------------------------------------------------------- /dev/shm


def case_segments_during_life() -> dict:
    """This rank's pid, and the smddp entries of it in /dev/shm before and
    after a fresh group is created, used and destroyed."""
    torch.set_num_threads(1)
    me = {os.getpid()}
    g = dist.new_group(backend="smddp")
    t = torch.ones(1 << 18)
    dist.all_reduce(t, group=g)  # staged and single-copy paths both set up by now
    dist.all_reduce(torch.ones(7), group=g)
    during = _segments(me)
    dist.destroy_process_group(g)
    return {"pid": os.getpid(), "during": during, "after_destroy": _segments(me)}


@pytest.mark.timeout(90, func_only=True)
def test_nothing_left_in_dev_shm(pools) -> None:
    # The ranks must exit to show that exiting leaves nothing: this test ends
    # the pool (a later test gets a new one).
    pool = pools(3)
    try:
        results = pool.run(case_segments_during_life, timeout=60)
    finally:
        pool.close()
    pids = {r["pid"] for r in results}
    for rank, r in enumerate(results):
        assert not r["after_destroy"], f"rank {rank}: left after destroy_process_group: {r['after_destroy']}"
    deadline = time.monotonic() + 10
    while _segments(pids) and time.monotonic() < deadline:
        time.sleep(0.1)  # the ranks have exited; give the kernel a moment
    assert not _segments(pids), f"left in {SHM_DIR} after the ranks exited: {_segments(pids)}"


def case_new_group() -> None:
    torch.set_num_threads(1)
    g = dist.new_group(backend="smddp")
    dist.all_reduce(torch.ones(3), group=g)
    dist.destroy_process_group(g)


@pytest.mark.timeout(90, func_only=True)
def test_stale_segments_are_swept(pools) -> None:
    """A new group removes entries whose creator is gone, and only those;
    an entry made in another pid namespace (a container that shares
    /dev/shm but not pids) is not judged by this one's pids, and stays."""
    uid = os.getuid()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    with open(f"/proc/{os.getpid()}/stat") as f:
        my_start = int(f.read().rsplit(")", 1)[1].split()[19])
    ns = os.stat("/proc/self/ns/pid").st_ino
    token = os.urandom(16).hex()
    stale = f"smddp-{uid}-{dead_pid}-12345-{ns}-{token}"
    reused = f"smddp-{uid}-{os.getpid()}-{my_start + 1}-{ns}-{token}"  # the pid was recycled
    older = f"smddp-{uid}-{dead_pid}-12345-{token}"  # named without its namespace
    alive = f"smddp-{uid}-{os.getpid()}-{my_start}-{ns}-{token}"
    foreign = f"smddp-{uid}-{dead_pid}-12345-{ns + 1}-{token}"
    paths = [os.path.join(SHM_DIR, n) for n in (stale, reused, older, alive, foreign)]
    try:
        for p in paths:
            with open(p, "wb") as f:
                f.write(b"\0" * 4096)
            os.chmod(p, 0o600)
        pools(2).run(case_new_group, timeout=60)
        assert not os.path.exists(paths[0]), "an entry of a process that is gone was not removed"
        assert not os.path.exists(paths[1]), "an entry of a recycled pid (other start time) was not removed"
        assert not os.path.exists(paths[2]), "an entry named without its namespace was not removed"
        assert os.path.exists(paths[3]), "the entry of a live process was removed"
        assert os.path.exists(paths[4]), "the entry of another pid namespace was removed"
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


# ---------------------------------------------------------------- the example


@pytest.mark.slow
@pytest.mark.timeout(300, func_only=True)
def test_example_under_torchrun() -> None:
    torchrun = os.path.join(VENV_BIN, "torchrun")
    cmd = [
        torchrun,
        "--nproc-per-node",
        "4",
        "--master-port",
        str(_free_port()),
        os.path.join(ROOT, "examples", "check_collectives.py"),
        "--quick",
    ]
    proc = subprocess.run(cmd, env=_clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "all collectives match the reference" in proc.stdout, proc.stdout
    for op in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast (every root)", "barrier"):
        assert re.search(rf"^{re.escape(op)}\s+[1-9]\d* cases\s+0 wrong.*ok$", proc.stdout, flags=re.M), (
            f"no ok line for {op}:\n{proc.stdout}"
        )
