#!/bin/sh
# Makes every common client in a session container trust what the session
# CA file, /etc/hangar/session-ca.pem, holds, and nothing else
# (docs/clients.md): the session CA alone, or, for a session whose
# allowlist holds a passthrough name (the model route), the session CA
# and the public roots after it.
#
# The worker writes that file (what `control-stub sandbox trust` prints:
# the CA certificates of both gateway members, then the public roots when
# the session lists a passthrough name) and sets six variables
# (SSL_CERT_FILE, CURL_CA_BUNDLE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS,
# GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, GIT_SSL_CAINFO):
# enough for curl, Python, pip, Node, git and grpcio. Not for Java (a
# truststore), Chromium (an NSS database or a policy, and encrypted client
# hello off), Firefox (a policy), wget built with GnuTLS (its own setting),
# nor for programs that read only the system's bundle.
#
#   trust-session-ca.sh install   at image build, as root: copies this
#                                 script to /usr/local/sbin/hangar-trust and
#                                 writes what points at the CA file by path
#                                 (system bundle links, wgetrc, variables).
#   trust-session-ca.sh apply     at every container start, as root, before
#                                 the agent runs (the default): everything
#                                 built from the file's certificates (Java's
#                                 truststore, NSS databases, the Chromium
#                                 and Firefox policies), and the install
#                                 steps again.
#
# The CA changes at every attempt (start, resume, recovery) and containers
# start fresh at each, so `apply` belongs in the container's entrypoint
# (run `install` last in the image build: update-ca-certificates would
# write the system bundle again):
#   ENTRYPOINT ["/bin/sh", "-c", "hangar-trust apply && . /etc/hangar/trust/env && exec \"$@\"", "--"]
#
# Environment:
#   HANGAR_SESSION_CA  the CA file (default /etc/hangar/session-ca.pem)
#   HANGAR_NSS_HOMES   home directories to give an NSS database
#                      (default: /root, every /home/* and $HOME)
#   HANGAR_JAVA_HOMES  JDK/JRE homes whose default truststore to replace
#                      (default: every one under /usr/lib/jvm, /opt,
#                      /usr/local and $JAVA_HOME)
#   HANGAR_DNS         the gateway's DNS answerer on the session network
#                      (its [dns] address): `apply` writes /etc/resolv.conf
#                      naming it alone, with no search domain. The
#                      gateway's packet rules bring every DNS query to it
#                      whatever nameserver it names, so this only saves a
#                      client a wrong first guess; unset, resolv.conf is
#                      left as the runtime wrote it.
#
# POSIX sh, no bash: images differ. Uses certutil (NSS) when the image has
# it, and says so when it has not; base64 (or openssl) and sha1sum (or
# openssl) for Java's truststore, which it writes itself.
set -eu

CA=${HANGAR_SESSION_CA:-/etc/hangar/session-ca.pem}
TRUST=/etc/hangar/trust
INSTALLED=/usr/local/sbin/hangar-trust

say() { echo "hangar-trust: $*" >&2; }
die() {
  say "$*"
  exit 1
}

# The system bundles that programs read when no variable names a file
# (Debian and Ubuntu; Fedora and RHEL; Alpine; openSUSE). Each becomes a
# link to the session CA file, so it follows every new attempt's CA. (The
# same list, in the same order, is where `control-stub sandbox trust`
# looks for the public roots on its own host: control-stub/src/trust.rs.)
SYSTEM_BUNDLES="/etc/ssl/certs/ca-certificates.crt
/etc/pki/tls/certs/ca-bundle.crt
/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem
/etc/ssl/cert.pem
/etc/ssl/ca-bundle.pem"

# Variables beside the worker's six, each read by a client that ignores
# those: pip (its own bundle), the AWS SDKs and CLI, httplib2, cargo, Deno,
# Nix, the gcloud CLI, Bundler.
EXTRA_VARIABLES="PIP_CERT AWS_CA_BUNDLE HTTPLIB2_CA_CERTS CARGO_HTTP_CAINFO DENO_CERT NIX_SSL_CERT_FILE CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE BUNDLE_SSL_CA_CERT"
WORKER_VARIABLES="SSL_CERT_FILE CURL_CA_BUNDLE REQUESTS_CA_BUNDLE NODE_EXTRA_CA_CERTS GRPC_DEFAULT_SSL_ROOTS_FILE_PATH GIT_SSL_CAINFO"

# --- the steps that point at the CA file by path

