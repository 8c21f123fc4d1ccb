"""The demo's jobs as tests: separate processes (a scheduler, 2 servers, 2 workers), the
digits MLP to >= 95% test accuracy and the click-through-rate model with a 1 M-row
pscore.torch.Embedding. Every process is stopped by its pid; every wait has a deadline."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import wait_exit

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_job(procs, script, args, workers=2, servers=2, timeout=240):
    port = procs.scheduler(workers=workers, servers=servers)
    for i in range(servers):
        procs.python(f"server{i}", ["-m", "pscore.run", "server", f"--scheduler-port={port}", f"--node-id=server{i}"])
    ws = [procs.python(f"worker{i}", [str(EXAMPLES / script), f"--scheduler-port={port}", f"--node-id=worker{i}",
                                      *args]) for i in range(workers)]
    rcs = [wait_exit(w, timeout) for w in ws]
    logs = [procs.log(w) for w in ws]
    return rcs, logs


def test_digits_mlp_two_workers_two_servers(procs):
    rcs, logs = run_job(procs, "digits_mlp.py", [])
    assert rcs == [0, 0], logs
    finals = [re.search(r"final test_acc ([0-9.]+) .* weights_sum (\S+)", log) for log in logs]
    assert all(finals), logs
    assert all(float(f.group(1)) >= 0.95 for f in finals), logs
    # Synchronous: both workers end with the same weights (the servers').
    assert finals[0].group(2) == finals[1].group(2)
    assert sum(len(re.findall(r"worker \d epoch \d+/12 ", log)) for log in logs) == 24


def test_ctr_embedding_of_a_million_rows(procs):
    rcs, logs = run_job(procs, "ctr.py", ["--epochs=2", "--samples=20000", "--target=0.68"])
    assert rcs == [0, 0], logs
    assert "table of 1048576 rows" in "".join(logs)
    aucs = [float(m) for m in re.findall(r"final test_auc ([0-9.]+)", "".join(logs))]
    assert len(aucs) == 2 and min(aucs) >= 0.68, logs
    # A step pulls only the rows its batch touches: at most 256 samples x 4 fields.
    pulled = [float(m) for m in re.findall(r"rows pulled/step (\d+)", "".join(logs))]
    assert pulled and max(pulled) <= 1024, logs


def test_digits_scale_out_mid_training_ends_as_unscaled(procs, tmp_path):
    """Worker 0 asks for a third server after step 10; the test starts it once the
    scale-out began. Synchronous training ends with the weights of the unscaled run (equal
    up to the order in which the servers add the two workers' pushes)."""
    import time

    import pscore

    args = ["--epochs=1", "--target=0"]
    rcs, plain = run_job(procs, "digits_mlp.py", args)
    assert rcs == [0, 0], plain
    port = procs.scheduler(workers=2, servers=2)
    for i in range(2):
        procs.python(f"s-server{i}", ["-m", "pscore.run", "server", f"--scheduler-port={port}", f"--node-id=server{i}"])
    ws = [procs.python(f"s-worker{i}", [str(EXAMPLES / "digits_mlp.py"), f"--scheduler-port={port}",
                                        f"--node-id=worker{i}", "--scale-out-at=10", *args]) for i in range(2)]
    deadline = time.monotonic() + 120
    with pscore.AdminClient(port) as admin:
        while admin.status()["cluster_state"] != "CLUSTER_SCALE_OUT":
            assert time.monotonic() < deadline and all(w.poll() is None for w in ws), "no scale-out began"
            time.sleep(0.05)
        procs.python("s-server2", ["-m", "pscore.run", "server", f"--scheduler-port={port}", "--node-id=server2"])
        rcs = [wait_exit(w, 240) for w in ws]
        scaled = [procs.log(w) for w in ws]
        assert rcs == [0, 0], scaled
    assert "asked for a scale-out to 3 servers" in "".join(scaled)

    def final(logs):
        return sorted(float(re.search(r"weights_sum (\S+)", log).group(1)) for log in logs)

    for a, b in zip(final(plain), final(scaled)):
        assert abs(a - b) < 1e-3, (plain, scaled)


def test_digits_scale_in_mid_training_ends_as_unscaled(procs):
    """Worker 0 asks for one server fewer after step 10: server1 hands its parameters to
    server0 and exits 0. Synchronous training ends with the weights of the unscaled run."""
    args = ["--epochs=1", "--target=0"]
    rcs, plain = run_job(procs, "digits_mlp.py", args)
    assert rcs == [0, 0], plain
    port = procs.scheduler(workers=2, servers=2)
    servers = [procs.python(f"i-server{i}", ["-m", "pscore.run", "server", f"--scheduler-port={port}",
                                             f"--node-id=server{i}"]) for i in range(2)]
    ws = [procs.python(f"i-worker{i}", [str(EXAMPLES / "digits_mlp.py"), f"--scheduler-port={port}",
                                        f"--node-id=worker{i}", "--scale-in-at=10", *args]) for i in range(2)]
    rcs = [wait_exit(w, 240) for w in ws]
    scaled = [procs.log(w) for w in ws]
    assert rcs == [0, 0], scaled
    assert "asked for a scale-in to 1 servers" in "".join(scaled)
    assert [wait_exit(s, 60) for s in servers] == [0, 0], [procs.log(s) for s in servers]

    def final(logs):
        return sorted(float(re.search(r"weights_sum (\S+)", log).group(1)) for log in logs)

    for a, b in zip(final(plain), final(scaled)):
        assert abs(a - b) < 1e-3, (plain, scaled)
