//! The app's pages and assets, compiled into the binary (`include_bytes!`
//! of `assets/`): HTML, one style sheet, one script, the service worker,
//! the manifest and the icon. Nothing is fetched from anywhere else: no
//! CDN, font or framework; no build step (the script is written as
//! browsers run it).
//!
//! The pages are the same for everyone and hold no data: each loads the
//! script, which asks the API for what the person may see. They are
//! answered `no-store` anyway (a page is where a session starts); the
//! assets `no-cache` with an `ETag` (the first 16 bytes of their SHA-256,
//! hex), so a browser asks again each time and gets `304` until a new
//! binary serves another.

use std::sync::OnceLock;

use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use hyper::{HeaderMap, Method, Response, StatusCode};

use super::answer::{full, Reply};

/// One asset.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// A page (HTML, `no-store`) or an asset (`no-cache`, `ETag`).
    page: bool,
}

const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/index.html"),
        page: true,
    },
    Asset {
        path: "/enrol",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/enrol.html"),
        page: true,
    },
    Asset {
        path: "/cards",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/cards.html"),
        page: true,
    },
    Asset {
        path: "/sessions",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/sessions.html"),
        page: true,
    },
    Asset {
        path: "/sessions/*",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/session.html"),
        page: true,
    },
    Asset {
        path: "/history",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/history.html"),
        page: true,
    },
    Asset {
        path: "/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/app.css"),
        page: false,
    },
    Asset {
        path: "/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/app.js"),
        page: false,
    },
    Asset {
        path: "/sw.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/sw.js"),
        page: false,
    },
    Asset {
        path: "/manifest.webmanifest",
        content_type: "application/manifest+json",
        body: include_bytes!("assets/manifest.webmanifest"),
        page: false,
    },
    Asset {
        path: "/icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("assets/icon.svg"),
        page: false,
    },
];

/// The longest session id a page path takes (`/sessions/ID`).
const MAX_ID: usize = 128;

fn find(path: &str) -> Option<(usize, &'static Asset)> {
    let session_page = path
        .strip_prefix("/sessions/")
        .is_some_and(|id| !id.is_empty() && id.len() <= MAX_ID && !id.contains('/'));
    let key = if session_page { "/sessions/*" } else { path };
    ASSETS.iter().enumerate().find(|(_, a)| a.path == key)
}

fn etags() -> &'static Vec<String> {
    static ETAGS: OnceLock<Vec<String>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, a.body);
                format!("\"{}\"", hex::encode(&d.as_ref()[..16]))
            })
            .collect()
    })
}

/// Whether `path` is a page or asset of the app.
#[cfg(test)]
fn is_asset(path: &str) -> bool {
    find(path).is_some()
}

/// Answer `method path` with the asset there (the caller adds the
/// security headers): 405 for a method other than GET and HEAD, 404 for a
/// path that is none.
pub fn serve(method: &Method, path: &str, headers: &HeaderMap) -> Reply {
    let Some((i, asset)) = find(path) else {
        let mut r = Response::new(full("not found\n"));
        *r.status_mut() = StatusCode::NOT_FOUND;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return r;
    };
    if method != Method::GET && method != Method::HEAD {
        let mut r = Response::new(full("method not allowed\n"));
        *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let etag = &etags()[i];
    let fresh = !asset.page
        && headers
            .get_all(IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim() == etag || t.trim() == "*");
    let body = if fresh || method == Method::HEAD {
        full(bytes::Bytes::new())
    } else {
        full(bytes::Bytes::from_static(asset.body))
    };
    let mut r = Response::new(body);
    if fresh {
        *r.status_mut() = StatusCode::NOT_MODIFIED;
    }
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    if asset.page {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    } else {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if let Ok(v) = HeaderValue::from_str(etag) {
            h.insert(ETAG, v);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No page holds an inline script, an inline style, an event handler
    /// attribute or anything from another origin; every script and style
    /// sheet is the app's own file.
    #[test]
    fn pages_hold_nothing_inline_and_nothing_foreign() {
        for a in ASSETS.iter().filter(|a| a.page) {
            let html = std::str::from_utf8(a.body).unwrap();
            for needle in [
                "<style",
                " style=",
                "onclick",
                "onload",
                "onerror",
                "javascript:",
                "http://",
                "https://",
                "//cdn",
                "<iframe",
            ] {
                assert!(!html.contains(needle), "{} holds {needle:?}", a.path);
            }
            for (i, _) in html.match_indices("<script") {
                let tag = &html[i..i + html[i..].find('>').unwrap()];
                assert!(tag.contains("src=\"/app.js\""), "{}: {tag}", a.path);
            }
            assert!(html.contains("<html lang=\"en\">"), "{}", a.path);
            assert!(html.contains("<main id=\"main\""), "{}", a.path);
            assert!(html.contains("name=\"viewport\""), "{}", a.path);
        }
    }

    /// The script never writes markup: no innerHTML, outerHTML,
    /// insertAdjacentHTML, document.write or eval (Trusted Types would
    /// refuse them anyway).
    #[test]
    fn the_script_writes_no_markup() {
        for a in ASSETS
            .iter()
            .filter(|a| a.content_type.starts_with("text/javascript"))
        {
            let js = std::str::from_utf8(a.body).unwrap();
            for needle in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "setTimeout('",
                "setInterval('",
            ] {
                assert!(!js.contains(needle), "{} uses {needle}", a.path);
            }
        }
    }

    #[test]
    fn pages_and_assets_are_found_and_others_are_not() {
        assert!(is_asset("/"));
        assert!(is_asset("/sessions/sbx-0123456789ab"));
        assert!(!is_asset("/sessions/"));
        assert!(!is_asset("/sessions/a/b"));
        assert!(!is_asset("/app.js.map"));
        assert!(!is_asset("/../etc/passwd"));
        let r = serve(&Method::GET, "/app.js", &HeaderMap::new());
        assert_eq!(r.status(), StatusCode::OK);
        let etag = r.headers()[ETAG].clone();
        let mut h = HeaderMap::new();
        h.insert(IF_NONE_MATCH, etag);
        assert_eq!(
            serve(&Method::GET, "/app.js", &h).status(),
            StatusCode::NOT_MODIFIED
        );
        assert_eq!(
            serve(&Method::POST, "/", &HeaderMap::new()).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
}
