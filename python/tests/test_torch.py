"""pscore.torch against an in-process job (one worker, two servers with the sum rule)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pscore
import pscore.torch as pst


def test_data_parallel_pulls_in_place_and_applies_sgd(job2):
    w = job2.worker
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    before = [p.detach().clone() for p in model.parameters()]
    dp = pst.DataParallel(model, w, lr=0.1)
    dp.start()
    ptrs = [p.data_ptr() for p in model.parameters()]
    # The servers hold the model's initial weights.
    for key, p0 in zip(dp.keys, before):
        np.testing.assert_array_equal(w.pull([int(key)]), p0.numpy().reshape(-1))
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    assert any(float(g.abs().sum()) > 0 for g in grads)
    dp.step()
    for p, p0, g, ptr in zip(model.parameters(), before, grads, ptrs):
        assert p.data_ptr() == ptr  # pulled into the parameter's own memory
        torch.testing.assert_close(p.detach(), p0 - 0.1 * g)
        assert float(p.grad.abs().sum()) == 0  # zeroed for the next step
    # Another worker's change (pushed here directly) arrives with the next pull.
    w.push([int(dp.keys[0])], torch.ones(model[0].weight.numel()))
    expect = model[0].weight.detach().clone() + 1
    dp.pull()
    torch.testing.assert_close(model[0].weight.detach(), expect)


def test_data_parallel_modes(job):
    model = torch.nn.Linear(2, 1)
    with pytest.raises(pscore.InvalidArgument):
        pst.DataParallel(model, job.worker, lr=0.1, mode="other")
    dp = pst.DataParallel(model, job.worker, lr=0.1, mode="async", staleness=2, key_base=100)
    dp.start()
    for _ in range(5):
        model(torch.ones(1, 2)).sum().backward()
        dp.step()
    assert dp.steps == 5
    # d(sum(w.x + b))/dw = x = 1, /db = 1: five steps of -0.1 each.
    np.testing.assert_allclose(job.worker.pull([101]), dp.flat[2:3].numpy(), rtol=0, atol=0)


def test_embedding_pulls_only_touched_rows(job2):
    w = job2.worker
    emb = pst.Embedding(1000, 4, w, lr=1.0, key_base=1 << 30, name="t")
    emb.initialize(chunk_rows=256)
    idx = torch.tensor([[3, 7], [7, 999]])
    out = emb(idx)
    assert out.shape == (2, 2, 4)
    assert emb.rows_pulled == 3  # rows 3, 7, 999
    row7 = w.pull([(1 << 30) + 7]).copy()
    torch.testing.assert_close(out[0, 1].detach(), torch.from_numpy(row7))
    untouched = w.pull([(1 << 30) + 5]).copy()
    out.sum().backward()
    emb.push_gradients()
    # d(sum)/d(row) = number of uses: row 7 twice, rows 3 and 999 once; lr 1, one worker.
    np.testing.assert_allclose(w.pull([(1 << 30) + 7]), row7 - 2, rtol=1e-6)
    np.testing.assert_array_equal(w.pull([(1 << 30) + 5]), untouched)
