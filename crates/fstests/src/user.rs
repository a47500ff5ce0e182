//! Running checks as an unprivileged user.
//!
//! The suites run as root (the mount is made by root with allow_other), so permission checks
//! need a process with other credentials. [`as_user`] forks a child that drops to the given
//! uid/gid/groups, runs the checks and reports each result back through a pipe; the parent
//! prints them and fails the test on any failed check. The child never returns into the test
//! harness: it leaves with `_exit`.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Uid, fork, pipe, setgid, setgroups, setuid};

use crate::{Errnoish, errno_name};

/// Checks made in the child; each line travels back to the parent.
#[derive(Default)]
pub struct Checks {
    lines: Vec<String>,
}

impl Checks {
    /// `r` must fail with `expected`.
    pub fn err<T>(&mut self, r: impl Errnoish<T>, expected: i32, what: &str) {
        let line = match r.errno_result() {
            Err(e) if e == expected => format!("ok   {what} -> {}", errno_name(e)),
            Err(e) => format!(
                "FAIL {what}: expected {} got {}",
                errno_name(expected),
                errno_name(e)
            ),
            Ok(_) => format!("FAIL {what}: expected {} got success", errno_name(expected)),
        };
        self.lines.push(line);
    }

    /// `r` must succeed; returns its value if it did.
    pub fn ok<T>(&mut self, r: impl Errnoish<T>, what: &str) -> Option<T> {
        match r.errno_result() {
            Ok(v) => {
                self.lines.push(format!("ok   {what}"));
                Some(v)
            }
            Err(e) => {
                self.lines.push(format!(
                    "FAIL {what}: expected success got {}",
                    errno_name(e)
                ));
                None
            }
        }
    }

    /// `cond` must hold.
    pub fn check(&mut self, cond: bool, what: &str) {
        self.lines.push(if cond {
            format!("ok   {what}")
        } else {
            format!("FAIL {what}")
        });
    }
}

/// Runs `f` in a child process with credentials uid/gid and supplementary `groups`, umask
/// 022, and panics (after printing every line) if any check failed or the child crashed.
#[track_caller]
pub fn as_user(uid: u32, gid: u32, groups: &[u32], label: &str, f: impl FnOnce(&mut Checks)) {
    let failed = run_as(uid, gid, groups, label, f);
    assert!(
        failed.is_empty(),
        "{label} as uid {uid}: {} check(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// [`as_user`] without the verdict: prints every line and returns the failed ones (a
/// child that crashed is one failed line).
pub fn run_as(
    uid: u32,
    gid: u32,
    groups: &[u32],
    label: &str,
    f: impl FnOnce(&mut Checks),
) -> Vec<String> {
    let (rd, wr) = pipe().expect("pipe");
    // SAFETY: the child only makes system calls, allocates (glibc's malloc is fork-safe via
    // its atfork handlers) and leaves with _exit, never returning into the multi-threaded
    // harness or running destructors of state shared with other threads.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            drop(rd);
            let mut out = std::fs::File::from(wr);
            let res = catch_unwind(AssertUnwindSafe(|| {
                let gs: Vec<Gid> = groups.iter().map(|&g| Gid::from_raw(g)).collect();
                setgroups(&gs).map_err(|e| format!("setgroups: {e}"))?;
                setgid(Gid::from_raw(gid)).map_err(|e| format!("setgid: {e}"))?;
                setuid(Uid::from_raw(uid)).map_err(|e| format!("setuid: {e}"))?;
                nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
                let mut c = Checks::default();
                f(&mut c);
                Ok::<_, String>(c.lines)
            }));
            let text = match res {
                Ok(Ok(lines)) => lines.join("\n"),
                Ok(Err(e)) => format!("FAIL cannot drop privileges: {e}"),
                Err(_) => "FAIL the checks panicked".to_string(),
            };
            let _ = out.write_all(text.as_bytes());
            drop(out);
            // SAFETY: _exit ends the child without running atexit handlers or destructors.
            unsafe { libc::_exit(0) };
        }
        ForkResult::Parent { child } => {
            drop(wr);
            let mut text = String::new();
            std::fs::File::from(rd)
                .read_to_string(&mut text)
                .expect("read child report");
            let status = waitpid(child, None).expect("waitpid");
            let mut failed = Vec::new();
            for l in text.lines() {
                crate::say!("[{label} as uid {uid}] {l}");
                if l.starts_with("FAIL") {
                    failed.push(l.to_string());
                }
            }
            if !matches!(status, WaitStatus::Exited(_, 0)) {
                failed.push(format!("FAIL {label}: child ended with {status:?}"));
            }
            failed
        }
    }
}

/// Errno name re-exported for child-side messages.
pub fn name(e: i32) -> String {
    errno_name(e)
}
