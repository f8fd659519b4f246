#!/usr/bin/env python3
"""A person's passkey for the demo (scripts/demo.sh): a software
authenticator (ES256, P-256, attestation "none", user presence and
verification set) driving the people's web app over its own HTTPS
endpoints, as the app's pages drive a browser's authenticator (the same
requests the end-to-end tests' client makes, tests/src/people.rs).

  demo-passkey.py enrol LINK --state FILE --ca CA.pem --connect HOST:PORT
      Register a new passkey with the one-time enrolment LINK
      (`control-stub people enroll`). The private key is kept in FILE
      (mode 0600), never printed.
  demo-passkey.py decide CARD_ID approved|declined --state FILE --ca CA.pem --connect HOST:PORT [--digest HEX]
      Sign in with the passkey, read the card (GET /api/cards), and post
      the decision with an assertion over the challenge the server gives
      for that card and verdict. Prints the server's answer (JSON). With
      --digest, a card the person is not shown is decided anyway, over the
      challenge docs give for that digest (to show the server's refusal).

HOST:PORT is where the web app listens; TLS trusts only CA.pem and names
the relying party's host (the origin's) in SNI, as a browser would.
Python's standard library and the cryptography package only.
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import socket
import ssl
import sys
import urllib.parse

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

UP, UV, AT = 0x01, 0x04, 0x40


def b64u(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# ---- CBOR, the little a registration needs (RFC 8949, shortest heads) ----

def cbor_head(major, arg):
    major <<= 5
    if arg < 24:
        return bytes([major | arg])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if arg < 1 << (8 * size):
            return bytes([major | extra]) + arg.to_bytes(size, "big")
    raise ValueError("CBOR argument too large")


def cbor_int(value):
    return cbor_head(0, value) if value >= 0 else cbor_head(1, -1 - value)


def cbor_bytes(value):
    return cbor_head(2, len(value)) + value


def cbor_text(value):
    raw = value.encode()
    return cbor_head(3, len(raw)) + raw


def cose_es256(public_key):
    """The COSE_Key of a P-256 public key, labels in CTAP2's canonical order."""
    numbers = public_key.public_numbers()
    return (cbor_head(5, 5)
            + cbor_int(1) + cbor_int(2)      # kty: EC2
            + cbor_int(3) + cbor_int(-7)     # alg: ES256
            + cbor_int(-1) + cbor_int(1)     # crv: P-256
            + cbor_int(-2) + cbor_bytes(numbers.x.to_bytes(32, "big"))
            + cbor_int(-3) + cbor_bytes(numbers.y.to_bytes(32, "big")))


# ---- the passkey ----------------------------------------------------------

class Passkey:
    def __init__(self, state):
        self.state = state
        self.key = serialization.load_pem_private_key(state["private_key_pem"].encode(), password=None)
        self.credential_id = unb64u(state["credential_id"])

    @staticmethod
    def new(origin, rp_id):
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        return Passkey({
            "origin": origin,
            "rp_id": rp_id,
            "credential_id": b64u(secrets.token_bytes(32)),
            "sign_count": 0,
            "private_key_pem": pem,
        })

    def save(self, path):
        fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.state, f)
        os.replace(path + ".new", path)

    def client_data(self, kind, challenge):
        # Members in the order Chromium writes them.
        return json.dumps({"type": kind, "challenge": b64u(challenge), "origin": self.state["origin"],
                           "crossOrigin": False}, separators=(",", ":")).encode()

    def authenticator_data(self, flags, count, attested=b""):
        return (hashlib.sha256(self.state["rp_id"].encode()).digest() + bytes([flags])
                + count.to_bytes(4, "big") + attested)

    def register(self, challenge):
        """What navigator.credentials.create gives: attestation "none"."""
        attested = (bytes(16)  # AAGUID: zeros, as attestation "none" allows
                    + len(self.credential_id).to_bytes(2, "big") + self.credential_id
                    + cose_es256(self.key.public_key()))
        auth_data = self.authenticator_data(UP | UV | AT, 0, attested)
        attestation = (cbor_head(5, 3) + cbor_text("fmt") + cbor_text("none")
                       + cbor_text("attStmt") + cbor_head(5, 0)
                       + cbor_text("authData") + cbor_bytes(auth_data))
        return {
            "id": b64u(self.credential_id),
            "response": {
                "attestationObject": b64u(attestation),
                "clientDataJSON": b64u(self.client_data("webauthn.create", challenge)),
            },
        }

    def sign(self, challenge):
        """What navigator.credentials.get gives, the sign count one more."""
        self.state["sign_count"] += 1
        auth_data = self.authenticator_data(UP | UV, self.state["sign_count"])
        client_data = self.client_data("webauthn.get", challenge)
        signature = self.key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        return {
            "id": b64u(self.credential_id),
            "response": {
                "authenticatorData": b64u(auth_data),
                "clientDataJSON": b64u(client_data),
                "signature": b64u(signature),
                "userHandle": None,
            },
        }


# ---- the web app, as its pages reach it ------------------------------------

class Refused(Exception):
    pass


