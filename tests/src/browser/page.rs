//! One tab, in a browser context of its own, driven over a flat DevTools
//! session.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use super::cdp::Connection;
use super::png::PngInfo;
use super::{Error, Problem, LIMIT};

/// How often [`Page::wait_until`] checks its condition inside the page.
const CONDITION_POLL_MS: u64 = 20;

/// How much longer than a condition's own bound its reply is awaited: the
/// page gives up first and says so; this margin only catches a page that
/// cannot answer at all.
const REPLY_MARGIN: Duration = Duration::from_secs(5);

/// A screen the page is shown on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Viewport {
    /// CSS pixels.
    pub width: u32,
    /// CSS pixels.
    pub height: u32,
    /// Device pixels per CSS pixel: a screenshot is `width × scale` wide.
    pub scale: f64,
    /// A phone: mobile layout (the page's `<meta name=viewport>` applies)
    /// and touch input.
    pub mobile: bool,
}

impl Viewport {
    /// The issue's phone: 390 × 844 CSS pixels at 3 device pixels each
    /// (an iPhone 12–15's screen), mobile, with touch.
    pub const PHONE: Viewport = Viewport {
        width: 390,
        height: 844,
        scale: 3.0,
        mobile: true,
    };
}

/// A cookie's value: compared and read by tests, never printed (a session
/// cookie is a secret; `Debug` shows its length only).
#[derive(Clone, PartialEq, Eq)]
pub struct CookieValue(String);

impl CookieValue {
    /// The value itself, for a test that must send or compare it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for CookieValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// A cookie as the browser holds it (`Network.getCookies`).
#[derive(Debug, Clone)]
pub struct Cookie {
    pub name: String,
    pub value: CookieValue,
    pub domain: String,
    pub path: String,
    /// Seconds since the epoch; `None` for a session cookie.
    pub expires: Option<f64>,
    pub http_only: bool,
    pub secure: bool,
    /// `Strict`, `Lax` or `None` as the server set it; `None` here if it
    /// set no attribute.
    pub same_site: Option<String>,
}

/// One tab. Closed (and its browser context disposed) when dropped.
#[derive(Debug)]
pub struct Page {
    conn: Arc<Connection>,
    target: String,
    context: String,
    session: String,
    viewport: Option<Viewport>,
}

impl Page {
    /// Open a tab on `about:blank` in a new browser context, attach to it
    /// and enable what the driver listens to.
    pub(crate) async fn open(conn: Arc<Connection>) -> Result<Page, Error> {
        let context = conn
            .call(
                None,
                "Target.createBrowserContext",
                json!({"disposeOnDetach": true}),
                LIMIT,
            )
            .await?;
        let context = str_field(&context, "browserContextId", "Target.createBrowserContext")?;
        let target = conn
            .call(
                None,
                "Target.createTarget",
                json!({"url": "about:blank", "browserContextId": context}),
                LIMIT,
            )
            .await;
        let target = match target {
            Ok(t) => str_field(&t, "targetId", "Target.createTarget")?,
            Err(e) => {
                conn.send_and_forget(
                    None,
                    "Target.disposeBrowserContext",
                    json!({"browserContextId": context}),
                );
                return Err(e);
            }
        };
        let attached = conn
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
                LIMIT,
            )
            .await;
        let session =
            match attached.and_then(|a| str_field(&a, "sessionId", "Target.attachToTarget")) {
                Ok(s) => s,
                Err(e) => {
                    conn.send_and_forget(None, "Target.closeTarget", json!({"targetId": target}));
                    conn.send_and_forget(
                        None,
                        "Target.disposeBrowserContext",
                        json!({"browserContextId": context}),
                    );
                    return Err(e);
                }
            };
        // Problems are kept from before Runtime and Log are enabled, which
        // report what the page said before.
        conn.watch_problems(&session);
        let page = Page {
            conn,
            target,
            context,
            session,
            viewport: None,
        };
        for (method, params) in [
            ("Page.enable", json!({})),
            ("Page.setLifecycleEventsEnabled", json!({"enabled": true})),
            ("Runtime.enable", json!({})),
            ("Log.enable", json!({})),
            // A tab of a headless browser is not focused; WebAuthn (and
            // `:focus` styles) want a focused document, as a person's
            // foreground tab is.
            (
                "Emulation.setFocusEmulationEnabled",
                json!({"enabled": true}),
            ),
        ] {
            page.call(method, params).await?;
        }
        Ok(page)
    }

