#!/usr/bin/env python3
"""A Web Push endpoint of the tests' own: a browser and its push service in
one, written apart from the control plane's Rust code (Python's
`cryptography` package only), so that the two implementations check each
other.

It makes one subscription per name it is given, as a browser would (a
P-256 key pair and a 16-byte auth secret, RFC 8291 section 3.2), serves
HTTPS on 127.0.0.1 (port chosen by the kernel), and for every POST to a
subscription's endpoint:

- checks the headers RFC 8030 asks of a push message (TTL,
  Content-Encoding: aes128gcm) and notes Urgency and Topic;
- checks the VAPID token (RFC 8292): `Authorization: vapid t=JWT, k=KEY`,
  the JWT's header (typ JWT, alg ES256), its claims (aud this endpoint's
  origin, exp in the future and at most 24 hours away, sub a mailto: or
  https: contact) and its ES256 signature (r || s) under k;
- decrypts the body as RFC 8291 and RFC 8188 say, with the subscription's
  private key and auth secret: one record, its padding, its delimiter;
- writes one JSON line to the record file (flushed and synced before the
  answer leaves), then answers with the subscription's next status (the
  last one repeats).

Usage: push_endpoint.py --cert PEM --key PEM --record FILE
                        --subscription NAME=STATUS[,STATUS...] ...
       push_endpoint.py --self-test   (RFC 8291 Appendix A, decrypted)

Its first line on standard output is JSON: the port and each
subscription as `PushSubscription.toJSON()` gives it. It runs until
killed.
"""

import argparse
import base64
import json
import os
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, hmac, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

# A message is one record of at most 4096 bytes (RFC 8030 section 7.2);
# anything larger is refused before it is read.
MAX_BODY = 8192
MAX_TOKEN_LIFE = 24 * 60 * 60


def b64d(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def b64e(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hkdf(salt, ikm, info, length):
    mac = hmac.HMAC(salt, hashes.SHA256())
    mac.update(ikm)
    prk = mac.finalize()
    return HKDFExpand(hashes.SHA256(), length, info).derive(prk)


def public_bytes(private_key):
    return private_key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


def decrypt(body, ua_private, auth):
    """The aes128gcm body opened as a user agent would (RFC 8291 3.4,
    RFC 8188 2). Raises ValueError naming what is wrong."""
    if len(body) < 21:
        raise ValueError("body shorter than the aes128gcm header")
    salt = body[:16]
    rs = int.from_bytes(body[16:20], "big")
    idlen = body[20]
    if idlen != 65:
        raise ValueError("key id is %d bytes, not a P-256 point" % idlen)
    as_public = body[21:21 + idlen]
    record = body[21 + idlen:]
    if rs < 18:
        raise ValueError("record size %d under 18" % rs)
    if len(record) > rs:
        raise ValueError("more than one record (%d bytes, rs %d)" % (len(record), rs))
    ua_public = public_bytes(ua_private)
    peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), as_public)
    shared = ua_private.exchange(ec.ECDH(), peer)
    ikm = hkdf(auth, shared, b"WebPush: info\x00" + ua_public + as_public, 32)
    cek = hkdf(salt, ikm, b"Content-Encoding: aes128gcm\x00", 16)
    nonce = hkdf(salt, ikm, b"Content-Encoding: nonce\x00", 12)
    try:
        padded = AESGCM(cek).decrypt(nonce, record, None)
    except InvalidTag:
        raise ValueError("the record does not open (wrong key, auth or body)")
    end = len(padded)
    while end > 0 and padded[end - 1] == 0:
        end -= 1
    if end == 0 or padded[end - 1] != 0x02:
        raise ValueError("no last-record delimiter (0x02)")
    return padded[:end - 1], rs


