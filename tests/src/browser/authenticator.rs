//! A virtual WebAuthn authenticator inside Chromium (the `WebAuthn` DevTools
//! domain): what a person's phone or laptop is to the people pages. It is
//! a CTAP2.1 platform authenticator ("internal" transport) with resident
//! keys (passkeys) that verifies its user and simulates their presence,
//! so `navigator.credentials.create/get` complete with the UP and UV flags
//! set and no prompt. The test reads back the credentials it holds (id,
//! sign count) and can turn user verification off to see a page refused.
//!
//! # Secrets
//!
//! `WebAuthn.getCredentials` (and the `credentialAdded`/`credentialAsserted`
//! events) carry each credential's private key. The connection removes it
//! from every `WebAuthn.*` reply and event as it reads them, and
//! [`Credential`] has no field for it, so no test output, panic or `Debug`
//! can show passkey material.

use serde_json::{json, Value};

use super::page::Page;
use super::{Error, LIMIT};

/// A credential the authenticator holds (no private key: see the module
/// docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The credential id, base64url without padding (as in a WebAuthn
    /// response's `id`).
    pub id: String,
    /// The relying party id it is scoped to.
    pub rp_id: Option<String>,
    /// Whether it is a discoverable credential (a passkey).
    pub resident: bool,
    /// The user handle, base64url without padding, for a resident one.
    pub user_handle: Option<String>,
    /// The signature counter: incremented by each assertion.
    pub sign_count: u64,
}

/// How the authenticator presents itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `ctap2` or `u2f`.
    pub protocol: &'static str,
    /// `ctap2_0` or `ctap2_1`.
    pub ctap2_version: &'static str,
    /// `internal` (a platform authenticator), `usb`, `nfc`, `ble`, `hybrid`.
    pub transport: &'static str,
    pub has_resident_key: bool,
    pub has_user_verification: bool,
    /// Whether user verification succeeds (a person who unlocks the device).
    pub is_user_verified: bool,
}

impl Options {
    /// A phone's or laptop's platform authenticator, holding passkeys and
    /// verifying its user: what the people pages expect.
    pub const PLATFORM: Options = Options {
        protocol: "ctap2",
        ctap2_version: "ctap2_1",
        transport: "internal",
        has_resident_key: true,
        has_user_verification: true,
        is_user_verified: true,
    };
}

/// A virtual authenticator added to one page's tab. Removed with
/// [`Authenticator::remove`] (or with the page's browser context).
#[derive(Debug)]
pub struct Authenticator {
    id: String,
}

impl Authenticator {
    /// Enable the WebAuthn domain on `page` (with no browser UI) and add an
    /// authenticator as `options` say, whose user is present whenever a
    /// page asks (`automaticPresenceSimulation`).
    pub async fn add(page: &Page, options: &Options) -> Result<Authenticator, Error> {
        page.call("WebAuthn.enable", json!({"enableUI": false}))
            .await?;
        let r = page
            .call(
                "WebAuthn.addVirtualAuthenticator",
                json!({"options": params(options)}),
            )
            .await?;
        let id = r["authenticatorId"]
            .as_str()
            .ok_or_else(|| {
                Error::Page("WebAuthn.addVirtualAuthenticator gave no authenticatorId".into())
            })?
            .to_owned();
        Ok(Authenticator { id })
    }

    /// The authenticator's id in the DevTools session.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The credentials it holds now.
    pub async fn credentials(&self, page: &Page) -> Result<Vec<Credential>, Error> {
        let r = page
            .call(
                "WebAuthn.getCredentials",
                json!({"authenticatorId": self.id}),
            )
            .await?;
        Ok(r["credentials"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(credential)
            .collect())
    }

    /// Wait (at most [`LIMIT`]) for this authenticator's next
    /// `WebAuthn.credentialAdded` or `credentialAsserted` event (subscribe
    /// with [`Page::events`] before the page acts); the credential it
    /// names, as it is after the event (an assertion's new sign count).
    pub async fn wait_credential(
        &self,
        page: &Page,
        events: &mut super::Events,
        event: Used,
    ) -> Result<Credential, Error> {
        let method = match event {
            Used::Added => "WebAuthn.credentialAdded",
            Used::Asserted => "WebAuthn.credentialAsserted",
        };
        let id = self.id.clone();
        let e = events
            .wait_for(
                Some(page.session()),
                method,
                &format!("{method} on authenticator {id}"),
                LIMIT,
                |p| p["authenticatorId"] == id.as_str(),
            )
            .await?;
        Ok(credential(&e.params["credential"]))
    }

    /// Whether user verification succeeds from now on: `false` is a person
    /// who fails to unlock the device (a page that requires verification is
    /// refused with `NotAllowedError`).
    pub async fn set_user_verified(&self, page: &Page, verified: bool) -> Result<(), Error> {
        page.call(
            "WebAuthn.setUserVerified",
            json!({"authenticatorId": self.id, "isUserVerified": verified}),
        )
        .await?;
        Ok(())
    }

    /// Remove the authenticator from the page's tab.
    pub async fn remove(self, page: &Page) -> Result<(), Error> {
        page.call(
            "WebAuthn.removeVirtualAuthenticator",
            json!({"authenticatorId": self.id}),
        )
        .await?;
        Ok(())
    }
}

/// Which WebAuthn event [`Authenticator::wait_credential`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Used {
    /// A credential was made (`navigator.credentials.create`).
    Added,
    /// A credential signed an assertion (`navigator.credentials.get`).
    Asserted,
}

/// A DevTools `Credential` (its `privateKey` already removed).
fn credential(c: &Value) -> Credential {
    Credential {
        id: to_base64url(c["credentialId"].as_str().unwrap_or("")),
        rp_id: c["rpId"].as_str().map(str::to_owned),
        resident: c["isResidentCredential"] == true,
        user_handle: c["userHandle"].as_str().map(to_base64url),
        sign_count: c["signCount"].as_u64().unwrap_or(0),
    }
}

/// DevTools gives binary fields in standard base64; WebAuthn's JSON forms
/// and the pages use base64url without padding.
fn to_base64url(standard: &str) -> String {
    standard
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_")
}

/// The `options` of `WebAuthn.addVirtualAuthenticator`.
fn params(options: &Options) -> Value {
    json!({
        "protocol": options.protocol,
        "ctap2Version": options.ctap2_version,
        "transport": options.transport,
        "hasResidentKey": options.has_resident_key,
        "hasUserVerification": options.has_user_verification,
        "isUserVerified": options.is_user_verified,
        "automaticPresenceSimulation": true,
    })
}
