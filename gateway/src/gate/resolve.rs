//! Resolving a destination name, and refusing names that point inside.
//!
//! The gateway resolves every name itself — the session's own idea of where
//! a name points is never used — and classifies **every** answer, A and
//! AAAA alike. One internal answer refuses the name (`resolves_internal`),
//! even when others are public: a name that points inside at all is not a
//! destination. The connection then goes to an address from exactly this
//! answer; there is no second lookup, so a DNS answer that changes between
//! check and connect (rebinding) cannot slip through.

use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::proto::ProtoErrorKind;
use hickory_resolver::TokioResolver;
use ipnet::IpNet;

use crate::gate::classify::{classify, Class, Internal};
use crate::gate::name::Name;

/// The most addresses kept from one answer. A name with more is still
/// checked whole; only the first ones are kept as connect candidates.
pub const MAX_CANDIDATES: usize = 8;

/// The result of resolving and checking one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Every answer is public: connect to these, in order.
    Public(Vec<IpAddr>),
    /// At least one answer is internal: this one, of this class.
    Internal { addr: IpAddr, class: Internal },
    /// The name could not be resolved.
    Failed(ResolveFailure),
}

/// Why a name could not be resolved: a fixed word for records and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveFailure {
    /// The name does not exist.
    NxDomain,
    /// The name exists but has no A or AAAA record.
    NoAddress,
    /// No nameserver answered in time.
    Timeout,
    /// Any other resolver failure (refused, SERVFAIL, bad answer).
    Error,
}

impl ResolveFailure {
    /// Every failure.
    pub const ALL: &'static [ResolveFailure] = &[
        ResolveFailure::NxDomain,
        ResolveFailure::NoAddress,
        ResolveFailure::Timeout,
        ResolveFailure::Error,
    ];

    /// The cause word recorded with `upstream_failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolveFailure::NxDomain => "nxdomain",
            ResolveFailure::NoAddress => "no_address",
            ResolveFailure::Timeout => "resolver_timeout",
            ResolveFailure::Error => "resolver_error",
        }
    }
}

/// The gateway's resolver: hickory with the configured nameservers.
#[derive(Debug)]
pub struct Resolver {
    inner: TokioResolver,
    /// Internal blocks an operator explicitly permits (labs and tests).
    permit: Vec<IpNet>,
    /// The bound on one whole lookup, all attempts included.
    deadline: Duration,
}

/// How the resolver is built (the config's `[resolver]`, validated).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Nameservers (UDP, falling back to TCP). Empty: the system's.
    pub nameservers: Vec<std::net::SocketAddr>,
    /// The bound on one query.
    pub timeout: Duration,
    /// How many times a query is sent before the name counts as unresolvable.
    pub attempts: usize,
    /// Internal blocks an operator explicitly permits (labs and tests).
    pub permit_internal: Vec<IpNet>,
}

impl Resolver {
    /// Build the resolver: listed nameservers, or the system's.
    pub fn new(c: &Settings) -> Result<Resolver, String> {
        let mut builder = if c.nameservers.is_empty() {
            TokioResolver::builder_tokio()
                .map_err(|e| format!("cannot read the system resolver configuration: {e}"))?
        } else {
            let mut rc = ResolverConfig::new();
            for &addr in &c.nameservers {
                rc.add_name_server(NameServerConfig::new(addr, Protocol::Udp));
                rc.add_name_server(NameServerConfig::new(addr, Protocol::Tcp));
            }
            let mut b = TokioResolver::builder_with_config(rc, TokioConnectionProvider::default());
            // Listed nameservers are the whole truth: no hosts file.
            b.options_mut().use_hosts_file = ResolveHosts::Never;
            b
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = c.timeout;
        opts.attempts = c.attempts;
        // Both families, so every answer the name has is classified.
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        // Names are looked up exactly as written: no search domains.
        opts.ndots = 0;
        let deadline = c.timeout * (c.attempts as u32 + 1);
        Ok(Resolver {
            inner: builder.build(),
            permit: c.permit_internal.clone(),
            deadline,
        })
    }

    /// Resolve `name` and check every answer. Never takes longer than the
    /// configured timeout times (attempts + 1).
    pub async fn resolve(&self, name: &Name) -> Resolution {
        // A trailing dot makes the name absolute: no search list applies.
        let fqdn = format!("{}.", name.as_str());
        let lookup = match tokio::time::timeout(self.deadline, self.inner.lookup_ip(fqdn)).await {
            Err(_) => return Resolution::Failed(ResolveFailure::Timeout),
            Ok(Err(e)) => return Resolution::Failed(failure_of(&e)),
            Ok(Ok(l)) => l,
        };
        self.check(lookup.iter())
    }

    /// Classify every answer; the first internal one refuses the lot.
    pub fn check(&self, answers: impl IntoIterator<Item = IpAddr>) -> Resolution {
        let mut public = Vec::new();
        for addr in answers {
            if let Class::Internal(class) = classify(addr) {
                if !self.permit.iter().any(|n| n.contains(&addr)) {
                    return Resolution::Internal { addr, class };
                }
            }
            if public.len() < MAX_CANDIDATES && !public.contains(&addr) {
                public.push(addr);
            }
        }
        if public.is_empty() {
            Resolution::Failed(ResolveFailure::NoAddress)
        } else {
            Resolution::Public(public)
        }
    }
}

fn failure_of(e: &hickory_resolver::ResolveError) -> ResolveFailure {
    if e.is_nx_domain() {
        return ResolveFailure::NxDomain;
    }
    if e.is_no_records_found() {
        return ResolveFailure::NoAddress;
    }
    let timed_out = e
        .proto()
        .is_some_and(|p| matches!(p.kind(), ProtoErrorKind::Timeout));
    if timed_out {
        ResolveFailure::Timeout
    } else {
        ResolveFailure::Error
    }
}
