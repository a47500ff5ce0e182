//! POSIX ACLs, inode flags, fallocate and how many extended attributes an inode holds, in
//! every mode of every format, driven through the `FileSystem` contract on a memory device
//! (no kernel in between: these are the checks a
//! file system driven directly, or mounted with `nodefault_permissions`, relies on). Each
//! mode is made and mounted through the registry, remounted to see what was kept, and
//! checked by its own fsck at the end.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_fstypes::{DeviceMount, MkfsArgs, Mode};
use cairn_vfs::acl::{ACCESS_XATTR, DEFAULT_XATTR};
use cairn_vfs::fileattr::{APPEND, IMMUTABLE, NOATIME, NODUMP};
use cairn_vfs::{Access, Ctx, Errno, FileSystem, RenameFlags, SetAttr, SetTime};

const ROOT_CTX: fn() -> Ctx = Ctx::root;
const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const CAROL: u32 = 1002;
const STAFF: u32 = 50;

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn errno<T: std::fmt::Debug>(r: cairn_vfs::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.errno().0,
    }
}

/// A mounted file system of one mode on a memory device that outlives remounts.
struct Rig {
    mode: Mode,
    dev: Arc<MemDevice>,
    fs: Arc<dyn FileSystem>,
}

impl Rig {
    fn new(mode: Mode) -> Rig {
        let dev = Arc::new(MemDevice::new(4096, 16384));
        let args = MkfsArgs {
            label: "attrs".into(),
            ..Default::default()
        };
        (mode.fs.device.mkfs)(dev.clone() as Arc<dyn BlockDevice>, &args).expect("mkfs");
        let fs = Self::mount_dev(mode, &dev);
        Rig { mode, dev, fs }
    }

    fn mount_dev(mode: Mode, dev: &Arc<MemDevice>) -> Arc<dyn FileSystem> {
        let opts = vec![("mode".to_string(), Some(mode.name().to_string()))];
        (mode.fs.device.mount)(
            dev.clone() as Arc<dyn BlockDevice>,
            &opts,
            DeviceMount {
                read_only: false,
                background: false,
            },
        )
        .unwrap_or_else(|e| panic!("{}: mount: {e}", mode.name()))
    }

    fn remount(&mut self) {
        self.fs.destroy().expect("unmount");
        self.fs = Self::mount_dev(self.mode, &self.dev);
    }

    /// Unmounts and runs the format's check: nothing may be found.
    fn check(self) {
        self.fs.destroy().expect("unmount");
        drop(self.fs);
        let r = (self.mode.fs.device.check)(self.dev.clone() as Arc<dyn BlockDevice>)
            .expect("check runs");
        assert!(
            r.findings.is_empty(),
            "{}: fsck found {:?}",
            self.mode.name(),
            r.findings
        );
    }

    fn root(&self) -> u64 {
        self.fs.root_ino()
    }

    fn mkfile(&self, c: &Ctx, dir: u64, name: &str, mode: u32, data: &[u8]) -> u64 {
        let (a, fh) = self
            .fs
            .create(c, dir, n(name), mode, 0, libc::O_RDWR)
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        if !data.is_empty() {
            self.fs.write(a.ino, fh, 0, data).unwrap();
        }
        self.fs.release(a.ino, fh).unwrap();
        a.ino
    }

    fn read_all(&self, ino: u64) -> Vec<u8> {
        let c = ROOT_CTX();
        let fh = self.fs.open(&c, ino, libc::O_RDONLY).unwrap();
        let mut buf = Vec::new();
        self.fs.read(ino, fh, 0, 1 << 24, &mut buf).unwrap();
        self.fs.release(ino, fh).unwrap();
        buf
    }

    fn chmod(&self, c: &Ctx, ino: u64, mode: u32) -> cairn_vfs::Result<u32> {
        self.fs
            .setattr(
                c,
                ino,
                SetAttr {
                    mode: Some(mode),
                    ..Default::default()
                },
            )
            .map(|a| u32::from(a.perm))
    }
}

/// The binary form of an ACL given as (tag, perm, id) triples.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    cairn_vfs::acl::encode_raw(entries)
}

const U: u32 = u32::MAX;
const USER_OBJ: u16 = 1;
const USER: u16 = 2;
const GROUP_OBJ: u16 = 4;
const GROUP: u16 = 8;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

fn user(uid: u32, groups: &[u32]) -> Ctx {
    let mut c = Ctx::user(uid, uid);
    c.groups = Some(groups.to_vec());
    c
}

