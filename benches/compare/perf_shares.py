#!/usr/bin/env python3
"""Where a proxy's CPU goes, from `perf report` of a profiled run.

    perf_shares.py LABEL=REPORT.txt ...

Each REPORT.txt is `perf report --stdio --no-children --sort dso,sym -g none
--percent-limit 0` of one target's profile (benches/compare/run.sh,
PROFILE=1). Prints a Markdown table: for each LABEL, the share of its
samples in each kind of work, and then each LABEL's heaviest symbols.

The kinds, by symbol and object (the first rule that matches wins):
- kernel: anything in the kernel (system calls, TCP, loopback, the
  scheduler, copies between user and kernel memory);
- TLS record crypto: AES-GCM (and GHASH, ChaCha20-Poly1305), whether in
  aws-lc (linked into the gateway) or OpenSSL's libcrypto (HAProxy);
- TLS handshake crypto: signatures, key exchange, hashes and big numbers;
- TLS protocol: rustls, libssl and HAProxy's ssl_sock layer around them;
- HTTP: parsing and writing HTTP/1.1 and HTTP/2 (hyper, httparse, h2,
  http; HAProxy's h1/h2/htx/http/hpack);
- gateway's own: the gate, injection, the reply filter (aho-corasick),
  records (talos_*);
- allocation: malloc, free and their kin (glibc; HAProxy's pools);
- copying: memcpy, memmove, memset;
- runtime: the event loop and task scheduling (tokio, mio, futures, std's
  synchronisation; HAProxy's scheduler, fd and connection layers);
- other: the rest (in HAProxy, samples in its static functions, which its
  stripped binary does not name, are "other").
"""

import re
import sys

LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S+)\s+\[(.)\]\s+(.*?)\s*$")

KINDS = [
    ("kernel", lambda dso, kind, sym: kind == "k" or dso.startswith("[kernel")),
    (
        "TLS record crypto",
        lambda dso, kind, sym: re.search(
            r"aes|gcm|ghash|gfmul|chacha|poly1305|CRYPTO_ctr|vpaes|bsaes",
            sym,
            re.I,
        ),
    ),
    (
        "TLS handshake crypto",
        lambda dso, kind, sym: re.search(
            r"sha256|sha512|sha1|sha3|keccak|x25519|curve25519|p256|p384|ecp_|ec_|ecdsa|"
            r"bn_|BN_|rsa|RSA|mont|hkdf|HKDF|hmac|HMAC|EVP_Digest|fiat_|ed25519|ring::",
            sym,
        ),
    ),
    (
        "TLS protocol",
        lambda dso, kind, sym: dso.startswith("libssl")
        or dso.startswith("libcrypto")
        or re.search(r"rustls|tokio_rustls|aws_lc|ssl_sock|SSL_|ssl3_|tls1_|tls13_|ossl_", sym),
    ),
    (
        "HTTP",
        lambda dso, kind, sym: re.search(
            r"hyper::|httparse|\bh2::|<h2::|http::|hpack|hyper_util|"
            r"^(h1|h2|htx|http|hpack|h1c|h2c|h1s|h2s)_",
            sym,
        ),
    ),
    (
        "gateway's own",
        lambda dso, kind, sym: re.search(r"talos_|aho_corasick", sym),
    ),
    (
        "allocation",
        lambda dso, kind, sym: re.search(
            r"malloc|free|realloc|calloc|_int_|tcache|^pool_|__rust_alloc|__rust_dealloc|"
            r"__rdl_|sdallocx|mallocx",
            sym,
        ),
    ),
    ("copying", lambda dso, kind, sym: re.search(r"memcpy|memmove|memset|memcmp|bcmp", sym)),
    (
        "runtime",
        lambda dso, kind, sym: re.search(
            r"tokio::|mio::|futures|parking_lot|std::sync|std::thread|crossbeam|"
            r"__pthread|pthread_|epoll|^(run_tasks|process_runnable|fd_|_do_poll|task_|tasklet|"
            r"sc_|se_|si_|conn_|stream_|listener_|sock_|raw_sock|_task|wake)",
            sym,
        ),
    ),
]


def kind_of(dso, kind, sym):
    for name, rule in KINDS:
        if rule(dso, kind, sym):
            return name
    return "other"


def read(path):
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                rows.append((float(m.group(1)), m.group(2), m.group(3), m.group(4)))
    return rows


def main():
    if len(sys.argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    labels, shares, tops = [], {}, {}
    for arg in sys.argv[1:]:
        label, _, path = arg.partition("=")
        rows = read(path)
        total = sum(r[0] for r in rows) or 1.0
        labels.append(label)
        per = {}
        for pct, dso, kind, sym in rows:
            k = kind_of(dso, kind, sym)
            per[k] = per.get(k, 0.0) + pct * 100.0 / total
        shares[label] = per
        tops[label] = sorted(rows, key=lambda r: -r[0])[:12]
    order = [k for k, _ in KINDS] + ["other"]
    print("| share of the CPU samples | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for k in order:
        cells = [f"{shares[l].get(k, 0.0):.1f} %" for l in labels]
        print(f"| {k} | " + " | ".join(cells) + " |")
    for l in labels:
        print(f"\nHeaviest symbols, {l}:")
        for pct, dso, kind, sym in tops[l]:
            print(f"  {pct:5.2f} %  {kind_of(dso, kind, sym):<20} {dso} {sym[:110]}")


if __name__ == "__main__":
    main()
