"""Linux network namespaces for shaped multi-rank runs (root only).

Topology: one namespace per rank plus a switch namespace holding a bridge;
each rank's veth pair joins the bridge.  With a bandwidth, both directions of
every rank's link are shaped with ``tc tbf`` (egress of the rank end and of
the switch end).  Latency is not set here: ``tc netem`` is missing from the
CI kernels, so the Comm layer injects it.  Addresses live only inside the
namespaces this run creates; everything is deleted on exit, also after an
error or a signal.  Namespace names carry the launcher's pid
(``cb-<pid>-<hex>-sw``, ``cb-<pid>-<hex>-r<rank>``), so that what a killed
launcher left is found and removed later (:mod:`harness.leftovers`).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import uuid

from .comm.pacer import tbf_burst_bytes
from .config import parse_rate

SUBNET = "10.231.0"
_NAME = re.compile(r"^cb-(\d+)-[0-9a-f]{6}-(sw|r\d+)$")


class NetnsError(RuntimeError):
    pass


def unavailable_reason() -> str | None:
    """Why namespaced runs cannot work here, or None when they can."""
    if os.name != "posix" or not os.path.exists("/proc/self/ns/net"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run as root or drop --net netns"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (package iproute2)"
    return None


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def shape(dev: str, rate_bps: float | None, mtu: int = 1500, ns: str | None = None) -> None:
    """Shape the egress of ``dev`` (in namespace ``ns``, else the caller's) with ``tc tbf`` at
    ``rate_bps``, or take its shaping off (None).

    The bucket holds one timer tick's worth (HZ = 250 here) and a few MTUs, but no more
    (``pacer.tbf_burst_bytes``, which the pacer's bucket copies): a large bucket lets a whole
    step's messages through at full speed and the link would not look shaped.  The queue bound
    (latency) is generous so TCP is paced, not dropped."""
    prefix = ["ip", "netns", "exec", ns] if ns else []
    if rate_bps is None:
        # a veth starts with no root qdisc; deleting one it does not have is not an error here
        _sh(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        return
    _sh(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(rate_bps)}bit",
        "burst", str(tbf_burst_bytes(rate_bps, mtu)), "latency", "200ms")


_CLONE_NEWNET = 0x40000000


def enter(ns: str) -> None:
    """Move the calling thread into namespace ``ns`` (root only); the threads and processes it
    starts after are there too.  For a process that starts its sockets after this (a benchmark's
    spawned rank; the launcher's ranks start under ``ip netns exec`` instead).  Its ``/sys`` still
    shows the namespace it came from: ``rank_meters.interface_bytes`` reads ``/proc``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise NetnsError(f"cannot enter network namespace {ns}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


class NetnsTopology:
    """Context manager creating (and always removing) a star of rank namespaces."""

    def __init__(self, world_size: int, bandwidth: str | None = None, mtu: int = 1500):
        if world_size < 1 or world_size > 250:
            raise NetnsError(f"world size {world_size} does not fit one /24 subnet")
        self.world_size = world_size
        self.bandwidth = bandwidth
        self.rate_bps = parse_rate(bandwidth) if bandwidth else None
        self.mtu = mtu
        self.tag = f"cb-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.tag}-sw"
        self.created: list[str] = []

    def ns(self, rank: int) -> str:
        return f"{self.tag}-r{rank}"

    def ifname(self, rank: int) -> str:
        return f"cbp{rank}"

    def addr(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def exec_prefix(self, rank: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(rank)]

    def _tbf(self, ns: str, dev: str) -> None:
        shape(dev, self.rate_bps, self.mtu, ns=ns)

    def _quiet(self, ns: str) -> None:
        # No IPv6 chatter (router/neighbour discovery) on the counted links.
        for key in ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"):
            _sh("ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}=1", check=False)

    def __enter__(self) -> NetnsTopology:
        why = unavailable_reason()
        if why:
            raise NetnsError(why)
        try:
            _sh("ip", "netns", "add", self.switch)
            self.created.append(self.switch)
            self._quiet(self.switch)
            _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for r in range(self.world_size):
                ns, host, peer = self.ns(r), f"{self.tag[-6:]}h{r}", f"{self.tag[-6:]}p{r}"
                _sh("ip", "netns", "add", ns)
                self.created.append(ns)
                self._quiet(ns)
                _sh("ip", "link", "add", host, "mtu", str(self.mtu), "type", "veth",
                    "peer", "name", peer, "mtu", str(self.mtu))
                _sh("ip", "link", "set", host, "netns", self.switch)
                _sh("ip", "link", "set", peer, "netns", ns)
                _sh("ip", "-n", ns, "link", "set", peer, "name", self.ifname(r))
                _sh("ip", "-n", self.switch, "link", "set", host, "master", "br0")
                _sh("ip", "-n", self.switch, "link", "set", host, "up")
                _sh("ip", "-n", ns, "addr", "add", f"{self.addr(r)}/24", "dev", self.ifname(r))
                _sh("ip", "-n", ns, "link", "set", self.ifname(r), "up")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                if self.rate_bps:
                    self._tbf(ns, self.ifname(r))
                    self._tbf(self.switch, host)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for ns in reversed(self.created):
            _sh("ip", "netns", "del", ns, check=False)
        self.created.clear()

    def __exit__(self, *exc) -> None:
        self.close()


def leftover_namespaces() -> list[str]:
    """Namespaces named like ours that still exist (for checks and cleanup)."""
    p = _sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.startswith("cb-")]


def namespace_owners() -> dict[int, list[str]]:
    """Namespaces named exactly like ours, by the pid of the launcher that made them."""
    if shutil.which("ip") is None:
        return {}
    owners: dict[int, list[str]] = {}
    for name in leftover_namespaces():
        m = _NAME.match(name)
        if m:
            owners.setdefault(int(m.group(1)), []).append(name)
    return owners


def delete_namespaces_of(pid: int) -> list[str]:
    """Delete the namespaces launcher ``pid`` made (their veths and bridge go with them)."""
    gone = []
    for name in namespace_owners().get(pid, []):
        if _sh("ip", "netns", "del", name, check=False).returncode == 0:
            gone.append(name)
    return gone
