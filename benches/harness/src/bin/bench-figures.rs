//! The bench scripts' arithmetic, tables and gateway config: the scripts
//! (benches/) install tools and start processes; this computes.
//!
//! ```text
//! bench-figures compare-table DIR    the comparison's table from its work folder (benches/compare/run.sh)
//! bench-figures compare-check DIR    STRICT=1: every run got its requests through (exit 1 if not)
//! bench-figures load-table DIR       benches/load/quick.sh's tables from its work folder
//! bench-figures aes-floor FILE       bytes/s of AES-256-GCM in `openssl speed` output
//! bench-figures ab-round WORKLOAD TICKS TCK T0 T1 < H2LOAD-OUTPUT
//!                                    one gateway-ab.sh round: "CPU-per-unit rate"
//! bench-figures ab-summary FILE WORKLOAD
//!                                    gateway-ab.sh's medians of the rounds in FILE
//! bench-figures masking-round SECONDS TICKS TCK < H2LOAD-OUTPUT
//!                                    one masking-ab.sh round: "MB/s CPU-s-per-GB"
//! bench-figures masking-summary "MB/S OFF" "MB/S ON" "CPU OFF" "CPU ON"
//!                                    masking-ab.sh's medians (space-separated rounds)
//! bench-figures idle-line MODE N RSS0 RSS1 OPENED SAID
//!                                    one benches/idle/run.sh run's line
//! bench-figures idle-slopes FILE     its slopes per mode ("MODE N DELTA OPENED" lines)
//! bench-figures capacity-table DIR   benches/capacity/run.sh's tables from its work folder
//! bench-figures capacity-check DIR   STRICT=1: no call, request or lease failed (exit 1 if one did)
//! bench-figures json-field NAME      a field of the JSON object on stdin (a ready line)
//! bench-figures ticks PID...         utime+stime of processes (or PID/task/TID), clock ticks
//! bench-figures sys-ticks PID...     stime alone
//! bench-figures child-ticks PID      cutime+cstime: the CPU time of the children PID waited for
//! bench-figures machine-ticks        busy ticks of the machine (user nice system irq softirq steal)
//! bench-figures rss-kib PID...       resident memory, KiB, summed
//! bench-figures threads PID          "NAME: TICKS" of each of PID's threads
//! bench-figures gateway-config KEY=VALUE...
//!                                    writes the benchmarks' gateway config (below)
//! ```
//!
//! `gateway-config` writes, with the test rig's writer
//! (`talos_e2e::gateway::TestConfig`), one static session for NAME in front
//! of load-origin:
//!
//! ```text
//! file=PATH      where to write it
//! id=ID          gateway_id            session=ID  the session's id (none: no static session)
//! name=NAME      the one listed name   sources=A,B  its source addresses (127.0.0.1)
//! dns=ADDR       load-origin's DNS     port=N       load-origin's TLS port
//! work=DIR       load-origin's folder (its CA: DIR/origin-ca.pem)
//! records=PATH   the records file      trust=PATH   where the session CA goes
//! limits=TOML    lines for [limits]    workers=N    runtime.workers (1, the default: one thread serves everything)
//! masked=DIR     4 random credentials (0600) written to DIR/secret1..4 and attached to
//!                NAME's requests as x-api-key-1..4: every reply is masked
//! permit=A,B     the internal blocks let through (default 127.0.0.1/32)
//! control=DIR    a [control] table with the files `ControlPki::new(DIR)` writes
//!                (`talos_e2e::control`), listening on 127.0.0.1:0
//! plane=ADDR     with control=: ship signed batches to ADDR, spool in DIR/spool
//! passthrough=1  NAME is passthrough: checked, then passed on unterminated
//! ```

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use talos_bench_harness::figures::capacity::Capacity;
use talos_bench_harness::figures::{self, Compare, Load};
use talos_e2e::gateway::{TestConfig, TestSession};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench-figures: {e}");
            ExitCode::FAILURE
        }
    }
}

fn stdin() -> Result<String, String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .map_err(|e| format!("stdin: {e}"))?;
    Ok(s)
}

