//! Named points in the migration protocol, where tests widen, stop or crash a move.
//!
//! Each point is a moment at which the branches hold a distinct state of a move (see
//! `migrate`); [`POINTS`] lists them in protocol order. Three ways to act at one:
//! - `CAIRN_UMBRELLA_DELAY_MS=N` in the daemon's environment: every point sleeps N ms, so
//!   a `kill -9` from outside lands inside moves (`crates/fstests/tests/umbrella_crash.rs`);
//! - `CAIRN_UMBRELLA_CRASH_AT=NAME`: the daemon kills itself with SIGKILL at the first hit
//!   of point NAME, a crash at exactly that step (`crates/cli/tests/umbrella.rs`);
//! - a hook on a live layer ([`crate::Umbrella::set_failpoint_hook`], in-process tests):
//!   called with the point's name on the migrating thread, it may block the move or change
//!   the namespace through the mount to race it.
//!
//! Unset, a point costs one relaxed load and one uncontended lock.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

/// The points, in the order a move reaches them.
pub const POINTS: &[&str] = &[
    // The source's names and identity are taken; nothing exists on the target yet.
    "gathered",
    // The copy is complete and fsynced in the target's tmp/; no record yet.
    "copied",
    // The move record is durable; nothing is visible on the target yet.
    "recorded",
    // The copy holds the file's first name on the target; other names not linked yet.
    "renamed",
    // Every name is on the target and fsynced; the source is untouched.
    "linked",
    // The first source name is removed (others, if any, remain).
    "unlinked-one",
    // Every source name is removed and the index says target; the record remains.
    "unlinked",
];

/// A test's action at a point, called with its name.
pub type Hook = Arc<dyn Fn(&str) + Send + Sync>;

#[derive(Default)]
pub(crate) struct Failpoints {
    hook: Mutex<Option<Hook>>,
}

struct Env {
    delay: Option<Duration>,
    crash_at: Option<String>,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| Env {
        delay: std::env::var("CAIRN_UMBRELLA_DELAY_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis),
        crash_at: std::env::var("CAIRN_UMBRELLA_CRASH_AT").ok(),
    })
}

impl Failpoints {
    pub fn set(&self, hook: Option<Hook>) {
        *self.hook.lock() = hook;
    }

    pub fn hit(&self, name: &str) {
        debug_assert!(POINTS.contains(&name), "unknown failpoint {name}");
        let e = env();
        if let Some(d) = e.delay {
            log::trace!("failpoint {name}");
            std::thread::sleep(d);
        }
        if e.crash_at.as_deref() == Some(name) {
            log::warn!("failpoint {name}: CAIRN_UMBRELLA_CRASH_AT, killing the daemon");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        let hook = self.hook.lock().clone();
        if let Some(h) = hook {
            h(name);
        }
    }
}
