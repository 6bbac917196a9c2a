"""The one JSON record every benchmark here writes (``schema: smddp-bench/2``).

Every record has ``schema``, ``kind`` (sweep, peers, model, calibration,
step, gpu-kernels), ``created``, ``command`` (the exact command line that
regenerates it), ``machine`` (CPU, cores, memory, kernel, versions, load),
``config`` (the SMDDP_* knobs), ``settings``, and where calls were timed
``timing`` (the policy and the sentence the tables' footers print); then
what its kind measured, ``results`` first. A measured point is one
``point()`` record, whatever ran it. Torch-free.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import sys
from dataclasses import asdict
from typing import Any

from smddp.bench import ops as _ops

SCHEMA = "smddp-bench/2"
MEASURED = ("ok", "few", "slow")  # statuses that carry a time


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _first(path: str, key: str) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                if line.lower().startswith(key.lower()):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_info() -> dict[str, Any]:
    """The host and the software versions (read without importing torch)."""
    mem = _first("/proc/meminfo", "MemTotal")
    smddp = sys.modules.get("smddp")
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _first("/proc/cpuinfo", "model name") or platform.processor(),
        "cpu_cores": os.cpu_count(), "cpu_cores_available": len(os.sched_getaffinity(0)),
        "memory_gb": round(int(mem.split()[0]) * 1024 / 1e9, 1) if mem else None,
        "kernel": f"{platform.system()} {platform.release()}", "platform": platform.platform(),
        "device": "cpu", "gpus": [],
        "python": platform.python_version(), "torch": _version("torch"), "numpy": _version("numpy"),
        "smddp": getattr(smddp, "__version__", None) or _version("smddp"),
        "load_average": {"start": load_average()},
    }  # fmt: skip


def smddp_config() -> dict[str, str]:
    """Every SMDDP_* knob as this process sees it (defaults included where
    smddp is already imported)."""
    config = sys.modules.get("smddp.config")
    values = dict(config.current()) if config is not None else {}
    values.update((k, v) for k, v in os.environ.items() if k.startswith("SMDDP_"))
    return dict(sorted(values.items()))


def new(kind: str, command: list[str], settings: dict[str, Any], timing: Any = None, **extra: Any) -> dict:
    """A record's common part; ``timing`` is a ``timing.Timing``."""
    rec: dict[str, Any] = {
        "schema": SCHEMA, "kind": kind,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": list(command), "machine": machine_info(), "config": smddp_config(),
        "settings": dict(settings),
    }  # fmt: skip
    if timing is not None:
        rec["timing"] = {**asdict(timing), "description": timing.describe()}
    rec.update(extra)
    return rec


def write_gpu(kind: str, script: str, argv: list[str], settings: Any, timing: Any, device: str,
              results: list[dict[str, Any]], path: str) -> None:  # fmt: skip
    """A GPU benchmark's record of its results so far, at ``path``: rewritten
    after each measurement, a run cut short keeps what it measured."""
    rec = new(kind, ["python", script, *argv], vars(settings), timing, device=device, results=results)
    rec["machine"].update(device="cuda", gpus=[device])
    write(rec, path)


def point(backend: str, op: str, dtype: str, redop: str, world: int, requested: int, res: Any = None,
          status: str = "", note: str = "") -> dict[str, Any]:  # fmt: skip
    """The record of one backend at one point; ``res`` is a ``timing.Result``
    (None for a cell that has no time: n/a, skipped, timeout, error, absent)."""
    geom = _ops.geometry(op, requested, _ops.DTYPES[dtype][0], world)
    rec: dict[str, Any] = {
        "backend": backend, "op": op, "dtype": dtype, "redop": redop, "world": world,
        "requested_bytes": requested, "size_bytes": geom and geom.size,
        "count": geom and geom.count, "status": status or (res.status if res else "error"),
        "note": note or (res.error if res else ""),
    }  # fmt: skip
    if res is not None and res.samples and rec["status"] in MEASURED:
        med = statistics.median(res.samples)
        rec.update(iters=res.iters, time_us=med * 1e6, time_min_us=min(res.samples) * 1e6,
                   time_max_us=max(res.samples) * 1e6, algbw_gbs=_ops.algbw_gbs(geom.size, med),
                   busbw_gbs=_ops.busbw_gbs(op, geom.size, med, world), wrong=res.wrong,
                   samples_us=[x * 1e6 for x in res.samples], warmup_us=[x * 1e6 for x in res.warm])  # fmt: skip
    return rec


def measured(rec: dict[str, Any] | None) -> bool:
    return bool(rec) and rec.get("status") in MEASURED


def write(record: dict[str, Any], path: str) -> None:
    """Writes strict JSON, atomically."""
    record.setdefault("machine", {}).setdefault("load_average", {})["end"] = load_average()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read(path: str) -> dict[str, Any]:
    with open(path) as f:
        rec = json.load(f)
    if rec.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} record (schema {rec.get('schema')!r})")
    return rec
