//! One queue's io_uring and the ring entries it registers with the kernel: the only code in
//! the transport that needs `unsafe`, kept to what the kernel interface forces on it.
//!
//! # The memory the kernel writes into
//!
//! A ring entry is two buffers, the 288-byte request header and the payload (as large as
//! the largest request or reply), whose addresses REGISTER hands the kernel. From then on
//! the kernel may write into them (a request) or read them (a reply) whenever it holds a
//! command of ours for that entry, and only then: REGISTER or COMMIT_AND_FETCH submitted,
//! its completion not yet reaped. The kernel copies a request in and then completes the
//! command; it reads a reply while it processes the COMMIT_AND_FETCH we submitted.
//!
//! So ownership of an entry's buffers passes back and forth with the commands: an SQE gives
//! them to the kernel (`in_kernel = true`), its CQE gives them back. [`Ring::bufs`] lends
//! them to the server only while `in_kernel` is false, and an entry is never freed while it
//! is true: on a teardown that cannot wait for the kernel (see [`Ring::drop`]) those
//! buffers are leaked, never returned to the allocator, so a late kernel write can land in
//! no other object. On the normal teardown (unmount, daemon exit with the mount gone) the
//! kernel completes every command with ENOTCONN first, and nothing leaks.

#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::abi::{self, CmdReq};

/// Page alignment, as libfuse uses: the kernel copies with copy_to_user, which needs none,
/// but whole pages keep two entries from sharing one.
const ALIGN: usize = 4096;

/// A zeroed, page-aligned allocation whose address the kernel keeps. Only [`Ring`] touches
/// it, under the ownership rule in the module comment.
struct RingBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RingBuf is a uniquely owned heap allocation, like Box<[u8]>; moving it to the
// queue's thread moves that ownership. The kernel's access is governed by `in_kernel`,
// which belongs to the same owner.
unsafe impl Send for RingBuf {}