fn num(s: &str) -> Result<f64, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["compare-table", dir] => print!("{}", Compare::open(Path::new(dir))?.table()),
        ["compare-check", dir] => {
            let bad = Compare::open(Path::new(dir))?.check();
            for b in &bad {
                eprintln!("compare: {b}");
            }
            if !bad.is_empty() {
                eprintln!("compare: a run failed (STRICT=1)");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!("compare: every run got its requests through (STRICT=1)");
        }
        ["load-table", dir] => print!("{}", Load::open(Path::new(dir))?.table()),
        ["capacity-table", dir] => print!("{}", Capacity::open(Path::new(dir))?.table()),
        ["capacity-check", dir] => {
            let bad = Capacity::open(Path::new(dir))?.check();
            for b in &bad {
                eprintln!("capacity: {b}");
            }
            if !bad.is_empty() {
                eprintln!("capacity: a call, request or lease failed (STRICT=1)");
                return Ok(ExitCode::FAILURE);
            }
            eprintln!("capacity: every call, request and lease renewal went through (STRICT=1)");
        }
        ["aes-floor", file] => {
            let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
            println!(
                "{}",
                figures::fixed(figures::aes_bytes_per_second(&text), 0)
            );
        }
        ["ab-round", workload, ticks, tck, t0, t1] => {
            let units = figures::ab_units(workload, &stdin()?);
            let cpu = num(ticks)? / num(tck)?;
            println!(
                "{}",
                figures::ab_round(workload, units, cpu, num(t1)? - num(t0)?)
            );
        }
        ["ab-summary", file, workload] => {
            let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
            print!("{}", figures::ab_summary(&text, workload)?);
        }
        ["masking-round", seconds, ticks, tck] => {
            let bytes = figures::ab_units("mib", &stdin()?);
            let (mbs, g) = figures::masking_round(bytes, num(seconds)?, num(ticks)?, num(tck)?);
            println!("{} {}", figures::py_float(mbs), figures::py_float(g));
        }
        ["masking-summary", off, on, cpu_off, cpu_on] => {
            let list = |s: &str| s.split_whitespace().map(num).collect::<Result<Vec<_>, _>>();
            print!(
                "{}",
                figures::masking_summary(&list(off)?, &list(on)?, &list(cpu_off)?, &list(cpu_on)?)?
            );
        }
        ["idle-line", mode, n, rss0, rss1, opened, said] => println!(
            "{}",
            figures::idle_line(mode, num(n)?, num(rss0)?, num(rss1)?, num(opened)?, said)
        ),
        ["idle-slopes", file] => {
            let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
            print!("{}", figures::idle_slopes(&text));
        }
        ["json-field", name] => {
            let v = figures::json_field(&stdin()?, name)
                .ok_or_else(|| format!("no field {name:?} in the JSON on stdin"))?;
            println!("{v}");
        }
        ["ticks", pids @ ..] if !pids.is_empty() => println!("{}", sum(pids, figures::ticks)?),
        ["sys-ticks", pids @ ..] if !pids.is_empty() => {
            println!("{}", sum(pids, figures::sys_ticks)?);
        }
        ["child-ticks", pid] => println!("{}", figures::child_ticks(pid)?),
        ["machine-ticks"] => println!("{}", figures::machine_ticks()?),
        ["rss-kib", pids @ ..] if !pids.is_empty() => println!("{}", sum(pids, figures::rss_kib)?),
        ["threads", pid] => print!("{}", figures::threads(pid)?),
        ["gateway-config", kv @ ..] => gateway_config(kv)?,
        _ => return Err(
            "usage: bench-figures compare-table|compare-check|load-table|capacity-table|capacity-check DIR | \
                 aes-floor FILE | \
                 ab-round | ab-summary | masking-round | masking-summary | idle-line | idle-slopes FILE | \
                 json-field NAME | \
                 ticks|sys-ticks|rss-kib PID... | child-ticks PID | machine-ticks | threads PID | \
                 gateway-config KEY=VALUE... (see benches/harness/src/bin/bench-figures.rs)"
                .into(),
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn sum(pids: &[&str], f: fn(&str) -> Result<u64, String>) -> Result<u64, String> {
    pids.iter().map(|p| f(p)).sum()
}

/// `gateway-config KEY=VALUE...` (the module's documentation lists them).
fn gateway_config(kv: &[&str]) -> Result<(), String> {
    let mut file = None;
    let mut masked: Option<PathBuf> = None;
    let mut control: Option<PathBuf> = None;
    let mut plane: Option<String> = None;
    let mut passthrough = false;
    let (mut records, mut work) = (PathBuf::new(), PathBuf::new());
    let mut name = String::new();
    let mut c = TestConfig {
        gateway_id: String::new(),
        permit_internal: vec!["127.0.0.1/32".into()],
        limits: String::new(),
        workers: Some(1),
        resolver_timeout_ms: 500,
        connect_timeout_ms: None,
        hello_timeout_ms: None,
        tenant: "bench".into(),
        ..Default::default()
    };
    let mut s = TestSession {
        sources: vec!["127.0.0.1".into()],
        ..Default::default()
    };
    for arg in kv {
        let (k, v) = arg
            .split_once('=')
            .ok_or_else(|| format!("{arg:?} is not KEY=VALUE"))?;
        match k {
            "file" => file = Some(PathBuf::from(v)),
            "id" => c.gateway_id = v.into(),
            "session" => s.id = v.into(),
            "name" => name = v.into(),
            "sources" => s.sources = v.split(',').map(str::to_string).collect(),
            "dns" => {
                c.dns = v
                    .parse()
                    .map_err(|_| format!("dns={v:?} is not ADDR:PORT"))?
            }
            "port" => c.upstream_port = v.parse().map_err(|_| format!("port={v:?}"))?,
            "work" => work = PathBuf::from(v),
            "records" => records = PathBuf::from(v),
            "trust" => s.trust_file = PathBuf::from(v),
            "limits" => c.limits = v.into(),
            "workers" => c.workers = Some(v.parse().map_err(|_| format!("workers={v:?}"))?),
            "masked" => masked = Some(PathBuf::from(v)),
            "permit" => c.permit_internal = v.split(',').map(str::to_string).collect(),
            "control" => control = Some(PathBuf::from(v)),
            "plane" => {
                let addr: std::net::SocketAddr = v
                    .parse()
                    .map_err(|_| format!("plane={v:?} is not ADDR:PORT"))?;
                plane = Some(addr.to_string());
            }
            "passthrough" => passthrough = v == "1",
            _ => return Err(format!("unknown key {k:?}")),
        }
    }
    let file = file.ok_or("file=PATH is missing")?;
    if s.id.is_empty() && masked.is_some() {
        return Err("masked= needs session=ID".into());
    }
    if let Some(dir) = control {
        let mut files = talos_e2e::control::ControlPki::files(&dir);
        if let Some(addr) = plane {
            files.extra = format!(
                "plane = {addr:?}\nspool_dir = {:?}\n",
                dir.join("spool").display().to_string()
            );
        }
        c.control = Some(files);
    } else if plane.is_some() {
        return Err("plane= needs control=DIR".into());
    }
    c.anchors = vec![work.join("origin-ca.pem")];
    if let Some(dir) = masked {
        for i in 1..=4 {
            let path = dir.join(format!("secret{i}"));
            write_secret(&path, i)?;
            c.secrets.push((format!("KEY{i}"), path));
            s.attach.push(format!("KEY{i}={name}:x-api-key-{i}"));
        }
    }
    if passthrough {
        s.passthrough = vec![name.clone()];
    }
    s.allowlist = vec![name];
    if !s.id.is_empty() {
        c.sessions = vec![s];
    }
    std::fs::write(&file, c.toml_with_records(&records))
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// `load-secret-I-` and 32 random hex digits, in a 0600 file.
fn write_secret(path: &Path, i: usize) -> Result<(), String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    use std::io::Write;
    writeln!(f, "load-secret-{i}-{}", hex::encode(bytes))
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmarks' config, with every key the bench scripts pass, is
    /// one the gateway accepts, and says what the shell's heredoc said.
    #[test]
    fn gateway_config_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        talos_e2e::origin::TestCa::new("bench origin CA").write_pem(&d.join("origin-ca.pem"));
        let file = d.join("gateway.toml");
        let p = |n: &str| d.join(n).display().to_string();
        let args = [
            format!("file={}", file.display()),
            "id=gw-bench".into(),
            "session=sbx-bench".into(),
            "name=origin.demo.test".into(),
            "sources=127.0.0.1,127.0.0.2".into(),
            "dns=127.0.0.1:5353".into(),
            "port=4443".into(),
            format!("work={}", d.display()),
            format!("records={}", p("records.jsonl")),
            format!("trust={}", p("session-ca.pem")),
            "limits=max_connections = 30000\nshutdown_grace_ms = 2000".into(),
            "workers=2".into(),
            format!("masked={}", d.display()),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        gateway_config(&args).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        talos_gateway::config::Config::load(&file).unwrap();
        let want = format!(
            r#"gateway_id = "gw-bench"
[listen]
data = "127.0.0.1:0"
admin = "127.0.0.1:0"
[records]
path = "{records}"
[resolver]
nameservers = ["127.0.0.1:5353"]
timeout_ms = 500
attempts = 1
permit_internal = ["127.0.0.1/32"]
[upstream]
port = 4443
extra_trust_anchors = ["{ca}"]
[limits]
max_connections = 30000
shutdown_grace_ms = 2000
[runtime]
workers = 2
[[session]]
id = "sbx-bench"
tenant = "bench"
sources = ["127.0.0.1", "127.0.0.2"]
allowlist = ["origin.demo.test"]
trust_file = "{trust}"
attach = ["KEY1=origin.demo.test:x-api-key-1", "KEY2=origin.demo.test:x-api-key-2", "KEY3=origin.demo.test:x-api-key-3", "KEY4=origin.demo.test:x-api-key-4"]
"#,
            records = p("records.jsonl"),
            ca = p("origin-ca.pem"),
            trust = p("session-ca.pem"),
        );
        let mut want = want;
        for i in 1..=4 {
            want.push_str(&format!(
                "[[secret]]\nname = \"KEY{i}\"\nfile = \"{}\"\n",
                p(&format!("secret{i}"))
            ));
        }
        assert_eq!(text, want);
        for i in 1..=4 {
            let path = d.join(format!("secret{i}"));
            let secret = std::fs::read_to_string(&path).unwrap();
            assert!(secret.starts_with(&format!("load-secret-{i}-")) && secret.len() == 47);
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Unmasked, the defaults: one worker, 127.0.0.1 alone, no attachment.
        let args = [
            format!("file={}", file.display()),
            "id=gw-bench".into(),
            "session=sbx-bench".into(),
            "name=origin.demo.test".into(),
            "dns=127.0.0.1:5353".into(),
            "port=4443".into(),
            format!("work={}", d.display()),
            format!("records={}", p("records.jsonl")),
            format!("trust={}", p("session-ca.pem")),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        gateway_config(&args).unwrap();
        talos_gateway::config::Config::load(&file).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("[limits]\n\n[runtime]\nworkers = 1\n"));
        assert!(text.contains("sources = [\"127.0.0.1\"]\n"));
        assert!(text.ends_with("attach = []\n"));
        // No static session; the control channel, shipping to a plane;
        // the origin's three addresses let through.
        let pki = talos_e2e::control::ControlPki::new(d);
        let args = [
            format!("file={}", file.display()),
            "id=gw-cap".into(),
            "dns=127.0.0.1:5353".into(),
            "port=4443".into(),
            format!("work={}", d.display()),
            format!("records={}", p("records.jsonl")),
            format!("control={}", d.display()),
            "plane=127.0.0.1:7001".into(),
            "permit=127.0.0.1/32,127.0.0.3/32,127.0.0.4/32".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        gateway_config(&args).unwrap();
        let config = talos_gateway::config::Config::load(&file).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains("[[session]]"), "{text}");
        assert!(text.contains(
            "permit_internal = [\"127.0.0.1/32\", \"127.0.0.3/32\", \"127.0.0.4/32\"]\n"
        ));
        let control = config.control.expect("[control]");
        assert_eq!(control.ca_file.get_ref(), &pki.files.ca_file);
        assert_eq!(
            control.plane.expect("plane").get_ref().addrs()[0].port(),
            7001
        );
        assert_eq!(
            control.spool_dir.expect("spool").get_ref(),
            &d.join("spool")
        );
        assert!(gateway_config(&["file=/dev/null", "plane=127.0.0.1:1"]).is_err());
        assert!(gateway_config(&["file=/dev/null", "masked=/tmp"]).is_err());
        assert!(gateway_config(&["id=x"]).is_err());
        assert!(gateway_config(&["file=/dev/null", "colour=blue"]).is_err());
    }
}
