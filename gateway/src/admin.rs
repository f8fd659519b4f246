//! The admin listener: Prometheus metrics and health, plain HTTP/1.1.
//!
//! Bind it to an address only operators reach (the default is loopback).
//! `/metrics` is the Prometheus text format; `/healthz` answers 200 while the
//! process runs; `/readyz` answers 200 while it accepts connections and 503
//! while it drains.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use tokio::net::TcpListener;

use crate::member_link::link::LinkRefusal;
use crate::pair::forwarding::ForwardResult;
use crate::pair::proxy::HeaderError;
use tokio_util::sync::CancellationToken;

use crate::conn::HandshakeFailure;
use crate::process::HandoverResult;
use crate::records::record::Verdict;
use crate::records::shipper::{self, Shipped};
use crate::refusal::Refusal;
use crate::reload::ReloadResult;
use crate::secrets::reply::ReplyRefusal;
use crate::session::approvals::Outcome;
use crate::session::share::Bound;

/// `gateway_hello_bytes`' buckets, in bytes. A ClientHello without a
/// post-quantum key share is 200-600 bytes, and clients pad one of 256-511
/// bytes to 512 (RFC 7685): 256 and 512 split those. One with an
/// X25519MLKEM768 key share (1216 bytes of it) is about 1.8 KiB: 1024,
/// 1536 and 2048 tell the two kinds apart. Above, session tickets and
/// many extensions, up to the largest TLS record (16384); `+Inf` holds
/// hellos that reach `hello_max_bytes` (default 16640).
pub const HELLO_BYTES_BUCKETS: [f64; 9] = [
    256.0, 512.0, 1024.0, 1536.0, 2048.0, 3072.0, 4096.0, 8192.0, 16384.0,
];

/// `gateway_resolve_seconds`' buckets, in seconds: 0.5 ms for a cached
/// answer, 1-50 ms for a nameserver nearby, 0.1-1 s for a slow or distant
/// one, and 2.5 and 5 s for queries sent again (the default timeout,
/// 2 s, times the default attempts, 2, is 4 s); `+Inf` holds configs with
/// longer timeouts.
pub const RESOLVE_SECONDS_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Install the process-wide metrics recorder and return its render handle.
/// Every series the gateway can export is in the first scrape, at its
/// starting value ([`preregister`]). Later calls (tests that start several
/// gateways in one process) reuse the first recorder.
pub fn install_metrics() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
            }
            describe();
            preregister();
            handle
        })
        .clone()
}

