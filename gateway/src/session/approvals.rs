//! Approval holds: the Lock's rules, held requests, and the relay's
//! decisions.
//!
//! A session's authority carries the account's Lock rules as they stood
//! when it opened, and the approval relay's public key. A request that
//! matches a rule (destination, attachment, method, path prefix) is held:
//! [`Approvals::hold`] writes a `talos_certs::Proposal`, its sentence and
//! digest, hands it to the [`Proposer`] (which delivers it to the relay
//! through the control channel, and says what became of it), and waits —
//! without a thread: a held request is a future, two oneshot channels and
//! two timers — for the first of:
//!
//! - a decision the relay signed ([`Approvals::decide`]): checked under the
//!   relay key, for this proposal id and digest, from a listed approver.
//!   Approved: the request goes on. Declined: `approval_declined`;
//! - the relay refusing the proposal (it makes no card: a rule removed
//!   since the session opened, a session no longer running there, a
//!   proposal it judges invalid): `approval_declined` at once, since no
//!   decision can come;
//! - the relay not taking the proposal within [`DELIVERY_TIMEOUT`]
//!   (unreachable, or not answering): `approval_declined` then, not at the
//!   end of the decision time;
//! - [`DECISION_TIMEOUT`] (five minutes) without a decision:
//!   `approval_declined`;
//! - the session's authority ending (pause, interruption, end, Revoke
//!   All): `approval_withdrawn`. The proposal is forgotten, so a decision
//!   that comes later finds nothing to decide.
//!
//! Modes: `every_request` holds every matching request; `first_use` holds
//! matching requests until one of them is approved under this authority.
//! A resume or recovery opens a new authority, so first uses count again.
//! On a pair, each member holds its own first use, but the relay makes one
//! card for them: the first proposal it receives of that session attempt
//! and rule, the others joined to it and answered with the same decision
//! (the card it names, the person's assertion over that card). A member
//! takes another member's card only for the same first use
//! ([`FirstUseOf`]: session, attempt, tenant, rule and approvers), and
//! verifies the person's assertion over it itself; the record names the
//! card (`card`).
//! Other requests, streams and connections never wait for a hold.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use talos_certs::{Decision, Proposal, ProposalKind, Signed, Verdict};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::gate::name::Name;
use crate::session::person::{Card, Decider, People};
use talos_contract::sync::Locked;

/// How long a held request waits for a decision.
pub const DECISION_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How long a held request waits for the relay to take its proposal
/// (the card made) before it is declined (`relay_unreachable`): a tenth
/// of [`DECISION_TIMEOUT`], long enough for a relay that restarts and for
/// the deliverer's retries (after 0.2 s, doubling to 10 s: eight tries
/// in the first 23 s when each fails at once), short enough that a request does not hold a place of the
/// session's share for minutes for a card that is not there.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The Lock's rules as the contract checks them ([`talos_contract::lock`]):
/// the control plane keeps the same rules when a rule is added.
pub use talos_contract::lock::{LockRule, Mode, MAX_RULES};
pub use talos_contract::path::RoutedPath;

/// How a hold ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Approved {
        approver: String,
    },
    Declined {
        approver: String,
    },
    /// No decision within [`DECISION_TIMEOUT`].
    TimedOut,
    /// The session's authority ended while waiting.
    Withdrawn,
    /// No relay to ask: the session was opened without a relay key.
    NoRelay,
    /// The relay refused the proposal: no card, so no decision can come.
    RelayRefused,
    /// The relay did not take the proposal within [`DELIVERY_TIMEOUT`].
    RelayUnreachable,
}

impl Outcome {
    /// Every outcome's word, in declaration order (the `outcome` label
    /// values of `gateway_approvals_total`). [`as_str`](Self::as_str)
    /// indexes into it, so a new variant needs its word here (an index past
    /// the end does not compile).
    pub const NAMES: [&'static str; 7] = [
        "approved",
        "declined",
        "timed_out",
        "withdrawn",
        "no_relay",
        "relay_refused",
        "relay_unreachable",
    ];

    /// The word records use.
    pub const fn as_str(&self) -> &'static str {
        Self::NAMES[match self {
            Outcome::Approved { .. } => 0,
            Outcome::Declined { .. } => 1,
            Outcome::TimedOut => 2,
            Outcome::Withdrawn => 3,
            Outcome::NoRelay => 4,
            Outcome::RelayRefused => 5,
            Outcome::RelayUnreachable => 6,
        }]
    }
}

/// What a held request's record says of its approval.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ApprovalRecord {
    pub proposal_id: String,
    pub digest: String,
    pub rule: String,
    pub decision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// The card the person decided, when it was not this proposal: another
    /// member's card for the same first use (one card across the pair).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card: Option<String>,
    pub requested_at: String,
    pub decided_at: String,
}

/// Why a decision was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("no pending proposal has that id (decided, withdrawn, timed out or never made)")]
    NotPending,
    #[error("the decision does not verify under the session's relay key: {0}")]
    BadSignature(String),
    #[error("the decision names another proposal digest")]
    WrongDigest,
    #[error("the approver is not listed for this proposal")]
    NotListed,
    /// The person's assertion is missing or does not verify (issue 42):
    /// the relay's signature alone releases nothing.
    #[error("the person's passkey assertion is refused ({name}): {0}", name = .0.as_str())]
    Person(talos_certs::webauthn::AssertionError),
}

struct Pending {
    digest: String,
    approvers: Vec<String>,
    /// Set when the request is a `first_use` rule's: what another
    /// member's card must share to answer it.
    first_use: Option<FirstUseOf>,
    /// The outcome, and the other member's card that answered it, if one
    /// did.
    answer: oneshot::Sender<(Outcome, Option<String>)>,
}

