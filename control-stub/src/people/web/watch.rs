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
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Frame;
use talos_contract::sync::Locked;
use tokio::sync::{mpsc, watch};

use super::super::push::Push;
use super::views;
use super::{App, Pool};
use crate::error::Error;
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

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Take a stream slot for `person`, or refuse (see the module docs).
    fn slot(&self, person: &str) -> Option<Slot> {
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
struct Slot {
    watch: Watch,
    person: String,
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
            () = super::stopped(&mut stop) => return,
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}

/// A streamed body: the events a stream's task sends.
pub struct EventBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|event| event.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// One server-sent event.
fn event(name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// `person`'s cards as the stream and `GET /api/cards` give them.
pub async fn cards_of(app: &Arc<App>, person: &str) -> Result<serde_json::Value, Error> {
    let person = person.to_owned();
    let now = app.now();
    let rp_id = app.rp.rp_id().to_owned();
    app.pool
        .run(move |store| {
            store.read(|tx| {
                let cards: Vec<_> = views::waiting(tx, &person, now)?
                    .iter()
                    .map(|p| views::card(p, now))
                    .collect();
                let allow = super::super::ceremony::descriptors(&tx.passkeys_of(&person)?);
                Ok(serde_json::json!({"cards": cards, "allow_credentials": allow, "rp_id": rp_id}))
            })
        })
        .await
}

/// Open a stream for `person` in web session `session_id`, or `None` when
/// they hold as many as they may (see the module docs).
pub fn open(app: &Arc<App>, person: &str, session_id: &str) -> Option<EventBody> {
    let slot = app.watch.slot(person)?;
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    tokio::spawn(run(Arc::clone(app), slot, session_id.to_owned(), tx));
    Some(EventBody { rx })
}

/// A stream's task (see the module docs).
async fn run(app: Arc<App>, slot: Slot, session_id: String, tx: mpsc::Sender<Bytes>) {
    let mut woken = app.watch.subscribe();
    let mut stop = app.shutdown.clone();
    let mut sent: Option<String> = None;
    // A browser reconnects after this long if the stream drops.
    if tx
        .send(Bytes::from_static(b"retry: 2000\n\n"))
        .await
        .is_err()
    {
        return;
    }
    loop {
        let live = {
            let (id, now) = (session_id.clone(), app.now());
            app.pool
                .run(move |store| super::super::sessions::live(store, &id, now))
                .await
        };
        match live {
            Ok(true) => {}
            Ok(false) => {
                let _ = tx.send(event("signed_out", &serde_json::json!({}))).await;
                return;
            }
            Err(_) => {}
        }
        if let Ok(cards) = cards_of(&app, &slot.person).await {
            // Which cards, not their time left (which moves at every read).
            let ids: String = cards["cards"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["id"].as_str())
                .collect::<Vec<_>>()
                .join("\n");
            if sent.as_deref() != Some(ids.as_str()) {
                if tx.send(event("cards", &cards)).await.is_err() {
                    return;
                }
                sent = Some(ids);
            }
        }
        let idle = tokio::select! {
            () = super::stopped(&mut stop) => return,
            // The connection's end, as soon as hyper drops the body: at
            // once over HTTP/2 (the browser resets the stream), at the
            // next keepalive over HTTP/1.1 (when writing fails).
            () = tx.closed() => return,
            changed = woken.changed() => if changed.is_err() { return } else { false },
            () = tokio::time::sleep(KEEPALIVE) => true,
        };
        if idle
            && tx
                .send(Bytes::from_static(b": keepalive\n\n"))
                .await
                .is_err()
        {
            return;
        }
        if tx.is_closed() {
            return;
        }
    }
}
