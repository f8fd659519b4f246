//! The accessibility check: axe-core, run inside the page in the same
//! Chromium.
//!
//! axe-core comes from the npm registry, pinned ([`VERSION`]), installed by
//! `scripts/install-ops-tools.sh` into `.tools/axe-core/` (gitignored). It
//! is put into the page with `Runtime.evaluate` of its source: DevTools
//! evaluation is not governed by the page's Content-Security-Policy (the
//! page under test keeps its strict `script-src 'self'`, and the test
//! `axe_finds_a_planted_violation_and_passes_a_good_page` in
//! `tests/tests/browser.rs` checks axe runs there and adds
//! no violation). [`Report::assert_no_serious`] fails a test on any
//! `serious` or `critical` violation, naming each rule and the nodes.

use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

use super::page::Page;
use super::Error;

/// The axe-core release the install script fetches and the tests expect.
pub const VERSION: &str = "4.14.1";

/// How serious axe judges a violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Impact {
    Minor,
    Moderate,
    Serious,
    Critical,
}

impl Impact {
    fn parse(s: &str) -> Option<Impact> {
        match s {
            "minor" => Some(Impact::Minor),
            "moderate" => Some(Impact::Moderate),
            "serious" => Some(Impact::Serious),
            "critical" => Some(Impact::Critical),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Impact::Minor => "minor",
            Impact::Moderate => "moderate",
            Impact::Serious => "serious",
            Impact::Critical => "critical",
        }
    }
}

/// One element a rule failed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// CSS selectors that reach the element.
    pub target: Vec<String>,
    /// The element's opening HTML, as axe quotes it.
    pub html: String,
    /// What to fix, in axe's words.
    pub failure_summary: String,
}

/// One rule the page breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// axe's rule id (`color-contrast`, `label`, `image-alt`, …).
    pub id: String,
    /// `None` if axe gave none (it always does for violations).
    pub impact: Option<Impact>,
    pub help: String,
    pub help_url: String,
    pub nodes: Vec<Node>,
}

/// What axe found on a page.
#[derive(Debug, Clone)]
pub struct Report {
    /// The page checked.
    pub url: String,
    /// axe's own version, as it reports it.
    pub axe_version: String,
    pub violations: Vec<Violation>,
    /// How many rules passed.
    pub passes: usize,
    /// Rules axe could not decide alone (for a person to look at).
    pub incomplete: Vec<String>,
}

impl Report {
    /// The violations of impact `serious` or `critical`.
    pub fn serious(&self) -> Vec<&Violation> {
        self.violations
            .iter()
            .filter(|v| v.impact >= Some(Impact::Serious))
            .collect()
    }

    /// Panic, naming each rule and its nodes, if any violation is serious
    /// or critical.
    pub fn assert_no_serious(&self) {
        let serious = self.serious();
        assert!(
            serious.is_empty(),
            "axe {} found {} serious or critical violation(s) on {}:\n{}",
            self.axe_version,
            serious.len(),
            self.url,
            serious
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  {} ({}): {} <{}>",
            self.id,
            self.impact.map_or("no impact", Impact::as_str),
            self.help,
            self.help_url
        )?;
        for n in &self.nodes {
            writeln!(f, "    {}  {}", n.target.join(" "), n.html)?;
            for line in n.failure_summary.lines() {
                writeln!(f, "      {line}")?;
            }
        }
        Ok(())
    }
}

/// Where the installed `axe.min.js` is: `TALOS_AXE_JS` if set, else
/// `.tools/axe-core/node_modules/axe-core/axe.min.js` in this checkout.
pub fn script_path() -> PathBuf {
    if let Some(p) = std::env::var_os("TALOS_AXE_JS") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.tools/axe-core/node_modules/axe-core/axe.min.js")
}

/// axe-core's source, checked to be the pinned release.
fn source() -> Result<String, Error> {
    let path = script_path();
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Error::Page(format!(
            "axe-core is not installed ({}: {e}): scripts/install-ops-tools.sh installs it",
            path.display()
        ))
    })?;
    if text.lines().next() != Some(&format!("/*! axe v{VERSION}")) {
        return Err(Error::Page(format!(
            "{} is not axe-core {VERSION}: run scripts/install-ops-tools.sh again",
            path.display()
        )));
    }
    Ok(text)
}

/// The script that runs axe on the whole document and keeps what the
/// report needs.
const RUN: &str = r#"axe.run(document, {resultTypes: ['violations']}).then(r => ({
    url: r.url,
    version: r.testEngine.version,
    passes: r.passes.length,
    incomplete: r.incomplete.map(v => v.id),
    violations: r.violations.map(v => ({
        id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
        nodes: v.nodes.map(n => ({
            target: n.target.map(String), html: n.html, failureSummary: n.failureSummary || ''
        }))
    }))
}))"#;

impl Page {
    /// Run axe-core on the page as it is now (injecting it first if this
    /// document has not got it yet).
    pub async fn axe(&self) -> Result<Report, Error> {
        let present = self
            .evaluate("typeof window.axe === 'object' && typeof window.axe.run === 'function'")
            .await?;
        if present != true {
            // The source's value (the axe object) is not wanted: `void`.
            let src = source()?;
            self.evaluate(&format!("{src}\n;void 0")).await?;
        }
        let r = self.evaluate(RUN).await?;
        let str_of = |v: &Value| v.as_str().unwrap_or("").to_owned();
        let violations = r["violations"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|v| Violation {
                id: str_of(&v["id"]),
                impact: v["impact"].as_str().and_then(Impact::parse),
                help: str_of(&v["help"]),
                help_url: str_of(&v["helpUrl"]),
                nodes: v["nodes"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|n| Node {
                        target: n["target"]
                            .as_array()
                            .map(Vec::as_slice)
                            .unwrap_or_default()
                            .iter()
                            .map(str_of)
                            .collect(),
                        html: str_of(&n["html"]),
                        failure_summary: str_of(&n["failureSummary"]),
                    })
                    .collect(),
            })
            .collect();
        Ok(Report {
            url: str_of(&r["url"]),
            axe_version: str_of(&r["version"]),
            violations,
            passes: r["passes"].as_u64().unwrap_or(0) as usize,
            incomplete: r["incomplete"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(str_of)
                .collect(),
        })
    }
}