install_paths() {
  mkdir -p "$TRUST"
  # The variables, for the entrypoint and for login shells.
  {
    echo "# Written by hangar-trust: every client's CA setting, the session CA file."
    for v in $WORKER_VARIABLES $EXTRA_VARIABLES; do
      echo "export $v=$CA"
    done
  } >"$TRUST/env.tmp"
  mv "$TRUST/env.tmp" "$TRUST/env"
  if [ -d /etc/profile.d ]; then
    echo ". $TRUST/env" >/etc/profile.d/hangar-session-ca.sh
  fi

  for bundle in $SYSTEM_BUNDLES; do
    # Only the bundles this distribution has (or links to).
    if [ -e "$bundle" ] || [ -L "$bundle" ]; then
      ln -sfn "$CA" "$bundle"
    fi
  done

  # wget built with GnuTLS reads neither SSL_CERT_FILE nor the variables
  # above; its own setting, in the system wgetrc.
  for wgetrc in /etc/wgetrc /usr/local/etc/wgetrc; do
    if [ -e "$wgetrc" ] || { [ "$wgetrc" = /etc/wgetrc ] && command -v wget >/dev/null 2>&1; }; then
      if [ -e "$wgetrc" ]; then
        grep -v '^[[:space:]]*ca_certificate[[:space:]]*=' "$wgetrc" >"$wgetrc.tmp" || true
      else
        : >"$wgetrc.tmp"
      fi
      echo "ca_certificate = $CA" >>"$wgetrc.tmp"
      mv "$wgetrc.tmp" "$wgetrc"
    fi
  done

  if [ "$(realpath "$0" 2>/dev/null || echo "$0")" != "$INSTALLED" ]; then
    mkdir -p "$(dirname "$INSTALLED")"
    cp "$0" "$INSTALLED"
    chmod 0755 "$INSTALLED"
  fi
}

# --- the steps built from the file's certificates

# Split the bundle, in one pass, into one PEM file per certificate,
# session-ca-N.pem, and its body as one line of base64 (no line ends, no
# carriage returns or blanks), session-ca-N.b64: what Java's store and
# Chromium's policy are made from.
split_bundle() {
  rm -f "$TRUST"/session-ca-*.pem "$TRUST"/session-ca-*.b64
  awk -v dir="$TRUST" '
    { sub(/\r$/, "") }
    /-----BEGIN CERTIFICATE-----/ { file = sprintf("%s/session-ca-%d", dir, n++); inside = 1; body = "" }
    inside { print > (file ".pem") }
    inside && !/-----/ { gsub(/[ \t]/, ""); body = body $0 }
    /-----END CERTIFICATE-----/ && inside { inside = 0; close(file ".pem"); print body > (file ".b64"); close(file ".b64") }
    END { if (n == 0) exit 1 }
  ' "$CA" || die "$CA holds no PEM certificate"
}

# Binary output without a fork: each byte as printf's octal escape. (No
# `local` in POSIX sh: these helpers' variables start with an underscore.)
#
# The number $1 as $2 big-endian bytes.
be() {
  _v=$1 _n=$2 _f=""
  while [ "$_n" -gt 0 ]; do
    _n=$((_n - 1))
    _b=$(((_v >> (8 * _n)) & 255))
    _f="$_f\\$(((_b >> 6) & 7))$(((_b >> 3) & 7))$((_b & 7))"
  done
  # shellcheck disable=SC2059 # the format is the bytes
  printf "$_f"
}

