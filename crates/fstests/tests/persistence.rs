//! Persistence: what was written before an unmount is there after the remount, and the image
//! in between is clean for fsck.
//!
//! 1. `populate_fsck_remount_compare`: a few thousand files, directories, symlinks, hard
//!    links, sparse files, special files and xattrs with varied sizes, modes, owners and
//!    mtimes; unmount, `cairn fsck` exits 0, remount, the tree compares equal (contents,
//!    modes, owners, mtimes, link counts, xattrs). Then half of it is deleted and the cycle
//!    repeats.
//! 2. `build_c_project_fsck_remount_compare`: Debian's zlib source is built on the mount
//!    (`./configure && make -j2 && make test`), a checksum list of the build tree is taken,
//!    unmount, fsck clean, remount, compare. The source is cached under
//!    `~/.cache/cairn/src` (or `$CAIRN_SRC_CACHE`). Without a cached copy, the source is
//!    fetched with `apt-get source zlib` only when `CAIRN_TEST_HEAVY=1` (adding deb-src
//!    entries if missing); otherwise — or if fetching fails — a generated C project of a few
//!    dozen files is built instead, and the output says so. With `CAIRN_TEST_HEAVY=1` the
//!    remounted tree is also rebuilt from clean and tested again.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_fstests::{Target, pattern, say, sys, tree};
use nix::fcntl::AT_FDCWD;
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, mknod, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, chown};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn file_size(r: &mut StdRng) -> usize {
    match r.random_range(0..1000) {
        0..=699 => r.random_range(0..4096),
        700..=964 => r.random_range(4096..64 << 10),
        965..=994 => r.random_range(64 << 10..512 << 10),
        _ => r.random_range(1 << 20..3 << 20),
    }
}

/// Builds the population under `root`; returns the number of objects made.
fn populate(root: &Path, seed: u64) -> usize {
    let mut r = StdRng::seed_from_u64(seed);
    let mut dirs: Vec<PathBuf> = vec![root.to_path_buf()];
    let mut files: Vec<PathBuf> = Vec::new();
    let mut made = 0;
    for i in 0..120 {
        let parent = dirs[r.random_range(0..dirs.len())].clone();
        let d = parent.join(format!("dir{i:03}"));
        fs::create_dir(&d).unwrap();
        dirs.push(d);
        made += 1;
    }
    for i in 0..2500 {
        let parent = &dirs[r.random_range(0..dirs.len())];
        let f = parent.join(format!("file{i:04}.dat"));
        let n = file_size(&mut r);
        fs::write(&f, pattern(seed ^ i, n)).unwrap();
        files.push(f);
        made += 1;
    }
    for i in 0..25 {
        let parent = &dirs[r.random_range(0..dirs.len())];
        let f = parent.join(format!("sparse{i:02}"));
        let fh = File::create(&f).unwrap();
        for k in 0..4u64 {
            let off = r.random_range(0..100u64 << 20);
            fh.write_all_at(&pattern(i * 7 + k, 5000), off).unwrap();
        }
        files.push(f);
        made += 1;
    }
    for i in 0..300 {
        let parent = &dirs[r.random_range(0..dirs.len())];
        let len = [1, 10, 59, 60, 61, 120, 500, 1000, 4095][r.random_range(0..9)];
        let target: String = (0..len)
            .map(|k| (b'a' + ((i + k) % 26) as u8) as char)
            .collect();
        std::os::unix::fs::symlink(target, parent.join(format!("link{i:03}"))).unwrap();
        made += 1;
    }
    for i in 0..150 {
        let src = files[r.random_range(0..files.len())].clone();
        let parent = &dirs[r.random_range(0..dirs.len())];
        fs::hard_link(&src, parent.join(format!("hard{i:03}"))).unwrap();
        made += 1;
    }
    for i in 0..10 {
        let parent = &dirs[r.random_range(0..dirs.len())];
        nix::unistd::mkfifo(
            &parent.join(format!("fifo{i}")),
            Mode::from_bits_truncate(0o640),
        )
        .unwrap();
        let dev = nix::sys::stat::makedev(r.random_range(1..300), r.random_range(0..100_000));
        mknod(
            &parent.join(format!("chr{i}")),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            dev,
        )
        .unwrap();
        made += 2;
    }
    // xattrs, modes, owners, mtimes — mtimes last, since creating children changes a
    // directory's mtime.
    for (i, f) in files.iter().enumerate().filter(|(i, _)| i % 15 == 0) {
        for k in 0..(1 + i % 3) {
            let v = pattern(i as u64 * 3 + k as u64, [0, 5, 100, 1500][(i + k) % 4]);
            sys::setxattr(f, &format!("user.attr{k}"), &v, 0).unwrap();
        }
    }
    for (i, d) in dirs.iter().enumerate().skip(1).filter(|(i, _)| i % 10 == 0) {
        sys::setxattr(d, "user.dirattr", format!("dir {i}").as_bytes(), 0).unwrap();
    }
    let modes = [0o600, 0o644, 0o755, 0o640, 0o4755, 0o2755, 0o444, 0o000];
    for (i, f) in files.iter().enumerate() {
        fs::set_permissions(f, fs::Permissions::from_mode(modes[i % modes.len()])).unwrap();
        if i % 7 == 0 {
            chown(
                f,
                Some(Uid::from_raw(1000 + (i % 5) as u32)),
                Some(Gid::from_raw(2000 + (i % 3) as u32)),
            )
            .unwrap();
        }
    }
    for (i, d) in dirs.iter().enumerate().skip(1) {
        if i % 9 == 0 {
            fs::set_permissions(
                d,
                fs::Permissions::from_mode([0o1777, 0o2775, 0o700][i % 3]),
            )
            .unwrap();
        }
        if i % 11 == 0 {
            chown(d, Some(Uid::from_raw(3000)), Some(Gid::from_raw(3001))).unwrap();
        }
    }
    for (i, f) in files.iter().enumerate().filter(|(i, _)| i % 4 == 0) {
        let t = TimeSpec::new(
            1_000_000_000 + i as i64 * 1000,
            (i as i64 * 7919) % 1_000_000_000,
        );
        utimensat(AT_FDCWD, f, &t, &t, UtimensatFlags::FollowSymlink).unwrap();
    }
    made
}

