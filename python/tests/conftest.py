"""Fixtures: an in-process job (scheduler, servers, worker: each node has its own loop
thread) and helpers for jobs of separate processes. Every process a test starts is
stopped by its pid; every wait has a deadline; ports are ephemeral (0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import pscore

HB = dict(heartbeat_interval=0.2, heartbeat_timeout=3.0)


class Job:
    def __init__(self, servers: int = 1, rule: str = "sum", learning_rate: float = 0.01, handlers=None,
                 worker_opts=None):
        self.scheduler = pscore.Scheduler(worker_num=1, server_num=servers, **HB)
        self.scheduler.start()
        port = self.scheduler.port
        self.servers = []
        for i in range(servers):
            s = pscore.Server(rule=rule, learning_rate=learning_rate, scheduler_port=port, node_id=f"s{i}", **HB)
            for name, fn in (handlers or {}).items():
                s.register_handler(name, fn)
            s.start()
            self.servers.append(s)
        self.worker = pscore.Worker(scheduler_port=port, node_id="w0", **HB, **(worker_opts or {}))
        self.worker.start()
        self.worker.wait_ready(30)
        for s in self.servers:
            s.wait_ready(30)

    def close(self):
        self.worker.close()
        for s in self.servers:
            s.close()
        self.scheduler.close()


@pytest.fixture
def job():
    j = Job()
    yield j
    j.close()


@pytest.fixture
def job2():
    j = Job(servers=2)
    yield j
    j.close()


class Procs:
    """Processes of one test, each stopped by its pid at the end."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.procs = []

    def start(self, name, args, **kw):
        log = open(self.tmp / f"{name}.log", "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, **kw)
        p.log_path = self.tmp / f"{name}.log"
        self.procs.append(p)
        return p

    def python(self, name, args, **kw):
        return self.start(name, [sys.executable, *args], **kw)

    def scheduler(self, workers, servers):
        name = f"scheduler{sum(1 for p in self.procs if p.log_path.name.startswith('scheduler'))}"
        port_file = self.tmp / f"{name}.port"
        self.python(name, ["-m", "pscore.run", "scheduler", f"--workers={workers}",
                                  f"--servers={servers}", f"--port-file={port_file}"])
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert time.monotonic() < deadline, "scheduler did not write its port"
            time.sleep(0.05)
        return int(port_file.read_text())

    def log(self, p):
        return p.log_path.read_text()

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    yield ps
    ps.stop_all()


def wait_exit(p, timeout):
    """The process's exit code; fails the test if it has not exited by the deadline."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"process {p.args} did not exit within {timeout} s")
