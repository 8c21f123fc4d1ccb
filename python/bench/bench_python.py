"""scripts/bench.sh python: the Python binding against the C++ API, in the same run.

- push / pull_into of one key of 4 KiB, 1 MiB and 16 MiB numpy arrays from Python, and
  the same loop in C++ (ZPush, PullInto) on the same worker and servers: MB/s and the
  ratio Python / C++ (1.0 = as fast as C++);
- 64 B pull latency p50 from Python (pull, pull_into) and from C++ (Pull): ratio;
- MLP samples/s (python/examples/digits_mlp.py) through pscore (a job of 1 scheduler,
  1 server, 1 worker as processes) against the same model trained in one process with no
  server: ratio.
Figures are printed one per line as `name value unit`. --smoke: tiny sizes, for CI.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import pscore
from pscore import _pscore

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def fig(name, value, unit):
    print(f"{name} {value:.4g} {unit}", flush=True)


def dataplane(w, sizes, iters, rounds):
    """Rounds alternate Python and C++ (the same n calls each), so load on the machine
    hits both alike; each figure is the median over the rounds."""
    for label, floats in sizes:
        key = 1000 + floats  # a key of its own per size
        arr = np.full(floats, 0.001, dtype=np.float32)
        out = np.empty(floats, dtype=np.float32)
        w.push([key], arr)
        lens = w.pull_into([key], out)
        n = max(iters // 2, min(iters * 8, iters * (1 << 20) // max(floats * 4, 1 << 16)))
        py_push, py_pull, cpp_push, cpp_pull = [], [], [], []
        for r in range(rounds + 1):  # round 0 warms both paths up and is not counted
            t0 = time.perf_counter()
            for _ in range(n):
                w.push([key], arr)
            t1 = time.perf_counter()
            for _ in range(n):
                w.pull_into([key], out, lens)
            t2 = time.perf_counter()
            a, b = _pscore._cpp_push_pull(w, key, floats, n)
            if r == 0:
                continue
            py_push.append((t1 - t0) / n)
            py_pull.append((t2 - t1) / n)
            cpp_push.append(a)
            cpp_pull.append(b)
        med = statistics.median
        mb = floats * 4 / 1e6
        fig(f"python_push_{label}", mb / med(py_push), "MB/s")
        fig(f"cpp_push_{label}", mb / med(cpp_push), "MB/s")
        fig(f"ratio_push_{label}", med(cpp_push) / med(py_push), "x (python/cpp throughput)")
        fig(f"python_pull_into_{label}", mb / med(py_pull), "MB/s")
        fig(f"cpp_pull_into_{label}", mb / med(cpp_pull), "MB/s")
        fig(f"ratio_pull_{label}", med(cpp_pull) / med(py_pull), "x (python/cpp throughput)")


def latency(w, iters):
    keys = [7]
    w.push(keys, np.ones(16, dtype=np.float32))  # 64 B
    out = np.empty(16, dtype=np.float32)
    for _ in range(20):
        w.pull(keys)
    py, py_into, cpp = [], [], []
    chunk = max(1, iters // 10)
    for _ in range(0, iters, chunk):  # alternating chunks of Python and C++ calls
        for _ in range(chunk):
            t0 = time.perf_counter()
            w.pull(keys)
            py.append(time.perf_counter() - t0)
        for _ in range(chunk):
            t0 = time.perf_counter()
            w.pull_into(keys, out)
            py_into.append(time.perf_counter() - t0)
        cpp += _pscore._cpp_pull_latencies(w, keys, chunk)
    p50 = statistics.median
    fig("python_pull_64B_p50", p50(py) * 1e6, "us")
    fig("python_pull_into_64B_p50", p50(py_into) * 1e6, "us")
    fig("cpp_pull_64B_p50", p50(cpp) * 1e6, "us")
    fig("ratio_pull_64B_p50", p50(py) / p50(cpp), "x (python/cpp, lower is better)")


def mlp(epochs, reps):
    """Best samples/s of `reps` runs each, alternating: one process with no server, and
    one worker through pscore (1 scheduler, 1 server as processes)."""
    base = got = 0.0
    for _ in range(reps):
        base = max(base, mlp_local(epochs))
        got = max(got, mlp_pscore(epochs))
    fig("mlp_local_samples", base, "samples/s")
    fig("mlp_pscore_samples", got, "samples/s")
    fig("ratio_mlp_samples", got / base, "x (pscore/local)")


def mlp_local(epochs):
    local = subprocess.run([sys.executable, str(EXAMPLES / "digits_mlp.py"), "--local", f"--epochs={epochs}",
                            "--batch=64", "--target=0"], capture_output=True, text=True, timeout=600)
    return float(re.search(r"final .* samples/s (\d+)", local.stdout).group(1))


def mlp_pscore(epochs):
    py = sys.executable
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        procs = [subprocess.Popen([py, "-m", "pscore.run", "scheduler", "--workers=1", "--servers=1",
                                   f"--port-file={port_file}"], env=env, stdout=subprocess.DEVNULL)]
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("scheduler did not start")
                time.sleep(0.05)
            port = port_file.read_text()
            procs.append(subprocess.Popen([py, "-m", "pscore.run", "server", f"--scheduler-port={port}"], env=env,
                                          stdout=subprocess.DEVNULL))
            job = subprocess.run([py, str(EXAMPLES / "digits_mlp.py"), f"--scheduler-port={port}", "--node-id=w0",
                                  f"--epochs={epochs}", "--batch=64", "--target=0"], capture_output=True, text=True,
                                 timeout=600, env=env)
            got = float(re.search(r"final .* samples/s (\d+)", job.stdout).group(1))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        sizes, iters, rounds, lat_iters, epochs, reps = [("4KiB", 1024), ("1MiB", 1 << 18)], 2, 1, 50, 1, 1
    else:
        sizes, iters, rounds, lat_iters = [("4KiB", 1024), ("1MiB", 1 << 18), ("16MiB", 1 << 22)], 20, 7, 2000
        epochs, reps = 3, 2
    hb = dict(heartbeat_interval=0.5, heartbeat_timeout=5.0)
    with pscore.Scheduler(worker_num=1, server_num=1, **hb) as s:
        s.start()
        with pscore.Server(rule="sum", scheduler_port=s.port, **hb) as srv, \
                pscore.Worker(scheduler_port=s.port, **hb) as w:
            srv.start()
            w.start()
            w.wait_ready(30)
            dataplane(w, sizes, iters, rounds)
            latency(w, lat_iters)
    mlp(epochs, reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