/// What makes two held requests one first use (issue 42, item 4): a
/// `first_use` rule's request of the same session attempt and tenant, under
/// the same rule naming the same approvers, whichever member holds it. The
/// relay makes one card for them all (the first proposal it receives) and
/// answers the others with the decision the person signed over that card;
/// each member checks the card is of its own first use here, then the
/// person's assertion over the card's digest itself.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FirstUseOf {
    session_id: String,
    attempt: u32,
    tenant: String,
    rule: String,
    approvers: Vec<String>,
}

impl FirstUseOf {
    fn of(rule: &LockRule, ask: &Ask<'_>) -> Option<FirstUseOf> {
        (rule.mode == Mode::FirstUse && ask.kind == ProposalKind::Request).then(|| FirstUseOf {
            session_id: ask.session_id.to_owned(),
            attempt: ask.attempt,
            tenant: ask.tenant.to_owned(),
            rule: rule.id.clone(),
            approvers: rule.approvers.clone(),
        })
    }

    /// Whether `card` (another proposal) is this same first use.
    fn answered_by(&self, card: &Proposal) -> bool {
        card.kind == ProposalKind::Request
            && card.session_id == self.session_id
            && card.attempt == self.attempt
            && card.tenant == self.tenant
            && card.rule == self.rule
            && card.approvers == self.approvers
    }
}

/// What became of a proposal at the relay, as its deliverer tells the
/// held request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Taken: the card is made (or was, by an earlier try).
    Taken,
    /// Refused for good: no card will be made.
    Refused,
}

/// A proposal on its way to the relay: its fields, sentence and digest,
/// and where to say what became of it. Dropping `delivered` unsent says
/// the delivery was given up (the process is stopping): no card will come.
#[derive(Debug)]
pub struct Proposed {
    pub proposal: Proposal,
    pub sentence: String,
    pub digest: String,
    pub delivered: oneshot::Sender<Delivery>,
}

/// Delivers proposals to the approval relay.
#[derive(Clone, Debug)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<Proposed>,
    /// Told of every first use approved, once this process has handed its
    /// authorities to a successor (which must count them too).
    first_uses: Arc<Mutex<Option<mpsc::UnboundedSender<FirstUse>>>>,
}

/// A `first_use` rule's first use approved under one authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstUse {
    pub session_id: String,
    pub attempt: u32,
    pub rule: String,
}

impl Proposer {
    /// A proposer and the receiving end its delivery task reads.
    pub fn new() -> (Proposer, mpsc::UnboundedReceiver<Proposed>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Proposer {
                tx,
                first_uses: Arc::default(),
            },
            rx,
        )
    }

    fn send(&self, p: Proposed) -> bool {
        self.tx.send(p).is_ok()
    }

    /// From now on, tell `to` of every first use approved.
    pub fn report_first_uses(&self, to: mpsc::UnboundedSender<FirstUse>) {
        *self.first_uses.locked() = Some(to);
    }

    fn first_use(&self, session_id: &str, attempt: u32, rule: &str) {
        let to = self.first_uses.locked();
        if let Some(to) = to.as_ref() {
            let _ = to.send(FirstUse {
                session_id: session_id.to_owned(),
                attempt,
                rule: rule.to_owned(),
            });
        }
    }
}

/// The Lock state of one session authority.
pub struct Approvals {
    rules: Vec<LockRule>,
    relay_key: Option<[u8; 32]>,
    proposer: Option<Proposer>,
    pending: Mutex<HashMap<String, Pending>>,
    /// Rules whose first use was approved under this authority.
    first_use_done: Mutex<HashSet<String>>,
    /// Whose passkeys sign decisions, and the lab setting.
    people: People,
    counter: AtomicU64,
    /// No request is held from now on (the member drains, or the
    /// authority ended): a request the Lock would hold is withdrawn at
    /// once.
    closed: std::sync::atomic::AtomicBool,
    /// Requests withdrawn under this authority, however they were.
    withdrawn: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("rules", &self.rules.len())
            .field("relay", &self.relay_key.is_some())
            .field("pending", &self.pending_count())
            .finish()
    }
}

/// The facts of one request, for matching and for its proposal.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub gateway_id: &'a str,
    pub session_id: &'a str,
    pub attempt: u32,
    pub tenant: &'a str,
    pub kind: ProposalKind,
    pub destination: &'a Name,
    pub method: &'a str,
    /// The path as the Lock judges it; proposals carry its canonical form.
    pub path: &'a RoutedPath,
    pub attachments: Vec<&'a str>,
    pub tool: &'a str,
    pub call_digest: &'a str,
}

impl Approvals {
    pub fn new(
        rules: Vec<LockRule>,
        relay_key: Option<[u8; 32]>,
        proposer: Option<Proposer>,
    ) -> Self {
        Approvals {
            rules,
            relay_key,
            proposer,
            pending: Mutex::new(HashMap::new()),
            first_use_done: Mutex::new(HashSet::new()),
            people: People::default(),
            counter: AtomicU64::new(0),
            closed: Default::default(),
            withdrawn: Default::default(),
        }
    }

    /// Decisions checked against `people`'s passkeys (the default lists
    /// none, not in lab mode: every decision is refused).
    pub fn with_people(mut self, people: People) -> Self {
        self.people = people;
        self
    }

    /// The approvers' passkeys and the lab setting.
    pub fn people(&self) -> &People {
        &self.people
    }