fn each_mode(f: impl Fn(Rig)) {
    for m in cairn_fstypes::modes() {
        println!("=== {}", m.name());
        f(Rig::new(m));
    }
}

#[test]
fn access_acls_are_validated_enforced_and_kept() {
    each_mode(|mut r| {
        let fs = r.fs.clone();
        let root = ROOT_CTX();
        let alice = user(ALICE, &[]);
        r.chmod(&root, r.root(), 0o777).unwrap();
        let f = r.mkfile(&alice, r.root(), "f", 0o640, b"secret");
        // u::rw-, u:bob:rw-, g::r--, g:staff:r--, m::r--, o::---
        let a = acl(&[
            (USER_OBJ, 6, U),
            (USER, 6, BOB),
            (GROUP_OBJ, 4, U),
            (GROUP, 4, STAFF),
            (MASK, 4, U),
            (OTHER, 0, U),
        ]);
        assert_eq!(
            errno(fs.setxattr(&user(BOB, &[]), f, n("system.posix_acl_access"), &a, 0)),
            libc::EPERM,
            "only the owner sets an ACL"
        );
        fs.setxattr(&alice, f, n("system.posix_acl_access"), &a, 0)
            .unwrap();
        let m = fs.getattr(f).unwrap();
        assert_eq!(m.perm, 0o640, "the mode's group bits are the mask");
        assert_eq!(
            fs.getxattr(&root, f, n("system.posix_acl_access")).unwrap(),
            a
        );
        // Bob: rw- masked to r--; Carol in staff: r--; Carol alone: nothing.
        let bob = user(BOB, &[]);
        assert!(fs.access(&bob, f, Access::R).is_ok());
        assert_eq!(errno(fs.access(&bob, f, Access::W)), libc::EACCES);
        assert_eq!(
            errno(fs.open(&bob, f, libc::O_WRONLY)),
            libc::EACCES,
            "the mask holds the named user's w back"
        );
        assert!(fs.access(&user(CAROL, &[STAFF]), f, Access::R).is_ok());
        assert_eq!(
            errno(fs.access(&user(CAROL, &[]), f, Access::R)),
            libc::EACCES
        );
        // chmod g+w widens the mask: Bob may write now.
        assert_eq!(r.chmod(&alice, f, 0o660).unwrap(), 0o660);
        assert!(fs.access(&bob, f, Access::W).is_ok());
        let stored = fs
            .getxattr(&root, f, n(std::str::from_utf8(ACCESS_XATTR).unwrap()))
            .unwrap();
        assert_eq!(stored[4 + 4 * 8 + 2], 6, "chmod rewrote the mask entry");
        // Hostile values: refused whole, nothing changes.
        let before = fs.getxattr(&root, f, n("system.posix_acl_access")).unwrap();
        for (bad, want) in [
            (vec![1, 2, 3], libc::EINVAL),
            (
                acl(&[(USER_OBJ, 6, U), (0x40, 6, U), (OTHER, 0, U)]),
                libc::EINVAL,
            ),
            (
                acl(&[
                    (USER_OBJ, 6, U),
                    (USER, 6, 7),
                    (GROUP_OBJ, 4, U),
                    (OTHER, 0, U),
                ]),
                libc::EINVAL,
            ),
            (
                acl(&[(USER_OBJ, 9, U), (GROUP_OBJ, 4, U), (OTHER, 0, U)]),
                libc::EINVAL,
            ),
            (
                {
                    let mut v = a.clone();
                    v[0] = 1;
                    v
                },
                libc::EOPNOTSUPP,
            ),
        ] {
            assert_eq!(
                errno(fs.setxattr(&alice, f, n("system.posix_acl_access"), &bad, 0)),
                want,
                "{bad:?}"
            );
        }
        assert_eq!(
            fs.getxattr(&root, f, n("system.posix_acl_access")).unwrap(),
            before
        );
        // Random bytes never panic: every answer is an errno or a stored valid ACL.
        let mut seed = 0x5eed_u64;
        for _ in 0..200 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (seed >> 59) as usize * 4 + 4;
            let mut v: Vec<u8> = (0..len).map(|i| (seed >> ((i % 8) * 8)) as u8).collect();
            v[..4].copy_from_slice(&2u32.to_le_bytes());
            let _ = fs.setxattr(&alice, f, n("system.posix_acl_access"), &v, 0);
        }
        fs.setxattr(&alice, f, n("system.posix_acl_access"), &a, 0)
            .unwrap();
        // An ACL the mode says entirely is not stored; the mode takes it.
        let f2 = r.mkfile(&alice, r.root(), "plain", 0o600, b"");
        fs.setxattr(
            &alice,
            f2,
            n("system.posix_acl_access"),
            &acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 1, U)]),
            0,
        )
        .unwrap();
        assert_eq!(fs.getattr(f2).unwrap().perm, 0o751);
        assert_eq!(
            errno(fs.getxattr(&root, f2, n("system.posix_acl_access"))),
            libc::ENODATA
        );
        // A default ACL only on a directory; removing an absent one is no error.
        assert_eq!(
            errno(fs.setxattr(&alice, f2, n("system.posix_acl_default"), &a, 0)),
            libc::EACCES
        );
        fs.removexattr(&alice, f2, n("system.posix_acl_default"))
            .unwrap();
        // S_ISGID goes when the owner setting the ACL is outside the file's group.
        let g = r.mkfile(&alice, r.root(), "sgid", 0o2770, b"");
        fs.setattr(
            &root,
            g,
            SetAttr {
                gid: Some(STAFF),
                ..Default::default()
            },
        )
        .unwrap();
        fs.setattr(
            &root,
            g,
            SetAttr {
                mode: Some(0o2770),
                ..Default::default()
            },
        )
        .unwrap();
        fs.setxattr(&alice, g, n("system.posix_acl_access"), &a, 0)
            .unwrap();
        assert_eq!(fs.getattr(g).unwrap().perm & 0o7000, 0, "S_ISGID cleared");
        r.remount();
        let fs = r.fs.clone();
        let f = fs.lookup(&root, r.root(), n("f")).unwrap().ino;
        assert_eq!(
            fs.getxattr(&root, f, n("system.posix_acl_access")).unwrap(),
            a
        );
        assert!(fs.access(&bob, f, Access::R).is_ok(), "kept across remount");
        assert_eq!(errno(fs.access(&bob, f, Access::W)), libc::EACCES);
        // Removal leaves the mode as it was (the group class keeps the mask's bits).
        fs.removexattr(&alice, f, n("system.posix_acl_access"))
            .unwrap();
        assert_eq!(errno(fs.access(&bob, f, Access::R)), libc::EACCES);
        r.check();
    });
}

