"""Probes of the GPU check (tools/gpu_check.py), each run as its own process:

    python3 tools/gpu_probes.py env    --json FILE   facts about the machine
    python3 tools/gpu_probes.py ipc    --json FILE   CUDA IPC with torch alone
    python3 tools/gpu_probes.py import --json FILE   smddp and its CUDA module
    python3 tools/gpu_probes.py memops --json FILE   two processes meeting through
                                                     stream memory operations
                                                     (also run by the ipc step)

Each writes a JSON object to FILE: {"status": "ok"|"FAIL"|"skipped",
"reason": one line, "details": {...}}. The file is rewritten as the probe
goes, so a probe killed half-way still leaves what it learned. Nothing here
changes a setting of the machine: every command only reads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Report:
    """The probe's JSON file, rewritten at every change."""

    def __init__(self, path: str):
        self.path = path
        self.data = {"status": "FAIL", "reason": "the probe did not finish", "details": {}}
        self.save()

    @property
    def details(self) -> dict:
        return self.data["details"]

    def set(self, key: str, value) -> None:
        self.details[key] = value
        self.save()

    def finish(self, status: str, reason: str) -> None:
        self.data["status"] = status
        self.data["reason"] = reason
        self.save()

    def save(self) -> None:
        tmp = self.path + ".part"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


def _say(text: str) -> None:
    print(text, flush=True)


def _command(argv: list[str], timeout: float = 20.0) -> dict:
    """Runs a read-only command; its output goes to the log and the result."""
    _say(f"$ {' '.join(argv)}")
    if shutil.which(argv[0]) is None:
        _say("  (not found)")
        return {"found": False}
    t = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        _say(f"  (no answer within {timeout:.0f} s)")
        return {"found": True, "timed_out": True}
    except OSError as e:
        _say(f"  ({e})")
        return {"found": True, "error": str(e)}
    out = (p.stdout + p.stderr).rstrip()
    _say(out)
    _say(f"  (exit status {p.returncode}, {time.monotonic() - t:.1f} s)")
    return {"found": True, "rc": p.returncode, "output": out[-20000:]}


def _read(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read(limit).strip()
    except OSError:
        return None


# ---------------------------------------------------------------- env


def _runtime(release: str, dmesg: str, version: str) -> str:
    """gvisor, firecracker or native/unknown, from what the kernel says."""
    text = (dmesg + "\n" + version).lower()
    if "gvisor" in text or release == "4.4.0":
        return "gvisor"
    if "firecracker" in text or "-fc-" in release:
        return "firecracker"
    return "other"


def _meminfo() -> dict:
    out = {}
    text = _read("/proc/meminfo", 1 << 16) or ""
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+) kB", line)
        if m and m.group(1) in ("MemTotal", "MemAvailable", "HugePages_Total", "Shmem"):
            out[m.group(1) + "_bytes"] = int(m.group(2)) * 1024
    return out


def _statvfs(path: str) -> dict | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"size_bytes": st.f_frsize * st.f_blocks, "free_bytes": st.f_frsize * st.f_bavail}


