//! The rules a config's values must keep beyond their types, checked once
//! when the file loads (and when a reload or a successor reads it): the
//! numbers' ranges as one table of field, range and message; the rules
//! between fields; the files the config names; the secrets and the static
//! sessions. Every error names the line of the value at fault: a number
//! carries its own span, whatever table or form it was written in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::{Range, RangeInclusive};
use std::path::Path;

use toml::Spanned;

use talos_contract::id::is_id;
use talos_contract::source::canonical_ip;

use super::files::{check_private_file, read_pem_certs, read_private_key};
use super::text::{find_field, line_of};
use super::{Config, ConfigError, Runtime};

/// One number's rule: `field` (dotted) must lie in `range`, else `message`,
/// with the value put where `{}` stands (if it does).
struct Bound {
    field: &'static str,
    value: u64,
    span: Range<usize>,
    range: RangeInclusive<u64>,
    message: &'static str,
}

/// A number with its span, as `u64`.
fn num<T: Copy + Into<u64>>(s: &Spanned<T>) -> (u64, Range<usize>) {
    (Into::<u64>::into(*s.get_ref()), s.span())
}

/// The same for `usize` fields (never wider than 64 bits here).
fn num_usize(s: &Spanned<usize>) -> (u64, Range<usize>) {
    (u64::try_from(*s.get_ref()).unwrap_or(u64::MAX), s.span())
}

const AT_LEAST_ONE_SHARE: &str = "must be at least 1 (0 would refuse everything it bounds)";
const TIMEOUT: &str = "{} ms is outside 1-600000 ms";

impl Config {
    /// Every number's range, as a table.
    fn bounds(&self) -> Vec<Bound> {
        let l = &self.limits;
        let bound = |field, (value, span): (u64, Range<usize>), range, message| Bound {
            field,
            value,
            span,
            range,
            message,
        };
        let mut out = vec![
            bound(
                "limits.hello_max_bytes",
                num_usize(&l.hello_max_bytes),
                512..=65_536,
                "{} is outside 512-65536 bytes",
            ),
            bound(
                "limits.hello_timeout_ms",
                num(&l.hello_timeout_ms),
                1..=600_000,
                TIMEOUT,
            ),
            bound(
                "limits.handshake_timeout_ms",
                num(&l.handshake_timeout_ms),
                1..=600_000,
                TIMEOUT,
            ),
            bound(
                "limits.h2_idle_timeout_ms",
                num(&l.h2_idle_timeout_ms),
                1..=600_000,
                TIMEOUT,
            ),
            bound(
                "resolver.timeout_ms",
                num(&self.resolver.timeout_ms),
                1..=600_000,
                TIMEOUT,
            ),
            bound(
                "upstream.connect_timeout_ms",
                num(&self.upstream.connect_timeout_ms),
                1..=600_000,
                TIMEOUT,
            ),
            bound(
                "limits.max_connections",
                num_usize(&l.max_connections),
                1..=u64::MAX,
                "must be at least 1",
            ),
            bound(
                "limits.session_connections",
                num(&l.session_connections),
                1..=u64::MAX,
                AT_LEAST_ONE_SHARE,
            ),
            bound(
                "limits.session_handshakes",
                num(&l.session_handshakes),
                1..=u64::MAX,
                AT_LEAST_ONE_SHARE,
            ),
            bound(
                "limits.session_held_requests",
                num(&l.session_held_requests),
                1..=u64::MAX,
                AT_LEAST_ONE_SHARE,
            ),
            bound(
                "limits.session_pending_proposals",
                num(&l.session_pending_proposals),
                1..=u64::MAX,
                AT_LEAST_ONE_SHARE,
            ),
            bound(
                "limits.session_proposals_per_minute",
                num(&l.session_proposals_per_minute),
                1..=u64::MAX,
                AT_LEAST_ONE_SHARE,
            ),
            bound(
                "limits.session_proposal_burst",
                num(&l.session_proposal_burst),
                1..=u64::MAX,
                AT_LEAST_ONE_SHARE,
            ),
            bound(
                "limits.tcp_keepalive_ms",
                num(&l.tcp_keepalive_ms),
                3_000..=600_000,
                "{} ms is outside 3000-600000 ms (probes go a third of it apart, at least 1 s)",
            ),
            bound(
                "limits.reply_decoded_max_bytes",
                num(&l.reply_decoded_max_bytes),
                1 << 20..=u64::MAX,
                "{} is less than 1 MiB (1048576)",
            ),
            bound(
                "limits.reply_decoded_max_ratio",
                num(&l.reply_decoded_max_ratio),
                2..=100_000,
                "{} is outside 2-100000",
            ),
            bound(
                "resolver.attempts",
                num_usize(&self.resolver.attempts),
                1..=10,
                "{} is outside 1-10",
            ),
            bound(
                "upstream.port",
                num(&self.upstream.port),
                1..=u64::from(u16::MAX),
                "port {} cannot be connected to",
            ),
        ];
        if let Some(n) = &self.runtime.workers {
            out.push(bound(
                "runtime.workers",
                num_usize(n),
                1..=Runtime::MAX_WORKERS as u64,
                "{} is outside 1-1024",
            ));
        }
        if let Some(c) = &self.control {
            out.extend([
                bound(
                    "control.batch_max_records",
                    num_usize(&c.batch_max_records),
                    1..=10_000,
                    "{} is outside 1-10000",
                ),
                bound(
                    "control.batch_interval_ms",
                    num(&c.batch_interval_ms),
                    10..=60_000,
                    "{} is outside 10-60000",
                ),
                bound(
                    "control.spool_max_batches",
                    num_usize(&c.spool_max_batches),
                    1..=1000,
                    "{} is outside 1-1000",
                ),
                bound(
                    "control.spool_max_bytes",
                    num(&c.spool_max_bytes),
                    1 << 20..=u64::MAX,
                    "{} is less than 1 MiB (1048576)",
                ),
                bound(
                    "control.lease_ms",
                    num(&c.lease_ms),
                    1000..=3_600_000,
                    "{} is outside 1000-3600000",
                ),
            ]);
        }
        if let Some(d) = &self.dns {
            out.extend([
                bound("dns.ttl_s", num(&d.ttl_s), 1..=300, "{} is outside 1-300"),
                bound(
                    "dns.queries_per_second",
                    num(&d.queries_per_second),
                    1..=10_000,
                    "{} is outside 1-10000",
                ),
                bound(
                    "dns.max_tcp_per_session",
                    num(&d.max_tcp_per_session),
                    1..=1024,
                    "{} is outside 1-1024",
                ),
                bound(
                    "dns.record_interval_ms",
                    num(&d.record_interval_ms),
                    1000..=3_600_000,
                    "{} is outside 1000-3600000",
                ),
            ]);
        }
        if let Some(p) = &self.pair {
            out.extend([
                bound(
                    "pair.max_forwarded_per_session",
                    num_usize(&p.max_forwarded_per_session),
                    1..=100_000,
                    "{} is outside 1-100000",
                ),
                bound(
                    "pair.holdings_interval_ms",
                    num(&p.holdings_interval_ms),
                    100..=60_000,
                    "{} is outside 100-60000",
                ),
            ]);
        }
        out
    }