#[test]
fn default_acls_are_inherited_without_the_umask() {
    each_mode(|mut r| {
        let fs = r.fs.clone();
        let root = ROOT_CTX();
        let d = fs.mkdir(&root, r.root(), n("d"), 0o755, 0o022).unwrap().ino;
        // d:u::rwx, d:u:bob:rwx, d:g::r-x, d:m::rwx, d:o::---
        let def = acl(&[
            (USER_OBJ, 7, U),
            (USER, 7, BOB),
            (GROUP_OBJ, 5, U),
            (MASK, 7, U),
            (OTHER, 0, U),
        ]);
        fs.setxattr(&root, d, n("system.posix_acl_default"), &def, 0)
            .unwrap();
        // umask 077 would leave 0600: with a default ACL it is not applied.
        let (fa, fh) = fs
            .create(&root, d, n("file"), 0o664, 0o077, libc::O_RDWR)
            .unwrap();
        fs.release(fa.ino, fh).unwrap();
        assert_eq!(fa.perm, 0o660, "mode & ACL: u rw, mask rw, o ---");
        let fa_acl = fs
            .getxattr(&root, fa.ino, n("system.posix_acl_access"))
            .unwrap();
        assert_eq!(
            fa_acl,
            acl(&[
                (USER_OBJ, 6, U),
                (USER, 7, BOB),
                (GROUP_OBJ, 5, U),
                (MASK, 6, U),
                (OTHER, 0, U)
            ])
        );
        assert_eq!(
            errno(fs.getxattr(&root, fa.ino, n("system.posix_acl_default"))),
            libc::ENODATA,
            "a file keeps no default ACL"
        );
        assert!(fs.access(&user(BOB, &[]), fa.ino, Access::W).is_ok());
        let sub = fs.mkdir(&root, d, n("sub"), 0o777, 0o077).unwrap();
        assert_eq!(sub.perm, 0o770);
        assert_eq!(
            fs.getxattr(&root, sub.ino, n("system.posix_acl_default"))
                .unwrap(),
            def,
            "a directory inherits the default ACL itself"
        );
        // Deeper still, and a symlink inherits nothing.
        let deep = fs.mkdir(&root, sub.ino, n("deep"), 0o700, 0).unwrap();
        assert!(
            fs.getxattr(
                &root,
                deep.ino,
                n(std::str::from_utf8(DEFAULT_XATTR).unwrap())
            )
            .is_ok()
        );
        let s = fs.symlink(&root, d, n("link"), b"file").unwrap();
        assert_eq!(
            errno(fs.getxattr(&root, s.ino, n("system.posix_acl_access"))),
            libc::EOPNOTSUPP,
            "a symlink has no ACLs"
        );
        // Without a default ACL the umask applies again.
        fs.removexattr(&root, d, n("system.posix_acl_default"))
            .unwrap();
        let (fb, fh) = fs
            .create(&root, d, n("after"), 0o666, 0o027, libc::O_RDWR)
            .unwrap();
        fs.release(fb.ino, fh).unwrap();
        assert_eq!(fb.perm, 0o640);
        r.remount();
        let fs = r.fs.clone();
        let d = fs.lookup(&root, r.root(), n("d")).unwrap().ino;
        let sub = fs.lookup(&root, d, n("sub")).unwrap().ino;
        assert_eq!(
            fs.getxattr(&root, sub, n("system.posix_acl_default"))
                .unwrap(),
            def
        );
        r.check();
    });
}

