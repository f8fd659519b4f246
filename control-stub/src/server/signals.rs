//! The signals `serve` acts on or logs: SIGTERM, SIGINT and SIGQUIT start
//! the drain; the others whose default action would end the process
//! without a word are logged and ignored.
//!
//! Each handler is installed when [`Signals::listen`] returns, which
//! `serve` calls before it prints its ready line, so a signal sent the
//! moment the line is read finds its handler rather than the default
//! action. From [`Signals::handle`] to [`Handled::stop`], the drain's last
//! step, every signal is logged (a second SIGTERM during the drain too).

use tokio::signal::unix::Signal;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The signals that end `serve`.
const SHUTDOWN_SIGNALS: [(i32, &str); 3] = [(15, "SIGTERM"), (2, "SIGINT"), (3, "SIGQUIT")];

/// Signals whose default action would end `serve` without a word: each is
/// logged and ignored (SIGHUP included: `serve` reads no config file to
/// reload).
const LOGGED_SIGNALS: [(i32, &str); 9] = [
    (1, "SIGHUP"),
    (10, "SIGUSR1"),
    (12, "SIGUSR2"),
    (14, "SIGALRM"),
    (16, "SIGSTKFLT"),
    (26, "SIGVTALRM"),
    (27, "SIGPROF"),
    (29, "SIGIO"),
    (30, "SIGPWR"),
];

/// The handlers, installed and not yet handled.
#[derive(Debug)]
pub struct Signals {
    /// SIGTERM, SIGINT, SIGQUIT: shutting down.
    shutdown: Vec<(&'static str, Signal)>,
    /// [`LOGGED_SIGNALS`]: logged and ignored.
    logged: Vec<(&'static str, Signal)>,
}

impl Signals {
    /// Install the handlers now (inside the runtime's context). A signal
    /// that cannot be listened for keeps its default action, and says so.
    pub fn listen() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |list: &[(i32, &'static str)]| {
            list.iter()
                .filter_map(|&(raw, name)| match signal(SignalKind::from_raw(raw)) {
                    Ok(s) => Some((name, s)),
                    Err(e) => {
                        eprintln!(
                            "{}",
                            serde_json::json!({"signal": name, "error": format!("cannot listen for it: {e}")})
                        );
                        None
                    }
                })
                .collect()
        };
        Signals {
            shutdown: install(&SHUTDOWN_SIGNALS),
            logged: install(&LOGGED_SIGNALS),
        }
    }

    /// Handle them from now on: each logged signal is logged and ignored;
    /// the first shutdown signal is logged and fires the [`Shutdown`] in
    /// the [`Handled`] returned, and every later one is logged too.
    pub fn handle(self) -> Handled {
        let (fire, fired) = watch::channel(false);
        let fire = std::sync::Arc::new(fire);
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        for (name, mut s) in self.shutdown {
            let fire = std::sync::Arc::clone(&fire);
            let stop = stop.clone();
            tasks.spawn(async move {
                // Kept listening while shutting down: a second signal is
                // caught too, never the default action.
                while recv(&mut s, &stop).await {
                    let action = if fire.send_replace(true) {
                        "already shutting down"
                    } else {
                        "shutting down"
                    };
                    eprintln!("{}", serde_json::json!({"signal": name, "action": action}));
                }
            });
        }
        for (name, mut s) in self.logged {
            let stop = stop.clone();
            tasks.spawn(async move {
                while recv(&mut s, &stop).await {
                    eprintln!(
                        "{}",
                        serde_json::json!({"signal": name, "action": "ignored"})
                    );
                }
            });
        }
        tasks.close();
        Handled {
            shutdown: Shutdown(fired),
            tasks,
            stop,
        }
    }
}

/// Whether `s` came before `stop` fired.
async fn recv(s: &mut Signal, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        got = s.recv() => got.is_some(),
    }
}

/// The signals being handled: what the first shutdown signal fires, and
/// the handlers' tasks.
#[derive(Debug)]
pub struct Handled {
    pub shutdown: Shutdown,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Handled {
    /// Stop handling: the handlers' tasks end. (The handlers stay
    /// installed: a signal from here to the process's exit is neither
    /// logged nor acted on.)
    pub async fn stop(self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

/// Fired by the first shutdown signal ([`Signals::handle`]).
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Resolves once a shutdown signal has come (at once if one came
    /// before); never, if none can.
    pub async fn wait(mut self) {
        if self.0.wait_for(|fired| *fired).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
