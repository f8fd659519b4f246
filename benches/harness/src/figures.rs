//! The benchmarks' arithmetic and tables (`src/bin/bench-figures.rs`).
//!
//! The bench scripts start the processes and keep every tool's raw output
//! in their work folder: wrk's and h2load's output (`RUN.out`), the CPU
//! ticks read from `/proc` around each run (`RUN.cpu`), the idle
//! connections' readings (`idle.TARGET.res`), `openssl speed`'s output
//! (`speed.out`) and the facts of the run (`run.env`). This module turns
//! those files into the figures and the Markdown tables, so a kept work
//! folder gives the same table again.
//!
//! The numbers are formatted as C's `printf` does (Rust's `{:.N}` rounds
//! the exact binary value half to even, as glibc does), and where the
//! scripts rounded a figure before computing with it (seconds to 3
//! decimals, counts to integers), so does this.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub mod capacity;
pub mod spread;

pub use spread::{ratio_text, Spread, TOO_WIDE};

/// The leading number of `s`, as awk reads a string as a number: leading
/// blanks, then the longest prefix that is a decimal number; 0 if none.
pub fn awk_num(s: &str) -> f64 {
    let t = s.trim_start_matches([' ', '\t', '\n']);
    let b = t.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    let mut n = digits(&mut i);
    if i < b.len() && b[i] == b'.' {
        i += 1;
        n += digits(&mut i);
    }
    if n == 0 {
        return 0.0;
    }
    let mut end = i;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if digits(&mut j) > 0 {
            end = j;
        }
    }
    t[..end].parse().unwrap_or(0.0)
}

/// `v` as `printf("%.Nf")` prints it.
pub fn fixed(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// `v` rounded as `%.Nf` prints it, read back: what a figure is worth after
/// a script printed it and computed with the printed text.
fn rounded(v: f64, decimals: usize) -> f64 {
    fixed(v, decimals).parse().unwrap_or(0.0)
}

/// The figures of one load run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Requests answered with a 2xx.
    pub requests: f64,
    /// The run's length in seconds, to the millisecond.
    pub seconds: f64,
    /// Bytes read by the client.
    pub bytes: f64,
    /// Failed requests: errors and non-2xx replies.
    pub errors: f64,
    /// Latency percentiles in µs (wrk's report script gives them).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Mean request time in µs (h2load gives it).
    pub mean_us: Option<f64>,
    /// Handshakes that resumed a TLS session (resume-load gives it).
    pub resumed: Option<f64>,
}

impl Run {
    /// What the scripts counted for a run that left no output they know.
    pub const NONE: Run = Run {
        requests: 0.0,
        seconds: 0.0,
        bytes: 0.0,
        errors: 1.0,
        p50_us: None,
        p99_us: None,
        mean_us: None,
        resumed: None,
    };

    /// The figures in one tool's output: the `RESULT` line of the wrk
    /// script (`report.lua`), else h2load's summary, else [`Run::NONE`].
    pub fn parse(out: &str) -> Run {
        if out.lines().any(|l| l.starts_with("RESULT ")) {
            return Self::wrk(out);
        }
        if out.lines().any(|l| l.starts_with("finished in")) {
            return Self::h2load(out);
        }
        Run::NONE
    }

    /// [`Run::parse`] of a file; a missing file is [`Run::NONE`].
    pub fn read(path: &Path) -> Run {
        std::fs::read_to_string(path).map_or(Run::NONE, |s| Self::parse(&s))
    }

    /// `RESULT requests=N bytes=N duration_us=N errors=N non2xx=N p50_us=N
    /// p99_us=N`, and resume-load's `resumed=N`.
    fn wrk(out: &str) -> Run {
        let mut v: HashMap<&str, &str> = HashMap::new();
        for l in out.lines() {
            if let Some(rest) = l.strip_prefix("RESULT ") {
                for kv in rest.split(' ') {
                    let mut it = kv.split('=');
                    let k = it.next().unwrap_or("");
                    v.insert(k, it.next().unwrap_or(""));
                }
            }
        }
        let n = |k: &str| awk_num(v.get(k).copied().unwrap_or(""));
        Run {
            requests: rounded(n("requests") - n("non2xx"), 0),
            seconds: rounded(n("duration_us") / 1e6, 3),
            bytes: rounded(n("bytes"), 0),
            errors: rounded(n("errors") + n("non2xx"), 0),
            p50_us: Some(rounded(n("p50_us"), 0)),
            p99_us: Some(rounded(n("p99_us"), 0)),
            mean_us: None,
            resumed: v.get("resumed").map(|r| rounded(awk_num(r), 0)),
        }
    }

    /// h2load's summary: `finished in`, `requests:`, `status codes:`,
    /// `traffic:` and `time for request:` lines (the last of each counts).
    fn h2load(out: &str) -> Run {
        // h2load's durations: 12.3us, 4.5ms, 1.2s.
        fn us(s: &str) -> f64 {
            if s.ends_with("us") {
                awk_num(s)
            } else if s.ends_with("ms") {
                awk_num(s) * 1000.0
            } else {
                awk_num(s) * 1e6
            }
        }
        let (mut secs, mut ok, mut bad, mut ok2xx, mut bytes, mut mean) =
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for l in out.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            let at = |i: usize| f.get(i - 1).copied().unwrap_or("");
            if l.starts_with("finished in") {
                secs = us(at(3).strip_suffix(',').unwrap_or(at(3))) / 1e6;
            } else if l.starts_with("requests:") {
                ok = awk_num(at(8));
                bad = awk_num(at(10)) + awk_num(at(12)) + awk_num(at(14));
            } else if l.starts_with("status codes:") {
                ok2xx = awk_num(at(3));
            } else if l.starts_with("traffic:") {
                bytes = awk_num(&at(3).replace(['(', ')'], ""));
            } else if l.starts_with("time for request:") {
                mean = us(at(6));
            }
        }
        if ok2xx < ok {
            bad += ok - ok2xx;
            ok = ok2xx;
        }
        Run {
            requests: rounded(ok, 0),
            seconds: rounded(secs, 3),
            bytes: rounded(bytes, 0),
            errors: rounded(bad, 0),
            p50_us: None,
            p99_us: None,
            mean_us: Some(rounded(mean, 0)),
            resumed: None,
        }
    }
}

/// `key=value ...` words (a `.cpu` or `.res` file): the value of each key,
/// the first if a key comes twice, "" for a missing one.
#[derive(Debug, Clone, Default)]
pub struct Fields(Vec<(String, String)>);

