//! The capacity bench's figures (`benches/capacity/run.sh`), from the raw
//! readings its work folder keeps:
//!
//! - `run.env`: the facts of the run (`KEY=VALUE` lines).
//! - `runs/N.R.phases`: one run of N sessions (repeat R) on a fresh
//!   member, one line per phase: `PHASE TICKS RSS_KIB SECONDS ANSWER`,
//!   where TICKS is the gateway's CPU time over the phase (clock ticks,
//!   `/proc/PID/stat`), RSS_KIB its `VmRSS` after the phase, SECONDS the
//!   phase's wall time as the shell saw it, and ANSWER the driver's JSON
//!   answer (`src/bin/capacity-driver.rs`). Phases: `base` (after
//!   the warm-up: one session opened, used and closed), `open`, `touch`,
//!   `idle` (nothing asked for a while; the answer is a `status`), `renew`,
//!   `close`.
//! - `ab/WL.res`: the per-request rounds, member A (1 session) against
//!   member B (many), as `benches/load/gateway-ab.sh` writes them
//!   (`round R T: CPU-PER-1K RATE`); `ab/WL.R.T.out`, h2load's output of
//!   each; `ab/status`: `TAG RSS_KIB ANSWER` of each member after the rounds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{ab_summary, fixed, Run, RunEnv};

/// One phase of a run.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: String,
    /// The gateway's CPU time over the phase, clock ticks.
    pub ticks: f64,
    /// The gateway's resident memory after the phase, KiB.
    pub rss_kib: f64,
    /// The phase's wall time, seconds, as the shell saw it.
    pub seconds: f64,
    /// The driver's answer.
    pub said: Value,
}

impl Phase {
    /// `PHASE TICKS RSS_KIB SECONDS ANSWER`.
    pub fn parse(line: &str) -> Result<Phase, String> {
        let mut it = line.splitn(5, ' ');
        let mut next = |what: &str| it.next().ok_or_else(|| format!("no {what} in {line:?}"));
        let name = next("phase")?.to_owned();
        let num = |s: &str| {
            s.parse::<f64>()
                .map_err(|_| format!("{s:?} is not a number in {line:?}"))
        };
        let ticks = num(next("ticks")?)?;
        let rss_kib = num(next("rss")?)?;
        let seconds = num(next("seconds")?)?;
        let said = serde_json::from_str(next("answer")?)
            .map_err(|e| format!("the answer in {line:?}: {e}"))?;
        Ok(Phase {
            name,
            ticks,
            rss_kib,
            seconds,
            said,
        })
    }

    /// A number in the driver's answer (0 if missing).
    pub fn n(&self, key: &str) -> f64 {
        self.said.get(key).and_then(Value::as_f64).unwrap_or(0.0)
    }
}

/// One run: N sessions opened, touched, renewed and closed on a fresh member.
#[derive(Debug, Clone)]
pub struct CapRun {
    /// The sessions asked for, and which repeat.
    pub n: u64,
    pub repeat: u64,
    pub phases: Vec<Phase>,
}

/// The figures of one run; `None` where the run has no such phase.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFigures {
    pub opened: f64,
    pub base_mib: Option<f64>,
    pub idle_kib: Option<f64>,
    pub touched: f64,
    pub touched_kib: Option<f64>,
    pub closed_kib: Option<f64>,
    pub opens_per_s: Option<f64>,
    pub open_cpu_ms: Option<f64>,
    pub open_p99_ms: Option<f64>,
    pub first_conns_per_s: Option<f64>,
    pub first_conn_cpu_ms: Option<f64>,
    pub upkeep_ms_per_s: Option<f64>,
    pub renew_ms: Option<f64>,
    pub renew_cpu_ms: Option<f64>,
    pub closes_per_s: Option<f64>,
    pub close_cpu_ms: Option<f64>,
    pub close_p99_ms: Option<f64>,
}

