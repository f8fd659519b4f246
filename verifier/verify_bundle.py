#!/usr/bin/env python3
"""Verify a TALOS certificate bundle from the signatures it carries.

    verify_bundle.py BUNDLE [--quiet]

A session certificate is the control plane's word on what a session did.
Its evidence is signed at its source: each gateway member signs its batches
of connection records and its drop and start reports; the approval relay
signs each decision. A bundle (`control-stub certificate bundle ID --out
FILE`) carries the certificate with all of that, exactly as signed, and the
keys that signed it, each bound to its role and id under the control CA.

This script checks the bundle alone, and shares no code with the product:
only Python's standard library and the `cryptography` package. Every format
it reads is the one docs/records.md describes ("Verifying a certificate
yourself" and "What every signature covers"). It

  1. checks every key's binding to its role and id under the control CA,
     and every signature (certificate, batches, reports, decisions);
  2. checks each member's hash chain over the batches included;
  3. recomputes the certificate's connections, hand-offs, DNS counts,
     refusals and secrets' use from the signed records and compares them
     with the certificate, connection by connection;
  4. checks reset steps 4 and 5 against the signed reports, for the CAs
     the certificate says were made, and each decision against its card;
     a decision a person made with a passkey, against the person's own
     WebAuthn assertion inside it, under the approvers' listed keys; one
     without is taken on the relay's word only for an attempt the
     certificate says was in lab mode; the certificate's own copy of each
     decision against the bundle's, and verified again under its own key;
     each command a passkey or a client certificate verified (Revoke All)
     against its record;
  5. says what it could not check: what rests on the control stub's word.

Each check prints one line, `ok   ITEM: ...` or `FAIL ITEM: ...`; the
exit status is 0 when every check holds, 1 when one fails (the FAIL lines
name each), and 2 when the bundle cannot be read at all.
"""

import argparse
import base64
import datetime
import hashlib
import json
import sys

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

FORMAT = "talos-certificate-bundle"
VERSION = 1

# The signed message of every envelope: "talos-v1" 0x00, a kind byte, the
# payload (docs/records.md, "What every signature covers").
DOMAIN = b"talos-v1\x00"
KIND_BYTE = {
    "batch": 0x01,
    "drop_report": 0x02,
    "decision": 0x03,
    "start_report": 0x04,
    "certificate": 0x05,
    "key_binding": 0x06,
}

# The DNS names a control-channel certificate carries as its role
# (docs/records.md, "Key bindings").
ROLE_NAME = {
    "gateway": "gateway.role.talos.invalid",
    "relay": "control-plane.role.talos.invalid",
    "plane": "control-plane.role.talos.invalid",
}

# The canonical field order of each signed payload (docs/records.md).
BATCH_FIELDS = ["gateway_id", "seq", "prev_digest", "created_at", "count", "records"]
DROP_FIELDS = ["gateway_id", "instance", "session_id", "attempt", "ca_digest", "secrets",
               "reason", "at"]
START_FIELDS = ["gateway_id", "instance", "started_at", "key_id", "previous_instance",
                "cut_by_crash"]
DECISION_FIELDS = ["proposal_id", "proposal_digest", "approver", "decision", "decided_at"]
# A decision a person signed: the card they saw and their assertion, after
# those five (talos-certs `approval`, "The decision payload").
PERSON_DECISION_FIELDS = DECISION_FIELDS + ["card", "assertion"]
ASSERTION_FIELDS = ["credential_id", "authenticator_data", "client_data_json", "signature"]
PROPOSAL_FIELDS = ["proposal_id", "gateway_id", "session_id", "attempt", "tenant", "kind",
                   "destination", "method", "path", "attachments", "rule", "tool",
                   "call_digest", "approvers", "created_at", "expires_at"]
BINDING_FIELDS = ["role", "id", "public_key"]
GENESIS = "0" * 96

EXIT_OK, EXIT_FAILED, EXIT_UNREADABLE = 0, 1, 2


class Unreadable(Exception):
    """The bundle cannot be read at all (exit status 2)."""


class Bad(Exception):
    """One item does not check out; the message says why."""


# ---------------------------------------------------------------- encodings


def no_duplicates(pairs):
    """A JSON object's members, refusing a key given twice: two parsers
    could read such an object differently, so nothing signed may hold one."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError("the key %r is given twice" % twice)
    return out


def parse_json(data, what):
    try:
        return json.loads(data, object_pairs_hook=no_duplicates)
    except (ValueError, UnicodeDecodeError) as e:
        raise Bad("%s is not JSON: %s" % (what, e))


def canonical(value):
    """The compact JSON the product signs: members in the order given, no
    whitespace, strings escaped as serde_json escapes them (only `"`, `\\`
    and the control characters; everything else as UTF-8)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def b64(text, what):
    """Standard base64 with padding, decoded strictly (RFC 4648 section 4):
    no missing padding, no stray bits, nothing but the alphabet."""
    if not isinstance(text, str):
        raise Bad("%s is not a base64 string" % what)
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as e:
        raise Bad("%s is not base64: %s" % (what, e))
    if base64.b64encode(raw).decode("ascii") != text:
        raise Bad("%s is not in canonical base64" % what)
    return raw


def sha384_hex(data):
    return hashlib.sha384(data).hexdigest()


def key_id(public_key):
    """A key's id: the first 16 hex digits of the SHA-256 of the 32-byte
    raw Ed25519 public key."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def envelope_digest(envelope):
    """How the certificate names a report (reset steps' `report_digest`):
    SHA-384 of the envelope's JSON, members in the order kind, key_id,
    payload, signature."""
    ordered = {k: envelope[k] for k in ("kind", "key_id", "payload", "signature")}
    return sha384_hex(canonical(ordered))


def ordered_object(payload, fields, what):
    """`payload` parsed, with exactly `fields` in that order, and written
    back to the same bytes (the canonical encoding)."""
    value = parse_json(payload, what)
    if not isinstance(value, dict) or list(value.keys()) != fields:
        raise Bad("%s does not hold exactly the fields %s, in that order" % (what, ", ".join(fields)))
    if canonical(value) != payload:
        raise Bad("%s is not in the canonical encoding" % what)
    return value


def parse_time(text):
    """An RFC 3339 UTC time as the product writes it."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


# ------------------------------------------------------------- signatures


def open_envelope(envelope, kind, public_key, what="the envelope"):
    """The payload of a signed envelope of `kind`, after checking that its
    key id names `public_key` and its Ed25519 signature verifies over
    "talos-v1" 0x00, the kind byte, the payload. `what` names it in a
    refusal when the item's own name does not say enough."""
    if not isinstance(envelope, dict) or sorted(envelope) != ["key_id", "kind", "payload", "signature"]:
        raise Bad("%s is not an envelope {kind, key_id, payload, signature}" % what)
    if envelope["kind"] != kind:
        raise Bad("%s is a signed %s, not a %s" % (what, envelope["kind"], kind))
    payload = b64(envelope["payload"], what + "'s payload")
    signature = b64(envelope["signature"], what + "'s signature")
    if envelope["key_id"] != key_id(public_key):
        raise Bad("%s names key %s, not the signer's key %s"
                  % (what, envelope["key_id"], key_id(public_key)))
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public_key).verify(
            signature, DOMAIN + bytes([KIND_BYTE[kind]]) + payload)
    except InvalidSignature:
        raise Bad("the signature does not verify under key %s" % key_id(public_key))
    return payload


def verify_ecdsa(public_key, signature, message, what):
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.curve.name != "secp256r1":
        raise Bad("%s: the signer's key is not ECDSA P-256" % what)
    try:
        public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise Bad("%s: the signature does not verify" % what)


def valid_at(cert, when):
    before = getattr(cert, "not_valid_before_utc", None) or cert.not_valid_before.replace(tzinfo=datetime.timezone.utc)
    after = getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)
    return before <= when <= after


def dns_names(cert):
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName)


def is_ca(cert):
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def issued_by(cert, ca):
    """Whether `ca`'s key signed `cert` (and `cert` names `ca` as issuer)."""
    if cert.issuer != ca.subject:
        return False
    try:
        ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                               ec.ECDSA(cert.signature_hash_algorithm))
        return True
    except (InvalidSignature, TypeError, AttributeError, ValueError):
        return False


# ------------------------------------------------------------------ report


class Report:
    """The lines printed: what held, what failed, what rests on the stub."""

    def __init__(self, quiet):
        self.quiet = quiet
        self.failures = []
        self.checks = 0

    def ok(self, item, detail):
        self.checks += 1
        if not self.quiet:
            print("ok   %s: %s" % (item, detail))

    def fail(self, item, detail):
        self.checks += 1
        self.failures.append(item)
        print("FAIL %s: %s" % (item, detail))

    def note(self, text):
        if not self.quiet:
            print("     " + text)

    def check(self, item, fn):
        """Run `fn`; an `ok` line with what it returns, or a FAIL line (a
        field of the wrong type or missing fails the item too)."""
        try:
            detail = fn()
        except Bad as e:
            self.fail(item, str(e))
            return False
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            self.fail(item, "malformed (%s: %s)" % (type(e).__name__, e))
            return False
        self.ok(item, detail)
        return True


# ------------------------------------------------------------------ bundle


