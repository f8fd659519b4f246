//! The live card streams (server-sent events): a person's cards, sent
//! again each time the card watch ([`super::watch`]) says they changed.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::app::App;
use super::views;
use super::watch::{stopped, Slot, KEEPALIVE, STREAM_QUEUE};
use crate::error::Error;

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
            () = stopped(&mut stop) => return,
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
