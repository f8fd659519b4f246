//! Screenshots for the docs, made by the same driver the tests use: each
//! shot is numbered in the order taken (`01-NAME.png`, …) and is taken
//! only of a page that passes the checks the tests make (no serious
//! accessibility violation, no console error, exception or CSP violation),
//! so a picture in the docs is of a page that works.
//!
//! `tests/src/bin/people-screenshots.rs` (run by
//! `scripts/people-screenshots.sh OUT_DIR`) drives the scenarios; a page
//! that wants its picture adds steps there.

use std::path::{Path, PathBuf};

use super::page::Page;
use super::png::PngInfo;
use super::Error;

/// Numbered screenshots written into one folder.
#[derive(Debug)]
pub struct Shots {
    dir: PathBuf,
    taken: Vec<(PathBuf, PngInfo)>,
}

impl Shots {
    /// Write into `dir` (made if missing).
    pub fn new(dir: &Path) -> Result<Shots, Error> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Page(format!("making {}: {e}", dir.display())))?;
        Ok(Shots {
            dir: dir.to_owned(),
            taken: Vec::new(),
        })
    }

    /// Check `page` (axe: nothing serious or critical; no problem
    /// reported), wait for its fonts, and write what it shows to
    /// `NN-name.png`; the file's path.
    pub async fn take(&mut self, page: &Page, name: &str) -> Result<PathBuf, Error> {
        let report = page.axe().await?;
        let serious = report.serious();
        if !serious.is_empty() {
            return Err(Error::Page(format!(
                "{name}: axe found serious violations on {}:\n{}",
                report.url,
                serious.iter().map(|v| v.to_string()).collect::<String>()
            )));
        }
        let problems = page.problems();
        if !problems.is_empty() {
            return Err(Error::Page(format!(
                "{name}: the page reported problems:\n{}",
                problems
                    .iter()
                    .map(|p| format!("  {p}\n"))
                    .collect::<String>()
            )));
        }
        page.evaluate("document.fonts.ready.then(() => true)")
            .await?;
        let path = self
            .dir
            .join(format!("{:02}-{name}.png", self.taken.len() + 1));
        let info = page.screenshot(&path).await?;
        self.taken.push((path.clone(), info));
        Ok(path)
    }

    /// What was written, in order, with each picture's size.
    pub fn taken(&self) -> &[(PathBuf, PngInfo)] {
        &self.taken
    }
}