#[test]
fn inode_flags_are_kept_and_enforced() {
    each_mode(|mut r| {
        let fs = r.fs.clone();
        let root = ROOT_CTX();
        let alice = user(ALICE, &[]);
        r.chmod(&root, r.root(), 0o777).unwrap();
        let d = fs.mkdir(&alice, r.root(), n("d"), 0o777, 0).unwrap().ino;
        let f = r.mkfile(&alice, d, "f", 0o666, b"data");
        let other = r.mkfile(&alice, d, "other", 0o666, b"");
        // Who may set what.
        assert_eq!(errno(fs.set_flags(&alice, f, IMMUTABLE)), libc::EPERM);
        assert_eq!(errno(fs.set_flags(&user(BOB, &[]), f, NODUMP)), libc::EPERM);
        assert_eq!(
            errno(fs.set_flags(&alice, f, 0x0000_0008)),
            libc::EOPNOTSUPP,
            "sync"
        );
        assert_eq!(
            errno(fs.set_flags(&alice, f, 0x0008_0000)),
            libc::EOPNOTSUPP,
            "extents"
        );
        fs.set_flags(&alice, f, NODUMP | NOATIME).unwrap();
        assert_eq!(fs.get_flags(&alice, f).unwrap(), NODUMP | NOATIME);
        fs.set_flags(&root, f, IMMUTABLE).unwrap();
        assert_eq!(fs.get_flags(&alice, f).unwrap(), IMMUTABLE);
        // Immutable: nothing changes, not even by root.
        for c in [&root, &alice] {
            assert_eq!(errno(fs.open(c, f, libc::O_WRONLY)), libc::EPERM);
            assert_eq!(
                errno(fs.open(c, f, libc::O_WRONLY | libc::O_APPEND)),
                libc::EPERM
            );
            assert_eq!(
                errno(fs.setattr(
                    c,
                    f,
                    SetAttr {
                        size: Some(0),
                        ..Default::default()
                    }
                )),
                libc::EPERM
            );
            assert_eq!(errno(r.chmod(c, f, 0o600)), libc::EPERM);
            assert_eq!(
                errno(fs.setattr(
                    c,
                    f,
                    SetAttr {
                        uid: Some(ALICE),
                        ..Default::default()
                    }
                )),
                libc::EPERM
            );
            assert_eq!(
                errno(fs.setattr(
                    c,
                    f,
                    SetAttr {
                        mtime: Some(SetTime::Now),
                        ..Default::default()
                    }
                )),
                libc::EPERM
            );
            assert_eq!(errno(fs.setxattr(c, f, n("user.x"), b"1", 0)), libc::EPERM);
            assert_eq!(
                errno(fs.setxattr(
                    c,
                    f,
                    n("system.posix_acl_access"),
                    &acl(&[(USER_OBJ, 6, U), (GROUP_OBJ, 6, U), (OTHER, 6, U)]),
                    0
                )),
                libc::EPERM
            );
            assert_eq!(errno(fs.unlink(c, d, n("f"))), libc::EPERM);
            assert_eq!(
                errno(fs.rename(c, d, n("f"), d, n("g"), RenameFlags::default())),
                libc::EPERM
            );
            assert_eq!(
                errno(fs.rename(c, d, n("other"), d, n("f"), RenameFlags::default())),
                libc::EPERM
            );
            assert_eq!(errno(fs.link(c, f, d, n("l"))), libc::EPERM);
            assert_eq!(errno(fs.fallocate(f, 0, 0, 4096, 0)), libc::EPERM);
        }
        assert_eq!(r.read_all(f), b"data", "reads go on");
        // An immutable directory takes no new entries and loses none.
        fs.set_flags(&root, d, IMMUTABLE).unwrap();
        assert_eq!(
            errno(fs.create(&alice, d, n("new"), 0o644, 0, libc::O_RDWR)),
            libc::EPERM
        );
        assert_eq!(errno(fs.mkdir(&root, d, n("sub"), 0o755, 0)), libc::EPERM);
        assert_eq!(errno(fs.unlink(&root, d, n("other"))), libc::EPERM);
        fs.set_flags(&root, d, 0).unwrap();
        let _ = other;
        // Append-only: writes only at the end, no truncation, no removal.
        fs.set_flags(&root, f, APPEND).unwrap();
        assert_eq!(errno(fs.open(&alice, f, libc::O_WRONLY)), libc::EPERM);
        assert_eq!(
            errno(fs.open(&alice, f, libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC)),
            libc::EPERM
        );
        let fh = fs.open(&alice, f, libc::O_WRONLY | libc::O_APPEND).unwrap();
        fs.write(f, fh, 0, b"+more").unwrap();
        assert_eq!(
            errno(fs.setattr(
                &alice,
                f,
                SetAttr {
                    size: Some(0),
                    fh: Some(fh),
                    ..Default::default()
                }
            )),
            libc::EPERM
        );
        fs.release(f, fh).unwrap();
        assert_eq!(
            r.read_all(f),
            b"data+more",
            "an append-only write lands at the end"
        );
        assert!(
            fs.setattr(
                &alice,
                f,
                SetAttr {
                    atime: Some(SetTime::Now),
                    ..Default::default()
                }
            )
            .is_ok(),
            "touch"
        );
        assert_eq!(errno(fs.unlink(&alice, d, n("f"))), libc::EPERM);
        assert_eq!(
            errno(fs.fallocate(
                f,
                0,
                0,
                4096,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
            )),
            libc::EPERM
        );
        assert!(
            fs.fallocate(f, 0, 0, 8192, libc::FALLOC_FL_KEEP_SIZE)
                .is_ok(),
            "preallocation"
        );
        // An append-only directory takes new entries but loses none.
        fs.set_flags(&root, d, APPEND).unwrap();
        r.mkfile(&alice, d, "added", 0o644, b"");
        assert_eq!(errno(fs.unlink(&alice, d, n("added"))), libc::EPERM);
        r.remount();
        let fs = r.fs.clone();
        let d = fs.lookup(&root, r.root(), n("d")).unwrap().ino;
        let f = fs.lookup(&root, d, n("f")).unwrap().ino;
        assert_eq!(
            fs.get_flags(&root, f).unwrap(),
            APPEND,
            "kept across remount"
        );
        assert_eq!(fs.get_flags(&root, d).unwrap(), APPEND);
        fs.set_flags(&root, f, 0).unwrap();
        fs.set_flags(&root, d, 0).unwrap();
        fs.unlink(&alice, d, n("f")).unwrap();
        r.check();
    });
}

