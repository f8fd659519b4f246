//! One DNS query from a session, and the answer it gets: bytes in, bytes
//! out, no sockets (so it is fuzzed and tested on its own).
//!
//! The gateway answers the sessions' DNS itself; what a session may learn
//! is exactly what it may reach:
//!
//! - **a source that is no session's** (nor one a peer holds): `REFUSED`;
//! - **a session a peer holds** (this member forwards its connections and
//!   does not know its names): `SERVFAIL`, so the session's resolver asks
//!   its next nameserver (the other member);
//! - **a name on the session's allowlist** (canonicalised exactly as SNI
//!   is): `A`/`AAAA` from the gateway's own resolution of it, the addresses
//!   a connection to it would be checked against (every TCP 443 connection
//!   is redirected to the gateway whatever address it was dialled to, so
//!   the real ones keep clients' own checks sound); no address when it
//!   resolves to an internal one (the connection would be refused
//!   `resolves_internal`), `SERVFAIL` when it cannot be resolved;
//! - **`approvals.hangar.internal`**: the gateway's own configured
//!   address;
//! - **`HTTPS`/`SVCB` and every other type** of those names: an empty
//!   answer (`NOERROR`, no records), so no client learns an `ech` key or
//!   an HTTP/3 endpoint to try;
//! - **every other name**: `NXDOMAIN`, never looked up on the session's
//!   behalf, so a name it may not reach (or one carrying data out in its
//!   labels) reaches no resolver;
//! - **what is not a query** (a response, an opcode other than `QUERY`, a
//!   class other than `IN`, not exactly one question): `FORMERR` or
//!   `NOTIMP` when the header can be read, nothing otherwise.
//!
//! # Limits
//! An answer carries at most [`MAX_ADDRESSES`] addresses, and fits the
//! size the client can take (512 bytes, or its EDNS size up to
//! [`MAX_UDP_PAYLOAD`]); what does not fit is cut with `TC` set.

use std::net::IpAddr;

use hickory_resolver::proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, AAAA};
use hickory_resolver::proto::rr::{DNSClass, RData, Record, RecordType};

use crate::gate::name::{canonicalize, Name};
use crate::refusal::causes;

/// The name the gateway answers itself (the approvals API).
pub const APPROVALS_NAME: &str = "approvals.hangar.internal";

/// Addresses in one answer at most.
pub const MAX_ADDRESSES: usize = 16;

/// The largest UDP answer the gateway sends, whatever a client offers:
/// the size the DNS flag day of 2020 settled on, which no path fragments.
pub const MAX_UDP_PAYLOAD: u16 = 1232;

/// A DNS header is 12 bytes: anything shorter gets no answer at all.
const HEADER_LEN: usize = 12;

/// What a query's source is to this member.
#[derive(Clone, Copy)]
pub enum Scope<'a> {
    /// No session's, here or on a peer.
    Unknown,
    /// A session a peer holds: its names are not known here.
    Elsewhere,
    /// A session of this member's: whether a name is on its allowlist.
    Session(&'a dyn Fn(&Name) -> bool),
}

impl std::fmt::Debug for Scope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scope::Unknown => "Unknown",
            Scope::Elsewhere => "Elsewhere",
            Scope::Session(_) => "Session",
        })
    }
}

causes! {
    /// How a query was settled: the `outcome` label of
    /// `gateway_dns_queries_total`, and the counts kept per session.
    pub enum Outcome {
        /// A listed name (or the approvals name): answered.
        Answered => "answered",
        /// A name not on the allowlist: `NXDOMAIN`.
        Unlisted => "unlisted",
        /// A listed name resolving to an internal address: no address given.
        Internal => "resolves_internal",
        /// A listed name the gateway could not resolve: `SERVFAIL`.
        Unresolved => "unresolved",
        /// No session's source: `REFUSED`.
        UnknownSource => "unknown_source",
        /// A session a peer holds, and no peer could answer for it: `SERVFAIL`.
        Elsewhere => "elsewhere",
        /// A session a peer holds: passed to it over the member link, and
        /// its answer passed back.
        Forwarded => "forwarded",
        /// Past the session's share of queries (or the bound for sources
        /// that are no session's): a UDP query dropped, a TCP one refused.
        Limited => "limited",
        /// Not a query the gateway answers: `FORMERR` or `NOTIMP`, or no
        /// answer at all when it is no DNS message.
        Malformed => "malformed",
    }
}

