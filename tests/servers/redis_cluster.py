"""Three Redis nodes in cluster mode on loopback: a throwaway Redis Cluster.

The nodes are joined through redis-py (the commands ``redis-cli --cluster create`` sends), so
unlike the rest of this package this module needs the virtualenv; ``tests.servers`` does not
import it, and ``make servers`` runs without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from tests.servers.debian import require_binary
from tests.servers.processes import HOST, START_ATTEMPTS, ServerStartError, accepts, free_port


class Cluster:
    """Three Redis nodes on loopback, cluster mode, slots split in thirds, no replicas."""

    NODES = 3

    def __init__(self) -> None:
        self.binary = require_binary("redis-server")
        self.tmpdir = tempfile.mkdtemp(prefix="bucketry-cluster-")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        self.bus_ports: list[int] = []
        try:
            for n in range(self.NODES):
                self._start_node(n)
            self._join()
        except BaseException:
            self.stop()
            raise

    def _start_node(self, n: int) -> None:
        folder = os.path.join(self.tmpdir, str(n))
        os.mkdir(folder)
        for _attempt in range(START_ATTEMPTS):
            port, bus = free_port(), free_port()
            argv = [self.binary, "--port", str(port), "--cluster-port", str(bus)]
            argv += ["--bind", HOST, "--cluster-enabled", "yes", "--dir", folder]
            argv += ["--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no"]
            with open(os.path.join(folder, "log"), "ab") as log:
                proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=folder,
                    start_new_session=True,
                )
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline:
                if accepts(HOST, port):
                    self.procs.append(proc)
                    self.ports.append(port)
                    self.bus_ports.append(bus)
                    return
                time.sleep(0.02)
            proc.kill()
            proc.wait(10)
        raise ServerStartError(f"cluster node {n} did not start: see {folder}/log")

    def _join(self) -> None:
        """What ``redis-cli --cluster create`` does: epochs, slot ranges, MEET, then wait."""
        nodes = [redis.Redis(host=HOST, port=port, socket_timeout=5) for port in self.ports]
        bounds = [REDIS_CLUSTER_HASH_SLOTS * n // self.NODES for n in range(self.NODES + 1)]
        try:
            for n, node in enumerate(nodes):
                node.execute_command("CLUSTER", "SET-CONFIG-EPOCH", n + 1)
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", bounds[n], bounds[n + 1] - 1)
            for port, bus in zip(self.ports[1:], self.bus_ports[1:], strict=True):
                nodes[0].execute_command("CLUSTER", "MEET", HOST, port, bus)
            deadline = time.monotonic() + 20
            while not all(
                b"cluster_state:ok" in n.execute_command("CLUSTER", "INFO") for n in nodes
            ):
                if time.monotonic() > deadline:
                    raise ServerStartError("the cluster did not reach cluster_state:ok in 20 s")
                time.sleep(0.05)
        finally:
            for node in nodes:
                node.close()

    def keys_by_node(self) -> list[list[bytes]]:
        """Every key of each node (``KEYS *``: a test cluster holds a few hundred)."""
        out = []
        for port in self.ports:
            with redis.Redis(host=HOST, port=port) as node:
                out.append(sorted(node.keys("*")))
        return out

    def flush(self) -> None:
        for port in self.ports:
            with redis.Redis(host=HOST, port=port) as node:
                node.flushall()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
