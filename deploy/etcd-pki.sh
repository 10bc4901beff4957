#!/bin/sh
# Certificates for etcd's TLS and client-certificate authentication (deploy/README.md, "etcd").
#
#   deploy/etcd-pki.sh DIR [EXTRA_SAN...]
#
# writes into DIR (created with mode 0700):
#   ca.crt                 the CA every party trusts (its key is deleted: run again to re-issue)
#   etcd.crt  etcd.key     etcd's server certificate (names etcd, etcd.fluxmq.svc, localhost,
#                          127.0.0.1 and each EXTRA_SAN, e.g. a DNS name or IP of yours)
#   root.crt  root.key     etcd's root user (CN root): for etcd_auth and operators only
#   fluxmq.crt fluxmq.key  the FluxMQ nodes' etcd user (CN fluxmq)
# etcd runs with --client-cert-auth: a client needs a certificate of this CA, and with etcd's
# authentication on (python -m fluxmq.metadata.etcd_auth) its common name is its etcd user.
# Keys are mode 0644 inside the 0700 directory: containers running as another user (the node
# image runs as uid 10001) read them through single-file mounts; nobody else on the host can.
set -eu
dir=${1:?usage: deploy/etcd-pki.sh DIR [EXTRA_SAN...]}
shift
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

sans="DNS:etcd,DNS:etcd.fluxmq.svc,DNS:etcd.fluxmq.svc.cluster.local,DNS:etcd-0.etcd,DNS:etcd-0.etcd.fluxmq.svc,DNS:localhost,IP:127.0.0.1"
for san in "$@"; do
  case $san in
    *[!0-9.]*) sans="$sans,DNS:$san" ;;
    *) sans="$sans,IP:$san" ;;
  esac
done

openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/ca.key"
openssl req -x509 -new -key "$tmp/ca.key" -subj "/CN=fluxmq etcd CA" -days 3650 -sha256 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$dir/ca.crt"

issue() {  # name CN extendedKeyUsage [subjectAltName]
  openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/$1.ec"
  openssl pkcs8 -topk8 -nocrypt -in "$tmp/$1.ec" -out "$dir/$1.key"
  openssl req -new -key "$dir/$1.key" -subj "/CN=$2" -out "$tmp/$1.csr"
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n' "$3" > "$tmp/$1.ext"
  if [ -n "${4:-}" ]; then printf 'subjectAltName=%s\n' "$4" >> "$tmp/$1.ext"; fi
  openssl x509 -req -in "$tmp/$1.csr" -CA "$dir/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
    -CAserial "$tmp/ca.srl" -days 825 -sha256 -extfile "$tmp/$1.ext" -out "$dir/$1.crt" 2>/dev/null
  chmod 0644 "$dir/$1.key" "$dir/$1.crt"
}

issue etcd etcd serverAuth,clientAuth "$sans"
issue root root clientAuth
issue fluxmq fluxmq clientAuth
chmod 0644 "$dir/ca.crt"
echo "etcd certificates in $dir (CA key discarded)"