def _torch_facts(rep: Report) -> dict:
    facts: dict = {}
    t = time.monotonic()
    import torch

    facts["import_s"] = round(time.monotonic() - t, 2)
    facts["version"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    facts["git"] = getattr(torch.version, "git_version", None)
    facts["arch_list"] = torch.cuda.get_arch_list() if torch.version.cuda else []
    rep.set("torch", facts)
    t = time.monotonic()
    facts["cuda_available"] = torch.cuda.is_available()
    facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
    rep.set("torch", facts)
    try:
        facts["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as e:  # torch without NCCL, or its library missing
        facts["nccl"] = f"unknown ({type(e).__name__}: {e})"
    try:
        import importlib.metadata as md

        facts["nccl_wheels"] = {
            d.metadata["Name"]: d.version
            for d in md.distributions()
            if (d.metadata["Name"] or "").lower().startswith("nvidia-nccl")
        }
    except Exception:
        pass
    facts["cudnn"] = torch.backends.cudnn.version() if torch.version.cuda else None
    if facts["cuda_available"]:
        devices = []
        for i in range(facts["device_count"]):
            p = torch.cuda.get_device_properties(i)
            d = {
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "total_memory_bytes": p.total_memory,
                "multiprocessors": p.multi_processor_count,
            }
            for attr in ("L2_cache_size", "uuid", "pci_bus_id"):
                if hasattr(p, attr):
                    d[attr] = str(getattr(p, attr))
            devices.append(d)
        facts["devices"] = devices
        x = torch.ones(1, device="cuda")
        torch.cuda.synchronize()
        facts["first_kernel_s"] = round(time.monotonic() - t, 2)
        free, total = torch.cuda.mem_get_info()
        facts["mem_free_bytes"] = free
        facts["driver_api"] = getattr(torch._C, "_cuda_getDriverVersion", lambda: None)()
        del x
    rep.set("torch", facts)
    _say("torch: " + json.dumps(facts, default=str))
    return facts


def probe_env(rep: Report) -> None:
    d = rep.details
    uname = platform.uname()
    d["uname"] = " ".join(uname)
    d["proc_version"] = _read("/proc/version")
    d["python"] = sys.version.split()[0]
    d["python_executable"] = sys.executable
    d["cpu_count"] = os.cpu_count()
    try:
        d["cpu_affinity"] = len(os.sched_getaffinity(0))
    except OSError:
        pass
    d["memory"] = _meminfo()
    d["cgroup_memory_max"] = _read("/sys/fs/cgroup/memory.max")
    d["dev_shm"] = _statvfs("/dev/shm")
    d["tmp"] = _statvfs("/tmp")
    d["uid"] = os.getuid()
    d["ptrace_scope"] = _read("/proc/sys/kernel/yama/ptrace_scope")
    d["env"] = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(("CUDA", "NCCL", "PYTORCH", "SMDDP", "TORCH", "NVIDIA", "LD_LIBRARY"))
    }
    rep.save()
    dmesg = _command(["dmesg"], timeout=10)
    dmesg_text = dmesg.get("output", "") if dmesg.get("rc") == 0 else ""
    lines = dmesg_text.splitlines()
    keep = re.compile(r"gvisor|firecracker|nvidia|nvrm|iommu|hypervisor", re.I)
    d["dmesg"] = lines[:5] + [line for line in lines[5:] if keep.search(line)][:40]
    d["runtime"] = _runtime(uname.release, dmesg_text, d["proc_version"] or "")
    rep.save()
    d["tools"] = {t: shutil.which(t) for t in ("nvidia-smi", "nvcc", "compute-sanitizer", "ncu", "cuobjdump", "ninja")}
    rep.save()
    smi = _command(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,memory.used,driver_version,compute_mode,mig.mode.current,"
            "persistence_mode,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,"
            "temperature.gpu,pcie.link.gen.current,pcie.link.width.current",
            "--format=csv",
        ]
    )
    if smi.get("rc") == 0:
        lines = smi["output"].splitlines()
        if len(lines) >= 2:
            keys = [k.strip() for k in lines[0].split(",")]
            d["gpus"] = [dict(zip(keys, (v.strip() for v in line.split(",")))) for line in lines[1:]]
    else:
        d["gpus"] = []
        d["nvidia_smi"] = {k: v for k, v in smi.items() if k != "output"} | {"output": smi.get("output", "")[-2000:]}
    rep.save()
    if d["tools"]["nvidia-smi"]:
        _command(["nvidia-smi", "-L"])
        _command(["nvidia-smi", "-q", "-d", "COMPUTE,CLOCK,MEMORY,PERFORMANCE,ECC"], timeout=30)
        _command(["nvidia-smi", "topo", "-m"])
    if d["tools"]["nvcc"]:
        nvcc = _command(["nvcc", "--version"])
        m = re.search(r"release ([\d.]+)", nvcc.get("output", ""))
        d["nvcc_release"] = m.group(1) if m else None
    if d["tools"]["compute-sanitizer"]:
        cs = _command(["compute-sanitizer", "--version"])
        d["compute_sanitizer_version"] = (cs.get("output") or "").splitlines()[-1:] or None
    _command(["df", "-h", "/dev/shm", "/tmp", ROOT])
    _command(["sh", "-c", "ulimit -a"])
    rep.save()
    try:
        _torch_facts(rep)
    except Exception:
        rep.set("torch_error", traceback.format_exc())
        _say(traceback.format_exc())
        rep.finish("FAIL", "torch failed: " + traceback.format_exc().strip().splitlines()[-1])
        return
    rep.finish("ok", env_summary(d))