fn compare_after_remount(t: &mut Target, dir: &Path, what: &str) -> tree::Tree {
    let before = tree::snapshot(dir, tree::Opts::ALL, &[]).unwrap();
    say!(
        "{}: {what}: {} objects snapshotted; unmount, fsck, remount",
        t.name(),
        before.len()
    );
    t.assert_fsck_clean_and_remount(what);
    let after = tree::snapshot(dir, tree::Opts::ALL, &[]).unwrap();
    let d = tree::diff("before unmount", &before, "after remount", &after);
    assert!(
        d.is_empty(),
        "{}: {what}: the tree changed across unmount/remount ({} differences):\n{}",
        t.name(),
        d.len(),
        d.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
    say!(
        "{}: {what}: all {} objects identical after remount",
        t.name(),
        after.len()
    );
    after
}

#[test]
fn populate_fsck_remount_compare() {
    // Among the slowest suites: every mode over one transport, the transports in turn (what
    // the transport changes, the teardown before the final flush, is the same whatever the
    // mode); the POSIX and differential suites run every mode over both.
    for mut t in Target::all_once() {
        say!("=== persistence (populate) on {}", t.name());
        let dir = t.path("pop");
        fs::create_dir(&dir).unwrap();
        let start = std::time::Instant::now();
        let n = populate(&dir, 0xC0FFEE);
        say!(
            "populated {n} objects in {:.1}s",
            start.elapsed().as_secs_f64()
        );
        let snap = compare_after_remount(&mut t, &dir, "populate");
        // Delete every other regular file and symlink, rewrite some others, and check again:
        // frees must persist as well as allocations.
        let mut deleted = 0;
        for (i, (k, e)) in snap.iter().enumerate() {
            let p = dir.join(String::from_utf8_lossy(k).as_ref());
            if e.kind != "dir" && i % 2 == 0 {
                fs::remove_file(&p).unwrap();
                deleted += 1;
            } else if e.kind == "file" && e.perm & 0o200 != 0 && i % 5 == 1 {
                fs::write(&p, pattern(i as u64, 10_000)).unwrap();
            }
        }
        say!("deleted {deleted} names, rewrote some files");
        compare_after_remount(&mut t, &dir, "delete half");
    }
}

// ---------------------------------------------------------------------------------------------
// building a C project

fn src_cache() -> PathBuf {
    std::env::var_os("CAIRN_SRC_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/root".into());
            home.join(".cache/cairn/src")
        })
}

