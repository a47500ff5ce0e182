//! Permission checks run as unprivileged users, the same list on every target: a host
//! directory (the kernel's own checks on a local file system — the reference), cairn with
//! `default_permissions` (the kernel checks from the attributes, then cairn again) and
//! cairn with `nodefault_permissions` (cairn's checks alone: the kernel forwards every
//! request). Each check is one line; a failed line names what differed. Covered: search
//! permission on every directory of a path, open access modes, truncation, chmod and chown
//! rules with setuid/setgid clearing, utimens, hard links (protected), sticky and setgid
//! directories, supplementary groups, POSIX ACLs (named users and groups, the mask, default
//! ACLs inherited), inode flags (immutable, append-only: who may set them, what they
//! refuse), user extended attributes, access(2).
//!
//! With `CAIRN_PERM_COUNT_ONLY=1` the test reports each target's failures and passes: a
//! measurement of an older build (`CAIRN_BIN=`), not a verdict.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cairn_fstests::user::{Checks, run_as};
use cairn_fstests::{Target, host_only, lstat, modes, say, sys, transports};
use nix::fcntl::AT_FDCWD;
use nix::sys::stat::{UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{AccessFlags, Gid, Uid, access, chown};

use libc::{EACCES, EPERM};

const UA: u32 = 4242;
const UB: u32 = 4343;
const UC: u32 = 4444;
const SHARED: u32 = 5000;
const OTHER_GROUP: u32 = 6000;

const ACL_USER_OBJ: u16 = 1;
const ACL_USER: u16 = 2;
const ACL_GROUP_OBJ: u16 = 4;
const ACL_GROUP: u16 = 8;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const NONE: u32 = u32::MAX;

fn write(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

fn own(p: &Path, uid: u32, gid: u32) {
    chown(p, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
        .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
}

fn mkdir(p: &Path, m: u32) {
    fs::create_dir(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    chmod(p, m);
}

/// chattr's way: the flags read first, the immutable and append-only bits replaced by
/// `flags` (a file system's own flags, e.g. ext4's extents flag, are kept).
fn chattr(p: &Path, flags: u32) -> std::io::Result<()> {
    let f = File::open(p)?;
    let old = sys::get_flags(f.as_fd())?;
    sys::set_flags(f.as_fd(), (old & !(IMMUTABLE | APPEND)) | flags)
}

fn flags_of(p: &Path) -> std::io::Result<u32> {
    File::open(p).and_then(|f| sys::get_flags(f.as_fd()))
}

const IMMUTABLE: u32 = 0x10;
const APPEND: u32 = 0x20;

/// Builds the tree the checks look at, as root, in `d` (mode 0777).
fn setup(d: &Path) {
    let p = |n: &str| d.join(n);
    // Search permission on each directory of a path.
    mkdir(&p("private"), 0o755);
    write(&p("private/secret"), b"secret");
    chmod(&p("private/secret"), 0o644);
    mkdir(&p("private/inner"), 0o755);
    write(&p("private/inner/deep"), b"deep");
    chmod(&p("private/inner/deep"), 0o644);
    chmod(&p("private"), 0o700);
    mkdir(&p("noexec"), 0o755);
    write(&p("noexec/f"), b"x");
    chmod(&p("noexec/f"), 0o644);
    chmod(&p("noexec"), 0o744);
    mkdir(&p("noread"), 0o755);
    write(&p("noread/f"), b"x");
    chmod(&p("noread/f"), 0o644);
    chmod(&p("noread"), 0o711);
    mkdir(&p("ro"), 0o755);
    write(&p("ro/f"), b"x");
    chmod(&p("ro/f"), 0o666);
    mkdir(&p("ro/sub"), 0o777);
    // Files of each class.
    for n in ["owner-exec", "all-exec"] {
        write(&p(n), b"#!/bin/sh\nexit 0\n");
    }
    for (name, uid, gid, mode) in [
        ("a-own", UA, UA, 0o600),
        ("grp", 0, SHARED, 0o640),
        ("oth", 0, 0, 0o604),
        ("none", 0, 0, 0o600),
        ("ownerdeny", UA, SHARED, 0o070),
        ("script", 0, 0, 0o644),
        ("ro-file", 0, 0, 0o644),
        ("rw-file", 0, 0, 0o666),
        ("b-file", UB, UB, 0o644),
        ("su-file", UB, UB, 0o4755),
        ("su-open", UB, UB, 0o4777),
        ("su-keep", UB, UB, 0o4777),
        ("sg-file", UB, SHARED, 0o2755),
        ("owner-exec", 0, 0, 0o744),
        ("all-exec", 0, 0, 0o755),
    ] {
        if !name.ends_with("exec") {
            write(&p(name), b"content");
        }
        own(&p(name), uid, gid);
        chmod(&p(name), mode);
    }
    // A directory A may write but does not own, holding a directory A cannot write: moving
    // the latter elsewhere rewrites its "..", which needs write permission on it.
    mkdir(&p("x"), 0o777);
    mkdir(&p("x/rootdir"), 0o755);
    mkdir(&p("y"), 0o777);
    // Sticky and setgid directories.
    mkdir(&p("sticky"), 0o1777);
    write(&p("sticky/b-victim"), b"b");
    own(&p("sticky/b-victim"), UB, UB);
    write(&p("sticky/c-victim"), b"c");
    own(&p("sticky/c-victim"), UC, UC);
    mkdir(&p("sgid"), 0o777);
    own(&p("sgid"), 0, SHARED);
    chmod(&p("sgid"), 0o2777);
    // A's file and directories in a group A is not in: chmod g+s and an ACL drop S_ISGID.
    write(&p("a-file-sgid"), b"x");
    own(&p("a-file-sgid"), UA, OTHER_GROUP);
    chmod(&p("a-file-sgid"), 0o644);
    // What only root may do.
    write(&p("zero"), b"0");
    chmod(&p("zero"), 0o000);
    mkdir(&p("closed"), 0o000);
    for n in ["a-dir-chmod", "a-dir-acl"] {
        mkdir(&p(n), 0o755);
        own(&p(n), UA, OTHER_GROUP);
        chmod(&p(n), 0o2755);
    }
    // A user xattr on a file A may read but not write.
    write(&p("xattr-ro"), b"x");
    chmod(&p("xattr-ro"), 0o644);
    sys::setxattr(&p("xattr-ro"), "user.k", b"v", 0).unwrap();
    write(&p("xattr-none"), b"x");
    chmod(&p("xattr-none"), 0o600);
}

/// What a target supports beyond POSIX modes (a file system without them fails one line
/// each, and their checks are skipped).
#[derive(Clone, Copy)]
struct Support {
    acls: bool,
    flags: bool,
}

/// The ACLs of the tree, set by root.
fn setup_acls(d: &Path) -> std::io::Result<()> {
    let p = |n: &str| d.join(n);
    // ACLs: a 0640 root file with u:A:r--, g:SHARED:rw-, mask rw-.
    write(&p("acl-file"), b"acl");
    chmod(&p("acl-file"), 0o640);
    sys::setxattr(
        &p("acl-file"),
        "system.posix_acl_access",
        &sys::acl(&[
            (ACL_USER_OBJ, 6, NONE),
            (ACL_USER, 4, UA),
            (ACL_GROUP_OBJ, 4, NONE),
            (ACL_GROUP, 6, SHARED),
            (ACL_MASK, 6, NONE),
            (ACL_OTHER, 0, NONE),
        ]),
        0,
    )?;
    // The mask (r--) holds the named user's rwx back.
    write(&p("acl-masked"), b"m");
    chmod(&p("acl-masked"), 0o640);
    sys::setxattr(
        &p("acl-masked"),
        "system.posix_acl_access",
        &sys::acl(&[
            (ACL_USER_OBJ, 6, NONE),
            (ACL_USER, 7, UA),
            (ACL_GROUP_OBJ, 4, NONE),
            (ACL_MASK, 4, NONE),
            (ACL_OTHER, 0, NONE),
        ]),
        0,
    )?;
    // A directory only A may search and write, by ACL; with a default ACL for B.
    mkdir(&p("acl-dir"), 0o700);
    sys::setxattr(
        &p("acl-dir"),
        "system.posix_acl_access",
        &sys::acl(&[
            (ACL_USER_OBJ, 7, NONE),
            (ACL_USER, 7, UA),
            (ACL_GROUP_OBJ, 0, NONE),
            (ACL_MASK, 7, NONE),
            (ACL_OTHER, 0, NONE),
        ]),
        0,
    )?;
    sys::setxattr(
        &p("acl-dir"),
        "system.posix_acl_default",
        &sys::acl(&[
            (ACL_USER_OBJ, 7, NONE),
            (ACL_USER, 6, UB),
            (ACL_GROUP_OBJ, 5, NONE),
            (ACL_MASK, 7, NONE),
            (ACL_OTHER, 0, NONE),
        ]),
        0,
    )?;
    Ok(())
}

/// The inode flags of the tree, set by root.
fn setup_flags(d: &Path) -> std::io::Result<()> {
    let p = |n: &str| d.join(n);
    // Inode flags, set by root.
    write(&p("immutable"), b"frozen");
    chmod(&p("immutable"), 0o666);
    own(&p("immutable"), UA, UA);
    chattr(&p("immutable"), IMMUTABLE)?;
    write(&p("append"), b"log");
    chmod(&p("append"), 0o666);
    own(&p("append"), UA, UA);
    chattr(&p("append"), APPEND)?;
    mkdir(&p("imm-dir"), 0o777);
    write(&p("imm-dir/f"), b"x");
    chmod(&p("imm-dir/f"), 0o666);
    chattr(&p("imm-dir"), IMMUTABLE)?;
    Ok(())
}

/// What user A (in groups A and SHARED) may and may not do.
fn as_a(d: &Path, sup: Support, c: &mut Checks) {
    let p = |n: &str| d.join(n);
    // Search permission: nothing inside a 0700 directory of root's, however deep, and
    // whatever the kernel has cached of it.
    c.err(
        lstat(&p("private/secret")),
        EACCES,
        "stat in a 0700 dir of root's",
    );
    c.err(
        fs::read(p("private/secret")),
        EACCES,
        "read a 0644 file in a 0700 dir",
    );
    c.err(
        fs::read(p("private/inner/deep")),
        EACCES,
        "read two levels under a 0700 dir",
    );
    c.err(fs::read_dir(p("private")), EACCES, "list a 0700 dir");
    c.err(
        File::create(p("private/new")),
        EACCES,
        "create in a 0700 dir",
    );
    c.err(
        std::env::set_current_dir(p("private")),
        EACCES,
        "chdir into a 0700 dir",
    );
    c.err(
        lstat(&p("noexec/f")),
        EACCES,
        "stat in a dir without search",
    );
    c.ok(
        fs::read_dir(p("noexec")),
        "list a dir with read but no search",
    );
    c.err(fs::read_dir(p("noread")), EACCES, "list a 0711 dir");
    c.ok(fs::read(p("noread/f")), "open a known name in a 0711 dir");
    // Open modes.
    c.ok(fs::read(p("a-own")), "owner reads 0600");
    c.ok(
        OpenOptions::new().write(true).open(p("a-own")),
        "owner writes 0600",
    );
    c.ok(
        fs::read(p("grp")),
        "group member (supplementary) reads 0640",
    );
    c.err(
        OpenOptions::new().write(true).open(p("grp")),
        EACCES,
        "group member writes 0640",
    );
    c.ok(fs::read(p("oth")), "other reads 0604");
    c.err(fs::read(p("none")), EACCES, "other reads 0600");
    c.err(
        OpenOptions::new().read(true).write(true).open(p("none")),
        EACCES,
        "other opens 0600 rw",
    );
    c.err(
        fs::read(p("ownerdeny")),
        EACCES,
        "owner of a 0070 file reads it",
    );
    c.err(
        OpenOptions::new().write(true).open(p("ro-file")),
        EACCES,
        "write 0644 of root's",
    );
    c.err(
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(p("ro-file")),
        EACCES,
        "O_TRUNC 0644 of root's",
    );
    c.err(
        OpenOptions::new().append(true).open(p("ro-file")),
        EACCES,
        "O_APPEND 0644 of root's",
    );
    c.ok(
        OpenOptions::new().write(true).open(p("rw-file")),
        "write 0666 of root's",
    );
    c.err(
        access(&p("script"), AccessFlags::X_OK),
        EACCES,
        "access X of a 0644 file",
    );
    c.err(
        std::process::Command::new(p("owner-exec")).status(),
        EACCES,
        "execute a 0744 file of root's",
    );
    c.ok(
        std::process::Command::new(p("all-exec")).status(),
        "execute a 0755 file of root's",
    );
    c.err(
        access(&p("ro-file"), AccessFlags::W_OK),
        EACCES,
        "access W of 0644",
    );
    c.ok(access(&p("ro-file"), AccessFlags::R_OK), "access R of 0644");
    // Truncation.
    c.err(
        nix::unistd::truncate(&p("ro-file"), 0),
        EACCES,
        "truncate 0644 of root's",
    );
    c.ok(
        nix::unistd::truncate(&p("rw-file"), 3),
        "truncate 0666 of root's",
    );
    // Entries in a directory A may not write.
    c.err(
        File::create(p("ro/new")),
        EACCES,
        "create in 0755 of root's",
    );
    c.err(fs::create_dir(p("ro/d")), EACCES, "mkdir in 0755 of root's");
    c.err(
        fs::remove_file(p("ro/f")),
        EACCES,
        "unlink in 0755 of root's",
    );
    c.err(
        fs::remove_dir(p("ro/sub")),
        EACCES,
        "rmdir in 0755 of root's",
    );
    c.err(
        fs::rename(p("ro/f"), p("stolen")),
        EACCES,
        "rename out of 0755 of root's",
    );
    c.err(
        std::os::unix::fs::symlink("x", p("ro/s")),
        EACCES,
        "symlink in 0755 of root's",
    );
    c.err(
        fs::hard_link(p("a-own"), p("ro/l")),
        EACCES,
        "link into 0755 of root's",
    );
    c.err(
        fs::rename(p("x/rootdir"), p("y/rootdir")),
        EACCES,
        "move a dir of root's to another parent",
    );
    c.ok(
        fs::rename(p("x/rootdir"), p("x/renamed")),
        "rename it in place",
    );
    // Hard links (protected): not to what A may not read and write.
    c.err(
        fs::hard_link(p("none"), p("l-none")),
        EPERM,
        "link to 0600 of root's",
    );
    c.err(
        fs::hard_link(p("ro-file"), p("l-ro")),
        EPERM,
        "link to 0644 of root's",
    );
    c.err(
        fs::hard_link(p("su-file"), p("l-su")),
        EPERM,
        "link to someone's setuid file",
    );
    c.ok(
        fs::hard_link(p("rw-file"), p("l-rw")),
        "link to 0666 of root's",
    );
    c.ok(fs::hard_link(p("a-own"), p("l-own")), "link to own file");
    // A write by someone else clears setuid in the file system, and `stat` shows it at once:
    // the kernel's cached attributes of the file are dropped before the write is answered.
    // Direct I/O: the kernel then refetches no attribute after the write on its own
    // (generic/355).
    let _ = lstat(&p("su-open"));
    c.ok(
        OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(p("su-open"))
            .and_then(|f| {
                let mut buf = vec![0u8; 8192];
                let at = buf.as_ptr().align_offset(4096);
                std::os::unix::fs::FileExt::write_at(&f, &buf[at..at + 4096], 0)?;
                buf.clear();
                Ok(())
            }),
        "direct write to someone's 04777 file",
    );
    let m = lstat(&p("su-open")).map(|m| m.mode() & 0o7777);
    c.check(
        m == Ok(0o777),
        &format!("stat right after the write shows setuid cleared ({m:?})"),
    );
    // The same for fallocate inside the file's size, which changes no attribute the kernel
    // would refetch on its own.
    let _ = lstat(&p("su-keep"));
    c.ok(
        OpenOptions::new()
            .write(true)
            .open(p("su-keep"))
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
            .and_then(|f| {
                nix::fcntl::fallocate(
                    f.as_fd(),
                    nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    0,
                    4,
                )
            }),
        "fallocate someone's 04777 file within its size",
    );
    let m = lstat(&p("su-keep")).map(|m| m.mode() & 0o7777);
    c.check(
        m == Ok(0o777),
        &format!("stat right after the fallocate shows setuid cleared ({m:?})"),
    );
    // chmod, chown, times.
    c.err(
        fs::set_permissions(p("grp"), fs::Permissions::from_mode(0o777)),
        EPERM,
        "chmod root's file",
    );
    c.err(
        fs::set_permissions(p("su-file"), fs::Permissions::from_mode(0o755)),
        EPERM,
        "chmod clearing setuid of someone else's file",
    );
    c.ok(
        fs::set_permissions(p("a-own"), fs::Permissions::from_mode(0o640)),
        "chmod own file",
    );
    c.err(
        chown(&p("a-own"), Some(Uid::from_raw(UB)), None),
        EPERM,
        "give a file away",
    );
    c.ok(
        chown(&p("a-own"), None, Some(Gid::from_raw(SHARED))),
        "chgrp to a member group",
    );
    c.err(
        chown(&p("a-own"), None, Some(Gid::from_raw(OTHER_GROUP))),
        EPERM,
        "chgrp to a non-member group",
    );
    c.err(
        chown(&p("grp"), None, Some(Gid::from_raw(SHARED))),
        EPERM,
        "chgrp root's file",
    );
    let t1 = TimeSpec::new(1, 0);
    c.err(
        utimensat(AT_FDCWD, &p("oth"), &t1, &t1, UtimensatFlags::FollowSymlink),
        EPERM,
        "set explicit times on root's file",
    );
    c.err(
        utimensat(
            AT_FDCWD,
            &p("oth"),
            &TimeSpec::UTIME_NOW,
            &TimeSpec::UTIME_NOW,
            UtimensatFlags::FollowSymlink,
        ),
        EACCES,
        "touch a file without write permission",
    );
    c.ok(
        utimensat(
            AT_FDCWD,
            &p("rw-file"),
            &TimeSpec::UTIME_NOW,
            &TimeSpec::UTIME_NOW,
            UtimensatFlags::FollowSymlink,
        ),
        "touch a 0666 file",
    );
    // Setgid directory; chmod g+s outside the group.
    c.ok(fs::write(p("sgid/f"), b"x"), "create in a setgid dir");
    c.ok(fs::write(p("mine"), b"x"), "create mine");
    c.ok(
        fs::set_permissions(p("a-dir-chmod"), fs::Permissions::from_mode(0o2777)),
        "chmod g+s own dir outside its group",
    );
    c.ok(
        fs::set_permissions(p("a-file-sgid"), fs::Permissions::from_mode(0o2755)),
        "chmod g+s own file outside its group",
    );
    c.ok(
        chown(&p("mine"), None, Some(Gid::from_raw(UA))),
        "chgrp mine to my own group",
    );
    // Sticky directory: A's own file, B's victim.
    c.ok(
        fs::write(p("sticky/a-file"), b"a"),
        "create in a sticky dir",
    );
    c.err(
        fs::remove_file(p("sticky/b-victim")),
        EPERM,
        "unlink B's file in a sticky dir",
    );
    c.err(
        fs::rename(p("sticky/b-victim"), p("sticky/mine-now")),
        EPERM,
        "rename B's file in a sticky dir",
    );
    c.err(
        fs::rename(p("sticky/a-file"), p("sticky/b-victim")),
        EPERM,
        "rename over B's file in a sticky dir",
    );
    // ACLs: the named user entry, the mask, named groups.
    if sup.acls {
        c.ok(
            sys::setxattr(
                &p("a-dir-acl"),
                "system.posix_acl_access",
                &sys::acl(&[
                    (ACL_USER_OBJ, 7, NONE),
                    (ACL_GROUP_OBJ, 7, NONE),
                    (ACL_OTHER, 7, NONE),
                ]),
                0,
            ),
            "setfacl on own dir outside its group",
        );
        c.ok(fs::read(p("acl-file")), "read by a named-user ACL entry");
        c.err(
            OpenOptions::new().write(true).open(p("acl-file")),
            EACCES,
            "write where a named-user entry (r--) decides before A's group entry (rw-)",
        );
        c.err(
            OpenOptions::new().write(true).open(p("acl-masked")),
            EACCES,
            "write through a mask of r-- (named entry rwx)",
        );
        c.ok(fs::read(p("acl-masked")), "read through a mask of r--");
        c.ok(
            fs::write(p("acl-dir/a-made"), b"a"),
            "create in a dir searchable only by ACL",
        );
        c.err(
            sys::setxattr(
                &p("acl-file"),
                "system.posix_acl_access",
                &sys::acl(&[
                    (ACL_USER_OBJ, 7, NONE),
                    (ACL_GROUP_OBJ, 7, NONE),
                    (ACL_OTHER, 7, NONE),
                ]),
                0,
            ),
            EPERM,
            "set an ACL on root's file",
        );
    }
    // Inode flags: only root sets immutable or append-only; the owner cannot undo them.
    if sup.flags {
        c.err(chattr(&p("a-own"), IMMUTABLE), EPERM, "chattr +i own file");
        c.err(chattr(&p("b-file"), 0), EPERM, "chattr someone else's file");
        c.ok(flags_of(&p("immutable")), "lsattr");
        c.err(chattr(&p("immutable"), 0), EPERM, "chattr -i as the owner");
        c.err(
            OpenOptions::new().write(true).open(p("immutable")),
            EPERM,
            "write an immutable file",
        );
        c.err(
            fs::remove_file(p("immutable")),
            EPERM,
            "unlink an immutable file",
        );
        c.err(
            fs::set_permissions(p("immutable"), fs::Permissions::from_mode(0o600)),
            EPERM,
            "chmod an immutable file",
        );
        c.err(
            fs::hard_link(p("immutable"), p("l-imm")),
            EPERM,
            "link an immutable file",
        );
        c.err(
            File::create(p("imm-dir/new")),
            EPERM,
            "create in an immutable dir",
        );
        c.err(
            fs::remove_file(p("imm-dir/f")),
            EPERM,
            "unlink in an immutable dir",
        );
        c.err(
            OpenOptions::new().write(true).open(p("append")),
            EPERM,
            "open append-only without O_APPEND",
        );
        c.ok(
            OpenOptions::new()
                .append(true)
                .open(p("append"))
                .and_then(|mut f| f.write_all(b"+a")),
            "append to an append-only file",
        );
        c.err(
            nix::unistd::truncate(&p("append"), 0),
            EPERM,
            "truncate an append-only file",
        );
        c.err(
            fs::remove_file(p("append")),
            EPERM,
            "unlink an append-only file",
        );
    }
    // User extended attributes follow the file's permissions.
    c.ok(
        sys::getxattr(&p("xattr-ro"), "user.k"),
        "read a user xattr of a readable file",
    );
    c.err(
        sys::setxattr(&p("xattr-ro"), "user.k", b"w", 0),
        EACCES,
        "set a user xattr without write",
    );
    c.err(
        sys::getxattr(&p("xattr-none"), "user.k"),
        EACCES,
        "read a user xattr without read",
    );
}

/// What user B may and may not do (no supplementary groups).
fn as_b(d: &Path, sup: Support, c: &mut Checks) {
    let p = |n: &str| d.join(n);
    c.err(fs::read(p("grp")), EACCES, "read 0640 outside its group");
    if sup.acls {
        c.err(
            fs::read(p("acl-file")),
            EACCES,
            "read with no ACL entry (other ---)",
        );
        c.err(
            fs::write(p("acl-dir/b-made"), b"b"),
            EACCES,
            "create in a dir B may not search",
        );
        c.err(
            lstat(&p("acl-dir/a-made")),
            EACCES,
            "stat in a dir B may not search",
        );
    }
    c.err(
        fs::remove_file(p("sticky/a-file")),
        EPERM,
        "unlink A's file in a sticky dir",
    );
    c.ok(
        fs::remove_file(p("sticky/b-victim")),
        "unlink own file in a sticky dir",
    );
    c.err(
        OpenOptions::new().write(true).open(p("a-own")),
        EACCES,
        "write A's 0640 file as other",
    );
    c.err(
        chown(&p("a-own"), Some(Uid::from_raw(UB)), None),
        EPERM,
        "chown A's file to self",
    );
}

/// What user C, a member of SHARED only, may do.
fn as_c(d: &Path, sup: Support, c: &mut Checks) {
    let p = |n: &str| d.join(n);
    c.ok(
        fs::read(p("grp")),
        "read 0640 through the supplementary group",
    );
    if sup.acls {
        c.ok(
            OpenOptions::new().write(true).open(p("acl-file")),
            "write through a named-group ACL entry",
        );
    }
    c.err(
        OpenOptions::new().write(true).open(p("sg-file")),
        EACCES,
        "write a 02755 file of the group",
    );
}

/// After the users ran: what root sees.
fn verify(d: &Path, sup: Support) -> Vec<String> {
    let p = |n: &str| d.join(n);
    let mut bad = Vec::new();
    let mut want = |cond: bool, what: &str| {
        if !cond {
            bad.push(format!("FAIL {what}"));
        } else {
            say!("ok   {what}");
        }
    };
    let m = lstat(&p("sgid/f")).map(|m| m.gid());
    want(
        m == Ok(SHARED),
        "a file made in a setgid dir takes its group",
    );
    let m = lstat(&p("a-file-sgid")).map(|m| m.mode() & 0o7777);
    want(
        m == Ok(0o755),
        &format!("S_ISGID dropped by chmod outside the group ({m:?})"),
    );
    // Root reads and writes anything, creates in and removes from any directory, but
    // executes only what has an execute bit.
    want(fs::read(p("zero")).is_ok(), "root reads a 0000 file");
    want(
        OpenOptions::new().write(true).open(p("zero")).is_ok(),
        "root writes a 0000 file",
    );
    want(
        access(&p("script"), AccessFlags::X_OK) == Err(nix::errno::Errno::EACCES),
        "root may not execute a file with no execute bit",
    );
    want(
        access(&p("owner-exec"), AccessFlags::X_OK).is_ok(),
        "root executes a 0744 file",
    );
    want(
        File::create(p("closed/by-root")).is_ok(),
        "root creates in a 0000 dir",
    );
    want(
        fs::remove_file(p("sticky/c-victim")).is_ok(),
        "root unlinks someone's file in a sticky dir",
    );
    let m = lstat(&p("a-dir-chmod")).map(|m| m.mode() & 0o7777);
    want(
        m == Ok(0o777),
        &format!("S_ISGID dropped by chmod outside the group, on a dir too ({m:?})"),
    );
    if sup.acls {
        let m = lstat(&p("a-dir-acl")).map(|m| m.mode() & 0o7777);
        want(
            m == Ok(0o777),
            &format!("S_ISGID dropped by setfacl outside the group ({m:?})"),
        );
        let made = lstat(&p("acl-dir/a-made"));
        let acl = sys::getxattr(&p("acl-dir/a-made"), "system.posix_acl_access");
        want(
            made.as_ref().is_ok_and(|m| m.mode() & 0o777 == 0o660)
                && acl.as_ref().is_ok_and(|v| v.len() == 4 + 5 * 8),
            &format!(
                "a file made under a default ACL inherits it (mode {:o}, ACL {acl:?})",
                made.map(|m| m.mode() & 0o7777).unwrap_or(0)
            ),
        );
    } else {
        want(false, "POSIX ACLs: setting one as root fails");
    }
    if sup.flags {
        let f = flags_of(&p("append"));
        want(
            f.as_ref().is_ok_and(|f| f & APPEND != 0),
            &format!("append-only kept ({f:?})"),
        );
        want(
            fs::read(p("append")).is_ok_and(|b| b == b"log+a"),
            "the append landed at the end",
        );
    } else {
        want(false, "inode flags: chattr as root fails");
    }
    want(
        lstat(&p("sticky/a-file")).is_ok(),
        "A's file survived B in the sticky dir",
    );
    want(
        lstat(&p("immutable")).is_ok(),
        "the immutable file survived",
    );
    bad
}

fn cleanup_flags(d: &Path) {
    for n in ["immutable", "append", "imm-dir"] {
        let _ = chattr(&d.join(n), 0);
    }
}

/// Runs the whole list on one target; the failed lines.
fn run(t: &Target) -> Vec<String> {
    let d: PathBuf = t.path("perm");
    chmod(t.root(), 0o755);
    mkdir(&d, 0o777);
    setup(&d);
    let sup = Support {
        acls: setup_acls(&d).map_err(|e| say!("no ACLs: {e}")).is_ok(),
        flags: setup_flags(&d)
            .map_err(|e| say!("no inode flags: {e}"))
            .is_ok(),
    };
    let mut failed = Vec::new();
    let (da, db, dc) = (d.clone(), d.clone(), d.clone());
    failed.extend(run_as(UA, UA, &[UA, SHARED], "A", move |c| {
        as_a(&da, sup, c)
    }));
    failed.extend(run_as(UB, UB, &[UB], "B", move |c| as_b(&db, sup, c)));
    failed.extend(run_as(UC, UC, &[UC, SHARED], "C", move |c| {
        as_c(&dc, sup, c)
    }));
    failed.extend(verify(&d, sup));
    cleanup_flags(&d);
    failed
}

/// The targets: the host (with CAIRN_TEST_HOST_ONLY=1), else each mode with and without
/// `default_permissions`, over the transports in turn.
fn targets() -> Vec<(String, Target)> {
    if host_only() {
        return vec![("host".into(), Target::host_dir())];
    }
    let ts = transports();
    let mut v = Vec::new();
    for (i, m) in modes().iter().enumerate() {
        let t = &ts[i % ts.len()];
        v.push((
            format!("{m}+{t} default_permissions"),
            Target::cairn_via(m, t, "64M", &[]),
        ));
        let u = &ts[(i + 1) % ts.len()];
        v.push((
            format!("{m}+{u} nodefault_permissions"),
            Target::cairn_with(m, u, "64M", &[], "nodefault_permissions"),
        ));
    }
    v
}

#[test]
fn permissions_as_unprivileged_users() {
    let count_only = std::env::var("CAIRN_PERM_COUNT_ONLY").is_ok_and(|v| v == "1");
    let mut summary = Vec::new();
    let mut all = 0;
    for (name, t) in targets() {
        say!("=== permissions on {name}");
        let failed = run(&t);
        summary.push(format!("{name}: {} failed", failed.len()));
        for f in &failed {
            say!("[{name}] {f}");
        }
        all += failed.len();
    }
    for s in &summary {
        say!("{s}");
    }
    if !count_only {
        assert_eq!(all, 0, "permission checks failed:\n{}", summary.join("\n"));
    }
}