/// A file's contents as a model (bytes; `None` beyond the end).
fn model_apply(m: &mut Vec<u8>, op: &Op) {
    match *op {
        Op::Write(off, ref data) => {
            let end = off as usize + data.len();
            if m.len() < end {
                m.resize(end, 0);
            }
            m[off as usize..end].copy_from_slice(data);
        }
        Op::Zero(off, len, keep) => {
            let end = (off + len) as usize;
            if !keep && m.len() < end {
                m.resize(end, 0);
            }
            let e = end.min(m.len());
            if (off as usize) < e {
                m[off as usize..e].fill(0);
            }
        }
        Op::Punch(off, len) => {
            let e = ((off + len) as usize).min(m.len());
            if (off as usize) < e {
                m[off as usize..e].fill(0);
            }
        }
        Op::Collapse(off, len) => {
            m.drain(off as usize..(off + len) as usize);
        }
        Op::Insert(off, len) => {
            let at = off as usize;
            m.splice(at..at, std::iter::repeat_n(0, len as usize));
        }
    }
}

#[derive(Debug)]
enum Op {
    Write(u64, Vec<u8>),
    Zero(u64, u64, bool),
    Punch(u64, u64),
    Collapse(u64, u64),
    Insert(u64, u64),
}

#[test]
fn fallocate_ranges_against_a_model() {
    let seed: u64 = std::env::var("CAIRN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00fa_11c0);
    println!("seed {seed} (CAIRN_TEST_SEED to repeat)");
    each_mode(|mut r| {
        let fs = r.fs.clone();
        let root = ROOT_CTX();
        let f = r.mkfile(&root, r.root(), "f", 0o644, b"");
        let fh = fs.open(&root, f, libc::O_RDWR).unwrap();
        let bs = 4096u64;
        let mut model: Vec<u8> = Vec::new();
        let mut s = seed;
        let mut next = |m: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) % m.max(1)
        };
        for i in 0..120 {
            let size = model.len() as u64;
            let op = match next(6) {
                0 | 1 => {
                    let off = next(20 * bs);
                    let len = 1 + next(3 * bs);
                    Op::Write(
                        off,
                        (0..len).map(|j| (i * 31 + j as usize) as u8 | 1).collect(),
                    )
                }
                2 => Op::Zero(next(20 * bs), 1 + next(3 * bs), next(2) == 0),
                3 => Op::Punch(next(20 * bs), 1 + next(3 * bs)),
                4 if size > bs => {
                    let blocks = size / bs;
                    let at = next(blocks);
                    Op::Collapse(at * bs, (1 + next(2)) * bs)
                }
                _ if size > 0 => Op::Insert(next(size.div_ceil(bs)) * bs, (1 + next(2)) * bs),
                _ => Op::Write(0, vec![7; 100]),
            };
            let got = match &op {
                Op::Write(off, data) => fs.write(f, fh, *off, data).map(|_| ()),
                Op::Zero(off, len, keep) => fs.fallocate(
                    f,
                    fh,
                    *off,
                    *len,
                    libc::FALLOC_FL_ZERO_RANGE | if *keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 },
                ),
                Op::Punch(off, len) => fs.fallocate(
                    f,
                    fh,
                    *off,
                    *len,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                ),
                Op::Collapse(off, len) => {
                    fs.fallocate(f, fh, *off, *len, libc::FALLOC_FL_COLLAPSE_RANGE)
                }
                Op::Insert(off, len) => {
                    fs.fallocate(f, fh, *off, *len, libc::FALLOC_FL_INSERT_RANGE)
                }
            };
            // The model says which range shifts the rules refuse.
            let refused = match &op {
                Op::Collapse(off, len) => off + len >= size,
                Op::Insert(off, _) => *off >= size,
                _ => false,
            };
            match got {
                Ok(()) => {
                    assert!(
                        !refused,
                        "{}: op {i} {op:?} on size {size} accepted",
                        r.mode.name()
                    );
                    model_apply(&mut model, &op);
                }
                Err(e) => assert!(
                    refused && e.errno() == Errno::EINVAL,
                    "{}: op {i} {op:?} on size {size}: {e}",
                    r.mode.name()
                ),
            }
            assert_eq!(
                fs.getattr(f).unwrap().size,
                model.len() as u64,
                "{}: size after op {i} {op:?}",
                r.mode.name()
            );
            if i % 10 == 9 {
                assert!(
                    r.read_all(f) == model,
                    "{}: contents after op {i} {op:?}",
                    r.mode.name()
                );
            }
        }
        fs.release(f, fh).unwrap();
        // Unaligned shifts and shifts past the end are EINVAL.
        assert_eq!(
            errno(fs.fallocate(f, 0, 1, bs, libc::FALLOC_FL_COLLAPSE_RANGE)),
            libc::EINVAL
        );
        assert_eq!(
            errno(fs.fallocate(f, 0, 0, 100, libc::FALLOC_FL_INSERT_RANGE)),
            libc::EINVAL
        );
        assert_eq!(
            errno(fs.fallocate(
                f,
                0,
                0,
                bs,
                libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_KEEP_SIZE
            )),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            errno(fs.fallocate(f, 0, 0, bs, libc::FALLOC_FL_PUNCH_HOLE)),
            libc::EOPNOTSUPP
        );
        r.remount();
        let f = r.fs.lookup(&root, r.root(), n("f")).unwrap().ino;
        assert!(
            r.read_all(f) == model,
            "{}: contents after remount",
            r.mode.name()
        );
        r.check();
    });
}