fn cached_zlib(cache: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(cache)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("zlib-"))
                && p.join("configure").is_file()
        })
        .collect();
    dirs.sort();
    dirs.pop()
}

/// Adds deb-src entries mirroring the configured deb entries if there are none.
fn ensure_deb_src() -> Result<(), String> {
    let mut texts = Vec::new();
    if let Ok(s) = fs::read_to_string("/etc/apt/sources.list") {
        texts.push(("/etc/apt/sources.list".to_string(), s));
    }
    for e in fs::read_dir("/etc/apt/sources.list.d")
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let name = e.path().to_string_lossy().into_owned();
        if name.ends_with(".list") || name.ends_with(".sources") {
            texts.push((name, fs::read_to_string(e.path()).unwrap_or_default()));
        }
    }
    let has_src = texts.iter().any(|(_, s)| {
        s.lines().any(|l| {
            l.trim_start().starts_with("deb-src ")
                || (l.starts_with("Types:") && l.contains("deb-src"))
        })
    });
    if has_src {
        return Ok(());
    }
    let (name, text) = texts
        .iter()
        .find(|(n, s)| n.contains("debian") && (s.contains("Types: deb") || s.contains("deb http")))
        .ok_or("no Debian apt source to mirror")?;
    let src = if name.ends_with(".sources") {
        text.replace("Types: deb\n", "Types: deb-src\n")
    } else {
        text.lines()
            .filter(|l| l.starts_with("deb "))
            .map(|l| l.replacen("deb ", "deb-src ", 1) + "\n")
            .collect()
    };
    let out = if name.ends_with(".sources") {
        "/etc/apt/sources.list.d/cairn-deb-src.sources"
    } else {
        "/etc/apt/sources.list.d/cairn-deb-src.list"
    };
    fs::write(out, src).map_err(|e| format!("write {out}: {e}"))?;
    say!("added deb-src entries in {out}");
    let o = Command::new("apt-get")
        .args(["update", "-qq"])
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "apt-get update failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(())
}

fn fetch_zlib(cache: &Path) -> Result<PathBuf, String> {
    fs::create_dir_all(cache).map_err(|e| e.to_string())?;
    ensure_deb_src()?;
    let o = Command::new("apt-get")
        .args(["source", "zlib"])
        .current_dir(cache)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "apt-get source zlib failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    cached_zlib(cache).ok_or_else(|| "apt-get source zlib left no zlib-*/configure".to_string())
}