/// What to do with a query.
#[derive(Debug)]
pub enum Step {
    /// Send these bytes back.
    Reply(Vec<u8>, Outcome),
    /// Resolve `name` for `family`'s addresses, then [`Pending::answer`].
    Resolve(Pending),
    /// Send nothing (the bytes are no DNS message, or are a response).
    Drop,
}

/// Which addresses a query asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// A query for a listed name's addresses, waiting for its resolution.
#[derive(Debug)]
pub struct Pending {
    query: Message,
    /// The name, canonical.
    pub name: Name,
    pub family: Family,
    limit: u16,
}

/// What the gateway's resolution of a listed name gave.
#[derive(Debug)]
pub enum Resolved<'a> {
    /// Every address is public: these.
    Addresses(&'a [IpAddr]),
    /// Some address is internal: no connection to it would be made.
    Internal,
    /// It could not be resolved.
    Failed,
}

/// Settle the query in `bytes` from a source whose `scope` is given;
/// `approvals` are the addresses `approvals.hangar.internal` is given;
/// `ttl` the answers' time to live, in seconds.
pub fn step(bytes: &[u8], scope: Scope<'_>, approvals: &[IpAddr], ttl: u32) -> Step {
    if bytes.len() < HEADER_LEN {
        return Step::Drop;
    }
    // The QR bit: a response sent to the answerer is not answered.
    if bytes[2] & 0x80 != 0 {
        return Step::Drop;
    }
    let query = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => return header_only(bytes, ResponseCode::FormErr),
    };
    let limit = payload_limit(&query);
    if query.op_code() != OpCode::Query {
        return reply(&query, ResponseCode::NotImp, &[], limit, Outcome::Malformed);
    }
    if query.queries().len() != 1 || !query.answers().is_empty() {
        return reply(
            &query,
            ResponseCode::FormErr,
            &[],
            limit,
            Outcome::Malformed,
        );
    }
    let q = &query.queries()[0];
    if q.query_class() != DNSClass::IN {
        return reply(&query, ResponseCode::NotImp, &[], limit, Outcome::Malformed);
    }
    let listed = match scope {
        Scope::Unknown => {
            return reply(
                &query,
                ResponseCode::Refused,
                &[],
                limit,
                Outcome::UnknownSource,
            )
        }
        Scope::Elsewhere => {
            return reply(
                &query,
                ResponseCode::ServFail,
                &[],
                limit,
                Outcome::Elsewhere,
            )
        }
        Scope::Session(listed) => listed,
    };
    // An unlisted name, or one that is no host name at all: NXDOMAIN.
    let Some(name) = canonicalize(&q.name().to_ascii())
        .ok()
        .filter(|n| n.as_str() == APPROVALS_NAME || listed(n))
    else {
        return reply(
            &query,
            ResponseCode::NXDomain,
            &[],
            limit,
            Outcome::Unlisted,
        );
    };
    let family = match q.query_type() {
        RecordType::A => Some(Family::V4),
        RecordType::AAAA => Some(Family::V6),
        _ => None,
    };
    if name.as_str() == APPROVALS_NAME {
        let records = match family {
            Some(f) => records(&query, of_family(approvals, f), ttl),
            None => Vec::new(),
        };
        return reply(
            &query,
            ResponseCode::NoError,
            &records,
            limit,
            Outcome::Answered,
        );
    }
    match family {
        // HTTPS, SVCB and every other type of a listed name: nothing.
        None => reply(&query, ResponseCode::NoError, &[], limit, Outcome::Answered),
        Some(family) => Step::Resolve(Pending {
            query,
            name,
            family,
            limit,
        }),
    }
}

