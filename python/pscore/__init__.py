"""pscore: the C++ parameter-server core, from Python.

A thin layer over the C++ API (docs/embedding.md): ``Scheduler``, ``Server`` and
``Worker`` nodes whose options are keyword arguments named as the fields of
``SchedulerOptions`` / ``NodeOptions`` (durations in seconds). Float data crosses as
float32 C-contiguous buffers (numpy arrays, CPU torch tensors) without a copy between the
caller's memory and the C++ calls. Every blocking call releases the GIL and can be
interrupted with Ctrl-C. Errors are raised as subclasses of :class:`pscore.Error`.

See docs/python.md.
"""

from __future__ import annotations

import concurrent.futures as _futures
import json as _json
import threading as _threading
import concurrent.futures as _futures
import json as _json
import threading as _threading
from typing import Any, Iterable, Optional, Sequence

import numpy as _np

from . import _pscore
from ._pscore import (  # noqa: F401  (re-exported)
    Aborted,
    AdminClient as _AdminClient,
    AlreadyExists,
    Cancelled,
    Error,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ResourceExhausted,
    Timeout,
    Unavailable,
    Unimplemented,
)

__all__ = [
    "Scheduler", "Server", "Worker", "AdminClient", "RankTables", "Error", "InvalidArgument", "ProtocolError",
    "Unavailable", "Timeout", "ResourceExhausted", "InternalError", "NotFound", "AlreadyExists",
    "Cancelled", "FailedPrecondition", "PermissionDenied", "Aborted", "Unimplemented", "as_buffer",
]


def as_buffer(x: Any) -> Any:
    """The object pscore reads or writes for ``x``, sharing its memory.

    numpy arrays and other buffer-protocol objects are returned as they are; a CPU torch
    tensor becomes the numpy view of its storage (``tensor.detach().numpy()``, no copy).
    Raises InvalidArgument for a tensor that is not on the CPU, not float32 or not
    contiguous (pscore would have to copy it).
    """
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise InvalidArgument("invalid_argument: tensor must be on the CPU, not " + str(x.device))
        if not x.is_contiguous():
            raise InvalidArgument("invalid_argument: tensor must be contiguous")
        return x.detach().numpy()
    return x


class Scheduler(_pscore.Scheduler):
    """The job's scheduler (C++ ``SchedulerNode``).

    Keyword options (``SchedulerOptions``): host, port (0: a free port, read ``.port``),
    worker_num, server_num, heartbeat_interval, heartbeat_timeout, scale_timeout,
    isolation_timeout (seconds), max_message_bytes, max_kv_value_bytes, max_kv_total_bytes, job_id, http_host,
    http_port, state_dir, cluster_token; tls_cert, tls_key, tls_ca (PEM files, all three or
    none: TLS 1.3 with mutual authentication, docs/security.md) and tls_admin_cns (the
    certificate CNs allowed admin commands, default ["admin"]).
    """

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Server(_pscore.Server):
    """A parameter server (C++ ``ServerNode``) with the built-in store.

    ``rule`` is the store's update rule: ``"sum"`` (w += v), ``"sgd"`` (w -= lr * v) or
    ``"assign"`` (w = v); ``learning_rate`` is sgd's lr. Other keyword options are
    ``NodeOptions`` fields: node_id, scheduler_host, scheduler_port, host, port, rank,
    heartbeat_interval, heartbeat_timeout, scheduler_timeout, connect_timeout,
    join_timeout, request_timeout, recovery_timeout (seconds), host_name, max_message_bytes,
    handler_threads (>= 1 for Python handlers), push_slice_keys (worker), data_dir, journal_compact_bytes,
    cluster_token, direct_control_calls, poll_spin (seconds the loop polls without sleeping
    after a lone request or the last answer; 0: off), max_connections, tls_cert, tls_key, tls_ca (PEM files, all three or none;
    without node_id the certificate's CN is the node id).
    """

    def register_handler(self, name: str, fn: Any) -> None:  # type: ignore[override]
        """Registers ``fn(payload: bytes, from_rank: int) -> bytes | None`` for calls named
        ``name`` (before ``start``). It runs on one of the server's handler threads with the
        GIL held for its duration; raising a ``pscore.Error`` subclass answers the caller
        with that error, any other exception with ``InternalError``."""
        super().register_handler(name, fn)

    def serve(self, ready_timeout: float = 60.0, finish_timeout: float = 86400.0) -> None:
        """start(), wait_ready(), then serve until every node has finished (finish())."""
        self.start()
        self.wait_ready(ready_timeout)
        self.finish(finish_timeout)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Worker(_pscore.Worker):
    """A worker (C++ ``WorkerNode``): pushes and pulls keyed float32 tensors.

    Keyword options are ``NodeOptions`` fields (see :class:`Server`). Keys are uint64:
    a sequence of ints or a numpy uint64 array. Values are float32 C-contiguous buffers:
    numpy arrays or CPU torch tensors.
    """

    def push(self, keys: Any, values: Any, lens: Optional[Sequence[int]] = None) -> None:  # type: ignore[override]
        """Pushes ``values`` (``lens[i]`` floats for ``keys[i]``, back to back; no lens:
        equal lengths) to the keys' servers; returns when every server applied it.

        The values are read from the caller's memory (C++ ``ZPush``): keys of 64 KiB or
        more on average are written to the sockets from it (in a job of one server, any
        push of 64 KiB or more in all), smaller ones are encoded from it once. Do not
        change the array while the call runs."""
        super().push(keys, as_buffer(values), None if lens is None else list(lens))

    def pull(self, keys: Any, with_lens: bool = False) -> Any:  # type: ignore[override]
        """Pulls the keys' values, back to back in the order of ``keys``, as a new float32
        numpy array (the C++ result vector itself, not a copy); with ``with_lens`` a tuple
        (array, lens). A key never pushed raises NotFound."""
        return super().pull(keys, with_lens)

    def pull_into(self, keys: Any, out: Any, lens: Optional[Sequence[int]] = None) -> list:  # type: ignore[override]
        """Pulls the keys' values straight into ``out`` (C++ ``PullInto``; a numpy array
        or a CPU torch tensor of exactly the keys' float count). ``lens`` is an optional
        layout (one count per key); the true per-key counts are returned."""
        return super().pull_into(keys, as_buffer(out), None if lens is None else list(lens))

    # ---- futures: the blocking calls run on a small thread pool of the worker (they
    # release the GIL while they wait); each returns a concurrent.futures.Future, usable
    # from asyncio with asyncio.wrap_future.
    def _pool(self) -> _futures.ThreadPoolExecutor:
        with _pool_lock:
            pool = self.__dict__.get("_executor")
            if pool is None:
                pool = _futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="pscore-worker")
                self.__dict__["_executor"] = pool
        return pool

    def push_async(self, keys: Any, values: Any, lens: Optional[Sequence[int]] = None) -> "_futures.Future[None]":
        """``push`` on the worker's thread pool; do not change ``values`` before the future is done."""
        return self._pool().submit(self.push, keys, values, lens)

    def pull_async(self, keys: Any, with_lens: bool = False) -> "_futures.Future[Any]":
        """``pull`` on the worker's thread pool."""
        return self._pool().submit(self.pull, keys, with_lens)

    def pull_into_async(self, keys: Any, out: Any, lens: Optional[Sequence[int]] = None) -> "_futures.Future[list]":
        """``pull_into`` on the worker's thread pool; ``out`` is written until the future is done."""
        return self._pool().submit(self.pull_into, keys, out, lens)

    def call_async(self, rank: int, name: str, payload: bytes = b"") -> "_futures.Future[bytes]":
        """``call`` on the worker's thread pool."""
        return self._pool().submit(self.call, rank, name, payload)

    def close(self) -> None:  # type: ignore[override]
        """Stops the node (pending calls end with Cancelled), then the futures' threads."""
        super().close()
        with _pool_lock:
            pool = self.__dict__.pop("_executor", None)
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_pool_lock = _threading.Lock()