/// A small generated C project: `n` translation units, a static library, a program, and a
/// `make test` that checks the program's output against the value computed here.
fn generate_project(dir: &Path, n: usize) {
    fs::create_dir_all(dir.join("src")).unwrap();
    let mut expected: u64 = 0;
    let mut decls = String::new();
    let mut calls = String::new();
    for i in 0..n {
        let body = format!(
            "#include \"gen.h\"\nunsigned long long f{i}(unsigned long long x) {{\n    unsigned long long acc = {i};\n    for (int k = 0; k < {k}; k++) acc = acc * 31 + (x ^ k);\n    return acc % 1000003ULL;\n}}\n",
            k = 10 + i
        );
        fs::write(dir.join(format!("src/f{i}.c")), body).unwrap();
        decls.push_str(&format!("unsigned long long f{i}(unsigned long long x);\n"));
        calls.push_str(&format!("    sum += f{i}({i});\n"));
        let mut acc: u64 = i as u64;
        for k in 0..(10 + i) as u64 {
            acc = acc.wrapping_mul(31).wrapping_add(i as u64 ^ k);
        }
        expected = expected.wrapping_add(acc % 1_000_003);
    }
    fs::write(dir.join("src/gen.h"), format!("#pragma once\n{decls}")).unwrap();
    fs::write(
        dir.join("src/main.c"),
        format!("#include <stdio.h>\n#include \"gen.h\"\nint main(void) {{\n    unsigned long long sum = 0;\n{calls}    printf(\"%llu\\n\", sum);\n    return 0;\n}}\n"),
    )
    .unwrap();
    fs::write(dir.join("expected.txt"), format!("{expected}\n")).unwrap();
    let objs: Vec<String> = (0..n).map(|i| format!("src/f{i}.o")).collect();
    fs::write(
        dir.join("Makefile"),
        format!(
            "CC ?= cc\nCFLAGS ?= -O2 -Wall\nOBJS = {}\n\nall: prog\n\nlibgen.a: $(OBJS)\n\tar rcs $@ $^\n\nprog: src/main.o libgen.a\n\t$(CC) -o $@ $^\n\n%.o: %.c src/gen.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\ntest: prog\n\t./prog > out.txt\n\tcmp out.txt expected.txt\n\t@echo generated project test OK\n\nclean:\n\trm -f $(OBJS) src/main.o libgen.a prog out.txt\n",
            objs.join(" ")
        ),
    )
    .unwrap();
    fs::write(
        dir.join("configure"),
        "#!/bin/sh\necho configured > config.status\n",
    )
    .unwrap();
    fs::set_permissions(dir.join("configure"), fs::Permissions::from_mode(0o755)).unwrap();
}

fn sh(dir: &Path, script: &str) {
    let o = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("run sh");
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    assert!(
        o.status.success(),
        "`{script}` failed in {} ({}):\n--- stdout (tail) ---\n{}\n--- stderr (tail) ---\n{}",
        dir.display(),
        o.status,
        tail(&o.stdout),
        tail(&o.stderr)
    );
    say!(
        "`{script}` ok: {}",
        tail(&o.stdout).lines().last().unwrap_or("")
    );
}

#[test]
fn build_c_project_fsck_remount_compare() {
    let cache = src_cache();
    let zlib = match cached_zlib(&cache) {
        Some(p) => Ok(p),
        None if cairn_fstests::heavy() => fetch_zlib(&cache),
        None => Err(format!(
            "no cached zlib source in {} and CAIRN_TEST_HEAVY is not 1",
            cache.display()
        )),
    };
    let project = match &zlib {
        Ok(p) => {
            say!("building Debian zlib from {}", p.display());
            Some(p.clone())
        }
        Err(e) => {
            say!("NOTE: zlib source unavailable ({e}); building a generated C project instead");
            None
        }
    };
    // The slowest suite: every mode over one transport, the transports in turn.
    for mut t in Target::all_once() {
        say!("=== persistence (C build) on {}", t.name());
        let build = t.path("build");
        match &project {
            Some(src) => {
                let o = Command::new("cp")
                    .arg("-a")
                    .arg(src)
                    .arg(&build)
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "cp -a: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            None => generate_project(&build, 40),
        }
        let start = std::time::Instant::now();
        sh(&build, "./configure");
        sh(&build, "make -j2");
        sh(&build, "make test");
        say!(
            "configure/make/make test took {:.1}s on {}",
            start.elapsed().as_secs_f64(),
            t.name()
        );
        let files = compare_after_remount(&mut t, &build, "C build");
        let count: BTreeMap<&str, usize> = files.values().fold(BTreeMap::new(), |mut m, e| {
            *m.entry(e.kind).or_default() += 1;
            m
        });
        say!("build tree: {count:?}");
        assert!(
            count.get("file").copied().unwrap_or(0) > 40,
            "the build tree looks too small: {count:?}"
        );
        if cairn_fstests::heavy() {
            sh(&build, "make test");
            sh(
                &build,
                "make clean >/dev/null && make -j2 >/dev/null && make test",
            );
            compare_after_remount(&mut t, &build, "rebuild after remount");
        }
    }
}