impl CapRun {
    /// `runs/N.R.phases`.
    pub fn read(path: &Path) -> Result<CapRun, String> {
        let stem = path
            .file_name()
            .and_then(|f| f.to_str())
            .and_then(|f| f.strip_suffix(".phases"))
            .ok_or_else(|| format!("{}: not N.R.phases", path.display()))?;
        let (n, r) = stem
            .split_once('.')
            .and_then(|(n, r)| Some((n.parse().ok()?, r.parse().ok()?)))
            .ok_or_else(|| format!("{}: not N.R.phases", path.display()))?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let phases = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(Phase::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CapRun {
            n,
            repeat: r,
            phases,
        })
    }

    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// The run's figures; `tck` is the clock ticks per second.
    pub fn figures(&self, tck: f64) -> RunFigures {
        let mut f = RunFigures::default();
        let cpu_ms = |p: &Phase| p.ticks / tck * 1e3;
        let per = |v: f64, n: f64| (n > 0.0).then(|| v / n);
        let base = self.phase("base");
        let open = self.phase("open");
        f.base_mib = base.map(|b| b.rss_kib / 1024.0);
        if let Some(o) = open {
            f.opened = o.n("ok");
            f.opens_per_s = per(o.n("ok"), o.n("seconds"));
            f.open_cpu_ms = per(cpu_ms(o), o.n("ok"));
            f.open_p99_ms = Some(o.n("p99_ms"));
            if let Some(b) = base {
                f.idle_kib = per(o.rss_kib - b.rss_kib, f.opened);
            }
        }
        if let (Some(o), Some(t), Some(idle)) = (open, self.phase("touch"), f.idle_kib) {
            f.touched = t.n("sessions");
            f.touched_kib = per(t.rss_kib - o.rss_kib, f.touched).map(|d| idle + d);
            f.first_conns_per_s = per(t.n("connections"), t.n("seconds"));
            f.first_conn_cpu_ms = per(cpu_ms(t), t.n("connections"));
        }
        if let Some(i) = self.phase("idle") {
            f.upkeep_ms_per_s = per(cpu_ms(i), i.seconds);
        }
        if let Some(r) = self.phase("renew") {
            f.renew_ms = Some(r.n("seconds") * 1e3);
            f.renew_cpu_ms = Some(cpu_ms(r));
        }
        if let Some(c) = self.phase("close") {
            f.closes_per_s = per(c.n("ok"), c.n("seconds"));
            f.close_cpu_ms = per(cpu_ms(c), c.n("ok"));
            f.close_p99_ms = Some(c.n("p99_ms"));
            if let Some(b) = base {
                f.closed_kib = per(c.rss_kib - b.rss_kib, c.n("ok"));
            }
        }
        f
    }

    /// What went wrong in the run: failed calls or requests, sessions not
    /// opened or not closed, leases not renewed.
    pub fn check(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let at = format!("{} sessions, run {}", self.n, self.repeat);
        for p in &self.phases {
            if p.said.get("event").and_then(Value::as_str) == Some("error") {
                bad.push(format!("{at}, {}: {}", p.name, p.said["error"]));
            }
            if p.n("failed") > 0.0 {
                bad.push(format!(
                    "{at}, {}: {} failed ({})",
                    p.name,
                    p.n("failed"),
                    p.said["first_error"]
                ));
            }
            if p.n("not_held") > 0.0 {
                bad.push(format!(
                    "{at}, {}: {} leases not held",
                    p.name,
                    p.n("not_held")
                ));
            }
            let bg = &p.said["background_renewals"];
            let bgn = |k: &str| bg.get(k).and_then(Value::as_f64).unwrap_or(0.0);
            if bgn("not_held") > 0.0 || bgn("errors") > 0.0 {
                bad.push(format!(
                    "{at}, {}: background renewals: {} not held, {} failed calls",
                    p.name,
                    bgn("not_held"),
                    bgn("errors")
                ));
            }
        }
        match self.phase("open") {
            Some(o) if o.n("ok") as u64 == self.n => {}
            Some(o) => bad.push(format!("{at}: {} of {} sessions opened", o.n("ok"), self.n)),
            None => bad.push(format!("{at}: no open phase")),
        }
        if let Some(c) = self.phase("close") {
            if c.n("ok") as u64 != self.n {
                bad.push(format!("{at}: {} of {} sessions closed", c.n("ok"), self.n));
            }
        }
        bad
    }
}

/// The capacity bench's work folder.
#[derive(Debug)]
pub struct Capacity {
    dir: PathBuf,
    env: RunEnv,
    runs: Vec<CapRun>,
}

/// `v` as a cell: one value, or the lowest and highest of the runs.
pub fn spread(v: &[f64], decimals: usize) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (fixed(lo, decimals), fixed(hi, decimals));
    if a == b {
        a
    } else {
        format!("{a}–{b}")
    }
}