/// A range operation that runs out of space halfway leaves the file as it was.
#[test]
fn a_failed_range_operation_changes_nothing() {
    for m in cairn_fstypes::modes() {
        println!("=== {}", m.name());
        let dev = Arc::new(MemDevice::new(4096, 4096));
        (m.fs.device.mkfs)(dev.clone() as Arc<dyn BlockDevice>, &MkfsArgs::default()).unwrap();
        let mut r = Rig {
            mode: m,
            fs: Rig::mount_dev(m, &dev),
            dev,
        };
        let fs = r.fs.clone();
        let root = ROOT_CTX();
        let data: Vec<u8> = (0..(64u32 << 12)).map(|i| (i / 4096) as u8 | 1).collect();
        let f = r.mkfile(&root, r.root(), "f", 0o644, &data);
        // Fill the rest of the disk.
        let filler = r.mkfile(&root, r.root(), "filler", 0o644, b"");
        let fh = fs.open(&root, filler, libc::O_RDWR).unwrap();
        let chunk = vec![0x5a; 1 << 20];
        let mut off = 0;
        while fs.write(filler, fh, off, &chunk).is_ok_and(|n| n > 0) {
            off += chunk.len() as u64;
        }
        let mut left = 0;
        while fs.write(filler, fh, off, &chunk[..4096]).is_ok() {
            off += 4096;
            left += 1;
            assert!(left < 100_000);
        }
        fs.release(filler, fh).unwrap();
        let before = fs.getattr(f).unwrap();
        for (what, mode, len) in [
            ("insert", libc::FALLOC_FL_INSERT_RANGE, 32 * 4096),
            ("zero", libc::FALLOC_FL_ZERO_RANGE, 256 * 4096),
            ("allocate", 0, 256 * 4096),
        ] {
            let off = if mode == 0 || mode == libc::FALLOC_FL_ZERO_RANGE {
                1 << 20
            } else {
                4096
            };
            assert_eq!(
                errno(fs.fallocate(f, 0, off, len, mode)),
                libc::ENOSPC,
                "{what}"
            );
            let now = fs.getattr(f).unwrap();
            assert_eq!(
                (now.size, now.blocks),
                (before.size, before.blocks),
                "{}: {what}",
                m.name()
            );
            assert!(
                r.read_all(f) == data,
                "{}: {what} changed the contents",
                m.name()
            );
        }
        fs.unlink(&root, r.root(), n("filler")).unwrap();
        r.remount();
        let f = r.fs.lookup(&root, r.root(), n("f")).unwrap().ino;
        assert!(r.read_all(f) == data);
        r.check();
    }
}

