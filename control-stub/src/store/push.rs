//! People's push subscriptions (Web Push, RFC 8030): for each person, each
//! device's endpoint and the keys its messages are encrypted to (RFC
//! 8291), and how the last delivery to it went. What sends to them is
//! [`crate::people::push`].
//!
//! A subscription comes from a browser (`PushSubscription.toJSON()`), so
//! it is checked here, once, before anything is stored
//! ([`NewSubscription::parse`]): the endpoint an `https` URL of at most
//! [`MAX_ENDPOINT_LEN`] bytes with a host and no user name, `p256dh` a
//! point on P-256, `auth` 16 bytes. A person holds at most
//! [`MAX_SUBSCRIPTIONS`] of them.
//!
//! An endpoint URL is a capability: whoever holds it can send to the
//! device (the push service asks for no more than a VAPID signature, and
//! without one it accepts any sender). It is never logged, printed or put
//! in an error; a subscription's `Debug` and [`Endpoint::origin`] show its
//! origin only. The `auth` secret stays in the store too.

use base64::Engine as _;

use super::db::{now, Store, Tx};
use super::value::{params, Row};
use crate::error::Error;

/// The longest endpoint URL accepted, in bytes. The browsers' push
/// services hand out URLs of 150 to 500 bytes; the bound keeps a page
/// from filling the store.
pub const MAX_ENDPOINT_LEN: usize = 2048;

/// The most subscriptions one person holds: a phone, a laptop and a few
/// browsers, with room for the subscriptions a reinstalled browser leaves
/// behind until its push service answers 404 or 410 and they are removed.
pub const MAX_SUBSCRIPTIONS: usize = 10;

/// The length of a subscription's `auth` secret (RFC 8291 §3.2).
pub const AUTH_LEN: usize = 16;

/// The length of a subscription's `p256dh` key: an uncompressed P-256
/// point (RFC 8291 §3.1).
pub const P256DH_LEN: usize = 65;

fn invalid(reason: impl Into<String>) -> Error {
    Error::PushSubscriptionInvalid {
        reason: reason.into(),
    }
}

/// An endpoint URL taken apart: where a message goes.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The host as the URL gives it, lower case (an IPv6 address without
    /// its brackets).
    pub host: String,
    pub port: u16,
    /// The path and query: the capability part.
    pub path: String,
    /// `host[:port]` as the `Host` header carries it.
    pub authority: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({} …)", self.origin())
    }
}

impl Endpoint {
    /// Check an endpoint URL (see the module docs) and take it apart.
    /// The error names what is wrong, never the URL.
    pub fn parse(text: &str) -> Result<Endpoint, Error> {
        if text.is_empty() || text.len() > MAX_ENDPOINT_LEN {
            return Err(invalid(format!(
                "the endpoint is {} bytes; 1 to {MAX_ENDPOINT_LEN} are accepted",
                text.len()
            )));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "the endpoint holds a byte that is no printable ASCII",
            ));
        }
        let uri: hyper::Uri = text
            .parse()
            .map_err(|_| invalid("the endpoint is not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(invalid("the endpoint's scheme is not https"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| invalid("the endpoint has no host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid("the endpoint names a user"));
        }
        let port = match authority.port() {
            None => 443,
            Some(p) => p
                .as_str()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| invalid("the endpoint's port is not 1 to 65535"))?,
        };
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        if host.is_empty() || rustls::pki_types::ServerName::try_from(host.as_str()).is_err() {
            return Err(invalid(
                "the endpoint's host is neither a DNS name nor an IP address",
            ));
        }
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        let shown_host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let authority = if port == 443 {
            shown_host
        } else {
            format!("{shown_host}:{port}")
        };
        Ok(Endpoint {
            host,
            port,
            path,
            authority,
        })
    }

    /// `https://host[:port]`: the endpoint's origin, what a VAPID token's
    /// `aud` names (RFC 8292 §2) and all that logs show of an endpoint.
    pub fn origin(&self) -> String {
        format!("https://{}", self.authority)
    }
}

