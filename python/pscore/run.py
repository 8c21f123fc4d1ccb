"""Runs one scheduler or server node as a process (the Python counterpart of pscore-node).

    python3 -m pscore.run scheduler --workers=2 --servers=2 --port-file=/tmp/port
    python3 -m pscore.run server --scheduler-port=PORT --node-id=server0 [--rule=sum]

The scheduler writes its port to --port-file (atomically) once it listens and exits when
the job has ended; a server serves until every node has finished. Exit code 0 when the
node ended without error, 1 otherwise (the error on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

import pscore


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m pscore.run")
    p.add_argument("role", choices=["scheduler", "server"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--port", type=int, default=0, help="scheduler: port to listen on (0: a free one)")
    p.add_argument("--port-file", default="", help="scheduler: write the port here")
    p.add_argument("--scheduler-port", type=int, default=0)
    p.add_argument("--scheduler-host", default="127.0.0.1")
    p.add_argument("--node-id", default="")
    p.add_argument("--rule", default="sum", choices=["sum", "sgd", "assign"])
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--heartbeat-interval", type=float, default=0.2)
    p.add_argument("--heartbeat-timeout", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=3600.0, help="longest the job may run")
    a = p.parse_args(argv)
    hb = dict(heartbeat_interval=a.heartbeat_interval, heartbeat_timeout=a.heartbeat_timeout)
    try:
        if a.role == "scheduler":
            with pscore.Scheduler(port=a.port, worker_num=a.workers, server_num=a.servers, **hb) as s:
                s.start()
                if a.port_file:
                    tmp = a.port_file + ".tmp"
                    with open(tmp, "w") as f:
                        f.write(str(s.port))
                    os.rename(tmp, a.port_file)
                s.wait_for_exit(a.timeout)
        else:
            opts = dict(scheduler_host=a.scheduler_host, scheduler_port=a.scheduler_port, **hb)
            if a.node_id:
                opts["node_id"] = a.node_id
            with pscore.Server(rule=a.rule, learning_rate=a.learning_rate, **opts) as s:
                s.serve(ready_timeout=60.0, finish_timeout=a.timeout)
    except pscore.Error as e:
        print(f"pscore.run {a.role}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