class WebApp:
    def __init__(self, connect, ca, origin, rp_id):
        host, port = connect.rsplit(":", 1)
        self.addr = (host, int(port))
        self.origin = origin
        self.rp_id = rp_id
        self.tls = ssl.create_default_context(cafile=ca)
        self.tls.minimum_version = ssl.TLSVersion.TLSv1_3
        self.cookie = None
        self.csrf = None

    def call(self, method, path, body=None):
        raw_body = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path} HTTP/1.1", f"Host: {urllib.parse.urlsplit(self.origin).netloc}",
                "Connection: close", f"Content-Length: {len(raw_body)}"]
        if method != "GET":
            head += [f"Origin: {self.origin}", "Content-Type: application/json", "Sec-Fetch-Site: same-origin"]
            if self.csrf:
                head.append(f"X-CSRF-Token: {self.csrf}")
        if self.cookie:
            head.append(f"Cookie: __Host-talos_session={self.cookie}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + raw_body
        with socket.create_connection(self.addr, timeout=30) as tcp:
            with self.tls.wrap_socket(tcp, server_hostname=self.rp_id) as s:
                s.sendall(request)
                raw = b""
                while len(raw) < 4 << 20:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    raw += chunk
        head, _, payload = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1]) if lines and " " in lines[0] else 0
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "set-cookie":
                cookie = value.split(";")[0].partition("=")[2]
                self.cookie = cookie or None
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if chunked:
            payload = dechunk(payload)
        try:
            answer = json.loads(payload) if payload else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get("csrf"), str):
            self.csrf = answer["csrf"]
        return status, answer

    def expect(self, what, status, answer):
        if status != 200:
            code = answer.get("error", "") if isinstance(answer, dict) else ""
            message = answer.get("message", "") if isinstance(answer, dict) else ""
            raise Refused(f"{what} refused: the web app answered {status} {code}: {message}".rstrip(": "))
        return answer

    def sign_in(self, passkey):
        begun = self.expect("sign-in", *self.call("POST", "/api/sign-in/begin", {}))
        challenge = unb64u(begun["publicKey"]["challenge"])
        return self.expect("sign-in", *self.call("POST", "/api/sign-in/finish", {
            "challenge_id": begun["challenge_id"],
            "credential": passkey.sign(challenge),
        }))


def dechunk(data):
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += rest[:n]
        data = rest[n + 2:]
    return out


def enrol(args):
    origin, sep, token = args.link.partition("/enrol#")
    if not sep or not token:
        raise Refused("not an enrolment link (ORIGIN/enrol#TOKEN)")
    rp_id = urllib.parse.urlsplit(origin).hostname
    app = WebApp(args.connect, args.ca, origin, rp_id)
    options = app.expect("enrolment options", *app.call("POST", "/api/enrol/begin", {"token": token}))
    pk = options["publicKey"]
    if pk.get("rp", {}).get("id", rp_id) != rp_id:
        raise Refused(f"the web app's rp id is {pk['rp']['id']}, not {rp_id}")
    passkey = Passkey.new(origin, rp_id)
    done = app.expect("enrolment", *app.call("POST", "/api/enrol/finish", {
        "token": token,
        "challenge_id": options["challenge_id"],
        "credential": passkey.register(unb64u(pk["challenge"])),
    }))
    passkey.save(args.state)
    print(json.dumps({"person": done.get("person"), "role": done.get("role"), "passkey": done.get("passkey"),
                      "rp_id": rp_id, "algorithm": "ES256"}))


def decide(args):
    with open(args.state) as f:
        passkey = Passkey(json.load(f))
    app = WebApp(args.connect, args.ca, passkey.state["origin"], passkey.state["rp_id"])
    try:
        me = app.sign_in(passkey)
        cards = app.expect("cards", *app.call("GET", "/api/cards"))
        if isinstance(cards, dict):
            cards = cards.get("cards", [])
        card = next((c for c in cards if c.get("id") == args.card), None)
        if card is not None:
            # The challenge binds the card's digest and the verdict; the
            # page gets it with the card, and the server computes it again.
            challenge = unb64u(card["challenges"][args.verdict])
        elif args.digest:
            # A card this person is not shown: sign the challenge PEOPLE.md
            # gives for its digest anyway, and let the server answer.
            challenge = hashlib.sha256(b"talos-webauthn-v1\0decision\0" + args.digest.encode() + b"\0"
                                       + args.verdict.encode()).digest()
        else:
            raise Refused(f"card {args.card} is not among {me.get('person', 'this person')}'s pending cards")
        status, answer = app.call("POST", "/api/cards/" + urllib.parse.quote(args.card, safe="") + "/decision",
                                  {"verdict": args.verdict, "credential": passkey.sign(challenge)})
        print(json.dumps(app.expect("decision", status, answer)))
    finally:
        # Every signature counted, refused or not: the next must be higher.
        passkey.save(args.state)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("enrol", help="register a passkey with an enrolment link")
    e.add_argument("link")
    d = sub.add_parser("decide", help="sign in and approve or decline a card")
    d.add_argument("card")
    d.add_argument("verdict", choices=["approved", "declined"])
    d.add_argument("--digest", help="the card's digest (SHA-384 hex): post the decision even if the card "
                   "is not shown to this person, to see the server's answer")
    for p in (e, d):
        p.add_argument("--state", required=True, help="the passkey's file (private key, 0600)")
        p.add_argument("--ca", required=True, help="the PEM CA the web app's certificate chains to")
        p.add_argument("--connect", required=True, metavar="HOST:PORT", help="where the web app listens")
    args = parser.parse_args()
    try:
        enrol(args) if args.command == "enrol" else decide(args)
    except (Refused, OSError, ssl.SSLError, KeyError, ValueError) as e:
        print(f"demo-passkey: {e}" if isinstance(e, Refused) else f"demo-passkey: {type(e).__name__}: {e}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
