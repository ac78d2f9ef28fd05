#!/usr/bin/env bash
# Makes the TLS files of the tests in DIR (default .): a CA (ca.pem, ca.key), another CA
# (other.pem), and a server and a client certificate signed by the first (server.pem/.key,
# client.pem/.key) naming 127.0.0.1 and localhost. EC P-256 keys, valid 2 days; needs the
# openssl tool (scripts/install_deps.sh installs it).
set -euo pipefail
cd "${1:-.}"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
key ca.key
openssl req -x509 -new -key ca.key -subj /CN=kvtrim-test-ca -days 2 -out ca.pem
key other.key
openssl req -x509 -new -key other.key -subj /CN=other-ca -days 2 -out other.pem
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext
for who in server client; do
  key "$who.key"
  openssl req -new -key "$who.key" -subj "/CN=$who" -out "$who.csr"
  openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile san.ext -out "$who.pem"
done
