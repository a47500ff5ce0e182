//! POSIX ACLs, inode flags (chattr/lsattr) and fallocate's range operations through a real
//! mount in every mode: what the kernel and cairn do together with `default_permissions`
//! and FUSE_POSIX_ACL (the kernel checks the ACL it reads back; cairn updates the mode,
//! rewrites the ACL on chmod and inherits default ACLs), kept across a remount and clean
//! under fsck. Validated against the host (CAIRN_TEST_HOST_ONLY=1). The unprivileged-user
//! side of the same rules, with and without `default_permissions`, is in
//! `permissions.rs`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use cairn_fstests::user::as_user;
use cairn_fstests::{Errnoish, Target, expect_err, expect_ok, host_only, pattern, say, sys};
use nix::fcntl::FallocateFlags;

use libc::{EACCES, EINVAL, EOPNOTSUPP, EPERM};

const UA: u32 = 4242;
const UB: u32 = 4343;
const NONE: u32 = u32::MAX;
const IMMUTABLE: u32 = 0x10;
const APPEND: u32 = 0x20;
const NODUMP: u32 = 0x40;

fn each(case: &str, f: impl Fn(&mut Target, &Path)) {
    for mut t in Target::all() {
        say!("=== {case} on {}", t.name());
        let d = t.path(case);
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        f(&mut t, &d);
        t.assert_fsck_clean_and_remount(case);
    }
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn acl_of(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    sys::getxattr(p, name).errno_result()
}

/// chattr's way: read the flags, replace ours, keep the file system's own.
fn chattr(p: &Path, flags: u32) -> std::io::Result<()> {
    let f = File::open(p)?;
    let old = sys::get_flags(f.as_fd())?;
    sys::set_flags(f.as_fd(), (old & !(IMMUTABLE | APPEND | NODUMP)) | flags)
}

fn lsattr(p: &Path) -> u32 {
    let f = File::open(p).unwrap();
    sys::get_flags(f.as_fd()).unwrap() & (IMMUTABLE | APPEND | NODUMP)
}

#[test]
fn acls_set_enforced_inherited_and_kept() {
    each("acl", |t, d| {
        let f = d.join("f");
        fs::write(&f, b"data").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        // u::rw-, u:UA:rwx, g::r--, m::rw-, o::---: the mask caps UA at rw-.
        let a = sys::acl(&[
            (1, 6, NONE),
            (2, 7, UA),
            (4, 4, NONE),
            (0x10, 6, NONE),
            (0x20, 0, NONE),
        ]);
        expect_ok(
            sys::setxattr(&f, "system.posix_acl_access", &a, 0),
            "setfacl",
        );
        assert_eq!(mode(&f), 0o660, "the group bits show the mask");
        assert_eq!(acl_of(&f, "system.posix_acl_access"), Ok(a.clone()));
        expect_err(
            sys::setxattr(&f, "system.posix_acl_access", &a[..9], 0),
            EINVAL,
            "a ragged ACL",
        );
        let ff = f.clone();
        as_user(UA, UA, &[UA], "named user", move |c| {
            c.ok(fs::read(&ff), "read through a named-user entry");
            c.ok(
                OpenOptions::new().write(true).open(&ff),
                "write through the mask rw-",
            );
            c.err(
                std::process::Command::new(&ff).status(),
                EACCES,
                "execute masked away",
            );
        });
        let ff = f.clone();
        as_user(UB, UB, &[UB], "no entry", move |c| {
            c.err(fs::read(&ff), EACCES, "other ---");
        });
        // chmod rewrites the mask: g-w takes UA's write away.
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        let after = acl_of(&f, "system.posix_acl_access").unwrap();
        assert_eq!(after[4 + 3 * 8 + 2], 4, "mask entry now r--: {after:?}");
        let ff = f.clone();
        as_user(UA, UA, &[UA], "after chmod", move |c| {
            c.err(
                OpenOptions::new().write(true).open(&ff),
                EACCES,
                "write after g-w",
            );
        });
        // A default ACL: a user's new file and directory inherit it, the umask (022 in
        // as_user) ignored.
        let dd = d.join("dd");
        fs::create_dir(&dd).unwrap();
        fs::set_permissions(&dd, fs::Permissions::from_mode(0o777)).unwrap();
        let def = sys::acl(&[
            (1, 7, NONE),
            (2, 6, UB),
            (4, 5, NONE),
            (0x10, 7, NONE),
            (0x20, 0, NONE),
        ]);
        expect_ok(
            sys::setxattr(&dd, "system.posix_acl_default", &def, 0),
            "setfacl -d",
        );
        let ddd = dd.clone();
        as_user(UA, UA, &[UA], "inherit", move |c| {
            c.ok(
                fs::write(ddd.join("new"), b"n"),
                "create under a default ACL",
            );
            c.ok(fs::create_dir(ddd.join("sub")), "mkdir under a default ACL");
        });
        assert_eq!(
            mode(&dd.join("new")),
            0o660,
            "0666 masked by the ACL, no umask"
        );
        assert_eq!(mode(&dd.join("sub")), 0o770);
        assert_eq!(
            acl_of(&dd.join("sub"), "system.posix_acl_default"),
            Ok(def.clone())
        );
        let new = dd.join("new");
        as_user(UB, UB, &[UB], "inherited entry", move |c| {
            c.ok(
                OpenOptions::new().write(true).open(&new),
                "write through an inherited entry",
            );
        });
        t.remount();
        assert_eq!(
            acl_of(&f, "system.posix_acl_access"),
            Ok(after),
            "kept across remount"
        );
        assert_eq!(acl_of(&dd, "system.posix_acl_default"), Ok(def));
        // Removing the ACL: the mode stays as it was.
        expect_ok(fs::remove_file(dd.join("new")), "unlink");
        expect_ok(
            sys::removexattr(&f, "system.posix_acl_access"),
            "setfacl -b",
        );
        assert_eq!(acl_of(&f, "system.posix_acl_access"), Err(libc::ENODATA));
        let ff = f.clone();
        as_user(UA, UA, &[UA], "no ACL", move |c| {
            c.err(fs::read(&ff), EACCES, "the named entry is gone");
        });
    });
}

#[test]
fn inode_flags_set_shown_enforced_and_kept() {
    each("flags", |t, d| {
        let f = d.join("f");
        fs::write(&f, b"data").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        nix::unistd::chown(&f, Some(nix::unistd::Uid::from_raw(UA)), None).unwrap();
        let ff = f.clone();
        as_user(UA, UA, &[UA], "owner", move |c| {
            c.err(chattr(&ff, IMMUTABLE), EPERM, "chattr +i as the owner");
            c.ok(chattr(&ff, NODUMP), "chattr +d as the owner");
        });
        assert_eq!(lsattr(&f), NODUMP);
        expect_ok(chattr(&f, IMMUTABLE), "chattr +i");
        assert_eq!(lsattr(&f), IMMUTABLE);
        expect_err(
            OpenOptions::new().write(true).open(&f),
            EPERM,
            "write an immutable file",
        );
        expect_err(fs::remove_file(&f), EPERM, "unlink an immutable file");
        expect_err(
            fs::rename(&f, d.join("g")),
            EPERM,
            "rename an immutable file",
        );
        expect_err(
            fs::hard_link(&f, d.join("l")),
            EPERM,
            "link an immutable file",
        );
        expect_err(
            fs::set_permissions(&f, fs::Permissions::from_mode(0o600)),
            EPERM,
            "chmod an immutable file",
        );
        expect_err(
            sys::setxattr(&f, "user.x", b"1", 0),
            EPERM,
            "setxattr on an immutable file",
        );
        expect_err(
            nix::unistd::truncate(&f, 0),
            EPERM,
            "truncate an immutable file",
        );
        expect_ok(fs::read(&f), "read an immutable file");
        t.remount();
        assert_eq!(lsattr(&f), IMMUTABLE, "kept across remount");
        expect_ok(chattr(&f, APPEND), "chattr -i +a");
        expect_err(
            OpenOptions::new().write(true).open(&f),
            EPERM,
            "open append-only for writing",
        );
        let mut w = expect_ok(
            OpenOptions::new().append(true).open(&f),
            "open with O_APPEND",
        );
        w.write_all(b"+").unwrap();
        expect_err(w.set_len(0), EPERM, "ftruncate an append-only file");
        drop(w);
        assert_eq!(fs::read(&f).unwrap(), b"data+");
        expect_err(fs::remove_file(&f), EPERM, "unlink an append-only file");
        // An immutable directory.
        let sub = d.join("sub");
        fs::create_dir(&sub).unwrap();
        expect_ok(chattr(&sub, IMMUTABLE), "chattr +i dir");
        expect_err(
            File::create(sub.join("x")),
            EPERM,
            "create in an immutable dir",
        );
        expect_ok(chattr(&sub, 0), "chattr -i dir");
        expect_ok(chattr(&f, 0), "chattr -a");
    });
}

/// chattr changes the ctime, and `stat` shows it at once: the kernel keeps a FUSE inode's
/// attributes for attr_ttl and knows nothing of what an ioctl changed, so the file system
/// tells it (FUSE_NOTIFY_INVAL_INODE; generic/277).
#[test]
fn chattr_shows_its_new_ctime_at_once() {
    each("chattr-ctime", |_t, d| {
        let f = d.join("f");
        fs::write(&f, b"data").unwrap();
        let before = fs::metadata(&f).unwrap();
        // The new ctime differs from the old one at the file system's nanosecond
        // resolution; the kernel's cached copy would still hold the old one.
        expect_ok(chattr(&f, NODUMP), "chattr +d");
        let after = fs::metadata(&f).unwrap();
        assert!(
            (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
            "ctime after chattr: {}.{} then {}.{}",
            before.ctime(),
            before.ctime_nsec(),
            after.ctime(),
            after.ctime_nsec()
        );
        expect_ok(chattr(&f, 0), "chattr -d");
    });
}

/// What statx(2) says of `p` when asked for the basic stats and btime with
/// AT_STATX_FORCE_SYNC (the kernel asks the file system whatever it has cached).
struct Statx {
    /// `stx_mask`: which fields were filled.
    filled: u32,
    /// `stx_attributes` and `stx_attributes_mask`, restricted to the three cairn keeps.
    set: u64,
    known: u64,
}

fn statx(p: &Path) -> Statx {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    // SAFETY: `c` is a NUL-terminated path and `st` a statx buffer the call fills.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_FORCE_SYNC,
            mask,
            st.as_mut_ptr(),
        )
    };
    assert_eq!(
        r,
        0,
        "statx {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: statx returned 0, so it filled the buffer (zeroed before, in any case).
    #[allow(unsafe_code)]
    let st = unsafe { st.assume_init() };
    Statx {
        filled: st.stx_mask,
        set: st.stx_attributes & STATX_OURS,
        known: st.stx_attributes_mask & STATX_OURS,
    }
}

const STATX_I: u64 = libc::STATX_ATTR_IMMUTABLE as u64;
const STATX_A: u64 = libc::STATX_ATTR_APPEND as u64;
const STATX_D: u64 = libc::STATX_ATTR_NODUMP as u64;
const STATX_OURS: u64 = STATX_I | STATX_A | STATX_D;

/// statx is answered by the file system (FUSE_STATX: the birth time is filled, which
/// GETATTR cannot give), and where the kernel passes the answer's `stx_attributes` on
/// (kernels with `kstat_from_fuse_statx`; 6.18 drops them) they show the flags chattr set,
/// all three known (generic/424). The answer's own bits are checked below the kernel, in
/// `cairn_vfs::fileattr` and the reply encoders' tests.
#[test]
fn statx_is_served_and_shows_the_inode_flags() {
    let check = |f: &Path, what: &str, want: u64, known: u64| {
        let sx = statx(f);
        assert_ne!(
            sx.filled & libc::STATX_BTIME,
            0,
            "{what}: statx filled {:#x}, no btime: FUSE_STATX not served",
            sx.filled
        );
        if sx.known == 0 {
            say!("{what}: the kernel does not pass statx attributes on");
            return;
        }
        assert_eq!(
            sx.known, known,
            "{what}: stx_attributes_mask {:#x}",
            sx.known
        );
        assert_eq!(sx.set, want, "{what}: stx_attributes {:#x}", sx.set);
    };
    each("statx-flags", |_t, d| {
        let f = d.join("f");
        fs::write(&f, b"data").unwrap();
        for (flags, want, what) in [
            (0, 0, "no flag"),
            (APPEND, STATX_A, "chattr +a"),
            (IMMUTABLE | NODUMP, STATX_I | STATX_D, "chattr -a +id"),
            (NODUMP, STATX_D, "chattr -i +d"),
            (0, 0, "chattr -d"),
        ] {
            expect_ok(chattr(&f, flags), what);
            check(&f, what, want, STATX_OURS);
        }
        let sub = d.join("sub");
        fs::create_dir(&sub).unwrap();
        expect_ok(chattr(&sub, APPEND), "chattr +a dir");
        check(&sub, "chattr +a dir", STATX_A, STATX_OURS);
        expect_ok(chattr(&sub, 0), "chattr -a dir");
    });
    if host_only() {
        return;
    }
    // The umbrella layer shows its branch's flags: what the branch file system knows of
    // the file, it knows through the umbrella.
    let t = Target::umbrella_sized("512M");
    let f = t.path("f");
    fs::write(&f, b"data").unwrap();
    let copy = t
        .umbrella_branches()
        .into_iter()
        .map(|b| b.join("f"))
        .find(|p| p.exists())
        .expect("the file on a branch");
    for (flags, want, what) in [
        (0, 0, "umbrella: no flag"),
        (APPEND | NODUMP, STATX_A | STATX_D, "umbrella: chattr +ad"),
        (0, 0, "umbrella: chattr -ad"),
    ] {
        expect_ok(chattr(&f, flags), what);
        check(&f, what, want & statx(&copy).known, statx(&copy).known);
    }
}

#[test]
fn fallocate_zero_range_and_the_range_shifts() {
    each("frange", |t, d| {
        let p = d.join("f");
        let data = pattern(21, 64 << 10);
        fs::write(&p, &data).unwrap();
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        expect_ok(
            nix::fcntl::fallocate(f.as_fd(), FallocateFlags::FALLOC_FL_ZERO_RANGE, 1000, 9000),
            "zero range",
        );
        let mut want = data.clone();
        want[1000..10_000].fill(0);
        let mut got = Vec::new();
        (&f).read_to_end(&mut got).unwrap();
        assert!(got == want, "zeroed range and its neighbours");
        expect_ok(
            nix::fcntl::fallocate(
                f.as_fd(),
                FallocateFlags::FALLOC_FL_ZERO_RANGE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                60 << 10,
                16 << 10,
            ),
            "zero range past the end, keeping the size",
        );
        assert_eq!(f.metadata().unwrap().size(), 64 << 10);
        expect_ok(
            nix::fcntl::fallocate(
                f.as_fd(),
                FallocateFlags::FALLOC_FL_ZERO_RANGE,
                60 << 10,
                16 << 10,
            ),
            "zero range past the end",
        );
        assert_eq!(f.metadata().unwrap().size(), 76 << 10);
        want.truncate(60 << 10);
        want.resize(76 << 10, 0);
        // COLLAPSE_RANGE and INSERT_RANGE: ext4 does them; the kernel's FUSE client refuses
        // both itself (fs/fuse/file.c), so through a cairn mount they are EOPNOTSUPP
        // (cairn does them for a caller without the kernel: crates/fstypes/tests).
        for (flag, what) in [
            (FallocateFlags::FALLOC_FL_COLLAPSE_RANGE, "collapse"),
            (FallocateFlags::FALLOC_FL_INSERT_RANGE, "insert"),
        ] {
            let r = nix::fcntl::fallocate(f.as_fd(), flag, 4096, 4096).errno_result();
            if t.is_cairn() {
                assert_eq!(r, Err(EOPNOTSUPP), "{what} through FUSE");
            } else {
                assert_eq!(r, Ok(()), "{what} on the host");
                say!("{what}: done by the host");
            }
        }
        if t.is_cairn() {
            let mut got = vec![0u8; want.len()];
            f.read_exact_at(&mut got, 0).unwrap();
            assert!(got == want, "contents after the zero ranges");
        }
        drop(f);
        t.remount();
        if t.is_cairn() {
            assert!(fs::read(&p).unwrap() == want, "kept across remount");
        }
    });
}
