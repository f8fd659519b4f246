//! Every cause word the gateway can record is listed in `docs/records.md`,
//! and every word listed there is one the gateway can record.

use std::collections::BTreeSet;

use talos_gateway::gate::classify::Internal;
use talos_gateway::gate::hello::Cause as HelloCause;
use talos_gateway::gate::resolve::ResolveFailure;
use talos_gateway::secrets::reply::ReplyRefusal;
use talos_gateway::session::share::Bound;
use talos_gateway::session::upstream::ConnectFailure;

fn causes() -> BTreeSet<&'static str> {
    let mut all = BTreeSet::new();
    all.extend(HelloCause::EXAMPLES.iter().map(|c| c.as_str()));
    all.extend(talos_gateway::conn::Cause::ALL.iter().map(|c| c.as_str()));
    all.extend(
        talos_gateway::http::proxy::Cause::ALL
            .iter()
            .map(|c| c.as_str()),
    );
    all.extend(Internal::ALL.iter().map(|c| c.cause()));
    all.extend(ResolveFailure::ALL.iter().map(|c| c.as_str()));
    all.extend(ConnectFailure::ALL.iter().map(|c| c.as_str()));
    all.extend(ReplyRefusal::ALL.iter().map(|c| c.as_str()));
    all.extend(Bound::ALL.iter().map(|c| c.as_str()));
    all
}

#[test]
fn records_doc_lists_every_cause_and_no_other() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/records.md"))
        .expect("docs/records.md");
    let section = doc
        .split("### Causes")
        .nth(1)
        .expect("docs/records.md has a Causes section");
    let table: String = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.rsplit('|').nth(1).unwrap_or("").to_owned() + " ")
        .collect();
    let listed: BTreeSet<&str> = table.split('`').skip(1).step_by(2).collect();
    let known = causes();
    let missing: Vec<_> = known.iter().filter(|c| !listed.contains(**c)).collect();
    let unknown: Vec<_> = listed.iter().filter(|c| !known.contains(**c)).collect();
    assert!(
        missing.is_empty(),
        "causes not in docs/records.md: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "docs/records.md lists unknown causes: {unknown:?}"
    );
}