impl Fields {
    pub fn parse(text: &str) -> Fields {
        Fields(
            text.split([' ', '\n'])
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The fields of a file, `None` if it is missing.
    pub fn read(path: &Path) -> Option<Fields> {
        std::fs::read_to_string(path).ok().map(|s| Self::parse(&s))
    }

    pub fn get(&self, k: &str) -> &str {
        self.0
            .iter()
            .find(|(key, _)| key == k)
            .map_or("", |(_, v)| v)
    }

    /// The value as awk reads it as a number.
    pub fn num(&self, k: &str) -> f64 {
        awk_num(self.get(k))
    }
}

/// `run.env`: the facts of a run the tables name (one `key=value` a line,
/// the value up to the line's end), written by the script before the
/// table is printed, so a kept work folder gives the same header again.
#[derive(Debug, Clone, Default)]
pub struct RunEnv(HashMap<String, String>);

impl RunEnv {
    pub fn parse(text: &str) -> RunEnv {
        RunEnv(
            text.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    pub fn read(path: &Path) -> Result<RunEnv, String> {
        std::fs::read_to_string(path)
            .map(|s| Self::parse(&s))
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn get(&self, k: &str) -> &str {
        self.0.get(k).map_or("", String::as_str)
    }

    /// A space-separated list (`refs`, `peers`).
    pub fn list(&self, k: &str) -> Vec<String> {
        self.get(k).split_whitespace().map(str::to_string).collect()
    }

    /// `clk_tck`: the unit of every CPU time in `/proc`.
    pub fn tck(&self) -> f64 {
        match awk_num(self.get("clk_tck")) {
            t if t > 0.0 => t,
            _ => 100.0,
        }
    }
}

/// What one core encrypts per second with AES-GCM, from `openssl speed
/// -evp aes-128-gcm -bytes 16384` (or `aes-256-gcm`: its last line for the
/// cipher, in thousands of bytes per second), in bytes per second; 0 if
/// none.
pub fn aes_bytes_per_second(speed_out: &str) -> f64 {
    aes_floor(speed_out).1
}

/// The cipher `openssl speed` measured (`AES-128-GCM` or `AES-256-GCM`;
/// `AES-256-GCM` if the output names neither) and its bytes per second.
pub fn aes_floor(speed_out: &str) -> (&'static str, f64) {
    let (mut v, mut cipher) = ("", "AES-256-GCM");
    for l in speed_out.lines() {
        for c in ["AES-128-GCM", "AES-256-GCM"] {
            if l.starts_with(c) || l.starts_with(&c.to_ascii_lowercase()) {
                v = l.split_whitespace().last().unwrap_or("");
                cipher = c;
            }
        }
    }
    (
        cipher,
        rounded(awk_num(v.strip_suffix('k').unwrap_or(v)) * 1000.0, 0),
    )
}

/// 1 when other jobs used more than a quarter of a CPU during a run of
/// `seconds` whose `other_ticks` were `other`: the figure gets a star.
fn disturbed(other: f64, tck: f64, seconds: f64) -> bool {
    seconds > 0.0 && other / tck / seconds > 0.25
}

// --- benches/compare ----------------------------------------------------------

/// One round of the comparison: where its runs' files are, and the
/// AES-GCM floor measured in it.
#[derive(Debug)]
struct Round {
    /// The prefix of its runs' files in the work folder: "" for a run
    /// without rounds (every file at the top), else `rN/`.
    prefix: String,
    /// AES-GCM bytes per second on one core (the round's `speed.out`),
    /// 0 if none.
    aes: f64,
    /// The AES-GCM `openssl speed` measured: the suite the proxies use.
    aes_cipher: &'static str,
}

/// One load run's figure in one round ([`Compare::figure`]).
#[derive(Debug, Clone, Copy)]
struct Figure {
    /// The figure, in the unit the table prints (CPU-s per request for
    /// `cpu1k`); `None` if the run gives none (no request got through).
    v: Option<f64>,
    /// Other jobs used more than a quarter of a CPU during the run.
    star: bool,
    /// The failed requests, when more than 1 % failed.
    errors: Option<i64>,
}

/// The comparison harness's work folder (`benches/compare/run.sh`).
///
/// A run with rounds (`rounds=N` in `run.env`, from `ROUNDS`) keeps each
/// round's load runs and AES-GCM floor in `rN/` (every system once a round,
/// back to back, the order in `rN/order`), and the idle connections'
/// readings, measured once, at the top. Each cell is then the median over
/// the rounds, and each ratio gateway/peer the median of the per-round
/// ratios with their spread ([`Spread`]). A work folder from before rounds
/// (every file at the top) prints the table it printed then.
#[derive(Debug)]
pub struct Compare {
    dir: PathBuf,
    env: RunEnv,
    tck: f64,
    /// invariant: at least one; a folder without rounds is one round with
    /// the prefix "".
    rounds: Vec<Round>,
    /// The reference columns (`direct`, `relay`), the gateway, the peers.
    refs: Vec<String>,
    peers: Vec<String>,
}

impl Compare {
    pub fn open(dir: &Path) -> Result<Compare, String> {
        let env = RunEnv::read(&dir.join("run.env"))?;
        let n = awk_num(env.get("rounds")) as usize;
        let prefixes: Vec<String> = if n == 0 {
            vec![String::new()]
        } else {
            (1..=n).map(|r| format!("r{r}/")).collect()
        };
        let rounds = prefixes
            .into_iter()
            .map(|prefix| {
                let speed = std::fs::read_to_string(dir.join(format!("{prefix}speed.out")))
                    .unwrap_or_default();
                let (aes_cipher, aes) = aes_floor(&speed);
                Round {
                    aes,
                    aes_cipher,
                    prefix,
                }
            })
            .collect();
        Ok(Compare {
            dir: dir.to_path_buf(),
            tck: env.tck(),
            rounds,
            refs: env.list("refs"),
            peers: env.list("peers"),
            env,
        })
    }

    /// Whether the run had rounds (`rN/` folders), even a single one.
    fn in_rounds(&self) -> bool {
        !self.rounds[0].prefix.is_empty()
    }

    /// Every target, as the table's columns: references, gateway, peers.
    fn targets(&self) -> Vec<&str> {
        self.refs
            .iter()
            .map(String::as_str)
            .chain(std::iter::once("gateway"))
            .chain(self.peers.iter().map(String::as_str))
            .collect()
    }

    /// The targets with idle connections: the gateway and the peers.
    fn proxies(&self) -> Vec<&str> {
        std::iter::once("gateway")
            .chain(self.peers.iter().map(String::as_str))
            .collect()
    }

    fn run(&self, run: &str) -> Run {
        Run::read(&self.dir.join(format!("{run}.out")))
    }

    /// One load run's figure in one round. Kinds: rps, p50 and p99 (ms),
    /// mbps, cpu1k (CPU-s per request), cpugb, syscpugb (the kernel's part
    /// of cpugb), floor (CPU per GB over the round's two-pass AES-GCM
    /// floor), busy (percent of one core). `None` if the run has no CPU
    /// readings: it did not run.
    fn figure(&self, round: &Round, run: &str, kind: &str) -> Option<Figure> {
        let name = format!("{}{run}", round.prefix);
        let cpu = Fields::read(&self.dir.join(format!("{name}.cpu")))?;
        let r = self.run(&name);
        let (n, s, b) = (r.requests, r.seconds, r.bytes);
        let tck = self.tck;
        let c = cpu.num("proxy_ticks") / tck;
        let kt = cpu.num("proxy_sys_ticks");
        let v = match kind {
            "rps" if s > 0.0 => Some(n / s),
            "p50" => r.p50_us.map(|u| u / 1000.0),
            "p99" => r.p99_us.map(|u| u / 1000.0),
            "mbps" if s > 0.0 => Some(b / s / 1e6),
            "cpu1k" if n > 0.0 => Some(c / n),
            "cpugb" if b > 0.0 => Some(c / b * 1e9),
            "syscpugb" if b > 0.0 => Some(kt / tck / b * 1e9),
            "floor" if b > 0.0 && round.aes > 0.0 => Some((c / b * 1e9) / (2.0 * 1e9 / round.aes)),
            "busy" if s > 0.0 => Some(100.0 * c / s),
            _ => None,
        };
        // More than 1 % of the requests failed (integer division, as the
        // script's shell arithmetic).
        let (e, ni) = (r.errors as i64, r.requests as i64);
        Some(Figure {
            v,
            star: disturbed(cpu.num("other_ticks"), tck, s),
            errors: (e != 0 && e > ni / 100).then_some(e),
        })
    }

    /// A figure of `kind` as the table prints it: CPU-s per 1k requests
    /// and per 100k after a slash for cpu1k, `2.0x` for floor, `93%` for
    /// busy.
    fn text(kind: &str, v: Option<f64>) -> String {
        let Some(v) = v else {
            return "-".into();
        };
        match kind {
            "rps" | "mbps" => fixed(v, 0),
            "cpu1k" => format!("{} / {}", fixed(v * 1e3, 4), fixed(v * 1e5, 2)),
            "floor" => format!("{}x", fixed(v, 1)),
            "busy" => format!("{}%", fixed(v, 0)),
            _ => fixed(v, 2),
        }
    }

    /// One cell of a load run (`RUN.TARGET`): its figure, the median over
    /// the rounds that measured it; a star if other jobs disturbed any of
    /// them; the failed requests of the rounds that lost more than 1 %.
    pub fn value(&self, run: &str, kind: &str) -> String {
        let figs: Vec<Figure> = self
            .rounds
            .iter()
            .filter_map(|r| self.figure(r, run, kind))
            .collect();
        if figs.is_empty() {
            return "-".into();
        }
        let values: Vec<f64> = figs.iter().filter_map(|f| f.v).collect();
        let mut v = Self::text(kind, median(&values));
        if figs.iter().any(|f| f.star) {
            v.push('*');
        }
        if figs.iter().any(|f| f.errors.is_some()) {
            let e: i64 = figs.iter().filter_map(|f| f.errors).sum();
            let _ = write!(v, " (errors {e})");
        }
        v
    }

    /// gateway/peer of a figure in each round, from the two runs of that
    /// round (measured back to back); `None` for a round where either has
    /// no figure.
    pub fn round_ratios(&self, run: &str, kind: &str, peer: &str) -> Vec<Option<f64>> {
        self.rounds
            .iter()
            .map(|r| {
                let g = self.figure(r, &format!("{run}.gateway"), kind)?.v?;
                let p = self.figure(r, &format!("{run}.{peer}"), kind)?.v?;
                (g > 0.0 && p > 0.0).then(|| g / p)
            })
            .collect()
    }

    /// gateway/peer of a figure over the rounds: the median of the
    /// per-round ratios and their spread; `None` if no round has both.
    pub fn ratio_spread(&self, run: &str, kind: &str, peer: &str) -> Option<Spread> {
        let r: Vec<f64> = self
            .round_ratios(run, kind, peer)
            .into_iter()
            .flatten()
            .collect();
        Spread::of(&r)
    }

    /// One idle-connections cell. Kinds: rss0, rss1 (MiB), est, per_conn
    /// (KiB per established connection).
    pub fn idle_value(&self, target: &str, kind: &str) -> String {
        if self.refs.iter().any(|r| r == target) {
            return "-".into();
        }
        let Some(f) = Fields::read(&self.dir.join(format!("idle.{target}.res"))) else {
            return "-".into();
        };
        let (r0, r1, est) = (f.num("rss0_kib"), f.num("rss1_kib"), f.num("established"));
        match kind {
            "rss0" => fixed(r0 / 1024.0, 1),
            "rss1" => fixed(r1 / 1024.0, 1),
            "est" => format!("{}", est as i64),
            "per_conn" if est > 0.0 => fixed((r1 - r0) / est, 1),
            _ => "-".into(),
        }
    }

    /// gateway/peer for one cell pair: their leading numbers.
    pub fn ratio(gw: &str, peer: &str) -> String {
        let (a, b) = (awk_num(gw), awk_num(peer));
        if a > 0.0 && b > 0.0 {
            fixed(a / b, 2)
        } else {
            "-".into()
        }
    }

    /// A table row over every target, then gateway/peer of the cells.
    fn row(&self, out: &mut String, label: &str, cell: impl Fn(&str) -> String) {
        let cells: Vec<String> = self.targets().into_iter().map(&cell).collect();
        let gw = &cells[self.refs.len()];
        let _ = write!(out, "| {label} |");
        for c in &cells {
            let _ = write!(out, " {c} |");
        }
        for (i, _) in self.peers.iter().enumerate() {
            let peer = &cells[self.refs.len() + 1 + i];
            let _ = write!(out, " {} |", Self::ratio(gw, peer));
        }
        out.push('\n');
    }

    /// A load run's row: every target's cell, then gateway/peer. With
    /// rounds, each ratio is the median of the per-round ratios with their
    /// spread; a spread too wide to read is marked and added to `wide`.
    fn load_row(
        &self,
        out: &mut String,
        label: &str,
        run: &str,
        kind: &str,
        wide: &mut Vec<String>,
    ) {
        if !self.in_rounds() {
            self.row(out, label, |t| self.value(&format!("{run}.{t}"), kind));
            return;
        }
        let _ = write!(out, "| {label} |");
        for t in self.targets() {
            let _ = write!(out, " {} |", self.value(&format!("{run}.{t}"), kind));
        }
        for p in &self.peers {
            let cell = match self.ratio_spread(run, kind, p) {
                Some(s) => {
                    if s.too_wide() {
                        wide.push(format!("{label}, gw/{p}: rounds {}", s.range()));
                    }
                    s.cell()
                }
                None => "-".into(),
            };
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }

    /// The table's load rows before the idle ones: (label, run, kind).
    const LOAD_ROWS: [(&'static str, &'static str, &'static str); 14] = [
        (
            "CPU-s per 1k / per 100k req, HTTP/1.1 1 KiB (lower is better)",
            "h1_small",
            "cpu1k",
        ),
        (
            "CPU-s per 1k / per 100k req, HTTP/2 1 KiB",
            "h2_small",
            "cpu1k",
        ),
        (
            "CPU-s per 1k / per 100k new TLS connections",
            "h1_newconn",
            "cpu1k",
        ),
        (
            "… with a resuming client (TLS 1.3 tickets)",
            "h1_resume",
            "cpu1k",
        ),
        ("CPU-s per GB, 1 MiB replies", "h1_1mib", "cpugb"),
        ("… over the AES-GCM floor (2 passes)", "h1_1mib", "floor"),
        (
            "… of which in the kernel (system time), CPU-s per GB",
            "h1_1mib",
            "syscpugb",
        ),
        (
            "HTTP/1.1 keep-alive 1 KiB: req/s (wrk -c32)",
            "h1_small",
            "rps",
        ),
        ("… p50 latency, ms", "h1_small", "p50"),
        ("… p99 latency, ms", "h1_small", "p99"),
        (
            "HTTP/2 multiplexed 1 KiB: req/s (h2load -c8 -m32)",
            "h2_small",
            "rps",
        ),
        ("1 MiB replies, HTTP/1.1: MB/s (wrk -c4)", "h1_1mib", "mbps"),
        (
            "new TLS connections/s, one request each (wrk -c16)",
            "h1_newconn",
            "rps",
        ),
        (
            "… resumed, connections/s (resume-load -c16)",
            "h1_resume",
            "rps",
        ),
    ];

    /// The table's busy rows, after the idle ones.
    const BUSY_ROWS: [(&'static str, &'static str, &'static str); 5] = [
        (
            "busy (share of one core), HTTP/1.1 1 KiB",
            "h1_small",
            "busy",
        ),
        ("busy, HTTP/2 1 KiB", "h2_small", "busy"),
        ("busy, 1 MiB replies", "h1_1mib", "busy"),
        ("busy, new connections", "h1_newconn", "busy"),
        ("busy, resumed connections", "h1_resume", "busy"),
    ];

    /// The header line: the machine, the run's length, the AES-GCM floor
    /// (with rounds, its median and the rounds' range).
    fn header(&self, o: &mut String) {
        let e = &self.env;
        let floors: Vec<f64> = self
            .rounds
            .iter()
            .map(|r| r.aes)
            .filter(|a| *a > 0.0)
            .collect();
        let aes = Spread::of(&floors);
        let med = aes.map_or(0.0, |s| s.median);
        let mut runs = format!("{} s per load run", e.get("duration_s"));
        let mut floor_range = String::new();
        if self.in_rounds() {
            let _ = write!(
                runs,
                ", {} rounds per figure (each system once a round, back to back, the order rotating)",
                self.rounds.len()
            );
            if let Some(s) = aes.filter(|s| s.rounds >= 2) {
                floor_range = format!(
                    " (rounds {}–{})",
                    fixed(s.min / 1e6, 0),
                    fixed(s.max / 1e6, 0)
                );
            }
        }
        let _ = writeln!(
            o,
            "{}, nproc {}, {}, Linux {}, glibc {}, GLIBC_TUNABLES={}; {runs}, {} idle connections; {} floor {} MB/s{floor_range} = {} CPU-s per GB one pass, {} for decrypt + re-encrypt",
            e.get("date"),
            e.get("nproc"),
            e.get("cpu"),
            e.get("kernel"),
            e.get("glibc"),
            e.get("glibc_tunables"),
            e.get("idle_conns"),
            self.rounds.first().map_or("AES-256-GCM", |r| r.aes_cipher),
            fixed(med / 1e6, 0),
            fixed(1e9 / med, 2),
            fixed(2e9 / med, 2),
        );
    }

    /// The table, as the harness prints it.
    pub fn table(&self) -> String {
        let e = &self.env;
        let mut o = String::new();
        o.push('\n');
        self.header(&mut o);
        o.push('\n');
        o.push_str("| figure |");
        for t in self.targets() {
            let _ = write!(o, " {t} |");
        }
        for p in &self.peers {
            let _ = write!(o, " gw/{p} |");
        }
        o.push('\n');
        o.push_str("|---|");
        for _ in 0..self.targets().len() + self.peers.len() {
            o.push_str("---:|");
        }
        o.push('\n');
        let mut wide = Vec::new();
        for (label, run, kind) in Self::LOAD_ROWS {
            self.load_row(&mut o, label, run, kind, &mut wide);
        }
        let idle_n = e.get("idle_conns");
        let idle = [
            ("idle: RSS MiB before".to_string(), "rss0"),
            (
                "idle: RSS MiB with the idle connections".to_string(),
                "rss1",
            ),
            (
                format!("idle: connections established (asked {idle_n})"),
                "est",
            ),
            ("idle: KiB per connection".to_string(), "per_conn"),
        ];
        for (label, kind) in &idle {
            self.row(&mut o, label, |t| self.idle_value(t, kind));
        }
        for (label, run, kind) in Self::BUSY_ROWS {
            self.load_row(&mut o, label, run, kind, &mut wide);
        }
        o.push('\n');
        o.push_str("The direct column's CPU figures are the origin's own.\n");
        if self.refs.iter().any(|r| r == "relay") {
            o.push_str("The relay's are HAProxy's in TCP mode, passing the TLS through without terminating it (the kernel's share of moving the bytes).\n");
        }
        if self.refs.iter().any(|r| r == "passthrough") {
            o.push_str("The passthrough's are the gateway's with the name marked passthrough: the gate's checks before the handshake, then the TLS passed through to the origin unread, by splice(2).\n");
        }
        if self.in_rounds() {
            self.spread_notes(&mut o, &wide);
        } else {
            o.push_str("\\* other jobs on the machine used more than a quarter of a CPU during that run. Ratios are\n");
            o.push_str("gateway/peer: for CPU, latency and memory below 1 is better for the gateway, for rates above 1.\n");
        }
        o.push('\n');
        if self.in_rounds() {
            o.push_str("Failed requests/connections per figure, summed over the rounds (the end of a timed wrk run may cut a few):\n");
        } else {
            o.push_str(
                "Failed requests/connections per run (the end of a timed wrk run may cut a few):\n",
            );
        }
        for r in ["h1_small", "h2_small", "h1_1mib", "h1_newconn", "h1_resume"] {
            // The resumed figure is newer than some kept folders.
            if r == "h1_resume" && !self.ran_any(r) {
                continue;
            }
            let _ = write!(o, "  {r}:");
            for t in self.targets() {
                let _ = write!(o, " {t} {}", self.failed(&format!("{r}.{t}")));
            }
            o.push('\n');
        }
        if self.ran_any("h1_resume") {
            o.push_str("Handshakes resumed in h1_resume (the client offers a ticket whenever it holds one; the first connections cannot):\n ");
            for t in self.targets() {
                let _ = write!(o, " {t} {}", self.resumed_share(&format!("h1_resume.{t}")));
            }
            o.push('\n');
        }
        let checks: Vec<String> = self
            .targets()
            .iter()
            .filter_map(|t| {
                let out = std::fs::read_to_string(self.dir.join(format!("check.{t}.out"))).ok()?;
                let mut words = out.split_whitespace();
                let (version, suite) = (words.next()?, words.next()?);
                Some(format!("{t} {version} {suite}"))
            })
            .collect();
        if !checks.is_empty() {
            let _ = writeln!(
                o,
                "Negotiated in each target's check (Python's ssl, OpenSSL's default order: AES-256-GCM first):\n  {}",
                checks.join(", ")
            );
        }
        o.push_str("Idle connections (opened/failed by the client, seconds to open them all, the target's CPU-s for the handshakes):\n");
        for t in self.proxies() {
            let Some(f) = Fields::read(&self.dir.join(format!("idle.{t}.res"))) else {
                continue;
            };
            let _ = writeln!(
                o,
                "  {t}: opened {} failed {} in {}s, {} CPU-s",
                f.get("opened"),
                f.get("failed"),
                f.get("seconds"),
                fixed(f.num("handshake_ticks") / self.tck, 2),
            );
        }
        o
    }

    /// The failed requests of a load run (`RUN.TARGET`). Without rounds as
    /// the shell printed them (a run that did not run counts 1); with
    /// rounds, summed over the rounds that ran it, `-` if none did.
    fn failed(&self, run: &str) -> String {
        if !self.in_rounds() {
            return fixed(self.run(run).errors, 0);
        }
        let ran: Vec<String> = self
            .run_names(run)
            .into_iter()
            .filter(|name| self.dir.join(format!("{name}.cpu")).exists())
            .collect();
        if ran.is_empty() {
            return "-".into();
        }
        fixed(ran.iter().map(|name| self.run(name).errors).sum(), 0)
    }

    /// The names a run has in the folder: each round's (without rounds,
    /// the one round's prefix is empty).
    fn run_names(&self, run: &str) -> Vec<String> {
        self.rounds
            .iter()
            .map(|r| format!("{}{run}", r.prefix))
            .collect()
    }

    /// Whether any target ran `run` (a figure, not `RUN.TARGET`).
    fn ran_any(&self, run: &str) -> bool {
        self.targets().iter().any(|t| {
            self.run_names(&format!("{run}.{t}"))
                .iter()
                .any(|n| self.dir.join(format!("{n}.out")).exists())
        })
    }

    /// The share of a resuming client's requests whose handshake resumed
    /// (`RUN.TARGET`, summed over the rounds), as a percentage; `-` if
    /// none ran.
    fn resumed_share(&self, run: &str) -> String {
        let (mut resumed, mut requests) = (0.0, 0.0);
        for name in self.run_names(run) {
            let r = self.run(&name);
            if let Some(n) = r.resumed {
                requests += r.requests + r.errors;
                resumed += n;
            }
        }
        if requests > 0.0 {
            format!("{} %", fixed(100.0 * resumed / requests, 1))
        } else {
            "-".into()
        }
    }

    /// With rounds: how to read the cells and the spread, the ratios too
    /// wide to read, every round's ratios, and the order of each round.
    fn spread_notes(&self, o: &mut String, wide: &[String]) {
        let n = self.rounds.len();
        let _ = writeln!(
            o,
            "Each cell is the median over the {n} rounds; \\* other jobs on the machine used more than a quarter of a CPU during one of its runs. Ratios are gateway/peer: for CPU, latency and memory below 1 is better for the gateway, for rates above 1. Each is the median of the per-round ratios (the two runs of a round measured back to back), with the lowest and highest round in parentheses; \" !\" marks a spread too wide to read (highest round over lowest above {}). The idle rows are one run each.",
            fixed(TOO_WIDE, 2)
        );
        o.push('\n');
        if wide.is_empty() {
            let _ = writeln!(
                o,
                "Every ratio's spread is within {} (highest round over lowest).",
                fixed(TOO_WIDE, 2)
            );
        } else {
            let _ = writeln!(
                o,
                "**WARNING: too wide to read** ({} of the ratios: highest round over lowest above {}; more rounds, longer runs or a quieter machine):",
                wide.len(),
                fixed(TOO_WIDE, 2)
            );
            for w in wide {
                let _ = writeln!(o, "- {w}");
            }
        }
        if self.peers.is_empty() {
            return;
        }
        o.push('\n');
        o.push_str("Every round's ratio gateway/peer, in round order:\n\n| figure |");
        for p in &self.peers {
            let _ = write!(o, " gw/{p} |");
        }
        o.push_str("\n|---|");
        for _ in &self.peers {
            o.push_str("---|");
        }
        o.push('\n');
        for (label, run, kind) in Self::LOAD_ROWS.iter().chain(&Self::BUSY_ROWS) {
            let _ = write!(o, "| {label} |");
            for p in &self.peers {
                let r: Vec<String> = self
                    .round_ratios(run, kind, p)
                    .into_iter()
                    .map(|r| r.map_or_else(|| "-".into(), ratio_text))
                    .collect();
                let _ = write!(o, " {} |", r.join(" "));
            }
            o.push('\n');
        }
        o.push('\n');
        o.push_str("The order of the systems in each round (every figure alike):\n");
        for (i, r) in self.rounds.iter().enumerate() {
            let order = std::fs::read_to_string(self.dir.join(format!("{}order", r.prefix)))
                .unwrap_or_else(|_| "?".into());
            let _ = writeln!(o, "  round {}: {}", i + 1, order.trim());
        }
    }

    /// STRICT=1: every load run that ran got requests through and lost at
    /// most 1 % of them, a resuming client's handshakes resumed but for its
    /// first connections, and every target held its idle connections.
    /// Returns the complaints, one a line (none: it passed).
    pub fn check(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let names = |dir: &Path, suffix: &str| {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(suffix))
                .collect();
            v.sort();
            v
        };
        for round in &self.rounds {
            for f in names(&self.dir.join(&round.prefix), ".cpu") {
                let run = format!("{}{}", round.prefix, f.trim_end_matches(".cpu"));
                let r = self.run(&run);
                let (n, e) = (r.requests as i64, r.errors as i64);
                if n == 0 || e > n / 100 {
                    bad.push(format!("{run}: {n} requests, {e} failed"));
                }
                if let Some(resumed) = r.resumed {
                    let fresh = n + e - resumed as i64;
                    if fresh > RESUME_FRESH_MAX {
                        bad.push(format!(
                            "{run}: {fresh} of {} handshakes did not resume (at most {RESUME_FRESH_MAX}: the client's first connections)",
                            n + e
                        ));
                    }
                }
            }
        }
        for f in names(&self.dir, ".res")
            .into_iter()
            .filter(|n| n.starts_with("idle."))
        {
            let path = self.dir.join(&f);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if Fields::parse(&text).get("failed") != "0" {
                bad.push(format!(
                    "{}: {}",
                    f.trim_end_matches(".res"),
                    text.trim_end_matches('\n')
                ));
            }
        }
        bad
    }
}

/// Handshakes that may not resume in a resuming client's run: its first
/// connections (16 at once, before any ticket came) and as many again, for
/// a ticket that a target's cache let go.
const RESUME_FRESH_MAX: i64 = 32;

// --- benches/load/quick.sh ------------------------------------------------------

/// The load comparison's work folder (`benches/load/quick.sh`): each
/// figure straight to the origin (`RUN.direct`) and through the gateway
/// (`RUN.gw`), and the 1 MiB runs through a masking gateway (`RUN.gwm`).
#[derive(Debug)]
pub struct Load {
    dir: PathBuf,
    env: RunEnv,
    tck: f64,
}

/// The load comparison's runs, in the order of its tables.
pub const LOAD_RUNS: [&str; 7] = [
    "h1_small",
    "h2_small",
    "h1_1mib",
    "h2_1mib",
    "h2_1mib_1",
    "h1_newconn",
    "h2_burst",
];

impl Load {
    pub fn open(dir: &Path) -> Result<Load, String> {
        let env = RunEnv::read(&dir.join("run.env"))?;
        Ok(Load {
            dir: dir.to_path_buf(),
            tck: env.tck(),
            env,
        })
    }

    fn run(&self, run: &str) -> Run {
        Run::read(&self.dir.join(format!("{run}.out")))
    }

    fn cpu(&self, run: &str) -> Fields {
        Fields::read(&self.dir.join(format!("{run}.cpu"))).unwrap_or_default()
    }

    /// via/direct of two cells: their numbers without a star.
    pub fn ratio(direct: &str, via: &str) -> String {
        let a = direct.strip_suffix('*').unwrap_or(direct);
        let b = via.strip_suffix('*').unwrap_or(via);
        if awk_num(a) > 0.0 && b != "-" {
            fixed(awk_num(b) / awk_num(a), 2)
        } else {
            "-".into()
        }
    }

    /// A figure's row: RUN LABEL KIND (reqs | conns | mbps | p50 | p99 | mean).
    fn figure_row(&self, o: &mut String, run: &str, label: &str, kind: &str) {
        let cell = |side: &str| {
            let name = format!("{run}.{side}");
            let r = self.run(&name);
            let ms = |u: Option<f64>| u.map_or_else(|| "-".into(), |u| fixed(u / 1000.0, 2));
            let mut v = match kind {
                "reqs" | "conns" if r.seconds > 0.0 => fixed(r.requests / r.seconds, 0),
                "mbps" if r.seconds > 0.0 => fixed(r.bytes / r.seconds / 1e6, 0),
                "p50" => ms(r.p50_us),
                "p99" => ms(r.p99_us),
                "mean" => ms(r.mean_us),
                _ => "-".into(),
            };
            if disturbed(self.cpu(&name).num("other_ticks"), self.tck, r.seconds) {
                v.push('*');
            }
            v
        };
        let (d, g) = (cell("direct"), cell("gw"));
        let _ = writeln!(o, "| {label} | {d} | {g} | {} |", Self::ratio(&d, &g));
    }

    /// The report: the figures direct and via the gateway, the CPU time of
    /// every process, failed requests, the gateway's threads (`threads`:
    /// "NAME: TICKS" lines read at the end), then masking off against on.
    pub fn table(&self) -> String {
        let e = &self.env;
        let tck = self.tck;
        let burst = e.get("burst");
        let mut o = String::new();
        o.push('\n');
        let _ = writeln!(
            o,
            "{}, {} CPUs, {}, {} s per run, gateway with {} runtime worker(s)",
            e.get("date"),
            e.get("nproc"),
            e.get("cpu"),
            e.get("duration_s"),
            e.get("workers"),
        );
        o.push('\n');
        o.push_str("| figure | direct | via gateway | via/direct |\n|---|---:|---:|---:|\n");
        let rows = [
            (
                "h1_small",
                "HTTP/1.1 keep-alive, small replies: req/s (wrk -c32)".to_string(),
                "reqs",
            ),
            ("h1_small", "… latency p50, ms".into(), "p50"),
            ("h1_small", "… latency p99, ms".into(), "p99"),
            (
                "h2_small",
                "HTTP/2, small replies: req/s (h2load -c8 -m32)".into(),
                "reqs",
            ),
            ("h2_small", "… mean latency, ms".into(), "mean"),
            (
                "h1_1mib",
                "1 MiB replies, HTTP/1.1: MB/s (wrk -c4)".into(),
                "mbps",
            ),
            (
                "h2_1mib",
                "1 MiB replies, HTTP/2: MB/s (h2load -c4 -m1)".into(),
                "mbps",
            ),
            (
                "h2_1mib_1",
                "1 MiB replies one at a time, HTTP/2: MB/s (h2load -c1 -m1)".into(),
                "mbps",
            ),
            (
                "h1_newconn",
                "new TLS connections/s, one request each (wrk -c16, Connection: close)".into(),
                "conns",
            ),
            (
                "h2_burst",
                format!("burst of {burst} new connections: conn/s (h2load -c{burst} -n{burst})"),
                "conns",
            ),
        ];
        for (run, label, kind) in &rows {
            self.figure_row(&mut o, run, label, kind);
        }
        o.push('\n');
        o.push_str(
            "\\* other jobs on the machine used more than a quarter of a CPU during that run.\n\n",
        );
        o.push_str("Gateway CPU time in the via-gateway runs; the other processes' CPU time in both (\"other\n");
        o.push_str("jobs\": the rest of the machine, approximate: within about ±0.5 CPU-s per 10 s when quiet).\n\n");
        o.push_str("| run | gateway CPU-s | gateway busy | gateway CPU-s per 1k req | gateway CPU-s per GB | origin CPU-s direct / via | client CPU-s direct / via | other jobs CPU-s direct / via | gateway records |\n");
        o.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for run in LOAD_RUNS {
            let r = self.run(&format!("{run}.gw"));
            let (d, g) = (
                self.cpu(&format!("{run}.direct")),
                self.cpu(&format!("{run}.gw")),
            );
            let cpu = g.num("gw_ticks") / tck;
            let or_dash = |ok: bool, v: String| if ok { v } else { "-".into() };
            let _ = writeln!(
                o,
                "| {run} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} |",
                fixed(cpu, 2),
                or_dash(
                    r.seconds > 0.0,
                    format!("{}%", fixed(100.0 * cpu / r.seconds, 0))
                ),
                or_dash(r.requests > 0.0, fixed(cpu / r.requests * 1000.0, 4)),
                or_dash(r.bytes > 0.0, fixed(cpu / r.bytes * 1e9, 2)),
                fixed(d.num("origin_ticks") / tck, 2),
                fixed(g.num("origin_ticks") / tck, 2),
                fixed(d.num("client_ticks") / tck, 2),
                fixed(g.num("client_ticks") / tck, 2),
                fixed(d.num("other_ticks") / tck, 2),
                fixed(g.num("other_ticks") / tck, 2),
                g.num("records") as i64,
            );
        }
        o.push('\n');
        o.push_str("Failed requests/connections per run (0 expected; the end of a timed wrk run may cut a few):\n");
        for run in LOAD_RUNS {
            let _ = writeln!(
                o,
                "  {run}: direct {}, via gateway {}",
                fixed(self.run(&format!("{run}.direct")).errors, 0),
                fixed(self.run(&format!("{run}.gw")).errors, 0),
            );
        }
        o.push('\n');
        o.push_str("Gateway threads at the end (name: CPU ticks):\n");
        let threads = std::fs::read_to_string(self.dir.join("threads")).unwrap_or_default();
        for l in threads.lines() {
            let _ = writeln!(o, "  {l}");
        }
        self.masked(&mut o);
        o
    }

    /// Masking: the via-gateway 1 MiB runs against the same runs through
    /// the masking gateway.
    fn masked(&self, o: &mut String) {
        o.push('\n');
        o.push_str("Masking: the via-gateway 1 MiB runs above against the same runs through a gateway masking 4 attached values:\n\n");
        o.push_str("| figure | masking off | masking on | on/off | CPU-s per GB off / on |\n");
        o.push_str("|---|---:|---:|---:|---:|\n");
        for (run, label) in [
            ("h1_1mib", "1 MiB HTTP/1.1 MB/s"),
            ("h2_1mib", "1 MiB HTTP/2 MB/s"),
        ] {
            let (off, on) = (
                self.run(&format!("{run}.gw")),
                self.run(&format!("{run}.gwm")),
            );
            let g0 = self.cpu(&format!("{run}.gw")).num("gw_ticks");
            let g1 = self.cpu(&format!("{run}.gwm")).num("gw_ticks");
            let rate = |r: &Run| {
                if r.seconds > 0.0 {
                    r.bytes / r.seconds / 1e6
                } else {
                    0.0
                }
            };
            let per_gb = |g: f64, r: &Run| {
                if r.bytes > 0.0 {
                    g / self.tck / r.bytes * 1e9
                } else {
                    0.0
                }
            };
            let (r0, r1) = (rate(&off), rate(&on));
            let _ = writeln!(
                o,
                "| {label} | {} | {} | {} | {} / {} |",
                fixed(r0, 0),
                fixed(r1, 0),
                fixed(if r0 > 0.0 { r1 / r0 } else { 0.0 }, 2),
                fixed(per_gb(g0, &off), 2),
                fixed(per_gb(g1, &on), 2),
            );
        }
    }
}

// --- benches/load/gateway-ab.sh, masking-ab.sh --------------------------------

/// The units of one A/B run from h2load's output (one or more summaries):
/// bytes (`traffic: ... (N) total`) for `mib`, else succeeded requests.
pub fn ab_units(workload: &str, out: &str) -> f64 {
    let mut s = 0.0;
    for l in out.lines() {
        if workload == "mib" {
            if let Some(i) = l.find("traffic: ") {
                let rest = &l[i..];
                if let (Some(a), Some(b)) = (rest.find('('), rest.find(") total")) {
                    if a < b && rest[a + 1..b].bytes().all(|c| c.is_ascii_digit()) {
                        s += awk_num(&rest[a + 1..b]);
                    }
                }
            }
        } else if l.starts_with("requests:") {
            s += awk_num(l.split_whitespace().nth(7).unwrap_or(""));
        }
    }
    s
}

/// One A/B round's line, "CPU-per-unit rate": CPU-s per GB and MB/s for
/// `mib`, CPU-s per 1k requests and requests/s otherwise; "- -" without
/// units. `cpu_s` and `seconds` count as printed to the millisecond.
pub fn ab_round(workload: &str, units: f64, cpu_s: f64, seconds: f64) -> String {
    let (u, c, s) = (units.trunc(), rounded(cpu_s, 3), rounded(seconds, 3));
    if u == 0.0 {
        "- -".into()
    } else if workload == "mib" {
        format!("{} {}", fixed(c / u * 1e9, 3), fixed(u / s / 1e6, 1))
    } else {
        format!("{} {}", fixed(c / u * 1e3, 4), fixed(u / s, 0))
    }
}

/// The median, as Python's `statistics.median`.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The summary of an A/B workload from its rounds ("round R T: CPU RATE"
/// lines, T being A or B): the medians of A and B and of B/A per round.
pub fn ab_summary(rounds_text: &str, workload: &str) -> Result<String, String> {
    let mut by: [HashMap<String, (f64, f64)>; 2] = [HashMap::new(), HashMap::new()];
    for l in rounds_text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 5 || f[3] == "-" {
            continue;
        }
        let side = match f[2] {
            "A:" => 0,
            "B:" => 1,
            _ => continue,
        };
        by[side].insert(f[1].to_string(), (awk_num(f[3]), awk_num(f[4])));
    }
    // Rounds both sides have, in the order of their names as text.
    let mut rounds: Vec<&String> = by[0].keys().filter(|k| by[1].contains_key(*k)).collect();
    rounds.sort();
    let (a, b) = (&by[0], &by[1]);
    let col = |m: &HashMap<String, (f64, f64)>, i: usize| -> Vec<f64> {
        rounds
            .iter()
            .map(|k| if i == 0 { m[*k].0 } else { m[*k].1 })
            .collect()
    };
    let cpu: Vec<f64> = rounds.iter().map(|k| b[*k].0 / a[*k].0).collect();
    let rate: Vec<f64> = rounds.iter().map(|k| b[*k].1 / a[*k].1).collect();
    let med = |v: &[f64]| median(v).ok_or("no round with figures from both A and B");
    let unit = if workload == "mib" { "MB/s" } else { "req/s" };
    let list: Vec<String> = cpu.iter().map(|x| fixed(*x, 2)).collect();
    Ok(format!(
        "  CPU per unit: A {}  B {}  B/A median of rounds {} (rounds {})\n  rate ({unit}): A {}  B {}  B/A median of rounds {}\n",
        fixed(med(&col(a, 0))?, 4),
        fixed(med(&col(b, 0))?, 4),
        fixed(med(&cpu)?, 3),
        list.join(", "),
        fixed(med(&col(a, 1))?, 0),
        fixed(med(&col(b, 1))?, 0),
        fixed(med(&rate)?, 3),
    ))
}

/// A float as Python's `repr` prints it (the shortest text that reads back
/// the same, with ".0" on whole numbers).
pub fn py_float(v: f64) -> String {
    let s = format!("{v}");
    if s.contains(['.', 'e', 'i', 'N']) {
        s
    } else {
        format!("{s}.0")
    }
}

/// Python's `round(v, n)` (correctly rounded, ties to even on the exact
/// value: as `%.Nf`).
pub fn py_round(v: f64, n: usize) -> f64 {
    rounded(v, n)
}

/// One masking A/B round: "MB/s CPU-s-per-GB" over `seconds` of `bytes`
/// with `ticks` of gateway CPU, as Python's `round` and `repr` print them.
pub fn masking_round(bytes: f64, seconds: f64, ticks: f64, tck: f64) -> (f64, f64) {
    (
        py_round(bytes / 1e6 / seconds, 1),
        py_round(ticks / tck / (bytes / 1e9), 3),
    )
}

/// The masking A/B summary of the rounds' MB/s and CPU-s per GB, off and on.
pub fn masking_summary(
    off: &[f64],
    on: &[f64],
    cpu_off: &[f64],
    cpu_on: &[f64],
) -> Result<String, String> {
    let med = |v: &[f64]| median(v).ok_or_else(|| "no rounds".to_string());
    let (m0, m1) = (med(off)?, med(on)?);
    let per: Vec<String> = off
        .iter()
        .zip(on)
        .map(|(a, b)| py_float(py_round(b / a, 2)))
        .collect();
    Ok(format!(
        "median MB/s off {} on {} -> on/off {}\nper-round on/off: [{}]\nmedian CPU-s/GB off {} on {}\n",
        py_float(m0),
        py_float(m1),
        fixed(m1 / m0, 2),
        per.join(", "),
        fixed(med(cpu_off)?, 3),
        fixed(med(cpu_on)?, 3),
    ))
}

// --- benches/idle/run.sh ------------------------------------------------------

/// One idle-memory run's line: MODE, N asked, VmRSS before and with the
/// connections (KiB), how many opened, the client's own words.
pub fn idle_line(mode: &str, n: f64, rss0: f64, rss1: f64, opened: f64, said: &str) -> String {
    let per = if opened > 0.0 {
        (rss1 - rss0) / opened
    } else {
        0.0
    };
    format!(
        "{mode:<6} {:>5} rss0={:>6} KiB rss1={:>7} KiB  {per:>5.1} KiB/conn  ({said})",
        n as i64, rss0 as i64, rss1 as i64
    )
}

/// The slope per mode between the first and the last count of the runs
/// ("MODE N DELTA_KIB OPENED" lines): what one more connection costs,
/// one-time costs cancelled out. Modes in the order they first come;
/// none if there are fewer than two counts.
pub fn idle_slopes(deltas: &str) -> String {
    let mut counts: Vec<&str> = Vec::new();
    let mut modes: Vec<&str> = Vec::new();
    let mut at: HashMap<(&str, &str), (f64, f64)> = HashMap::new();
    for l in deltas.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(m), Some(n)) = (f.first().copied(), f.get(1).copied()) else {
            continue;
        };
        let v = |i: usize| awk_num(f.get(i).copied().unwrap_or(""));
        at.insert((m, n), (v(2), v(3)));
        if !modes.contains(&m) {
            modes.push(m);
        }
        if !counts.contains(&n) {
            counts.push(n);
        }
    }
    let mut out = String::new();
    if counts.len() < 2 {
        return out;
    }
    let (lo, hi) = (counts[0], counts[counts.len() - 1]);
    for m in modes {
        let get = |n| at.get(&(m, n)).copied().unwrap_or((0.0, 0.0));
        let ((d0, o0), (d1, o1)) = (get(lo), get(hi));
        if o1 > o0 {
            let _ = writeln!(
                out,
                "{m:<6} slope {}..{}: {:.1} KiB/conn",
                awk_num(lo) as i64,
                awk_num(hi) as i64,
                (d1 - d0) / (o1 - o0)
            );
        }
    }
    out
}

// --- readings and ready lines ---------------------------------------------------

/// A field of the first JSON object in `text` (a ready line, or a command's
/// JSON answer): a string as it is, anything else as JSON.
pub fn json_field(text: &str, name: &str) -> Option<String> {
    let mut it = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    let v = it.next()?.ok()?;
    match v.get(name)? {
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The fields of `/proc/PID/stat` after the command name (which is in
/// parentheses and may hold spaces): utime, stime are the 12th and 13th,
/// cutime, cstime the 14th and 15th.
fn stat_fields(pid: &str) -> Result<Vec<u64>, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let rest = text
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .ok_or_else(|| format!("{path}: no command name"))?;
    Ok(rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect())
}

fn stat_sum(pid: &str, at: &[usize]) -> Result<u64, String> {
    let f = stat_fields(pid)?;
    Ok(at.iter().map(|i| f.get(i - 1).copied().unwrap_or(0)).sum())
}

/// utime+stime of a process (all its threads) or of one thread
/// (`PID/task/TID`), in clock ticks.
pub fn ticks(pid: &str) -> Result<u64, String> {
    stat_sum(pid, &[12, 13])
}

/// stime alone: the part of [`ticks`] spent in the kernel.
pub fn sys_ticks(pid: &str) -> Result<u64, String> {
    stat_sum(pid, &[13])
}

/// cutime+cstime: the CPU time of the children the process waited for.
pub fn child_ticks(pid: &str) -> Result<u64, String> {
    stat_sum(pid, &[14, 15])
}

/// Busy ticks of the whole machine: user, nice, system, irq, softirq,
/// steal (`/proc/stat`'s `cpu` line).
pub fn machine_ticks() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or("/proc/stat: no cpu line")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    Ok([0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| f.get(i).copied().unwrap_or(0))
        .sum())
}

/// Resident memory of a process (`VmRSS`), in KiB.
pub fn rss_kib(pid: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{path}: no VmRSS"))
}

/// "NAME: TICKS" for each thread of a process, in the order of their ids
/// as text (a shell glob's).
pub fn threads(pid: &str) -> Result<String, String> {
    let dir = format!("/proc/{pid}/task");
    let mut tids: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{dir}: {e}"))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    tids.sort();
    let mut out = String::new();
    for t in tids {
        let task = format!("{pid}/task/{t}");
        let comm = std::fs::read_to_string(format!("/proc/{task}/comm")).unwrap_or_default();
        let _ = writeln!(out, "{}: {}", comm.trim_end_matches('\n'), ticks(&task)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn testdata(p: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(p)
    }

    /// The table and the STRICT=1 check of each kept work folder are what
    /// the shell and awk report printed from the same files.
    #[test]
    fn compare_table_as_the_shell_printed_it() {
        for d in ["smoke", "peers", "subset"] {
            let dir = testdata(&format!("compare/{d}"));
            let c = Compare::open(&dir).unwrap();
            let want = std::fs::read_to_string(dir.join("table.md")).unwrap();
            assert_eq!(c.table(), want, "{d}");
            let check: String = c
                .check()
                .iter()
                .map(|l| format!("compare: {l}\n"))
                .collect();
            let want = std::fs::read_to_string(dir.join("check.txt")).unwrap();
            let verdict = if check.is_empty() {
                "compare: every run got its requests through (STRICT=1)\n"
            } else {
                "compare: a run failed (STRICT=1)\n"
            };
            assert_eq!(format!("{check}{verdict}"), want, "{d}");
        }
    }

    /// A run with rounds (`benches/compare/run.sh` with `ROUNDS=2 AA=1`):
    /// the table bench-figures printed then, from the files it kept.
    #[test]
    fn compare_rounds_table_as_kept() {
        let dir = testdata("compare/rounds");
        let c = Compare::open(&dir).unwrap();
        let want = std::fs::read_to_string(dir.join("table.md")).unwrap();
        assert_eq!(c.table(), want);
        assert!(c.check().is_empty());
    }

    /// Each round's ratio comes from the two runs of that round, and the
    /// ratio is their median, not the ratio of the cells' medians.
    #[test]
    fn compare_ratios_pair_the_runs_of_a_round() {
        let c = Compare::open(&testdata("compare/rounds")).unwrap();
        // CPU-s per request: the target's ticks (100 a second) over the
        // requests wrk counted, in r1/ and r2/h1_small.gateway{,2}.*.
        let (g1, a1) = (0.64 / 3443.0, 0.54 / 3220.0);
        let (g2, a2) = (0.39 / 1525.0, 0.33 / 1233.0);
        let r = c.round_ratios("h1_small", "cpu1k", "gateway2");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(
            close(r[0].unwrap(), g1 / a1) && close(r[1].unwrap(), g2 / a2),
            "{r:?}"
        );
        let s = c.ratio_spread("h1_small", "cpu1k", "gateway2").unwrap();
        assert!(close(s.median, (g1 / a1 + g2 / a2) / 2.0));
        assert_eq!((s.min, s.max, s.rounds), (g2 / a2, g1 / a1, 2));
        assert_eq!(s.cell(), "1.03 (0.96–1.11) !");
        // The cells: each target's median over the rounds (starred: the
        // machine was busy), whose ratio is another figure.
        assert_eq!(c.value("h1_small.gateway", "cpu1k"), "0.2208 / 22.08*");
        assert_eq!(c.value("h1_small.gateway2", "cpu1k"), "0.2177 / 21.77*");
        let of_medians = ((g1 + g2) / 2.0) / ((a1 + a2) / 2.0);
        assert!((of_medians - s.median).abs() > 0.01, "{of_medians}");
    }

    /// Writes a compare work folder with rounds: the gateway and one peer,
    /// HTTP/1.1 only, each run 1 s (`ROUND: GW_TICKS GW_REQUESTS PEER_TICKS
    /// PEER_REQUESTS PEER_ERRORS`).
    fn rounds_folder(d: &Path, rounds: &[(f64, f64, f64, f64, f64)]) {
        std::fs::write(
            d.join("run.env"),
            format!(
                "duration_s=1\nrounds={}\nidle_conns=0\nclk_tck=100\nrefs=\npeers=nginx\n",
                rounds.len()
            ),
        )
        .unwrap();
        for (i, (gt, gn, pt, pn, pe)) in rounds.iter().enumerate() {
            let r = d.join(format!("r{}", i + 1));
            std::fs::create_dir_all(&r).unwrap();
            std::fs::write(r.join("order"), "gateway nginx\n").unwrap();
            for (t, ticks, n, e) in [("gateway", gt, gn, 0.0), ("nginx", pt, pn, *pe)] {
                std::fs::write(
                    r.join(format!("h1_small.{t}.cpu")),
                    format!("proxy_ticks={ticks} proxy_sys_ticks=0 origin_ticks=0 client_ticks=0 other_ticks=0\n"),
                )
                .unwrap();
                std::fs::write(
                    r.join(format!("h1_small.{t}.out")),
                    format!("RESULT requests={n} bytes=0 duration_us=1000000 errors={e} non2xx=0 p50_us=100 p99_us=200\n"),
                )
                .unwrap();
            }
        }
    }

    /// A resuming client's runs: the share of its handshakes that resumed,
    /// summed over the rounds, under the failures; STRICT names a target
    /// whose handshakes did not resume beyond the client's first ones.
    #[test]
    fn compare_resumed_share_and_check() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        rounds_folder(d, &[(10.0, 1000.0, 20.0, 1000.0, 0.0); 2]);
        for (r, gw_resumed, nginx_resumed) in [(1, 984, 990), (2, 984, 0)] {
            let dir = d.join(format!("r{r}"));
            for (t, resumed) in [("gateway", gw_resumed), ("nginx", nginx_resumed)] {
                std::fs::write(
                    dir.join(format!("h1_resume.{t}.cpu")),
                    "proxy_ticks=10 proxy_sys_ticks=0 origin_ticks=0 client_ticks=0 other_ticks=0
",
                )
                .unwrap();
                std::fs::write(
                    dir.join(format!("h1_resume.{t}.out")),
                    format!("RESULT requests=1000 bytes=0 duration_us=1000000 errors=0 non2xx=0 p50_us=100 p99_us=200 resumed={resumed}\n"),
                )
                .unwrap();
            }
        }
        let c = Compare::open(d).unwrap();
        let t = c.table();
        assert!(
            t.contains("(the client offers a ticket whenever it holds one; the first connections cannot):\n  gateway 98.4 % nginx 49.5 %\n"),
            "{t}"
        );
        assert!(t.contains("  h1_resume: gateway 0 nginx 0\n"), "{t}");
        assert!(t.contains("| … with a resuming client (TLS 1.3 tickets) | 0.1000 / 10.00 | 0.1000 / 10.00 | 1.00 (1.00–1.00) |\n"), "{t}");
        assert_eq!(
            c.check(),
            ["r2/h1_resume.nginx: 1000 of 1000 handshakes did not resume (at most 32: the client's first connections)"]
        );
    }

    /// Three rounds: gateway/nginx CPU per request 0.5, 0.6 and 0.4, so
    /// the median 0.5 and a spread of 1.5, too wide to read; the rates
    /// agree in every round. A failed run is named with its round.
    #[test]
    fn compare_rounds_spread_and_warning() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        rounds_folder(
            d,
            &[
                (10.0, 1000.0, 20.0, 1000.0, 0.0),
                (12.0, 1000.0, 20.0, 1000.0, 0.0),
                (10.0, 1000.0, 25.0, 1000.0, 0.0),
            ],
        );
        let c = Compare::open(d).unwrap();
        let s = c.ratio_spread("h1_small", "cpu1k", "nginx").unwrap();
        assert!((s.median - 0.5).abs() < 1e-12 && (s.min - 0.4).abs() < 1e-12);
        assert!((s.max - 0.6).abs() < 1e-12 && s.too_wide(), "{s:?}");
        let rate = c.ratio_spread("h1_small", "rps", "nginx").unwrap();
        assert_eq!((rate.median, rate.min, rate.max), (1.0, 1.0, 1.0));
        assert!(!rate.too_wide());
        let t = c.table();
        assert!(t.contains("| CPU-s per 1k / per 100k req, HTTP/1.1 1 KiB (lower is better) | 0.1000 / 10.00 | 0.2000 / 20.00 | 0.50 (0.40–0.60) ! |\n"), "{t}");
        assert!(t.contains("| HTTP/1.1 keep-alive 1 KiB: req/s (wrk -c32) | 1000 | 1000 | 1.00 (1.00–1.00) |\n"), "{t}");
        // CPU per request and the share of a core it made: both too wide.
        assert!(
            t.contains("**WARNING: too wide to read** (2 of the ratios"),
            "{t}"
        );
        assert!(t.contains("\n- CPU-s per 1k / per 100k req, HTTP/1.1 1 KiB (lower is better), gw/nginx: rounds 0.40–0.60 (1.50×)\n"), "{t}");
        assert!(t.contains("\n- busy (share of one core), HTTP/1.1 1 KiB, gw/nginx: rounds 0.40–0.60 (1.50×)\n"), "{t}");
        assert!(t.contains("; 1 s per load run, 3 rounds per figure (each system once a round, back to back, the order rotating), 0 idle connections;"), "{t}");
        assert!(
            t.contains("  h1_small: gateway 0 nginx 0\n  h2_small: gateway - nginx -\n"),
            "{t}"
        );
        assert!(t.contains("| CPU-s per 1k / per 100k req, HTTP/1.1 1 KiB (lower is better) | 0.50 0.60 0.40 |\n"), "{t}");
        assert!(t.contains("  round 3: gateway nginx\n"), "{t}");
        // The figures that did not run are dashes, and no warning.
        assert!(t.contains("| busy, HTTP/2 1 KiB | - | - | - |\n"), "{t}");
        assert!(c.check().is_empty());

        // Rounds that agree: no warning. A round whose peer lost more than
        // 1 % of its requests: the check names the round, the cell the
        // errors.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        rounds_folder(
            d,
            &[
                (10.0, 1000.0, 20.0, 1000.0, 0.0),
                (10.0, 1000.0, 21.0, 1000.0, 20.0),
            ],
        );
        let c = Compare::open(d).unwrap();
        let t = c.table();
        assert!(t.contains("Every ratio's spread is within 1.15"), "{t}");
        assert!(
            t.contains("| 0.2050 / 20.50 (errors 20) | 0.49 (0.48–0.50) |"),
            "{t}"
        );
        assert_eq!(c.check(), ["r2/h1_small.nginx: 1000 requests, 20 failed"]);
    }

    /// The load comparison's tables from a kept work folder.
    #[test]
    fn load_tables_as_printed() {
        let dir = testdata("load/quick");
        let want = std::fs::read_to_string(dir.join("table.md")).unwrap();
        assert_eq!(Load::open(&dir).unwrap().table(), want);
    }

    /// As benches/idle/run.sh's awk printed them.
    #[test]
    fn idle_lines_and_slopes() {
        assert_eq!(
            idle_line("http1", 2000.0, 30208.0, 44544.0, 2000.0, "opened=2000 failed=0 seconds=1.9"),
            "http1   2000 rss0= 30208 KiB rss1=  44544 KiB    7.2 KiB/conn  (opened=2000 failed=0 seconds=1.9)"
        );
        assert_eq!(
            idle_line("h2", 5.0, 1.0, 2.0, 0.0, "opened=0"),
            "h2         5 rss0=     1 KiB rss1=      2 KiB    0.0 KiB/conn  (opened=0)"
        );
        let deltas = "http1 2000 14336 2000\nhttp1 5000 35840 5000\nh2 2000 16384 2000\nh2 5000 40000 4990\n";
        assert_eq!(
            idle_slopes(deltas),
            "http1  slope 2000..5000: 7.2 KiB/conn\nh2     slope 2000..5000: 7.9 KiB/conn\n"
        );
        assert_eq!(idle_slopes("http1 2000 14336 2000\n"), "");
    }

    #[test]
    fn wrk_result_line() {
        let out = std::fs::read_to_string(testdata("compare/smoke/h1_small.gateway.out")).unwrap();
        let r = Run::parse(&out);
        assert_eq!(r.requests, 1834.0);
        assert_eq!(r.seconds, 1.107);
        assert_eq!(r.bytes, 2021068.0);
        assert_eq!(r.errors, 0.0);
        assert_eq!(r.p50_us, Some(16088.0));
        assert_eq!(r.p99_us, Some(109995.0));
        assert_eq!(r.mean_us, None);
    }

    #[test]
    fn h2load_summary() {
        let out = std::fs::read_to_string(testdata("compare/smoke/h2_small.gateway.out")).unwrap();
        let r = Run::parse(&out);
        assert_eq!(r.requests, 3632.0);
        assert_eq!(r.seconds, 1.02);
        assert_eq!(r.bytes, 3814456.0);
        assert_eq!(r.errors, 0.0);
        assert_eq!(r.p50_us, None);
        assert_eq!(r.mean_us, Some(64990.0));
        // Failed, errored, timed out and non-2xx replies all count as failed.
        let out =
            std::fs::read_to_string(testdata("compare/peers/h2_small.mitmproxy.out")).unwrap();
        let r = Run::parse(&out);
        assert_eq!((r.requests, r.errors), (3590.0, 42.0));
        assert_eq!(Run::parse("no summary"), Run::NONE);
        assert_eq!(Run::read(&testdata("missing.out")), Run::NONE);
    }

    #[test]
    fn aes_floor_from_openssl_speed() {
        let out = std::fs::read_to_string(testdata("compare/smoke/speed.out")).unwrap();
        assert_eq!(aes_bytes_per_second(&out), 4768318880.0);
        assert_eq!(aes_floor(&out).0, "AES-256-GCM");
        assert_eq!(aes_bytes_per_second(""), 0.0);
        let aes128 = "type 16384 bytes\nAES-128-GCM 5123456.79k\n";
        assert_eq!(aes_floor(aes128), ("AES-128-GCM", 5123456790.0));
    }

    #[test]
    fn numbers_as_awk_reads_them() {
        assert_eq!(awk_num("0.2672 / 26.72*"), 0.2672);
        assert_eq!(awk_num("1657*"), 1657.0);
        assert_eq!(awk_num("51%*"), 51.0);
        assert_eq!(awk_num("6.7x*"), 6.7);
        assert_eq!(awk_num("-"), 0.0);
        assert_eq!(awk_num(" 1e3x"), 1000.0);
        assert_eq!(awk_num("2e"), 2.0);
        assert_eq!(awk_num(".5"), 0.5);
        assert_eq!(Compare::ratio("0.2672 / 26.72*", "0.0713 / 7.13"), "3.75");
        assert_eq!(Compare::ratio("-", "12"), "-");
        assert_eq!(Load::ratio("100*", "250"), "2.50");
        assert_eq!(Load::ratio("100", "-"), "-");
        // printf's rounding: the exact binary value, ties to even.
        assert_eq!(fixed(2.5, 0), "2");
        assert_eq!(fixed(0.125, 2), "0.12");
        assert_eq!(fixed(2.675, 2), "2.67");
    }

    #[test]
    fn ready_line_fields() {
        let line = r#"{"ready":true,"data":"127.0.0.1:4431","admin":"127.0.0.1:9","workers":1}"#;
        assert_eq!(json_field(line, "data").as_deref(), Some("127.0.0.1:4431"));
        assert_eq!(json_field(line, "workers").as_deref(), Some("1"));
        assert_eq!(json_field(line, "control"), None);
        // The first object only, and pretty-printed answers too.
        assert_eq!(
            json_field("{\"a\":\"x\"}\n{\"a\":\"y\"}\n", "a").as_deref(),
            Some("x")
        );
        assert_eq!(
            json_field("{\n  \"session_id\": \"s-1\"\n}\n", "session_id").as_deref(),
            Some("s-1")
        );
    }

    #[test]
    fn ab_rounds_and_medians() {
        let h2 = std::fs::read_to_string(testdata("compare/smoke/h2_small.gateway.out")).unwrap();
        assert_eq!(ab_units("h2", &h2), 3632.0);
        assert_eq!(ab_units("mib", &h2), 3814456.0);
        // Two summaries (newconn's repeated runs) add up.
        assert_eq!(ab_units("h2", &format!("{h2}\n{h2}")), 7264.0);
        assert_eq!(ab_round("h2", 3632.0, 0.53, 1.0204), "0.1459 3561");
        assert_eq!(ab_round("mib", 3814456.0, 0.53, 1.02), "138.945 3.7");
        assert_eq!(ab_round("h1", 0.0, 0.5, 1.0), "- -");
        let rounds = "round 1 A: 0.1000 1000\nround 1 B: 0.0900 1100\nround 2 B: 0.0800 1200\n\
                      round 2 A: 0.1000 1000\nround 3 A: - -\nround 3 B: 0.0500 900\n";
        assert_eq!(
            ab_summary(rounds, "h1").unwrap(),
            "  CPU per unit: A 0.1000  B 0.0850  B/A median of rounds 0.850 (rounds 0.90, 0.80)\n  \
             rate (req/s): A 1000  B 1150  B/A median of rounds 1.150\n"
        );
        assert!(ab_summary("", "h1").is_err());
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn masking_rounds_as_python_printed_them() {
        assert_eq!(
            masking_round(2_000_000_000.0, 5.0, 250.0, 100.0),
            (400.0, 1.25)
        );
        assert_eq!(py_float(400.0), "400.0");
        assert_eq!(py_float(1.25), "1.25");
        assert_eq!(
            masking_summary(&[400.0, 500.0], &[380.0, 450.0], &[1.0, 1.2], &[1.3, 1.5]).unwrap(),
            "median MB/s off 450.0 on 415.0 -> on/off 0.92\nper-round on/off: [0.95, 0.9]\n\
             median CPU-s/GB off 1.100 on 1.400\n"
        );
    }
}
