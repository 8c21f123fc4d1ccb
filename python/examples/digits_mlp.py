"""Trains an MLP on scikit-learn's handwritten digits (8x8 images, 10 classes; shipped by
Debian's python3-sklearn, no download) through pscore: the weights live on the servers,
each worker trains on its shard of the training set and pushes gradients.

One worker process of a job (scripts/demo.sh starts the whole job):

    python3 digits_mlp.py --scheduler-port=PORT --node-id=worker0 [--epochs=N]

With --local the same model trains in this one process with no servers (the baseline of
scripts/bench.sh python). Prints a line per epoch and a final line; exits 0 when the test
accuracy reached --target.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits


def data(seed: int = 0):
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--scheduler-port", type=int, default=0)
    p.add_argument("--node-id", default="")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--mode", default="sync", choices=["sync", "async"])
    p.add_argument("--staleness", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--local", action="store_true", help="one process, no servers (baseline)")
    p.add_argument("--scale-out-at", type=int, default=-1,
                   help="worker rank 0 asks for one more server after this step (the operator starts it)")
    p.add_argument("--scale-in-at", type=int, default=-1,
                   help="worker rank 0 asks for one server fewer after this step (the highest rank leaves)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    xtr, ytr, xte, yte = data(a.seed)
    model = make_model(a.seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    worker = dp = None
    if a.local:
        rank, nworkers = 0, 1
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)
        name = "local"
    else:
        import pscore
        import pscore.torch as pst
        worker = pscore.Worker(scheduler_port=a.scheduler_port, node_id=a.node_id, heartbeat_interval=0.2,
                               heartbeat_timeout=3.0)
        worker.start()
        worker.wait_ready(60)
        rank, nworkers = worker.rank, worker.worker_count
        dp = pst.DataParallel(model, worker, lr=a.lr, mode=a.mode, staleness=a.staleness)
        dp.start()
        name = f"worker {rank}"
    # Each worker its shard, all shards the same length (synchronous steps line up).
    per = len(xtr) // nworkers
    xs, ys = xtr[rank * per:(rank + 1) * per], ytr[rank * per:(rank + 1) * per]
    steps = per // a.batch
    acc = 0.0
    samples, t_train = 0, 0.0
    step_no = 0
    for epoch in range(a.epochs):
        order = np.random.default_rng(a.seed * 1000 + epoch * 10 + rank).permutation(per)
        t0 = time.perf_counter()
        total = 0.0
        for s in range(steps):
            idx = order[s * a.batch:(s + 1) * a.batch]
            xb, yb = torch.from_numpy(xs[idx]), torch.from_numpy(ys[idx])
            loss = loss_fn(model(xb), yb)
            if dp is None:
                opt.zero_grad()
                loss.backward()
                opt.step()
            else:
                loss.backward()
                dp.step()
                step_no += 1
                if step_no == a.scale_out_at and rank == 0:
                    # Every push of this step is in (dp.step passed its barrier): the
                    # scale-out moves finished parameters; the next push and pull of every
                    # worker wait until the cluster is READY again.
                    servers = worker.server_count + 1
                    with pscore.AdminClient(a.scheduler_port) as admin:
                        r = admin.scale_out(servers=servers)
                    print(f"worker 0 asked for a scale-out to {servers} servers "
                          f"(membership version {r['epoch']})", flush=True)
                if step_no == a.scale_in_at and rank == 0:
                    # The count before the request: a scale-in may be done before it returns.
                    servers = worker.server_count - 1
                    with pscore.AdminClient(a.scheduler_port) as admin:
                        r = admin.scale_in(servers=servers)
                    print(f"worker 0 asked for a scale-in to {servers} servers "
                          f"(membership version {r['epoch']})", flush=True)
            total += float(loss)
        t_train += time.perf_counter() - t0
        samples += steps * a.batch
        acc = accuracy(model, xte, yte)
        print(f"{name} epoch {epoch + 1}/{a.epochs} loss {total / steps:.4f} test_acc {acc:.4f} "
              f"samples/s {samples / t_train:.0f}", flush=True)
    print(f"{name} final test_acc {acc:.4f} samples/s {samples / t_train:.0f} "
          f"weights_sum {float(sum(p.detach().double().sum() for p in model.parameters())):.6f}", flush=True)
    if worker is not None:
        worker.finish(120)
        worker.close()
    return 0 if acc >= a.target else 1


if __name__ == "__main__":
    sys.exit(main())
