//! One DevTools WebSocket to Chromium: commands matched to their replies by
//! id, events fanned out to whoever waits, and each page's problems
//! (console errors, uncaught exceptions, CSP violations) kept as they come.
//!
//! The socket is driven by a thread of its own with a single-threaded
//! runtime, so a [`Connection`] works from any runtime (each
//! `#[tokio::test]` has its own, and one browser serves several tests) and
//! from none. Commands and replies cross through channels; every wait for
//! a reply or an event is bounded by the caller's deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use super::{Error, Problem, ProblemKind};

/// Events kept for a subscriber that has not read them yet. Chromium sends
/// a few dozen per navigation of the small pages the tests load; past this
/// a subscriber has fallen behind and its wait fails saying so (rather
/// than missing the event it waits for without knowing).
const EVENT_BACKLOG: usize = 4096;

/// Problems kept per page: enough for any page that works, and a page that
/// logs an error in a loop cannot grow the test's memory without end (the
/// rest are counted in [`Problems::dropped`]).
const MAX_PROBLEMS: usize = 256;

/// Largest message taken from Chromium: a phone-sized PNG screenshot
/// (1170×2532 pixels) is a few MiB in base64; axe's report of a large page
/// is less.
const MAX_MESSAGE: usize = 64 << 20;

/// One event from Chromium: its method, its parameters, and the session
/// (page) it came from (`None` for the browser's own).
#[derive(Debug, Clone)]
pub struct Event {
    pub method: String,
    pub params: Value,
    pub session: Option<String>,
}

/// The problems recorded for one page session.
#[derive(Debug, Default, Clone)]
pub(crate) struct Problems {
    pub list: Vec<Problem>,
    /// How many came after [`MAX_PROBLEMS`] and were only counted.
    pub dropped: usize,
}

type Reply = Result<Value, Error>;

/// Commands sent and not answered yet: id → (method, who waits).
type Pending = HashMap<u64, (String, oneshot::Sender<Reply>)>;

/// What the connection's thread and its users share.
#[derive(Debug, Default)]
struct Shared {
    /// Commands sent and not answered yet, by id. `None` once the socket
    /// has closed: a command sent after that fails at once.
    pending: Mutex<Option<Pending>>,
    /// Problems of the page sessions being watched, by session id.
    problems: Mutex<HashMap<String, Problems>>,
}