/// A subscription as a browser gives it, checked: what
/// [`Store::push_subscribe`] stores.
#[derive(Clone, PartialEq, Eq)]
pub struct NewSubscription {
    endpoint: String,
    parsed: Endpoint,
    p256dh: [u8; P256DH_LEN],
    auth: [u8; AUTH_LEN],
}

impl std::fmt::Debug for NewSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewSubscription")
            .field("origin", &self.parsed.origin())
            .finish_non_exhaustive()
    }
}

/// base64url as browsers write it (no padding; padding is taken too),
/// decoded strictly.
fn base64url(what: &str, text: &str) -> Result<Vec<u8>, Error> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| invalid(format!("{what} is not base64url")))
}

impl NewSubscription {
    /// Check a browser's subscription: `endpoint`, and its `keys.p256dh`
    /// and `keys.auth` in base64url.
    pub fn parse(endpoint: &str, p256dh: &str, auth: &str) -> Result<NewSubscription, Error> {
        let parsed = Endpoint::parse(endpoint)?;
        let key = base64url("p256dh", p256dh)?;
        let key: [u8; P256DH_LEN] = key.try_into().map_err(|k: Vec<u8>| {
            invalid(format!(
                "p256dh is {} bytes, not an uncompressed P-256 point ({P256DH_LEN})",
                k.len()
            ))
        })?;
        if key[0] != 0x04 {
            return Err(invalid("p256dh is not an uncompressed point (0x04 first)"));
        }
        // aws-lc checks that the point is on the curve as it parses it.
        aws_lc_rs::agreement::ParsedPublicKey::try_from(
            aws_lc_rs::agreement::UnparsedPublicKey::new(&aws_lc_rs::agreement::ECDH_P256, key),
        )
        .map_err(|_| invalid("p256dh is not a point on P-256"))?;
        let secret = base64url("auth", auth)?;
        let secret: [u8; AUTH_LEN] = secret
            .try_into()
            .map_err(|s: Vec<u8>| invalid(format!("auth is {} bytes, not {AUTH_LEN}", s.len())))?;
        Ok(NewSubscription {
            endpoint: endpoint.to_owned(),
            parsed,
            p256dh: key,
            auth: secret,
        })
    }

    /// The endpoint taken apart.
    pub fn endpoint(&self) -> &Endpoint {
        &self.parsed
    }
}

/// A stored subscription. Its `Debug` shows the person and the endpoint's
/// origin only: the endpoint URL is a capability and `auth` a secret.
#[derive(Clone, PartialEq, Eq)]
pub struct PushSubscription {
    /// The person, by the name Lock rules give approvers.
    pub person: String,
    /// The endpoint URL, as the browser gave it.
    pub endpoint: String,
    /// The device's P-256 key (uncompressed point).
    pub p256dh: Vec<u8>,
    /// The device's authentication secret (16 bytes).
    pub auth: Vec<u8>,
    pub created_at: String,
    pub last_success_at: Option<String>,
    pub last_failure_at: Option<String>,
    /// Why the last failed delivery failed (a status or an error class;
    /// never the endpoint).
    pub last_failure: Option<String>,
}

impl std::fmt::Debug for PushSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSubscription")
            .field("person", &self.person)
            .field("origin", &self.origin())
            .field("created_at", &self.created_at)
            .field("last_success_at", &self.last_success_at)
            .field("last_failure_at", &self.last_failure_at)
            .field("last_failure", &self.last_failure)
            .finish_non_exhaustive()
    }
}

impl PushSubscription {
    /// The endpoint's origin (`https://host[:port]`), or `(unreadable)`
    /// for a stored URL that no longer parses.
    pub fn origin(&self) -> String {
        Endpoint::parse(&self.endpoint).map_or_else(|_| "(unreadable)".into(), |e| e.origin())
    }
}

const COLUMNS: &str = "person, endpoint, p256dh, auth, created_at, last_success_at, \
                       last_failure_at, last_failure";

