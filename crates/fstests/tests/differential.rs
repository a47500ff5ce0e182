//! Randomized differential test: random operation sequences applied to a cairn mount and to a
//! directory on the host file system, comparing every result and errno, and finally both
//! trees byte for byte.
//!
//! What legitimately differs is normalised away: inode numbers, st_dev, st_blocks, times and
//! directory sizes are never compared. Everything else (kinds, permission bits, sizes, link
//! counts, owners, contents, symlink targets, errnos) must be identical.
//!
//! Environment: `CAIRN_DIFF_SEED` (default: from the clock, printed), `CAIRN_DIFF_OPS` (total
//! operations per target, default 4000), `CAIRN_DIFF_SEQ_LEN` (operations per sequence,
//! default 200), `CAIRN_DIFF_ONLY_SEQ` (replay one sequence). A failure prints the seed, the
//! sequence and every operation up to the failing one. With CAIRN_TEST_HOST_ONLY=1 the
//! comparison is host ext4 against a tmpfs, which validates the harness and normalisation.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use cairn_fstests::{Errnoish, Target, errno_name, fnv64, pattern, say, tree};
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f"];

#[derive(Clone, Debug)]
enum Op {
    Create {
        path: String,
        mode: u32,
        excl: bool,
    },
    Write {
        path: String,
        off: u64,
        len: usize,
        seed: u64,
        append: bool,
        trunc: bool,
    },
    Read {
        path: String,
        off: u64,
        len: usize,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Rename {
        from: String,
        to: String,
        flags: u32,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Symlink {
        target: String,
        path: String,
    },
    Readlink {
        path: String,
    },
    Stat {
        path: String,
    },
    Readdir {
        path: String,
    },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// A normalised result: what must be equal on both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Err(String),
    Stat {
        kind: &'static str,
        perm: u32,
        size: Option<u64>,
        nlink: u64,
        uid: u32,
        gid: u32,
    },
    Data {
        len: usize,
        hash: u64,
    },
    Names(Vec<String>),
    Bytes(Vec<u8>),
}

fn errout(e: i32) -> Outcome {
    Outcome::Err(errno_name(e))
}

fn kind(m: &fs::Metadata) -> &'static str {
    let ft = m.file_type();
    if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "other"
    }
}

