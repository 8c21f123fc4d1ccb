"""Jobs of separate processes: a pull blocked on a stopped server releases the GIL and is
interrupted by SIGINT (Ctrl-C)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pscore

from conftest import HB, wait_exit

HERE = Path(__file__).parent


def wait_for_line(procs, p, text, timeout=30):
    deadline = time.monotonic() + timeout
    while text not in procs.log(p):
        assert p.poll() is None, f"process exited: {procs.log(p)}"
        assert time.monotonic() < deadline, f"no '{text}' in {procs.log(p)}"
        time.sleep(0.02)


def test_pull_blocked_on_a_stopped_server_releases_the_gil(procs):
    port = procs.scheduler(workers=1, servers=1)
    server = procs.python("server", ["-m", "pscore.run", "server", f"--scheduler-port={port}", "--node-id=s0"])
    with pscore.Worker(scheduler_port=port, node_id="w0", request_timeout=1.5, **HB) as w:
        w.start()
        w.wait_ready(30)
        w.push([1], np.ones(4, dtype=np.float32))
        os.kill(server.pid, signal.SIGSTOP)
        count = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1

        th = threading.Thread(target=spin)
        th.start()
        try:
            start = count[0]
            with pytest.raises(pscore.Timeout):
                w.pull([1])  # the server answers nothing: blocks until request_timeout
            advanced = count[0] - start
        finally:
            stop.set()
            th.join(5)
        os.kill(server.pid, signal.SIGCONT)
        assert advanced > 1000


def test_ctrl_c_interrupts_a_blocking_pull(procs, tmp_path):
    port = procs.scheduler(workers=1, servers=1)
    server = procs.python("server", ["-m", "pscore.run", "server", f"--scheduler-port={port}", "--node-id=s0"])
    go = tmp_path / "go"
    worker = procs.python("worker", [str(HERE / "interrupt_worker.py"), str(port), str(go)])
    wait_for_line(procs, worker, "pushed")
    os.kill(server.pid, signal.SIGSTOP)
    go.write_text("1")
    wait_for_line(procs, worker, "pulling")
    time.sleep(0.3)  # let it enter the pull
    os.kill(worker.pid, signal.SIGINT)
    rc = wait_exit(worker, 20)  # the pull's own deadline is 120 s
    assert rc == 0, procs.log(worker)
    assert "interrupted after" in procs.log(worker)
    os.kill(server.pid, signal.SIGCONT)
