//! A DNS server on 127.0.0.1 that answers A and AAAA queries from a table.
//!
//! Names not in the table get NXDOMAIN; names mapped to [`Answer::Silent`]
//! get no answer at all, as a dead nameserver would behave.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;

/// What the server answers for one name.
#[derive(Clone, Debug)]
pub enum Answer {
    /// These addresses (A for IPv4, AAAA for IPv6).
    Addrs(Vec<IpAddr>),
    /// Never answer.
    Silent,
}

/// A running DNS server; stops when dropped.
#[derive(Debug)]
pub struct DnsServer {
    pub addr: SocketAddr,
    /// Every name asked, in order, as asked (lower case, no final dot).
    asked: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DnsServer {
    /// Start a server answering from `table` (names without trailing dot,
    /// lower case).
    pub async fn start(table: HashMap<String, Answer>) -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind dns");
        let addr = socket.local_addr().expect("dns addr");
        let table = Arc::new(table);
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = Arc::clone(&asked);
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                if let Some(name) = asked_name(&buf[..n]) {
                    log.lock().expect("asked").push(name);
                }
                if let Some(reply) = answer(&table, &buf[..n]) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        DnsServer { addr, asked, task }
    }

    /// Every name asked so far.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("asked").clone()
    }
}

fn asked_name(query: &[u8]) -> Option<String> {
    let query = Message::from_vec(query).ok()?;
    let q = query.queries().first()?;
    Some(
        q.name()
            .to_ascii()
            .trim_end_matches('.')
            .to_ascii_lowercase(),
    )
}

fn answer(table: &HashMap<String, Answer>, query: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(query).ok()?;
    let q = query.queries().first()?.clone();
    let name = q
        .name()
        .to_ascii()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let mut reply = Message::new();
    reply
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true)
        .add_query(q.clone());
    match table.get(&name) {
        None => {
            reply.set_response_code(ResponseCode::NXDomain);
        }
        Some(Answer::Silent) => return None,
        Some(Answer::Addrs(addrs)) => {
            let mut answered = false;
            for ip in addrs {
                let rdata = match (ip, q.query_type()) {
                    (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                    (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                    _ => continue,
                };
                reply.add_answer(Record::from_rdata(q.name().clone(), 60, rdata));
                answered = true;
            }
            if !answered {
                // "No record of this type" with an SOA, as real servers
                // answer, so resolvers cache the empty answer (RFC 2308).
                let soa = SOA::new(q.name().clone(), q.name().clone(), 1, 3600, 600, 86_400, 60);
                reply.add_name_server(Record::from_rdata(q.name().clone(), 60, RData::SOA(soa)));
            }
        }
    }
    reply.to_vec().ok()
}