def env_summary(d: dict) -> str:
    """One line: GPU, driver, runtime, torch, CUDA, NCCL, /dev/shm."""
    parts = []
    gpus = d.get("gpus") or []
    tf = d.get("torch") or {}
    if gpus:
        g = gpus[0]
        # nvidia-smi's csv values carry their units ("143771 MiB").
        parts.append(f"{len(gpus)} x {g.get('name', '?')} ({g.get('memory.total [MiB]', '?')})")
        parts.append(f"driver {g.get('driver_version', '?')}")
        parts.append(f"compute mode {g.get('compute_mode', '?')}, MIG {g.get('mig.mode.current', '?')}")
    else:
        parts.append("no GPU (nvidia-smi " + ("found none" if (d.get("tools") or {}).get("nvidia-smi") else "absent") + ")")
    parts.append(f"runtime {d.get('runtime', '?')}")
    if tf:
        parts.append(f"torch {tf.get('version')} (CUDA {tf.get('cuda')}, NCCL {tf.get('nccl', '?')})")
        parts.append("cuda available" if tf.get("cuda_available") else "torch sees no GPU")
    shm = d.get("dev_shm")
    if shm:
        parts.append(f"/dev/shm {shm['size_bytes'] / 2**30:.1f} GiB")
    parts.append(f"{d.get('cpu_count')} CPUs, python {d.get('python')}")
    return ", ".join(parts)


# ---------------------------------------------------------------- ipc


def _recv(conn, timeout: float):
    if not conn.poll(timeout):
        raise TimeoutError(f"no answer from the other process within {timeout:.0f} s")
    return conn.recv()


def _answer(conn, kind: str, details: dict, timeout: float):
    """The child's next message, which must be `kind`; a child that failed
    sends ("error", its traceback), kept in details["child_error"]."""
    got, payload = _recv(conn, timeout)
    if got == "error":
        details["child_error"] = payload
        _say(payload)
        raise RuntimeError("the child failed: " + payload.strip().splitlines()[-1])
    assert got == kind, (got, kind)
    return payload


def _ipc_child(conn) -> None:  # pragma: no cover - runs on a GPU
    import torch

    try:
        torch.cuda.set_device(0)
        t, ev = _recv(conn, 30)
        try:
            ev.wait(torch.cuda.current_stream())
            event_ok, event_error = True, None
        except Exception as e:
            event_ok, event_error = False, f"{type(e).__name__}: {e}"
        want = torch.arange(t.numel(), dtype=torch.float32, device="cuda")
        read_ok = bool(torch.equal(t, want))
        t.add_(1.0)
        done = torch.cuda.Event(interprocess=True)
        done.record()
        conn.send(("tensor", {"read_ok": read_ok, "event_wait_ok": event_ok, "event_wait_error": event_error}))
        conn.send(("event", done))
        # Two processes on the GPU at once: both spin a kernel on one signal.
        _recv(conn, 30)
        start = time.time()
        torch.cuda._sleep(1 << 30)
        torch.cuda.synchronize()
        conn.send(("busy", (start, time.time())))
        _recv(conn, 30)  # the parent is done with the shared memory
    except Exception:
        conn.send(("error", traceback.format_exc()))


