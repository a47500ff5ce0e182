//! Issue 9 §6 and fstests generic/683-684 on an umbrella mount: a user who may write a
//! setuid/setgid file but does not own it can write, truncate and fallocate it, and each
//! clears setuid, and setgid when group-execute is set or when the writer is outside the
//! file's group (Linux's `setattr_should_drop_sgid`, since 6.2), as on ext4. The same steps
//! run on a host directory (ext4 or tmpfs) as the reference, by a member of the file's group
//! and by an outsider, with and without FUSE passthrough (docs/UMBRELLA.md: who clears
//! what).

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cairn_fstests::user::as_user;
use common::Rig;

const OWNER: u32 = 4241;
const WRITER: u32 = 4242;

/// One branch by default, so files may be passed through (nothing to overflow to).
const CONFIG: &str = r#"
[umbrella]
default = ["a"]
[[branch]]
name = "a"
path = "a"
[[branch]]
name = "b"
path = "b"
"#;

/// How each copy of a file is changed: write, truncate, ftruncate, fallocate.
const SUFFIXES: [&str; 4] = ["w", "t", "ft", "f"];

/// (name, mode) of the files the writer works on; all owned by OWNER:OWNER, writable by
/// everyone.
const FILES: [(&str, u32); 4] = [
    ("suid", 0o4666),
    ("sgid-noexec", 0o2666),
    ("both-gexec", 0o6676),
    ("both-noexec", 0o6666),
];

fn prepare(dir: &Path) {
    for (name, mode) in FILES {
        for suffix in SUFFIXES {
            let p = dir.join(format!("{name}.{suffix}"));
            fs::write(&p, b"0123456789").unwrap();
            std::os::unix::fs::chown(&p, Some(OWNER), Some(OWNER)).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, mode);
        }
    }
}

/// As WRITER (with supplementary `groups`): write, truncate by path, truncate through a
/// descriptor, fallocate, each on its own copy of every file; an explicit chmod is refused.
fn as_writer(dir: &Path, groups: &[u32], label: &str) {
    let d = dir.to_path_buf();
    as_user(WRITER, WRITER, groups, label, move |c| {
        for (name, mode) in FILES {
            let p = |s: &str| d.join(format!("{name}.{s}"));
            c.ok(
                fs::OpenOptions::new()
                    .write(true)
                    .open(p("w"))
                    .and_then(|mut f| f.write_all(b"x")),
                &format!("write {name} (mode {mode:o}) as a non-owner"),
            );
            c.ok(
                fs::OpenOptions::new()
                    .write(true)
                    .open(p("t"))
                    .and_then(|_| nix::unistd::truncate(&p("t"), 3).map_err(Into::into)),
                &format!("truncate {name} by path as a non-owner"),
            );
            c.ok(
                fs::OpenOptions::new()
                    .write(true)
                    .open(p("ft"))
                    .and_then(|f| f.set_len(4)),
                &format!("ftruncate {name} as a non-owner"),
            );
            c.ok(
                fs::OpenOptions::new()
                    .write(true)
                    .open(p("f"))
                    .and_then(|f| {
                        nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::empty(), 0, 4096)
                            .map_err(Into::into)
                    }),
                &format!("fallocate {name} as a non-owner"),
            );
            c.err(
                fs::set_permissions(p("w"), fs::Permissions::from_mode(0o666)),
                libc::EPERM,
                &format!("chmod {name} as a non-owner"),
            );
        }
    });
}

/// Modes and sizes of every file, by name.
fn results(dir: &Path) -> Vec<(String, u32, u64)> {
    let mut v = Vec::new();
    for (name, _) in FILES {
        for s in SUFFIXES {
            let m = fs::metadata(dir.join(format!("{name}.{s}"))).unwrap();
            v.push((format!("{name}.{s}"), m.mode() & 0o7777, m.len()));
        }
    }
    v
}

/// Setuid gone; setgid gone where group-execute is set, and everywhere for an outsider.
fn expected(outsider: bool) -> Vec<(String, u32, u64)> {
    let mut v = Vec::new();
    for (name, mode) in FILES {
        let after = mode
            & !libc::S_ISUID
            & if outsider || mode & 0o010 != 0 {
                !libc::S_ISGID
            } else {
                !0
            };
        for (s, len) in [("w", 10), ("t", 3), ("ft", 4), ("f", 4096)] {
            v.push((format!("{name}.{s}"), after, len));
        }
    }
    v
}

fn host_reference(groups: &[u32]) -> Vec<(String, u32, u64)> {
    let d = tempfile::tempdir().unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    prepare(d.path());
    as_writer(d.path(), groups, "host directory");
    results(d.path())
}

#[test]
fn a_permitted_non_owner_writes_and_truncates_setuid_files() {
    let groups = [
        ("member", &[WRITER, OWNER][..]),
        ("outsider", &[WRITER][..]),
    ];
    let reference: Vec<_> = groups.iter().map(|(_, g)| host_reference(g)).collect();
    for (i, (who, _)) in groups.iter().enumerate() {
        assert_eq!(
            reference[i],
            expected(*who == "outsider"),
            "the host file system disagrees with the test ({who})"
        );
    }
    let mut r = Rig::new(&["a", "b"], CONFIG);
    for passthrough in [true, false] {
        r.unmount();
        r.mount_with(passthrough);
        for (i, (who, groups)) in groups.iter().enumerate() {
            let dir: PathBuf = r.m(&format!("pt-{passthrough}-{who}"));
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
            prepare(&dir);
            as_writer(
                &dir,
                groups,
                &format!("umbrella, passthrough {passthrough}, {who}"),
            );
            assert_eq!(
                results(&dir),
                reference[i],
                "umbrella (passthrough {passthrough}, writer a group {who}) differs from the host"
            );
        }
    }
}
