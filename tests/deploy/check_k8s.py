#!/usr/bin/python3
"""Offline check of deploy/k8s/ (no cluster is reachable where pscore is developed).

Parses every manifest with PyYAML and checks the fields pscore relies on: selectors that
match their pods' labels, the downward-API variables the k8s launcher reads, Service
ports that name container ports, probes on named ports, the servers' --data_dir on a
volume claim, the Indexed Job. Every flag in a container's args must be listed by that
binary's --help. Then it starts each container's command as the pod would (its args and
environment, with ports moved to free ones and paths to a temp dir, the Service name set to
127.0.0.1): a scheduler, one server and one trainer of the manifests form a job, every
probed HTTP path is fetched from the running process and must answer 200, and the trainer
must end 0. Usage: check_k8s.py SOURCE_DIR BIN_DIR. Prints "k8s manifests: ok" and exits 0.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

errors = []


def fail(msg):
    errors.append(msg)
    print("FAIL: " + msg, flush=True)


def load(src):
    docs = {}
    d = os.path.join(src, "deploy", "k8s")
    for name in sorted(os.listdir(d)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(d, name)) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"^\s+-(\w+) \(", out, re.M))


def pod_spec(doc):
    return doc["spec"]["template"]["spec"]


def check_static(docs, bin_dir):
    want = {("Service", "pscore-scheduler"), ("Deployment", "pscore-scheduler"), ("Service", "pscore-server"),
            ("StatefulSet", "pscore-server"), ("Job", "pscore-worker")}
    for k in sorted(want - set(docs)):
        fail("missing %s/%s" % k)
    api = {"Service": "v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1"}
    flags = {"pscore-node": help_flags(os.path.join(bin_dir, "pscore-node")),
             "pscore-train": help_flags(os.path.join(bin_dir, "pscore-train"))}
    if len(flags["pscore-node"]) < 20:
        fail("pscore-node --help listed only %d flags" % len(flags["pscore-node"]))
    workloads = {k: v for k, v in docs.items() if k[0] in ("Deployment", "StatefulSet", "Job")}
    for (kind, name), doc in docs.items():
        if doc.get("apiVersion") != api.get(kind):
            fail("%s/%s: apiVersion %s, want %s" % (kind, name, doc.get("apiVersion"), api.get(kind)))
    for (kind, name), doc in workloads.items():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        sel = doc["spec"].get("selector", {}).get("matchLabels")
        if kind != "Job" and (not sel or any(labels.get(k) != v for k, v in sel.items())):
            fail("%s/%s: selector %s does not match the pod labels %s" % (kind, name, sel, labels))
        spec = pod_spec(doc)
        if spec.get("enableServiceLinks") is not False:
            fail("%s/%s: enableServiceLinks must be false (PSCORE_SCHEDULER_PORT=tcp://... would be read "
                 "as --scheduler_port)" % (kind, name))
        for c in spec["containers"]:
            cmd = c["command"][0]
            if cmd not in flags:
                fail("%s/%s: unknown command %s" % (kind, name, cmd))
                continue
            for a in c.get("args", []):
                m = re.match(r"--(\w+)", a)
                if not m or m.group(1) not in flags[cmd]:
                    fail("%s/%s: %s is not a flag of %s --help" % (kind, name, a, cmd))
            if "--launcher=k8s" not in c.get("args", []):
                fail("%s/%s: no --launcher=k8s" % (kind, name))
            env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
            for var, path in (("POD_NAME", "metadata.name"), ("POD_IP", "status.podIP"),
                              ("POD_ROLE", "metadata.labels['pscore/role']")):
                if env.get(var) != path:
                    fail("%s/%s: env %s must come from %s (got %s)" % (kind, name, var, path, env.get(var)))
            if labels.get("pscore/role") not in ("scheduler", "server", "worker"):
                fail("%s/%s: label pscore/role is %s" % (kind, name, labels.get("pscore/role")))
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in c and c[probe]["httpGet"]["port"] not in ports:
                    fail("%s/%s: %s port %s is no container port" % (kind, name, probe, c[probe]["httpGet"]["port"]))
            http = [a for a in c.get("args", []) if a.startswith("--http_port=")]
            if "readinessProbe" in c and (not http or int(http[0].split("=")[1]) != ports.get("http")):
                fail("%s/%s: the probes' port is not --http_port" % (kind, name))
    # Services select pods of a workload and name their container ports.
    for (kind, name), doc in docs.items():
        if kind != "Service":
            continue
        sel = doc["spec"]["selector"]
        pods = [w for w in workloads.values()
                if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        if not pods:
            fail("Service/%s selects no pod" % name)
            continue
        cports = {p["name"]: p["containerPort"] for c in pod_spec(pods[0])["containers"] for p in c.get("ports", [])}
        for p in doc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            if target not in cports and target not in cports.values():
                fail("Service/%s: port %s targets %s, no container port" % (name, p["name"], target))
    sched = docs.get(("Deployment", "pscore-scheduler"))
    svc = docs.get(("Service", "pscore-scheduler"))
    if sched and svc:
        native = [p for p in svc["spec"]["ports"] if p["name"] == "native"]
        if not native or native[0]["port"] != 7000:
            fail("Service/pscore-scheduler: the native port must be 7000, the k8s launcher's default")
        if sched["spec"]["replicas"] != 1:
            fail("Deployment/pscore-scheduler: one scheduler per job")
    sts = docs.get(("StatefulSet", "pscore-server"))
    if sts:
        c = pod_spec(sts)["containers"][0]
        data = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--data_dir=")]
        claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        if not data or mounts.get(data[0]) not in claims:
            fail("StatefulSet/pscore-server: --data_dir is not on a volume claim")
        if sts["spec"]["serviceName"] != "pscore-server":
            fail("StatefulSet/pscore-server: serviceName")
    job = docs.get(("Job", "pscore-worker"))
    if job and job["spec"].get("completionMode") != "Indexed":
        fail("Job/pscore-worker: completionMode must be Indexed (JOB_COMPLETION_INDEX names the workers)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_file(path, deadline):
    while time.time() < deadline:
        try:
            with open(path) as f:
                v = f.read().strip()
            if v:
                return int(v)
        except OSError:
            pass
        time.sleep(0.05)
    return 0


def http_get(port, path, deadline):
    last = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as r:
                return r.status
        except Exception as e:  # not up yet, or an HTTP error
            last = e
            if hasattr(e, "code"):
                return e.code
            time.sleep(0.1)
    return "no answer: %s" % last


def container_argv(doc, bin_dir, overrides):
    c = pod_spec(doc)["containers"][0]
    args = [a for a in c["args"] if not any(a.startswith(o.split("=")[0] + "=") for o in overrides)]
    return [os.path.join(bin_dir, c["command"][0])] + args + overrides, c


def pod_env(doc, name, ip):
    labels = doc["spec"]["template"]["metadata"]["labels"]
    env = {"PATH": "/usr/bin:/bin", "KUBERNETES_SERVICE_HOST": "127.0.0.1", "POD_NAME": name, "POD_IP": ip,
           "POD_ROLE": labels["pscore/role"], "PSCORE_SCHEDULER_SERVICE": "127.0.0.1"}
    for name in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS"):  # CI's sanitizer runs
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def run_job(docs, bin_dir):
    tmp = tempfile.mkdtemp(prefix="pscore-k8s-")
    procs = []
    try:
        deadline = time.time() + 120
        sched_doc = docs[("Deployment", "pscore-scheduler")]
        sport, shttp = free_port(), free_port()
        argv, c = container_argv(sched_doc, bin_dir, [
            "--scheduler_port=%d" % sport, "--http_port=%d" % shttp, "--state_dir=" + tmp + "/state",
            "--server_num=1", "--worker_num=1", "--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"])
        log = open(os.path.join(tmp, "scheduler.log"), "w")
        procs.append(("scheduler", subprocess.Popen(argv, env=pod_env(sched_doc, "pscore-scheduler-abc12-xyz34",
                                                                      "127.0.0.1"), stdout=log, stderr=log)))
        for probe in ("readinessProbe", "livenessProbe"):
            st = http_get(shttp, c[probe]["httpGet"]["path"], deadline)
            if st != 200:
                fail("scheduler %s %s: %s" % (probe, c[probe]["httpGet"]["path"], st))
        srv_doc = docs[("StatefulSet", "pscore-server")]
        mhttp = free_port()
        argv, c = container_argv(srv_doc, bin_dir, [
            "--scheduler_port=%d" % sport, "--port=0", "--http_port=%d" % mhttp, "--data_dir=" + tmp + "/data",
            "--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"])
        log = open(os.path.join(tmp, "server.log"), "w")
        procs.append(("server", subprocess.Popen(argv, env=pod_env(srv_doc, "pscore-server-0", "127.0.0.1"),
                                                 stdout=log, stderr=log)))
        for probe in ("readinessProbe", "livenessProbe"):
            st = http_get(mhttp, c[probe]["httpGet"]["path"], deadline)
            if st != 200:
                fail("server %s %s: %s" % (probe, c[probe]["httpGet"]["path"], st))
        wk_doc = docs[("Job", "pscore-worker")]
        argv, c = container_argv(wk_doc, bin_dir, ["--scheduler_port=%d" % sport, "--steps=10",
                                                    "--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=3000"])
        env = pod_env(wk_doc, "pscore-worker-0-q8x7z", "127.0.0.1")
        env["JOB_COMPLETION_INDEX"] = "0"
        log = open(os.path.join(tmp, "worker.log"), "w")
        worker = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        procs.append(("worker", worker))
        try:
            rc = worker.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            rc = "still running at the deadline"
        out = open(os.path.join(tmp, "worker.log")).read()
        if rc != 0 or " final loss " not in out:
            fail("the trainer of workers.yaml ended %s:\n%s" % (rc, out[-2000:]))
        if "launcher k8s: role=worker task=0 node_id=worker-0" not in out:
            fail("the trainer's detection line is missing:\n" + out[-2000:])
        slog = open(os.path.join(tmp, "server.log")).read()
        if "launcher k8s: role=server task=0 node_id=pscore-server-0" not in slog:
            fail("the server's detection line is missing:\n" + slog[-2000:])
        for name, p in procs[:2]:
            try:
                rc = p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                rc = "still running at the deadline"
            if rc != 0:
                fail("%s ended %s:\n%s" % (name, rc, open(os.path.join(tmp, name + ".log")).read()[-2000:]))
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    src, bin_dir = sys.argv[1], sys.argv[2]
    docs = load(src)
    check_static(docs, bin_dir)
    if not errors:
        run_job(docs, bin_dir)
    if errors:
        print("k8s manifests: %d problem(s)" % len(errors))
        return 1
    print("k8s manifests: ok (%d objects checked; a scheduler, a server and a trainer ran from them)" % len(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