def probe_ipc(rep: Report) -> None:
    """A CUDA tensor and an interprocess event shared with a child process
    (what smddp's node arena needs), then both processes' kernels at once:
    tells "the runtime forbids CUDA IPC" apart from an smddp bug."""
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        rep.finish("skipped", "no GPU (torch.cuda.is_available() is False)")
        return
    d = rep.details
    d["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_ipc_child, args=(child_conn,), daemon=True)
    child.start()
    child_conn.close()
    verdicts: dict[str, str] = {}

    def answer(kind: str):
        return _answer(conn, kind, d, 30)

    step = "tensor"
    n = 1 << 20
    try:
        t = torch.arange(n, dtype=torch.float32, device="cuda")
        ev = torch.cuda.Event(interprocess=True)
        torch.cuda._sleep(1 << 24)  # the child's wait must really wait
        ev.record()
        conn.send((t, ev))
        got = answer("tensor")
        d["child"] = got
        verdicts["tensor"] = "ok" if got["read_ok"] else "FAIL: the child read other values"
        verdicts["event_wait"] = "ok" if got["event_wait_ok"] else f"FAIL: {got['event_wait_error']}"
        step = "event_back"
        answer("event").wait(torch.cuda.current_stream())
        torch.cuda.synchronize()
        verdicts["event_back"] = "ok"
        step = "child_write"
        want = torch.arange(n, dtype=torch.float32, device="cuda") + 1
        verdicts["child_write"] = "ok" if torch.equal(t, want) else "FAIL: the parent does not see it"
        step = "concurrent"
        conn.send("go")
        start = time.time()
        torch.cuda._sleep(1 << 30)
        torch.cuda.synchronize()
        mine = (start, time.time())
        theirs = answer("busy")
        overlap = min(mine[1], theirs[1]) - max(mine[0], theirs[0])
        d["busy_s"] = {"parent": mine[1] - mine[0], "child": theirs[1] - theirs[0], "overlap": overlap}
        verdicts["concurrent"] = "ok" if overlap > 0 else "FAIL: the two processes' kernels did not overlap"
        conn.send("done")
        # Facts, not verdicts: whether the host waits behind this process's
        # busy stream for the first launch of a kernel (CUDA's lazy loading,
        # why smddp loads its kernels before its first collective) and for
        # a cudaFree (empty_cache of a cached block).
        step = "busy"
        x = torch.ones(8, device="cuda")
        spare = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        del spare
        torch.cuda.synchronize()
        waits = {"CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING", "(unset)")}
        for name, call in (("first_launch_s", lambda: torch.special.i1e(x)),
                           ("cuda_free_s", torch.cuda.empty_cache)):  # fmt: skip
            torch.cuda._sleep(1 << 30)
            t0 = time.time()
            call()
            waits[name] = round(time.time() - t0, 3)
            torch.cuda.synchronize()
        d["busy_stream_waits"] = waits
    except Exception as e:
        _say(traceback.format_exc())
        d.setdefault("error", traceback.format_exc())
        verdicts.setdefault(step, f"FAIL: {type(e).__name__}: {e}")
    finally:
        child.join(timeout=20)
        if child.is_alive():
            child.kill()
        d["verdicts"] = verdicts
    wanted = ("tensor", "event_wait", "event_back", "child_write", "concurrent")
    failed = [k for k in wanted if verdicts.get(k) != "ok"]
    text = ", ".join(f"{k} {verdicts.get(k, 'not reached')}" for k in wanted)
    if "busy_s" in d:
        b = d["busy_s"]
        text += f" (kernels {b['parent']:.2f} s and {b['child']:.2f} s, overlapping {b['overlap']:.2f} s)"
    if "busy_stream_waits" in d:
        w = d["busy_stream_waits"]
        text += (f"; behind a busy stream the host waited {w['first_launch_s']:.2f} s for a kernel's first launch, "
                 f"{w['cuda_free_s']:.2f} s for a cudaFree")
    rep.finish("FAIL" if failed else "ok", text)


# ---------------------------------------------------------------- import


def cuda_module():
    """(module or None, where, reason): smddp's CUDA code, in either layout.

    smddp._cuda.load() returns the separate CUDA module (smddp._C_cuda) or
    raises ImportError with the reason; a build from before that split
    carries the CUDA code in smddp._C itself (smddp._C.with_cuda), which is
    used when the loader has no module to give.
    """
    reason = None
    try:
        from smddp import _cuda
    except ImportError:
        _cuda = None
    if _cuda is not None:
        try:
            return _cuda.load(), "smddp._cuda.load()", "ok"
        except ImportError as e:
            reason = f"smddp._cuda.load(): {e}"
    from smddp import _C

    if getattr(_C, "with_cuda", False) and hasattr(_C, "device_reduce"):
        return _C, "smddp._C (with_cuda)", "ok"
    return None, "smddp._cuda.load()" if reason else "smddp._C", reason or (
        "smddp was built without CUDA (smddp._C.with_cuda is False)")


