#!/bin/sh
# Makes every common client in a session container trust the session CA,
# /etc/hangar/session-ca.pem, and nothing else (docs/clients.md).
#
# The worker writes that file (the CA certificates of both gateway members)
# and sets six variables (SSL_CERT_FILE, CURL_CA_BUNDLE, REQUESTS_CA_BUNDLE,
# NODE_EXTRA_CA_CERTS, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, GIT_SSL_CAINFO):
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
#                                 built from the CA's contents (Java
#                                 truststores, NSS databases, the Chromium
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
# POSIX sh, no bash: images differ. Uses keytool and certutil (NSS) when
# the image has them, and says so when it has not.
set -eu

CA=${HANGAR_SESSION_CA:-/etc/hangar/session-ca.pem}
TRUST=/etc/hangar/trust
INSTALLED=/usr/local/sbin/hangar-trust
# A truststore holds public certificates only; Java tools expect some
# password, and this well-known one protects nothing.
STOREPASS=changeit

say() { echo "hangar-trust: $*" >&2; }
die() {
  say "$*"
  exit 1
}

# The system bundles that programs read when no variable names a file
# (Debian and Ubuntu; Fedora and RHEL; Alpine; openSUSE). Each becomes a
# link to the session CA file, so it follows every new attempt's CA.
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
    echo "# Written by hangar-trust: every client's CA setting, the session CA."
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

# --- the steps built from the CA's contents

# Split the bundle into one PEM file per certificate: session-ca-N.pem.
split_bundle() {
  rm -f "$TRUST"/session-ca-*.pem
  awk -v dir="$TRUST" '
    /-----BEGIN CERTIFICATE-----/ { n++; file = sprintf("%s/session-ca-%d.pem", dir, n - 1); inside = 1 }
    inside { print > file }
    /-----END CERTIFICATE-----/ { inside = 0; close(file) }
    END { if (n == 0) exit 1 }
  ' "$CA" || die "$CA holds no PEM certificate"
}

apply_java() {
  keytool=$(command -v keytool 2>/dev/null || true)
  homes=${HANGAR_JAVA_HOMES:-}
  if [ -z "$homes" ]; then
    homes=$(for d in /usr/lib/jvm/* /opt/* /opt/java/* /usr/local/* ${JAVA_HOME:-}; do
      [ -f "$d/lib/security/cacerts" ] || [ -L "$d/lib/security/cacerts" ] || [ -f "$d/jre/lib/security/cacerts" ] && echo "$d"
    done | sort -u)
  fi
  if [ -z "$keytool" ]; then
    for h in $homes; do
      [ -x "$h/bin/keytool" ] && keytool="$h/bin/keytool" && break
    done
  fi
  if [ -z "$keytool" ]; then
    [ -z "$homes" ] || say "Java found ($homes) but no keytool: Java is not set up"
    return 0
  fi
  # A PKCS#12 store without certificate encryption or MAC: any JVM reads
  # it with or without javax.net.ssl.trustStorePassword (as the JDK's own
  # cacerts since JDK 18).
  store="$TRUST/java-cacerts.p12"
  rm -f "$store.tmp"
  for pem in "$TRUST"/session-ca-*.pem; do
    alias=hangar-$(basename "$pem" .pem)
    "$keytool" -J-Dkeystore.pkcs12.certProtectionAlgorithm=NONE -J-Dkeystore.pkcs12.macAlgorithm=NONE \
      -importcert -noprompt -storetype PKCS12 -keystore "$store.tmp" -storepass "$STOREPASS" \
      -alias "$alias" -file "$pem" >"$TRUST/keytool.log" 2>&1 ||
      die "keytool could not import $pem: $(cat "$TRUST/keytool.log")"
  done
  rm -f "$TRUST/keytool.log"
  mv "$store.tmp" "$store"
  chmod 0644 "$store"
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
  for home in $homes; do
    db="$home/.pki/nssdb"
    if [ ! -e "$db/cert9.db" ]; then
      mkdir -p "$db"
      certutil -N -d "sql:$db" --empty-password
    fi
    # The previous attempt's CAs out, this one's in; anything else the
    # database holds is left alone.
    certutil -L -d "sql:$db" | awk '/^hangar-session-ca-/ { print $1 }' | while read -r old; do
      certutil -D -d "sql:$db" -n "$old"
    done
    for pem in "$TRUST"/session-ca-*.pem; do
      # C,,: a CA trusted to issue TLS server certificates, nothing else.
      certutil -A -d "sql:$db" -n "hangar-$(basename "$pem" .pem)" -t "C,," -a -i "$pem"
    done
    owner=$(stat -c %u:%g "$home")
    chown -R "$owner" "$home/.pki"
    chmod 0700 "$home/.pki" "$db"
  done
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
  # CACertificates: the CAs as base64 DER, which is a PEM's body.
  certs=""
  for pem in "$TRUST"/session-ca-*.pem; do
    b64=$(sed -e '/-----/d' "$pem" | tr -d '\n\r ')
    certs="$certs${certs:+, }\"$b64\""
  done
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