    /// Check every rule (see the module docs); the first broken one is the
    /// error, at the line of the value at fault.
    pub(super) fn validate(&self, path: &Path, text: &str) -> Result<(), ConfigError> {
        let f = Faults { path, text };
        self.check_names(&f)?;
        self.check_bounds(&f)?;
        self.check_files(&f)?;
        self.check_pair(&f)?;
        self.check_dns(&f)?;
        let secrets = self.check_secrets(&f)?;
        self.check_sessions(&f, &secrets)
    }

    /// `gateway_id`, the log filter, the process socket's path.
    fn check_names(&self, f: &Faults<'_>) -> Result<(), ConfigError> {
        let id = self.gateway_id.get_ref();
        if !is_id(id) {
            return Err(f.invalid(
                self.gateway_id.span(),
                "gateway_id",
                format!("{id:?} must be 1-64 letters, digits, '-', '_' or '.'"),
            ));
        }
        if let Some(level) = &self.log.level {
            if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level.get_ref()) {
                return Err(f.invalid(
                    level.span(),
                    "log.level",
                    format!("{:?} is not a log filter: {e}", level.get_ref()),
                ));
            }
        }
        if let Some(socket) = &self.process.socket {
            let p = socket.get_ref();
            if !p.is_absolute() {
                return Err(f.invalid(
                    socket.span(),
                    "process.socket",
                    format!("{} must be an absolute path", p.display()),
                ));
            }
            // sun_path holds 107 bytes and a NUL.
            if p.as_os_str().len() > 107 {
                return Err(f.invalid(
                    socket.span(),
                    "process.socket",
                    format!(
                        "{} is longer than a Unix socket path may be (107 bytes)",
                        p.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `[dns]`: the addresses for `approvals.hangar.internal` are known
    /// (named, or the listen address's own), and none is a wildcard.
    fn check_dns(&self, f: &Faults<'_>) -> Result<(), ConfigError> {
        let Some(dns) = &self.dns else {
            return Ok(());
        };
        if dns.approvals.is_empty() && dns.listen.get_ref().ip().is_unspecified() {
            return Err(f.invalid(
                dns.listen.span(),
                "dns.listen",
                format!(
                    "{} is a wildcard: name the gateway's address on the session network in dns.approvals (what approvals.hangar.internal resolves to)",
                    dns.listen.get_ref()
                ),
            ));
        }
        for a in &dns.approvals {
            if a.get_ref().is_unspecified() || a.get_ref().is_multicast() {
                return Err(f.invalid(
                    a.span(),
                    "dns.approvals",
                    format!("{} cannot be connected to", a.get_ref()),
                ));
            }
        }
        Ok(())
    }

    /// `[pair]`: it needs `[control]` (the link's identities), at least one
    /// peer, each a valid id other than this gateway's, named once.
    fn check_pair(&self, f: &Faults<'_>) -> Result<(), ConfigError> {
        let Some(pair) = &self.pair else {
            return Ok(());
        };
        if self.control.is_none() {
            return Err(f.invalid(
                pair.listen.span(),
                "pair.listen",
                "needs [control]: the member link uses the control identities".into(),
            ));
        }
        if pair.peers.is_empty() {
            return Err(f.invalid(
                f.at(0..0, "pair"),
                "pair.peers",
                "name at least one other member".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for peer in &pair.peers {
            let id = peer.id.get_ref();
            if !is_id(id) {
                return Err(f.invalid(
                    peer.id.span(),
                    "pair.peers.id",
                    format!("{id:?} must be 1-64 letters, digits, '-', '_' or '.'"),
                ));
            }
            if id == self.gateway_id.get_ref() {
                return Err(f.invalid(
                    peer.id.span(),
                    "pair.peers.id",
                    format!("{id:?} is this gateway's own id"),
                ));
            }
            if !seen.insert(id.as_str()) {
                return Err(f.invalid(
                    peer.id.span(),
                    "pair.peers.id",
                    format!("{id:?} is named twice"),
                ));
            }
            if peer.link.get_ref().port() == 0 {
                return Err(f.invalid(peer.link.span(), "pair.peers.link", "needs a port".into()));
            }
        }
        Ok(())
    }

    /// Every bound in its range (the table [`Config::bounds`]), and the
    /// bounds that must agree with each other.
    fn check_bounds(&self, f: &Faults<'_>) -> Result<(), ConfigError> {
        for b in self.bounds() {
            if !b.range.contains(&b.value) {
                return Err(f.invalid(
                    f.at(b.span, b.field),
                    b.field,
                    b.message.replacen("{}", &b.value.to_string(), 1),
                ));
            }
        }
        let l = &self.limits;
        let (handshakes, connections) = (
            *l.session_handshakes.get_ref(),
            *l.session_connections.get_ref(),
        );
        if handshakes > connections {
            // The field at fault is the one the file sets: the handshakes'
            // bound when set, or else the connections' bound, set below
            // the handshakes' default.
            let why = "connections in their handshake are open connections";
            return Err(if l.session_handshakes.span().is_empty() {
                f.invalid(
                    f.at(l.session_connections.span(), "limits.session_connections"),
                    "limits.session_connections",
                    format!(
                        "{connections} is less than limits.session_handshakes ({handshakes}, its default): {why}"
                    ),
                )
            } else {
                f.invalid(
                    l.session_handshakes.span(),
                    "limits.session_handshakes",
                    format!(
                        "{handshakes} is more than limits.session_connections ({connections}): {why}"
                    ),
                )
            });
        }
        Ok(())
    }

    /// The files the config names: trust anchors, the control channel's
    /// certificates and keys; and the control plane's settings that go
    /// together.
    fn check_files(&self, f: &Faults<'_>) -> Result<(), ConfigError> {
        for (i, anchor) in self.upstream.extra_trust_anchors.iter().enumerate() {
            if let Err(message) = read_pem_certs(anchor.get_ref()) {
                return Err(f.invalid(
                    anchor.span(),
                    &format!("upstream.extra_trust_anchors[{i}]"),
                    message,
                ));
            }
        }

        if let Some(c) = &self.control {
            for (file, field) in [
                (&c.ca_file, "control.ca_file"),
                (&c.cert_file, "control.cert_file"),
            ] {
                if let Err(message) = read_pem_certs(file.get_ref()) {
                    return Err(f.invalid(file.span(), field, message));
                }
            }
            if let Err(message) = read_private_key(c.key_file.get_ref()) {
                return Err(f.invalid(c.key_file.span(), "control.key_file", message));
            }
            if let Err(message) = check_private_file(c.signing_key_file.get_ref()) {
                return Err(f.invalid(
                    c.signing_key_file.span(),
                    "control.signing_key_file",
                    message,
                ));
            }
            match (&c.plane, &c.spool_dir) {
                (Some(plane), None) => {
                    return Err(f.invalid(
                        plane.span(),
                        "control.spool_dir",
                        "required with control.plane: batches wait there until acknowledged".into(),
                    ))
                }
                (None, Some(dir)) => {
                    return Err(f.invalid(
                        dir.span(),
                        "control.spool_dir",
                        "needs control.plane: without a control plane no batch is made".into(),
                    ))
                }
                _ => {}
            }
            let name = c.plane_name.get_ref();
            if rustls::pki_types::DnsName::try_from(name.as_str()).is_err() {
                return Err(f.invalid(
                    f.at(c.plane_name.span(), "control.plane_name"),
                    "control.plane_name",
                    format!("{name:?} is not a DNS name"),
                ));
            }
        }
        Ok(())
    }

    /// `[[secret]]` tables: each named once, with exactly one source.
    /// Returns their names.
    fn check_secrets(&self, f: &Faults<'_>) -> Result<HashMap<&str, ()>, ConfigError> {
        let mut secret_names: HashMap<&str, ()> = HashMap::new();
        for (i, src) in self.secrets.iter().enumerate() {
            let field = format!("secret[{i}]");
            let name = src.name.get_ref();
            if secret_names.insert(name, ()).is_some() {
                return Err(f.invalid(
                    src.name.span(),
                    &field,
                    format!("secret {name} is defined twice"),
                ));
            }
            if src.env.is_some() == src.file.is_some() {
                return Err(f.invalid(
                    src.name.span(),
                    &field,
                    format!("secret {name} needs exactly one of env and file (values never go in the config)"),
                ));
            }
        }
        Ok(secret_names)
    }

    /// `[[session]]` tables: each a valid spec, ids and sources unique,
    /// every attachment's secret defined.
    fn check_sessions(
        &self,
        f: &Faults<'_>,
        secret_names: &HashMap<&str, ()>,
    ) -> Result<(), ConfigError> {
        let mut ids: HashMap<&str, ()> = HashMap::new();
        let mut owners: HashMap<IpAddr, &str> = HashMap::new();
        for (i, s) in self.sessions.iter().enumerate() {
            let sid = s.id.get_ref();
            let field = |f: &str| format!("session[{i}].{f}");
            let spec = s.spec().map_err(|e| {
                let (span, name, message) = s.refusal(&e);
                f.invalid(span, &field(&name), message)
            })?;
            if ids.insert(sid, ()).is_some() {
                return Err(f.invalid(
                    s.id.span(),
                    &field("id"),
                    format!("session id {sid:?} is used twice"),
                ));
            }
            for (j, src) in s.sources.get_ref().iter().enumerate() {
                let ip = canonical_ip(*src.get_ref());
                if let Some(other) = owners.insert(ip, sid) {
                    return Err(f.invalid(
                        src.span(),
                        &field(&format!("sources[{j}]")),
                        format!("{ip} is already a source of session {other:?}"),
                    ));
                }
            }
            for (j, a) in spec.scope().attachments().iter().enumerate() {
                if !secret_names.contains_key(a.secret()) {
                    return Err(f.invalid(
                        s.attach[j].span(),
                        &field(&format!("attach[{j}]")),
                        format!("secret {} has no [[secret]] table", a.secret()),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where a bad value is reported: the file and its text, for its line.
struct Faults<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Faults<'_> {
    /// The error for `field`, at the line `span` starts on.
    fn invalid(&self, span: Range<usize>, field: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            line: line_of(self.text, span.start),
            field: field.to_owned(),
            message,
        }
    }

    /// `span`, or for a value left to its default (an empty span) the line
    /// that names the field's table, if any.
    fn at(&self, span: Range<usize>, field: &str) -> Range<usize> {
        if span.is_empty() {
            find_field(self.text, field)
        } else {
            span
        }
    }
}
