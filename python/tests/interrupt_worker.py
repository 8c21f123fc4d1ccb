"""A worker process for test_procs: pushes a key, waits for the file `go`, then blocks in
a pull (its server is stopped by the test) until SIGINT. Prints what ended the pull."""

import os
import signal
import sys
import time

import numpy as np

import pscore

# Ctrl-C raises KeyboardInterrupt, as in a program started from a terminal: a launcher
# that started the test run in the background (sh's `cmd &`) leaves SIGINT ignored, and
# Python keeps an inherited SIG_IGN.
signal.signal(signal.SIGINT, signal.default_int_handler)
port, go = int(sys.argv[1]), sys.argv[2]
w = pscore.Worker(scheduler_port=port, node_id="w0", request_timeout=120.0, heartbeat_interval=0.2,
                  heartbeat_timeout=3.0)
w.start()
w.wait_ready(30)
w.push([1], np.ones(4, dtype=np.float32))
print("pushed", flush=True)
deadline = time.monotonic() + 30
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
print("pulling", flush=True)
t0 = time.monotonic()
try:
    w.pull([1])
    print("pull returned", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - t0:.2f} s", flush=True)
    w.close()
    sys.exit(0)
sys.exit(1)