class Bundle:
    """The bundle's items, read (not yet checked)."""

    def __init__(self, path):
        self.control_ca = None
        self.keys = []
        self.certificates = []
        self.proposals = []
        self.reports = []
        self.batches = []
        self.approver_keys = []
        try:
            with open(path, "rb") as f:
                lines = f.read().split(b"\n")
        except OSError as e:
            raise Unreadable("cannot read %s: %s" % (path, e))
        if lines and lines[-1] == b"":
            lines.pop()
        if not lines:
            raise Unreadable("%s is empty" % path)
        try:
            self.header = parse_json(lines[0], "the header line")
        except Bad as e:
            raise Unreadable(str(e))
        if not isinstance(self.header, dict) or self.header.get("format") != FORMAT:
            raise Unreadable("the first line is not a %s header" % FORMAT)
        if self.header.get("version") != VERSION:
            raise Unreadable("format version %r; this verifier reads version %d"
                             % (self.header.get("version"), VERSION))
        self.session_id = self.header.get("session_id")
        self.unknown = []
        for number, line in enumerate(lines[1:], start=2):
            try:
                item = parse_json(line, "line %d" % number)
            except Bad as e:
                raise Unreadable(str(e))
            kind = item.get("item") if isinstance(item, dict) else None
            item["line"] = number
            if kind == "control_ca":
                if self.control_ca is not None:
                    raise Unreadable("line %d: a second control CA" % number)
                self.control_ca = item
            elif kind == "key":
                self.keys.append(item)
            elif kind == "certificate":
                self.certificates.append(item)
            elif kind == "proposal":
                self.proposals.append(item)
            elif kind == "report":
                self.reports.append(item)
            elif kind == "batch":
                self.batches.append(item)
            elif kind == "approver_key":
                self.approver_keys.append(item)
            else:
                self.unknown.append((number, kind))


# ----------------------------------------------------------------- checks


