"""TLS from Python: a job whose scheduler, server and worker all take tls_cert, tls_key and
tls_ca (certificates made by scripts/tls_certs.sh with the openssl command line) pushes
and pulls; the operator's certificate (CN=admin) may use admin commands, a worker's
certificate gets only "status"; a node claiming another node's id and a client without TLS
are refused."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import pscore

HB = dict(heartbeat_interval=0.2, heartbeat_timeout=3.0)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command line")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    subprocess.run([os.path.join(ROOT, "scripts", "tls_certs.sh"), d, "scheduler", "admin", "s0", "w0"], check=True,
                   stdout=subprocess.DEVNULL, timeout=60)
    return d


def tls(pki: str, name: str) -> dict:
    return dict(tls_cert=f"{pki}/{name}.crt", tls_key=f"{pki}/{name}.key", tls_ca=f"{pki}/ca.crt")


def test_a_tls_job_pushes_and_pulls_and_only_admin_certificates_steer_it(pki):
    sched = pscore.Scheduler(worker_num=1, server_num=1, **HB, **tls(pki, "scheduler"))
    sched.start()
    port = sched.port
    server = pscore.Server(rule="sum", scheduler_port=port, node_id="s0", **HB, **tls(pki, "s0"))
    server.start()
    # No node_id: the worker takes its certificate's CN (w0).
    worker = pscore.Worker(scheduler_port=port, **HB, **tls(pki, "w0"))
    worker.start()
    try:
        worker.wait_ready(30)
        server.wait_ready(30)
        worker.push([1, 2], np.arange(4, dtype=np.float32))
        worker.push([1, 2], np.ones(4, dtype=np.float32))
        np.testing.assert_array_equal(worker.pull([1, 2]), np.arange(4, dtype=np.float32) + 1)

        with pscore.AdminClient(port, **tls(pki, "admin")) as a:
            assert a.status()["cluster_state"] == "CLUSTER_READY"
            assert sorted(n["node_id"] for n in a.nodes()) == ["s0", "w0"]
        with pscore.RankTables(port, **tls(pki, "admin")) as tables:
            assert tables.get(20.0) is not None  # the current table, over TLS
        # A member's certificate is not an operator's: status only.
        with pscore.AdminClient(port, **tls(pki, "w0")) as a:
            assert a.status()["cluster_state"] == "CLUSTER_READY"
            with pytest.raises(pscore.PermissionDenied, match="not an admin certificate"):
                a.nodes()
            with pytest.raises(pscore.PermissionDenied, match=r"CN=w0"):
                a.scale_out(servers=2)
        # Without TLS the scheduler's port does not answer.
        with pytest.raises(pscore.Error):
            pscore.AdminClient(port, timeout=3.0).status()
        # The job is undisturbed.
        np.testing.assert_array_equal(worker.pull([1, 2]), np.arange(4, dtype=np.float32) + 1)
    finally:
        worker.close()
        server.close()
        sched.close()


def test_a_node_claiming_another_id_is_refused(pki):
    with pscore.Scheduler(worker_num=1, server_num=1, **HB, **tls(pki, "scheduler")) as sched:
        sched.start()
        impostor = pscore.Worker(scheduler_port=sched.port, node_id="w9", connect_timeout=5.0, **HB,
                                 **tls(pki, "w0"))
        try:
            with pytest.raises(pscore.Error, match="does not match the TLS certificate"):
                impostor.start()
                impostor.wait_ready(10)
        finally:
            impostor.close()


def test_tls_options_are_checked(pki):
    with pytest.raises(pscore.Error):
        pscore.Scheduler(worker_num=1, server_num=1, tls_cert=f"{pki}/admin.crt")  # no key, no CA
    with pytest.raises(pscore.Error):
        pscore.AdminClient(1, tls_cert=f"{pki}/admin.crt", tls_key=f"{pki}/w0.key", tls_ca=f"{pki}/ca.crt")
