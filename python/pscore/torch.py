"""PyTorch over pscore: dense data-parallel training and a sparse embedding table.

Both expect servers with the ``"sum"`` rule (``pscore.Server(rule="sum")``, or
``python3 -m pscore.run server``): a worker pushes the change it wants applied
(``-lr * gradient / num_workers``), so the servers hold the weights and plain SGD over
all workers' gradients results, and the first push of a key (its initial value) is
stored exactly.

- :class:`DataParallel` registers a model's parameters as keys, makes them views of one
  flat buffer that :meth:`pscore.Worker.pull_into` writes in place, and accumulates the
  gradients of ``backward()`` into a second flat buffer that is pushed as it is.
- :class:`Embedding` is a table of ``num_embeddings`` rows of ``dim`` floats, one key a
  row, held by the servers: a forward pass pulls only the rows the batch touches, and
  :meth:`Embedding.push_gradients` (called by ``DataParallel.step``) pushes their
  gradients.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import numpy as np
import torch

import pscore

__all__ = ["DataParallel", "Embedding"]


def _worker_ids(worker: pscore.Worker) -> List[str]:
    return sorted(worker.node_ids("worker"))


class Embedding(torch.nn.Module):
    """An embedding table served by pscore: row ``i`` is key ``key_base + i`` of ``dim``
    floats on its server (keys spread over servers by pscore/core/key_range.h).

    ``forward(indices)`` pulls the distinct rows of the batch into one tensor (through
    ``pull_into``) and returns the embeddings of ``indices``; after ``backward()``,
    ``push_gradients()`` pushes ``-lr * grad / num_workers`` for those rows only.
    Call ``initialize()`` once per job (on every worker: rank 0 writes the rows, the
    others wait on a barrier) before the first forward pass.
    """

    def __init__(self, num_embeddings: int, dim: int, worker: pscore.Worker, lr: float = 0.1,
                 key_base: int = 1 << 40, num_workers: Optional[int] = None, init_std: float = 0.01,
                 seed: int = 0, name: str = "emb") -> None:
        super().__init__()
        self.num_embeddings = int(num_embeddings)
        self.dim = int(dim)
        self.worker = worker
        self.lr = float(lr)
        self.key_base = int(key_base)
        self.num_workers = num_workers
        self.init_std = float(init_std)
        self.seed = int(seed)
        self.name = name
        self._keys: Optional[np.ndarray] = None
        self._rows: Optional[torch.Tensor] = None
        self.rows_pulled = 0  # rows pulled in all (for reports)

    def initialize(self, chunk_rows: int = 1 << 16, timeout: float = 600.0) -> None:
        """Writes the table's initial values (normal, ``init_std``) from worker rank 0 in
        chunks of ``chunk_rows`` rows; every worker returns once they are on the servers."""
        if self.worker.rank == 0:
            gen = np.random.default_rng(self.seed)
            for start in range(0, self.num_embeddings, chunk_rows):
                n = min(chunk_rows, self.num_embeddings - start)
                keys = np.arange(self.key_base + start, self.key_base + start + n, dtype=np.uint64)
                vals = (gen.standard_normal(n * self.dim) * self.init_std).astype(np.float32)
                self.worker.push(keys, vals)
        self.worker.barrier(f"pscore.embedding.{self.name}.init", timeout, _worker_ids(self.worker))

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        flat = indices.reshape(-1)
        uniq, inverse = torch.unique(flat, return_inverse=True)
        keys = uniq.numpy().astype(np.uint64) + np.uint64(self.key_base)
        rows = torch.empty(len(keys), self.dim)
        self.worker.pull_into(keys, rows)
        self.rows_pulled += len(keys)
        rows.requires_grad_(True)
        self._keys, self._rows = keys, rows
        return rows[inverse].reshape(*indices.shape, self.dim)

    def push_gradients(self) -> None:
        """Pushes ``-lr * grad / num_workers`` of the rows the last forward pass touched."""
        if self._rows is None or self._rows.grad is None:
            return
        n = self.num_workers or len(_worker_ids(self.worker))
        g = self._rows.grad
        g.mul_(-self.lr / n)
        self.worker.push(self._keys, g)
        self._keys, self._rows = None, None


class DataParallel:
    """Dense data-parallel training of ``model`` through the servers.

    The model's parameters become keys ``key_base, key_base + 1, ...`` (one a parameter
    tensor, in ``model.parameters()`` order) and views of one flat float32 buffer, so a
    pull writes them in place; their ``.grad`` become views of a second flat buffer that
    ``backward()`` accumulates into. Per step::

        loss.backward()
        dp.step()          # push -lr*grad/num_workers, [barrier], pull the weights

    ``mode="sync"``: all workers' pushes of a step are in before anyone pulls, and all have
    pulled before anyone pushes the next step (two barriers a step), so every worker
    computes each step on the same weights (synchronous SGD).
    ``mode="async"`` with ``staleness=s``: the barrier is passed only every ``s + 1``
    steps, so workers run at most ``s`` steps apart and pull whatever the servers hold
    (bounded staleness). ``embeddings`` push their row gradients in the same step.
    Call ``start()`` once on every worker (rank 0's weights become the initial weights).
    """

    def __init__(self, model: torch.nn.Module, worker: pscore.Worker, lr: float, key_base: int = 0,
                 mode: str = "sync", staleness: int = 0, embeddings: Iterable[Embedding] = (),
                 num_workers: Optional[int] = None, barrier_timeout: float = 600.0, name: str = "dp") -> None:
        if mode not in ("sync", "async"):
            raise pscore.InvalidArgument("invalid_argument: mode must be sync or async, not " + repr(mode))
        if staleness < 0:
            raise pscore.InvalidArgument("invalid_argument: staleness must be >= 0")
        self.model = model
        self.worker = worker
        self.lr = float(lr)
        self.mode = mode
        self.staleness = 0 if mode == "sync" else int(staleness)
        self.embeddings = list(embeddings)
        self.barrier_timeout = barrier_timeout
        self.name = name
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.lens = [p.numel() for p in self.params]
        self.keys = np.arange(key_base, key_base + len(self.params), dtype=np.uint64)
        total = sum(self.lens)
        self.flat = torch.zeros(total)
        self.flat_grad = torch.zeros(total)
        off = 0
        with torch.no_grad():
            for p, n in zip(self.params, self.lens):
                self.flat[off:off + n].copy_(p.data.reshape(-1))
                p.data = self.flat[off:off + n].view_as(p)
                p.grad = self.flat_grad[off:off + n].view_as(p)
                off += n
        self.workers = _worker_ids(worker)
        self.num_workers = num_workers or len(self.workers)
        self.steps = 0

    def start(self) -> None:
        """Rank 0 pushes the model's weights as the initial values; then every worker pulls
        them (all workers start from the same weights)."""
        if self.worker.rank == 0:
            self.worker.push(self.keys, self.flat, self.lens)
        self.worker.barrier(f"pscore.{self.name}.init", self.barrier_timeout, self.workers)
        self.pull()

    def pull(self) -> None:
        """Pulls the weights into the model's parameters (in place)."""
        self.worker.pull_into(self.keys, self.flat, self.lens)

    def zero_grad(self) -> None:
        self.flat_grad.zero_()

    def step(self) -> None:
        """Pushes this worker's gradients (and the embeddings'), waits for the other
        workers as the mode says, pulls the new weights and zeroes the gradients."""
        if self.mode == "sync" and self.num_workers > 1:
            # Every worker has pulled the last step's weights before anyone changes them.
            self.worker.barrier(f"pscore.{self.name}.pulled", self.barrier_timeout, self.workers)
        self.flat_grad.mul_(-self.lr / self.num_workers)
        self.worker.push(self.keys, self.flat_grad, self.lens)
        for e in self.embeddings:
            e.push_gradients()
        self.steps += 1
        if self.steps % (self.staleness + 1) == 0:
            self.worker.barrier(f"pscore.{self.name}.step", self.barrier_timeout, self.workers)
        self.pull()
        self.flat_grad.zero_()

    def parameters_vector(self) -> torch.Tensor:
        """The flat weights (the model's parameters' storage)."""
        return self.flat
