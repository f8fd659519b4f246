//! The card watch and the live card streams.
//!
//! A person's cards page holds one stream (`GET /api/events`,
//! server-sent events): the person's waiting cards, whole, each time they
//! change, so a new card appears within a second of its proposal without
//! a reload, and a decided, withdrawn or expired one goes.
//!
//! **What wakes the streams.** A card may reach any `serve` replica
//! sharing the store, and be decided on any. So each replica's watch
//! [`poll`]s the store every [`POLL_INTERVAL`] for what changes whenever a
//! card starts or stops waiting (the pending cards' count and the newest
//! one's position: one indexed query), and wakes its streams when it
//! changed. A card received here wakes them at once through
//! [`CardHook`], and a decision made here through [`Watch::wake`]: the
//! poll is what makes the other replicas' cards appear, within
//! [`POLL_INTERVAL`] and a read. (PostgreSQL's LISTEN/NOTIFY would save
//! the poll, but needs a connection held for it outside the store's
//! transactions, and SQLite has nothing like it; one small query four
//! times a second per replica costs nothing beside the gateways'
//! batches.)
//!
//! **A stream**, woken, reads its person's cards and sends them if they
//! differ from what it sent last; it also sends a comment every
//! [`KEEPALIVE`] (so a proxy or a phone's network does not drop an idle
//! connection), and ends with an `signed_out` event when the person's
//! session is over (checked at each wake and keepalive), or at once when
//! the app stops.
//!
//! # Limits
//!
//! At most [`MAX_STREAMS_PER_PERSON`] streams per person and
//! [`MAX_STREAMS`] in all (`too_many_streams`, HTTP 429, past either: the
//! page then asks for its cards every few seconds instead). A stream's
//! slot is given back when it ends: at once when the page closes it over
//! HTTP/2, by the next [`KEEPALIVE`] over HTTP/1.1 (the first write that
//! fails). Each stream holds a task, a channel of [`STREAM_QUEUE`] events,
//! and what it sent last.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use talos_contract::sync::Locked;
use tokio::sync::watch;

use super::super::push::Push;
use super::pool::Pool;
use crate::store::{ProposalRecord, Store};

/// How often each replica reads the store for cards that started or
/// stopped waiting: well inside the second a new card has to appear in.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How often an idle stream sends a comment.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// Live card streams per person: a phone and a laptop, each with a tab or
/// two.
pub const MAX_STREAMS_PER_PERSON: usize = 4;

/// Live card streams in all.
pub const MAX_STREAMS: usize = 128;

/// Events a stream's channel holds before its task waits for the
/// connection: one list of cards is all that matters, so a short queue.
pub const STREAM_QUEUE: usize = 4;

/// What the relay calls when a new card starts waiting, with the store it
/// received the card in.
pub type CardHook = Arc<dyn Fn(&Store, &ProposalRecord) + Send + Sync>;

/// The watch: a generation number that moves whenever the cards may have
/// changed, and the streams open, per person.
#[derive(Clone)]
pub struct Watch {
    generation: Arc<watch::Sender<u64>>,
    streams: Arc<Mutex<HashMap<String, usize>>>,
}

impl Watch {
    pub fn new() -> Watch {
        Watch {
            generation: Arc::new(watch::channel(0).0),
            streams: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Wake every stream: the cards may have changed.
    pub fn wake(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Take a stream slot for `person`, or refuse (see the module docs).
    pub(crate) fn slot(&self, person: &str) -> Option<Slot> {
        let mut streams = self.streams.locked();
        let total: usize = streams.values().sum();
        let mine = streams.get(person).copied().unwrap_or(0);
        if total >= MAX_STREAMS || mine >= MAX_STREAMS_PER_PERSON {
            return None;
        }
        streams.insert(person.to_owned(), mine + 1);
        Some(Slot {
            watch: self.clone(),
            person: person.to_owned(),
        })
    }
}

/// A stream's slot, given back when the stream ends.
pub(crate) struct Slot {
    watch: Watch,
    pub(crate) person: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut streams = self.watch.streams.locked();
        if let Some(n) = streams.get_mut(&self.person) {
            *n -= 1;
            if *n == 0 {
                streams.remove(&self.person);
            }
        }
    }
}

/// The hook the relay calls (see [`CardHook`]): the card's approvers'
/// devices pushed to, the streams here woken.
pub fn hook(watch: Watch, push: Option<Push>) -> CardHook {
    Arc::new(move |store: &Store, card: &ProposalRecord| {
        watch.wake();
        if let Some(push) = &push {
            if let Err(e) =
                push.notify_card_waiting(store, &card.proposal_id, &card.fields.approvers)
            {
                eprintln!(
                    "{}",
                    serde_json::json!({"push": "failed", "card": card.proposal_id, "error": e.code(), "message": e.to_string()})
                );
            }
        }
    })
}

/// Read the store every [`POLL_INTERVAL`] and wake the streams when the
/// waiting cards changed, until `stop`.
pub async fn poll(watch: Watch, pool: Arc<Pool>, mut stop: watch::Receiver<bool>) {
    let mut last = None;
    let mut failing = false;
    loop {
        match pool
            .run(|store| store.read(|tx| tx.pending_fingerprint()))
            .await
        {
            Ok(now) => {
                if last.is_some_and(|l| l != now) {
                    watch.wake();
                }
                last = Some(now);
                failing = false;
            }
            Err(e) => {
                if !failing {
                    eprintln!(
                        "{}",
                        serde_json::json!({"web": "card_watch_failed", "error": e.code(), "message": e.to_string()})
                    );
                }
                failing = true;
            }
        }
        tokio::select! {
            () = stopped(&mut stop) => return,
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}

/// Resolves once `stop` says stop (at once if it did already; never if
/// its sender is gone without saying it).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}