impl RingBuf {
    fn new(len: usize) -> io::Result<RingBuf> {
        let len = len.max(1).next_multiple_of(ALIGN);
        let layout = Layout::from_size_align(len, ALIGN).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(RingBuf { ptr, len })
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The bytes. Callers ([`Ring::bufs`]) only ask while the kernel holds no command for the
    /// entry, so nobody else reads or writes them meanwhile; `&mut self` excludes other
    /// Rust borrows.
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` initialized (zeroed, then only ever
        // written with bytes) bytes owned by self; see above for exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        // Entries whose buffers the kernel may still use are forgotten, not dropped
        // (Entry::drop), so reaching here means the kernel has let go.
        if let Ok(layout) = Layout::from_size_align(self.len, ALIGN) {
            // SAFETY: allocated in `new` with this very layout, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

/// One ring entry: its buffers, the iovec pair REGISTER points the kernel at, and whether
/// the kernel holds a command for it.
struct Entry {
    header: Option<RingBuf>,
    payload: Option<RingBuf>,
    /// `struct iovec[2]`: header base, length, payload base, length. Boxed so its address
    /// stays put; the kernel reads it while it issues the REGISTER.
    iov: Option<Box<[u64; 4]>>,
    in_kernel: bool,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.in_kernel {
            // The kernel may still write here: leak, never free (module comment).
            std::mem::forget(self.header.take());
            std::mem::forget(self.payload.take());
            std::mem::forget(self.iov.take());
        }
    }
}

/// user_data of the stop-signal poll; entries use their index.
pub(super) const STOP: u64 = u64::MAX;

/// A queue's io_uring (SQE128, the size FUSE commands need) and its entries.
pub(super) struct Ring {
    // Field order matters for Drop: the ring (and with it the poll on `stop`) goes before
    // the entries and the eventfd.
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<Entry>,
    stop: Arc<EventFd>,
    pub(super) qid: u16,
    /// Which of the queue's rings this is (0 is the one pinned to the queue's CPU).
    pub(super) slot: u16,
}

impl Ring {
    /// Ring `slot` of queue `qid`, with `depth` entries of `payload_len` bytes.
    pub(super) fn new(qid: u16, slot: u16, depth: usize, payload_len: usize) -> io::Result<Ring> {
        let sq = u32::try_from(depth + 2).map_err(io::Error::other)?;
        // One thread submits to and waits on this ring, so the kernel may run the task
        // work that delivers a request (`fuse_uring_send_in_task`) when that thread waits for
        // completions, instead of interrupting it (DEFER_TASKRUN, which needs SINGLE_ISSUER).
        // The ring is made here, on the thread answering INIT, and used by the queue thread:
        // it starts disabled and the queue thread enables it (`enable`), which makes that
        // thread its one issuer.
        let uring = IoUring::builder()
            .setup_cqsize(sq * 2)
            .setup_r_disabled()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(sq)
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
        let mut entries = Vec::with_capacity(depth);
        for _ in 0..depth {
            let header = RingBuf::new(abi::HDR_LEN)?;
            let payload = RingBuf::new(payload_len)?;
            let iov = Box::new([
                header.addr(),
                header.len as u64,
                payload.addr(),
                payload.len as u64,
            ]);
            entries.push(Entry {
                header: Some(header),
                payload: Some(payload),
                iov: Some(iov),
                in_kernel: false,
            });
        }
        let stop = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?);
        Ok(Ring {
            uring,
            entries,
            stop,
            qid,
            slot,
        })
    }

    pub(super) fn depth(&self) -> usize {
        self.entries.len()
    }

    /// What another thread writes to make this ring's thread stop.
    pub(super) fn stopper(&self) -> Arc<EventFd> {
        self.stop.clone()
    }

    /// Enables the ring with the calling thread as its only submitter; before anything
    /// else the queue thread does with it.
    pub(super) fn enable(&mut self) -> io::Result<()> {
        self.uring.submitter().register_enable_rings()
    }

    /// Makes the /dev/fuse descriptor fixed file 0 of the ring (no file lookup per command;
    /// the ring holds its own reference to the file).
    pub(super) fn register_dev(&mut self, dev: &File) -> io::Result<()> {
        self.uring
            .submitter()
            .register_files(&[dev.as_raw_fd()])
            .map(|_| ())
    }

    /// Whether the kernel holds a command for entry `i`.
    pub(super) fn in_kernel(&self, i: usize) -> bool {
        self.entries.get(i).is_some_and(|e| e.in_kernel)
    }

    /// The number of entries the kernel holds a command for.
    pub(super) fn outstanding(&self) -> usize {
        self.entries.iter().filter(|e| e.in_kernel).count()
    }

    /// Records that the kernel completed the command of entry `i`: its buffers are ours.
    pub(super) fn completed(&mut self, i: usize) {
        if let Some(e) = self.entries.get_mut(i) {
            e.in_kernel = false;
        }
    }

    /// Entry `i`'s header and payload buffers, while the kernel holds no command for it.
    pub(super) fn bufs(&mut self, i: usize) -> Option<(&mut [u8], &mut [u8])> {
        let e = self.entries.get_mut(i)?;
        if e.in_kernel {
            return None;
        }
        let (h, p) = (e.header.as_mut()?, e.payload.as_mut()?);
        Some((&mut h.slice()[..abi::HDR_LEN], p.slice()))
    }

    /// Queues a REGISTER of entry `i` (not yet submitted).
    pub(super) fn push_register(&mut self, i: usize) -> io::Result<()> {
        let qid = self.qid;
        let e = self.entries.get(i).ok_or_else(bad_entry)?;
        let iov = e.iov.as_ref().ok_or_else(bad_entry)?.as_ptr() as u64;
        let cmd = CmdReq {
            qid,
            ..Default::default()
        };
        let sqe = opcode::UringCmd80::new(types::Fixed(0), abi::CMD_REGISTER)
            .cmd(cmd.to_cmd())
            .addr(Some(iov))
            .build()
            .user_data(i as u64);
        // REGISTER takes a two-element iovec array: header, payload.
        self.push(i, with_len(sqe, 2))
    }

    /// Queues the COMMIT_AND_FETCH that answers `commit_id` from entry `i` and offers the
    /// entry for the next request (not yet submitted).
    pub(super) fn push_commit(&mut self, i: usize, commit_id: u64) -> io::Result<()> {
        let cmd = CmdReq {
            commit_id,
            qid: self.qid,
            ..Default::default()
        };
        let sqe = opcode::UringCmd80::new(types::Fixed(0), abi::CMD_COMMIT_AND_FETCH)
            .cmd(cmd.to_cmd())
            .build()
            .user_data(i as u64);
        self.push(i, sqe)
    }

    /// Queues a poll on the stop eventfd; its completion (user_data [`STOP`]) tells the
    /// thread to leave.
    pub(super) fn push_stop_poll(&mut self) -> io::Result<()> {
        let fd = self.stop.as_fd().as_raw_fd();
        let sqe: squeue::Entry128 = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(STOP)
            .into();
        // SAFETY: the poll references only the eventfd, which lives in `self` and is
        // dropped after the ring (field order), so it outlives the command.
        unsafe { self.uring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))
    }

    fn push(&mut self, i: usize, sqe: squeue::Entry128) -> io::Result<()> {
        let e = self.entries.get_mut(i).ok_or_else(bad_entry)?;
        if e.in_kernel {
            return Err(io::Error::other("entry already with the kernel"));
        }
        // SAFETY: the command references entry i's buffers and iovec array. From here
        // until its completion is reaped, `in_kernel` is true: `bufs` refuses to lend
        // them, and `Entry::drop` leaks instead of freeing them, so they outlive the
        // command whatever happens (module comment).
        unsafe { self.uring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        e.in_kernel = true;
        Ok(())
    }

    /// Submits what is queued and waits for at least `want` completions.
    pub(super) fn submit_and_wait(&mut self, want: usize) -> io::Result<usize> {
        self.uring.submit_and_wait(want)
    }

    /// Moves the completions into `out` as (user_data, result).
    pub(super) fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        out.extend(self.uring.completion().map(|c| (c.user_data(), c.result())));
    }
}

fn bad_entry() -> io::Error {
    io::Error::other("no such ring entry")
}

/// Sets `sqe->len`, which the io_uring crate's UringCmd80 builder does not expose and FUSE's
/// REGISTER requires (the iovec count).
fn with_len(mut sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // `len` sits at byte 24 of `struct io_uring_sqe` (opcode 0, flags 1, ioprio 2, fd 4,
    // off 8, addr 16, len 24): a kernel ABI that cannot move. Entry128 is `repr(C)` over
    // that struct (the crate's own tests pin its size at 128 bytes).
    const LEN_OFFSET: usize = 24;
    let p = (&mut sqe as *mut squeue::Entry128).cast::<u8>();
    // SAFETY: offset 24..28 lies inside the 128-byte value we own exclusively; the write is
    // unaligned-safe and replaces a plain u32 field.
    unsafe { p.add(LEN_OFFSET).cast::<u32>().write_unaligned(len) };
    sqe
}

/// Makes the kernel give up on io_uring for this connection: a REGISTER for a queue that
/// cannot exist fails with EINVAL, and a failed REGISTER clears the connection's io_uring
/// flag and wakes every request waiting for the rings to be ready, which then go over
/// /dev/fuse. Used when a queue could not register for a reason of ours (a thread that
/// would not start, a submission that failed): the kernel would otherwise hold every
/// request until all queues had registered. Returns the command's result (a negative
/// errno, -EINVAL expected).
pub(super) fn refuse_rings(dev: &File) -> io::Result<i32> {
    let mut uring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(2)?;
    let cmd = CmdReq {
        qid: u16::MAX,
        ..Default::default()
    };
    let sqe = opcode::UringCmd80::new(types::Fd(dev.as_raw_fd()), abi::CMD_REGISTER)
        .cmd(cmd.to_cmd())
        .build()
        .user_data(0);
    let sqe = with_len(sqe, 2);
    // SAFETY: the command points at no memory (addr 0); the kernel rejects the queue number
    // before it would read an iovec, and a read of address 0 would fail with EFAULT anyway.
    unsafe { uring.submission().push(&sqe) }
        .map_err(|_| io::Error::other("submission queue full"))?;
    uring.submit_and_wait(1)?;
    let res = uring.completion().next().map(|c| c.result());
    res.ok_or_else(|| io::Error::other("no completion"))
}

nix::ioctl_write_ptr!(fuse_dev_ioc_backing_close, 229, 2, u32);

/// `FUSE_DEV_IOC_BACKING_CLOSE`: unregisters a passthrough backing file.
pub(super) fn backing_close(dev: &File, id: u32) -> io::Result<()> {
    // SAFETY: the ioctl reads one u32 through the pointer, which points at a live local.
    unsafe { fuse_dev_ioc_backing_close(dev.as_raw_fd(), &id) }
        .map(|_| ())
        .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn len_lands_in_the_sqe_len_field() {
        let sqe = opcode::UringCmd80::new(types::Fixed(0), 1).build();
        let sqe = with_len(sqe, 2);
        // Round-trip through Debug is not enough; check the raw bytes.
        let p = (&sqe as *const squeue::Entry128).cast::<u8>();
        // SAFETY: reading 128 bytes of a 128-byte value we own.
        let bytes = unsafe { std::slice::from_raw_parts(p, 128) };
        assert_eq!(&bytes[24..28], &2u32.to_ne_bytes());
        assert_eq!(bytes[0], 46, "IORING_OP_URING_CMD");
    }

    #[test]
    fn buffers_are_lent_only_while_the_kernel_has_none_of_them() {
        let mut r = match Ring::new(0, 0, 2, 8192) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: no io_uring here ({e})");
                return;
            }
        };
        assert!(r.bufs(0).is_some());
        r.entries[0].in_kernel = true;
        assert!(r.bufs(0).is_none());
        r.completed(0);
        let (h, p) = r.bufs(0).unwrap();
        assert_eq!((h.len(), p.len()), (abi::HDR_LEN, 8192));
        assert!(r.bufs(5).is_none());
    }
}
