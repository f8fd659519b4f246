//! The metrics `serve` exports on `--metrics-listen`, every series at 0
//! from the moment `serve` knows it can happen: the unlabelled ones at
//! start, and each member's as soon as `serve` knows the member (given
//! with `--gateway`, registered in the store, or described). A counter that
//! first appears at 1 shows no `increase()`, so an alert over it would
//! never fire. Label values come from the enums the call sites count with.
//!
//! `stub_gateway_up` is left to the first `Describe` (0 would say the
//! member is down), `stub_forwarding_entries` to the member's first
//! answered renewal, and the other gauges to the first tick, which reads
//! them from the store; but `stub_batches_in_intake`, which the batch
//! intake moves, is at 0 from the start.

use crate::model::{CloseAttempt, Renewal};

/// The series of member `gateway_id`, at 0 (a series already counting
/// keeps its value).
pub fn member(gateway_id: &str) {
    let id = || gateway_id.to_owned();
    for result in CloseAttempt::ALL {
        metrics::counter!("stub_close_attempts_total", "gateway" => id(), "result" => result.as_str())
            .increment(0);
    }
    for result in Renewal::ALL {
        metrics::counter!("stub_lease_renewals_total", "gateway" => id(), "result" => result.as_str())
            .increment(0);
    }
    metrics::counter!("stub_batches_accepted_total", "gateway" => id()).increment(0);
    for reason in talos_certs::ack_rejection_reasons() {
        metrics::counter!("stub_batches_rejected_total", "gateway" => id(), "reason" => reason)
            .increment(0);
    }
    for kind in crate::batches::REPORT_KINDS {
        metrics::counter!("stub_reports_accepted_total", "gateway" => id(), "kind" => kind.as_str())
            .increment(0);
    }
    metrics::counter!("stub_spool_gaps_total", "gateway" => id()).increment(0);
}

/// The unlabelled series and those of every member in `members`, at 0.
pub fn preregister<'a>(members: impl IntoIterator<Item = &'a str>) {
    metrics::counter!("stub_certificates_issued_total").increment(0);
    metrics::gauge!("stub_batches_in_intake").increment(0.0);
    for id in members {
        member(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_scrape_holds_each_members_series_at_0() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            preregister(["gw-a", "gw-b"]);
            // Known again (described): a series already counting keeps its
            // value.
            metrics::counter!("stub_spool_gaps_total", "gateway" => "gw-a").increment(2);
            member("gw-a");
        });
        let text = handle.render();
        let value = |series: String| {
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
                .to_owned()
        };
        assert_eq!(value("stub_certificates_issued_total".into()), "0");
        assert_eq!(value("stub_spool_gaps_total{gateway=\"gw-a\"}".into()), "2");
        for gw in ["gw-a", "gw-b"] {
            for result in ["confirmed", "owed"] {
                assert_eq!(
                    value(format!(
                        "stub_close_attempts_total{{gateway=\"{gw}\",result=\"{result}\"}}"
                    )),
                    "0"
                );
            }
            for result in ["ok", "failed"] {
                assert_eq!(
                    value(format!(
                        "stub_lease_renewals_total{{gateway=\"{gw}\",result=\"{result}\"}}"
                    )),
                    "0"
                );
            }
            for kind in ["drop_report", "start_report"] {
                assert_eq!(
                    value(format!(
                        "stub_reports_accepted_total{{gateway=\"{gw}\",kind=\"{kind}\"}}"
                    )),
                    "0"
                );
            }
            for reason in talos_certs::Rejection::REASONS
                .into_iter()
                .chain(["certificate_mismatch"])
            {
                assert_eq!(
                    value(format!(
                        "stub_batches_rejected_total{{gateway=\"{gw}\",reason=\"{reason}\"}}"
                    )),
                    "0"
                );
            }
            assert_eq!(
                value(format!("stub_batches_accepted_total{{gateway=\"{gw}\"}}")),
                "0"
            );
        }
        assert_eq!(value("stub_spool_gaps_total{gateway=\"gw-b\"}".into()), "0");
        assert!(!text.contains("stub_gateway_up"), "{text}");
    }
}
