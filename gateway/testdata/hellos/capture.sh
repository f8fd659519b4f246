#!/usr/bin/env bash
# Captures real ClientHellos from the TLS clients installed on this machine.
#
#   capture.sh             rewrite every capture: runs the ignored Rust test
#                          `capture_real_hellos`, which listens on 127.0.0.1:0
#                          with talos_gateway::capture::capture_hellos, calls
#                          `capture.sh run PORT` for the external clients and
#                          then connects its own rustls clients
#   capture.sh names       the external clients' capture names, in order
#   capture.sh run PORT    run each external client once against 127.0.0.1:PORT,
#                          in the order of `names` (the listener takes one
#                          connection per name)
#   capture.sh versions    the version of each client, for README.md
#
# Every client fails its handshake: the listener closes after the hello.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
names=(curl-http1.1 curl-http2 curl-tls1.2 openssl-alpn openssl-noservername
       python-ssl node-tls wget-gnutls java-jsse)

# Each client gets a bounded time; a failure to finish is not an error.
bounded() { timeout 20 "$@" </dev/null >/dev/null 2>&1 || true; }

client() {
    local name="$1" port="$2"
    local url="https://example.test/" to="example.test:443:127.0.0.1:$port"
    case "$name" in
    curl-http1.1) bounded curl -sS --http1.1 "$url" --connect-to "$to" ;;
    curl-http2) bounded curl -sS --http2 "$url" --connect-to "$to" ;;
    curl-tls1.2) bounded curl -sS --tls-max 1.2 "$url" --connect-to "$to" ;;
    openssl-alpn)
        bounded openssl s_client -connect "127.0.0.1:$port" \
            -servername example.test -alpn h2,http/1.1 ;;
    openssl-noservername)
        bounded openssl s_client -connect "127.0.0.1:$port" -noservername ;;
    python-ssl)
        bounded python3 -c '
import socket, ssl, sys
ctx = ssl.create_default_context()
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
ctx.wrap_socket(sock, server_hostname="example.test")
' "$port" ;;
    node-tls)
        bounded node -e '
require("tls").connect({host: "127.0.0.1", port: Number(process.argv[1]),
  servername: "example.test", ALPNProtocols: ["h2", "http/1.1"]}).on("error", () => {});
' "$port" ;;
    # wget has no --connect-to: it names the loopback host itself.
    wget-gnutls) bounded wget -q -O /dev/null --tries=1 "https://localhost:$port/" ;;
    java-jsse)
        local src
        src="$(mktemp -d)/Hello.java"
        cat >"$src" <<'JAVA'
import java.util.List;
import javax.net.ssl.*;
public class Hello {
    public static void main(String[] args) throws Exception {
        SSLSocket s = (SSLSocket) SSLSocketFactory.getDefault()
            .createSocket("127.0.0.1", Integer.parseInt(args[0]));
        SSLParameters p = s.getSSLParameters();
        p.setServerNames(List.of(new SNIHostName("example.test")));
        p.setApplicationProtocols(new String[] {"h2", "http/1.1"});
        s.setSSLParameters(p);
        try { s.startHandshake(); } catch (Exception e) { }
    }
}
JAVA
        bounded java "$src" "$port"
        rm -rf "$(dirname "$src")" ;;
    *) echo "unknown client $name" >&2; exit 2 ;;
    esac
}

case "${1:-all}" in
names) printf '%s\n' "${names[@]}" ;;
run)
    port="${2:?usage: capture.sh run PORT}"
    for name in "${names[@]}"; do
        echo "capture.sh: $name" >&2
        client "$name" "$port"
    done ;;
versions)
    curl --version | head -1
    openssl version
    python3 -c 'import ssl, sys; print("Python", sys.version.split()[0], ssl.OPENSSL_VERSION)'
    echo "node $(node --version) OpenSSL $(node -p process.versions.openssl)"
    wget --version | head -1
    dpkg-query -W -f='libgnutls30 ${Version}\n' libgnutls30 2>/dev/null || true
    java -version 2>&1 | head -1
    grep -A1 '^name = "rustls"$' "$here/../../../Cargo.lock" | tail -1 ;;
all)
    cd "$here/../.."
    cargo test -p talos-gateway --test hello_captures capture_real_hellos -- --ignored --nocapture ;;
*) echo "usage: capture.sh [names | run PORT | versions]" >&2; exit 2 ;;
esac
