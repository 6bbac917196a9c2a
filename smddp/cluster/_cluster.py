"""The cluster's namespaces, links and launcher (see smddp/cluster/__init__.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Sequence

ADDRESS_RANGE = "198.18.0.0/15"
DEFAULT_NAME = "smddp"
STATE_ROOT = "/run/smddp-cluster"
MASTER_PORT = 29500
MAX_HOSTS = 250
MAX_NICS = 16
# A NIC k's routing table and the priority of its rule: 100 + k.
_TABLE_BASE = 100
_BRIDGE = "br0"
# The hosts' TCP congestion control: the stock Linux default, whatever this
# machine's default is, so that a cluster's results do not depend on the
# machine it is emulated on. "system" keeps the machine's.
TCP_CONGESTION = "cubic"
_TCP_SYSCTL = "/proc/sys/net/ipv4/tcp_congestion_control"
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_TOOLS = ("ip", "tc", "nsenter", "unshare", "mount", "umount")
_HOW_TO_GET = (
    "run it as root (sudo smddp-cluster ...), or in a container started with "
    "--cap-add NET_ADMIN --cap-add SYS_ADMIN"
)


class ClusterError(RuntimeError):
    """The cluster cannot be made, used or removed; the message says why."""


@dataclass
class RunResult:
    """What ``Cluster.run`` saw: each host's exit status and output lines."""

    returncode: int  # the worst host's (124: the run timed out)
    host_codes: list[int]
    outputs: list[list[str]]
    timed_out: bool = False
    seconds: float = 0.0
    stopped: list[int] = field(default_factory=list)  # hosts stopped after another failed

    def text(self, host: int | None = None) -> str:
        """One host's output, or every host's with its prefix."""
        if host is not None:
            return "\n".join(self.outputs[host])
        return "\n".join(f"[h{h}] {line}" for h, lines in enumerate(self.outputs) for line in lines)


def parse_rate(rate: str | None) -> int | None:
    """Bytes per second of a tc rate ("1gbit", "100mbit", "125mbps"); None
    for an unshaped link ("none", "0", empty)."""
    if rate is None:
        return None
    text = str(rate).strip().lower()
    if text in ("", "0", "none", "off", "unlimited"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)", text)
    if not m:
        raise ClusterError(
            f"--rate {rate!r} is not a rate; use e.g. 1gbit, 100mbit, 10gbit (bits per second) "
            "or 125mbps (bytes per second), or none for unshaped links"
        )
    value = float(m.group(1))
    unit = m.group(2)
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[unit[0] if unit[0] in "kmgt" else ""]
    per_second = value * scale / 8 if unit.endswith("bit") else value * scale
    if per_second < 1000:
        raise ClusterError(f"--rate {rate!r} is below 8 kbit/s; links that slow cannot carry a job")
    return int(per_second)


def _capabilities() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def unavailable_reason(probe: bool = True) -> str | None:
    """Why a cluster cannot be made here (None if it can). With ``probe``,
    also tries to make and remove a namespace (containers may forbid it)."""
    if not sys.platform.startswith("linux"):
        return "smddp-cluster needs Linux (network, UTS and mount namespaces)"
    caps = _capabilities()
    if os.geteuid() != 0 and not (caps >> _CAP_NET_ADMIN & 1 and caps >> _CAP_SYS_ADMIN & 1):
        return (
            "smddp-cluster needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN (it makes network, UTS "
            f"and mount namespaces, veth links and bridges): {_HOW_TO_GET}"
        )
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return (
            f"smddp-cluster needs {', '.join(missing)} on PATH: install iproute2 (ip, tc) and "
            "util-linux (nsenter, unshare, mount), e.g. apt-get install iproute2 util-linux"
        )
    if probe:
        ns = f"smddp-probe-{os.getpid()}"
        made = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
        if made.returncode != 0:
            said = made.stderr.strip()
            return f"network namespaces cannot be made here (`ip netns add` said: {said}); {_HOW_TO_GET}"
        try:
            shared = subprocess.run(
                ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "true"],
                capture_output=True,
                text=True,
            )
            if shared.returncode != 0:
                said = shared.stderr.strip()
                return f"UTS and mount namespaces cannot be made here (unshare said: {said}); {_HOW_TO_GET}"
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return None


