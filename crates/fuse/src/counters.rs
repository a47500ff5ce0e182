//! FUSE round trips per opcode.
//!
//! Every request the kernel sends costs two context switches and, on this machine, usually a
//! cross-CPU wake-up; the benchmark divides these counts by the operations a workload did to
//! report round trips per operation, which is the number the kernel-caching features exist
//! to cut. Counting is one relaxed atomic add per request, cheap enough to be always on.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! ops {
    ($($variant:ident => $name:literal,)*) => {
        /// A FUSE request type, as counted by [`RequestCounts`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op {
            $($variant,)*
        }

        impl Op {
            /// Every opcode, in the order [`Op::index`] numbers them.
            pub const ALL: &'static [Op] = &[$(Op::$variant,)*];

            /// The kernel's name for the opcode, lower-case (`lookup`, `readdirplus`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$variant => $name,)*
                }
            }
        }
    };
}

ops! {
    Lookup => "lookup",
    Forget => "forget",
    Getattr => "getattr",
    Setattr => "setattr",
    Readlink => "readlink",
    Mknod => "mknod",
    Mkdir => "mkdir",
    Unlink => "unlink",
    Rmdir => "rmdir",
    Symlink => "symlink",
    Rename => "rename",
    Link => "link",
    Open => "open",
    Read => "read",
    Write => "write",
    Flush => "flush",
    Release => "release",
    Fsync => "fsync",
    Opendir => "opendir",
    Readdir => "readdir",
    Readdirplus => "readdirplus",
    Releasedir => "releasedir",
    Fsyncdir => "fsyncdir",
    Statfs => "statfs",
    Setxattr => "setxattr",
    Getxattr => "getxattr",
    Listxattr => "listxattr",
    Removexattr => "removexattr",
    Access => "access",
    Create => "create",
    Getlk => "getlk",
    Setlk => "setlk",
    Bmap => "bmap",
    Ioctl => "ioctl",
    Poll => "poll",
    Fallocate => "fallocate",
    Lseek => "lseek",
    CopyFileRange => "copy_file_range",
    Statx => "statx",
    Tmpfile => "tmpfile",
}

impl Op {
    pub fn index(self) -> usize {
        self as usize
    }
}

const N: usize = Op::ALL.len();

/// Requests served, per opcode, since the mount. Shared between the serving threads and
/// whoever reports them (`cairn stats`, the benchmark).
#[derive(Debug)]
pub struct RequestCounts {
    requests: [AtomicU64; N],
    errors: [AtomicU64; N],
    /// Answers that are errors to the protocol but not failures: a lookup of a name that
    /// does not exist, an extended attribute that is not set, the deliberate ENOSYS to
    /// FLUSH that tells the kernel to stop sending it.
    negative: [AtomicU64; N],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    /// Requests that arrived over each transport (forgets always come over /dev/fuse).
    via_uring: AtomicU64,
    via_dev: AtomicU64,
    /// The room the kernel's write-backs may count on (docs/DESIGN.md, "A full disk"):
    /// the mount's dirty limit (bytes, set once after INIT), the opens given no page cache
    /// because the file system was short of room, and write-backs that failed anyway.
    dirty_limit: AtomicU64,
    direct_opens: AtomicU64,
    write_backs_lost: AtomicU64,
    /// How the mount's transport was settled (set once, after INIT).
    transport: OnceLock<TransportReport>,
}

/// How a mount's requests travel: what was asked for (`-o transport=`), what serves it, and
/// why, when that is not what `auto` or the option would suggest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportReport {
    /// "auto", "uring" or "dev", as the mount option said.
    pub requested: &'static str,
    /// "uring" or "dev".
    pub active: &'static str,
    /// io_uring queues (one per possible CPU) when `active` is "uring", else 0.
    pub queues: usize,
    /// Ring entries per queue (`uring_depth`) when `active` is "uring", else 0.
    pub depth: usize,
    /// Why io_uring is not in use, when it was wanted.
    pub reason: Option<String>,
}

impl TransportReport {
    /// The one line the mount log gets, e.g. `FUSE transport: io_uring (2 queues, one per
    /// CPU, 2 entries each)`.
    pub fn line(&self) -> String {
        match (self.active, &self.reason) {
            ("uring", _) => format!(
                "FUSE transport: io_uring ({} queues, one per CPU, {} entries each)",
                self.queues, self.depth
            ),
            (_, Some(why)) => format!("FUSE transport: /dev/fuse ({why})"),
            _ => "FUSE transport: /dev/fuse".to_string(),
        }
    }
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            negative: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            via_uring: AtomicU64::new(0),
            via_dev: AtomicU64::new(0),
            dirty_limit: AtomicU64::new(0),
            direct_opens: AtomicU64::new(0),
            write_backs_lost: AtomicU64::new(0),
            transport: OnceLock::new(),
        }
    }
}