/// The question's name of the query in `bytes`, as sent (for the length
/// and distinctness of a refused name; never recorded).
pub fn question_name(bytes: &[u8]) -> Option<String> {
    let m = Message::from_vec(bytes).ok()?;
    m.queries().first().map(|q| {
        let mut name = q.name().to_ascii();
        if name.len() > 1 && name.ends_with('.') {
            name.pop();
        }
        name
    })
}

impl Pending {
    /// The answer, once the name is resolved.
    pub fn answer(self, resolved: Resolved<'_>, ttl: u32) -> (Vec<u8>, Outcome) {
        let (code, records, outcome) = match resolved {
            Resolved::Addresses(addrs) => (
                ResponseCode::NoError,
                records(&self.query, of_family(addrs, self.family), ttl),
                Outcome::Answered,
            ),
            Resolved::Internal => (ResponseCode::NoError, Vec::new(), Outcome::Internal),
            Resolved::Failed => (ResponseCode::ServFail, Vec::new(), Outcome::Unresolved),
        };
        match reply(&self.query, code, &records, self.limit, outcome) {
            Step::Reply(bytes, outcome) => (bytes, outcome),
            // `reply` always replies.
            _ => (Vec::new(), outcome),
        }
    }
}

fn of_family(addrs: &[IpAddr], family: Family) -> impl Iterator<Item = IpAddr> + '_ {
    addrs
        .iter()
        .copied()
        .filter(move |a| {
            matches!(
                (a, family),
                (IpAddr::V4(_), Family::V4) | (IpAddr::V6(_), Family::V6)
            )
        })
        .take(MAX_ADDRESSES)
}

fn records(query: &Message, addrs: impl Iterator<Item = IpAddr>, ttl: u32) -> Vec<Record> {
    let name = query.queries()[0].name().clone();
    addrs
        .map(|a| {
            let rdata = match a {
                IpAddr::V4(v4) => RData::A(A(v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
            };
            Record::from_rdata(name.clone(), ttl, rdata)
        })
        .collect()
}

/// The largest answer the client takes: 512 bytes, or its EDNS size (at
/// least 512, at most [`MAX_UDP_PAYLOAD`]).
fn payload_limit(query: &Message) -> u16 {
    query
        .extensions()
        .as_ref()
        .map_or(512, |e| e.max_payload().clamp(512, MAX_UDP_PAYLOAD))
}

/// The answer to `query`: its id, question and `RD` echoed, `RA` set (the
/// session's names are resolved for it), `code`, `records`; cut to `limit`
/// bytes with `TC` set when they do not fit.
fn reply(
    query: &Message,
    code: ResponseCode,
    records: &[Record],
    limit: u16,
    outcome: Outcome,
) -> Step {
    let mut m = Message::new();
    m.set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(code);
    // The question is echoed when there is exactly one (a query with
    // several is refused FORMERR, and its questions are not sent back).
    if query.op_code() == OpCode::Query && query.queries().len() == 1 {
        m.add_queries(query.queries().iter().cloned());
    }
    if query.extensions().is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP_PAYLOAD);
        m.set_edns(edns);
    }
    let mut kept = records.len();
    loop {
        let mut out = m.clone();
        out.add_answers(records[..kept].iter().cloned());
        if kept < records.len() {
            out.set_truncated(true);
        }
        match out.to_vec() {
            Ok(bytes) if bytes.len() <= usize::from(limit) => return Step::Reply(bytes, outcome),
            // Not even the question fits: the header alone, cut.
            Ok(_) if kept == 0 => {
                let mut step = header_only_id(query.id(), code);
                if let Step::Reply(out, o) = &mut step {
                    out[2] |= 0x02;
                    *o = outcome;
                }
                return step;
            }
            Ok(_) => kept -= 1,
            Err(_) => return header_only_id(query.id(), ResponseCode::ServFail),
        }
    }
}

/// A reply of the header alone, for a query whose body does not parse.
fn header_only(bytes: &[u8], code: ResponseCode) -> Step {
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    let mut step = header_only_id(id, code);
    if let Step::Reply(out, _) = &mut step {
        // The opcode and RD as asked.
        out[2] = 0x80 | (bytes[2] & 0x79);
    }
    step
}

