//! The engine's one background thread per mount: the syncer (FFS's 30-second update
//! daemon) and the strategy's background work (soft updates' worklist), both outside
//! application calls.
//!
//! Attached when a file system is mounted read-write; stopped (and joined) at unmount. It
//! holds only a weak reference to the file system, so dropping the last strong one ends it.
//! In a `Concurrent` mode it writes without the engine's lock, so it never stalls a call;
//! in a `Serialized` mode it takes the lock for each write-back, as sync's ordering needs.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::Ffs;
use crate::strategy::SyncWhy;

/// How long one round of background work may run before the worker looks at its other
/// duties again (FreeBSD's `softdep_process_worklist` gives up the CPU after a second).
const BACKGROUND_SLICE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Control {
    stop: bool,
}

pub(crate) struct Worker {
    ctl: Arc<(Mutex<Control>, Condvar)>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Worker {
    /// A worker that has not been started (read-only mounts never start one).
    pub fn idle() -> Worker {
        Worker {
            ctl: Arc::new((Mutex::new(Control::default()), Condvar::new())),
            handle: Mutex::new(None),
        }
    }

    /// Starts the thread: write-back every `syncer` and on `wake`, background work every
    /// `background` (if the strategy has any).
    pub fn start(
        &self,
        fs: Weak<Ffs>,
        syncer: Duration,
        background: Option<Duration>,
    ) -> std::io::Result<()> {
        let ctl = self.ctl.clone();
        let h = std::thread::Builder::new()
            .name("cairn-worker".into())
            .spawn(move || run(fs, ctl, syncer, background))?;
        *self.handle.lock() = Some(h);
        Ok(())
    }

    /// Stops the thread and waits for it (unless this is the worker itself, dropping the
    /// last reference to the file system).
    pub fn stop(&self) {
        self.ctl.0.lock().stop = true;
        self.ctl.1.notify_all();
        if let Some(h) = self.handle.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

fn run(
    fs: Weak<Ffs>,
    ctl: Arc<(Mutex<Control>, Condvar)>,
    syncer: Duration,
    background: Option<Duration>,
) {
    let mut next_sync = Instant::now() + syncer;
    let mut next_bg = background.map(|b| Instant::now() + b);
    loop {
        {
            let mut c = ctl.0.lock();
            loop {
                if c.stop {
                    return;
                }
                let now = Instant::now();
                if now >= next_sync || next_bg.is_some_and(|t| now >= t) {
                    break;
                }
                let until = next_bg.map_or(next_sync, |t| t.min(next_sync));
                ctl.1.wait_until(&mut c, until);
            }
        }
        let Some(f) = fs.upgrade() else { return };
        let now = Instant::now();
        if now >= next_sync {
            if f.vol.cache.dirty_count() > 0
                && let Err(e) = f.sync_as(SyncWhy::Periodic)
            {
                log::error!("syncer write-back failed: {e}");
            }
            next_sync = now + syncer;
        }
        if let (Some(at), Some(every)) = (next_bg, background)
            && now >= at
        {
            let start = Instant::now();
            loop {
                match f.strategy.background(&*f) {
                    Ok(true) if start.elapsed() < BACKGROUND_SLICE => continue,
                    Ok(_) => break,
                    Err(e) => {
                        log::error!("background work failed: {e}");
                        break;
                    }
                }
            }
            next_bg = Some(Instant::now() + every);
        }
    }
}
