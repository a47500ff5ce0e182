//! How cairn's threads ask the scheduler for the CPU: the threads that serve calls and
//! the background threads that compete with them on the same CPU.
//!
//! Linux's fair scheduler (EEVDF, 6.6 on) lets a thread that wakes up preempt the running
//! one only where the woken thread's slice is shorter, or once the running thread has used
//! its own; without a high-resolution tick (the usual configuration) a used-up slice is
//! noticed at the next tick, 4 ms apart at 250 Hz. A call woken while a background thread
//! of the same daemon (the LFS syncer cleaning) runs with a slice as long as its own
//! therefore waited up to a tick for the CPU: measured on the LFS overwrite benchmark
//! (docs/bench/history.md, "Calls preempt the syncer at once"), the syncer kept the CPU
//! for 2.9-3.5 ms while the woken call sat runnable; with the calls' threads asking for a
//! short slice ([`serve_calls`]) the calls' median p99 while the cleaner ran went from
//! 1.77 to 0.87 ms.
//!
//! A slice is not a share: a shorter one changes when a thread is preempted and may
//! preempt, not how much CPU it gets. Any thread may set its own (since 6.12; earlier
//! kernels accept the attribute block and ignore the slice) and raise its own niceness,
//! so nothing here needs a privilege, and a failure costs only latency: callers log it
//! and go on.

use std::io;

/// The scheduler slice of a thread that serves calls (FUSE request threads, and anything
/// that calls a cairn file system directly and wants its latency): the kernel's shortest.
/// A call runs for tens of microseconds and then sleeps; it is the thread to run first
/// when it wakes, and it gives the CPU back long before such a slice ends.
pub const CALL_SLICE_NS: u64 = 100_000;

/// Asks for [`CALL_SLICE_NS`] for the calling thread, at its niceness now: what every
/// thread serving the kernel's requests does as it serves its first (`cairn-fuse`).
pub fn serve_calls() -> io::Result<()> {
    let nice = rustix::process::getpriority_process(Some(rustix::thread::gettid()))?;
    set_thread(nice, CALL_SLICE_NS)
}

/// `sched_setattr(2)` on the calling thread: niceness `nice` and a slice of `ns` (0: the
/// kernel's default), in the thread's own scheduling class (`SCHED_FLAG_KEEP_POLICY`): a
/// daemon an administrator started in the batch class keeps it, and one in a real-time
/// class refuses the change (no priority is given) rather than losing it. No wrapper
/// exists in the crates used; the attribute block is the kernel's first version (48
/// bytes), which every kernel since 3.14 takes (the flag since 4.20; earlier ones refuse
/// it, which costs only the slice).
#[allow(unsafe_code)]
pub fn set_thread(nice: i32, ns: u64) -> io::Result<()> {
    let attr = libc::sched_attr {
        size: std::mem::size_of::<libc::sched_attr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: libc::SCHED_FLAG_KEEP_POLICY as u64,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: ns,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: `attr` is a valid, initialized `sched_attr` that outlives the call, its
    // `size` field says how many bytes the kernel may read, and pid 0 names the calling
    // thread; the kernel writes nothing back.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            0,
            &attr as *const libc::sched_attr,
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's scheduler slice in nanoseconds, as the kernel shows it
/// (`se.slice` of /proc/thread-self/sched; `None` where the kernel does not).
pub fn thread_slice() -> Option<u64> {
    let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
    slice_in(&sched)
}

/// `se.slice` of a /proc/.../sched text, in nanoseconds.
pub fn slice_in(sched: &str) -> Option<u64> {
    let line = sched.lines().find(|l| l.starts_with("se.slice "))?;
    line.rsplit(' ').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
    }

    /// A thread that serves calls gets the short slice on kernels that show slices, and
    /// keeps its niceness (a slice is not a priority).
    #[test]
    fn a_call_thread_asks_for_the_short_slice_and_keeps_its_niceness() {
        let (before, after, slice) = std::thread::spawn(|| {
            let before = nice();
            serve_calls().unwrap();
            (before, nice(), thread_slice())
        })
        .join()
        .unwrap();
        assert_eq!(before, after);
        if let Some(s) = slice {
            assert_eq!(s, CALL_SLICE_NS, "se.slice after serve_calls");
        }
    }

    /// The thread's scheduling class (field 41 of /proc/thread-self/stat).
    fn policy() -> u32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split(' ').nth(38).unwrap().parse().unwrap()
    }

    /// A thread in the batch class (as `chrt --batch` starts a daemon) keeps its class when
    /// it asks for the call slice, and gets the slice.
    #[test]
    #[allow(unsafe_code)]
    fn the_thread_keeps_its_scheduling_class() {
        let (class, slice) = std::thread::spawn(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is valid for the call; pid 0 is the calling thread.
            let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
            serve_calls().unwrap();
            (policy(), thread_slice())
        })
        .join()
        .unwrap();
        assert_eq!(
            class,
            libc::SCHED_BATCH as u32,
            "the batch class was replaced"
        );
        if let Some(s) = slice {
            assert_eq!(s, CALL_SLICE_NS);
        }
    }

    #[test]
    fn the_slice_is_read_from_the_sched_text() {
        let text = "x (1, #threads: 1)\n---\nse.exec_start : 1.0\nse.slice      :     100000\n";
        assert_eq!(slice_in(text), Some(100_000));
        assert_eq!(slice_in("se.vruntime : 3\n"), None);
    }
}
