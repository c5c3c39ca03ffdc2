#!/usr/bin/env bash
# Regenerates the extender's TLS test fixtures (never used outside tests): a CA for the server,
# a server certificate for 127.0.0.1 and xshare-extender.kube-system.svc, a CA for clients
# (what kube-scheduler's extender tlsConfig presents), a client certificate it signed, and a
# client certificate of another CA (which the extender must refuse), and one of the client CA
# naming someone else (refused under --client-name). Valid for 100 years.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
days=36500
ca() { # name subject
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days $days \
        -subj "/CN=$2" -keyout "$1.key" -out "$1.crt" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}
leaf() { # name ca subject eku san
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$3" \
        -keyout "$1.key" -out "$1.csr" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n%s\n' "$4" "$5" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days $days \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}
ca server-ca "xshare test server CA"
ca client-ca "xshare test client CA"
ca other-ca "another CA"
leaf server server-ca "xshare-extender.kube-system.svc" serverAuth \
    "subjectAltName=DNS:xshare-extender.kube-system.svc,IP:127.0.0.1"
leaf scheduler client-ca "xshare-scheduler" clientAuth "subjectAltName=DNS:xshare-scheduler"
leaf other-client client-ca "tenant" clientAuth "subjectAltName=DNS:tenant.example"
leaf stranger other-ca "xshare-scheduler" clientAuth "subjectAltName=DNS:xshare-scheduler"
rm -f ./*.srl server-ca.key client-ca.key other-ca.key