def check_vapid(header, origin):
    """The VAPID header's claims if it holds (RFC 8292); raises ValueError."""
    if not header or not header.startswith("vapid "):
        raise ValueError("no vapid Authorization")
    params = {}
    for part in header[len("vapid "):].split(","):
        name, _, value = part.strip().partition("=")
        params[name] = value
    token, k = params.get("t"), params.get("k")
    if not token or not k:
        raise ValueError("vapid without t or k")
    pieces = token.split(".")
    if len(pieces) != 3:
        raise ValueError("the token is not a JWS compact serialisation")
    head = json.loads(b64d(pieces[0]))
    if head.get("alg") != "ES256" or head.get("typ") != "JWT":
        raise ValueError("token header %r" % head)
    claims = json.loads(b64d(pieces[1]))
    if claims.get("aud") != origin:
        raise ValueError("aud %r is not %r" % (claims.get("aud"), origin))
    now = time.time()
    exp = claims.get("exp")
    if not isinstance(exp, int) or exp <= now or exp > now + MAX_TOKEN_LIFE:
        raise ValueError("exp %r is not within 24 hours from now" % exp)
    sub = claims.get("sub", "")
    if not (sub.startswith("mailto:") or sub.startswith("https:")):
        raise ValueError("sub %r is neither mailto: nor https:" % sub)
    signature = b64d(pieces[2])
    if len(signature) != 64:
        raise ValueError("signature of %d bytes, not r || s" % len(signature))
    key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b64d(k))
    der = encode_dss_signature(
        int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    )
    try:
        key.verify(der, (pieces[0] + "." + pieces[1]).encode(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise ValueError("the ES256 signature does not verify under k")
    return claims, k


class Subscription:
    def __init__(self, name, statuses):
        self.name = name
        self.statuses = statuses
        self.calls = 0
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)

    def next_status(self):
        status = self.statuses[min(self.calls, len(self.statuses) - 1)]
        self.calls += 1
        return status


class Server(ThreadingHTTPServer):
    """TLS per connection in the connection's own thread: a client that
    never finishes its handshake holds only its thread, never the accept
    loop."""

    daemon_threads = True

    def finish_request(self, request, client_address):
        request.settimeout(30)
        try:
            request = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            request.close()
            return
        super().finish_request(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        server = self.server
        name = self.path.removeprefix("/push/")
        sub = server.subscriptions.get(name) if self.path.startswith("/push/") else None
        length = int(self.headers.get("Content-Length", "0") or "0")
        if length > MAX_BODY:
            self.answer(413)
            return
        body = self.rfile.read(length)
        problems = []
        entry = {
            "subscription": name,
            "ttl": self.headers.get("TTL"),
            "urgency": self.headers.get("Urgency"),
            "topic": self.headers.get("Topic"),
            "content_encoding": self.headers.get("Content-Encoding"),
            "body_len": len(body),
            "payload": None,
            "claims": None,
        }
        if sub is None:
            problems.append("no such subscription")
        else:
            ttl = self.headers.get("TTL", "")
            if not ttl.isdigit():
                problems.append("TTL %r is not a number of seconds" % ttl)
            if self.headers.get("Content-Encoding") != "aes128gcm":
                problems.append("Content-Encoding is not aes128gcm")
            try:
                claims, k = check_vapid(self.headers.get("Authorization"), server.origin)
                entry["claims"] = claims
                entry["k"] = k
            except (ValueError, KeyError, TypeError) as e:
                problems.append("vapid: %s" % e)
            try:
                plain, rs = decrypt(body, sub.private, sub.auth)
                entry["payload"] = plain.decode("utf-8")
                entry["record_size"] = rs
            except (ValueError, UnicodeDecodeError) as e:
                problems.append("body: %s" % e)
        with server.lock:
            if sub is None:
                status = 404
            elif problems:
                status = 400
            else:
                status = sub.next_status()
            entry["problems"] = problems
            entry["status"] = status
            server.record.write(json.dumps(entry) + "\n")
            server.record.flush()
            os.fsync(server.record.fileno())
        self.answer(status)


def self_test():
    """RFC 8291 Appendix A: the RFC's message opens to its plaintext."""
    ua_private = ec.derive_private_key(
        int.from_bytes(b64d("q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94"), "big"),
        ec.SECP256R1(),
    )
    body = b64d(
        "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIg"
        "Dll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVB"
        "St2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
    )
    plain, rs = decrypt(body, ua_private, b64d("BTBZMqHH6r4Tts7J_aSIgg"))
    assert plain == b"When I grow up, I want to be a watermelon", plain
    assert rs == 4096, rs
    print(json.dumps({"self_test": "ok"}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--record")
    parser.add_argument("--subscription", action="append", default=[])
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return
    subscriptions = {}
    for spec in args.subscription:
        name, _, statuses = spec.partition("=")
        subscriptions[name] = Subscription(name, [int(s) for s in statuses.split(",")])

    server = Server(("127.0.0.1", 0), Handler)
    server.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.context.load_cert_chain(args.cert, args.key)
    port = server.server_address[1]
    server.origin = "https://127.0.0.1:%d" % port
    server.subscriptions = subscriptions
    server.lock = threading.Lock()
    server.record = open(args.record, "a", encoding="utf-8")
    ready = {
        "port": port,
        "subscriptions": {
            name: {
                "endpoint": "%s/push/%s" % (server.origin, name),
                "keys": {"p256dh": b64e(public_bytes(s.private)), "auth": b64e(s.auth)},
            }
            for name, s in subscriptions.items()
        },
    }
    print(json.dumps(ready), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
