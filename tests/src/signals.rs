//! Signals to a process the test started, by its PID, as an operator (or a
//! fault) sends them: with the `kill` command.

use std::process::Command;

/// A signal the fault tests send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ends the process at once: no handler, no drain, nothing flushed.
    Kill,
    /// Freezes the process (a hung member: a stuck VM, a long GC pause, a
    /// debugger); the kernel still accepts connections into its backlog.
    Stop,
    /// Wakes a stopped process.
    Cont,
    /// The graceful drain.
    Term,
    /// What operators send to reload; must never end the process.
    Hup,
}

impl Signal {
    /// The name `kill -NAME` takes.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Kill => "KILL",
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
            Signal::Term => "TERM",
            Signal::Hup => "HUP",
        }
    }
}

/// Send `signal` to process `pid`.
///
/// # Panics
/// If `kill` fails (no such process): a test must not quietly signal
/// nothing.
pub fn send(pid: u32, signal: Signal) {
    assert!(pid > 0, "no process to send SIG{} to", signal.name());
    let status = Command::new("kill")
        .arg(format!("-{}", signal.name()))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(
        status.success(),
        "kill -{} {pid} failed: the process is gone",
        signal.name()
    );
}

/// The scheduler state of process `pid` from `/proc/PID/stat` (`R`, `S`,
/// `T` for stopped, `Z` for a zombie…), or `None` once it is reaped.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state
    // is the first field after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}