class AdminClient(_AdminClient):
    """The operator's client (C++ ``AdminClient``): status, nodes, scale_out, scale_in.

    With TLS (tls_cert, tls_key, tls_ca) the scheduler carries out commands other than
    status only for a certificate whose CN it lists in tls_admin_cns (default "admin")."""

    def status(self) -> dict:
        """The job's state: cluster_state, epoch, worker_num, server_num, registered_*, ..."""
        return self.admin("status")

    def nodes(self) -> list:
        """Every member: node_id, role, rank, host, port."""
        return self.admin("nodes")["nodes"]

    def _totals(self, workers: int, servers: int) -> tuple:
        if workers and servers:
            return workers, servers
        st = self.status()
        return workers or st["worker_num"], servers or st["server_num"]

    def scale_out(self, workers: int = 0, servers: int = 0) -> dict:
        """Starts a scale-out to these **totals** (0: the role keeps its current total, as
        pscore-admin does); answers once it started (CLUSTER_SCALE_OUT). Starting the new
        processes is the caller's job."""
        return self.admin("scale_out", *self._totals(workers, servers))

    def scale_in(self, workers: int = 0, servers: int = 0, node_ids: Iterable[str] = ()) -> dict:
        """Starts a scale-in to these totals (0: unchanged; the highest ranks leave), or of
        the given node ids."""
        ids = list(node_ids)
        if ids:
            return self.admin("scale_in", 0, 0, ids)
        return self.admin("scale_in", *self._totals(workers, servers))

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RankTables(_pscore.RankTables):
    """The job's rank table as an iterator (C++ ``RankTableSubscriber``, docs/ranktable.md).

    Each item is the table as the scheduler streams it, parsed from JSON: the current
    table first, then every change. Iteration blocks (GIL released, Ctrl-C ends it) until
    the next table; it stops when the stream is closed (``close()``), and raises the
    reason when the stream is lost (``reconnect_for`` seconds of resubscribing first).
    """

    def __iter__(self) -> "RankTables":
        return self

    def __next__(self) -> dict:
        return _json.loads(self.next(-1.0))

    def get(self, timeout: float) -> Optional[dict]:
        """The next table, or None after ``timeout`` seconds."""
        t = self.next(timeout)
        return None if t is None else _json.loads(t)

    def __enter__(self) -> "RankTables":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def keys_array(keys: Iterable[int]) -> "_np.ndarray":
    """``keys`` as a numpy uint64 array (the form pscore reads without converting)."""
    return _np.asarray(list(keys) if not isinstance(keys, _np.ndarray) else keys, dtype=_np.uint64)