def probe_import(rep: Report) -> None:
    d = rep.details
    t = time.monotonic()
    try:
        import smddp
        from smddp import _C
    except Exception:
        d["error"] = traceback.format_exc()
        _say(d["error"])
        rep.finish("FAIL", "import smddp failed: " + d["error"].strip().splitlines()[-1])
        return
    import torch

    d["import_s"] = round(time.monotonic() - t, 2)
    d["smddp_file"] = smddp.__file__
    d["extension"] = getattr(_C, "__file__", None)
    d["built_for_torch"] = getattr(_C, "torch_version", None)
    d["torch"] = torch.__version__
    try:
        from smddp import _cuda

        d["cuda_status"] = _cuda.status()
    except ImportError:
        d["cuda_status"] = None
    mod, where, reason = cuda_module()
    d["cuda_module"] = getattr(mod, "__file__", None) if mod is not None else None
    d["cuda_where"] = where
    d["cuda_reason"] = reason
    if mod is not None:
        d["device_reduce_doc"] = (getattr(mod, "device_reduce", None).__doc__ or "").strip()[:600]
    rep.save()
    head = f"smddp imports (built for torch {d['built_for_torch']}, running {d['torch']})"
    if mod is None:
        gpu = torch.cuda.is_available()
        rep.finish("FAIL" if gpu else "ok", f"{head}; no CUDA module: {reason}")
        return
    if not torch.cuda.is_available():
        rep.finish("ok", f"{head}; CUDA module {where} loads (no GPU to call it on)")
        return
    a = torch.arange(4099, dtype=torch.float32, device="cuda")
    b = torch.full_like(a, 0.5)
    try:
        got = mod.device_reduce([a, b], "SUM")
        torch.cuda.synchronize()
        ok = bool(torch.equal(got, a + b))
    except Exception:
        d["device_reduce_error"] = traceback.format_exc()
        _say(d["device_reduce_error"])
        rep.finish("FAIL", f"{head}; {where} loads but device_reduce failed: "
                   + d["device_reduce_error"].strip().splitlines()[-1])
        return
    rep.finish("ok" if ok else "FAIL", f"{head}; {where}: device_reduce " + ("works" if ok else "gave wrong values"))


# ---------------------------------------------------------------- memops

# cuStreamWaitValue32's flags (cuda.h): wait until (int32)(*addr - value) >= 0.
CU_STREAM_WAIT_VALUE_GEQ = 0x0