impl Capacity {
    pub fn open(dir: &Path) -> Result<Capacity, String> {
        let env = RunEnv::read(&dir.join("run.env"))?;
        let mut runs = Vec::new();
        if let Ok(rd) = std::fs::read_dir(dir.join("runs")) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().ends_with(".phases") {
                    runs.push(CapRun::read(&e.path())?);
                }
            }
        }
        runs.sort_by_key(|r| (r.n, r.repeat));
        Ok(Capacity {
            dir: dir.to_path_buf(),
            env,
            runs,
        })
    }

    fn counts(&self) -> Vec<u64> {
        let mut c: Vec<u64> = self.runs.iter().map(|r| r.n).collect();
        c.dedup();
        c
    }

    /// Each run's figures, by count.
    fn by_count(&self) -> BTreeMap<u64, Vec<RunFigures>> {
        let tck = self.env.tck();
        let mut m: BTreeMap<u64, Vec<RunFigures>> = BTreeMap::new();
        for r in &self.runs {
            m.entry(r.n).or_default().push(r.figures(tck));
        }
        m
    }

    /// KiB per session between the smallest and the largest count, run by
    /// run (one-time costs cancel): (idle, touched) of each repeat both
    /// counts have.
    pub fn slopes(&self) -> Vec<(u64, f64, Option<f64>)> {
        let counts = self.counts();
        let (Some(&lo), Some(&hi)) = (counts.first(), counts.last()) else {
            return Vec::new();
        };
        if lo == hi {
            return Vec::new();
        }
        let tck = self.env.tck();
        let at = |n: u64, r: u64| self.runs.iter().find(|x| x.n == n && x.repeat == r);
        let mut out = Vec::new();
        for run in self.runs.iter().filter(|x| x.n == hi) {
            let Some(low) = at(lo, run.repeat) else {
                continue;
            };
            let rss = |x: &CapRun, p: &str| Some(x.phase(p)?.rss_kib - x.phase("base")?.rss_kib);
            let (Some(i1), Some(i0)) = (rss(run, "open"), rss(low, "open")) else {
                continue;
            };
            let (f1, f0) = (run.figures(tck), low.figures(tck));
            let idle = (i1 - i0) / (f1.opened - f0.opened);
            // Touched: only when every session of both was touched.
            let touched = match (rss(run, "touch"), rss(low, "touch")) {
                (Some(t1), Some(t0)) if f1.touched == f1.opened && f0.touched == f0.opened => {
                    Some((t1 - t0) / (f1.opened - f0.opened))
                }
                _ => None,
            };
            out.push((run.repeat, idle, touched));
        }
        out
    }

    /// The report: the memory table, the control channel's and the first
    /// connections' table, the slopes, and the per-request comparison.
    pub fn table(&self) -> String {
        let e = &self.env;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "\n{}, {} CPUs, {}, gateway with {} runtime worker(s); each session 3 names, {} attachment(s); \
             OpenSession/CloseSession {} in flight, first connections {} at once; lease {} ms renewed every {} ms\n",
            e.get("date"),
            e.get("nproc"),
            e.get("cpu"),
            e.get("workers"),
            e.get("attach"),
            e.get("conc"),
            e.get("touch_conc"),
            e.get("lease_ms"),
            e.get("renew_ms"),
        );
        let by = self.by_count();
        if !by.is_empty() {
            o.push_str(
                "| open sessions | runs | RSS before, MiB | idle, KiB per session | touched: sessions | \
                 touched, KiB per session | after closing all, KiB per session |\n\
                 |---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for (n, fs) in &by {
                let col = |f: fn(&RunFigures) -> Option<f64>| -> Vec<f64> {
                    fs.iter().filter_map(f).collect()
                };
                let touched: Vec<f64> = fs.iter().map(|f| f.touched).collect();
                let _ = writeln!(
                    o,
                    "| {n} | {} | {} | {} | {} | {} | {} |",
                    fs.len(),
                    spread(&col(|f| f.base_mib), 1),
                    spread(&col(|f| f.idle_kib), 1),
                    spread(&touched, 0),
                    spread(&col(|f| f.touched_kib), 1),
                    spread(&col(|f| f.closed_kib), 1),
                );
            }
            o.push('\n');
            o.push_str(
                "| open sessions | OpenSession/s | CPU-ms per open | open p99, ms | CloseSession/s | \
                 CPU-ms per close | close p99, ms | RenewLeases of all, ms | its CPU-ms | \
                 first connections/s | CPU-ms per first connection | idle upkeep, CPU-ms per s |\n\
                 |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for (n, fs) in &by {
                let col = |f: fn(&RunFigures) -> Option<f64>| -> Vec<f64> {
                    fs.iter().filter_map(f).collect()
                };
                let _ = writeln!(
                    o,
                    "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    spread(&col(|f| f.opens_per_s), 0),
                    spread(&col(|f| f.open_cpu_ms), 2),
                    spread(&col(|f| f.open_p99_ms), 1),
                    spread(&col(|f| f.closes_per_s), 0),
                    spread(&col(|f| f.close_cpu_ms), 2),
                    spread(&col(|f| f.close_p99_ms), 1),
                    spread(&col(|f| f.renew_ms), 1),
                    spread(&col(|f| f.renew_cpu_ms), 0),
                    spread(&col(|f| f.first_conns_per_s), 0),
                    spread(&col(|f| f.first_conn_cpu_ms), 2),
                    spread(&col(|f| f.upkeep_ms_per_s), 1),
                );
            }
            let slopes = self.slopes();
            if !slopes.is_empty() {
                let counts = self.counts();
                let idle: Vec<f64> = slopes.iter().map(|s| s.1).collect();
                let touched: Vec<f64> = slopes.iter().filter_map(|s| s.2).collect();
                let _ = writeln!(
                    o,
                    "\nPer session from {} to {} sessions (one-time costs cancel): idle {} KiB, touched {} KiB ({} run(s))",
                    counts[0],
                    counts[counts.len() - 1],
                    spread(&idle, 1),
                    spread(&touched, 1),
                    slopes.len(),
                );
            }
        }
        for wl in self.ab_workloads() {
            let rounds = std::fs::read_to_string(self.dir.join("ab").join(format!("{wl}.res")))
                .unwrap_or_default();
            let unit = if wl.as_str() == "h1" {
                "HTTP/1.1, h2load --h1 -c32 -m1"
            } else {
                "HTTP/2, h2load -c8 -m32"
            };
            let _ = writeln!(
                o,
                "\nPer request, {unit}: A = 1 session open, B = {} sessions open; CPU-s per 1k requests",
                e.get("ab_sessions")
            );
            match ab_summary(&rounds, &wl) {
                Ok(s) => o.push_str(&s),
                Err(err) => {
                    let _ = writeln!(o, "  {err}");
                }
            }
        }
        o
    }

    /// The workloads of the per-request comparison, as run.
    fn ab_workloads(&self) -> Vec<String> {
        self.env
            .list("workloads")
            .into_iter()
            .filter(|wl| self.dir.join("ab").join(format!("{wl}.res")).exists())
            .collect()
    }

    /// What went wrong anywhere: every run's [`CapRun::check`], every
    /// h2load run of the comparison that failed a request or got none
    /// through, and leases the members did not keep.
    pub fn check(&self) -> Vec<String> {
        let mut bad: Vec<String> = self.runs.iter().flat_map(CapRun::check).collect();
        let ab = self.dir.join("ab");
        if let Ok(rd) = std::fs::read_dir(&ab) {
            let mut outs: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "out"))
                .collect();
            outs.sort();
            for p in outs {
                let r = Run::read(&p);
                if r.errors > 0.0 || r.requests == 0.0 {
                    bad.push(format!(
                        "{}: {} requests, {} failed",
                        p.file_name().unwrap_or_default().to_string_lossy(),
                        r.requests,
                        r.errors
                    ));
                }
            }
        }
        if let Ok(text) = std::fs::read_to_string(ab.join("status")) {
            for l in text.lines() {
                let mut it = l.splitn(3, ' ');
                let (tag, _, said) = (it.next(), it.next(), it.next());
                let v: Value = said
                    .and_then(|s| serde_json::from_str(s).ok())
                    .unwrap_or(Value::Null);
                let bg = &v["background_renewals"];
                let n = |k: &str| bg.get(k).and_then(Value::as_f64).unwrap_or(-1.0);
                if n("not_held") != 0.0 || n("errors") != 0.0 {
                    bad.push(format!(
                        "member {}: background renewals {bg} (want none not held, none failed)",
                        tag.unwrap_or("?")
                    ));
                }
            }
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(p: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(p)
    }

    #[test]
    fn a_phase_line() {
        let p = Phase::parse(r#"open 250 40960 3.5 {"event":"opened","ok":1000,"seconds":3.2}"#)
            .unwrap();
        assert_eq!(
            (p.name.as_str(), p.ticks, p.rss_kib, p.seconds),
            ("open", 250.0, 40960.0, 3.5)
        );
        assert_eq!(p.n("ok"), 1000.0);
        assert_eq!(p.n("missing"), 0.0);
        assert!(Phase::parse("open 1 2").is_err());
        assert!(Phase::parse("open x 2 3 {}").is_err());
        assert!(Phase::parse("open 1 2 3 not-json").is_err());
    }

    /// Every figure from made-up readings, worked by hand.
    #[test]
    fn figures_of_a_run() {
        let run = CapRun {
            n: 1000,
            repeat: 1,
            phases: [
                r#"base 0 20480 0.1 {"event":"warm","ok":3,"failed":0}"#,
                r#"open 200 40960 2.1 {"event":"opened","ok":1000,"failed":0,"seconds":2.0,"p99_ms":3.5}"#,
                r#"touch 600 81920 10.2 {"event":"touched","sessions":500,"connections":1500,"ok":1500,"failed":0,"seconds":10.0}"#,
                r#"idle 50 81920 20.0 {"event":"status","open":1000}"#,
                r#"renew 1 81920 0.02 {"event":"renewed","n":1000,"renewed":1000,"not_held":0,"seconds":0.015}"#,
                r#"close 400 30720 4.1 {"event":"closed","n":1000,"ok":1000,"failed":0,"seconds":4.0,"p99_ms":9.25}"#,
            ]
            .iter()
            .map(|l| Phase::parse(l).unwrap())
            .collect(),
        };
        let f = run.figures(100.0);
        assert_eq!(f.base_mib, Some(20.0));
        assert_eq!(f.idle_kib, Some(20.48));
        // 500 of 1000 touched: 40 MiB more over 500 sessions, on top of idle.
        assert_eq!(f.touched, 500.0);
        assert_eq!(f.touched_kib, Some(20.48 + 81.92));
        assert_eq!(f.closed_kib, Some(10.24));
        assert_eq!(f.opens_per_s, Some(500.0));
        assert_eq!(f.open_cpu_ms, Some(2.0));
        assert_eq!(f.open_p99_ms, Some(3.5));
        assert_eq!(f.first_conns_per_s, Some(150.0));
        assert_eq!(f.first_conn_cpu_ms, Some(4.0));
        assert_eq!(f.upkeep_ms_per_s, Some(25.0));
        assert_eq!(f.renew_ms, Some(15.0));
        assert_eq!(f.renew_cpu_ms, Some(10.0));
        assert_eq!(f.closes_per_s, Some(250.0));
        assert_eq!(f.close_cpu_ms, Some(4.0));
        assert!(run.check().is_empty(), "{:?}", run.check());
    }

    #[test]
    fn cells_show_the_spread() {
        assert_eq!(spread(&[], 1), "-");
        assert_eq!(spread(&[3.04, 3.01], 1), "3.0");
        assert_eq!(spread(&[3.4, 2.9, 3.1], 1), "2.9–3.4");
    }

    /// A kept work folder (a smoke run: `COUNTS="1 20"`, 20 sessions in the
    /// comparison) gives the table it printed, and its check passes; the
    /// same runs with failures are caught.
    #[test]
    fn kept_work_folder() {
        let dir = testdata("capacity/smoke");
        let c = Capacity::open(&dir).unwrap();
        let want = std::fs::read_to_string(dir.join("table.md")).unwrap();
        assert_eq!(c.table(), want);
        assert!(c.check().is_empty(), "{:?}", c.check());

        let mut run = c.runs[1].clone();
        for p in &mut run.phases {
            if p.name == "touch" {
                p.said["failed"] = 2.into();
                p.said["first_error"] = "api.demo.test from 127.0.1.1: TLS: …".into();
            }
            if p.name == "close" {
                p.said["ok"] = (run.n - 1).into();
                p.said["background_renewals"]["not_held"] = 1.into();
            }
        }
        let bad = run.check();
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(bad[0].contains("touch: 2 failed"), "{bad:?}");
        assert!(bad[1].contains("1 not held"), "{bad:?}");
        assert!(bad[2].contains("sessions closed"), "{bad:?}");
    }
}