    /// No rules: nothing is ever held.
    pub fn none() -> Self {
        Approvals::new(Vec::new(), None, None)
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[LockRule] {
        &self.rules
    }

    /// The first rule that holds this request now (a `first_use` rule
    /// whose first use was approved holds no more).
    pub fn rule_for(&self, ask: &Ask<'_>) -> Option<&LockRule> {
        let done = self.first_use_done.locked();
        self.rules.iter().find(|r| {
            r.matches(ask.destination, ask.method, ask.path, &ask.attachments)
                && !(r.mode == Mode::FirstUse && done.contains(&r.id))
        })
    }

    /// The approval relay's public key, if the authority has one.
    pub fn relay_key(&self) -> Option<[u8; 32]> {
        self.relay_key
    }

    /// The rules whose first use was approved under this authority, sorted.
    pub fn first_uses(&self) -> Vec<String> {
        let done = self.first_use_done.locked();
        let mut rules: Vec<String> = done.iter().cloned().collect();
        rules.sort();
        rules
    }

    /// Count `rule`'s first use as approved (one approved under this
    /// authority in the process that handed it over).
    pub fn mark_first_use(&self, rule: &str) {
        if self
            .rules
            .iter()
            .any(|r| r.id == rule && r.mode == Mode::FirstUse)
        {
            self.first_use_done.locked().insert(rule.to_owned());
        }
    }

    /// Whether a hold sends a proposal: a relay key and a way to the relay.
    /// Without, a hold is declined at once, and nothing is sent.
    pub fn proposes(&self) -> bool {
        self.relay_key.is_some() && self.proposer.is_some()
    }

    /// Requests waiting now.
    pub fn pending_count(&self) -> usize {
        self.pending.locked().len()
    }

    /// Hold a request under `rule` until a decision, the relay's refusal
    /// of the proposal, [`DELIVERY_TIMEOUT`] without the relay taking it,
    /// the timeout or `ended`. Returns the outcome and what the record
    /// says.
    pub async fn hold(
        &self,
        rule: &LockRule,
        ask: &Ask<'_>,
        ended: &CancellationToken,
        timeout: Duration,
    ) -> (Outcome, ApprovalRecord) {
        let proposal = self.proposal(rule, ask, timeout);
        let proposal_id = proposal.proposal_id.clone();
        let sentence = talos_certs::sentence(&proposal);
        let digest = talos_certs::proposal_digest(&proposal, &sentence);
        let mut record = ApprovalRecord {
            proposal_id: proposal_id.clone(),
            digest: digest.clone(),
            rule: rule.id.clone(),
            decision: "",
            approver: None,
            card: None,
            requested_at: proposal.created_at.clone(),
            decided_at: String::new(),
        };
        let (answer, wait) = oneshot::channel();
        let outcome = if self.relay_key.is_none() || self.proposer.is_none() {
            Outcome::NoRelay
        } else {
            {
                // Checked under the lock `close` drains: a request comes
                // before the close (and is withdrawn by it) or after it
                // (and is withdrawn here, no proposal sent).
                let mut pending = self.pending.locked();
                if self.closed.load(Ordering::SeqCst) {
                    drop(pending);
                    self.withdrawn.fetch_add(1, Ordering::Relaxed);
                    return self.finish(rule, ask, Outcome::Withdrawn, record);
                }
                pending.insert(
                    proposal_id.clone(),
                    Pending {
                        digest: digest.clone(),
                        approvers: rule.approvers.clone(),
                        first_use: FirstUseOf::of(rule, ask),
                        answer,
                    },
                );
            }
            metrics::gauge!("gateway_approvals_pending").increment(1.0);
            tracing::info!(
                session = ask.session_id,
                proposal = %proposal_id,
                rule = %rule.id,
                digest = %digest,
                "request held for approval"
            );
            let (delivered, delivery) = oneshot::channel();
            let sent = self.proposer.as_ref().is_some_and(|p| {
                p.send(Proposed {
                    proposal,
                    sentence,
                    digest,
                    delivered,
                })
            });
            let outcome = if !sent {
                Outcome::NoRelay
            } else {
                // Ends only when no card will come; once the relay has
                // taken the proposal, only a decision, the timeout or the
                // authority's end can end the hold.
                let undelivered = async {
                    match tokio::time::timeout(DELIVERY_TIMEOUT, delivery).await {
                        Ok(Ok(Delivery::Taken)) => std::future::pending().await,
                        Ok(Ok(Delivery::Refused)) => Outcome::RelayRefused,
                        Ok(Err(_)) | Err(_) => Outcome::RelayUnreachable,
                    }
                };
                tokio::select! {
                    // A decision wins over a delivery report that comes
                    // with it (the relay took the proposal just in time).
                    biased;
                    answer = wait => match answer {
                        Ok((outcome, card)) => {
                            record.card = card;
                            outcome
                        }
                        Err(_) => Outcome::Withdrawn,
                    },
                    () = ended.cancelled() => Outcome::Withdrawn,
                    outcome = undelivered => outcome,
                    () = tokio::time::sleep(timeout) => Outcome::TimedOut,
                }
            };
            self.pending.locked().remove(&proposal_id);
            metrics::gauge!("gateway_approvals_pending").decrement(1.0);
            outcome
        };
        self.finish(rule, ask, outcome, record)
    }

    /// A hold's end: a first use approved is remembered, the outcome
    /// counted and put on the request's approval record.
    fn finish(
        &self,
        rule: &LockRule,
        ask: &Ask<'_>,
        outcome: Outcome,
        mut record: ApprovalRecord,
    ) -> (Outcome, ApprovalRecord) {
        if let Outcome::Approved { .. } = &outcome {
            if rule.mode == Mode::FirstUse {
                self.first_use_done.locked().insert(rule.id.clone());
                if let Some(p) = &self.proposer {
                    p.first_use(ask.session_id, ask.attempt, &rule.id);
                }
            }
        }
        metrics::counter!("gateway_approvals_total", "outcome" => outcome.as_str()).increment(1);
        record.decision = outcome.as_str();
        record.approver = match &outcome {
            Outcome::Approved { approver } | Outcome::Declined { approver } => {
                Some(approver.clone())
            }
            _ => None,
        };
        record.decided_at = rfc3339(SystemTime::now());
        (outcome, record)
    }

    /// The proposal for a request held under `rule`: a fresh id (session,
    /// attempt, a counter and random bytes), the request's facts, and when
    /// it expires.
    fn proposal(&self, rule: &LockRule, ask: &Ask<'_>, timeout: Duration) -> Proposal {
        let now = SystemTime::now();
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let mut random = [0u8; 6];
        let _ = aws_lc_rs::rand::fill(&mut random);
        let proposal_id = format!(
            "{}-{}-{}-{}",
            ask.session_id,
            ask.attempt,
            n,
            random
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let mut attachments: Vec<String> =
            ask.attachments.iter().map(|a| (*a).to_owned()).collect();
        attachments.sort();
        attachments.dedup();
        let proposal = Proposal {
            proposal_id: proposal_id.clone(),
            gateway_id: ask.gateway_id.to_owned(),
            session_id: ask.session_id.to_owned(),
            attempt: ask.attempt,
            tenant: ask.tenant.to_owned(),
            kind: ask.kind,
            destination: ask.destination.as_str().to_owned(),
            method: ask.method.to_owned(),
            path: ask.path.canonical().to_owned(),
            attachments,
            rule: rule.id.clone(),
            tool: ask.tool.to_owned(),
            call_digest: ask.call_digest.to_owned(),
            approvers: rule.approvers.clone(),
            created_at: rfc3339(now),
            expires_at: rfc3339(now + timeout),
        };
        proposal
    }

    /// Whether `proposal_id` is waiting here.
    pub fn holds(&self, proposal_id: &str) -> bool {
        self.pending.locked().contains_key(proposal_id)
    }

    /// Apply a signed decision: checked under the relay key, for a pending
    /// proposal with the same digest, from one of its approvers. A refused
    /// decision changes nothing.
    pub fn decide(&self, signed: &Signed) -> Result<Verdict, DecideError> {
        let key = self
            .relay_key
            .ok_or_else(|| DecideError::BadSignature("the session has no relay key".into()))?;
        let decision: Decision = talos_certs::verify_decision(&key, signed)
            .map_err(|e| DecideError::BadSignature(e.to_string()))?;
        let mut pending = self.pending.locked();
        let held = pending
            .get(&decision.proposal_id)
            .ok_or(DecideError::NotPending)?;
        if held.digest != decision.proposal_digest {
            return Err(DecideError::WrongDigest);
        }
        if !held.approvers.iter().any(|a| a == &decision.approver) {
            return Err(DecideError::NotListed);
        }
        let refused = |e: talos_certs::webauthn::AssertionError| {
            metrics::counter!("gateway_person_refusals_total", "reason" => e.as_str()).increment(1);
            // Whom the relay claimed decided, so an audit of a relay that
            // lies can name the person it named (never key material).
            tracing::warn!(proposal = %decision.proposal_id, claimed_approver = %decision.approver, verdict = decision.decision.as_str(), reason = e.as_str(), "a person's decision refused");
            DecideError::Person(e)
        };
        // The card the person signed: this proposal, or another member's
        // card for the same first use (one card across the pair).
        let (card_digest, card) = match &decision.card {
            None => (held.digest.clone(), Card::Own),
            Some(card) => {
                let digest = talos_certs::proposal_digest(card, &talos_certs::sentence(card));
                if digest == held.digest {
                    (digest, Card::Own)
                } else if held.first_use.as_ref().is_some_and(|f| f.answered_by(card)) {
                    tracing::info!(proposal = %decision.proposal_id, card = %card.proposal_id, card_gateway = %card.gateway_id, rule = %card.rule, "first use answered by the decision on another member's card for the same session attempt and rule");
                    (digest, Card::OtherMembers)
                } else {
                    tracing::info!(proposal = %decision.proposal_id, card = %card.proposal_id, "the card the person signed is another proposal, and not this one's first use");
                    return Err(refused(
                        talos_certs::webauthn::AssertionError::ChallengeMismatch,
                    ));
                }
            }
        };
        let decider = self
            .people
            .check_card(&decision, &card_digest, &held.approvers, card)
            .map_err(refused)?;
        match &decider {
            Decider::Person(person) => {
                tracing::info!(proposal = %decision.proposal_id, person = %person, decision = decision.decision.as_str(), "decision signed by the person's passkey, verified");
            }
            Decider::Lab(approver) => {
                tracing::info!(proposal = %decision.proposal_id, approver = %approver, decision = decision.decision.as_str(), "decision without a person's assertion taken on the relay's word: the account is in lab mode");
            }
        }
        let held = pending
            .remove(&decision.proposal_id)
            .ok_or(DecideError::NotPending)?;
        let approver = decider.name().to_owned();
        let outcome = match decision.decision {
            Verdict::Approved => Outcome::Approved { approver },
            Verdict::Declined => Outcome::Declined { approver },
        };
        // The waiter may have just timed out: then the decision is moot.
        let answered_by = (card == Card::OtherMembers)
            .then(|| decision.card.as_ref().map(|c| c.proposal_id.clone()))
            .flatten();
        let _ = held.answer.send((outcome, answered_by));
        Ok(decision.decision)
    }

    /// Withdraw every pending proposal (the authority ended): each waiter
    /// answers `approval_withdrawn`, and nothing is held from now on.
    /// Returns how many requests were withdrawn under this authority, a
    /// drain's ([`Approvals::close`]) included.
    pub fn withdraw_all(&self) -> u32 {
        self.close();
        self.withdrawn.load(Ordering::Relaxed)
    }

    /// Hold nothing from now on: every request held is answered
    /// `approval_withdrawn` at once, and so is every request the Lock
    /// would hold later. Returns how many were held. The drain of a member
    /// going down (not of one handing over) closes every session's Lock
    /// this way, so that no held request waits out the grace unanswered.
    pub fn close(&self) -> u32 {
        let drained: Vec<Pending> = {
            let mut pending = self.pending.locked();
            self.closed.store(true, Ordering::SeqCst);
            pending.drain().map(|(_, p)| p).collect()
        };
        let n = u32::try_from(drained.len()).unwrap_or(u32::MAX);
        self.withdrawn.fetch_add(n, Ordering::Relaxed);
        for p in drained {
            let _ = p.answer.send((Outcome::Withdrawn, None));
        }
        n
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::name;
    use std::sync::Arc;
    use talos_certs::GatewayKey;

    fn rule(mode: &str) -> LockRule {
        LockRule::check(&talos_contract::lock::RuleDraft {
            id: "lock-1",
            destination: "api.example.com",
            attachment: "",
            method: "post",
            path_prefix: "/merge",
            mode,
            approvers: &["bob".into(), "alice".into()],
        })
        .unwrap()
    }

    struct Rig {
        relay: GatewayKey,
        approvals: Arc<Approvals>,
        proposals: mpsc::UnboundedReceiver<Proposed>,
        dest: Name,
    }

    fn rig(mode: &str) -> Rig {
        let relay = GatewayKey::generate().unwrap();
        let (proposer, proposals) = Proposer::new();
        // The relay's own path: its word counts (lab). A person's
        // assertion is checked in `session::person` and in the test below.
        let approvals = Arc::new(
            Approvals::new(vec![rule(mode)], Some(relay.public_key()), Some(proposer))
                .with_people(People::lab()),
        );
        Rig {
            relay,
            approvals,
            proposals,
            dest: name::canonicalize("api.example.com").unwrap(),
        }
    }

    /// A proposal as the relay took it.
    struct Taken {
        proposal: Proposal,
        sentence: String,
        digest: String,
    }

    impl Rig {
        /// The next proposal, taken as the relay takes it.
        async fn taken(&mut self) -> Taken {
            let p = self.proposals.recv().await.unwrap();
            p.delivered.send(Delivery::Taken).unwrap();
            Taken {
                proposal: p.proposal,
                sentence: p.sentence,
                digest: p.digest,
            }
        }

        /// Hold a request under `rule` on a task of its own, until `ended`.
        fn hold(
            &self,
            rule: LockRule,
            ended: &CancellationToken,
        ) -> tokio::task::JoinHandle<(Outcome, ApprovalRecord)> {
            let approvals = Arc::clone(&self.approvals);
            let dest = self.dest.clone();
            let ended = ended.clone();
            tokio::spawn(async move {
                approvals
                    .hold(&rule, &ask(&dest), &ended, DECISION_TIMEOUT)
                    .await
            })
        }
    }

    fn ask(dest: &Name) -> Ask<'_> {
        static PATH: std::sync::LazyLock<RoutedPath> =
            std::sync::LazyLock::new(|| RoutedPath::new("/merge/7"));
        Ask {
            gateway_id: "gw-a",
            session_id: "sbx-1",
            attempt: 1,
            tenant: "acme",
            kind: ProposalKind::Request,
            destination: dest,
            method: "POST",
            path: &PATH,
            attachments: vec!["GH"],
            tool: "",
            call_digest: "",
        }
    }

    fn decision(relay: &GatewayKey, p: &Proposal, digest: &str, who: &str, v: Verdict) -> Signed {
        Decision {
            proposal_id: p.proposal_id.clone(),
            proposal_digest: digest.to_owned(),
            approver: who.to_owned(),
            decision: v,
            decided_at: "2026-11-29T10:00:00.000Z".into(),
            card: None,
            assertion: None,
        }
        .sign(relay)
    }

    #[tokio::test(start_paused = true)]
    async fn outside_the_lab_only_the_named_persons_own_signature_releases() {
        use crate::session::person::Key;
        use talos_certs::webauthn::soft::{Authenticator, Ceremony};
        use talos_certs::webauthn::{decision_challenge, CoseAlgorithm, Expected};
        const RP_ID: &str = "people.talos.test";
        const ORIGIN: &str = "https://people.talos.test:8443";
        let alice = Authenticator::new(CoseAlgorithm::Es256);
        let mut rig = rig("every_request");
        let people = People::new(
            RP_ID,
            ORIGIN,
            false,
            vec![Key {
                owner: "alice".into(),
                credential_id: alice.credential_id().to_vec(),
                public_key_cose: alice.public_key_cose().to_vec(),
                sign_count: 0,
                opened_count: 0,
            }],
        )
        .unwrap();
        let (proposer, proposals) = Proposer::new();
        rig.approvals = Arc::new(
            Approvals::new(
                vec![rule("every_request")],
                Some(rig.relay.public_key()),
                Some(proposer),
            )
            .with_people(people),
        );
        rig.proposals = proposals;
        let ended = CancellationToken::new();
        let held = rig.hold(rule("every_request"), &ended);
        let Taken {
            proposal: p,
            digest,
            ..
        } = rig.taken().await;
        let signed_by_alice = |verdict: Verdict, on: &str| {
            let challenge = decision_challenge(on, verdict);
            alice.assert(
                &Ceremony::get(&Expected {
                    challenge: &challenge,
                    rp_id: RP_ID,
                    origin: ORIGIN,
                })
                .sign_count(1),
            )
        };
        let with = |verdict: Verdict, a: &talos_certs::webauthn::soft::SignedAssertion| {
            Decision {
                proposal_id: p.proposal_id.clone(),
                proposal_digest: digest.clone(),
                approver: "alice".into(),
                decision: verdict,
                decided_at: "2026-11-29T10:00:00.000Z".into(),
                card: Some(p.clone()),
                assertion: Some(a.to_passkey_assertion()),
            }
            .sign(&rig.relay)
        };
        // The relay's word alone, and the relay turning Alice's Decline
        // into an Approve: refused, and the request stays held.
        let bare = decision(&rig.relay, &p, &digest, "alice", Verdict::Approved);
        let e = rig.approvals.decide(&bare).unwrap_err();
        assert!(
            matches!(e, DecideError::Person(ref a) if a.as_str() == "no_assertion"),
            "{e}"
        );
        let flipped = with(
            Verdict::Approved,
            &signed_by_alice(Verdict::Declined, &digest),
        );
        let e = rig.approvals.decide(&flipped).unwrap_err();
        assert!(
            matches!(e, DecideError::Person(ref a) if a.as_str() == "challenge_mismatch"),
            "{e}"
        );
        assert!(rig.approvals.holds(&p.proposal_id));
        // Alice's own approval releases it, in her name.
        let good = with(
            Verdict::Approved,
            &signed_by_alice(Verdict::Approved, &digest),
        );
        assert_eq!(rig.approvals.decide(&good), Ok(Verdict::Approved));
        let (outcome, record) = held.await.unwrap();
        assert_eq!(
            outcome,
            Outcome::Approved {
                approver: "alice".into()
            }
        );
        assert_eq!(record.approver.as_deref(), Some("alice"));
    }

    /// Both members of a pair hold the same first use; the person signs
    /// the one card (member A's). Member B takes the decision the relay
    /// signed for its own proposal only because the card is its own first
    /// use, checks Alice's assertion over that card itself, against the
    /// sign count its open listed (B has seen a higher count of hers
    /// since, on a card of its own); a card of another rule or attempt is
    /// refused `challenge_mismatch` however well signed.
    #[tokio::test(start_paused = true)]
    async fn another_members_card_answers_the_same_first_use_and_nothing_else() {
        use crate::session::person::Key;
        use talos_certs::webauthn::soft::{Authenticator, Ceremony};
        use talos_certs::webauthn::{decision_challenge, CoseAlgorithm, Expected};
        const RP_ID: &str = "people.talos.test";
        const ORIGIN: &str = "https://people.talos.test:8443";
        let alice = Authenticator::new(CoseAlgorithm::Es256);
        let people = |seen: u32| {
            People::new(
                RP_ID,
                ORIGIN,
                false,
                vec![Key {
                    owner: "alice".into(),
                    credential_id: alice.credential_id().to_vec(),
                    public_key_cose: alice.public_key_cose().to_vec(),
                    sign_count: seen,
                    opened_count: 0,
                }],
            )
            .unwrap()
        };
        // One relay signs for every member.
        let relay = GatewayKey::generate().unwrap();
        let member = |mode: &str, seen: u32| {
            let mut r = rig(mode);
            let (proposer, proposals) = Proposer::new();
            r.approvals = Arc::new(
                Approvals::new(vec![rule(mode)], Some(relay.public_key()), Some(proposer))
                    .with_people(people(seen)),
            );
            r.proposals = proposals;
            r
        };
        let mut a = member("first_use", 0);
        // B saw a count of 9 of Alice's already.
        let mut b = member("first_use", 9);
        let ended = CancellationToken::new();
        let held_a = a.hold(rule("first_use"), &ended);
        let held_b = b.hold(rule("first_use"), &ended);
        let card = a.taken().await;
        let mine = b.taken().await;
        assert_ne!(card.digest, mine.digest);
        let signed = |over: &str, count: u32| {
            alice.assert(
                &Ceremony::get(&Expected {
                    challenge: &decision_challenge(over, Verdict::Approved),
                    rp_id: RP_ID,
                    origin: ORIGIN,
                })
                .sign_count(count),
            )
        };
        // The relay's decision for `to` carrying `card` and Alice's
        // assertion over it.
        let relayed = |to: &Taken, card: &Proposal, count: u32| {
            let over = talos_certs::proposal_digest(card, &talos_certs::sentence(card));
            Decision {
                proposal_id: to.proposal.proposal_id.clone(),
                proposal_digest: to.digest.clone(),
                approver: "alice".into(),
                decision: Verdict::Approved,
                decided_at: "2026-11-29T10:00:00.000Z".into(),
                card: Some(card.clone()),
                assertion: Some(signed(&over, count).to_passkey_assertion()),
            }
            .sign(&relay)
        };
        // Another rule's card, or another attempt's, signed by Alice all
        // the same: refused by B, which still holds its request.
        for change in [
            (|c: &mut Proposal| c.rule = "lock-2".into()) as fn(&mut Proposal),
            |c: &mut Proposal| c.attempt = 2,
            |c: &mut Proposal| c.session_id = "sbx-2".into(),
        ] {
            let mut other = card.proposal.clone();
            change(&mut other);
            let e = b.approvals.decide(&relayed(&mine, &other, 5)).unwrap_err();
            assert!(
                matches!(e, DecideError::Person(ref a) if a.as_str() == "challenge_mismatch"),
                "{e}"
            );
        }
        assert!(b.approvals.holds(&mine.proposal.proposal_id));
        // The card itself, sign count 5: A takes it as its own card; B,
        // which has seen 9, as the same first use's card.
        assert_eq!(
            a.approvals.decide(&relayed(&card, &card.proposal, 5)),
            Ok(Verdict::Approved)
        );
        assert_eq!(
            b.approvals.decide(&relayed(&mine, &card.proposal, 5)),
            Ok(Verdict::Approved)
        );
        let (outcome_a, record_a) = held_a.await.unwrap();
        let (outcome_b, record_b) = held_b.await.unwrap();
        for o in [outcome_a, outcome_b] {
            assert_eq!(
                o,
                Outcome::Approved {
                    approver: "alice".into()
                }
            );
        }
        assert_eq!(record_a.card, None);
        assert_eq!(
            record_b.card.as_deref(),
            Some(card.proposal.proposal_id.as_str())
        );
        // Both count the first use as done.
        for m in [&a, &b] {
            assert!(m.approvals.rule_for(&ask(&m.dest)).is_none());
        }
        // On a card of its own, B still wants a count above the highest
        // it saw: 5 is a replay there.
        let mut c = member("every_request", 9);
        let held_c = c.hold(rule("every_request"), &ended);
        let own = c.taken().await;
        let own_relayed = |count: u32| {
            let over = own.digest.clone();
            Decision {
                proposal_id: own.proposal.proposal_id.clone(),
                proposal_digest: own.digest.clone(),
                approver: "alice".into(),
                decision: Verdict::Approved,
                decided_at: "2026-11-29T10:00:00.000Z".into(),
                card: Some(own.proposal.clone()),
                assertion: Some(signed(&over, count).to_passkey_assertion()),
            }
            .sign(&relay)
        };
        let e = c.approvals.decide(&own_relayed(5)).unwrap_err();
        assert!(
            matches!(e, DecideError::Person(ref a) if a.as_str() == "sign_count_replayed"),
            "{e}"
        );
        assert_eq!(c.approvals.decide(&own_relayed(10)), Ok(Verdict::Approved));
        held_c.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn no_decision_in_five_minutes_declines() {
        let mut rig = rig("every_request");
        let ended = CancellationToken::new();
        let held = rig.hold(rule("every_request"), &ended);
        let Taken { proposal: p, .. } = rig.taken().await;
        assert!(p.expires_at > p.created_at);
        tokio::time::advance(DECISION_TIMEOUT - Duration::from_secs(1)).await;
        assert_eq!(rig.approvals.pending_count(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        let (outcome, record) = held.await.unwrap();
        assert_eq!(outcome, Outcome::TimedOut);
        assert_eq!(record.decision, "timed_out");
        assert_eq!(rig.approvals.pending_count(), 0);
    }

    #[tokio::test]
    async fn a_closed_lock_withdraws_what_it_holds_and_holds_nothing_more() {
        let mut rig = rig("every_request");
        let ended = CancellationToken::new();
        let first = rig.hold(rule("every_request"), &ended);
        let Taken { proposal: p, .. } = rig.taken().await;
        assert!(rig.approvals.holds(&p.proposal_id));
        assert_eq!(rig.approvals.close(), 1);
        assert_eq!(first.await.unwrap().0, Outcome::Withdrawn);
        // Closed: withdrawn at once, and no proposal goes to the relay.
        let later = rig.hold(rule("every_request"), &ended);
        assert_eq!(later.await.unwrap().0, Outcome::Withdrawn);
        assert!(rig.proposals.try_recv().is_err(), "no card");
        // The authority's end counts both.
        assert_eq!(rig.approvals.withdraw_all(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_withdraws_and_a_late_decision_finds_nothing() {
        let mut rig = rig("every_request");
        let ended = CancellationToken::new();
        let held = rig.hold(rule("every_request"), &ended);
        let Taken {
            proposal: p,
            digest,
            ..
        } = rig.taken().await;
        tokio::time::advance(Duration::from_secs(60)).await;
        // The session pauses: the authority withdraws and ends, as
        // `Session::end_and_withdraw` does.
        assert_eq!(rig.approvals.withdraw_all(), 1);
        ended.cancel();
        let (outcome, _) = held.await.unwrap();
        assert_eq!(outcome, Outcome::Withdrawn);
        let late = decision(&rig.relay, &p, &digest, "alice", Verdict::Approved);
        assert_eq!(rig.approvals.decide(&late), Err(DecideError::NotPending));
    }

    #[tokio::test(start_paused = true)]
    async fn first_use_asks_once_every_request_asks_every_time() {
        for (mode, asks) in [("first_use", 1), ("every_request", 3)] {
            let mut rig = rig(mode);
            let ended = CancellationToken::new();
            let mut asked = 0;
            for _ in 0..3 {
                let Some(r) = rig.approvals.rule_for(&ask(&rig.dest)).cloned() else {
                    continue;
                };
                asked += 1;
                let held = rig.hold(r, &ended);
                let Taken {
                    proposal: p,
                    digest,
                    ..
                } = rig.taken().await;
                let d = decision(&rig.relay, &p, &digest, "bob", Verdict::Approved);
                assert_eq!(rig.approvals.decide(&d), Ok(Verdict::Approved));
                let (outcome, record) = held.await.unwrap();
                assert_eq!(
                    outcome,
                    Outcome::Approved {
                        approver: "bob".into()
                    }
                );
                assert_eq!(record.approver.as_deref(), Some("bob"));
            }
            assert_eq!(asked, asks, "{mode}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_digest_forged_signature_or_unlisted_approver_change_nothing() {
        let mut rig = rig("every_request");
        let ended = CancellationToken::new();
        let held = rig.hold(rule("every_request"), &ended);
        let Taken {
            proposal: p,
            sentence,
            digest,
        } = rig.taken().await;
        assert_eq!(talos_certs::sentence(&p), sentence);
        assert_eq!(talos_certs::proposal_digest(&p, &sentence), digest);
        let forger = GatewayKey::generate().unwrap();
        let cases = [
            (
                decision(&rig.relay, &p, &"0".repeat(96), "alice", Verdict::Approved),
                DecideError::WrongDigest,
            ),
            (
                decision(&forger, &p, &digest, "alice", Verdict::Approved),
                DecideError::BadSignature(String::new()),
            ),
            (
                decision(&rig.relay, &p, &digest, "mallory", Verdict::Approved),
                DecideError::NotListed,
            ),
        ];
        for (signed, want) in cases {
            let got = rig.approvals.decide(&signed).unwrap_err();
            assert_eq!(
                std::mem::discriminant(&got),
                std::mem::discriminant(&want),
                "{got}"
            );
            assert_eq!(rig.approvals.pending_count(), 1, "nothing changed");
        }
        let d = decision(&rig.relay, &p, &digest, "alice", Verdict::Declined);
        assert_eq!(rig.approvals.decide(&d), Ok(Verdict::Declined));
        let (outcome, _) = held.await.unwrap();
        assert_eq!(
            outcome,
            Outcome::Declined {
                approver: "alice".into()
            }
        );
        // Decided once: a second decision finds nothing.
        assert_eq!(rig.approvals.decide(&d), Err(DecideError::NotPending));
    }

    /// A hold the relay makes no card for ends at once when the relay
    /// refuses the proposal or the deliverer gives it up, and after
    /// [`DELIVERY_TIMEOUT`] when the relay does not take it; the
    /// deliverer then sees nobody waits for it.
    #[tokio::test(start_paused = true)]
    async fn a_proposal_the_relay_does_not_take_ends_its_hold_without_waiting_for_a_decision() {
        for (delivery, want) in [
            (Some(Delivery::Refused), Outcome::RelayRefused),
            (None, Outcome::RelayUnreachable),
        ] {
            let mut rig = rig("every_request");
            let start = tokio::time::Instant::now();
            let held = rig.hold(rule("every_request"), &CancellationToken::new());
            let p = rig.proposals.recv().await.unwrap();
            match delivery {
                Some(d) => p.delivered.send(d).unwrap(),
                None => drop(p),
            }
            let (outcome, record) = held.await.unwrap();
            assert_eq!(outcome, want);
            assert_eq!(record.decision, want.as_str());
            assert_eq!(start.elapsed(), Duration::ZERO, "no timer ran out");
            assert_eq!(rig.approvals.pending_count(), 0);
        }

        let mut rig = rig("every_request");
        let held = rig.hold(rule("every_request"), &CancellationToken::new());
        let p = rig.proposals.recv().await.unwrap();
        tokio::time::advance(DELIVERY_TIMEOUT - Duration::from_secs(1)).await;
        assert_eq!(rig.approvals.pending_count(), 1);
        assert!(!p.delivered.is_closed());
        tokio::time::advance(Duration::from_secs(2)).await;
        let (outcome, record) = held.await.unwrap();
        assert_eq!(outcome, Outcome::RelayUnreachable);
        assert_eq!(record.decision, "relay_unreachable");
        assert!(p.delivered.is_closed(), "the deliverer can stop trying");
    }

    /// Every request of the contract's shared table: held or not as the
    /// relay judges it, and proposed with its canonical path.
    #[tokio::test(start_paused = true)]
    async fn the_shared_lock_cases_are_held_and_proposed_with_their_canonical_paths() {
        use talos_contract::cases::{self, LOCK_CASES};
        let relay = GatewayKey::generate().unwrap();
        let (proposer, mut proposals) = Proposer::new();
        let approvals = Approvals::new(
            vec![cases::lock_rule()],
            Some(relay.public_key()),
            Some(proposer),
        )
        .with_people(People::lab());
        let dest = name::canonicalize(cases::LOCK_DESTINATION).unwrap();
        for c in LOCK_CASES {
            let path = RoutedPath::new(c.path);
            let ask = Ask {
                method: c.method,
                path: &path,
                attachments: Vec::new(),
                ..ask(&dest)
            };
            let Some(rule) = approvals.rule_for(&ask).cloned() else {
                assert!(!c.held, "{c:?} is not held");
                continue;
            };
            assert!(c.held, "{c:?} is held");
            let ended = CancellationToken::new();
            let hold = approvals.hold(&rule, &ask, &ended, DECISION_TIMEOUT);
            let relay_side = async {
                let p = proposals.recv().await.unwrap();
                assert_eq!(p.proposal.path, c.canonical, "{c:?}");
                assert!(
                    p.sentence
                        .contains(&format!("{} {} to", c.method, c.canonical)),
                    "{c:?}: {}",
                    p.sentence
                );
                p.delivered.send(Delivery::Refused).unwrap();
            };
            let ((outcome, _), ()) = tokio::join!(hold, relay_side);
            assert_eq!(outcome, Outcome::RelayRefused);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_relay_a_held_request_is_declined_at_once() {
        let approvals = Approvals::new(vec![rule("every_request")], None, None);
        let dest = name::canonicalize("api.example.com").unwrap();
        let (outcome, _) = approvals
            .hold(
                &rule("every_request"),
                &ask(&dest),
                &CancellationToken::new(),
                DECISION_TIMEOUT,
            )
            .await;
        assert_eq!(outcome, Outcome::NoRelay);
    }
}