fn header_only_id(id: u16, code: ResponseCode) -> Step {
    let mut out = vec![0u8; HEADER_LEN];
    out[..2].copy_from_slice(&id.to_be_bytes());
    out[2] = 0x80;
    out[3] = 0x80 | (u16::from(code) as u8 & 0x0f);
    Step::Reply(out, Outcome::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::op::Query;
    use hickory_resolver::proto::rr::Name as DnsName;
    use std::str::FromStr;

    fn query(name: &str, rtype: RecordType) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0x1234).set_recursion_desired(true);
        m.add_query(Query::query(DnsName::from_str(name).unwrap(), rtype));
        m.to_vec().unwrap()
    }

    fn listed(n: &Name) -> bool {
        n.as_str() == "api.example.com"
    }

    fn parsed(step: &Step) -> (Message, Outcome) {
        match step {
            Step::Reply(bytes, outcome) => (Message::from_vec(bytes).unwrap(), *outcome),
            other => panic!("no reply: {other:?}"),
        }
    }

    const APPROVALS: [IpAddr; 1] = [IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 53))];

    #[test]
    fn each_kind_of_query_gets_its_answer() {
        let session = Scope::Session(&listed);
        let cases: &[(&str, RecordType, Scope<'_>, ResponseCode, Outcome)] = &[
            (
                "api.example.com.",
                RecordType::HTTPS,
                session,
                ResponseCode::NoError,
                Outcome::Answered,
            ),
            (
                "API.Example.COM.",
                RecordType::SVCB,
                session,
                ResponseCode::NoError,
                Outcome::Answered,
            ),
            (
                "api.example.com.",
                RecordType::TXT,
                session,
                ResponseCode::NoError,
                Outcome::Answered,
            ),
            (
                "evil.example.com.",
                RecordType::A,
                session,
                ResponseCode::NXDomain,
                Outcome::Unlisted,
            ),
            (
                "x.api.example.com.",
                RecordType::A,
                session,
                ResponseCode::NXDomain,
                Outcome::Unlisted,
            ),
            (
                "api.example.com.",
                RecordType::A,
                Scope::Unknown,
                ResponseCode::Refused,
                Outcome::UnknownSource,
            ),
            (
                "api.example.com.",
                RecordType::A,
                Scope::Elsewhere,
                ResponseCode::ServFail,
                Outcome::Elsewhere,
            ),
        ];
        for (name, rtype, scope, code, outcome) in cases {
            let step = step(&query(name, *rtype), *scope, &APPROVALS, 30);
            let (m, got) = parsed(&step);
            assert_eq!(m.response_code(), *code, "{name} {rtype}");
            assert_eq!(got, *outcome, "{name} {rtype}");
            assert_eq!(m.id(), 0x1234);
            assert!(m.answers().is_empty(), "{name} {rtype}: {m:?}");
            assert_eq!(m.queries().len(), 1, "the question is echoed");
        }
    }

    #[test]
    fn a_listed_name_is_resolved_and_answered_with_its_family() {
        let step = step(
            &query("api.example.com.", RecordType::AAAA),
            Scope::Session(&listed),
            &[],
            30,
        );
        let Step::Resolve(p) = step else {
            panic!("{step:?}")
        };
        assert_eq!(p.name.as_str(), "api.example.com");
        assert_eq!(p.family, Family::V6);
        let addrs: Vec<IpAddr> = vec![
            "93.184.216.34".parse().unwrap(),
            "2606:2800:220:1::1".parse().unwrap(),
        ];
        let (bytes, outcome) = p.answer(Resolved::Addresses(&addrs), 30);
        assert_eq!(outcome, Outcome::Answered);
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.answers().len(), 1);
        assert_eq!(m.answers()[0].ttl(), 30);
        assert_eq!(
            m.answers()[0].data(),
            &RData::AAAA(AAAA("2606:2800:220:1::1".parse().unwrap()))
        );
    }

    #[test]
    fn internal_and_failed_resolutions_give_no_address() {
        for (resolved, code, outcome) in [
            (Resolved::Internal, ResponseCode::NoError, Outcome::Internal),
            (
                Resolved::Failed,
                ResponseCode::ServFail,
                Outcome::Unresolved,
            ),
        ] {
            let Step::Resolve(p) = step(
                &query("api.example.com", RecordType::A),
                Scope::Session(&listed),
                &[],
                30,
            ) else {
                panic!()
            };
            let (bytes, got) = p.answer(resolved, 30);
            let m = Message::from_vec(&bytes).unwrap();
            assert_eq!((m.response_code(), got), (code, outcome));
            assert!(m.answers().is_empty());
        }
    }

    #[test]
    fn the_approvals_name_gets_the_gateways_own_address() {
        let (m, outcome) = parsed(&step(
            &query("approvals.hangar.internal.", RecordType::A),
            Scope::Session(&|_| false),
            &APPROVALS,
            30,
        ));
        assert_eq!(outcome, Outcome::Answered);
        assert_eq!(m.answers().len(), 1);
        assert_eq!(m.answers()[0].data(), &RData::A(A::new(192, 0, 2, 53)));
    }

    #[test]
    fn what_is_not_a_query_gets_formerr_notimp_or_nothing() {
        let good = query("api.example.com.", RecordType::A);
        // Too short for a header; a response: nothing.
        assert!(matches!(
            step(&good[..11], Scope::Unknown, &[], 30),
            Step::Drop
        ));
        let mut response = good.clone();
        response[2] |= 0x80;
        assert!(matches!(
            step(&response, Scope::Unknown, &[], 30),
            Step::Drop
        ));
        // A header and a body cut short: FORMERR with the id.
        let (m, outcome) = parsed(&step(&good[..good.len() - 3], Scope::Unknown, &[], 30));
        assert_eq!(
            (m.id(), m.response_code(), outcome),
            (0x1234, ResponseCode::FormErr, Outcome::Malformed)
        );
        // Another opcode: NOTIMP.
        let mut notify = good.clone();
        notify[2] = (notify[2] & !0x78) | (4 << 3);
        let (m, _) = parsed(&step(&notify, Scope::Session(&listed), &[], 30));
        assert_eq!(m.response_code(), ResponseCode::NotImp);
        // Many questions: FORMERR, none sent back.
        let mut m = Message::new();
        m.set_id(7);
        for i in 0..65 {
            let name = format!("q{i}.{}.example.com.", "x".repeat(40));
            m.add_query(Query::query(
                DnsName::from_str(&name).unwrap(),
                RecordType::A,
            ));
        }
        let step_many = step(&m.to_vec().unwrap(), Scope::Session(&listed), &[], 30);
        let Step::Reply(bytes, _) = &step_many else {
            panic!()
        };
        assert!(bytes.len() <= 512, "{}", bytes.len());
        let (m, _) = parsed(&step_many);
        assert_eq!(m.response_code(), ResponseCode::FormErr);
        assert!(m.queries().is_empty());
        // Every prefix of a good query is settled without a panic.
        for n in 0..good.len() {
            let _ = step(&good[..n], Scope::Session(&listed), &APPROVALS, 30);
        }
    }

    #[test]
    fn an_answer_too_large_for_the_client_is_cut_with_tc() {
        let many: Vec<IpAddr> = (0..16u8)
            .map(|i| {
                IpAddr::V6(std::net::Ipv6Addr::new(
                    0x2001,
                    0xdb8,
                    0,
                    0,
                    0,
                    0,
                    0,
                    u16::from(i),
                ))
            })
            .collect();
        let long = format!("{}.example.com.", "a".repeat(60));
        let listed_long = |n: &Name| n.as_str().ends_with("example.com");
        let Step::Resolve(p) = step(
            &query(&long, RecordType::AAAA),
            Scope::Session(&listed_long),
            &[],
            30,
        ) else {
            panic!()
        };
        let (bytes, _) = p.answer(Resolved::Addresses(&many), 30);
        assert!(bytes.len() <= 512, "{}", bytes.len());
        let m = Message::from_vec(&bytes).unwrap();
        assert!(m.truncated());
        assert!(m.answers().len() < 16);
    }
}