fn row(r: &Row) -> Result<PushSubscription, Error> {
    Ok(PushSubscription {
        person: r.get(0)?,
        endpoint: r.get(1)?,
        p256dh: r.get(2)?,
        auth: r.get(3)?,
        created_at: r.get(4)?,
        last_success_at: r.get(5)?,
        last_failure_at: r.get(6)?,
        last_failure: r.get(7)?,
    })
}

/// The longest failure reason stored.
const MAX_REASON_LEN: usize = 200;

impl Store {
    /// Subscribe `person`'s device: stored, or its keys replaced when the
    /// person already holds that endpoint. Refused (nothing stored) for a
    /// malformed name, or a new endpoint past [`MAX_SUBSCRIPTIONS`].
    pub fn push_subscribe(
        &mut self,
        person: &str,
        sub: &NewSubscription,
    ) -> Result<PushSubscription, Error> {
        let person = crate::lock::approver(person)?;
        self.write(|tx| {
            let held = tx.push_subscriptions_of(std::slice::from_ref(&person))?;
            if !held.iter().any(|s| s.endpoint == sub.endpoint) && held.len() >= MAX_SUBSCRIPTIONS {
                return Err(Error::PushSubscriptionsFull {
                    person: person.clone(),
                    limit: MAX_SUBSCRIPTIONS,
                });
            }
            tx.conn.execute(
                "INSERT INTO push_subscriptions (person, endpoint, p256dh, auth, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (person, endpoint) DO UPDATE SET
                     p256dh = excluded.p256dh, auth = excluded.auth,
                     last_failure_at = NULL, last_failure = NULL",
                params![
                    person,
                    sub.endpoint,
                    sub.p256dh.as_slice(),
                    sub.auth.as_slice(),
                    now()
                ],
            )?;
            tx.push_subscriptions_of(std::slice::from_ref(&person))?
                .into_iter()
                .find(|s| s.endpoint == sub.endpoint)
                .ok_or_else(|| Error::Store("a push subscription was not stored".into()))
        })
    }

    /// Remove `person`'s subscription of `endpoint`; whether there was one.
    pub fn push_unsubscribe(&mut self, person: &str, endpoint: &str) -> Result<bool, Error> {
        self.write(|tx| {
            let n = tx.conn.execute(
                "DELETE FROM push_subscriptions WHERE person = ?1 AND endpoint = ?2",
                params![person, endpoint],
            )?;
            Ok(n > 0)
        })
    }

    /// `person`'s subscriptions, oldest first.
    pub fn push_subscriptions(&self, person: &str) -> Result<Vec<PushSubscription>, Error> {
        self.read(|tx| tx.push_subscriptions_of(&[person.to_owned()]))
    }

    /// A message reached `endpoint`'s push service: its last success is
    /// now (every person holding it).
    pub fn push_delivered(&mut self, endpoint: &str) -> Result<(), Error> {
        self.write(|tx| {
            tx.conn.execute(
                "UPDATE push_subscriptions SET last_success_at = ?2 WHERE endpoint = ?1",
                params![endpoint, now()],
            )?;
            Ok(())
        })
    }

    /// A message to `endpoint` failed for `reason` (a status or an error
    /// class, never the URL).
    pub fn push_failed(&mut self, endpoint: &str, reason: &str) -> Result<(), Error> {
        let reason: String = reason.chars().take(MAX_REASON_LEN).collect();
        self.write(|tx| {
            tx.conn.execute(
                "UPDATE push_subscriptions SET last_failure_at = ?2, last_failure = ?3
                 WHERE endpoint = ?1",
                params![endpoint, now(), reason],
            )?;
            Ok(())
        })
    }

    /// `endpoint`'s push service says the subscription is gone (404 or
    /// 410, RFC 8030 §7.3): removed for every person holding it. How many
    /// rows went.
    pub fn push_gone(&mut self, endpoint: &str) -> Result<usize, Error> {
        self.write(|tx| {
            tx.conn.execute(
                "DELETE FROM push_subscriptions WHERE endpoint = ?1",
                params![endpoint],
            )
        })
    }
}

