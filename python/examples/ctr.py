"""A click-through-rate model with a pscore.torch.Embedding of 1,048,576 rows (4 fields of
262,144 ids each, 8 floats a row: 32 MiB of table on the servers) on generated data:
ids follow a power law (a few hot ids, a long tail), every id has a hidden weight, and
a click happens with probability sigmoid(sum of the hidden weights of the sample's ids).
A worker pulls only the rows its batch touches and pushes their gradients.

One worker process of a job (scripts/demo.sh starts the whole job):

    python3 ctr.py --scheduler-port=PORT --node-id=worker0 [--epochs=N]

Prints a line per epoch (log loss and AUC on held-out data, the AUC of the hidden
weights themselves for reference) and exits 0 when the test AUC reached --target.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

FIELDS = 4
IDS_PER_FIELD = 1 << 18
ROWS = FIELDS * IDS_PER_FIELD  # 1,048,576
DIM = 8


def generate(n: int, seed: int, truth_seed: int = 7):
    rng = np.random.default_rng(seed)
    truth = np.random.default_rng(truth_seed).normal(0.0, 1.5, ROWS).astype(np.float32)
    u = rng.random((n, FIELDS))
    ids = np.minimum((IDS_PER_FIELD * u ** 8).astype(np.int64), IDS_PER_FIELD - 1)
    rows = ids + np.arange(FIELDS, dtype=np.int64) * IDS_PER_FIELD
    logit = truth[rows].sum(1) - 0.5
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return rows, y, logit


class Tower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FIELDS * DIM, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, emb):  # emb: (batch, FIELDS, DIM)
        return self.net(emb.reshape(emb.shape[0], -1)).squeeze(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--scheduler-port", type=int, default=0)
    p.add_argument("--node-id", default="")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=60000, help="training samples per worker")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--emb-lr", type=float, default=50.0)
    p.add_argument("--target", type=float, default=0.72)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    import pscore
    import pscore.torch as pst
    worker = pscore.Worker(scheduler_port=a.scheduler_port, node_id=a.node_id, heartbeat_interval=0.2,
                           heartbeat_timeout=3.0)
    worker.start()
    worker.wait_ready(60)
    rank = worker.rank
    torch.manual_seed(a.seed)
    tower = Tower()
    emb = pst.Embedding(ROWS, DIM, worker, lr=a.emb_lr, key_base=1 << 40, seed=a.seed, name="ctr")
    t0 = time.perf_counter()
    emb.initialize()
    print(f"worker {rank} ctr: table of {ROWS} rows x {DIM} on {worker.server_count} servers "
          f"initialized in {time.perf_counter() - t0:.1f} s", flush=True)
    dp = pst.DataParallel(tower, worker, lr=a.lr, key_base=1 << 20, embeddings=[emb], name="ctr")
    dp.start()
    rows, y, _ = generate(a.samples, seed=100 + rank)
    test_rows, test_y, test_logit = generate(20000, seed=99)
    oracle = roc_auc_score(test_y, test_logit)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    steps = a.samples // a.batch
    auc = 0.0
    for epoch in range(a.epochs):
        order = np.random.default_rng(epoch * 10 + rank).permutation(a.samples)
        t0 = time.perf_counter()
        pulled0 = emb.rows_pulled
        for s in range(steps):
            idx = order[s * a.batch:(s + 1) * a.batch]
            logits = tower(emb(torch.from_numpy(rows[idx])))
            loss = loss_fn(logits, torch.from_numpy(y[idx]))
            loss.backward()
            dp.step()
        dt = time.perf_counter() - t0
        pulled = (emb.rows_pulled - pulled0) / steps
        with torch.no_grad():
            pred = torch.cat([tower(emb(torch.from_numpy(test_rows[i:i + 4096])))
                              for i in range(0, len(test_rows), 4096)])
            emb._rows = None  # evaluation pushes nothing
            test_loss = float(loss_fn(pred, torch.from_numpy(test_y)))
        auc = roc_auc_score(test_y, pred.numpy())
        print(f"worker {rank} ctr epoch {epoch + 1}/{a.epochs} test_logloss {test_loss:.4f} test_auc {auc:.4f} "
              f"(hidden weights: {oracle:.4f}) rows pulled/step {pulled:.0f} "
              f"samples/s {steps * a.batch / dt:.0f}", flush=True)
    print(f"worker {rank} ctr final test_auc {auc:.4f}", flush=True)
    worker.finish(120)
    worker.close()
    return 0 if auc >= a.target else 1


if __name__ == "__main__":
    sys.exit(main())