impl RequestCounts {
    pub(crate) fn request(&self, op: Op) {
        self.requests[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn error(&self, op: Op) {
        self.errors[op.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an error answer as a failure or, when it is the normal answer to the
    /// question asked (see [`is_negative_answer`]), as a negative answer.
    pub(crate) fn answered(&self, op: Op, errno: i32) {
        if is_negative_answer(op, errno) {
            self.negative[op.index()].fetch_add(1, Ordering::Relaxed);
        } else {
            self.error(op);
        }
    }

    pub(crate) fn read_bytes(&self, n: usize) {
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn wrote_bytes(&self, n: usize) {
        self.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_dirty_limit(&self, bytes: u64) {
        self.dirty_limit.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn direct_open(&self) {
        self.direct_opens.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn write_back_lost(&self) {
        self.write_backs_lost.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn via_uring(&self) {
        self.via_uring.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn via_dev(&self) {
        self.via_dev.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_transport(&self, t: TransportReport) {
        let _ = self.transport.set(t);
    }

    /// How the mount's transport was settled (None until INIT is done).
    pub fn transport(&self) -> Option<&TransportReport> {
        self.transport.get()
    }

    /// Requests that arrived over io_uring and over /dev/fuse.
    pub fn by_transport(&self) -> (u64, u64) {
        (
            self.via_uring.load(Ordering::Relaxed),
            self.via_dev.load(Ordering::Relaxed),
        )
    }

    /// Requests of type `op` served so far.
    pub fn get(&self, op: Op) -> u64 {
        self.requests[op.index()].load(Ordering::Relaxed)
    }

    /// Requests of type `op` answered with an error that is a failure.
    pub fn errors(&self, op: Op) -> u64 {
        self.errors[op.index()].load(Ordering::Relaxed)
    }

    /// Requests of type `op` answered "no such name / attribute / operation" as asked.
    pub fn negative(&self, op: Op) -> u64 {
        self.negative[op.index()].load(Ordering::Relaxed)
    }

    /// All requests served so far.
    pub fn total(&self) -> u64 {
        self.requests
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// The counts as JSON (`forget` counts inodes forgotten: the binding splits each
    /// BATCH_FORGET round trip into one call per inode):
    /// `{"total": n, "requests": {"lookup": n, ...}, "errors": {...}, "negative": {...},
    /// "bytes_read": n, "bytes_written": n, "transport": {"requested": "auto", "active":
    /// "uring", "queues": 2, "depth": 2, "uring_requests": n, "dev_requests": n[, "reason": "..."]}`.
    /// Opcodes never seen are left out of `requests` and `errors`
    /// (absent means zero), so a report lists only what a workload actually used.
    pub fn to_json(&self) -> serde_json::Value {
        let nonzero = |counters: &[AtomicU64; N]| {
            let mut m = serde_json::Map::new();
            for op in Op::ALL {
                let v = counters[op.index()].load(Ordering::Relaxed);
                if v != 0 {
                    m.insert(op.name().to_string(), v.into());
                }
            }
            serde_json::Value::Object(m)
        };
        let (uring, dev) = self.by_transport();
        let mut transport = serde_json::json!({
            "uring_requests": uring,
            "dev_requests": dev,
        });
        if let Some(t) = self.transport() {
            transport["requested"] = t.requested.into();
            transport["active"] = t.active.into();
            transport["queues"] = t.queues.into();
            transport["depth"] = t.depth.into();
            if let Some(r) = &t.reason {
                transport["reason"] = r.clone().into();
            }
        }
        serde_json::json!({
            "transport": transport,
            "total": self.total(),
            "requests": nonzero(&self.requests),
            "errors": nonzero(&self.errors),
            "negative": nonzero(&self.negative),
            "bytes_read": self.bytes_read.load(Ordering::Relaxed),
            "bytes_written": self.bytes_written.load(Ordering::Relaxed),
            "room": {
                "dirty_limit": self.dirty_limit.load(Ordering::Relaxed),
                "direct_opens": self.direct_opens.load(Ordering::Relaxed),
                "write_backs_lost": self.write_backs_lost.load(Ordering::Relaxed),
            },
        })
    }
}

/// Whether `errno` is the ordinary answer to `op` rather than a failure: ENOENT to a lookup
/// (the kernel asks before every create), ENODATA to getxattr/removexattr (most files have
/// no such attribute: `ls -l` asks for ACLs and capabilities), ENOSYS to FLUSH (answered on
/// purpose so the kernel stops sending it).
pub fn is_negative_answer(op: Op, errno: i32) -> bool {
    matches!(
        (op, errno),
        (Op::Lookup, libc::ENOENT)
            | (Op::Getxattr | Op::Removexattr, libc::ENODATA)
            | (Op::Flush, libc::ENOSYS)
            // A file system without O_TMPFILE: programs fall back to a named file.
            | (Op::Tmpfile, libc::EOPNOTSUPP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_dense_and_names_unique() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
        }
        let mut names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
    }

    #[test]
    fn json_lists_only_seen_opcodes() {
        let c = RequestCounts::default();
        c.request(Op::Lookup);
        c.request(Op::Lookup);
        c.request(Op::Create);
        c.error(Op::Lookup);
        c.wrote_bytes(10);
        let j = c.to_json();
        assert_eq!(j["total"], 3);
        assert_eq!(j["requests"]["lookup"], 2);
        assert_eq!(j["requests"]["create"], 1);
        assert!(j["requests"].get("getattr").is_none());
        assert_eq!(j["errors"]["lookup"], 1);
        assert_eq!(j["bytes_written"], 10);
        assert_eq!(c.get(Op::Lookup), 2);
        assert_eq!(c.errors(Op::Create), 0);
    }

    #[test]
    fn ordinary_negative_answers_are_not_errors() {
        let c = RequestCounts::default();
        c.answered(Op::Lookup, libc::ENOENT);
        c.answered(Op::Getxattr, libc::ENODATA);
        c.answered(Op::Flush, libc::ENOSYS);
        c.answered(Op::Lookup, libc::EACCES);
        c.answered(Op::Create, libc::ENOENT);
        assert_eq!(c.errors(Op::Lookup), 1);
        assert_eq!(c.negative(Op::Lookup), 1);
        assert_eq!(c.errors(Op::Getxattr) + c.errors(Op::Flush), 0);
        assert_eq!(c.errors(Op::Create), 1);
        let j = c.to_json();
        assert_eq!(j["negative"]["getxattr"], 1);
        assert!(j["errors"].get("flush").is_none());
    }
}