// ---- how many extended attributes an inode holds ------------------------------------

/// Every extended attribute of `ino`, read back one by one from its list.
fn xattr_map(r: &Rig, ino: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = ROOT_CTX();
    let list = r.fs.listxattr(&c, ino).unwrap();
    list.split(|&b| b == 0)
        .filter(|k| !k.is_empty())
        .map(|k| {
            let name = OsStr::new(std::str::from_utf8(k).unwrap());
            (k.to_vec(), r.fs.getxattr(&c, ino, name).unwrap())
        })
        .collect()
}

/// Unmounts, runs the format's check (nothing may be found) and mounts again.
fn check_and_remount(r: &mut Rig) {
    r.fs.destroy().expect("unmount");
    let rep = (r.mode.fs.device.check)(r.dev.clone() as Arc<dyn BlockDevice>).expect("check runs");
    assert!(
        rep.findings.is_empty(),
        "{}: fsck found {:?}",
        r.mode.name(),
        rep.findings
    );
    r.fs = Rig::mount_dev(r.mode, &r.dev);
}

/// What: fstests generic/020 on every mode — 1000 attributes `user.attribute_N` =
/// `value_N` set, listed, kept across a remount and clean for fsck, removed again; then
/// one value of 64 KiB (the kernel's largest), likewise; and past what an inode holds,
/// ENOSPC with nothing changed.
/// Why: the suite assumes a FUSE file system holds that many (`_attr_get_max`); an inode
/// whose attributes live in one block held about 110.
#[test]
fn a_thousand_attributes_and_a_64k_value_in_every_mode() {
    each_mode(|mut r| {
        let name = r.mode.name();
        let c = ROOT_CTX();
        let f = r.mkfile(&c, r.root(), "f", libc::S_IFREG | 0o644, b"");
        r.fs.setxattr(&c, f, n("user.snrub"), b"fish2\n", 0)
            .unwrap();
        let mut want = BTreeMap::new();
        want.insert(b"user.snrub".to_vec(), b"fish2\n".to_vec());
        for i in 0..1000 {
            let (k, v) = (format!("user.attribute_{i}"), format!("value_{i}"));
            r.fs.setxattr(&c, f, n(&k), v.as_bytes(), 0)
                .unwrap_or_else(|e| panic!("{name}: attribute {i}: {e}"));
            want.insert(k.into_bytes(), v.into_bytes());
        }
        assert_eq!(xattr_map(&r, f), want, "{name}");
        r.remount();
        assert_eq!(xattr_map(&r, f), want, "{name}: after remount");
        check_and_remount(&mut r);
        for i in 0..1000 {
            r.fs.removexattr(&c, f, n(&format!("user.attribute_{i}")))
                .unwrap_or_else(|e| panic!("{name}: remove {i}: {e}"));
        }
        want.retain(|k, _| k == b"user.snrub");
        assert_eq!(xattr_map(&r, f), want, "{name}");
        let long = vec![0u8; 65536];
        r.fs.setxattr(&c, f, n("user.long_attr"), &long, 0)
            .unwrap_or_else(|e| panic!("{name}: 64 KiB value: {e}"));
        want.insert(b"user.long_attr".to_vec(), long.clone());
        r.remount();
        assert_eq!(xattr_map(&r, f), want, "{name}: 64 KiB value after remount");
        // More than an inode holds: refused, nothing changed.
        let too_much = (0..4)
            .map(|i| {
                r.fs.setxattr(&c, f, n(&format!("user.big{i}")), &long, 0)
                    .err()
                    .map(|e| e.errno())
            })
            .find(|e| e.is_some())
            .flatten();
        assert_eq!(too_much, Some(Errno::ENOSPC), "{name}");
        let mut after = xattr_map(&r, f);
        after.retain(|k, _| !k.starts_with(b"user.big"));
        assert_eq!(after, want, "{name}: a refused set changed nothing else");
        check_and_remount(&mut r);
        // All gone: the inode owns no attribute block again.
        for k in xattr_map(&r, f).keys() {
            r.fs.removexattr(&c, f, n(std::str::from_utf8(k).unwrap()))
                .unwrap();
        }
        assert!(xattr_map(&r, f).is_empty(), "{name}");
        // (A log-structured format counts its blocks when it writes them: after the check's
        // unmount.)
        check_and_remount(&mut r);
        assert_eq!(r.fs.getattr(f).unwrap().blocks, 0, "{name}");
        r.check();
    });
}

