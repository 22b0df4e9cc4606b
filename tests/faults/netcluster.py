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
import sys
import time
from pathlib import Path

from conftest import port_accepts_at
from test_cluster import Cluster

CONTROLLER_PORT = 9300
KAFKA_PORT = 9092
GRPC_PORT = 9093
METRICS_PORT = 9094
S3_PORT = 9000
# Each broker's data directory is a tmpfs of this size, mounted with this source name, so a
# test can fill it (and `sweep()` can find mounts a killed run left).
DISK_SIZE = "128m"
DISK_SOURCE = "sfx-disk"
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
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
    for line in Path("/proc/mounts").read_text().splitlines():
        source, target = line.split()[:2]
        if source == DISK_SOURCE:
            sh("umount", "-l", target, check=False)


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
    address, started with `ip netns exec`; and an S3-compatible server (moto_server) in a
    namespace of its own, node "s3", that the brokers tier to (`[cold]`, bucket "chaos"), so
    a test can cut the brokers off from the object store."""

    def __init__(self, binary, workdir: Path, lease_s: int, broker_extra: str = "", raft_heartbeat_ms: int = 100):
        self.net = Net([f"controller-{i}" for i in (1, 2, 3)] + [f"broker-{i}" for i in (1, 2, 3)] + ["s3"])
        self.s3_endpoint = f"http://{self.net.addr('s3')}:{S3_PORT}"
        self.bucket = "chaos"
        cold = (f'[cold]\nurl = "s3://{self.bucket}/strata"\nendpoint = "{self.s3_endpoint}"\npath_style = true\n'
                'interval = "200ms"\nrequest_timeout = "2s"\norphan_grace = "3s"\n'
                '[topics]\nretention_check_interval = "200ms"\n')
        super().__init__(binary, workdir, broker_extra=broker_extra + cold, lease_s=lease_s,
                         raft_heartbeat_ms=raft_heartbeat_ms)
        self.s3 = None
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

    def start_s3(self):
        """moto_server in namespace "s3", with the bucket made."""
        log = open(self.workdir / "s3.log", "ab")
        self.s3 = subprocess.Popen(
            ["ip", "netns", "exec", self.net.ns("s3"), sys.executable, "-m", "moto.server",
             "-H", self.net.addr("s3"), "-p", str(S3_PORT)], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not port_accepts_at(self.net.addr("s3"), S3_PORT):
            assert self.s3.poll() is None, "moto_server exited (see s3.log)"
            assert time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.1)
        self.s3_client().create_bucket(Bucket=self.bucket)

    def s3_client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.s3_endpoint, aws_access_key_id="test",
                            aws_secret_access_key="test", region_name="us-east-1",
                            config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2}))

    def data_dir(self, name):
        return self.workdir / name

    def start(self, name):
        os.environ.update(S3_ENV)  # the brokers' credentials for moto (any will do)
        d = self.data_dir(name)
        if name.startswith("broker") and not os.path.ismount(d):
            d.mkdir(parents=True, exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", DISK_SOURCE, str(d))
        super().start(name)

    def fill_disk(self, name):
        """Fills broker `name`'s data directory (a balloon file) until a write fails with
        ENOSPC. Returns the balloon's size."""
        path = self.data_dir(name) / "balloon"
        written = 0
        with open(path, "wb", buffering=0) as f:
            for chunk in (1 << 20, 4096):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                        written += chunk
                except OSError:
                    pass
        return written

    def free_disk(self, name):
        (self.data_dir(name) / "balloon").unlink(missing_ok=True)

    def start_all(self):
        self.start_s3()
        super().start_all()

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
            if self.s3 is not None and self.s3.poll() is None:
                self.s3.kill()
                self.s3.wait()
            self.net.teardown()
            for i in (1, 2, 3):
                if os.path.ismount(self.data_dir(f"broker-{i}")):
                    sh("umount", "-l", str(self.data_dir(f"broker-{i}")), check=False)
