//! Named points in the migration protocol where the crash test widens the window for a
//! `kill -9`: with `CAIRN_UMBRELLA_DELAY_MS=N` set, each point sleeps N milliseconds.

use std::sync::OnceLock;
use std::time::Duration;

static DELAY: OnceLock<Option<Duration>> = OnceLock::new();

pub fn hit(name: &str) {
    let d = DELAY.get_or_init(|| {
        std::env::var("CAIRN_UMBRELLA_DELAY_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
    });
    if let Some(d) = d {
        log::trace!("failpoint {name}");
        std::thread::sleep(*d);
    }
}