def _congestion_list(which: str) -> list[str] | None:
    """This machine's net.ipv4.tcp_{which}_congestion_control (available,
    allowed), or None where it cannot be read."""
    try:
        with open(f"/proc/sys/net/ipv4/tcp_{which}_congestion_control") as f:
            return f.read().split()
    except OSError:
        return None


def _sh(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise ClusterError(f"`{shlex.join(cmd)}` failed (exit status {p.returncode}): {p.stderr.strip()}")
    return p


def _netns_list() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except OSError:
        return []


def _netns_pids(ns: str) -> list[int]:
    p = _sh(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]


def _mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].encode().decode("unicode_escape")
                if point == path or point.startswith(path.rstrip("/") + "/"):
                    out.append(point)
    except OSError:
        pass
    return sorted(set(out), key=len, reverse=True)


@dataclass
class _Host:
    index: int
    netns: str
    hostname: str
    uts: str
    mnt: str
    nics: list[dict[str, str]] = field(default_factory=list)  # name, address, port


class Cluster:
    """N hosts of K NICs each on one machine (see the package's docstring).

    ``Cluster(hosts=2, nics=2, rate="1gbit").up()`` makes it;
    ``Cluster.load()`` finds the one ``up`` made (by name) from its state;
    ``run``, ``exec``, ``set_nic``, ``set_path`` and ``down`` use it.
    """

    def __init__(
        self,
        hosts: int = 2,
        nics: int = 2,
        rate: str | None = None,
        mtu: int = 9000,
        name: str = DEFAULT_NAME,
        state_root: str = STATE_ROOT,
        tcp_congestion: str = TCP_CONGESTION,
    ):
        if not re.fullmatch(r"[a-z][a-z0-9]{0,9}", name):
            raise ClusterError(
                f"cluster name {name!r}: use 1-10 lower-case letters and digits, starting with a letter"
            )
        if not 1 <= hosts <= MAX_HOSTS:
            raise ClusterError(f"--hosts {hosts}: use 1..{MAX_HOSTS}")
        if not 1 <= nics <= MAX_NICS:
            raise ClusterError(f"--nics {nics}: use 1..{MAX_NICS}")
        if not 1280 <= mtu <= 65535:
            raise ClusterError(f"--mtu {mtu}: use 1280..65535 (9000 is the jumbo MTU of EFA and most clusters)")
        available = _congestion_list("available")
        if tcp_congestion != "system" and available is not None and tcp_congestion not in available:
            raise ClusterError(
                f"--tcp-congestion {tcp_congestion}: this kernel has {' '.join(available)}; load it "
                f"(modprobe tcp_{tcp_congestion}), pick one of those, or use system (the machine's default)"
            )
        self.tcp_congestion = tcp_congestion
        # What the hosts run, once up (the kernel may refuse the one asked for).
        self.tcp: str | None = None
        self.name = name
        self.hosts = hosts
        self.nics = nics
        self.rate = None if parse_rate(rate) is None else str(rate).strip().lower()
        self.rate_bytes_per_s = parse_rate(rate)
        self.mtu = mtu
        self.state_dir = os.path.join(state_root, name)
        self.switch = f"{name}-sw"
        self._hosts = [self._plan(h) for h in range(hosts)]

    # ------------------------------------------------------------ naming

    def _plan(self, h: int) -> _Host:
        host = _Host(
            index=h,
            netns=f"{self.name}-h{h}",
            hostname=f"{self.name}-h{h}",
            uts=os.path.join(self.state_dir, "ns", f"h{h}.uts"),
            mnt=os.path.join(self.state_dir, "ns", f"h{h}.mnt"),
        )
        for k in range(self.nics):
            host.nics.append({"name": self.nic_name(k), "address": f"198.18.{k}.{h + 1}", "port": f"h{h}n{k}"})
        return host

    @staticmethod
    def nic_name(k: int) -> str:
        return f"nic{k}"

    def address(self, host: int, nic: int = 0) -> str:
        """NIC ``nic`` of ``host``: 198.18.nic.(host+1)."""
        return self._hosts[host].nics[nic]["address"]

    def netns(self, host: int) -> str:
        return self._hosts[host].netns

    def hostname(self, host: int) -> str:
        return self._hosts[host].hostname

    @property
    def master_address(self) -> str:
        return self.address(0, 0)

    @property
    def state_file(self) -> str:
        return os.path.join(self.state_dir, "state.json")

    def socket_ifname(self) -> str:
        """SMDDP_SOCKET_IFNAME of every host: all its NICs."""
        return ",".join(self.nic_name(k) for k in range(self.nics))

    def enter(self, host: int, cwd: str | None = None) -> list[str]:
        """The command prefix that runs a command on ``host``."""
        h = self._hosts[host]
        return [
            "nsenter",
            f"--net=/run/netns/{h.netns}",
            f"--uts={h.uts}",
            f"--mount={h.mnt}",
            f"--wd={cwd or os.getcwd()}",
            "--",
        ]

    # ------------------------------------------------------------ state

    def _state(self, complete: bool) -> dict[str, Any]:
        return {
            "version": 1,
            "name": self.name,
            "hosts": self.hosts,
            "nics": self.nics,
            "rate": self.rate,
            "rate_bytes_per_s": self.rate_bytes_per_s,
            "mtu": self.mtu,
            "tcp_congestion": self.tcp_congestion,
            "tcp": self.tcp,
            "address_range": ADDRESS_RANGE,
            "switch": self.switch,
            "bridge": _BRIDGE,
            "host_table": [h.__dict__ for h in self._hosts],
            "complete": complete,
        }

    def _save(self, complete: bool) -> None:
        tmp = self.state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self._state(complete), f, indent=1)
        os.replace(tmp, self.state_file)

    @classmethod
    def load(cls, name: str = DEFAULT_NAME, state_root: str = STATE_ROOT) -> Cluster:
        """The cluster ``up`` made under ``name``."""
        path = os.path.join(state_root, name, "state.json")
        try:
            with open(path) as f:
                s = json.load(f)
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster {name!r} is up (no {path}); make one with `smddp-cluster up --hosts 2 --nics 2`"
            ) from None
        except (OSError, ValueError) as e:
            raise ClusterError(f"cannot read {path}: {e}; `smddp-cluster down` removes what is left") from None
        c = cls(
            hosts=s["hosts"], nics=s["nics"], rate=s["rate"], mtu=s["mtu"], name=s["name"], state_root=state_root,
            tcp_congestion=s.get("tcp_congestion", "system"),
        )
        c.tcp = s.get("tcp")
        if not s.get("complete"):
            raise ClusterError(f"cluster {name!r} was not made completely; `smddp-cluster down` removes what is left")
        return c

    def describe(self) -> str:
        rate = f"{self.rate} per NIC per direction" if self.rate else "unshaped"
        lines = [
            f"cluster {self.name!r}: {self.hosts} hosts x {self.nics} NICs, {rate}, MTU {self.mtu}, "
            f"TCP {self.tcp or self.tcp_congestion}, addresses in {ADDRESS_RANGE}; rendezvous on {self.master_address}"
        ]
        for h in self._hosts:
            nics = ", ".join(f"{n['name']} {n['address']}" for n in h.nics)
            lines.append(f"  h{h.index}: hostname {h.hostname}, netns {h.netns}: {nics}")
        return "\n".join(lines)

    # ------------------------------------------------------------ up / down

    def up(self) -> None:
        """Makes the cluster, after removing what an earlier one of this name left."""
        reason = unavailable_reason(probe=False)
        if reason:
            raise ClusterError(reason)
        self.down()
        os.makedirs(os.path.join(self.state_dir, "ns"), exist_ok=True)
        self._save(complete=False)
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        self._save(complete=True)

    def _sysctl(self, ns: str, settings: dict[str, str]) -> None:
        script = "; ".join(
            f"echo {shlex.quote(v)} > /proc/sys/{k.replace('.', '/')}" for k, v in settings.items()
        )
        _sh(["nsenter", f"--net=/run/netns/{ns}", "sh", "-ec", script])

    def _make(self) -> None:
        nsdir = os.path.join(self.state_dir, "ns")
        # The namespace files are bind-mounted here; a private mount keeps
        # them from propagating into the namespaces they hold.
        _sh(["mount", "--bind", nsdir, nsdir])
        _sh(["mount", "--make-private", nsdir])
        quiet = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
        sw = self.switch
        _sh(["ip", "netns", "add", sw])
        self._sysctl(sw, quiet)
        _sh(["ip", "-n", sw, "link", "set", "lo", "up"])
        _sh(["ip", "-n", sw, "link", "add", _BRIDGE, "type", "bridge", "stp_state", "0"])
        _sh(["ip", "-n", sw, "link", "set", _BRIDGE, "mtu", str(self.mtu), "up"])
        hosts_file = os.path.join(self.state_dir, "hosts")
        try:
            with open("/etc/hosts") as f:
                base = f.read()
        except OSError:
            base = "127.0.0.1 localhost\n"
        # Every address has a name (getnameinfo answers at once), and there is
        # no name server to wait for: nothing resolves outside the machine.
        with open(hosts_file, "w") as f:
            f.write(base.rstrip("\n") + "\n# smddp-cluster " + self.name + "\n")
            for h in self._hosts:
                for k, nic in enumerate(h.nics):
                    names = f"{h.hostname} {h.hostname}-{nic['name']}" if k == 0 else f"{h.hostname}-{nic['name']}"
                    f.write(f"{nic['address']} {names}\n")
        resolv_file = os.path.join(self.state_dir, "resolv.conf")
        with open(resolv_file, "w") as f:
            f.write(f"# smddp-cluster {self.name}: no name servers, names come from /etc/hosts\n")
        for h in self._hosts:
            ns = h.netns
            _sh(["ip", "netns", "add", ns])
            # One subnet, K NICs: answer ARP only on the NIC that holds the
            # address, and let replies come back on any NIC.
            self._sysctl(ns, {
                **quiet,
                "net.ipv4.conf.all.arp_ignore": "1",
                "net.ipv4.conf.all.arp_announce": "2",
                "net.ipv4.conf.all.rp_filter": "0",
                "net.ipv4.conf.default.rp_filter": "0",
            })
            self._set_congestion(ns)
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            for k, nic in enumerate(h.nics):
                port, name, addr = nic["port"], nic["name"], nic["address"]
                _sh(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", name, "netns", ns])
                _sh(["ip", "-n", sw, "link", "set", port, "mtu", str(self.mtu), "master", _BRIDGE, "up"])
                _sh(["ip", "-n", ns, "link", "set", name, "mtu", str(self.mtu)])
                _sh(["ip", "-n", ns, "addr", "add", f"{addr}/15", "dev", name])
                _sh(["ip", "-n", ns, "link", "set", name, "up"])
                table = str(_TABLE_BASE + k)
                _sh(["ip", "-n", ns, "rule", "add", "from", addr, "lookup", table, "pref", table])
                self._route(ns, k, addr)
                _sh(["ip", "-n", ns, "route", "add", "unreachable", "default", "table", table])
                if self.rate_bytes_per_s is not None:
                    self._shape(["-n", ns], name)
                    self._shape(["-n", sw], port)
            for path in (h.uts, h.mnt):
                open(path, "w").close()
            inside = " && ".join([
                f"echo {shlex.quote(h.hostname)} > /proc/sys/kernel/hostname",
                "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm",
                # /sys of this host's network namespace (its NICs' counters).
                "mount -t sysfs sysfs /sys",
                f"mount --bind {shlex.quote(hosts_file)} /etc/hosts",
                f"if [ -e /etc/resolv.conf ]; then mount --bind {shlex.quote(resolv_file)} /etc/resolv.conf; fi",
            ])
            _sh([
                "nsenter", f"--net=/run/netns/{ns}", "unshare", f"--uts={h.uts}", f"--mount={h.mnt}",
                "--propagation", "private", "sh", "-ec", inside,
            ])

    def _set_congestion(self, ns: str) -> None:
        enter = ["nsenter", f"--net=/run/netns/{ns}"]
        if self.tcp_congestion != "system":
            p = _sh([*enter, "sh", "-c", f"echo {shlex.quote(self.tcp_congestion)} > {_TCP_SYSCTL}"], check=False)
            if p.returncode != 0 and self.tcp is None:
                # A namespace may choose only among the algorithms the machine
                # allows; the hosts then keep the machine's default, and
                # describe() says which.
                allowed = _congestion_list("allowed") or []
                print(
                    f"smddp-cluster: the hosts keep this machine's TCP congestion control: a network "
                    f"namespace may choose only among net.ipv4.tcp_allowed_congestion_control "
                    f"({' '.join(allowed)}), not {self.tcp_congestion}. To allow it: sysctl -w "
                    f"net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, self.tcp_congestion])}'",
                    file=sys.stderr,
                )
        self.tcp = _sh([*enter, "cat", _TCP_SYSCTL]).stdout.strip()

    def _route(self, ns: str, k: int, addr: str) -> None:
        _sh([
            "ip", "-n", ns, "route", "replace", ADDRESS_RANGE, "dev", self.nic_name(k), "src", addr,
            "table", str(_TABLE_BASE + k),
        ])

    def _shape(self, where: list[str], dev: str) -> None:
        rate = self.rate_bytes_per_s
        assert rate is not None
        # A burst of about 1 ms at the rate (at least a few jumbo frames) and
        # a queue of about 20 ms: TCP fills the link without long stalls.
        burst = max(rate // 1000, 4 * (self.mtu + 100), 32 << 10)
        limit = max(rate // 50, 4 * burst)
        cmd = ["tc", *where, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate * 8}bit",
               "burst", str(burst), "limit", str(limit)]
        p = _sh(cmd, check=False)
        if p.returncode != 0:
            raise ClusterError(
                f"shaping {dev} failed (`{shlex.join(cmd)}`: {p.stderr.strip()}); is the sch_tbf kernel "
                "module available? --rate none makes unshaped links"
            )

    def down(self) -> list[str]:
        """Removes everything a cluster of this name made (also a broken or
        half-made one); returns what it removed."""
        removed = []
        pattern = re.compile(rf"{re.escape(self.name)}-(h\d+|sw)")
        ours = [ns for ns in _netns_list() if pattern.fullmatch(ns)]
        for ns in ours:
            pids = _netns_pids(ns)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if pids:
                removed.append(f"{len(pids)} processes in {ns}")
        deadline = time.monotonic() + 10
        while any(_netns_pids(ns) for ns in ours) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The mount and UTS namespaces end with their last bind mount (and
        # their /dev/shm with them).
        for point in _mounts_under(self.state_dir):
            p = _sh(["umount", point], check=False)
            if p.returncode != 0:
                _sh(["umount", "-l", point], check=False)
            removed.append(f"mount {point}")
        for ns in ours:
            _sh(["ip", "netns", "del", ns], check=False)
            removed.append(f"netns {ns}")
        if os.path.isdir(self.state_dir):
            shutil.rmtree(self.state_dir, ignore_errors=True)
            removed.append(self.state_dir)
        return removed

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty after ``down``)."""
        pattern = re.compile(rf"{re.escape(self.name)}-(h\d+|sw)")
        left = [f"netns {ns}" for ns in _netns_list() if pattern.fullmatch(ns)]
        left += [f"mount {m}" for m in _mounts_under(self.state_dir)]
        if os.path.exists(self.state_dir):
            left.append(self.state_dir)
        return left

    # ------------------------------------------------------------ use

    def exec(
        self, host: int, argv: Sequence[str], check: bool = True, timeout: float | None = 60, capture: bool = True
    ) -> subprocess.CompletedProcess:
        """Runs ``argv`` on ``host`` (its namespaces) and waits for it."""
        cmd = self.enter(host) + list(argv)
        p = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise ClusterError(f"h{host}: `{shlex.join(argv)}` failed (exit status {p.returncode}): {p.stderr}")
        return p

    def pids(self, host: int) -> list[int]:
        """Every process running on ``host``."""
        return _netns_pids(self.netns(host))

    def kill_host(self, host: int, sig: int = signal.SIGKILL) -> list[int]:
        """Sends ``sig`` to every process on ``host`` (a host that dies)."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return pids

    def set_nic(self, host: int, nic: int, up: bool) -> None:
        """Takes NIC ``nic`` of ``host`` down (its link is cut) or up again."""
        ns, name = self.netns(host), self.nic_name(nic)
        _sh(["ip", "-n", ns, "link", "set", name, "up" if up else "down"])
        if up:
            # The kernel drops a down NIC's routes; its source route returns.
            self._route(ns, nic, self.address(host, nic))

    def set_path(self, host: int, peer: int, nic: int, open: bool) -> None:
        """Makes ``host`` silently discard what it sends to NIC ``nic`` of
        ``peer`` (a firewall that drops that path: connections to it go
        unanswered), or send it again."""
        ns, dest = self.netns(host), f"{self.address(peer, nic)}/32"
        # Every table the host routes by: its NICs' source tables and main.
        for table in [str(_TABLE_BASE + k) for k in range(self.nics)] + ["main"]:
            if open:
                _sh(["ip", "-n", ns, "route", "del", "blackhole", dest, "table", table], check=False)
            else:
                _sh(["ip", "-n", ns, "route", "replace", "blackhole", dest, "table", table])

    def nic_counters(self, host: int) -> dict[str, dict[str, int]]:
        """Bytes and packets each NIC of ``host`` sent and received, from
        ``/sys/class/net/*/statistics`` as the host sees them."""
        names = " ".join(self.nic_name(k) for k in range(self.nics))
        script = (
            f"for n in {names}; do s=/sys/class/net/$n/statistics; "
            "echo $n $(cat $s/tx_bytes $s/rx_bytes $s/tx_packets $s/rx_packets); done"
        )
        out = self.exec(host, ["sh", "-c", script]).stdout
        counters = {}
        for line in out.splitlines():
            name, *values = line.split()
            tx, rx, txp, rxp = (int(v) for v in values)
            counters[name] = {"tx_bytes": tx, "rx_bytes": rx, "tx_packets": txp, "rx_packets": rxp}
        return counters

    def torchrun_command(
        self, host: int, argv: Sequence[str], nproc_per_node: int, hosts: int, master_port: int
    ) -> list[str]:
        """torchrun for ``host`` (one of the first ``hosts``) running ``argv``."""
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={hosts}", f"--node-rank={host}", f"--nproc-per-node={nproc_per_node}",
            f"--master-addr={self.master_address}", f"--master-port={master_port}",
        ]
        argv = list(argv)
        if not argv:
            raise ClusterError("nothing to run: give a script (or -m module) after --")
        if argv[0] == "-m":
            return cmd + argv
        if not argv[0].endswith(".py") and not os.path.isfile(argv[0]) and shutil.which(argv[0]):
            path = shutil.which(argv[0])
            assert path is not None
            with open(path, "rb") as f:
                python = b"python" in f.readline()
            return cmd + ([path] if python else ["--no-python", path]) + argv[1:]
        return cmd + argv

    def start(
        self,
        argv: Sequence[str],
        nproc_per_node: int | None = None,
        hosts: int | None = None,
        env: dict[str, str] | None = None,
        echo: IO[str] | None = None,
        master_port: int = MASTER_PORT,
    ) -> ClusterRun:
        """Starts one torchrun per host (the first ``hosts``) with
        ``nproc_per_node`` ranks each (default: one per NIC); see ``run``."""
        n = hosts or self.hosts
        if not 1 <= n <= self.hosts:
            raise ClusterError(f"--hosts {n}: this cluster has {self.hosts}")
        per_node = nproc_per_node or self.nics
        base = dict(os.environ)
        base.update({
            "SMDDP_SOCKET_IFNAME": self.socket_ifname(),
            "GLOO_SOCKET_IFNAME": self.socket_ifname(),
            "PYTHONUNBUFFERED": "1",
        })
        base.update(env or {})
        commands = [self.enter(h) + self.torchrun_command(h, argv, per_node, n, master_port) for h in range(n)]
        return ClusterRun(self, commands, base, echo)

    def run(
        self,
        argv: Sequence[str],
        nproc_per_node: int | None = None,
        hosts: int | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        echo: IO[str] | None = None,
        master_port: int = MASTER_PORT,
        grace: float | None = 30,
    ) -> RunResult:
        """One torchrun per host; returns when every host is done, or after
        ``timeout`` seconds with every host's processes killed, or ``grace``
        seconds after a host failed (see ClusterRun.wait). Lines go to
        ``echo`` as they come, prefixed by the host."""
        return self.start(argv, nproc_per_node, hosts, env, echo, master_port).wait(timeout, grace)


class ClusterRun:
    """The torchruns of one ``Cluster.start``: ``wait`` for them, or ``stop`` them."""

    def __init__(self, cluster: Cluster, commands: list[list[str]], env: dict[str, str], echo: IO[str] | None):
        self.cluster = cluster
        self.outputs: list[list[str]] = [[] for _ in commands]
        self._echo = echo
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self._readers: list[threading.Thread] = []
        self._start = time.monotonic()
        # Hosts stopped after another failed (see wait).
        self.stopped: list[int] = []
        try:
            for h, cmd in enumerate(commands):
                p = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=env, text=True, errors="replace", start_new_session=True,
                )
                self._procs.append(p)
                t = threading.Thread(target=self._read, args=(h, p.stdout), name=f"cluster-h{h}", daemon=True)
                t.start()
                self._readers.append(t)
        except BaseException:
            self.stop()
            raise

    def _read(self, h: int, stream: IO[str]) -> None:
        for line in stream:
            line = line.rstrip("\n")
            with self._lock:
                self.outputs[h].append(line)
                if self._echo is not None:
                    self._echo.write(f"[h{h}] {line}\n")
                    self._echo.flush()

    def done(self) -> bool:
        return all(p.poll() is not None for p in self._procs)

    def wait(self, timeout: float | None = None, grace: float | None = 30) -> RunResult:
        """Waits for every host; past ``timeout`` seconds (from the start)
        kills every host's processes and reports exit status 124. Once a host
        failed, the others get ``grace`` seconds to fail or finish too (a
        job that lost a host may wait for it at its launcher's exit), then
        they are stopped and the failed hosts' status is the run's."""
        deadline = None if timeout is None else self._start + timeout
        timed_out = False
        failed_at = None
        try:
            while not self.done():
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    timed_out = True
                    break
                if failed_at is None and any(p.poll() not in (None, 0) for p in self._procs):
                    failed_at = now
                if failed_at is not None and grace is not None and now > failed_at + grace:
                    self.stopped = [h for h, p in enumerate(self._procs) if p.poll() is None]
                    break
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        if timed_out or self.stopped:
            self.stop()
        return self._result(timed_out)

    def stop(self) -> RunResult:
        """Kills every process on the hosts of this run."""
        for h in range(len(self._procs)):
            self.cluster.kill_host(h)
        for p in self._procs:
            try:
                p.kill()
            except OSError:
                pass
        return self._result(False)

    def _result(self, timed_out: bool) -> RunResult:
        codes = []
        for p in self._procs:
            rc = p.wait()
            codes.append(128 - rc if rc < 0 else rc)
        for t in self._readers:
            t.join(timeout=5)
        ended = [c for h, c in enumerate(codes) if h not in self.stopped]
        worst = 124 if timed_out else max(ended, default=0)
        with self._lock:
            outputs = [list(o) for o in self.outputs]
        return RunResult(worst, codes, outputs, timed_out, time.monotonic() - self._start, list(self.stopped))