def _driver():
    """libcuda's stream memory operations, through ctypes (torch alone)."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    fns = []
    for name in ("cuStreamWriteValue32", "cuStreamWaitValue32"):
        fn = None
        for symbol in (name + "_v2", name):
            fn = getattr(lib, symbol, None)
            if fn is not None:
                break
        if fn is None:
            raise RuntimeError(f"libcuda.so.1 has no {name}")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
        fns.append(fn)
    return fns


def _memops_rounds(write, wait, stream, post: int, await_: int, first: int, rounds: int, leader: bool) -> None:
    """`rounds` ping-pong rounds enqueued on `stream` without the host: the
    leader posts k then awaits the answer k; the other awaits k, then posts it."""
    for k in range(first, first + rounds):
        ops = ((write, post), (wait, await_)) if leader else ((wait, await_), (write, post))
        for fn, addr in ops:
            flags = CU_STREAM_WAIT_VALUE_GEQ if fn is wait else 0
            rc = fn(stream, addr, k, flags)
            if rc != 0:
                raise RuntimeError(f"{fn.__name__} returned CUresult {rc}")


def _memops_child(conn) -> None:  # pragma: no cover - runs on a GPU
    import torch

    try:
        torch.cuda.set_device(0)
        write, wait = _driver()
        flags = _recv(conn, 30)
        ping, pong = flags[0].data_ptr(), flags[1].data_ptr()
        stream = torch.cuda.current_stream().cuda_stream
        while True:
            msg = _recv(conn, 60)
            if msg[0] == "end":
                break
            if msg[0] == "memops":
                _, first, rounds = msg
                _memops_rounds(write, wait, stream, pong, ping, first, rounds, leader=False)
                conn.send(("enqueued", None))
                torch.cuda.synchronize()
                conn.send(("done", None))
            elif msg[0] == "host":
                # The host in the loop: answer each ping after this
                # process's own work on the GPU is done.
                _, rounds = msg
                x = torch.zeros(1024, device="cuda")
                for _ in range(rounds):
                    _recv(conn, 30)
                    x.add_(1.0)
                    torch.cuda.synchronize()
                    conn.send("pong")
                conn.send(("done", None))
    except Exception:
        conn.send(("error", traceback.format_exc()))


def probe_memops(rep: Report) -> None:
    """Two processes sharing GPU 0 meet through flags in device memory with
    cuStreamWriteValue32/cuStreamWaitValue32 (the stream waits; no kernel
    spins and no host thread waits), against the same rounds with the host in
    the loop: what one round costs when the two contexts take turns on the
    GPU, and whether a wait can be captured in a CUDA graph."""
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        rep.finish("skipped", "no GPU (torch.cuda.is_available() is False)")
        return
    d = rep.details
    write, wait = _driver()
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_memops_child, args=(child_conn,), daemon=True)
    child.start()
    child_conn.close()

    def answer(kind: str):
        return _answer(conn, kind, d, 60)

    results: dict[str, float] = {}
    try:
        flags = torch.zeros(2, 16, dtype=torch.int32, device="cuda")  # ping, pong: 64 B apart
        torch.cuda.synchronize()
        conn.send(flags)
        ping, pong = flags[0].data_ptr(), flags[1].data_ptr()
        stream = torch.cuda.current_stream().cuda_stream
        first = 1
        for rounds in (1, 10, 200):
            conn.send(("memops", first, rounds))
            answer("enqueued")
            t0 = time.perf_counter()
            _memops_rounds(write, wait, stream, ping, pong, first, rounds, leader=True)
            torch.cuda.synchronize()
            results[f"memops_{rounds}_us"] = round((time.perf_counter() - t0) / rounds * 1e6, 1)
            answer("done")
            first += rounds
            rep.set("round_us", results)
        rounds = 50
        conn.send(("host", rounds))
        x = torch.zeros(1024, device="cuda")
        t0 = time.perf_counter()
        for _ in range(rounds):
            x.add_(1.0)
            torch.cuda.synchronize()
            conn.send("ping")
            if _recv(conn, 30) != "pong":
                raise RuntimeError("the child answered out of turn")
        results["host_50_us"] = round((time.perf_counter() - t0) / rounds * 1e6, 1)
        answer("done")
        rep.set("round_us", results)
        # One round captured in a graph, replayed against the child's eager round.
        try:
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            with torch.cuda.graph(g, stream=side):
                _memops_rounds(write, wait, side.cuda_stream, ping, pong, first, 1, leader=True)
            conn.send(("memops", first, 1))
            answer("enqueued")
            g.replay()
            torch.cuda.synchronize()
            answer("done")
            d["capture"] = "ok"
        except Exception as e:
            d["capture"] = f"FAIL: {type(e).__name__}: {e}"
        conn.send(("end",))
    except Exception as e:
        d["error"] = traceback.format_exc()
        rep.finish("FAIL", f"{type(e).__name__}: {e}; so far {results}")
        return
    finally:
        child.join(timeout=20)
        if child.is_alive():
            child.kill()
    text = ", ".join(f"{k} {v}" for k, v in results.items())
    rep.finish("ok", f"one round (us): {text}; capture {d.get('capture')}")


PROBES = {"env": probe_env, "ipc": probe_ipc, "import": probe_import, "memops": probe_memops}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", choices=sorted(PROBES))
    p.add_argument("--json", required=True)
    args = p.parse_args()
    rep = Report(args.json)
    try:
        PROBES[args.probe](rep)
    except Exception:
        text = traceback.format_exc()
        _say(text)
        rep.set("error", text)
        rep.finish("FAIL", f"{args.probe} probe failed: " + text.strip().splitlines()[-1])
    _say(f"{args.probe}: {rep.data['status']}: {rep.data['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
