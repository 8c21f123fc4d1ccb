"""The binding's API against an in-process job: data plane, control plane, errors,
zero copy, handlers, admin client."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import pscore

from conftest import HB, Job


def test_push_pull_numpy(job):
    w = job.worker
    keys = [1, 2, 3]
    w.push(keys, np.arange(6, dtype=np.float32))  # equal lengths: 2 floats a key
    w.push(np.array(keys, dtype=np.uint64), np.ones(6, dtype=np.float32))  # sum rule: += 1
    got = w.pull(keys)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32) + 1)
    vals, lens = w.pull([3, 1], with_lens=True)
    assert lens == [2, 2]
    np.testing.assert_array_equal(vals, [5, 6, 1, 2])


def test_push_with_lens_and_pull_into(job):
    w = job.worker
    w.push([10, 11], np.array([1, 2, 3, 4, 5], dtype=np.float32), lens=[2, 3])
    out = np.zeros(5, dtype=np.float32)
    lens = w.pull_into([10, 11], out)
    assert lens == [2, 3]
    np.testing.assert_array_equal(out, [1, 2, 3, 4, 5])


def test_push_in_slices():
    # push_slice_keys=100: a push of 1,000 keys goes as ten slices, each split over both
    # servers; the sums come out whole.
    j = Job(servers=2, worker_opts=dict(push_slice_keys=100))
    try:
        keys = np.arange(1000, dtype=np.uint64) * 7919 + 3
        values = np.arange(3000, dtype=np.float32)
        j.worker.push(keys, values)
        j.worker.push(keys, values)
        np.testing.assert_array_equal(j.worker.pull(keys), 2 * values)
    finally:
        j.close()
    with pytest.raises(pscore.InvalidArgument, match="unknown node option 'push_slice_bytes'"):
        pscore.Worker(scheduler_port=1, node_id="w9", push_slice_bytes=100)


def test_poll_spin():
    # A worker whose loop polls 200 us after each lone request: the same sums, call by call.
    j = Job(worker_opts=dict(poll_spin=0.0002))
    try:
        keys = [5, 6, 7]
        for r in range(1, 201):
            j.worker.push(keys, np.full(3, r, dtype=np.float32))
            np.testing.assert_array_equal(j.worker.pull(keys), np.full(3, r * (r + 1) / 2, dtype=np.float32))
    finally:
        j.close()


def test_torch_tensors(job):
    w = job.worker
    t = torch.arange(8, dtype=torch.float32)
    w.push([20, 21], t)
    dest = torch.zeros(8)
    w.pull_into([20, 21], dest)
    assert torch.equal(dest, t)
    with pytest.raises(pscore.InvalidArgument):
        w.push([22], torch.arange(8, dtype=torch.float32)[::2])  # not contiguous


def test_pull_into_writes_the_callers_memory(job2):
    """The answer of a large key is read from the socket into the caller's array: the
    worker counts it as read in place, and it lands inside the array the view came from."""
    w = job2.worker
    n = 1 << 18  # 1 MiB a key: written from the store, read in place
    keys = [5, 6]
    w.push(keys, np.full(2 * n, 2.5, dtype=np.float32))
    big = np.zeros(2 * n + 16, dtype=np.float32)
    view = big[8:8 + 2 * n]  # contiguous view into big: same memory
    assert view.__array_interface__["data"][0] == big.__array_interface__["data"][0] + 32
    before = w.in_place_pulls
    lens = w.pull_into(keys, view)
    w.pull_into(keys, view, lens=lens)  # with a layout: every answer in place
    assert w.in_place_pulls - before >= 2
    assert np.all(big[8:8 + 2 * n] == 2.5)
    assert np.all(big[:8] == 0) and np.all(big[-8:] == 0)
    # torch: the tensor's own storage is written
    t = torch.zeros(2 * n)
    ptr = t.data_ptr()
    w.pull_into(keys, t)
    assert t.data_ptr() == ptr and bool(torch.all(t == 2.5))


def test_push_reads_the_callers_memory(job):
    """A large push goes to the socket from the caller's array (C++ ZPush): the worker's
    count of copied payload bytes does not grow by the array's size; a small push is
    encoded from it once (counted)."""
    w = job.worker
    n = 1 << 20  # 4 MiB, one key
    big = np.ones(n, dtype=np.float32)
    w.push([30], big)  # creates the key
    before = w.payload_bytes_copied
    w.push([30], big)
    assert w.payload_bytes_copied - before < big.nbytes // 4
    np.testing.assert_array_equal(w.pull([30])[:4], [2, 2, 2, 2])
    small = np.ones(16, dtype=np.float32)
    before = w.payload_bytes_copied
    w.push([31], small)
    assert w.payload_bytes_copied - before >= small.nbytes
    # Once the pushes are over nothing on the C++ side holds the arrays any more.
    deadline = time.monotonic() + 10
    while w.pending_buffers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.pending_buffers == 0


def test_errors(job):
    w = job.worker
    with pytest.raises(pscore.NotFound):
        w.pull([999])
    with pytest.raises(pscore.InvalidArgument) as e:
        w.push([1, 2], np.ones(3, dtype=np.float32), lens=[1, 1])
    assert isinstance(e.value, ValueError) and isinstance(e.value, pscore.Error)
    assert e.value.code == 1
    with pytest.raises(pscore.InvalidArgument):
        w.push([1], np.ones(3, dtype=np.float64))
    w.push([40], np.ones(4, dtype=np.float32))
    with pytest.raises(pscore.InvalidArgument):
        w.pull_into([40], np.zeros(3, dtype=np.float32))  # wrong size
    with pytest.raises(pscore.NotFound):
        w.call(0, "no-such-handler", b"")
    with pytest.raises(pscore.Timeout):
        w.wait_for_termination(0.2)  # the job is running
    with pytest.raises(pscore.Timeout) as t:
        w.kv_get("never-set", timeout=0.3)
    assert isinstance(t.value, TimeoutError)
    with pytest.raises(pscore.InvalidArgument):
        pscore.Worker(no_such_option=1)
    with pytest.raises(pscore.InvalidArgument):
        pscore.Server(rule="adam")
    assert issubclass(pscore.Unavailable, pscore.Error) and issubclass(pscore.Cancelled, pscore.Error)


def test_closed_worker_raises():
    j = Job()
    try:
        w = j.worker
        w.close()
        w.close()  # idempotent
        with pytest.raises(pscore.FailedPrecondition):
            w.pull([1])
    finally:
        j.close()


def test_kv_and_barrier(job):
    kv_and_barrier(job)


def test_kv_and_barrier_through_the_loop():
    # The same calls with direct_control_calls off: each through the node's loop thread.
    j = Job(worker_opts=dict(direct_control_calls=False))
    try:
        kv_and_barrier(j)
    finally:
        j.close()


def kv_and_barrier(job):
    w = job.worker
    w.kv_set("cfg/a", b"1")
    w.kv_set("cfg/b", "2")  # str: stored as UTF-8
    with pytest.raises(pscore.AlreadyExists):
        w.kv_set("cfg/a", b"3", overwrite=False)
    assert w.kv_get("cfg/a", timeout=5) == b"1"
    assert w.kv_try_get("cfg/b") == b"2"
    assert w.kv_try_get("cfg/none") is None
    assert sorted(w.kv_list("cfg/")) == [("cfg/a", b"1"), ("cfg/b", b"2")]
    w.kv_delete("cfg/a")
    assert w.kv_try_get("cfg/a") is None
    # A blocking get answered by a set from another node.
    s = job.servers[0]
    t = threading.Timer(0.2, lambda: s.kv_set("late", b"x"))
    t.start()
    assert w.kv_get("late", timeout=10) == b"x"
    t.join()
    # A barrier of the worker and the server.
    done = []
    th = threading.Thread(target=lambda: done.append(s.barrier("b1", 10, ["w0", "s0"])))
    th.start()
    w.barrier("b1", 10, ["w0", "s0"])
    th.join(10)
    assert done == [None]
    with pytest.raises(pscore.Timeout):
        w.barrier("b2", 0.3, ["w0", "s0"])
    # A waiting round cancelled by another node ends with Cancelled.
    errors = []

    def wait_b3():
        try:
            w.barrier("b3", 30, ["w0", "s0"])
        except pscore.Error as e:
            errors.append(e)

    th = threading.Thread(target=wait_b3)
    th.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            s.cancel_barrier("b3")
            break
        except (pscore.NotFound, pscore.FailedPrecondition):  # the round is not open yet
            assert time.monotonic() < deadline
            time.sleep(0.02)
    th.join(10)
    assert len(errors) == 1 and isinstance(errors[0], pscore.Cancelled)


def test_membership(job2):
    w = job2.worker
    assert w.rank == 0 and w.node_id == "w0"
    assert w.server_count == 2 and w.worker_count == 1
    assert w.node_ids("server") == ["s0", "s1"] or sorted(w.node_ids("server")) == ["s0", "s1"]
    assert w.cluster_state == "CLUSTER_READY"
    assert job2.servers[0].port > 0
    assert job2.scheduler.port > 0 and job2.scheduler.cluster_state == "CLUSTER_READY"


def test_events_and_report_error(job):
    w, s = job.worker, job.servers[0]
    w.send_event(7, b"hello")
    ev = s.next_event(timeout=10)
    while ev is not None and ev["kind"] != "user":
        ev = s.next_event(timeout=10)
    assert ev is not None and ev["event"] == 7 and ev["payload"] == b"hello" and ev["source"] == "w0"
    assert s.next_event(timeout=0) is None or True  # non-blocking form returns at once
    w.report_error(5, "out of memory")
    deadline = time.monotonic() + 10
    seen = None
    while time.monotonic() < deadline:
        ev = s.next_event(timeout=0.5)
        if ev and ev["kind"] == "cluster" and ev["source"] == "w0":
            seen = ev
            break
    assert seen is not None and seen["code"] == 5 and "out of memory" in seen["payload"].decode()


def test_python_server_handler():
    calls = []

    def reverse(payload: bytes, from_rank: int) -> bytes:
        calls.append((payload, from_rank, threading.current_thread() is threading.main_thread()))
        return payload[::-1]

    def refuse(payload: bytes, from_rank: int):
        raise pscore.ResourceExhausted("too big")

    def crash(payload: bytes, from_rank: int):
        raise ValueError("bad input")

    j = Job(servers=2, handlers={"reverse": reverse, "refuse": refuse, "crash": crash})
    try:
        w = j.worker
        assert w.call(0, "reverse", b"abc") == b"cba"
        assert w.call(1, "reverse", b"xy") == b"yx"
        assert w.broadcast("reverse", b"12") == [b"21", b"21"]
        assert calls[0][:2] == (b"abc", 0) and calls[0][2] is False  # a handler thread, not ours
        with pytest.raises(pscore.ResourceExhausted, match="too big"):
            w.call(0, "refuse", b"")
        with pytest.raises(pscore.InternalError, match="bad input"):
            w.call(0, "crash", b"")
    finally:
        j.close()


def test_admin_client(job2):
    with pscore.AdminClient(job2.scheduler.port) as a:
        st = a.status()
        assert st["cluster_state"] == "CLUSTER_READY"
        assert st["server_num"] == 2 and st["worker_num"] == 1
        ids = sorted(n["node_id"] for n in a.nodes())
        assert ids == ["s0", "s1", "w0"]
        # Roles are spelled as pscore-admin nodes --json spells them.
        assert {n["node_id"]: n["role"] for n in a.nodes()} == {"s0": "server", "s1": "server", "w0": "worker"}


def test_a_server_started_before_its_scale_out_joins_it(job):
    port = job.scheduler.port
    # The server quota (1) is full: a server that waits 0.5 s for a scale-out is refused then.
    extra = pscore.Server(scheduler_port=port, node_id="s9", join_timeout=0.5, **HB)
    t0 = time.monotonic()
    with pytest.raises(pscore.InvalidArgument, match="quota full"):
        extra.start()
    assert time.monotonic() - t0 >= 0.5
    extra.close()
    # With the default join timeout one started before the scale-out joins it.
    job.worker.push([1, 2, 3, 4], np.ones(4, dtype=np.float32))
    s1 = pscore.Server(scheduler_port=port, node_id="s1", **HB)
    errors = []

    def start():
        try:
            s1.start()
        except pscore.Error as e:  # reported by the assert below
            errors.append(e)

    t = threading.Thread(target=start)
    t.start()
    try:
        time.sleep(0.5)
        assert t.is_alive()  # refused "quota full", registering again
        with pscore.AdminClient(port) as a:
            a.scale_out(servers=2)
            t.join(30)
            assert not t.is_alive() and not errors
            s1.wait_ready(30)
            job.worker.wait_ready(30)
            assert a.status()["server_num"] == 2
            assert sorted(n["node_id"] for n in a.nodes()) == ["s0", "s1", "w0"]
        # The keys pushed before the scale-out are still there, wherever they now live.
        np.testing.assert_array_equal(job.worker.pull([1, 2, 3, 4]), np.ones(4, dtype=np.float32))
    finally:
        t.join(60)
        s1.close()


def test_gil_released_during_blocking_calls(job):
    """A Python thread keeps running while the main thread waits in a blocking call."""
    w = job.worker
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
            w.kv_get("never", timeout=0.5)
        assert count[0] - start > 1000
    finally:
        stop.set()
        th.join(5)


def test_finish_of_a_job():
    j = Job()
    try:
        errs = []
        th = threading.Thread(target=lambda: errs.append(j.servers[0].finish(30)))
        th.start()
        j.worker.finish(30)
        th.join(30)
        assert errs == [None]
        j.scheduler.wait_for_exit(30)
        assert j.scheduler.exited
        j.worker.wait_for_termination(10)  # the job ended without error
    finally:
        j.close()


def test_futures_and_asyncio(job):
    import asyncio
    import concurrent.futures

    w = job.worker
    f = w.push_async([50, 51], np.ones(8, dtype=np.float32))
    assert isinstance(f, concurrent.futures.Future)
    assert f.result(timeout=10) is None
    out = np.zeros(8, dtype=np.float32)
    assert w.pull_into_async([50, 51], out).result(timeout=10) == [4, 4]
    assert np.all(out == 1)

    async def main():
        a, b = await asyncio.gather(asyncio.wrap_future(w.pull_async([50])), asyncio.wrap_future(w.pull_async([51])))
        return a, b

    a, b = asyncio.run(asyncio.wait_for(main(), 10))
    np.testing.assert_array_equal(a, np.ones(4))
    np.testing.assert_array_equal(b, np.ones(4))
    with pytest.raises(pscore.NotFound):
        w.pull_async([52]).result(timeout=10)


def test_rank_table_iterator(job2):
    with pscore.RankTables(job2.scheduler.port) as tables:
        first = next(iter(tables))
        assert first["status"] == "completed"
        groups = first["server_group_list"]
        assert len(groups) == 2 and groups[1]["server_count"] == "1"  # both servers on one host
        assert tables.get(timeout=0.2) is None  # no change: nothing more within the timeout
        tables.close()
        with pytest.raises(StopIteration):
            next(tables)
