//! `https://approvals.hangar.internal`: the gateway answers it itself.
//!
//! An agent proposes an action of its own: `POST /v1/proposals` with a
//! JSON body `{"tool": "<name>", "digest": "<SHA-384 hex of the exact
//! call>"}`. The proposal goes to the approval relay like a held request
//! (kind `agent`, under the first Lock rule that matches `POST
//! /v1/proposals` at `approvals.hangar.internal`), and the answer waits for
//! the decision: `200 {"decision":"approved"|"declined", …}`. No decision
//! within five minutes, no rule that names an approver, or a proposal the
//! relay refused or did not take in time: `declined`, with a `reason`. The session's authority ending while it waits:
//! `403 approval_withdrawn`. Past a bound of the session's share (pending
//! proposals, or the rate of proposals): `429 session_limit` at once, with
//! the bound named (`"bound"`) and, for the rate, `retry-after`. A malformed proposal: `400` with a message
//! naming what is wrong. Nothing here is ever forwarded anywhere.

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use crate::http::answers::{self, ProxyBody};
use crate::http::connection::Connection;
use crate::records::record::RequestRecord;
use crate::refusal::{Refusal, Refused};
use crate::session::approvals::{Outcome, RoutedPath};

/// The path proposals are posted to.
pub const PROPOSALS_PATH: &str = "/v1/proposals";

/// The largest proposal body read.
pub const MAX_BODY: usize = 16 * 1024;

/// A proposal as the agent sends it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentProposal {
    tool: String,
    digest: String,
}

/// Answer one request to approvals.hangar.internal.
pub async fn answer(
    conn: &Connection,
    req: Request<Incoming>,
    entry: &mut RequestRecord,
) -> Response<ProxyBody> {
    let json = |status, body| answers::json(conn, status, None, body);
    let bad_request = |message: &str| {
        json(
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": "malformed_proposal", "message": message}),
        )
    };
    if req.uri().path() != PROPOSALS_PATH {
        return json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "not_found", "message": "approvals.hangar.internal answers POST /v1/proposals only"}),
        );
    }
    if req.method() != Method::POST {
        return json(
            StatusCode::METHOD_NOT_ALLOWED,
            serde_json::json!({"error": "method_not_allowed", "message": "use POST"}),
        );
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return bad_request(&format!(
                "the body must be JSON of at most {MAX_BODY} bytes"
            ))
        }
    };
    let proposal: AgentProposal = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return bad_request(&format!(
            "the body must be {{\"tool\": NAME, \"digest\": SHA-384 HEX}} and nothing else ({})",
            category(&e)
        ))
        }
    };
    if !is_tool_name(&proposal.tool) {
        return bad_request("tool: 1-128 letters, digits, '.', '_', '-', ':' or '/'");
    }
    if !(proposal.digest.len() == 96
        && proposal
            .digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    {
        return bad_request("digest: the SHA-384 of the exact call, 96 lowercase hex digits");
    }
    let path = RoutedPath::new(PROPOSALS_PATH);
    let mut ask = conn.ask(talos_certs::ProposalKind::Agent, "POST", &path);
    ask.tool = &proposal.tool;
    ask.call_digest = &proposal.digest;
    let Some(rule) = conn.session.approvals.rule_for(&ask).cloned() else {
        return json(
            StatusCode::OK,
            serde_json::json!({"decision": "declined", "reason": "no_rule", "message": "no Lock rule names an approver for agent proposals"}),
        );
    };
    let (outcome, record) = match conn.hold(&rule, &ask).await {
        Ok(held) => held,
        Err(at) => {
            let refused = at.refused();
            super::connection::refuse(conn, entry, &refused);
            // As a held request's (`http::proxy`): paused.
            tokio::time::sleep(crate::session::share::REFUSAL_PAUSE).await;
            return answers::json(
                conn,
                StatusCode::from_u16(refused.reason.http_status())
                    .unwrap_or(StatusCode::TOO_MANY_REQUESTS),
                Some(refused),
                serde_json::json!({"refusal": refused.reason.as_str(), "bound": at.bound.as_str(), "message": refused.reason.message()}),
            );
        }
    };
    let proposal_id = record.proposal_id.clone();
    let digest = record.digest.clone();
    entry.approval = Some(record);
    let (decision, approver, reason) = match outcome {
        Outcome::Approved { approver } => ("approved", Some(approver), None),
        Outcome::Declined { approver } => ("declined", Some(approver), None),
        Outcome::TimedOut => ("declined", None, Some("no_decision")),
        Outcome::NoRelay => ("declined", None, Some("no_relay")),
        Outcome::RelayRefused => ("declined", None, Some("relay_refused")),
        Outcome::RelayUnreachable => ("declined", None, Some("relay_unreachable")),
        Outcome::Withdrawn => {
            let reason = Refusal::ApprovalWithdrawn;
            let refused = Refused::new(reason, "session_ended");
            super::connection::refuse(conn, entry, &refused);
            return answers::json(
                conn,
                StatusCode::from_u16(reason.http_status()).unwrap_or(StatusCode::FORBIDDEN),
                Some(refused),
                serde_json::json!({"refusal": reason.as_str(), "proposal_id": proposal_id, "message": reason.message()}),
            );
        }
    };
    let mut body = serde_json::json!({
        "decision": decision,
        "proposal_id": proposal_id,
        "proposal_digest": digest,
        "rule": rule.id,
    });
    if let Some(a) = approver {
        body["approver"] = a.into();
    }
    if let Some(r) = reason {
        body["reason"] = r.into();
    }
    json(StatusCode::OK, body)
}

fn is_tool_name(t: &str) -> bool {
    (1..=128).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/'))
}

/// A JSON error's category, never the offending text.
fn category(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "wrong or missing fields",
        serde_json::error::Category::Eof => "truncated",
    }
}