/// The recorder: histograms with buckets (without them the exporter
/// renders summaries, which `histogram_quantile` cannot read).
fn recorder() -> PrometheusRecorder {
    let with_buckets = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("gateway_hello_bytes".into()),
            &HELLO_BYTES_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("gateway_resolve_seconds".into()),
                &RESOLVE_SECONDS_BUCKETS,
            )
        });
    match with_buckets {
        Ok(builder) => builder.build_recorder(),
        // Only an empty bucket list is refused, and neither is empty.
        Err(e) => {
            tracing::error!(error = %e, "histogram buckets refused; histograms are exported as summaries");
            PrometheusBuilder::new().build_recorder()
        }
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "gateway_connections_total",
        "Connections closed, by verdict (allowed or the refusal reason)."
    );
    describe_gauge!("gateway_connections_open", "Client connections open now.");
    describe_histogram!(
        "gateway_hello_bytes",
        "Bytes read to obtain a complete ClientHello."
    );
    describe_histogram!(
        "gateway_resolve_seconds",
        "Time to resolve and check a destination name."
    );
    describe_counter!(
        "gateway_requests_refused_total",
        "Requests refused after the TLS handshake, by reason."
    );
    describe_counter!(
        "gateway_session_handshake_failures_total",
        "TLS handshakes with the session that failed, by cause."
    );
    describe_counter!(
        "gateway_session_limit_total",
        "Refusals at a bound of a session's share, by bound."
    );
    describe_counter!(
        "gateway_session_drops_total",
        "Session authorities dropped, by reason."
    );
    describe_counter!(
        "gateway_leases_lapsed_total",
        "Session authorities dropped because their lease lapsed."
    );
    describe_counter!(
        "gateway_renewals_refused_total",
        "Lease renewals refused, by cause (stale: the control plane read the store a lease ago or more)."
    );
    describe_counter!(
        "gateway_freezes_total",
        "Times the process found it had been frozen (its ticks stopped for more than 2 s); its leased authorities are suspended until renewed."
    );
    describe_counter!(
        "gateway_forwarded_total",
        "Connections of sessions only a peer holds, by result (forwarded to it over the member link, holder_unreachable, session_limit)."
    );
    describe_counter!(
        "gateway_dns_queries_total",
        "The sessions' DNS queries, by outcome (answered, unlisted, resolves_internal, unresolved, unknown_source, elsewhere, forwarded, limited, malformed)."
    );
    describe_counter!(
        "gateway_passthrough_total",
        "Connections to passthrough destinations passed on unread, by relay (splice: inside the kernel; copy: through the process, for a connection that came over the member link)."
    );
    describe_counter!(
        "gateway_link_refused_total",
        "Connections and streams refused on the member link before a session's byte was served, by cause."
    );
    describe_gauge!(
        "gateway_forwarding_sessions",
        "Sessions this member forwards for: live sessions a peer holds whose sources hold no live authority here (not the sessions it holds itself)."
    );
    describe_counter!(
        "gateway_approvals_total",
        "Held requests' approvals, by outcome."
    );
    describe_counter!(
        "gateway_person_refusals_total",
        "Decisions refused for the person's passkey assertion (missing or not verified), by reason."
    );
    describe_counter!(
        "gateway_replies_cut_total",
        "Replies cut short because they could not be passed on, by cause."
    );
    describe_counter!(
        "gateway_reload_total",
        "Config reloads, by result (ok, refused)."
    );
    describe_counter!(
        "gateway_handover_total",
        "Upgrade handovers, by result (ok, failed)."
    );
    describe_counter!(
        "gateway_batches_shipped_total",
        "Batches the control plane took, by status (accepted, duplicate)."
    );
    describe_counter!(
        "gateway_batches_rejected_total",
        "Batches the control plane refused, by reason."
    );
}

