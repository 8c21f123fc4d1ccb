#!/usr/bin/env bash
# Makes a cluster CA and one certificate per name, with the openssl command line, for a
# local TLS job (docs/security.md):
#   scripts/tls_certs.sh DIR NAME...     e.g. scripts/tls_certs.sh /tmp/pki scheduler admin server0 worker0
# Writes DIR/ca.crt (+ DIR/ca.key) once, and DIR/NAME.crt + DIR/NAME.key per name: an EC
# P-256 key, subject CN=NAME (the identity pscore checks), SAN DNS:NAME, DNS:localhost,
# IP:127.0.0.1 (so curl accepts the scheduler's HTTPS port on loopback), valid DAYS days
# (default 30). An existing CA or certificate is kept, so names can be added later.
set -euo pipefail
dir=${1:?usage: tls_certs.sh DIR NAME...}
shift
days=${DAYS:-30}
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.crt" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/ca.key" -out "$dir/ca.crt" \
    -days "$days" -subj "/CN=pscore-cluster-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
for name in "$@"; do
  [ -f "$dir/$name.crt" ] && continue
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/$name.key" -out "$dir/$name.csr" \
    -subj "/CN=$name" 2>/dev/null
  ext=$(mktemp)
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\n' "$name" >"$ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$ext" -out "$dir/$name.crt" 2>/dev/null
  rm -f "$ext" "$dir/$name.csr"
done
echo "certificates in $dir: ca.crt and $*"