/// The DevTools connection to one browser.
#[derive(Debug)]
pub struct Connection {
    out: mpsc::UnboundedSender<String>,
    shared: Arc<Shared>,
    /// Never read: new subscriptions are made from it. The socket's thread
    /// holds the only sender, so when the socket closes every subscriber
    /// learns it ([`Error::Closed`]) instead of waiting out its bound.
    events: broadcast::Receiver<Arc<Event>>,
    next_id: AtomicU64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Connection {
    /// Connect to `url` (the browser's `ws://127.0.0.1:PORT/devtools/browser/…`)
    /// within `limit`.
    pub fn connect(url: &str, limit: Duration) -> Result<Connection, Error> {
        let (out, mut outgoing) = mpsc::unbounded_channel::<String>();
        let shared = Arc::new(Shared {
            pending: Mutex::new(Some(HashMap::new())),
            problems: Mutex::new(HashMap::new()),
        });
        let (thread_events, events) = broadcast::channel(EVENT_BACKLOG);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), Error>>();
        let url = url.to_owned();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("devtools".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Launch(format!(
                            "a runtime for the DevTools socket: {e}"
                        ))));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut config = WebSocketConfig::default();
                    config.max_message_size = Some(MAX_MESSAGE);
                    config.max_frame_size = Some(MAX_MESSAGE);
                    let connect = tokio_tungstenite::connect_async_with_config(
                        url.as_str(),
                        Some(config),
                        false,
                    );
                    let ws = match tokio::time::timeout(limit, connect).await {
                        Ok(Ok((ws, _))) => ws,
                        Ok(Err(e)) => {
                            let _ = ready_tx.send(Err(Error::Launch(format!(
                                "the DevTools socket {url}: {e}"
                            ))));
                            return;
                        }
                        Err(_) => {
                            let _ = ready_tx.send(Err(Error::Timeout {
                                awaited: format!("the DevTools socket {url} to open"),
                                after: limit,
                            }));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let (mut sink, mut stream) = ws.split();
                    loop {
                        tokio::select! {
                            msg = outgoing.recv() => match msg {
                                Some(text) => {
                                    if sink.send(Message::text(text)).await.is_err() {
                                        break;
                                    }
                                }
                                // Every `Connection` handle is gone.
                                None => {
                                    let _ = sink.close().await;
                                    break;
                                }
                            },
                            msg = stream.next() => match msg {
                                Some(Ok(Message::Text(text))) => {
                                    dispatch(&thread_shared, &thread_events, text.as_str());
                                }
                                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                                Some(Ok(_)) => {}
                            },
                        }
                    }
                    close_pending(&thread_shared);
                });
            })
            .map_err(|e| Error::Launch(format!("a thread for the DevTools socket: {e}")))?;
        // The thread answers within `limit` (its own timeout); the extra
        // second covers starting the thread on a loaded machine.
        let ready = ready_rx
            .recv_timeout(limit + Duration::from_secs(1))
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    awaited: "the DevTools socket to open".into(),
                    after: limit,
                })
            });
        let conn = Connection {
            out,
            shared,
            events,
            next_id: AtomicU64::new(1),
            thread: Mutex::new(Some(thread)),
        };
        ready.map(|()| conn)
    }

    /// Send `method` with `params` to `session` (or the browser itself) and
    /// wait at most `limit` for its reply. A DevTools error reply is
    /// [`Error::Protocol`].
    pub async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
        limit: Duration,
    ) -> Result<Value, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let Some(pending) = pending.as_mut() else {
                return Err(Error::Closed {
                    awaited: format!("the reply to {method}"),
                });
            };
            pending.insert(id, (method.to_owned(), tx));
        }
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = Value::String(s.to_owned());
        }
        if self.out.send(msg.to_string()).is_err() {
            self.forget(id);
            return Err(Error::Closed {
                awaited: format!("the reply to {method}"),
            });
        }
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(Error::Closed {
                awaited: format!("the reply to {method}"),
            }),
            Err(_) => {
                self.forget(id);
                Err(Error::Timeout {
                    awaited: format!("the reply to {method}"),
                    after: limit,
                })
            }
        }
    }

    /// Send `method` without waiting for its reply: for a `Drop`, which
    /// cannot wait. Its reply, when it comes, is dropped.
    pub fn send_and_forget(&self, session: Option<&str>, method: &str, params: Value) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = Value::String(s.to_owned());
        }
        let _ = self.out.send(msg.to_string());
    }

    fn forget(&self, id: u64) {
        let mut pending = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pending.as_mut() {
            p.remove(&id);
        }
    }

    /// Events from now on. Subscribe *before* sending the command whose
    /// effect you wait for, so the event cannot slip by in between.
    pub fn subscribe(&self) -> Events {
        Events(self.events.resubscribe())
    }

    /// Start keeping the problems reported for `session`.
    pub(crate) fn watch_problems(&self, session: &str) {
        self.shared
            .problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.to_owned(), Problems::default());
    }

    /// The problems kept for `session` so far; `clear` empties the list.
    pub(crate) fn problems(&self, session: &str, clear: bool) -> Problems {
        let mut all = self
            .shared
            .problems
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(p) = all.get_mut(session) else {
            return Problems::default();
        };
        if clear {
            std::mem::take(p)
        } else {
            p.clone()
        }
    }

    /// Stop keeping the problems of `session` (its page is closed).
    pub(crate) fn unwatch_problems(&self, session: &str) {
        self.shared
            .problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
    }

    /// Whether the socket is still open.
    pub fn is_open(&self) -> bool {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Wait (at most `limit`) for the socket's thread to end: after the
    /// browser has gone, the socket closes and the thread returns.
    pub(crate) fn join(&self, limit: Duration) -> bool {
        let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return true;
        };
        let deadline = std::time::Instant::now() + limit;
        while !thread.is_finished() {
            if std::time::Instant::now() > deadline {
                // Left to end on its own; its socket has no peer any more.
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = thread.join();
        true
    }
}

/// Route one message from Chromium: a reply to whoever sent the command,
/// an event to the subscribers (and to the page's problems).
fn dispatch(shared: &Shared, events: &broadcast::Sender<Arc<Event>>, text: &str) {
    let Ok(msg) = serde_json::from_str::<Value>(text) else {
        return;
    };
    if let Some(id) = msg.get("id").and_then(Value::as_u64) {
        let waiter = shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .and_then(|p| p.remove(&id));
        if let Some((method, tx)) = waiter {
            let mut msg = msg;
            scrub(&method, &mut msg);
            let reply = match msg.get("error") {
                Some(err) => Err(Error::Protocol {
                    method,
                    code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                    message: err
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    data: err.get("data").and_then(Value::as_str).map(str::to_owned),
                }),
                None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
            };
            let _ = tx.send(reply);
        }
        return;
    }
    let Some(method) = msg.get("method").and_then(Value::as_str).map(str::to_owned) else {
        return;
    };
    let mut msg = msg;
    scrub(&method, &mut msg);
    let event = Event {
        method,
        params: msg.get("params").cloned().unwrap_or(Value::Null),
        session: msg
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    if let Some(session) = &event.session {
        if let Some(problem) = problem_of(&event) {
            let mut all = shared.problems.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = all.get_mut(session) {
                if p.list.len() < MAX_PROBLEMS {
                    p.list.push(problem);
                } else {
                    p.dropped += 1;
                }
            }
        }
    }
    // No subscriber is not an error: nobody waits for this event.
    let _ = events.send(Arc::new(event));
}

/// Remove the private keys a virtual authenticator's credentials carry
/// (`WebAuthn.getCredentials`, `getCredential`, `credentialAdded`,
/// `credentialAsserted`, …) from `msg` as it is read, so no reply or event
/// the driver hands on, and so no test output, holds passkey material.
fn scrub(method: &str, msg: &mut Value) {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.remove("privateKey");
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if method.starts_with("WebAuthn.") {
        walk(msg);
    }
}

/// The socket has closed: every command still waiting fails now, and any
/// sent later fails at once.
fn close_pending(shared: &Shared) {
    let pending = shared
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    for (_, (method, tx)) in pending.into_iter().flatten() {
        let _ = tx.send(Err(Error::Closed {
            awaited: format!("the reply to {method}"),
        }));
    }
}

/// The problem an event reports, if it reports one: a `console.error` or
/// failed `console.assert`, an exception nobody caught, or an error the
/// browser logged for the page (a CSP violation, a resource that failed to
/// load, …).
fn problem_of(event: &Event) -> Option<Problem> {
    let p = &event.params;
    match event.method.as_str() {
        "Runtime.consoleAPICalled" => {
            let kind = p.get("type").and_then(Value::as_str)?;
            if kind != "error" && kind != "assert" {
                return None;
            }
            let text = p
                .get("args")
                .and_then(Value::as_array)
                .map(|args| args.iter().map(remote_text).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            let frame = p
                .get("stackTrace")
                .and_then(|s| s.get("callFrames"))
                .and_then(|f| f.get(0));
            Some(Problem {
                kind: ProblemKind::ConsoleError,
                text,
                url: frame
                    .and_then(|f| f.get("url"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                line: frame
                    .and_then(|f| f.get("lineNumber"))
                    .and_then(Value::as_u64),
            })
        }
        "Runtime.exceptionThrown" => {
            let d = p.get("exceptionDetails")?;
            let text = d
                .get("exception")
                .and_then(|e| e.get("description"))
                .and_then(Value::as_str)
                .or_else(|| d.get("text").and_then(Value::as_str))
                .unwrap_or("")
                .to_owned();
            Some(Problem {
                kind: ProblemKind::Exception,
                text,
                url: d
                    .get("url")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                line: d.get("lineNumber").and_then(Value::as_u64),
            })
        }
        "Log.entryAdded" => {
            let e = p.get("entry")?;
            if e.get("level").and_then(Value::as_str) != Some("error") {
                return None;
            }
            let text = e
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let kind = if is_csp_violation(&text) {
                ProblemKind::CspViolation
            } else {
                ProblemKind::LogError
            };
            Some(Problem {
                kind,
                text,
                url: e
                    .get("url")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                line: e.get("lineNumber").and_then(Value::as_u64),
            })
        }
        _ => None,
    }
}

/// Chromium words every CSP refusal as "… violates the following Content
/// Security Policy directive …" (and a report-only one "… violates the
/// following report-only Content Security Policy directive …").
fn is_csp_violation(text: &str) -> bool {
    text.contains("Content Security Policy")
}

/// A console argument as text: its value for primitives, else Chromium's
/// description of it.
fn remote_text(arg: &Value) -> String {
    match arg.get("value") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => arg
            .get("description")
            .or_else(|| arg.get("unserializableValue"))
            .or_else(|| arg.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    }
}

/// A subscription to the connection's events; see [`Connection::subscribe`].
#[derive(Debug)]
pub struct Events(broadcast::Receiver<Arc<Event>>);

impl Events {
    /// The next event of `session` (`None`: the browser's own) named
    /// `method` for which `matches` holds, within `limit`. `awaited` says
    /// what the caller waits for, in its errors.
    pub async fn wait_for(
        &mut self,
        session: Option<&str>,
        method: &str,
        awaited: &str,
        limit: Duration,
        mut matches: impl FnMut(&Value) -> bool,
    ) -> Result<Arc<Event>, Error> {
        let found = tokio::time::timeout(limit, async {
            loop {
                match self.0.recv().await {
                    Ok(e) => {
                        if e.method == method
                            && e.session.as_deref() == session
                            && matches(&e.params)
                        {
                            return Ok(e);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        return Err(Error::Page(format!(
                            "fell {n} events behind while waiting for {awaited}"
                        )))
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(Error::Closed {
                            awaited: awaited.to_owned(),
                        })
                    }
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            Err(Error::Timeout {
                awaited: awaited.to_owned(),
                after: limit,
            })
        })
    }
}