/// Every series the gateway can export, at its starting value, so that a
/// scrape holds it before its first event: `increase()` over a counter
/// that first appears at 1 is 0, and a dashboard panel or alert over an
/// absent series shows nothing. Label values come from the enums the call
/// sites count with, so a new variant is exported too. `gateway_config_info`
/// is not recorded here: `/metrics` renders it from the config in force
/// ([`crate::reload::ConfigInForce::render_info`]).
fn preregister() {
    use metrics::{counter, gauge, histogram};
    let labelled: [(&'static str, &'static str, Vec<&'static str>); 17] = [
        (
            "gateway_dns_queries_total",
            "outcome",
            crate::dns::query::Outcome::ALL
                .iter()
                .map(|o| o.as_str())
                .collect(),
        ),
        ("gateway_passthrough_total", "relay", vec!["splice", "copy"]),
        (
            "gateway_renewals_refused_total",
            "cause",
            crate::control::RENEWAL_REFUSALS.to_vec(),
        ),
        (
            "gateway_forwarded_total",
            "result",
            ForwardResult::ALL.iter().map(|r| r.as_str()).collect(),
        ),
        (
            "gateway_link_refused_total",
            "cause",
            LinkRefusal::ALL
                .iter()
                .map(|c| c.as_str())
                .chain(HeaderError::ALL.iter().map(|c| c.as_str()))
                .collect(),
        ),
        (
            "gateway_connections_total",
            "verdict",
            Verdict::every().map(Verdict::as_str).collect(),
        ),
        (
            "gateway_requests_refused_total",
            "reason",
            Refusal::ALL.iter().map(|r| r.as_str()).collect(),
        ),
        (
            "gateway_session_handshake_failures_total",
            "cause",
            HandshakeFailure::ALL.iter().map(|c| c.as_str()).collect(),
        ),
        (
            "gateway_session_limit_total",
            "bound",
            Bound::ALL.iter().map(|b| b.as_str()).collect(),
        ),
        (
            "gateway_session_drops_total",
            "reason",
            talos_certs::DropReason::ALL
                .iter()
                .map(|r| r.as_str())
                .collect(),
        ),
        (
            "gateway_approvals_total",
            "outcome",
            Outcome::NAMES.to_vec(),
        ),
        (
            "gateway_person_refusals_total",
            "reason",
            talos_certs::webauthn::AssertionError::NAMES.to_vec(),
        ),
        (
            "gateway_replies_cut_total",
            "cause",
            ReplyRefusal::ALL.iter().map(|c| c.as_str()).collect(),
        ),
        (
            "gateway_reload_total",
            "result",
            ReloadResult::ALL.iter().map(|r| r.as_str()).collect(),
        ),
        (
            "gateway_handover_total",
            "result",
            HandoverResult::ALL.iter().map(|r| r.as_str()).collect(),
        ),
        (
            "gateway_batches_shipped_total",
            "status",
            Shipped::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "gateway_batches_rejected_total",
            "reason",
            shipper::rejection_reasons().collect(),
        ),
    ];
    for (name, label, values) in labelled {
        for value in values {
            counter!(name, label => value).increment(0);
        }
    }
    for name in [
        "gateway_leases_lapsed_total",
        "gateway_freezes_total",
        "gateway_batches_sealed_total",
        "gateway_batch_ship_errors_total",
        "gateway_plane_failovers_total",
        "gateway_batch_write_errors_total",
        "gateway_journal_write_errors_total",
    ] {
        counter!(name).increment(0);
    }
    for name in [
        "gateway_connections_open",
        "gateway_approvals_pending",
        "gateway_sessions_open",
        "gateway_spool_batches",
        "gateway_spool_bytes",
        "gateway_spool_full",
        "gateway_forwarding_sessions",
    ] {
        gauge!(name).increment(0.0);
    }
    // -1: no session holds a lease (0 would read "lapses now").
    gauge!("gateway_lease_seconds_left_min").set(-1.0);
    // Registered, a histogram renders its buckets at 0 before its first
    // sample.
    let _ = histogram!("gateway_hello_bytes");
    let _ = histogram!("gateway_resolve_seconds");
}

/// Serve the admin listener until `shutdown` fires.
pub async fn serve(
    listener: Arc<TcpListener>,
    handle: PrometheusHandle,
    ready: Arc<AtomicBool>,
    config: Arc<crate::reload::ConfigInForce>,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            },
        };
        let handle = handle.clone();
        let ready = Arc::clone(&ready);
        let config = Arc::clone(&config);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let body = answer(&req, &handle, &ready, &config);
                async move { Ok::<_, Infallible>(body) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(
    req: &Request<Incoming>,
    handle: &PrometheusHandle,
    ready: &AtomicBool,
    in_force: &crate::reload::ConfigInForce,
) -> Response<Full<Bytes>> {
    let (status, body) = match req.uri().path() {
        "/metrics" => {
            let mut text = handle.render();
            in_force.render_info(&mut text);
            (StatusCode::OK, text)
        }
        "/healthz" => (StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => {
            let config = in_force.digest();
            if ready.load(Ordering::Relaxed) {
                (StatusCode::OK, format!("ready\nconfig {config}\n"))
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready\nconfig {config}\n"),
                )
            }
        }
        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scrape of a fresh recorder after `then` ran against it.
    fn scrape(then: impl FnOnce()) -> String {
        let recorder = recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            preregister();
            then();
        });
        handle.render()
    }

    /// The value of `series` (name and labels as rendered) in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    fn type_of<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines().find_map(|l| {
            l.strip_prefix("# TYPE ")?
                .strip_prefix(name)?
                .strip_prefix(' ')
        })
    }

    #[test]
    fn a_fresh_scrape_holds_every_series_at_its_start() {
        let text = scrape(|| {});
        let at_zero = |series: String| {
            assert_eq!(sample(&text, &series), Some(0.0), "{series} in:\n{text}");
        };
        for verdict in ["allowed", "undecided"]
            .into_iter()
            .chain(Refusal::ALL.iter().map(|r| r.as_str()))
        {
            at_zero(format!(
                "gateway_connections_total{{verdict=\"{verdict}\"}}"
            ));
        }
        for r in Refusal::ALL {
            at_zero(format!("gateway_requests_refused_total{{reason=\"{r}\"}}"));
        }
        for r in talos_certs::DropReason::ALL {
            at_zero(format!("gateway_session_drops_total{{reason=\"{r}\"}}"));
        }
        for b in Bound::ALL {
            at_zero(format!(
                "gateway_session_limit_total{{bound=\"{}\"}}",
                b.as_str()
            ));
        }
        for c in HandshakeFailure::ALL {
            at_zero(format!(
                "gateway_session_handshake_failures_total{{cause=\"{}\"}}",
                c.as_str()
            ));
        }
        assert!(HandshakeFailure::ALL
            .iter()
            .any(|c| c.as_str() == "timeout"));
        for o in ["approved", "declined", "timed_out", "withdrawn", "no_relay"] {
            at_zero(format!("gateway_approvals_total{{outcome=\"{o}\"}}"));
        }
        for r in talos_certs::webauthn::AssertionError::NAMES {
            at_zero(format!("gateway_person_refusals_total{{reason=\"{r}\"}}"));
        }
        for c in ReplyRefusal::ALL {
            at_zero(format!(
                "gateway_replies_cut_total{{cause=\"{}\"}}",
                c.as_str()
            ));
        }
        for (name, values) in [
            ("gateway_renewals_refused_total{cause", &["stale"][..]),
            ("gateway_reload_total{result", &["ok", "refused"][..]),
            ("gateway_handover_total{result", &["ok", "failed"][..]),
            (
                "gateway_batches_shipped_total{status",
                &["accepted", "duplicate"][..],
            ),
            (
                "gateway_batches_rejected_total{reason",
                &[
                    "bad_signature",
                    "gap",
                    "broken_chain",
                    "certificate_mismatch",
                ][..],
            ),
        ] {
            for v in values {
                at_zero(format!("{name}=\"{v}\"}}"));
            }
        }
        for r in talos_certs::Rejection::REASONS {
            at_zero(format!("gateway_batches_rejected_total{{reason=\"{r}\"}}"));
        }
        for name in [
            "gateway_leases_lapsed_total",
            "gateway_freezes_total",
            "gateway_batches_sealed_total",
            "gateway_batch_ship_errors_total",
            "gateway_plane_failovers_total",
            "gateway_batch_write_errors_total",
            "gateway_journal_write_errors_total",
            "gateway_connections_open",
            "gateway_approvals_pending",
            "gateway_sessions_open",
            "gateway_spool_batches",
            "gateway_spool_bytes",
            "gateway_spool_full",
        ] {
            at_zero(name.to_owned());
        }
        assert_eq!(sample(&text, "gateway_lease_seconds_left_min"), Some(-1.0));
        // Nothing else has a value yet.
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let value = line.rsplit(' ').next().unwrap_or_default();
            assert!(
                value == "0" || line.starts_with("gateway_lease_seconds_left_min "),
                "{line}"
            );
        }
    }

    #[test]
    fn histograms_are_histograms_with_their_buckets() {
        let text = scrape(|| {});
        for (name, buckets) in [
            ("gateway_hello_bytes", &HELLO_BYTES_BUCKETS[..]),
            ("gateway_resolve_seconds", &RESOLVE_SECONDS_BUCKETS[..]),
        ] {
            assert_eq!(type_of(&text, name), Some("histogram"), "{text}");
            for le in buckets.iter().map(f64::to_string).chain(["+Inf".into()]) {
                let series = format!("{name}_bucket{{le=\"{le}\"}}");
                assert_eq!(sample(&text, &series), Some(0.0), "{series} in:\n{text}");
            }
            assert_eq!(sample(&text, &format!("{name}_count")), Some(0.0));
            assert_eq!(sample(&text, &format!("{name}_sum")), Some(0.0));
        }

        // A post-quantum hello (1.8 KiB) and a cached answer (0.3 ms).
        let text = scrape(|| {
            metrics::histogram!("gateway_hello_bytes").record(1843.0);
            metrics::histogram!("gateway_resolve_seconds").record(0.0003);
        });
        for (series, n) in [
            ("gateway_hello_bytes_bucket{le=\"1536\"}", 0.0),
            ("gateway_hello_bytes_bucket{le=\"2048\"}", 1.0),
            ("gateway_hello_bytes_bucket{le=\"+Inf\"}", 1.0),
            ("gateway_hello_bytes_count", 1.0),
            ("gateway_resolve_seconds_bucket{le=\"0.0005\"}", 1.0),
            ("gateway_resolve_seconds_bucket{le=\"5\"}", 1.0),
        ] {
            assert_eq!(sample(&text, series), Some(n), "{series} in:\n{text}");
        }
    }
}