/// What: random sets (new and replacing, values from empty to 64 KiB), removals and
/// remounts on two files, against a reference map; the lists equal after every remount and
/// at the end, and fsck finds nothing.
/// Why: the list grows past one block and shrinks back under it many times, in every
/// mode, and the two files' chains are allocated among each other's.
#[test]
fn random_attributes_against_a_reference() {
    use rand::{Rng, SeedableRng};
    let seed = std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("CAIRN_SEED={seed}");
    each_mode(|mut r| {
        let name = r.mode.name();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let c = ROOT_CTX();
        let files = [
            r.mkfile(&c, r.root(), "a", libc::S_IFREG | 0o644, b""),
            r.mkfile(&c, r.root(), "b", libc::S_IFREG | 0o644, b""),
        ];
        let mut want: [BTreeMap<Vec<u8>, Vec<u8>>; 2] = Default::default();
        for step in 0..600 {
            let i = rng.random_range(0..2);
            let f = files[i];
            let k = format!("user.k{}", rng.random_range(0..200));
            match rng.random_range(0..10) {
                0..=5 => {
                    let len = match rng.random_range(0..20) {
                        0 => rng.random_range(4096..65537),
                        1..=3 => rng.random_range(256..4096),
                        _ => rng.random_range(0..64),
                    };
                    let v: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                    match r.fs.setxattr(&c, f, n(&k), &v, 0) {
                        Ok(()) => {
                            want[i].insert(k.into_bytes(), v);
                        }
                        Err(e) => assert_eq!(
                            e.errno(),
                            Errno::ENOSPC,
                            "{name} seed {seed} step {step}: set {k}"
                        ),
                    }
                }
                6..=8 => {
                    let r2 = r.fs.removexattr(&c, f, n(&k));
                    match want[i].remove(k.as_bytes()) {
                        Some(_) => r2.unwrap(),
                        None => assert_eq!(r2.unwrap_err().errno(), Errno::ENODATA),
                    }
                }
                _ => {
                    r.remount();
                    for (j, &f) in files.iter().enumerate() {
                        assert_eq!(xattr_map(&r, f), want[j], "{name} seed {seed} step {step}");
                    }
                }
            }
        }
        check_and_remount(&mut r);
        for (j, &f) in files.iter().enumerate() {
            assert_eq!(xattr_map(&r, f), want[j], "{name} seed {seed} at the end");
        }
        r.check();
    });
}
