//! The two processes after a handover, until the old one exits.
//!
//! The successor holds every authority; the old process only drains the
//! connections it had accepted. Three things still pass between them, on
//! the socket the handover used:
//!
//! - an authority the successor ends (a close, a lapse, a replacement) is
//!   ended in the old process too: its connections there are cut, and the
//!   successor signs its drop report only once the old process says their
//!   records are on its disk ([`Predecessor::end`]). The old process's
//!   batches are all sealed before the successor seals its first, so the
//!   report follows every record of the authority in the chain;
//! - a decision for a request held in the old process is passed to it
//!   ([`Predecessor::decide`]);
//! - a first use approved in the old process is counted in the successor
//!   ([`FirstUse`]).
//!
//! When the old process exits the socket closes: every question pending is
//! answered "nothing there", and [`Predecessor::gone`] resolves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use talos_certs::{Signed, Verdict};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};

use crate::process::wire;
use crate::session::approvals::FirstUse;
use crate::session::sessions::Sessions;
use talos_contract::sync::Locked;

/// The longest the successor waits for the old process to end an
/// authority there: it cuts the connections at once, so this bounds only
/// an old process that is stuck.
pub const END_BOUND: Duration = Duration::from_secs(30);

/// A message between the two processes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LinkMsg {
    /// Successor to old: end this authority's connections.
    End {
        id: u64,
        session_id: String,
        attempt: u32,
    },
    /// Old to successor: done, their records are on disk.
    Ended {
        id: u64,
        connections_closed: u32,
        approvals_withdrawn: u32,
    },
    /// Successor to old: a decision for a request held there.
    Decide { id: u64, decision: Signed },
    /// Old to successor: what the decision did there (neither: no such
    /// request is held there).
    Decided {
        id: u64,
        verdict: Option<Verdict>,
        error: Option<String>,
    },
    /// Old to successor: a first use approved there.
    FirstUse {
        session_id: String,
        attempt: u32,
        rule: String,
    },
}

/// What the old process did for an end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndedThere {
    pub connections_closed: u32,
    pub approvals_withdrawn: u32,
}

enum Waiting {
    End(oneshot::Sender<EndedThere>),
    Decide(oneshot::Sender<Option<Result<Verdict, String>>>),
}

/// The successor's side: the old process, until it exits.
#[derive(Debug)]
pub struct Predecessor {
    out: mpsc::UnboundedSender<LinkMsg>,
    waiting: Mutex<HashMap<u64, Waiting>>,
    next: AtomicU64,
    gone: watch::Receiver<bool>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Waiting::End(_) => "End",
            Waiting::Decide(_) => "Decide",
        })
    }
}

impl Predecessor {
    /// Run the successor's side of the link on `stream`; first uses
    /// reported by the old process are counted in `sessions`.
    pub fn start(stream: UnixStream, sessions: Arc<Sessions>) -> Arc<Predecessor> {
        let (read, write) = stream.into_split();
        let (out, rx) = mpsc::unbounded_channel();
        let (gone_tx, gone) = watch::channel(false);
        let this = Arc::new(Predecessor {
            out,
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            gone,
        });
        tokio::spawn(write_all(write, rx));
        let reader = Arc::clone(&this);
        tokio::spawn(async move {
            reader.read(read, &sessions).await;
            // The old process has exited (or broke the link): nothing
            // pending will be answered.
            let waiting: Vec<Waiting> = reader.waiting.locked().drain().map(|(_, w)| w).collect();
            for w in waiting {
                match w {
                    Waiting::End(tx) => {
                        let _ = tx.send(EndedThere::default());
                    }
                    Waiting::Decide(tx) => {
                        let _ = tx.send(None);
                    }
                }
            }
            let _ = gone_tx.send(true);
            tracing::info!("the previous process has exited");
        });
        this
    }