class Verifier:
    def __init__(self, bundle, report):
        self.b = bundle
        self.r = report
        self.sid = bundle.session_id
        self.keys = {}  # (role, id) -> [raw Ed25519 public keys]
        self.binding_certs = []  # (role, id, the certificate that bound the key)
        self.cert = None  # the certificate's payload, parsed
        self.chains = {}  # gateway -> [(seq, batch payload, entries)] in seq order
        # envelope digest -> (kind, payload dict, where (for people), gateway,
        # place: ("chain", seq, entry) or ("reply", None, None))
        self.report_by_digest = {}
        self.passkeys = []  # (owner, credential id, alg, public key, rp id, origin)
        self.listed_cose = {}  # credential id -> the listed COSE key's bytes
        self.lab_decisions = []  # (proposal id, approver, attempt)
        self.no_copy = []  # proposal ids whose certificate entry carries no `decided`

    def run(self):
        for number, kind in self.b.unknown:
            self.r.fail("bundle", "line %d is an item of unknown kind %r" % (number, kind))
        self.stage("control CA", self.control_ca)
        self.stage("keys", self.key_bindings)
        self.stage("certificate", self.certificate)
        if self.cert is None:
            return
        self.stage("batches", self.batches)
        self.stage("reports", self.standalone_reports)
        self.stage("batches", self.batch_list)
        records = self.stage("records", self.session_records) or []
        self.stage("completeness", lambda: self.completeness(records))
        self.stage("records", lambda: self.recompute(records))
        self.stage("reset", lambda: self.reset_steps(records))
        self.stage("approver keys", self.approver_key_items)
        self.stage("decisions", lambda: self.decisions(records))
        self.stage("commands", self.commands)
        self.rests_on_the_stub()

    def stage(self, item, fn):
        """Run one stage; a malformed field it meets fails `item` rather
        than stopping the verifier."""
        try:
            return fn()
        except (Bad, KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            self.r.fail(item, "malformed (%s: %s)" % (type(e).__name__, e))
            return None

    # -- 1. the control CA and the key bindings

    def control_ca(self):
        def check():
            if self.b.control_ca is None:
                raise Bad("the bundle holds no control CA")
            try:
                ca = x509.load_pem_x509_certificate(self.b.control_ca["pem"].encode("ascii"))
            except (ValueError, KeyError, AttributeError) as e:
                raise Bad("not a PEM certificate: %s" % e)
            if not is_ca(ca):
                raise Bad("the certificate is not a CA (basicConstraints)")
            if not issued_by(ca, ca):
                raise Bad("the CA's self-signature does not verify")
            self.ca = ca
            return "self-signed CA %s, SHA-256 %s" % (
                ca.subject.rfc4514_string(), ca.fingerprint(hashes.SHA256()).hex()[:16] + "...")
        self.ca = None
        self.r.check("control CA", check)

    def key_bindings(self):
        for item in self.b.keys:
            role, ident = item.get("role"), item.get("id")
            name = "key %s %s" % (role, ident)
            try:
                raw = bytes.fromhex(item.get("public_key", ""))
                if len(raw) != 32:
                    raise ValueError
            except (ValueError, TypeError):
                self.r.fail(name, "public_key is not 64 hex digits")
                continue
            self.keys.setdefault((role, ident), []).append(raw)
            self.r.check(name, lambda: self.binding(item, role, ident, raw))
        for (role, ident), ks in self.keys.items():
            if role != "relay" and len(ks) > 1:
                self.r.fail("key %s %s" % (role, ident), "the bundle gives %d keys for it" % len(ks))

    def binding(self, item, role, ident, raw):
        """A key's binding: a certificate the control CA issued, naming the
        role's DNS name and the id, whose ECDSA P-256 key signed
        {"role","id","public_key"}."""
        if role not in ROLE_NAME:
            raise Bad("unknown role %r" % role)
        # The PEM beside the hex (for openssl by hand) must be the same key.
        try:
            pem = serialization.load_pem_public_key(str(item.get("public_key_pem")).encode("ascii"))
            same = pem.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == raw
        except (ValueError, TypeError, UnicodeEncodeError):
            same = False
        if not same:
            raise Bad("public_key_pem is not the key public_key gives")
        if role in ("relay", "plane") and ident != "control-stub":
            raise Bad("a %s key is the control stub's (id control-stub), not %r" % (role, ident))
        binding = item.get("binding")
        if not isinstance(binding, dict):
            raise Bad("no binding: nothing ties this key to its role and id under the control CA")
        if sorted(binding) != ["certificate", "kind", "payload", "signature"] or binding["kind"] != "key_binding":
            raise Bad("the binding is not {kind: key_binding, payload, certificate, signature}")
        payload = b64(binding["payload"], "the binding's payload")
        claims = ordered_object(payload, BINDING_FIELDS, "the binding's payload")
        if claims != {"role": role, "id": ident, "public_key": raw.hex()}:
            raise Bad("the binding says role %r, id %r, key %s..."
                      % (claims["role"], claims["id"], str(claims["public_key"])[:16]))
        try:
            cert = x509.load_der_x509_certificate(b64(binding["certificate"], "the binding's certificate"))
        except ValueError as e:
            raise Bad("the binding's certificate does not parse: %s" % e)
        if self.ca is None or not issued_by(cert, self.ca):
            raise Bad("the binding's certificate (%s) is not issued by the control CA"
                      % cert.subject.rfc4514_string())
        if is_ca(cert):
            raise Bad("the binding's certificate is a CA, not a member's")
        names = dns_names(cert)
        for needed in (ROLE_NAME[role], ident):
            if needed not in names:
                raise Bad("the binding's certificate does not name %s (it names %s)"
                          % (needed, ", ".join(names)))
        verify_ecdsa(cert.public_key(), b64(binding["signature"], "the binding's signature"),
                     DOMAIN + bytes([KIND_BYTE["key_binding"]]) + payload, "the binding")
        self.binding_certs.append((role, ident, cert))
        return "key %s bound by the certificate %s (%s, %s) under the control CA" % (
            key_id(raw), cert.subject.rfc4514_string(), ROLE_NAME[role], ident)

    def key_of(self, role, ident):
        ks = self.keys.get((role, ident))
        if not ks:
            raise Bad("the bundle holds no %s key for %s" % (role, ident))
        return ks[0]

    # -- the certificate

    def certificate(self):
        def check():
            if len(self.b.certificates) != 1:
                raise Bad("the bundle holds %d certificates, not one" % len(self.b.certificates))
            item = self.b.certificates[0]
            payload = open_envelope(item.get("envelope"), "certificate",
                                    self.key_of("plane", "control-stub"), "the certificate")
            cert = parse_json(payload, "the certificate's payload")
            if cert.get("session_id") != self.sid or item.get("session_id") != self.sid:
                raise Bad("it is session %r's, the bundle says %r" % (cert.get("session_id"), self.sid))
            if cert.get("kind") != "sandbox session" or cert.get("issued") is not True:
                raise Bad("it is not an issued sandbox session certificate")
            if not isinstance(cert.get("certificate_signed"), str):
                raise Bad("it says no time it was signed (certificate_signed)")
            self.signed_at = parse_time(cert["certificate_signed"])
            self.cert = cert
            return "session %s, %s, signed %s by the control plane's key %s" % (
                self.sid, cert.get("state"), cert["certificate_signed"],
                item["envelope"]["key_id"])
        self.r.check("certificate", check)
        if self.cert is not None:
            # Each binding's certificate was valid when the certificate was signed.
            for role, ident, c in self.binding_certs:
                if not valid_at(c, self.signed_at):
                    self.r.fail("key %s %s" % (role, ident),
                                "its certificate was not valid at %s" % self.cert["certificate_signed"])

    # -- 2. the batches and each member's chain

    def batches(self):
        by_gateway = {}
        for item in self.b.batches:
            gateway, seq = item.get("gateway_id"), item.get("seq")
            name = "batch %s/%s" % (gateway, seq)
            try:
                payload = open_envelope(item.get("envelope"), "batch",
                                        self.key_of("gateway", gateway), "the batch")
                batch = ordered_object(payload, BATCH_FIELDS, "its payload")
                if batch["gateway_id"] != gateway or batch["seq"] != seq:
                    raise Bad("it is labelled %s/%s but its payload is batch %s of %s"
                              % (gateway, seq, batch["seq"], batch["gateway_id"]))
                if batch["count"] != len(batch["records"]):
                    raise Bad("count %s, but %d records" % (batch["count"], len(batch["records"])))
                if not all(isinstance(r, dict) for r in batch["records"]):
                    raise Bad("an entry is not a JSON object")
            except Bad as e:
                self.r.fail(name, str(e))
                continue
            by_gateway.setdefault(gateway, []).append((seq, payload, batch))
        for gateway in sorted(by_gateway):
            self.chain(gateway, sorted(by_gateway[gateway], key=lambda b: b[0]))

    def chain(self, gateway, batches):
        """Contiguous numbers, each batch naming the SHA-384 of the one
        before; a signed gap (a batch an operator set aside) is reported."""
        name = "chain %s" % gateway
        broken = False
        for (seq_a, payload_a, _), (seq_b, _, batch_b) in zip(batches, batches[1:]):
            if seq_b == seq_a:
                self.r.fail(name, "batch %d is in the bundle twice" % seq_a)
                broken = True
            elif seq_b != seq_a + 1:
                self.r.fail(name, "batch %d is followed by %d: %s missing" % (
                    seq_a, seq_b, ", ".join(str(s) for s in range(seq_a + 1, seq_b))))
                broken = True
            elif batch_b["prev_digest"] != sha384_hex(payload_a):
                self.r.fail(name, "batch %d does not link to batch %d (prev_digest is not its SHA-384)"
                            % (seq_b, seq_a))
                broken = True
        gaps = [seq for seq, _, batch in batches
                if any("gap" in e for e in batch["records"])]
        first = batches[0]
        if first[0] == 1 and first[2]["prev_digest"] != GENESIS:
            self.r.fail(name, "batch 1 does not link to the genesis digest")
            broken = True
        self.chains[gateway] = [(seq, payload, batch) for seq, payload, batch in batches]
        if not broken:
            self.r.ok(name, "batches %d to %d, each signed by %s and linked to the one before%s" % (
                batches[0][0], batches[-1][0], gateway,
                "; set aside as signed gaps: %s" % ", ".join(map(str, gaps)) if gaps else ""))
        for seq, _, batch in batches:
            for e in batch["records"]:
                if "gap" in e:
                    g = e["gap"]
                    self.r.note("gap in %s's chain at batch %s: %s (%s); records of this window may be lost"
                                % (gateway, seq, g.get("found"), g.get("reason")))
            for position, entry in enumerate(batch["records"]):
                if "report" in entry:
                    self.chain_report(gateway, seq, position, entry["report"])

    def chain_report(self, gateway, seq, position, envelope):
        where = "batch %s/%d entry %d" % (gateway, seq, position)
        self.read_report(envelope, gateway, where, ("chain", seq, position))

    def read_report(self, envelope, gateway, where, place):
        """A drop or start report, checked under `gateway`'s key and indexed
        by its envelope digest."""
        name = "report in %s" % where
        try:
            if not isinstance(envelope, dict):
                raise Bad("not an envelope")
            kind = envelope.get("kind")
            if kind == "drop_report":
                payload = open_envelope(envelope, kind, self.key_of("gateway", gateway), "the report")
                report = ordered_object(payload, DROP_FIELDS, "the drop report")
                if report["secrets"] != sorted(set(report["secrets"])):
                    raise Bad("its secret names are not sorted and without repeats")
            elif kind == "start_report":
                payload = open_envelope(envelope, kind, self.key_of("gateway", gateway), "the report")
                report = ordered_object(payload, START_FIELDS, "the start report")
            else:
                raise Bad("a signed %r is no report" % kind)
            if report["gateway_id"] != gateway:
                raise Bad("it is gateway %s's, in %s's place" % (report["gateway_id"], gateway))
        except Bad as e:
            self.r.fail(name, str(e))
            return
        digest = envelope_digest(envelope)
        known = self.report_by_digest.get(digest)
        # A report a member answered a close with is the same signed bytes
        # as the one in its chain: its place in the chain is the one kept.
        if known is None or (known[4][0] == "reply" and place[0] == "chain"):
            self.report_by_digest[digest] = (kind, report, where, gateway, place)

    def standalone_reports(self):
        """Drop reports a member answered a close with (the ones in its
        chain are in the batches)."""
        for item in self.b.reports:
            gateway = item.get("gateway_id")
            where = "%s's reply (line %d)" % (gateway, item["line"])
            envelope = item.get("envelope")
            if not isinstance(envelope, dict) or envelope.get("kind") != "drop_report":
                self.r.fail("report in " + where, "not a signed drop report")
                continue
            self.read_report(envelope, gateway, where, ("reply", None, None))

    # -- which batches: the certificate's list, and each member's run

    def batch_list(self):
        """Every batch the certificate lists is in the bundle with its
        digest; every batch of the bundle that holds a record of the session
        is listed; and each member's batches are one run from the first to
        the last that holds an entry of the session."""
        listed = {}
        for b in self.cert.get("batches", []):
            listed[(b["gateway_id"], b["seq"])] = b["digest"]
        problems = []
        present = {}
        for gateway, batches in self.chains.items():
            for seq, payload, batch in batches:
                present[(gateway, seq)] = sha384_hex(payload)
        for (gateway, seq), digest in sorted(listed.items()):
            if (gateway, seq) not in present:
                problems.append("batch %s/%d is on the certificate but not in the bundle" % (gateway, seq))
            elif present[(gateway, seq)] != digest:
                problems.append("batch %s/%d: the certificate names digest %s..., the signed batch is %s..."
                                % (gateway, seq, digest[:16], present[(gateway, seq)][:16]))
        self.wanted = {}
        for gateway, batches in self.chains.items():
            for seq, _, batch in batches:
                holds_record = any(e.get("session_id") == self.sid for e in batch["records"]
                                   if "report" not in e and "gap" not in e)
                if holds_record and (gateway, seq) not in listed:
                    problems.append("batch %s/%d holds records of this session, but the certificate "
                                    "does not list it" % (gateway, seq))
                if holds_record or (gateway, seq) in listed:
                    self.wanted.setdefault(gateway, set()).add(seq)
        for digest, (kind, report, where, gateway, place) in self.report_by_digest.items():
            if place[0] == "chain" and (kind == "start_report" or report.get("session_id") == self.sid):
                if kind == "drop_report" or digest in self.relied_on():
                    self.wanted.setdefault(gateway, set()).add(place[1])
        for gateway, batches in self.chains.items():
            seqs = self.wanted.get(gateway)
            for seq, _, _ in batches:
                if not seqs or not (min(seqs) <= seq <= max(seqs)):
                    problems.append("batch %s/%d holds nothing of this session and lies outside "
                                    "its run%s" % (gateway, seq, " (%d to %d)" % (min(seqs), max(seqs))
                                                   if seqs else ""))
        if problems:
            for p in problems:
                self.r.fail("batches", p)
        else:
            self.r.ok("batches", "the certificate's %d batches are in the bundle digest for digest; "
                      "each member's batches are one run from its first entry of the session to its last"
                      % len(listed))

    def relied_on(self):
        out = set()
        for step in self.cert.get("reset", []):
            response = step.get("response") or {}
            for key in ("cas", "detached"):
                for item in response.get(key) or []:
                    if item.get("report_digest"):
                        out.add(item["report_digest"])
        return out

    # -- 3. the session's records, recomputed

    def session_records(self):
        """The session's records as the certificate must count them: every
        record of the session in the bundle's batches, member by member
        (ordered by id), batch by batch, in order; a connection sealed twice
        (same member, instance and conn) counted once, the whole record over
        one cut by a crash, else the first."""
        kept = {}
        out = []
        for gateway in sorted(self.chains):
            for seq, _, batch in self.chains[gateway]:
                position = 0
                for entry in batch["records"]:
                    if "report" in entry or "gap" in entry:
                        continue
                    rec = {"gateway": gateway, "seq": seq, "position": position,
                           "record": entry, "counted": True}
                    position += 1
                    instance, conn = entry.get("instance"), entry.get("conn")
                    if isinstance(instance, str) and isinstance(conn, int) and not isinstance(conn, bool) \
                            and 0 <= conn < 2 ** 63:
                        key = (gateway, instance, conn)
                        earlier = kept.get(key)
                        if earlier is not None:
                            if cut_by_crash(earlier["record"]) and not cut_by_crash(entry):
                                earlier["counted"] = False
                                kept[key] = rec
                            else:
                                rec["counted"] = False
                        else:
                            kept[key] = rec
                    if entry.get("session_id") == self.sid:
                        out.append(rec)
        return [r for r in out if r["counted"]]

    def recompute(self, records):
        connections, forwarded, dns = [], [], []
        for r in records:
            rec = r["record"]
            if rec.get("kind") == "dns":
                dns.append(rec)
            elif isinstance(rec.get("forwarded_to"), str) and rec.get("verdict") == "allowed":
                forwarded.append(rec)
            else:
                connections.append(rec)
        self.connections = connections
        self.compare_list("connections", connections, self.cert.get("connections", []), lambda c: (
            "%d connections recomputed from the signed records equal the certificate's, one by one "
            "(%d of them served through a peer, each counted once)"
            % (len(c), sum(1 for x in c if isinstance(x.get("via"), str)))))
        self.compare_list("forwarded", forwarded, self.cert.get("forwarded", []), lambda f: (
            "%d hand-offs to a peer, listed apart and counted nowhere else" % len(f)))
        self.hand_offs(connections, forwarded)
        self.compare_list("dns", dns, self.cert.get("dns", []),
                          lambda d: "%d intervals of the session's DNS counts" % len(d))

        totals = {}
        for rec in dns:
            for outcome, n in (rec.get("queries") or {}).items():
                totals[outcome] = totals.get(outcome, 0) + (n if isinstance(n, int) else 0)
        self.r.check("dns totals", lambda: self.same(totals, self.cert.get("dns_totals"), "DNS totals")
                     or "queries by outcome: %s" % (", ".join("%s %d" % kv for kv in sorted(totals.items()))
                                                   or "none"))

        refusals = [x for rec in connections for x in refusals_of(rec)]
        self.compare_list("refusals", refusals, self.cert.get("refusals", []), lambda x: (
            "%d refusals, by reason: %s" % (len(x), ", ".join(
                "%s %d" % kv for kv in sorted(count_by(x, "reason").items())) or "none")))

        self.r.check("secrets", lambda: self.secrets(connections))
        sent = sum(c.get("bytes_from_session", 0) for c in connections)
        received = sum(c.get("bytes_to_session", 0) for c in connections)
        lines = sum(len(c.get("requests", [])) for c in connections)
        requests = sum(c.get("request_count", 0) for c in connections)
        self.r.note("bytes %d from the session and %d to it; %d requests, %d request lines listed "
                    "(each compared above, connection by connection)" % (sent, received, requests, lines))

    def compare_list(self, name, recomputed, on_certificate, summary):
        """The certificate's list against the recomputed one, element by
        element; on a difference, which elements are missing, extra or
        changed, named by member, process and connection number."""
        if recomputed == on_certificate:
            self.r.ok(name, summary(recomputed))
            return
        if not isinstance(on_certificate, list):
            self.r.fail(name, "the certificate has no list %s" % name)
            return
        mine = count_canonical(recomputed)
        theirs = count_canonical(on_certificate)
        problems = []
        for text, n in theirs.items():
            extra = n - mine.get(text, 0)
            if extra > 0:
                problems.append("on the certificate but not in the signed records%s: %s"
                                % (" (%d times)" % extra if extra > 1 else "", label(json.loads(text))))
        for text, n in mine.items():
            missing = n - theirs.get(text, 0)
            if missing > 0:
                problems.append("in the signed records but not on the certificate%s: %s"
                                % (" (%d times)" % missing if missing > 1 else "", label(json.loads(text))))
        if not problems:
            problems.append("the same %d entries in another order" % len(recomputed))
        for p in problems[:20]:
            self.r.fail(name, p)
        if len(problems) > 20:
            self.r.fail(name, "and %d more differences" % (len(problems) - 20))

    def same(self, mine, theirs, what):
        if mine != theirs:
            raise Bad("%s recomputed from the signed records: %s; the certificate says: %s"
                      % (what, json.dumps(mine, sort_keys=True), json.dumps(theirs, sort_keys=True)))

    def hand_offs(self, connections, forwarded):
        """Each hand-off is matched by the holder's record of the same
        connection (the peer it names, `via` naming the forwarder, the same
        source): the connection is counted once, as the holder's."""
        holders = {}
        for c in connections:
            if isinstance(c.get("via"), str):
                k = (c.get("gateway_id"), c.get("via"), c.get("source"))
                holders[k] = holders.get(k, 0) + 1
        unmatched = []
        for f in forwarded:
            k = (f.get("forwarded_to"), f.get("gateway_id"), f.get("source"))
            if holders.get(k, 0) > 0:
                holders[k] -= 1
            else:
                unmatched.append(f)
        if not forwarded:
            return
        if unmatched:
            for f in unmatched[:20]:
                self.r.fail("forwarded", "the hand-off %s to %s has no record of the holder's with via %s "
                            "and source %s" % (label(f), f.get("forwarded_to"), f.get("gateway_id"),
                                               f.get("source")))
        else:
            self.r.ok("forwarded", "each of the %d hand-offs is matched by the holder's record of it "
                      "(via the forwarder, same source), counted once" % len(forwarded))

    def secrets(self, connections):
        used, masked = {}, {}
        for c in connections:
            for name in c.get("attachments_used") or []:
                if isinstance(name, str):
                    used[name] = used.get(name, 0) + 1
            for name, n in (c.get("masked") or {}).items():
                masked[name] = masked.get(name, 0) + (n if isinstance(n, int) else 0)
        on_cert = {s["name"]: s for s in self.cert.get("secrets", [])}
        problems = []
        for name in sorted(set(used) | set(masked) | set(on_cert)):
            s = on_cert.get(name)
            if s is None:
                problems.append("%s is used in the signed records but not on the certificate" % name)
                continue
            if s.get("connections_used") != used.get(name, 0):
                problems.append("%s: used by %d connections in the signed records, the certificate says %s"
                                % (name, used.get(name, 0), s.get("connections_used")))
            if s.get("masked") != masked.get(name, 0):
                problems.append("%s: masked %d times in the signed records, the certificate says %s"
                                % (name, masked.get(name, 0), s.get("masked")))
        if problems:
            raise Bad("; ".join(problems))
        return "; ".join("%s used by %d connections, masked %d times" % (n, used.get(n, 0), masked.get(n, 0))
                         for n in sorted(on_cert)) or "none used"

    # -- completeness: each authority's end is in its member's chain

    def completeness(self, records):
        """For each CA the certificate says was made, its member's run holds
        the end of that authority: a drop report of the attempt, after every
        record of it; or, for an authority that ended with its process, the
        start report of a later process (another instance), after them."""
        for attempt in self.cert.get("attempts", []):
            n = attempt.get("attempt")
            for ca in attempt.get("ca", []):
                gateway = ca.get("gateway_id")
                name = "completeness %s attempt %s" % (gateway, n)
                self.r.check(name, lambda: self.authority_end(records, gateway, n, ca))

    def authority_end(self, records, gateway, attempt, ca):
        own = authority_records(records, gateway, attempt)
        last = max(((r["seq"], r["position"]) for r in own), default=None)
        if ca.get("destroy_reason") == "gateway_restarted":
            # The start report step 4 names for this CA (checked there).
            digest = next((i.get("report_digest") for s in self.cert.get("reset", []) if s.get("step") == 4
                           for i in (s.get("response") or {}).get("cas") or []
                           if i.get("attempt") == attempt and i.get("gateway_id") == gateway), None)
            found = self.report_by_digest.get(digest)
            if found is None or found[0] != "start_report" or found[4][0] != "chain" or found[3] != gateway:
                raise Bad("the authority ended with its process, but %s's batches in the bundle hold no "
                          "start report step 4 names for it" % gateway)
            _, seq, position = found[4]
            batch = dict((s, b) for s, _, b in self.chains[gateway])[seq]
            if last is not None and after_entry(last, seq, position, batch):
                raise Bad("a record of the attempt comes after the next process's start report")
            return "its process ended; the next one's start report (batch %d) comes after every record " \
                   "of the attempt (%d)" % (seq, len(own))
        for seq, _, batch in self.chains.get(gateway, []):
            for position, entry in enumerate(batch["records"]):
                report = self.in_chain(entry)
                if report is None:
                    continue
                kind, payload = report
                if kind != "drop_report" or payload["session_id"] != self.sid or payload["attempt"] != attempt:
                    continue
                if last is not None and after_entry(last, seq, position, batch):
                    raise Bad("a record of the attempt comes after its drop report (batch %d)" % last[0])
                return "its drop report (%s, batch %d) comes after every record of the attempt (%d)" % (
                    payload["reason"], seq, len(own))
        raise Bad("%s's batches in the bundle hold no drop report of the attempt" % gateway)

    def in_chain(self, entry):
        """The checked report an entry of a batch holds, if it holds one."""
        if "report" not in entry or not isinstance(entry["report"], dict):
            return None
        try:
            found = self.report_by_digest.get(envelope_digest(entry["report"]))
        except KeyError:
            return None
        return (found[0], found[1]) if found else None

    # -- 4. reset steps 4 and 5, against the signed reports

    def reset_steps(self, records):
        steps = {s.get("step"): s for s in self.cert.get("reset", [])}
        cas = [(a.get("attempt"), c) for a in self.cert.get("attempts", []) for c in a.get("ca", [])]
        self.r.check("reset step 4", lambda: self.step4(steps.get(4), cas, records))
        self.r.check("reset step 5", lambda: self.step5(steps.get(5), cas, records))

    def report_for(self, digest, what):
        found = self.report_by_digest.get(digest)
        if found is None:
            raise Bad("%s: the report %s... is not in the bundle (or did not verify)"
                      % (what, str(digest)[:16]))
        return found

    def ended_with_process(self, found, gateway, attempt, records, what):
        kind, report, where, _, place = found
        if kind != "start_report":
            raise Bad("%s: the report in %s is a %s, not the start report it is said to be"
                      % (what, where, kind))
        own = authority_records(records, gateway, attempt)
        if report["instance"] in {r["record"].get("instance") for r in own}:
            raise Bad("%s: the start report is of the process that served the attempt" % what)
        last = max(((r["seq"], r["position"]) for r in own), default=None)
        if place[0] != "chain" or (last is not None and place[1] < last[0]):
            raise Bad("%s: the start report comes before a record of the attempt" % what)

    def step4(self, step, cas, records):
        if step is None or step.get("name") != "gateway_ca_destroyed" or step.get("confirmed") is not True:
            raise Bad("the certificate has no confirmed step 4 (gateway_ca_destroyed)")
        items = (step.get("response") or {}).get("cas") or []
        if len(items) != len(cas):
            raise Bad("step 4 names %d CAs; the certificate's attempts made %d" % (len(items), len(cas)))
        for attempt, ca in cas:
            gateway = ca.get("gateway_id")
            what = "attempt %s, %s's CA %s..." % (attempt, gateway, str(ca.get("digest"))[:16])
            match = [i for i in items if i.get("attempt") == attempt and i.get("gateway_id") == gateway]
            if len(match) != 1 or match[0].get("digest") != ca.get("digest"):
                raise Bad("%s: step 4 does not name this CA once" % what)
            item = match[0]
            found = self.report_for(item.get("report_digest"), what)
            if item.get("reason") == "gateway_restarted":
                self.ended_with_process(found, gateway, attempt, records, what)
                continue
            kind, report, where = found[0], found[1], found[2]
            if kind != "drop_report" or found[3] != gateway:
                raise Bad("%s: the report in %s is not %s's drop report" % (what, where, gateway))
            if report["session_id"] != self.sid or report["attempt"] != attempt:
                raise Bad("%s: the report in %s is of session %s attempt %s" % (
                    what, where, report["session_id"], report["attempt"]))
            if report["ca_digest"] != ca.get("digest"):
                raise Bad("%s: the signed report names CA %s..." % (what, report["ca_digest"][:16]))
        return "each of the %d CAs the certificate says were made is named destroyed by its member's " \
               "signed drop report, or ended with the process that made it (its successor's start " \
               "report)" % len(cas)

    def attached_at(self, attempt):
        return sorted({s["name"] for s in self.cert.get("secrets", [])
                       for a in s.get("attachments", []) if attempt in a.get("attempts", [])})

    def step5(self, step, cas, records):
        if step is None or step.get("name") != "secrets_detached" or step.get("confirmed") is not True:
            raise Bad("the certificate has no confirmed step 5 (secrets_detached)")
        items = (step.get("response") or {}).get("detached") or []
        if len(items) != len(cas):
            raise Bad("step 5 names %d authorities; the certificate's attempts made %d" % (len(items), len(cas)))
        for attempt, ca in cas:
            gateway = ca.get("gateway_id")
            what = "attempt %s on %s" % (attempt, gateway)
            match = [i for i in items if i.get("attempt") == attempt and i.get("gateway_id") == gateway]
            if len(match) != 1:
                raise Bad("%s: step 5 does not name it once" % what)
            item = match[0]
            attached = self.attached_at(attempt)
            if sorted(item.get("attached") or []) != attached:
                raise Bad("%s: step 5 says %s were attached, the certificate's secrets say %s"
                          % (what, item.get("attached"), attached))
            found = self.report_for(item.get("report_digest"), what)
            if "gone_with_process" in item:
                self.ended_with_process(found, gateway, attempt, records, what)
                continue
            kind, report, where = found[0], found[1], found[2]
            if kind != "drop_report" or found[3] != gateway or report["session_id"] != self.sid \
                    or report["attempt"] != attempt:
                raise Bad("%s: the report in %s is not this attempt's drop report from %s" % (what, where, gateway))
            if report["secrets"] != attached or sorted(item.get("reported") or []) != attached:
                raise Bad("%s: the signed report names %s, the certificate says %s were attached"
                          % (what, report["secrets"], attached))
        return "for each attempt on each member, the signed report names exactly the secrets the " \
               "certificate says were attached (or the process that held them ended)"

    # -- 4b. the approvers' passkeys, as the bundle lists them

    def approver_key_items(self):
        for item in self.b.approver_keys:
            name = "approver_key %s line %s" % (item.get("owner"), item["line"])
            self.r.check(name, lambda: self.approver_key(item))
        ids = [k[1] for k in self.passkeys]
        for cid in sorted({c for c in ids if ids.count(c) > 1}):
            self.r.fail("approver keys", "the credential %s is listed %d times"
                        % (cid.hex()[:16], ids.count(cid)))

    def approver_key(self, item):
        owner, rp_id, origin = item.get("owner"), item.get("rp_id"), item.get("origin")
        if not isinstance(owner, str) or not owner:
            raise Bad("no owner")
        if (rp_id, origin) != (None, None) and not all(isinstance(v, str) and v for v in (rp_id, origin)):
            raise Bad("rp_id and origin are not both names (or both null: no web app's relying party)")
        cid = b64(item.get("credential_id"), "the credential id")
        alg, key = cose_key(b64(item.get("public_key_cose"), "the COSE key"))
        if item.get("alg") != alg:
            raise Bad("alg says %r, the COSE key is %s" % (item.get("alg"), alg))
        self.passkeys.append((owner, cid, alg, key, rp_id, origin))
        self.listed_cose[cid] = b64(item.get("public_key_cose"), "the COSE key")
        if rp_id is None:
            return "%s's %s passkey, credential %s..., and no web app's relying party: no assertion holds " \
                   "under it (listed by the control stub)" % (owner, alg, cid.hex()[:16])
        return "%s's %s passkey, credential %s..., relying party %s at %s (listed by the control stub)" % (
            owner, alg, cid.hex()[:16], rp_id, origin)

    # -- 4c. decisions, against the card's digest

    def decisions(self, records):
        items = {}
        for item in self.b.proposals:
            items.setdefault(item.get("proposal_id"), []).append(item)
        on_cert = self.cert.get("proposals", [])
        for p in on_cert:
            name = "decision %s" % p.get("id")
            self.r.check(name, lambda: self.decision(p, items.get(p.get("id"), []), records))
        for pid in items:
            if pid not in {p.get("id") for p in on_cert}:
                self.r.fail("decision %s" % pid, "the bundle holds it, the certificate does not list it")

    def decision(self, p, items, records):
        if len(items) != 1:
            raise Bad("the bundle holds %d proposals with this id, not one" % len(items))
        item = items[0]
        fields = item.get("fields")
        if not isinstance(fields, dict) or sorted(fields) != sorted(PROPOSAL_FIELDS):
            raise Bad("its fields are not a proposal's")
        fields = {k: fields[k] for k in PROPOSAL_FIELDS}
        if sentence(fields) != item.get("sentence") or item.get("sentence") != p.get("sentence"):
            raise Bad("the card's sentence is not the one its fields give")
        digest = sha384_hex(canonical({"fields": fields, "sentence": item["sentence"]}))
        if digest != item.get("digest") or digest != p.get("digest"):
            raise Bad("the card's digest recomputed from its fields and sentence is %s..., the "
                      "certificate says %s..." % (digest[:16], str(p.get("digest"))[:16]))
        for cert_key, field in (("id", "proposal_id"), ("gateway_id", "gateway_id"), ("attempt", "attempt"),
                                ("kind", "kind"), ("rule", "rule"), ("approvers", "approvers"),
                                ("created_at", "created_at"), ("expires_at", "expires_at")):
            if p.get(cert_key) != fields[field]:
                raise Bad("the certificate's %s is %r, the card's %r" % (cert_key, p.get(cert_key), fields[field]))
        if fields["session_id"] != self.sid:
            raise Bad("the card is session %s's" % fields["session_id"])
        # What the gateway's signed records say of it.
        seen = [req["approval"] for r in records for req in r["record"].get("requests") or []
                if isinstance(req.get("approval"), dict) and req["approval"].get("proposal_id") == p["id"]]
        for a in seen:
            if a.get("digest") != digest:
                raise Bad("the gateway's signed record names digest %s... for it" % str(a.get("digest"))[:16])
        verdict = p.get("decision")
        if verdict not in ("approved", "declined"):
            if item.get("decision") is not None:
                raise Bad("the certificate says %s, but the bundle holds a signed decision" % verdict)
            for a in seen:
                if a.get("decision") in ("approved", "declined"):
                    raise Bad("the certificate says %s; the gateway's record says %s" % (verdict, a["decision"]))
            return "%s (no decision: that state is the control stub's word); the card's digest %s... " \
                   "recomputed from its fields" % (verdict, digest[:16])
        payload, relay = None, None
        for k in self.keys.get(("relay", "control-stub"), []):
            try:
                payload = open_envelope(item.get("decision"), "decision", k, "the decision")
                relay = k
                break
            except Bad as e:
                last = e
        if payload is None:
            raise last if self.keys.get(("relay", "control-stub")) else Bad("the bundle holds no relay key")
        d = parse_json(payload, "the decision")
        d = ordered_object(payload, PERSON_DECISION_FIELDS if isinstance(d, dict) and "assertion" in d
                           else DECISION_FIELDS, "the decision")
        if d["proposal_id"] != p["id"] or d["proposal_digest"] != digest:
            raise Bad("the signed decision is for %s, digest %s..." % (d["proposal_id"], d["proposal_digest"][:16]))
        if d["decision"] != verdict or d["approver"] != p.get("approver") or d["decided_at"] != p.get("decided_at"):
            raise Bad("the signed decision says %s by %s at %s; the certificate says %s by %s at %s" % (
                d["decision"], d["approver"], d["decided_at"], verdict, p.get("approver"), p.get("decided_at")))
        if d["approver"] not in fields["approvers"]:
            raise Bad("%s is not among the card's approvers" % d["approver"])
        for a in seen:
            if a.get("decision") != verdict or a.get("approver", d["approver"]) != d["approver"]:
                raise Bad("the gateway's record says %s by %s" % (a.get("decision"), a.get("approver")))
        if "assertion" in d:
            person = self.person(d, fields, digest, verdict)
        else:
            person = self.lab(d, fields)
        copy = self.on_certificate(p, item, d, relay, fields, digest, verdict)
        return "%s by %s, signed by the relay's key %s for the card's digest %s... (recomputed from its " \
               "fields and sentence)%s; %s%s" % (verdict, d["approver"], key_id(relay), digest[:16],
                                                 "; the gateway's record names the same" if seen else "", person,
                                                 copy)

    def on_certificate(self, p, item, d, relay, fields, digest, verdict):
        """The certificate's own copy of the decision (`decided`), what an
        auditor holding the certificate alone verifies: the same signed
        envelope as the bundle's, under the relay key the bundle binds; the
        same approver; for a person's decision, the assertion the relay
        signed and the credential and COSE key listed for it, and the
        assertion checked again under the certificate's own key; for a
        decision in lab mode, `verified` false and no assertion."""
        c = p.get("decided")
        if c is None:
            self.no_copy.append(p["id"])
            return ""
        if not isinstance(c, dict):
            raise Bad("the certificate's decided is not an object")
        if c.get("relay_signed") != item.get("decision"):
            raise Bad("the certificate's relay_signed is not the signed decision the bundle holds")
        rk = c.get("relay_public_key")
        if rk is not None and (not isinstance(rk, str) or rk.lower() != relay.hex()):
            raise Bad("the certificate's relay_public_key is not the relay key that signed the decision")
        if c.get("approver") != d["approver"]:
            raise Bad("the certificate's decided names %r, the signed decision %r" % (c.get("approver"), d["approver"]))
        if "assertion" not in d:
            if c.get("verified") is not False or c.get("verified_by") != "relay_only" or "assertion" in c:
                raise Bad("the relay's decision carries no assertion, and the certificate does not say it is "
                          "unverified (verified false, verified_by relay_only)")
            return "; the certificate's copy says so (verified false, relay_only)"
        if c.get("verified") is not True or c.get("verified_by") != "passkey":
            raise Bad("the certificate's copy does not say a passkey verified it")
        if c.get("assertion") != d["assertion"]:
            raise Bad("the certificate's assertion is not the one inside the relay's signed decision")
        cid = b64url(c.get("credential_id"), "the certificate's credential id")
        raw = b64(c.get("public_key_cose"), "the certificate's COSE key")
        alg, key = cose_key(raw)
        if c.get("alg") != alg:
            raise Bad("the certificate's alg says %r, its COSE key is %s" % (c.get("alg"), alg))
        if cid in self.listed_cose and self.listed_cose[cid] != raw:
            raise Bad("the certificate's COSE key for credential %s... is not the listed one" % cid.hex()[:16])
        if not all(isinstance(c.get(k), str) and c.get(k) for k in ("rp_id", "origin")):
            raise Bad("the certificate's copy names no relying party (rp_id, origin)")
        own = [(d["approver"], cid, alg, key, c["rp_id"], c["origin"])]
        self.person(d, fields, digest, verdict, own)
        return "; the certificate's copy verifies alone (the same envelope, assertion and key)"


    def lab(self, d, fields):
        """A decision no person signed: it counts only on an attempt the
        certificate says was opened in lab mode (`lab_approvals`)."""
        attempt = fields["attempt"]
        on = [a for a in self.cert.get("attempts", []) if a.get("attempt") == attempt]
        if len(on) != 1 or on[0].get("lab_approvals") is not True:
            raise Bad("no person's assertion: nothing but the relay says %s decided, and the certificate "
                      "does not say attempt %s was in lab mode (lab_approvals)" % (d["approver"], attempt))
        self.lab_decisions.append((d["proposal_id"], d["approver"], attempt))
        return "no person's assertion: that %s decided rests on the relay's and the control stub's word " \
               "(attempt %s was in lab mode)" % (d["approver"], attempt)

    def person(self, d, fields, digest, verdict, keys=None):
        """The person's assertion a decision carries, checked under the
        listed keys (as the gateway checks it: talos-certs
        `webauthn::verify_person`), or under `keys` (the certificate's own
        copy): the card is the held one, the key is listed, its owner an
        approver the card names and the decision's approver; then the
        WebAuthn assertion itself."""
        card = d["card"]
        if not isinstance(card, dict) or list(card) != PROPOSAL_FIELDS:
            raise Bad("the decision's card does not hold exactly a proposal's fields, in order")
        card_digest = sha384_hex(canonical({"fields": card, "sentence": sentence(card)}))
        answered_by = ""
        if card_digest != digest:
            # One card per first use: a member's first use joined to
            # another's card is answered with the person's decision on that
            # card, and only if it is the same first use.
            self.same_first_use(fields, card, card_digest)
            answered_by = " (the same first use's card %s, as the gateway took it)" % card["proposal_id"]
            digest = card_digest
        a = d["assertion"]
        if not isinstance(a, dict) or list(a) not in (ASSERTION_FIELDS, ASSERTION_FIELDS + ["user_handle"]):
            raise Bad("malformed: the assertion is not {%s[, user_handle]}" % ", ".join(ASSERTION_FIELDS))
        cid = b64url(a["credential_id"], "the assertion's credential id")
        auth = b64url(a["authenticator_data"], "the assertion's authenticator data")
        client = b64url(a["client_data_json"], "the assertion's client data")
        signature = b64url(a["signature"], "the assertion's signature")
        if "user_handle" in a:
            b64url(a["user_handle"], "the assertion's user handle")
        listed = [k for k in (self.passkeys if keys is None else keys) if k[1] == cid]
        if len(listed) != 1:
            raise Bad("unknown_credential: the credential %s... is not one of the listed approvers' keys"
                      % cid.hex()[:16])
        owner, _, alg, key, rp_id, origin = listed[0]
        if owner not in fields["approvers"]:
            raise Bad("unknown_credential: the key is %s's, whom the card's rule does not name" % owner)
        if owner != d["approver"]:
            raise Bad("unknown_credential: the key is %s's, and the decision says %s decided"
                      % (owner, d["approver"]))
        if rp_id is None:
            raise Bad("origin_mismatch: no web app's relying party is listed with %s's key" % owner)
        data = parse_json(client, "the assertion's client data")
        if not isinstance(data, dict):
            raise Bad("malformed: the client data is not a JSON object")
        if data.get("type") != "webauthn.get":
            raise Bad("wrong_type: the client data is a %r, not a webauthn.get" % data.get("type"))
        challenge = hashlib.sha256(b"talos-webauthn-v1\x00decision\x00" + digest.encode("ascii") + b"\x00"
                                   + verdict.encode("ascii")).digest()
        if data.get("challenge") != base64.urlsafe_b64encode(challenge).rstrip(b"=").decode("ascii"):
            raise Bad("challenge_mismatch: the assertion's challenge is not this card's digest and the "
                      "verdict %s" % verdict)
        if data.get("origin") != origin:
            raise Bad("origin_mismatch: the client data's origin is %r, the listed origin %r"
                      % (data.get("origin"), origin))
        if len(auth) < 37:
            raise Bad("malformed: the authenticator data is %d bytes, under 37" % len(auth))
        if auth[:32] != hashlib.sha256(rp_id.encode("utf-8")).digest():
            raise Bad("rp_id_mismatch: the authenticator data does not name the relying party %s" % rp_id)
        if auth[32] & 0x01 == 0:
            raise Bad("user_not_present: the authenticator data's UP flag is not set")
        if auth[32] & 0x04 == 0:
            raise Bad("user_not_verified: the authenticator data's UV flag is not set")
        if not verify_passkey(alg, key, signature, auth + hashlib.sha256(client).digest()):
            raise Bad("bad_signature: %s's passkey signature (credential %s...) does not verify over the "
                      "authenticator data and the client data's hash" % (owner, cid.hex()[:16]))
        return "%s's own passkey signed this verdict on this card%s (credential %s..., %s; relying party " \
               "%s, origin %s; present and verified)" % (owner, answered_by, cid.hex()[:16], alg, rp_id, origin)

    def same_first_use(self, fields, card, card_digest):
        """A decision signed over another card answers this proposal only
        as a gateway takes it (`session::approvals`'s `FirstUseOf`): both
        requests, of the same session, attempt, tenant and rule naming the
        same approvers, a rule in mode first_use on the attempt's Lock; and
        that card is on the certificate with that digest."""
        for f in ("kind", "session_id", "attempt", "tenant", "rule", "approvers"):
            if card[f] != fields[f]:
                raise Bad("challenge_mismatch: the person signed card %s, whose %s is %r, not this "
                          "proposal's %r" % (card["proposal_id"], f, card[f], fields[f]))
        if fields["kind"] != "request":
            raise Bad("challenge_mismatch: the person signed another card, and this is no request")
        on = [a for a in self.cert.get("attempts", []) if a.get("attempt") == fields["attempt"]]
        modes = [r.get("mode") for a in on for r in a.get("lock") or [] if r.get("id") == fields["rule"]]
        if modes != ["first_use"]:
            raise Bad("challenge_mismatch: the person signed another card, and rule %s is not a first_use "
                      "rule of attempt %s on the certificate" % (fields["rule"], fields["attempt"]))
        listed = [p for p in self.cert.get("proposals", []) if p.get("id") == card["proposal_id"]]
        if len(listed) != 1 or listed[0].get("digest") != card_digest:
            raise Bad("challenge_mismatch: the card the person signed, %s, is not on the certificate with "
                      "digest %s..." % (card["proposal_id"], card_digest[:16]))

    # -- 4d. who asked: the commands a passkey or a certificate verified

    def commands(self):
        for i, c in enumerate(self.cert.get("commands", [])):
            name = "command %s %d" % (c.get("event"), i + 1)
            how = c.get("verified_by")
            if c.get("verified") is not True:
                if how is not None or "assertion" in c or "client_certificate" in c:
                    self.r.fail(name, "not verified, yet it carries a proof (verified_by %r)" % how)
                continue
            if how == "passkey":
                self.r.check(name, lambda: self.command_passkey(c))
            elif how == "client_certificate":
                self.r.check(name, lambda: self.command_certificate(c))
            else:
                self.r.fail(name, "verified, by %r: neither passkey nor client_certificate" % how)

    def command_passkey(self, c):
        """A command a person signed (Revoke All): their assertion over
        command_challenge(event, session, nonce), under the public key the
        record keeps (the control stub's word: the bundle lists no
        operator's keys)."""
        a = c.get("assertion")
        if not isinstance(a, dict) or a.get("person") != c.get("requested_by"):
            raise Bad("the assertion is not %s's" % c.get("requested_by"))
        if c.get("event") != "revoke_all":
            raise Bad("a passkey signs only revoke_all, not %r" % c.get("event"))
        if not all(isinstance(a.get(k), str) and a.get(k) for k in ("nonce", "rp_id", "origin")):
            raise Bad("the assertion's record lacks its nonce, rp_id or origin")
        if not isinstance(a.get("public_key_cose"), str):
            return "revoke_all by %s, verified by passkey (credential %s); its record predates keeping the " \
                   "public key: not checked here" % (a["person"], a.get("credential_id"))
        alg, key = cose_key(b64url(a["public_key_cose"], "the command's COSE key"))
        if a.get("alg") != alg:
            raise Bad("alg says %r, the COSE key is %s" % (a.get("alg"), alg))
        challenge = hashlib.sha256(b"talos-webauthn-v1\x00command\x00revoke_all\x00" + self.sid.encode("utf-8")
                                   + b"\x00" + a["nonce"].encode("ascii")).digest()
        text = base64.urlsafe_b64encode(challenge).rstrip(b"=").decode("ascii")
        client = b64url(a.get("client_data_json"), "the command's client data")
        data = parse_json(client, "the command's client data")
        if not isinstance(data, dict) or data.get("type") != "webauthn.get":
            raise Bad("wrong_type: the client data is not a webauthn.get")
        if data.get("challenge") != text or a.get("challenge") != text:
            raise Bad("challenge_mismatch: not this session's revoke_all with nonce %s" % a["nonce"])
        if data.get("origin") != a["origin"]:
            raise Bad("origin_mismatch: the client data's origin is %r" % data.get("origin"))
        auth = b64url(a.get("authenticator_data"), "the command's authenticator data")
        if len(auth) < 37 or auth[:32] != hashlib.sha256(a["rp_id"].encode("utf-8")).digest():
            raise Bad("rp_id_mismatch: the authenticator data does not name %s" % a["rp_id"])
        if auth[32] & 0x05 != 0x05:
            raise Bad("user_not_verified: the flags lack UP or UV")
        if not verify_passkey(alg, key, b64url(a.get("signature"), "the command's signature"),
                              auth + hashlib.sha256(client).digest()):
            raise Bad("bad_signature: the passkey's signature does not verify")
        return "revoke_all by %s, signed by a passkey (credential %s..., %s) over this session and nonce %s; " \
               "that the key is %s's rests on the control stub's record" % (
                   a["person"], a.get("credential_id", "")[:16], alg, a["nonce"], a["person"])

    def command_certificate(self, c):
        """A command an operator's client certificate carried: the
        certificate is the one the record's fingerprint names, names that
        operator (talos:operator:NAME) and is a TLS client's."""
        from cryptography.x509.oid import ExtendedKeyUsageOID
        cc = c.get("client_certificate")
        if not isinstance(cc, dict):
            raise Bad("no client_certificate")
        der = b64(cc.get("certificate"), "the client certificate")
        if hashlib.sha256(der).hexdigest() != cc.get("sha256"):
            raise Bad("the certificate's SHA-256 is not the record's %s" % cc.get("sha256"))
        try:
            cert = x509.load_der_x509_certificate(der)
            uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
                .get_values_for_type(x509.UniformResourceIdentifier)
            eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except (ValueError, x509.ExtensionNotFound) as e:
            raise Bad("the client certificate does not hold what an operator's does: %s" % e)
        want = "talos:operator:%s" % c.get("requested_by")
        if uris != [want] or cc.get("operator") != c.get("requested_by"):
            raise Bad("the certificate names %s, the record %s" % (uris, c.get("requested_by")))
        if ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
            raise Bad("the certificate is not a TLS client's (no clientAuth)")
        return "revoke_all by operator %s, with the client certificate %s... (%s, clientAuth); that it chains " \
               "to the operator CA and came on the request's connection rests on the control stub" % (
                   c["requested_by"], cc["sha256"][:16], want)

    # -- 5. what rests on the stub

    def rests_on_the_stub(self):
        c = self.cert
        self.r.note("")
        self.r.note("Not verifiable from the bundle; resting on the control stub's word:")
        for s in c.get("reset", []):
            if s.get("step") in (1, 2, 3):
                stub = (s.get("response") or {}).get("stub") is True
                self.r.note("- reset step %s %s: %s" % (s["step"], s.get("name"),
                                                         "a stub response (no AWS call)" if stub else
                                                         "the control plane's own response"))
        self.r.note("- the session's state, times and mode; each attempt's cause, times, allowlist, "
                    "Lock rules and attachments (step 5's reports confirm the attached secret names)")
        commands = c.get("commands", [])
        how = count_by([{"how": x.get("verified_by") or "not verified"} for x in commands], "how")
        self.r.note("- the commands that moved the session and who asked (%d: %s); a command's passkey "
                    "assertion or client certificate is shown, not checked here"
                    % (len(commands), ", ".join("%s %d" % kv for kv in sorted(how.items()))))
        if c.get("interruptions"):
            self.r.note("- each interruption's cause, time and what followed (%d: %s)" % (
                len(c["interruptions"]), ", ".join("attempt %s %s" % (i.get("attempt"), i.get("outcome"))
                                                   for i in c["interruptions"])))
        undecided = [p for p in c.get("proposals", []) if p.get("decision") not in ("approved", "declined")]
        if undecided:
            self.r.note("- the state of %d proposals without a decision (withdrawn, expired, pending)"
                        % len(undecided))
        self.r.note("- the relay's and the plane's key bindings: signed by the control stub's own "
                    "certificate under the control CA")
        if self.passkeys:
            self.r.note("- the approvers' passkeys and the relying party (%d keys): the control stub's list "
                        "when the bundle was written, not a signed copy of what each open listed; the "
                        "sign counts are not checked here (the gateway checks them)" % len(self.passkeys))
        for pid in self.no_copy:
            self.r.note("- decision %s: the certificate carries no copy of it (issued before decisions were "
                        "shown on it); the bundle's copy is checked above" % pid)
        for pid, approver, attempt in self.lab_decisions:
            self.r.note("- decision %s: that %s decided (no person's assertion; attempt %s in lab mode)"
                        % (pid, approver, attempt))
        self.r.note("- that nothing of the session was sealed before each member's first batch here "
                    "(the chain shows nothing was left out between the first and the last)")
        if c.get("batch_rejections"):
            self.r.note("- %d batch rejections the control plane records" % len(c["batch_rejections"]))


# ------------------------------------------------------------- rules


def authority_records(records, gateway, attempt):
    """The records `gateway` made under its authority for `attempt`: its
    connections' records of the attempt. Not a DNS line (it counts queries,
    no connection, and may follow the end by up to a second), and not a
    hand-off (`forwarded_to`: a member that forwards holds no authority; a
    restarted member's hand-offs come after its start report)."""
    return [r for r in records if r["gateway"] == gateway and r["record"].get("attempt") == attempt
            and r["record"].get("kind") != "dns" and not isinstance(r["record"].get("forwarded_to"), str)]


def cut_by_crash(record):
    return record.get("cause") == "cut_by_crash"


def after_entry(last, seq, position, batch):
    """Whether the record at (seq, record position) `last` lies after entry
    `position` (counting every entry) of batch `seq`."""
    if last[0] != seq:
        return last[0] > seq
    # `last[1]` counts records only; turn the entry position into a count
    # of the records before it.
    records_before = sum(1 for e in batch["records"][:position] if "report" not in e and "gap" not in e)
    return last[1] >= records_before


def refusals_of(rec):
    """The refusals a connection record holds (docs/records.md, the
    certificate's `refusals`): the connection's own verdict if it is not
    `allowed`, and each listed request the gateway refused."""
    out = []
    verdict = rec.get("verdict") if isinstance(rec.get("verdict"), str) else "(no verdict)"
    text = lambda k: rec.get(k) if isinstance(rec.get(k), str) else None
    if verdict != "allowed":
        r = {"kind": "connection", "reason": verdict, "gateway_id": text("gateway_id"),
             "sni": text("sni"), "opened_at": text("opened_at")}
        if text("cause") is not None:
            r["cause"] = text("cause")
        out.append(r)
    for req in rec.get("requests") or []:
        if isinstance(req.get("refusal"), str):
            r = {"kind": "request", "reason": req["refusal"], "gateway_id": text("gateway_id"),
                 "sni": text("sni"), "opened_at": text("opened_at")}
            for k in ("method", "path"):
                if isinstance(req.get(k), str):
                    r[k] = req[k]
            if isinstance(req.get("status"), int):
                r["status"] = req["status"]
            approval = req.get("approval")
            if isinstance(approval, dict) and isinstance(approval.get("proposal_id"), str):
                r["proposal_id"] = approval["proposal_id"]
            out.append(r)
    return out


def sentence(p):
    """The card's sentence, written from the proposal's fields alone (the
    relay shows it; talos-certs `sentence`)."""
    if p["kind"] == "request":
        carrying = ("carrying " + ", ".join(p["attachments"])) if p["attachments"] else \
            "with no attached credential"
        return ("Session %s (tenant %s, attempt %s) wants to send %s %s to %s, %s. Rule %s asks %s to "
                "decide by %s." % (p["session_id"], p["tenant"], p["attempt"], p["method"], p["path"],
                                   p["destination"], carrying, p["rule"], " or ".join(p["approvers"]),
                                   p["expires_at"]))
    return ("The agent in session %s (tenant %s, attempt %s) proposes to run the tool %s with the exact "
            "call whose SHA-384 is %s. Rule %s asks %s to decide by %s."
            % (p["session_id"], p["tenant"], p["attempt"], p["tool"], p["call_digest"], p["rule"],
               " or ".join(p["approvers"]), p["expires_at"]))


def b64url(text, what):
    """Base64url without padding (WebAuthn's JSON forms), decoded
    strictly: nothing but the alphabet, no padding, no stray bits."""
    if not isinstance(text, str) or any(c not in B64URL for c in text) or len(text) % 4 == 1:
        raise Bad("malformed: %s is not base64url without padding" % what)
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != text:
        raise Bad("malformed: %s is not in canonical base64url" % what)
    return raw


B64URL = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def cbor(data, at=0, depth=0):
    """One CBOR item (RFC 8949) at `at`: what a COSE key needs (integers,
    byte and text strings, arrays, maps without repeated keys, false, true,
    null), definite lengths only; the item and where the next begins."""
    if depth > 8 or at >= len(data):
        raise Bad("the COSE key is not CBOR (truncated or too deep)")
    major, info = data[at] >> 5, data[at] & 0x1f
    at += 1
    if info < 24:
        arg = info
    elif info in (24, 25, 26, 27):
        n = 1 << (info - 24)
        if at + n > len(data):
            raise Bad("the COSE key is not CBOR (truncated)")
        arg = int.from_bytes(data[at:at + n], "big")
        at += n
    else:
        raise Bad("the COSE key is not CBOR this reader takes (indefinite length or reserved)")
    if major == 0:
        return arg, at
    if major == 1:
        return -1 - arg, at
    if major in (2, 3):
        if at + arg > len(data):
            raise Bad("the COSE key is not CBOR (a string runs past the end)")
        raw = data[at:at + arg]
        return (raw if major == 2 else raw.decode("utf-8")), at + arg
    if major == 4:
        out = []
        for _ in range(arg):
            v, at = cbor(data, at, depth + 1)
            out.append(v)
        return out, at
    if major == 5:
        out = {}
        for _ in range(arg):
            k, at = cbor(data, at, depth + 1)
            v, at = cbor(data, at, depth + 1)
            if not isinstance(k, (int, str)) or k in out:
                raise Bad("the COSE key's map has a key repeated or not an integer or text")
            out[k] = v
        return out, at
    if major == 7 and info in (20, 21, 22):
        return {20: False, 21: True, 22: None}[info], at
    raise Bad("the COSE key holds a CBOR item of major type %d" % major)


def cose_key(raw):
    """A COSE_Key (RFC 9053) as registration keeps it: ES256 (kty 2, alg
    -7, crv 1 P-256, x, y), EdDSA (kty 1, alg -8, crv 6 Ed25519, x) or
    RS256 (kty 3, alg -257, n, e). Its name and the public key."""
    key, end = cbor(raw)
    if end != len(raw) or not isinstance(key, dict):
        raise Bad("the COSE key is not one CBOR map")
    kty, alg = key.get(1), key.get(3)
    try:
        if (kty, alg) == (2, -7):
            x, y = key.get(-2), key.get(-3)
            if key.get(-1) != 1 or not all(isinstance(v, bytes) and len(v) == 32 for v in (x, y)):
                raise Bad("the ES256 COSE key is not a P-256 point (crv 1, x and y of 32 bytes)")
            return "ES256", ec.EllipticCurvePublicNumbers(
                int.from_bytes(x, "big"), int.from_bytes(y, "big"), ec.SECP256R1()).public_key()
        if (kty, alg) == (1, -8):
            x = key.get(-2)
            if key.get(-1) != 6 or not isinstance(x, bytes) or len(x) != 32:
                raise Bad("the EdDSA COSE key is not Ed25519 (crv 6, x of 32 bytes)")
            return "EdDSA", ed25519.Ed25519PublicKey.from_public_bytes(x)
        if (kty, alg) == (3, -257):
            n, e = key.get(-1), key.get(-2)
            if not isinstance(n, bytes) or not isinstance(e, bytes):
                raise Bad("the RS256 COSE key has no n and e")
            public = rsa.RSAPublicNumbers(int.from_bytes(e, "big"), int.from_bytes(n, "big")).public_key()
            if public.key_size < 2048:
                raise Bad("the RS256 key is %d bits, under 2048" % public.key_size)
            return "RS256", public
    except ValueError as e:
        raise Bad("the COSE key is not a valid public key: %s" % e)
    raise Bad("the COSE key is kty %r alg %r: not ES256, EdDSA or RS256" % (kty, alg))


def verify_passkey(alg, key, signature, message):
    """Whether `signature` (WebAuthn's form for `alg`: ASN.1 DER for
    ES256, raw for EdDSA, PKCS #1 v1.5 for RS256) verifies over
    `message`."""
    try:
        if alg == "ES256":
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif alg == "EdDSA":
            key.verify(signature, message)
        else:
            key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        return True
    except (InvalidSignature, ValueError):
        return False


def count_by(items, key):
    out = {}
    for i in items:
        out[i[key]] = out.get(i[key], 0) + 1
    return out


def count_canonical(items):
    out = {}
    for i in items:
        text = json.dumps(i, sort_keys=True, separators=(",", ":"))
        out[text] = out.get(text, 0) + 1
    return out


def label(rec):
    """A record or refusal named for a person: member, process, connection
    number, name and verdict."""
    if not isinstance(rec, dict):
        return json.dumps(rec)[:120]
    parts = [str(rec.get("gateway_id"))]
    if rec.get("instance") is not None:
        parts.append("instance %s conn %s" % (rec.get("instance"), rec.get("conn")))
    for k in ("kind", "sni", "verdict", "reason", "method", "path", "opened_at"):
        if rec.get(k) is not None:
            parts.append("%s %s" % (k, rec[k]))
    return ", ".join(parts)


def main(argv):
    parser = argparse.ArgumentParser(description="Verify a TALOS certificate bundle alone.")
    parser.add_argument("bundle", help="the bundle file (control-stub certificate bundle ID --out FILE)")
    parser.add_argument("--quiet", action="store_true", help="print only what fails and the result")
    args = parser.parse_args(argv)
    try:
        bundle = Bundle(args.bundle)
    except Unreadable as e:
        print("UNREADABLE: %s" % e)
        return EXIT_UNREADABLE
    report = Report(args.quiet)
    if not args.quiet:
        print("TALOS certificate bundle of session %s (format %d, made %s by %s)" % (
            bundle.session_id, VERSION, bundle.header.get("made_at"), bundle.header.get("made_by")))
    Verifier(bundle, report).run()
    if report.failures:
        print("RESULT: FAILED: %d of %d checks failed; first: %s"
              % (len(report.failures), report.checks, report.failures[0]))
        return EXIT_FAILED
    print("RESULT: VERIFIED: %d checks hold" % report.checks)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
