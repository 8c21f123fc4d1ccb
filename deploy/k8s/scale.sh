#!/usr/bin/env bash
# Scales the servers of the running job to N: asks the scheduler for the new total first
# (a server that registers before the scale-out starts is refused), then raises the
# StatefulSet's replicas, then waits until the cluster is READY with N servers.
#   deploy/k8s/scale.sh N [--namespace=NS]
# Not run on a cluster (none is reachable where pscore is developed); the commands are
# those of docs/deploy.md, Kubernetes.
set -euo pipefail
n=${1:?usage: scale.sh N [--namespace=NS]}
ns=()
[ -n "${2:-}" ] && ns=(-n "${2#--namespace=}")
# pscore-admin runs inside the scheduler's pod, where the scheduler is on 127.0.0.1:7000.
kubectl "${ns[@]}" exec deploy/pscore-scheduler -- pscore-admin --scheduler_port=7000 scale-out --servers="$n" --nowait
kubectl "${ns[@]}" scale statefulset/pscore-server --replicas="$n"
deadline=$((SECONDS + 180))
until kubectl "${ns[@]}" exec deploy/pscore-scheduler -- pscore-admin --scheduler_port=7000 status |
  grep -q "CLUSTER_READY.*servers $n/$n"; do
  [ $SECONDS -lt $deadline ] || { echo "scale.sh: not READY with $n servers after 180 s" >&2; exit 1; }
  sleep 2
done
echo "scale.sh: READY with $n servers"