    async fn read(&self, mut read: OwnedReadHalf, sessions: &Sessions) {
        loop {
            let msg: LinkMsg = match wire::read_json(&mut read).await {
                Ok(m) => m,
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        tracing::warn!(error = %e, "the link to the previous process broke");
                    }
                    return;
                }
            };
            match msg {
                LinkMsg::Ended {
                    id,
                    connections_closed,
                    approvals_withdrawn,
                } => {
                    if let Some(Waiting::End(tx)) = self.take(id) {
                        let _ = tx.send(EndedThere {
                            connections_closed,
                            approvals_withdrawn,
                        });
                    }
                }
                LinkMsg::Decided { id, verdict, error } => {
                    if let Some(Waiting::Decide(tx)) = self.take(id) {
                        let _ = tx.send(match (verdict, error) {
                            (Some(v), _) => Some(Ok(v)),
                            (None, Some(e)) => Some(Err(e)),
                            (None, None) => None,
                        });
                    }
                }
                LinkMsg::FirstUse {
                    session_id,
                    attempt,
                    rule,
                } => {
                    if let Some(s) = sessions.find(&session_id) {
                        if s.attempt == attempt {
                            s.approvals.mark_first_use(&rule);
                        }
                    }
                }
                other => {
                    tracing::warn!(message = ?other, "unexpected message from the previous process")
                }
            }
        }
    }

    fn take(&self, id: u64) -> Option<Waiting> {
        self.waiting.locked().remove(&id)
    }

    fn ask(&self, waiting: Waiting, msg: impl FnOnce(u64) -> LinkMsg) -> bool {
        if *self.gone.borrow() {
            return false;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.waiting.locked().insert(id, waiting);
        if self.out.send(msg(id)).is_err() {
            self.take(id);
            return false;
        }
        true
    }

    /// End attempt `attempt` of session `session_id` in the old process
    /// and wait (at most [`END_BOUND`]) until its connections there are
    /// recorded. Answers at once once the old process is gone.
    pub async fn end(&self, session_id: &str, attempt: u32) -> EndedThere {
        let (tx, rx) = oneshot::channel();
        let asked = self.ask(Waiting::End(tx), |id| LinkMsg::End {
            id,
            session_id: session_id.to_owned(),
            attempt,
        });
        if !asked {
            return EndedThere::default();
        }
        match tokio::time::timeout(END_BOUND, rx).await {
            Ok(Ok(ended)) => ended,
            _ => {
                tracing::error!(
                    session = session_id,
                    attempt,
                    "the previous process did not end the authority's connections in time"
                );
                EndedThere::default()
            }
        }
    }

    /// Pass a decision to the old process: `None` when it is gone or holds
    /// no such request either.
    pub async fn decide(&self, decision: &Signed) -> Option<Result<Verdict, String>> {
        let (tx, rx) = oneshot::channel();
        let asked = self.ask(Waiting::Decide(tx), |id| LinkMsg::Decide {
            id,
            decision: decision.clone(),
        });
        if !asked {
            return None;
        }
        rx.await.ok().flatten()
    }

    /// Resolves once the old process has exited.
    pub async fn gone(&self) {
        let mut gone = self.gone.clone();
        let _ = gone.wait_for(|g| *g).await;
    }

    /// Whether the old process has exited.
    pub fn is_gone(&self) -> bool {
        *self.gone.borrow()
    }
}

async fn write_all(mut write: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<LinkMsg>) {
    while let Some(msg) = rx.recv().await {
        if wire::write_json(&mut write, &msg).await.is_err() {
            return;
        }
    }
}

/// The old process's side: answers the successor until this process
/// exits, and tells it of first uses approved here.
pub async fn serve_successor(
    stream: UnixStream,
    sessions: Arc<Sessions>,
    mut first_uses: mpsc::UnboundedReceiver<FirstUse>,
) {
    let (mut read, write) = stream.into_split();
    let (out, rx) = mpsc::unbounded_channel();
    tokio::spawn(write_all(write, rx));
    let relay = out.clone();
    tokio::spawn(async move {
        while let Some(f) = first_uses.recv().await {
            if relay
                .send(LinkMsg::FirstUse {
                    session_id: f.session_id,
                    attempt: f.attempt,
                    rule: f.rule,
                })
                .is_err()
            {
                return;
            }
        }
    });
    loop {
        let msg: LinkMsg = match wire::read_json(&mut read).await {
            Ok(m) => m,
            Err(_) => return,
        };
        match msg {
            LinkMsg::End {
                id,
                session_id,
                attempt,
            } => {
                let sessions = Arc::clone(&sessions);
                let out = out.clone();
                tokio::spawn(async move {
                    let mut ended = EndedThere::default();
                    if let Ok(session) = sessions.remove(&session_id, attempt) {
                        let (cut, withdrawn) = session.end_and_withdraw();
                        ended = EndedThere {
                            connections_closed: cut,
                            approvals_withdrawn: withdrawn,
                        };
                        if !session.connections_done(END_BOUND).await {
                            tracing::error!(
                                session = %session_id,
                                attempt,
                                "connections of an ended authority are not all recorded in time"
                            );
                        }
                        tracing::info!(
                            session = %session_id,
                            attempt,
                            connections_closed = cut,
                            "the successor ended an authority; its connections here are cut"
                        );
                    }
                    let _ = out.send(LinkMsg::Ended {
                        id,
                        connections_closed: ended.connections_closed,
                        approvals_withdrawn: ended.approvals_withdrawn,
                    });
                });
            }
            LinkMsg::Decide { id, decision } => {
                let proposal = serde_json::from_slice::<serde_json::Value>(&decision.payload)
                    .ok()
                    .and_then(|v| v["proposal_id"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let held = sessions
                    .all()
                    .into_iter()
                    .find(|s| s.approvals.holds(&proposal));
                let (verdict, error) = match held.map(|s| s.approvals.decide(&decision)) {
                    Some(Ok(v)) => (Some(v), None),
                    Some(Err(e)) => (None, Some(e.to_string())),
                    None => (None, None),
                };
                let _ = out.send(LinkMsg::Decided { id, verdict, error });
            }
            other => tracing::warn!(message = ?other, "unexpected message from the successor"),
        }
    }
}
