"""A 3-controller + 3-broker cluster whose nodes each live in their own network namespace on
one bridge, so a test can cut the network between any two of them while every node stays
reachable from the test process (the clients) in the root namespace.

This kernel has no `tc` drop action and no iptables. A cut is made with permanent neighbour
entries: each side resolves the other's address to an unused MAC address, so their frames
go nowhere while every other pair keeps talking. Healing deletes the entries (ARP resolves
the real address again).

Everything created here (bridge, veths, namespaces) carries a per-run prefix and is removed
by `teardown()`, which the suite calls even when it fails; `sweep()` also removes leftovers
of earlier runs that were killed before they could clean up.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from test_cluster import Cluster

CONTROLLER_PORT = 9300
KAFKA_PORT = 9092
GRPC_PORT = 9093
METRICS_PORT = 9094
# An address nobody has: frames for a cut peer go here (and are dropped).
NOWHERE_MAC = "02:00:00:00:00:01"
SUBNET = "10.77.0"
PREFIX = "sfx"


def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def sweep():
    """Removes what a run that died before its teardown left: the processes still running in
    its namespaces (only those: they are this suite's nodes), the namespaces, the bridge."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX + "-"):
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
    # a namespace outlives its name while a process still runs in it, and so does its veth
    # pair: delete the root ends (that removes both)
    time.sleep(0.2)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        if len(fields) > 1:
            link = fields[1].strip().split("@")[0]
            if link.startswith(PREFIX + "v"):
                sh("ip", "link", "del", link, check=False)
    sh("ip", "link", "del", PREFIX + "br", check=False)


class Net:
    """The bridge and one namespace per node, with cuts between pairs."""

    def __init__(self, nodes):
        # node name -> (namespace, address)
        self.nodes = {}
        self.cuts = set()
        sweep()
        bridge = PREFIX + "br"
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        for k, name in enumerate(nodes):
            ns = f"{PREFIX}-{name}"
            addr = f"{SUBNET}.{10 + k}"
            veth = f"{PREFIX}v{k}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", bridge, "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            self.nodes[name] = (ns, addr)

    def addr(self, name):
        return self.nodes[name][1]

    def ns(self, name):
        return self.nodes[name][0]

    def cut(self, a, b):
        """Drops all traffic between nodes a and b (both directions)."""
        for x, y in ((a, b), (b, a)):
            sh("ip", "-n", self.ns(x), "neigh", "replace", self.addr(y), "lladdr", NOWHERE_MAC,
               "dev", "eth0", "nud", "permanent")
        self.cuts.add(frozenset((a, b)))

    def heal(self, a, b):
        for x, y in ((a, b), (b, a)):
            sh("ip", "-n", self.ns(x), "neigh", "del", self.addr(y), "dev", "eth0", check=False)
        self.cuts.discard(frozenset((a, b)))

    def heal_all(self):
        for pair in list(self.cuts):
            self.heal(*pair)

    def teardown(self):
        for ns, _ in self.nodes.values():
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", PREFIX + "br", check=False)


class NetCluster(Cluster):
    """`test_cluster.Cluster` with every node in its own namespace, on fixed ports at its own
    address, started with `ip netns exec`."""

    def __init__(self, binary, workdir: Path, lease_s: int, broker_extra: str = ""):
        self.net = Net([f"controller-{i}" for i in (1, 2, 3)] + [f"broker-{i}" for i in (1, 2, 3)])
        super().__init__(binary, workdir, broker_extra=broker_extra, lease_s=lease_s)
        self.controller_ports = {i: CONTROLLER_PORT for i in (1, 2, 3)}
        self.broker_ports = {i: KAFKA_PORT for i in (1, 2, 3)}
        self.grpc_ports = {i: GRPC_PORT for i in (1, 2, 3)}
        self.metrics_ports = {i: METRICS_PORT for i in (1, 2, 3)}

    def controller_addr(self, i):
        return f"{self.net.addr(f'controller-{i}')}:{CONTROLLER_PORT}"

    def broker_addr(self, i):
        return f"{self.net.addr(f'broker-{i}')}:{KAFKA_PORT}"

    def bootstrap(self):
        return ",".join(self.broker_addr(i) for i in (1, 2, 3))

    def host(self, name):
        return self.net.addr(name)

    def launcher(self, name):
        # `ip netns exec` execs the binary: the process handle is the node itself
        return ["ip", "netns", "exec", self.net.ns(name)]

    def freshest_metadata(self):
        """The metadata of the controller that has applied the most (a cut-off controller's
        copy may be stale)."""
        best = None
        for i in (1, 2, 3):
            if f"controller-{i}" not in self.procs:
                continue
            try:
                # a paused controller does not answer: ask the others
                r = subprocess.run([self.binary, "quorum", "--controller", self.controller_addr(i), "metadata"],
                                   capture_output=True, text=True, timeout=3)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode != 0:
                continue
            m = json.loads(r.stdout)
            if best is None or m.get("version", 0) > best.get("version", 0):
                best = m
        assert best is not None, "no controller answered"
        return best

    def teardown(self):
        try:
            for p in self.procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)  # a paused node must hear SIGTERM
            self.stop_all()
        finally:
            self.net.teardown()