impl Tx<'_> {
    /// The subscriptions of every person in `persons`: by person, oldest
    /// first.
    pub fn push_subscriptions_of(
        &self,
        persons: &[String],
    ) -> Result<Vec<PushSubscription>, Error> {
        let mut out = Vec::new();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {COLUMNS} FROM push_subscriptions WHERE person = ?1
             ORDER BY created_at, endpoint"
        ))?;
        for person in persons {
            for s in stmt.query_map(params![person], row)? {
                out.push(s?);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
    const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";

    macro_rules! refused {
        ($($name:ident: ($endpoint:expr, $key:expr, $auth:expr) => $why:expr;)*) => {$(
            #[test]
            fn $name() {
                let e = NewSubscription::parse(&$endpoint, &$key, &$auth).unwrap_err();
                assert_eq!(e.code(), "push_subscription_invalid");
                assert!(e.to_string().contains($why), "{e}");
                // The error never carries the endpoint's capability part.
                assert!(!e.to_string().contains("capability-9q7"), "{e}");
            }
        )*};
    }

    refused! {
        http_is_refused: ("http://push.example/capability-9q7", KEY, AUTH) => "scheme is not https";
        no_scheme_is_refused: ("push.example/capability-9q7", KEY, AUTH) => "not a URL";
        a_user_is_refused: ("https://u:p@push.example/capability-9q7", KEY, AUTH) => "names a user";
        port_zero_is_refused: ("https://push.example:0/capability-9q7", KEY, AUTH) => "port";
        too_long_is_refused: (format!("https://push.example/capability-9q7/{}", "a".repeat(MAX_ENDPOINT_LEN)), KEY, AUTH) => "bytes";
        a_space_is_refused: ("https://push.example/capability-9q7 x", KEY, AUTH) => "printable";
        a_short_key_is_refused: ("https://push.example/capability-9q7", &KEY[..40], AUTH) => "bytes, not an uncompressed";
        a_compressed_key_is_refused: ("https://push.example/capability-9q7", "AiVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4", AUTH) => "0x04 first";
        // The vector's point with its last byte changed: off the curve.
        a_point_off_the_curve_is_refused: ("https://push.example/capability-9q7", "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw8", AUTH) => "not a point on P-256";
        a_key_not_base64url_is_refused: ("https://push.example/capability-9q7", "BCVx+r7N", AUTH) => "not base64url";
        a_short_auth_is_refused: ("https://push.example/capability-9q7", KEY, "BTBZMqHH6r4Tts7J_aSI") => "auth is 15 bytes";
        a_long_auth_is_refused: ("https://push.example/capability-9q7", KEY, "BTBZMqHH6r4Tts7J_aSIggAA") => "auth is 18 bytes";
    }

    #[test]
    fn a_browsers_subscription_is_taken_apart() {
        let s = NewSubscription::parse(
            "https://FCM.googleapis.com/fcm/send/capability-9q7?x=1",
            KEY,
            AUTH,
        )
        .unwrap();
        let e = s.endpoint();
        assert_eq!(e.host, "fcm.googleapis.com");
        assert_eq!(e.port, 443);
        assert_eq!(e.path, "/fcm/send/capability-9q7?x=1");
        assert_eq!(e.origin(), "https://fcm.googleapis.com");
        assert!(!format!("{s:?}").contains("capability"), "{s:?}");
        // Padding is taken too.
        NewSubscription::parse(
            "https://127.0.0.1:8443/p",
            &format!("{KEY}="),
            &format!("{AUTH}=="),
        )
        .unwrap();
        let e = Endpoint::parse("https://[::1]:8443/p").unwrap();
        assert_eq!(
            (e.host.as_str(), e.origin().as_str()),
            ("::1", "https://[::1]:8443")
        );
    }
}