# The bytes a string of hex digits names.
unhex() {
  _h=$1 _f=""
  while [ -n "$_h" ]; do
    _r=${_h#??}
    _b=$((0x${_h%"$_r"}))
    _h=$_r
    _f="$_f\\$(((_b >> 6) & 7))$(((_b >> 3) & 7))$((_b & 7))"
  done
  # shellcheck disable=SC2059 # the format is the bytes
  printf "$_f"
}

base64_decode() {
  if command -v base64 >/dev/null 2>&1; then
    base64 -d
  elif command -v openssl >/dev/null 2>&1; then
    openssl base64 -d
  else
    die "neither base64 nor openssl: Java's truststore cannot be written"
  fi
}

sha1_hex() {
  if command -v sha1sum >/dev/null 2>&1; then
    sha1sum | cut -c1-40
  elif command -v openssl >/dev/null 2>&1; then
    openssl dgst -sha1 -r | cut -c1-40
  else
    die "neither sha1sum nor openssl: Java's truststore cannot be written"
  fi
}

# Java's truststore, in the JKS format every JVM reads (JDK 8 as its
# default type; JDK 9 and later whichever type a program asks for, by
# keystore.type.compat; Debian's own /etc/ssl/certs/java/cacerts is one),
# written here rather than by keytool: keytool imports one certificate per
# JVM start, a fifth of a second each, which with the public roots (about
# 150) would hold every container start for half a minute. The format
# (the JDK's sun.security.provider.JavaKeyStore): magic FEEDFEED, version
# 2, the entry count; per entry tag 2 (a trusted certificate), the alias
# and the time (ms) as Java's writeUTF and writeLong, the type "X.509",
# the DER's length and the DER; then SHA-1 over the password (UTF-16BE),
# "Mighty Aphrodite" and all of the above, which a JVM checks when given
# the password and skips without one. A truststore holds public
# certificates only; Java tools expect some password, and this well-known
# one, changeit, protects nothing.
write_jks() {
  out=$1
  set -- "$TRUST"/session-ca-*.pem
  now=$(($(date +%s) * 1000))
  {
    be $((0xfeedfeed)) 4
    be 2 4
    be $# 4
    for pem in "$@"; do
      entry=hangar-${pem##*/}
      entry=${entry%.pem}
      base64_decode <"${pem%.pem}.b64" >"$TRUST/cert.der" ||
        die "$pem: its base64 does not decode"
      len=$(wc -c <"$TRUST/cert.der")
      be 2 4
      be ${#entry} 2
      printf '%s' "$entry"
      be "$now" 8
      be 5 2
      printf 'X.509'
      be $((len)) 4
      cat "$TRUST/cert.der"
    done
  } >"$out.body"
  rm -f "$TRUST/cert.der"
  # The password "changeit" as Java's chars: UTF-16BE.
  digest=$({
    printf '\000c\000h\000a\000n\000g\000e\000i\000t'
    printf 'Mighty Aphrodite'
    cat "$out.body"
  } | sha1_hex)
  [ ${#digest} -eq 40 ] || die "no SHA-1 of Java's truststore"
  { cat "$out.body" && unhex "$digest"; } >"$out"
  rm -f "$out.body"
}

apply_java() {
  # A store of every certificate of the file, in place of every JDK's
  # default truststore, and in /etc/hangar/trust for a JDK elsewhere.
  store="$TRUST/java-cacerts.jks"
  write_jks "$store.tmp"
  mv "$store.tmp" "$store"
  chmod 0644 "$store"
  homes=${HANGAR_JAVA_HOMES:-}
  if [ -z "$homes" ]; then
    homes=$(for d in /usr/lib/jvm/* /opt/* /opt/java/* /usr/local/* ${JAVA_HOME:-}; do
      [ -f "$d/lib/security/cacerts" ] || [ -L "$d/lib/security/cacerts" ] || [ -f "$d/jre/lib/security/cacerts" ] && echo "$d"
    done | sort -u)
  fi
  # Every JVM's default truststore becomes the session's: nothing to set
  # per program, and no JAVA_TOOL_OPTIONS line on every JVM's stderr.
  # Debian's JDKs link theirs to /etc/ssl/certs/java/cacerts.
  targets="/etc/ssl/certs/java/cacerts"
  for h in $homes; do
    for f in "$h/lib/security/cacerts" "$h/jre/lib/security/cacerts"; do
      { [ -e "$f" ] || [ -L "$f" ]; } && targets="$targets $f"
    done
  done
  for f in $targets; do
    if [ -e "$f" ] || [ -L "$f" ]; then
      real=$(realpath "$f")
      cp "$store" "$real.hangar.tmp" && mv "$real.hangar.tmp" "$real"
    fi
  done
}

apply_nss() {
  if ! command -v certutil >/dev/null 2>&1; then
    say "no certutil (Debian: libnss3-tools): no NSS database made; Chromium still trusts the CA through its policy"
    return 0
  fi
  homes=${HANGAR_NSS_HOMES:-$(for d in /root /home/* ${HOME:-}; do [ -d "$d" ] && echo "$d"; done | sort -u)}
  [ -n "$homes" ] || return 0
  # Every certificate of the file, in one certutil process (-B: a batch
  # of its commands). C,,: a CA trusted to issue TLS server certificates,
  # nothing else.
  batch="$TRUST/nss-add.batch"
  for pem in "$TRUST"/session-ca-*.pem; do
    entry=hangar-${pem##*/}
    echo "-A -n ${entry%.pem} -t C,, -a -i $pem"
  done >"$batch"
  # Each database is changed in a copy where writes reach no disk
  # (/dev/shm), then copied back: each certificate added or removed is a
  # commit of NSS's SQLite database, which on a disk waits for a sync, and
  # the public roots are about 150 of them (seconds, where this takes a
  # third of one).
  shm=$TRUST
  [ -d /dev/shm ] && [ -w /dev/shm ] && shm=/dev/shm
  for home in $homes; do
    db="$home/.pki/nssdb"
    work=$(mktemp -d "$shm/hangar-nssdb.XXXXXX")
    if [ -e "$db/cert9.db" ]; then
      for f in cert9.db key4.db pkcs11.txt; do
        [ ! -e "$db/$f" ] || cp "$db/$f" "$work/"
      done
      # The previous attempt's out; anything else the database holds is
      # left alone.
      certutil -L -d "sql:$work" | awk '/^hangar-session-ca-/ { print "-D -n " $1 }' >"$work/remove.batch"
      [ ! -s "$work/remove.batch" ] || certutil -B -d "sql:$work" -i "$work/remove.batch" >/dev/null
    else
      certutil -N -d "sql:$work" --empty-password
    fi
    certutil -B -d "sql:$work" -i "$batch" >/dev/null
    mkdir -p "$db"
    for f in cert9.db key4.db pkcs11.txt; do
      [ ! -e "$work/$f" ] || cp "$work/$f" "$db/"
    done
    rm -rf "$work"
    owner=$(stat -c %u:%g "$home")
    chown -R "$owner" "$home/.pki"
    chmod 0700 "$home/.pki" "$db"
  done
  rm -f "$batch"
}

apply_firefox() {
  # Firefox (and Firefox ESR) read enterprise policies at start: the CAs
  # from their files, no ECH (the gateway cannot name the destination of
  # an encrypted hello), no HTTP/3.
  mkdir -p /etc/firefox/policies
  files=""
  for pem in "$TRUST"/session-ca-*.pem; do
    files="$files${files:+, }\"$pem\""
  done
  cat >/etc/firefox/policies/policies.json <<EOF
{
  "policies": {
    "Certificates": {"ImportEnterpriseRoots": false, "Install": [$files]},
    "Preferences": {
      "network.dns.echconfig.enabled": {"Value": false, "Status": "locked"},
      "network.dns.http3_echconfig.enabled": {"Value": false, "Status": "locked"},
      "network.http.http3.enable": {"Value": false, "Status": "locked"}
    }
  }
}
EOF
  chmod 0644 /etc/firefox/policies/policies.json
}

apply_chromium() {
  # CACertificates: the certificates as base64 DER, which is a PEM's body.
  certs=$(awk 'NR > 1 { printf ", " } { printf "\"%s\"", $0 }' "$TRUST"/session-ca-*.b64)
  for dir in /etc/chromium/policies/managed /etc/opt/chrome/policies/managed; do
    mkdir -p "$dir"
    cat >"$dir/hangar-session.json" <<EOF
{
  "CACertificates": [$certs],
  "EncryptedClientHelloEnabled": false,
  "QuicAllowed": false
}
EOF
    chmod 0644 "$dir/hangar-session.json"
  done
}

# The resolver: the gateway's answerer alone (docs/clients.md, "Names").
# A runtime may bind-mount /etc/resolv.conf: it is written in place.
apply_dns() {
  [ -n "${HANGAR_DNS:-}" ] || return 0
  case "$HANGAR_DNS" in
    *[!0-9a-fA-F.:]*) die "HANGAR_DNS=$HANGAR_DNS is no IP address" ;;
  esac
  printf '# Written by hangar-trust: the gateway answers the session'"'"'s names.\nnameserver %s\noptions timeout:2 attempts:2\n' \
    "$HANGAR_DNS" >/etc/resolv.conf
}

apply() {
  [ -r "$CA" ] || die "$CA is missing: the worker writes it when the container starts"
  apply_dns
  install_paths
  split_bundle
  apply_java
  apply_nss
  apply_chromium
  apply_firefox
  n=$(ls "$TRUST"/session-ca-*.pem | wc -l)
  say "session CA set up ($n certificate(s)): system bundle, variables, wget, Java, NSS, Chromium, Firefox${HANGAR_DNS:+; resolver $HANGAR_DNS}"
}

[ "$(id -u)" -eq 0 ] || die "run as root (it writes under /etc)"
case "${1:-apply}" in
  install) install_paths ;;
  apply) apply ;;
  *) die "usage: $0 [install|apply]" ;;
esac
