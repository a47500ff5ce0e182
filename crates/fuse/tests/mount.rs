//! The adapter through a real FUSE mount of the in-memory file system.
//!
//! Needs /dev/fuse and root (mount(2), and `allow_other` checks as another user); CI runs
//! as root.
// Tests call a few libc functions that std does not wrap (xattrs, renameat2).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cairn_fuse::memfs::MemFs;
use cairn_fuse::{FuseOptions, MountHandle, Op, Transport};

/// A mount that is taken down before its directory is removed.
struct Mnt {
    handle: Option<MountHandle>,
    fs: Arc<MemFs>,
    dir: tempfile::TempDir,
}

impl Mnt {
    fn new(t: Transport) -> Mnt {
        Mnt::with(t, FuseOptions::default())
    }

    /// Mounts over transport `t` (io_uring explicitly, so a mount that silently fell back
    /// to /dev/fuse fails instead of passing for the wrong transport).
    fn with(t: Transport, mut opts: FuseOptions) -> Mnt {
        let _ = env_logger::builder().is_test(true).try_init();
        opts.transport = t;
        let fs = Arc::new(MemFs::default());
        let dir = tempfile::tempdir().unwrap();
        // Other users must be able to reach the mount point for the permission tests.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let handle = cairn_fuse::spawn(fs.clone(), dir.path(), &opts)
            .expect("mount (needs root and /dev/fuse)");
        Mnt {
            handle: Some(handle),
            fs,
            dir,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn count(&self, op: Op) -> u64 {
        self.handle.as_ref().unwrap().counts().get(op)
    }

    fn unmount(mut self) -> io::Result<()> {
        self.handle.take().unwrap().unmount()
    }
}

impl Drop for Mnt {
    fn drop(&mut self) {
        drop(self.handle.take());
    }
}

fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    r.expect_err("expected an error")
        .raw_os_error()
        .expect("an OS error")
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// getxattr(2) with a caller-chosen buffer size; Ok(len).
fn getxattr(p: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: valid NUL-terminated strings; the pointer/size pair describes `buf` (or is
    // null with size 0, the documented size probe).
    let r = unsafe {
        let ptr = if size == 0 {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast()
        };
        libc::getxattr(p.as_ptr(), n.as_ptr(), ptr, size)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok((r as usize, buf))
    }
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: valid strings; `value` is a live slice of the given length.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn listxattr(p: &Path, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let p = cstr(p);
    let mut buf = vec![0u8; size];
    // SAFETY: as getxattr.
    let r = unsafe {
        let ptr = if size == 0 {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast()
        };
        libc::listxattr(p.as_ptr(), ptr, size)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok((r as usize, buf))
    }
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: valid strings; AT_FDCWD makes the paths absolute-or-cwd-relative.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn root_is_inode_1_to_the_kernel_and_2_to_the_fs(t: Transport) {
    let m = Mnt::new(t);
    assert_eq!(fs::metadata(m.dir.path()).unwrap().ino(), 1);
    fs::create_dir(m.p("sub")).unwrap();
    fs::write(m.p("sub/f"), b"x").unwrap();
    let sub_ino = fs::metadata(m.p("sub")).unwrap().ino();
    assert!(
        sub_ino >= 3,
        "the fs hands out inodes from 3, got {sub_ino}"
    );
    // ".." of a top-level directory is the fs root, which must come back as 1.
    assert_eq!(fs::metadata(m.p("sub/..")).unwrap().ino(), 1);
    let names: Vec<_> = fs::read_dir(m.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["sub"]);
    drop(m);
}

fn create_write_read_append_truncate(t: Transport) {
    let m = Mnt::new(t);
    let p = m.p("file");
    fs::write(&p, b"hello world").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"hello world");
    let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"!!").unwrap();
    drop(f);
    assert_eq!(fs::read(&p).unwrap(), b"hello world!!");
    // A sparse write far out, read back through a fresh descriptor.
    let mut f = fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.write_all(b"end").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let data = fs::read(&p).unwrap();
    assert_eq!(data.len(), (1 << 20) + 3);
    assert!(data[13..1 << 20].iter().all(|&b| b == 0));
    // O_TRUNC reaches the fs through open (atomic_o_trunc).
    fs::write(&p, b"short").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"short");
    // A large write arrives in few requests (max_write 1 MiB, writeback cache).
    let big = vec![7u8; 8 << 20];
    let writes = m.count(Op::Write);
    fs::write(m.p("big"), &big).unwrap();
    let mut back = Vec::new();
    fs::File::open(m.p("big"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert!(back == big);
    let used = m.count(Op::Write) - writes;
    assert!(used <= 16, "8 MiB took {used} WRITE requests");
    m.unmount().unwrap();
}

/// A time past what every cairn file system keeps is clamped by the adapter, for every
/// file system, as the kernel clamps to a superblock's range (a FUSE superblock's is
/// unbounded): what stat shows is what was stored. A directory: of a regular file the
/// kernel's writeback cache keeps the mtime it was asked for, not the answer's.
fn times_out_of_range_are_clamped(t: Transport) {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    let m = Mnt::new(t);
    let p = m.p("dir");
    fs::create_dir(&p).unwrap();
    let (max, min) = (cairn_vfs::TIME_MAX_SECS, cairn_vfs::TIME_MIN_SECS);
    let late = TimeSpec::new(max + 100, 0);
    let early = TimeSpec::new(min - 100, 0);
    utimensat(
        nix::fcntl::AT_FDCWD,
        &p,
        &late,
        &early,
        UtimensatFlags::FollowSymlink,
    )
    .unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (max, 854_775_807));
    assert_eq!((md.mtime(), md.mtime_nsec()), (min, 0));
    m.unmount().unwrap();
}

fn errnos_cross_intact(t: Transport) {
    let m = Mnt::new(t);
    assert_eq!(errno(fs::metadata(m.p("missing"))), libc::ENOENT);
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(errno(fs::create_dir(m.p("d"))), libc::EEXIST);
    fs::write(m.p("d/f"), b"").unwrap();
    assert_eq!(errno(fs::remove_dir(m.p("d"))), libc::ENOTEMPTY);
    assert_eq!(
        errno(fs::write(m.p(&"n".repeat(256)), b"")),
        libc::ENAMETOOLONG
    );
    assert_eq!(errno(fs::read_link(m.p("d/f"))), libc::EINVAL);
    assert_eq!(errno(fs::hard_link(m.p("d"), m.p("d2"))), libc::EPERM);
    // ENODATA for a missing attribute, EOPNOTSUPP for an fallocate mode the fs lacks.
    assert_eq!(errno(getxattr(&m.p("d/f"), "user.none", 64)), libc::ENODATA);
    drop(m);
}

fn negative_lookups_are_cached_by_the_kernel(t: Transport) {
    let m = Mnt::new(t);
    let before = m.count(Op::Lookup);
    for _ in 0..5 {
        assert!(fs::metadata(m.p("nothing-here")).is_err());
    }
    assert_eq!(
        m.count(Op::Lookup) - before,
        1,
        "the miss should be asked once"
    );
    // The kernel's own create invalidates the negative entry.
    fs::write(m.p("nothing-here"), b"now").unwrap();
    assert_eq!(fs::read(m.p("nothing-here")).unwrap(), b"now");
    drop(m);
}

fn readdir_offsets_survive_concurrent_unlinks(t: Transport) {
    let m = Mnt::new(t);
    fs::create_dir(m.p("d")).unwrap();
    // Long names so the listing takes several READDIR requests.
    let name = |i: usize| format!("{i:04}-{}", "x".repeat(200));
    let n = 400;
    for i in 0..n {
        fs::write(m.p(&format!("d/{}", name(i))), b"").unwrap();
    }
    let mut it = fs::read_dir(m.p("d")).unwrap();
    let mut seen = Vec::new();
    for _ in 0..n / 2 {
        seen.push(
            it.next()
                .unwrap()
                .unwrap()
                .file_name()
                .into_string()
                .unwrap(),
        );
    }
    // Remove every third file, including some not listed yet.
    let mut removed = std::collections::HashSet::new();
    for i in (0..n).step_by(3) {
        fs::remove_file(m.p(&format!("d/{}", name(i)))).unwrap();
        removed.insert(name(i));
    }
    for e in it {
        seen.push(e.unwrap().file_name().into_string().unwrap());
    }
    let unique: std::collections::HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "an entry was listed twice");
    for i in 0..n {
        let nm = name(i);
        if !removed.contains(&nm) {
            assert!(unique.contains(&nm), "surviving entry {i} was skipped");
        }
    }
    // A full second listing is exact.
    let again = fs::read_dir(m.p("d")).unwrap().count();
    assert_eq!(again, n - removed.len());
    drop(m);
}

fn rename_flags_noreplace_and_exchange(t: Transport) {
    let m = Mnt::new(t);
    fs::write(m.p("a"), b"A").unwrap();
    fs::write(m.p("b"), b"B").unwrap();
    assert_eq!(
        errno(renameat2(&m.p("a"), &m.p("b"), libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    renameat2(&m.p("a"), &m.p("c"), libc::RENAME_NOREPLACE).unwrap();
    renameat2(&m.p("c"), &m.p("b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"A");
    assert_eq!(fs::read(m.p("c")).unwrap(), b"B");
    assert_eq!(
        errno(renameat2(&m.p("c"), &m.p("zz"), libc::RENAME_EXCHANGE)),
        libc::ENOENT
    );
    // Plain rename over an existing file.
    fs::rename(m.p("c"), m.p("b")).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"B");
    assert!(!m.p("c").exists());
    drop(m);
}

fn xattr_size_probe_and_erange(t: Transport) {
    let m = Mnt::new(t);
    let p = m.p("f");
    fs::write(&p, b"").unwrap();
    setxattr(&p, "user.k", b"0123456789", 0).unwrap();
    setxattr(&p, "user.j", b"v", 0).unwrap();
    assert_eq!(
        errno(setxattr(&p, "user.k", b"x", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        errno(setxattr(&p, "user.q", b"x", libc::XATTR_REPLACE)),
        libc::ENODATA
    );
    assert_eq!(getxattr(&p, "user.k", 0).unwrap().0, 10);
    assert_eq!(errno(getxattr(&p, "user.k", 4)), libc::ERANGE);
    let (n, v) = getxattr(&p, "user.k", 64).unwrap();
    assert_eq!(&v[..n], b"0123456789");
    let (len, _) = listxattr(&p, 0).unwrap();
    assert_eq!(len, "user.j\0user.k\0".len());
    assert_eq!(errno(listxattr(&p, 3)), libc::ERANGE);
    let (n, v) = listxattr(&p, 64).unwrap();
    assert_eq!(&v[..n], b"user.j\0user.k\0");
    drop(m);
}

fn symlink_link_mknod_statfs_fallocate(t: Transport) {
    let m = Mnt::new(t);
    std::os::unix::fs::symlink("target/path", m.p("ln")).unwrap();
    assert_eq!(fs::read_link(m.p("ln")).unwrap(), Path::new("target/path"));
    fs::write(m.p("f"), b"data").unwrap();
    fs::hard_link(m.p("f"), m.p("g")).unwrap();
    assert_eq!(fs::metadata(m.p("f")).unwrap().nlink(), 2);
    assert_eq!(fs::read(m.p("g")).unwrap(), b"data");
    nix::unistd::mkfifo(
        &m.p("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &fs::metadata(m.p("fifo")).unwrap().file_type()
    ));
    let st = nix::sys::statvfs::statvfs(m.dir.path()).unwrap();
    assert_eq!(st.block_size(), 4096);
    assert_eq!(st.name_max(), 255);
    let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
    nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::empty(), 0, 10000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 10000);
    let e = nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        0,
        10,
    );
    assert_eq!(e, Err(nix::errno::Errno::EOPNOTSUPP));
    drop(f);
    drop(m);
}

fn create_applies_umask_and_modes(t: Transport) {
    let m = Mnt::new(t);
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(m.p("f"))
        .unwrap();
    drop(f);
    let mode = fs::metadata(m.p("f")).unwrap().permissions().mode() & 0o7777;
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    nix::sys::stat::umask(umask);
    assert_eq!(mode, 0o666 & !umask.bits());
    fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(m.p("f")).unwrap().permissions().mode() & 0o7777,
        0o600
    );
    drop(m);
}

/// Runs `sh -c script` as user nobody; returns its exit status.
fn as_nobody(script: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap()
        .success()
}

fn other_users_get_in_and_permissions_hold(t: Transport) {
    let m = Mnt::new(t);
    fs::write(m.p("public"), b"hi").unwrap();
    fs::set_permissions(m.p("public"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(m.p("secret"), b"no").unwrap();
    fs::set_permissions(m.p("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir(m.p("open")).unwrap();
    fs::set_permissions(m.p("open"), fs::Permissions::from_mode(0o777)).unwrap();
    let d = m.dir.path().display();
    assert!(
        as_nobody(&format!("cat {d}/public >/dev/null")),
        "allow_other must let other users in"
    );
    assert!(!as_nobody(&format!("cat {d}/secret 2>/dev/null")));
    assert!(!as_nobody(&format!("touch {d}/new 2>/dev/null")));
    assert!(as_nobody(&format!("touch {d}/open/new")));
    assert_eq!(fs::metadata(m.p("open/new")).unwrap().uid(), 65534);
    drop(m);
}

fn a_panicking_fs_answers_eio_and_keeps_serving(t: Transport) {
    let m = Mnt::new(t);
    m.fs.panic_on_lookup("boom");
    assert_eq!(errno(fs::metadata(m.p("boom"))), libc::EIO);
    fs::write(m.p("fine"), b"ok").unwrap();
    assert_eq!(fs::read(m.p("fine")).unwrap(), b"ok");
    m.unmount().unwrap();
}

fn unmount_calls_destroy_once(t: Transport) {
    let m = Mnt::new(t);
    let fs_ = m.fs.clone();
    fs::write(m.p("f"), b"x").unwrap();
    assert_eq!(fs_.destroy_count(), 0);
    let dir = m.dir.path().to_path_buf();
    m.unmount().unwrap();
    assert_eq!(fs_.destroy_count(), 1);
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&format!(" {} ", dir.display())),
        "still mounted"
    );
}

fn mountinfo_names_the_source_and_type(t: Transport) {
    let opts = FuseOptions {
        fsname: "/images/disk.img".into(),
        ..Default::default()
    };
    let m = Mnt::with(t, opts);
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(m.dir.path().to_str().unwrap()))
        .expect("the mount is in mountinfo");
    assert!(line.contains(" - fuse.cairn /images/disk.img "), "{line}");
    assert!(line.contains("allow_other"), "{line}");
    assert!(line.contains("default_permissions"), "{line}");
    drop(m);
}

fn parallel_clients_on_several_threads(t: Transport) {
    let m = Mnt::with(
        t,
        FuseOptions {
            threads: 4,
            ..Default::default()
        },
    );
    std::thread::scope(|s| {
        for t in 0..4 {
            let m = &m;
            s.spawn(move || {
                let d = m.p(&format!("t{t}"));
                fs::create_dir(&d).unwrap();
                for i in 0..200 {
                    let p = d.join(format!("f{i}"));
                    fs::write(&p, format!("{t}-{i}")).unwrap();
                    assert_eq!(fs::read_to_string(&p).unwrap(), format!("{t}-{i}"));
                }
            });
        }
    });
    for t in 0..4 {
        assert_eq!(fs::read_dir(m.p(&format!("t{t}"))).unwrap().count(), 200);
    }
    m.unmount().unwrap();
}

fn readdirplus_lookups_balance_with_forgets(t: Transport) {
    let m = Mnt::new(t);
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..50 {
        fs::write(m.p(&format!("d/f{i}")), b"").unwrap();
    }
    // `ls -l`: a listing followed by stats, which readdirplus answers in bulk.
    for e in fs::read_dir(m.p("d")).unwrap() {
        e.unwrap().metadata().unwrap();
    }
    assert!(
        m.count(Op::Readdirplus) > 0,
        "the listing should have used readdirplus"
    );
    // Make the kernel evict its dentries and inodes: it forgets everything it looked up.
    // If the fs counted `.`/`..` of readdirplus (which the kernel does not), or the adapter
    // lost a forget, references would be left over.
    fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    // Forgets are queued by the kernel and read by the daemon's threads asynchronously: on a
    // busy machine they can trail the drop by a while, so wait (bounded) for them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let left = loop {
        let left: Vec<_> =
            m.fs.lookup_counts()
                .into_iter()
                .filter(|&(_, n)| n != 0)
                .collect();
        if left.len() <= 1 || std::time::Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // The kernel may still pin the directory chain it is using right now; everything else
    // must be gone.
    assert!(
        left.len() <= 1,
        "lookup references left after eviction: {left:?}"
    );
    drop(m);
}

fn lseek_data_hole_and_fsync_of_files_and_directories(t: Transport) {
    use nix::unistd::{Whence, lseek};
    let m = Mnt::new(t);
    fs::write(m.p("f"), vec![1u8; 5000]).unwrap();
    let f = fs::File::open(m.p("f")).unwrap();
    assert_eq!(lseek(&f, 10, Whence::SeekData).unwrap(), 10);
    assert_eq!(lseek(&f, 10, Whence::SeekHole).unwrap(), 5000);
    assert_eq!(
        lseek(&f, 6000, Whence::SeekData),
        Err(nix::errno::Errno::ENXIO)
    );
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    fs::File::open(m.dir.path()).unwrap().sync_all().unwrap();
    assert!(m.count(Op::Lseek) >= 3);
    assert!(m.count(Op::Fsync) >= 2);
    assert!(m.count(Op::Fsyncdir) >= 1);
    drop(f);
    drop(m);
}

/// Whether FUSE over io_uring can be used: the kernel has the switch, and it is on or we
/// may turn it on (as root). Turning it on only changes what new mounts are offered at
/// INIT; it never touches a live mount.
fn uring_available() -> bool {
    let p = cairn_fuse::URING_PARAMETER;
    match fs::read_to_string(p) {
        Ok(v) if v.trim() == "Y" => true,
        Ok(_) if nix::unistd::geteuid().is_root() => fs::write(p, "Y").is_ok(),
        Ok(_) => {
            eprintln!("skipped: {p} is off and only root may turn it on");
            false
        }
        Err(e) => {
            eprintln!("skipped: this kernel has no FUSE over io_uring ({p}: {e})");
            false
        }
    }
}

/// Every test above, once per transport: `dev::name` over the /dev/fuse threads,
/// `uring::name` over io_uring.
macro_rules! over_both_transports {
    ($($name:ident),* $(,)?) => {
        mod dev {
            $(#[test]
            fn $name() {
                super::$name(super::Transport::Dev)
            })*
        }
        mod uring {
            $(#[test]
            fn $name() {
                if super::uring_available() {
                    super::$name(super::Transport::Uring)
                }
            })*
        }
    };
}

over_both_transports!(
    root_is_inode_1_to_the_kernel_and_2_to_the_fs,
    create_write_read_append_truncate,
    times_out_of_range_are_clamped,
    errnos_cross_intact,
    negative_lookups_are_cached_by_the_kernel,
    readdir_offsets_survive_concurrent_unlinks,
    rename_flags_noreplace_and_exchange,
    xattr_size_probe_and_erange,
    symlink_link_mknod_statfs_fallocate,
    create_applies_umask_and_modes,
    other_users_get_in_and_permissions_hold,
    a_panicking_fs_answers_eio_and_keeps_serving,
    unmount_calls_destroy_once,
    mountinfo_names_the_source_and_type,
    parallel_clients_on_several_threads,
    readdirplus_lookups_balance_with_forgets,
    lseek_data_hole_and_fsync_of_files_and_directories,
);