    /// Send `method` to this page's session; its reply.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, Error> {
        self.conn
            .call(Some(&self.session), method, params, LIMIT)
            .await
    }

    /// Events from now on (subscribe before the command whose effect you
    /// wait for); [`super::Events::wait_for`] with [`Page::session`].
    pub fn events(&self) -> super::Events {
        self.conn.subscribe()
    }

    /// This page's DevTools session id (events carry it).
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Go to `url` and wait until its load event (the `load` lifecycle
    /// event of this navigation's own loader). A navigation Chromium
    /// refuses (a certificate it does not trust, a name that does not
    /// resolve) is [`Error::Navigation`] with Chromium's `net::ERR_…`.
    pub async fn goto(&self, url: &str) -> Result<(), Error> {
        let mut events = self.events();
        let nav = self.call("Page.navigate", json!({"url": url})).await?;
        if let Some(error) = nav.get("errorText").and_then(Value::as_str) {
            if !error.is_empty() {
                return Err(Error::Navigation {
                    url: url.to_owned(),
                    error: error.to_owned(),
                });
            }
        }
        let Some(loader) = nav.get("loaderId").and_then(Value::as_str) else {
            // A navigation within the document (a fragment): no load.
            return Ok(());
        };
        let frame = nav.get("frameId").and_then(Value::as_str).unwrap_or("");
        events
            .wait_for(
                Some(&self.session),
                "Page.lifecycleEvent",
                &format!("{url} to load"),
                LIMIT,
                |p| p["name"] == "load" && p["loaderId"] == loader && p["frameId"] == frame,
            )
            .await?;
        Ok(())
    }

    /// Evaluate `expression` in the page and return its value (awaited if
    /// it is a promise; as JSON: `undefined` is `null`). An exception, or a
    /// rejected promise, is [`Error::Script`].
    pub async fn evaluate(&self, expression: &str) -> Result<Value, Error> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({
                    "expression": expression,
                    "awaitPromise": true,
                    "returnByValue": true,
                }),
            )
            .await?;
        if let Some(details) = r.get("exceptionDetails") {
            return Err(Error::Script {
                what: short(expression),
                exception: exception_text(details),
            });
        }
        Ok(r["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// Wait until the JavaScript expression `condition` is truthy, checking
    /// it every 20 ms inside the page, for at most [`LIMIT`]. `what` names
    /// the awaited state in the error, which also gives the last exception
    /// the condition threw, if any (a throwing condition counts as false).
    pub async fn wait_until(&self, condition: &str, what: &str) -> Result<(), Error> {
        self.wait_until_within(condition, what, LIMIT).await
    }

    /// [`Page::wait_until`] with another bound.
    pub async fn wait_until_within(
        &self,
        condition: &str,
        what: &str,
        limit: Duration,
    ) -> Result<(), Error> {
        let ms = limit.as_millis();
        let script = format!(
            r#"(async () => {{
                const end = Date.now() + {ms};
                let last = null;
                for (;;) {{
                    try {{ if ({condition}) return {{ok: true}}; }}
                    catch (e) {{ last = String(e); }}
                    if (Date.now() > end) return {{ok: false, last}};
                    await new Promise(r => setTimeout(r, {CONDITION_POLL_MS}));
                }}
            }})()"#
        );
        // The page's own bound ends first; the reply's covers a page that
        // never answers at all (a renderer stuck in a loop).
        let r = self
            .evaluate_within(&script, limit + REPLY_MARGIN)
            .await
            .map_err(|e| match e {
                Error::Timeout { .. } => Error::Timeout {
                    awaited: format!("{what} (the page did not answer)"),
                    after: limit,
                },
                other => other,
            })?;
        if r["ok"] == true {
            return Ok(());
        }
        let last = r["last"]
            .as_str()
            .map(|l| format!(" (the condition last threw: {l})"))
            .unwrap_or_default();
        Err(Error::Timeout {
            awaited: format!("{what}: `{}`{last}", short(condition)),
            after: limit,
        })
    }

    async fn evaluate_within(&self, expression: &str, limit: Duration) -> Result<Value, Error> {
        let r = self
            .conn
            .call(
                Some(&self.session),
                "Runtime.evaluate",
                json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
                limit,
            )
            .await?;
        if let Some(details) = r.get("exceptionDetails") {
            return Err(Error::Script {
                what: short(expression),
                exception: exception_text(details),
            });
        }
        Ok(r["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// The centre of the element `selector` names, in CSS pixels of the
    /// viewport, after scrolling it into view. Fails if no element matches,
    /// or it has no size (hidden).
    async fn centre(&self, selector: &str) -> Result<(f64, f64), Error> {
        let sel = serde_json::to_string(selector).expect("a string");
        let r = self
            .evaluate(&format!(
                r#"(() => {{
                    const el = document.querySelector({sel});
                    if (!el) return {{found: false}};
                    el.scrollIntoView({{block: 'center', inline: 'center'}});
                    const r = el.getBoundingClientRect();
                    return {{found: true, x: r.left + r.width / 2, y: r.top + r.height / 2, w: r.width, h: r.height}};
                }})()"#
            ))
            .await?;
        if r["found"] != true {
            return Err(Error::Page(format!("no element matches {selector}")));
        }
        if r["w"].as_f64().unwrap_or(0.0) <= 0.0 || r["h"].as_f64().unwrap_or(0.0) <= 0.0 {
            return Err(Error::Page(format!("{selector} is not shown (no size)")));
        }
        Ok((
            r["x"].as_f64().unwrap_or(0.0),
            r["y"].as_f64().unwrap_or(0.0),
        ))
    }

    /// Click the element `selector` names with the mouse (a real press and
    /// release at its centre, so the page gets a user activation), or on a
    /// phone viewport tap it with a finger.
    pub async fn click(&self, selector: &str) -> Result<(), Error> {
        let (x, y) = self.centre(selector).await?;
        if self.viewport.is_some_and(|v| v.mobile) {
            for kind in ["touchStart", "touchEnd"] {
                let points = if kind == "touchEnd" {
                    json!([])
                } else {
                    json!([{"x": x, "y": y}])
                };
                self.call(
                    "Input.dispatchTouchEvent",
                    json!({"type": kind, "touchPoints": points}),
                )
                .await?;
            }
            return Ok(());
        }
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": "mouseMoved", "x": x, "y": y}),
        )
        .await?;
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            )
            .await?;
        }
        Ok(())
    }

    /// Focus the element `selector` names and type `text` into it, as an
    /// input method commits text (`Input.insertText`: `input` events fire,
    /// key events do not).
    pub async fn type_text(&self, selector: &str, text: &str) -> Result<(), Error> {
        let sel = serde_json::to_string(selector).expect("a string");
        let focused = self
            .evaluate(&format!(
                "(() => {{ const el = document.querySelector({sel}); if (!el) return false; el.focus(); return document.activeElement === el; }})()"
            ))
            .await?;
        if focused != true {
            return Err(Error::Page(format!(
                "{selector}: no such element, or it cannot take focus"
            )));
        }
        self.call("Input.insertText", json!({"text": text})).await?;
        Ok(())
    }

    /// The rendered text of the element `selector` names (`innerText`).
    pub async fn text(&self, selector: &str) -> Result<String, Error> {
        let sel = serde_json::to_string(selector).expect("a string");
        let v = self
            .evaluate(&format!(
                "(() => {{ const el = document.querySelector({sel}); return el ? el.innerText : null; }})()"
            ))
            .await?;
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Page(format!("no element matches {selector}")))
    }

    /// Show the page on `viewport` (`Emulation.setDeviceMetricsOverride`;
    /// touch emulation for a mobile one).
    pub async fn set_viewport(&mut self, viewport: Viewport) -> Result<(), Error> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({
                "width": viewport.width,
                "height": viewport.height,
                "deviceScaleFactor": viewport.scale,
                "mobile": viewport.mobile,
            }),
        )
        .await?;
        self.call(
            "Emulation.setTouchEmulationEnabled",
            json!({"enabled": viewport.mobile, "maxTouchPoints": 5}),
        )
        .await?;
        self.viewport = Some(viewport);
        Ok(())
    }

    /// A PNG of what the viewport shows, checked ([`super::png::check`])
    /// and written to `path`; its size in device pixels.
    pub async fn screenshot(&self, path: &Path) -> Result<PngInfo, Error> {
        let r = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": false, "fromSurface": true}),
            )
            .await?;
        let data = r["data"]
            .as_str()
            .ok_or_else(|| Error::Page("Page.captureScreenshot gave no data".into()))?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| {
                Error::Page(format!("Page.captureScreenshot's data is not base64: {e}"))
            })?;
        let info =
            super::png::check(&png).map_err(|e| Error::Page(format!("the screenshot: {e}")))?;
        std::fs::write(path, &png)
            .map_err(|e| Error::Page(format!("writing {}: {e}", path.display())))?;
        Ok(info)
    }

    /// The cookies the browser would send to `url` (`Network.getCookies`).
    pub async fn cookies(&self, url: &str) -> Result<Vec<Cookie>, Error> {
        let r = self
            .call("Network.getCookies", json!({"urls": [url]}))
            .await?;
        let list = r["cookies"].as_array().cloned().unwrap_or_default();
        Ok(list
            .iter()
            .map(|c| Cookie {
                name: c["name"].as_str().unwrap_or("").to_owned(),
                value: CookieValue(c["value"].as_str().unwrap_or("").to_owned()),
                domain: c["domain"].as_str().unwrap_or("").to_owned(),
                path: c["path"].as_str().unwrap_or("").to_owned(),
                expires: if c["session"] == true {
                    None
                } else {
                    c["expires"].as_f64()
                },
                http_only: c["httpOnly"] == true,
                secure: c["secure"] == true,
                same_site: c["sameSite"].as_str().map(str::to_owned),
            })
            .collect())
    }

    /// Every console error, uncaught exception, CSP violation and other
    /// error the browser logged for this page so far.
    pub fn problems(&self) -> Vec<Problem> {
        self.conn.problems(&self.session, false).list
    }

    /// [`Page::problems`], and forget them (for a test that plants some
    /// and then checks the rest of the page is clean).
    pub fn take_problems(&self) -> Vec<Problem> {
        self.conn.problems(&self.session, true).list
    }

    /// Panic, listing them, if the page reported any problem.
    pub fn assert_no_problems(&self) {
        let p = self.conn.problems(&self.session, false);
        assert!(
            p.list.is_empty() && p.dropped == 0,
            "the page reported {} problem(s):\n{}",
            p.list.len() + p.dropped,
            p.list
                .iter()
                .map(|p| format!("  {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Close the tab and its browser context, and wait for Chromium to
    /// confirm.
    pub async fn close(self) -> Result<(), Error> {
        self.conn
            .call(
                None,
                "Target.closeTarget",
                json!({"targetId": self.target}),
                LIMIT,
            )
            .await?;
        self.conn
            .call(
                None,
                "Target.disposeBrowserContext",
                json!({"browserContextId": self.context}),
                LIMIT,
            )
            .await?;
        // Drop sends both again; Chromium answers an unknown id with an
        // error nobody waits for.
        Ok(())
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        self.conn.unwatch_problems(&self.session);
        self.conn
            .send_and_forget(None, "Target.closeTarget", json!({"targetId": self.target}));
        self.conn.send_and_forget(
            None,
            "Target.disposeBrowserContext",
            json!({"browserContextId": self.context}),
        );
    }
}

fn str_field(v: &Value, field: &str, method: &str) -> Result<String, Error> {
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| Error::Page(format!("{method} gave no {field}")))
}

/// An exception's message as Chromium describes it (with its stack).
fn exception_text(details: &Value) -> String {
    details["exception"]["description"]
        .as_str()
        .or_else(|| details["exception"]["value"].as_str())
        .or_else(|| details["text"].as_str())
        .unwrap_or("an exception")
        .to_owned()
}

/// At most 200 characters of a script, for an error message.
fn short(script: &str) -> String {
    let script = script.trim();
    match script.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &script[..i]),
        None => script.to_owned(),
    }
}
