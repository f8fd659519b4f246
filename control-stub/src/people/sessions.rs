//! Web sessions: what a signed-in person's browser holds, and how long.
//!
//! A sign-in opens a session and gives the browser its token in a cookie:
//!
//! ```text
//! Set-Cookie: __Host-talos_session=<token>; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=<to the absolute end>
//! ```
//!
//! - `__Host-`: the browser takes it only from a secure origin, with
//!   `Path=/` and no `Domain`, so no other host under the same domain can
//!   set or shadow it;
//! - `HttpOnly`: no script reads it (a script that ran in the page anyway
//!   could act for the person while the page is open, but not carry the
//!   session away);
//! - `SameSite=Strict`: no request another site starts carries it.
//!
//! The token is 32 random bytes; the store keeps its SHA-256. A session
//! lasts at most [`ABSOLUTE`] from its sign-in and ends after [`IDLE`]
//! without a request from the page (the live card stream does not count:
//! a phone left open on the cards page is signed out after a quarter of
//! an hour, and signs in again with one touch). Its token is **rotated**:
//! a new one at every sign-in (never the token of an earlier session), and
//! again on the first request after [`ROTATE_AFTER`]; the old token stops
//! working at once (the page makes its requests one at a time, so none of
//! its own is in flight with the old one). A cookie stolen from a backup
//! or a shared machine is good for minutes, not a working day.
//!
//! Each session also has a **CSRF token** (32 random bytes, base64url),
//! which the page reads from `/api/me` and sends in the `X-CSRF-Token`
//! header of every request that changes anything; the web app checks it
//! and the `Origin` header (see [`super::web`]).

use std::time::{Duration, SystemTime};

use zeroize::Zeroizing;

use super::rp::{at, b64, new_token, parse_at, random, token_hash};
use crate::error::Error;
use crate::store::{Person, Store, Tx, WebSession};

/// The session cookie's name.
pub const COOKIE: &str = "__Host-talos_session";

/// The longest a session lasts, whatever the person does: a working day.
pub const ABSOLUTE: Duration = Duration::from_secs(8 * 60 * 60);

/// A session with no request from its page for this long is over.
pub const IDLE: Duration = Duration::from_secs(15 * 60);

/// A session's token is replaced on the first request this long after it
/// was issued.
pub const ROTATE_AFTER: Duration = Duration::from_secs(5 * 60);

/// A session just opened, or a token just rotated: the token goes to the
/// browser once, in a cookie.
pub struct Opened {
    pub session: WebSession,
    pub token: Zeroizing<String>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// Open a session for `person`, signed in with passkey `credential_id`
/// from `source`, at `now` (sessions already over are removed first).
pub fn open(
    tx: &Tx<'_>,
    person: &Person,
    credential_id: &[u8],
    source: &str,
    now: SystemTime,
) -> Result<Opened, Error> {
    let stamp = at(now);
    tx.prune_web_sessions(&stamp)?;
    let token = new_token()?;
    let session = WebSession {
        id: hex::encode(random(16)?.as_slice()),
        person: person.name.clone(),
        role: person.role,
        csrf: b64(&random(32)?),
        credential_id: credential_id.to_vec(),
        source: source.to_owned(),
        created_at: stamp.clone(),
        rotated_at: stamp.clone(),
        last_seen_at: stamp,
        idle_expires_at: at(now + IDLE),
        expires_at: at(now + ABSOLUTE),
    };
    tx.insert_web_session(&session, &token_hash(&token))?;
    Ok(Opened { session, token })
}

/// Whether `s` is over at `now`.
pub fn over(s: &WebSession, now: SystemTime) -> bool {
    parse_at(&s.idle_expires_at) <= now || parse_at(&s.expires_at) <= now
}

/// The session a cookie's `token` names, at `now`: refused
/// `not_signed_in` when there is none or it is over (then removed). A
/// request counts as activity (`touch`: the idle end moves on) and, when
/// `rotate` and the token is older than [`ROTATE_AFTER`], the token is
/// replaced: the new one is returned, for the answer's cookie.
pub fn authenticate(
    store: &mut Store,
    token: &str,
    touch: bool,
    rotate: bool,
    now: SystemTime,
) -> Result<(WebSession, Option<Zeroizing<String>>), Error> {
    if token.is_empty() || token.len() > 128 {
        return Err(Error::NotSignedIn);
    }
    let hash = token_hash(token);
    let Some(mut session) = store.read(|tx| tx.web_session_by_token(&hash))? else {
        return Err(Error::NotSignedIn);
    };
    if over(&session, now) {
        store.write(|tx| tx.delete_web_session(&session.id))?;
        return Err(Error::NotSignedIn);
    }
    if !touch {
        return Ok((session, None));
    }
    let rotated = (rotate && parse_at(&session.rotated_at) + ROTATE_AFTER <= now)
        .then(new_token)
        .transpose()?;
    let stamp = at(now);
    let idle = at((now + IDLE).min(parse_at(&session.expires_at)));
    let still = store.write(|tx| {
        // Read again under the write lock: a rotation or sign-out by a
        // request that won the race leaves this token dead.
        let Some(current) = tx.web_session_by_token(&hash)? else {
            return Ok(false);
        };
        tx.touch_web_session(&current.id, &stamp, &idle)?;
        if let Some(new) = &rotated {
            tx.rotate_web_session(&current.id, &token_hash(new), &stamp)?;
        }
        Ok(true)
    })?;
    if !still {
        return Err(Error::NotSignedIn);
    }
    session.last_seen_at = stamp.clone();
    session.idle_expires_at = idle;
    if rotated.is_some() {
        session.rotated_at = stamp;
    }
    Ok((session, rotated))
}

/// Whether session `id` is still live at `now` (the card stream asks
/// between events).
pub fn live(store: &Store, id: &str, now: SystemTime) -> Result<bool, Error> {
    Ok(store
        .read(|tx| tx.web_session(id))?
        .is_some_and(|s| !over(&s, now)))
}

/// End session `id` (sign-out).
pub fn close(store: &mut Store, id: &str) -> Result<(), Error> {
    store.write(|tx| tx.delete_web_session(id))?;
    Ok(())
}

/// The `Set-Cookie` value that gives the browser `token` for `session`.
pub fn set_cookie(token: &str, session: &WebSession, now: SystemTime) -> Zeroizing<String> {
    // Whole seconds, rounded up: the stored end is cut to milliseconds,
    // and a cookie a few hundred microseconds longer than its session
    // matters not (the server ends the session, not the cookie).
    let max_age = parse_at(&session.expires_at)
        .duration_since(now)
        .unwrap_or_default()
        .as_millis()
        .div_ceil(1000);
    Zeroizing::new(format!(
        "{COOKIE}={token}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={max_age}"
    ))
}

/// The `Set-Cookie` value that removes the cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The session token in a `Cookie` header, if it carries one.
pub fn token_in(cookie_header: &str) -> Option<&str> {
    cookie_header
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim())
}