fn apply(root: &Path, op: &Op) -> Outcome {
    let p = |s: &str| root.join(s);
    let unit = |r: Result<(), i32>| match r {
        Ok(()) => Outcome::Ok,
        Err(e) => errout(e),
    };
    match op {
        Op::Create { path, mode, excl } => {
            let mut o = OpenOptions::new();
            o.write(true).mode(*mode);
            if *excl {
                o.create_new(true);
            } else {
                o.create(true);
            }
            unit(o.open(p(path)).map(drop).errno_result())
        }
        Op::Write {
            path,
            off,
            len,
            seed,
            append,
            trunc,
        } => {
            let data = pattern(*seed, *len);
            let r = (|| -> std::io::Result<()> {
                let mut o = OpenOptions::new();
                // O_TRUNC by flag: std refuses append together with truncate, the kernel does not.
                o.write(true)
                    .append(*append)
                    .custom_flags(if *trunc { libc::O_TRUNC } else { 0 });
                let f = o.open(p(path))?;
                f.write_all_at(&data, *off)?;
                Ok(())
            })();
            unit(r.errno_result())
        }
        Op::Read { path, off, len } => {
            let r = (|| -> std::io::Result<Vec<u8>> {
                let f = File::open(p(path))?;
                let mut buf = vec![0u8; *len];
                let mut got = 0;
                while got < *len {
                    let n = f.read_at(&mut buf[got..], off + got as u64)?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                buf.truncate(got);
                Ok(buf)
            })();
            match r.errno_result() {
                Ok(b) => Outcome::Data {
                    len: b.len(),
                    hash: fnv64(&b),
                },
                Err(e) => errout(e),
            }
        }
        Op::Truncate { path, size } => {
            unit(nix::unistd::truncate(&p(path), *size as i64).errno_result())
        }
        Op::Rename { from, to, flags } => unit(
            renameat2(
                AT_FDCWD,
                &p(from),
                AT_FDCWD,
                &p(to),
                RenameFlags::from_bits_truncate(*flags),
            )
            .errno_result(),
        ),
        Op::Link { from, to } => unit(fs::hard_link(p(from), p(to)).errno_result()),
        Op::Unlink { path } => unit(fs::remove_file(p(path)).errno_result()),
        Op::Mkdir { path, mode } => unit(
            nix::unistd::mkdir(&p(path), nix::sys::stat::Mode::from_bits_truncate(*mode))
                .errno_result(),
        ),
        Op::Rmdir { path } => unit(fs::remove_dir(p(path)).errno_result()),
        Op::Chmod { path, mode } => {
            unit(fs::set_permissions(p(path), fs::Permissions::from_mode(*mode)).errno_result())
        }
        Op::Symlink { target, path } => {
            unit(std::os::unix::fs::symlink(target, p(path)).errno_result())
        }
        Op::Readlink { path } => match fs::read_link(p(path)).errno_result() {
            Ok(t) => Outcome::Bytes(t.as_os_str().as_bytes().to_vec()),
            Err(e) => errout(e),
        },
        Op::Stat { path } => match fs::symlink_metadata(p(path)).errno_result() {
            Ok(m) => {
                let k = kind(&m);
                Outcome::Stat {
                    kind: k,
                    perm: m.mode() & 0o7777,
                    size: (k != "dir").then(|| m.size()),
                    nlink: m.nlink(),
                    uid: m.uid(),
                    gid: m.gid(),
                }
            }
            Err(e) => errout(e),
        },
        Op::Readdir { path } => match fs::read_dir(p(path)).errno_result() {
            Ok(rd) => {
                let mut v: Vec<String> = rd
                    .map(|e| {
                        e.map(|e| String::from_utf8_lossy(e.file_name().as_bytes()).into_owned())
                    })
                    .collect::<Result<_, _>>()
                    .unwrap_or_else(|e| vec![format!("readdir error {e}")]);
                v.retain(|n| !n.starts_with(".fuse_hidden"));
                v.sort();
                Outcome::Names(v)
            }
            Err(e) => errout(e),
        },
    }
}

/// Generates operations over a small name space so that collisions (EEXIST, ENOTEMPTY,
/// ENOENT, renames over existing targets) are frequent. Paths that worked are remembered and
/// preferred, so writes and reads mostly hit existing files.
struct Gen {
    rng: StdRng,
    files: Vec<String>,
    dirs: Vec<String>,
}

impl Gen {
    fn name(&mut self) -> &'static str {
        NAMES[self.rng.random_range(0..NAMES.len())]
    }

    fn fresh_path(&mut self) -> String {
        let depth = self.rng.random_range(0..3);
        let mut s = if depth > 0 && !self.dirs.is_empty() && self.rng.random_bool(0.8) {
            self.dirs[self.rng.random_range(0..self.dirs.len())].clone()
        } else {
            let mut s = String::new();
            for _ in 0..depth {
                s.push_str(self.name());
                s.push('/');
            }
            s.trim_end_matches('/').to_string()
        };
        if !s.is_empty() {
            s.push('/');
        }
        s.push_str(self.name());
        s
    }

    fn pick(&mut self, from_files: bool) -> Option<String> {
        let v = if from_files { &self.files } else { &self.dirs };
        (!v.is_empty()).then(|| v[self.rng.random_range(0..v.len())].clone())
    }

    /// Any path: mostly a known file or directory, sometimes a fresh one.
    fn path(&mut self) -> String {
        let r = self.rng.random_range(0..10);
        let p = if r < 5 {
            self.pick(true)
        } else if r < 8 {
            self.pick(false)
        } else {
            None
        };
        p.unwrap_or_else(|| self.fresh_path())
    }

    /// Mostly a known non-directory.
    fn file_path(&mut self) -> String {
        let p = if self.rng.random_bool(0.8) {
            self.pick(true)
        } else {
            None
        };
        p.unwrap_or_else(|| self.path())
    }

    fn offset(&mut self) -> u64 {
        match self.rng.random_range(0..10) {
            0 => self.rng.random_range(0..(64u64 << 20)),
            1 => self.rng.random_range(0..(1u64 << 20)),
            2 => 4096 * self.rng.random_range(0..64u64),
            _ => self.rng.random_range(0..(128u64 << 10)),
        }
    }

    fn mode(&mut self) -> u32 {
        [0o644, 0o600, 0o755, 0o000, 0o4755, 0o1777, 0o2750, 0o444][self.rng.random_range(0..8)]
    }

    fn op(&mut self) -> Op {
        let r = &mut self.rng;
        match r.random_range(0..100) {
            0..=11 => {
                let excl = self.rng.random_bool(0.5);
                let mode = self.mode();
                Op::Create {
                    path: self.fresh_path(),
                    mode,
                    excl,
                }
            }
            12..=29 => {
                let len = match self.rng.random_range(0..4) {
                    0 => 0,
                    1 => self.rng.random_range(1..100),
                    2 => self.rng.random_range(1..8192),
                    _ => self.rng.random_range(1..(200 << 10)),
                };
                let (off, seed) = (self.offset(), self.rng.random());
                let append = self.rng.random_bool(0.1);
                let trunc = self.rng.random_bool(0.05);
                Op::Write {
                    path: self.file_path(),
                    off,
                    len,
                    seed,
                    append,
                    trunc,
                }
            }
            30..=35 => {
                let (off, len) = (self.offset(), self.rng.random_range(0..(256 << 10)));
                Op::Read {
                    path: self.file_path(),
                    off,
                    len,
                }
            }
            36..=42 => {
                let size = if self.rng.random_bool(0.2) {
                    self.offset()
                } else {
                    self.rng.random_range(0..20_000)
                };
                Op::Truncate {
                    path: self.file_path(),
                    size,
                }
            }
            43..=54 => {
                let flags = match self.rng.random_range(0..10) {
                    0 => libc::RENAME_NOREPLACE,
                    1 => libc::RENAME_EXCHANGE,
                    _ => 0,
                };
                let from = self.path();
                let to = if self.rng.random_bool(0.5) {
                    self.path()
                } else {
                    self.fresh_path()
                };
                Op::Rename { from, to, flags }
            }
            55..=60 => {
                let from = self.file_path();
                Op::Link {
                    from,
                    to: self.fresh_path(),
                }
            }
            61..=67 => Op::Unlink {
                path: self.file_path(),
            },
            68..=76 => {
                let mode = [0o755, 0o700, 0o777, 0o1777, 0o2755][self.rng.random_range(0..5)];
                Op::Mkdir {
                    path: self.fresh_path(),
                    mode,
                }
            }
            77..=81 => {
                let p = if self.rng.random_bool(0.7) {
                    self.pick(false)
                } else {
                    None
                };
                Op::Rmdir {
                    path: p.unwrap_or_else(|| self.path()),
                }
            }
            82..=85 => {
                let mode = self.mode();
                Op::Chmod {
                    path: self.path(),
                    mode,
                }
            }
            86..=89 => {
                // Targets stay inside the sequence directory: no '..', no absolute paths.
                let target = if self.rng.random_bool(0.7) {
                    self.fresh_path()
                } else {
                    "x".repeat(self.rng.random_range(1..300))
                };
                Op::Symlink {
                    target,
                    path: self.fresh_path(),
                }
            }
            90..=92 => Op::Readlink {
                path: self.file_path(),
            },
            93..=96 => Op::Stat { path: self.path() },
            _ => {
                let path = if self.rng.random_bool(0.3) {
                    String::new()
                } else {
                    self.path()
                };
                Op::Readdir { path }
            }
        }
    }

    /// Tracks which paths exist after a successful operation (a best effort: a stale entry
    /// only makes an operation fail the same way on both sides).
    fn learn(&mut self, op: &Op, outcome: &Outcome) {
        if matches!(outcome, Outcome::Err(_)) {
            return;
        }
        fn add(v: &mut Vec<String>, s: &str) {
            if !v.iter().any(|x| x == s) {
                v.push(s.to_string());
            }
        }
        fn drop_tree(v: &mut Vec<String>, s: &str) {
            let prefix = format!("{s}/");
            v.retain(|x| x != s && !x.starts_with(&prefix));
        }
        match op {
            Op::Create { path, .. } | Op::Symlink { path, .. } => add(&mut self.files, path),
            Op::Mkdir { path, .. } => add(&mut self.dirs, path),
            Op::Link { to, .. } => add(&mut self.files, to),
            Op::Unlink { path } => drop_tree(&mut self.files, path),
            Op::Rmdir { path } => drop_tree(&mut self.dirs, path),
            Op::Rename { from, to, flags } if *flags != libc::RENAME_EXCHANGE => {
                let was_dir = self.dirs.iter().any(|d| d == from);
                for v in [&mut self.files, &mut self.dirs] {
                    drop_tree(v, to);
                    let prefix = format!("{from}/");
                    for x in v.iter_mut() {
                        if x == from {
                            *x = to.clone();
                        } else if let Some(rest) = x.strip_prefix(&prefix) {
                            *x = format!("{to}/{rest}");
                        }
                    }
                }
                if !was_dir {
                    add(&mut self.files, to);
                }
            }
            _ => {}
        }
        if self.files.len() > 48 {
            self.files.remove(0);
        }
        if self.dirs.len() > 16 {
            self.dirs.remove(0);
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

fn run_pair(a: &Target, b: &Target, seed: u64, total: u64, seq_len: u64) {
    let seqs = total.div_ceil(seq_len);
    let only = env_u64("CAIRN_DIFF_ONLY_SEQ");
    let (an, bn) = (a.name(), b.name());
    say!("differential {an} vs {bn}: seed {seed}, {seqs} sequences of {seq_len} ops");
    let mut stats = std::collections::BTreeMap::<String, u64>::new();
    for s in 0..seqs {
        if only.is_some_and(|o| o != s) {
            continue;
        }
        let seq_seed = seed ^ (s.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seq_seed),
            files: Vec::new(),
            dirs: Vec::new(),
        };
        let dir = format!("seq{s:04}");
        let (ra, rb) = (a.path(&dir), b.path(&dir));
        fs::create_dir(&ra).unwrap();
        fs::create_dir(&rb).unwrap();
        let mut log: Vec<String> = Vec::new();
        let fail = |log: &[String], msg: String| -> ! {
            panic!(
                "differential mismatch ({an} vs {bn}) — replay with CAIRN_DIFF_SEED={seed} CAIRN_DIFF_OPS={total} \
                 CAIRN_DIFF_SEQ_LEN={seq_len} CAIRN_DIFF_ONLY_SEQ={s}\noperations of sequence {s} (in {dir}):\n{}\n{msg}",
                log.join("\n")
            )
        };
        for i in 0..seq_len {
            let op = g.op();
            let oa = apply(&ra, &op);
            let ob = apply(&rb, &op);
            log.push(format!("  #{i:03} {op} -> {oa:?}"));
            if oa != ob {
                fail(
                    &log,
                    format!("op #{i} {op}:\n  {an}: {oa:?}\n  {bn}: {ob:?}"),
                );
            }
            let key = format!(
                "{}:{}",
                format!("{op:?}").split([' ', '{']).next().unwrap_or(""),
                match &oa {
                    Outcome::Err(e) => e.clone(),
                    _ => "ok".into(),
                }
            );
            *stats.entry(key).or_default() += 1;
            g.learn(&op, &oa);
        }
        let ta = tree::snapshot(&ra, tree::Opts::CONTENT, &[]).unwrap();
        let tb = tree::snapshot(&rb, tree::Opts::CONTENT, &[]).unwrap();
        let d = tree::diff(&an, &ta, &bn, &tb);
        if !d.is_empty() {
            fail(
                &log,
                format!("final trees differ after sequence {s}:\n{}", d.join("\n")),
            );
        }
        if s % 5 == 0 {
            say!(
                "sequence {s}: {} ops, {} objects in the final tree, trees identical",
                seq_len,
                ta.len()
            );
        }
    }
    say!("outcome counts: {stats:?}");
    // The generator must exercise both successes and the interesting errors; a generator that
    // only produced ENOENT would compare nothing.
    let count = |k: &str| {
        stats
            .iter()
            .filter(|(n, _)| n.contains(k))
            .map(|(_, c)| *c)
            .sum::<u64>()
    };
    if only.is_none() && total >= 1000 {
        for k in [
            "Write:ok",
            "Rename:ok",
            "Link:ok",
            "Mkdir:ok",
            "EEXIST",
            "ENOENT",
            "ENOTEMPTY",
            "ENOTDIR",
            "EISDIR",
        ] {
            assert!(count(k) > 0, "the generator never produced {k}: {stats:?}");
        }
    }
}

#[test]
fn differential_random_sequences() {
    let seed = env_u64("CAIRN_DIFF_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let total = env_u64("CAIRN_DIFF_OPS").unwrap_or(4000);
    let seq_len = env_u64("CAIRN_DIFF_SEQ_LEN").unwrap_or(200).max(1);
    say!("CAIRN_DIFF_SEED={seed} CAIRN_DIFF_OPS={total}");
    if cairn_fstests::host_only() {
        let (a, b) = (Target::host_dir(), Target::host_tmpfs("512M", None));
        run_pair(&a, &b, seed, total, seq_len);
    } else {
        for t in Target::all() {
            let host = Target::host_dir();
            run_pair(&t, &host, seed, total, seq_len);
        }
    }
}
