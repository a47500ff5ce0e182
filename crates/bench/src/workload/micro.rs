//! The microbenchmarks of Seltzer et al. (000 §4.2, 002 §4.2): for each file size, create,
//! read, overwrite and delete either `data_bytes` of data or `min_files` files, whichever is
//! more files, 50 files per directory, always in the same order, with a cold cache before every
//! phase. Files are written with one write(2) each and never fsynced: the paper measures each
//! file system's own write policy.
//!
//! Every phase reports unit "files" (ops = files) with the bytes moved in `extra`; the report
//! turns files/s into MB/s with the size (`param`). Each 4 KiB block of a file starts with the
//! file's number, the block's number and a generation, so the read phase catches a misplaced
//! block and the overwrite is checked to have replaced the data.
//! A 0-byte file's overwrite is an open and close: there is no data to rewrite.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{PhaseResult, Stage, fmt_bytes_human, measure_cold, scaled_count};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
/// The granule each tag marks; small enough that every block of a 4 MiB file is checked.
const TAG_BLOCK: usize = 4096;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// File sizes to sweep, in bytes (the swept `param` of every phase).
    pub sizes: Vec<u64>,
    /// Data per size: the file count is `data_bytes / size` ...
    pub data_bytes: u64,
    /// ... unless that is fewer than this many files.
    pub min_files: u64,
    /// Files per directory (the paper's 50: short lookups).
    pub per_dir: u64,
}

impl Config {
    pub fn paper() -> Config {
        Config {
            sizes: [0, 1, 2, 4, 8, 16, 32, 64, 96, 104, 128, 256, 512]
                .iter()
                .map(|k| k * KIB)
                .chain([MIB, 2 * MIB, 4 * MIB])
                .collect(),
            data_bytes: 128 * MIB,
            min_files: 512,
            per_dir: 50,
        }
    }

    /// Data and the file floor shrink with `scale` (never below 16 files); the sizes stay, since
    /// they are the curve's x axis.
    pub fn scaled(scale: f64) -> Config {
        let p = Config::paper();
        Config {
            data_bytes: scaled_count(p.data_bytes, scale, 0),
            min_files: scaled_count(p.min_files, scale, 16),
            ..p
        }
    }

    pub fn describe(&self) -> String {
        let total: u64 = self.sizes.iter().map(|&s| self.files_for(s)).sum();
        format!(
            "for each of {} file sizes ({}): create, read, overwrite, delete {} or {} files, whichever is more files ({total} files in all), {} per directory, cold cache before each phase; rate in files/s (MB/s = files/s × size)",
            self.sizes.len(),
            self.sizes
                .iter()
                .map(|&s| fmt_bytes_human(s))
                .collect::<Vec<_>>()
                .join(", "),
            fmt_bytes_human(self.data_bytes),
            self.min_files,
            self.per_dir
        )
    }

    /// Files used for `size`: enough for `data_bytes`, at least `min_files`. 0-byte files
    /// never add up to `data_bytes`, so they get the floor, `min_files` (their create and
    /// delete rates are the 0-length create/delete benchmark's, measured over 50,000 files).
    pub fn files_for(&self, size: u64) -> u64 {
        if size == 0 {
            return self.min_files;
        }
        self.data_bytes.div_ceil(size).max(self.min_files)
    }

    pub fn dirs_for(&self, size: u64) -> u64 {
        self.files_for(size).div_ceil(self.per_dir)
    }

    fn check(&self) -> Result<()> {
        ensure!(!self.sizes.is_empty(), "micro: no file sizes to run");
        ensure!(self.per_dir > 0, "micro: per_dir must be positive");
        ensure!(self.min_files > 0, "micro: min_files must be positive");
        for &s in &self.sizes {
            ensure!(
                s <= 1 << 30,
                "micro: file size {s} too large (one write per file)"
            );
        }
        Ok(())
    }
}

pub fn run(stage: &mut dyn Stage, cfg: &Config) -> Result<Vec<PhaseResult>> {
    cfg.check()?;
    let mut out = Vec::with_capacity(cfg.sizes.len() * 4);
    for &size in &cfg.sizes {
        let set = FileSet::new(&stage.dir(), cfg, size);
        let extra = json!({
            "bytes": set.files * size,
            "files": set.files,
            "dirs": cfg.dirs_for(size),
        });
        let phases: [(&str, PhaseFn); 4] = [
            ("create", FileSet::create),
            ("read", FileSet::read),
            ("overwrite", FileSet::overwrite),
            ("delete", FileSet::delete),
        ];
        for (name, f) in phases {
            // Cold before every phase, which also separates one size from the next.
            let p = Some(size as f64);
            out.extend(measure_cold(
                stage,
                name,
                p,
                set.files as f64,
                "files",
                || {
                    f(&set)?;
                    Ok(extra.clone())
                },
            )?);
            if name == "overwrite" {
                set.spot_check(1)?;
            }
        }
    }
    Ok(out)
}

type PhaseFn = fn(&FileSet) -> Result<()>;

/// The files of one size: `<dir>/s<size>/d<j>/f<i>`, file i in directory i / per_dir.
struct FileSet {
    top: PathBuf,
    files: u64,
    per_dir: u64,
    size: usize,
    template: Vec<u8>,
}

impl FileSet {
    fn new(dir: &Path, cfg: &Config, size: u64) -> FileSet {
        FileSet {
            top: dir.join(format!("s{size:08}")),
            files: cfg.files_for(size),
            per_dir: cfg.per_dir,
            size: size as usize,
            template: (0..size).map(|k| (k * 31 + 7) as u8).collect(),
        }
    }

    fn subdir(&self, i: u64) -> PathBuf {
        self.top.join(format!("d{:05}", i / self.per_dir))
    }

    fn path(&self, i: u64) -> PathBuf {
        self.subdir(i).join(format!("f{i:07}"))
    }

    /// Contents of file `i` at `generation` (0 = created, 1 = overwritten).
    fn content(&self, buf: &mut Vec<u8>, i: u64, generation: u64) {
        buf.clear();
        buf.extend_from_slice(&self.template);
        for (b, blk) in buf.chunks_mut(TAG_BLOCK).zip(0u64..) {
            let mut tag = [0u8; 16];
            tag[..8].copy_from_slice(&i.to_le_bytes());
            tag[8..].copy_from_slice(&(blk | generation << 48).to_le_bytes());
            let n = b.len().min(16);
            b[..n].copy_from_slice(&tag[..n]);
        }
    }

    fn create(&self) -> Result<()> {
        fs::create_dir(&self.top).with_context(|| format!("mkdir {}", self.top.display()))?;
        let mut buf = Vec::with_capacity(self.size);
        for i in 0..self.files {
            if i % self.per_dir == 0 {
                let d = self.subdir(i);
                fs::create_dir(&d).with_context(|| format!("mkdir {}", d.display()))?;
            }
            let p = self.path(i);
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .with_context(|| format!("create {}", p.display()))?;
            self.content(&mut buf, i, 0);
            f.write_all(&buf)
                .with_context(|| format!("write {}", p.display()))?;
        }
        Ok(())
    }

    fn read_one(
        &self,
        i: u64,
        generation: u64,
        got: &mut Vec<u8>,
        want: &mut Vec<u8>,
    ) -> Result<()> {
        let p = self.path(i);
        got.clear();
        File::open(&p)
            .and_then(|mut f| f.read_to_end(got))
            .with_context(|| format!("read {}", p.display()))?;
        self.content(want, i, generation);
        ensure!(
            got == want,
            "{} read back wrong: {} bytes (wrote {}), {}",
            p.display(),
            got.len(),
            want.len(),
            if got.len() == want.len() {
                "contents differ"
            } else {
                "length differs"
            }
        );
        Ok(())
    }

    fn read(&self) -> Result<()> {
        let (mut got, mut want) = (Vec::with_capacity(self.size + 1), Vec::new());
        for i in 0..self.files {
            self.read_one(i, 0, &mut got, &mut want)?;
        }
        Ok(())
    }

    /// Rewrites each file's data in place: same size, no truncation, so no block is freed or
    /// allocated and only the data (and the inode's times) change.
    fn overwrite(&self) -> Result<()> {
        let mut buf = Vec::with_capacity(self.size);
        for i in 0..self.files {
            let p = self.path(i);
            let mut f = OpenOptions::new()
                .write(true)
                .open(&p)
                .with_context(|| format!("open {}", p.display()))?;
            self.content(&mut buf, i, 1);
            f.write_all(&buf)
                .with_context(|| format!("write {}", p.display()))?;
        }
        Ok(())
    }

    /// First, middle and last file hold `generation` (untimed).
    fn spot_check(&self, generation: u64) -> Result<()> {
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for i in [0, self.files / 2, self.files - 1] {
            self.read_one(i, generation, &mut got, &mut want)?;
        }
        Ok(())
    }

    fn delete(&self) -> Result<()> {
        for i in 0..self.files {
            let p = self.path(i);
            fs::remove_file(&p).with_context(|| format!("unlink {}", p.display()))?;
            if (i + 1) % self.per_dir == 0 || i + 1 == self.files {
                let d = self.subdir(i);
                // rmdir fails on a directory that still holds anything: the count check.
                fs::remove_dir(&d).with_context(|| format!("rmdir {}", d.display()))?;
            }
        }
        fs::remove_dir(&self.top).with_context(|| format!("rmdir {}", self.top.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PlainDir;

    #[test]
    fn paper_counts_follow_the_128_mib_or_512_files_rule() {
        let p = Config::paper();
        assert_eq!(p, Config::scaled(1.0));
        assert_eq!(p.sizes.len(), 16);
        assert_eq!(p.sizes[9], 104 * KIB);
        assert_eq!(*p.sizes.last().unwrap(), 4 * MIB);
        assert_eq!(p.files_for(0), 512);
        assert_eq!(p.files_for(KIB), 131_072);
        assert_eq!(p.files_for(4 * KIB), 32_768);
        assert_eq!(p.files_for(96 * KIB), 1366); // ceil(128 MiB / 96 KiB)
        assert_eq!(p.files_for(256 * KIB), 512);
        assert_eq!(p.files_for(512 * KIB), 512);
        assert_eq!(p.files_for(4 * MIB), 512);
        assert!(p.describe().contains("delete 128 MiB or 512 files"));
        // The quick suite's 1/100: a size that is no whole number of KiB, formatted.
        let q = Config::scaled(0.01).describe();
        assert!(q.contains("delete 1.28 MiB or 16 files"), "{q}");
        assert_eq!(p.dirs_for(KIB), 2622);
        assert_eq!(p.dirs_for(4 * MIB), 11);
        let bytes: u64 = p.sizes.iter().map(|&s| s * p.files_for(s)).sum();
        // Eleven sizes of ~128 MiB each, then 512 files of 512 KiB .. 4 MiB.
        assert_eq!(bytes.div_ceil(MIB), 11 * 128 + 256 + 512 + 1024 + 2048 + 1);
        assert!(p.describe().contains("104 KiB"));
    }

    #[test]
    fn scaled_shrinks_data_and_keeps_a_floor() {
        let s = Config::scaled(0.1);
        assert_eq!(s.sizes, Config::paper().sizes);
        assert_eq!(s.min_files, 51);
        assert_eq!(s.files_for(KIB), 13_108);
        let t = Config::scaled(0.0001);
        assert_eq!(t.min_files, 16);
        assert_eq!(t.files_for(4 * MIB), 16);
        assert_eq!(t.files_for(KIB), 16);
        assert_eq!(t.files_for(0), 16);
    }

    #[test]
    fn tags_distinguish_files_blocks_and_generations() {
        let cfg = Config::paper();
        let set = FileSet::new(Path::new("/x"), &cfg, 3 * 4096 + 5);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        set.content(&mut a, 1, 0);
        assert_eq!(a.len(), 3 * 4096 + 5);
        set.content(&mut b, 2, 0);
        assert_ne!(a, b);
        set.content(&mut b, 1, 1);
        assert_ne!(a, b);
        assert_ne!(a[4096..4112], a[8192..8208], "blocks differ");
        let tiny = FileSet::new(Path::new("/x"), &cfg, 5);
        tiny.content(&mut a, 9, 0);
        assert_eq!(a, [9, 0, 0, 0, 0]);
        assert_eq!(
            set.path(123),
            Path::new("/x/s00012293/d00002/f0000123"),
            "50 per directory"
        );
    }

    #[test]
    fn runs_end_to_end_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            sizes: vec![0, 1000, 8192, 70_000],
            data_bytes: 200_000,
            min_files: 7,
            per_dir: 5,
        };
        let r = run(&mut PlainDir::new(d.path()), &cfg).unwrap();
        assert_eq!(r.len(), 16);
        let phases: Vec<_> = r[..4].iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(phases, ["create", "read", "overwrite", "delete"]);
        for p in &r {
            let size = p.param.unwrap() as u64;
            let files = cfg.files_for(size);
            assert_eq!(p.unit, "files");
            assert_eq!(p.ops, files as f64);
            assert_eq!(p.extra["files"], files);
            assert_eq!(p.extra["bytes"], files * size);
            assert!(p.rate > 0.0);
        }
        assert_eq!(r[0].ops, cfg.min_files as f64); // size 0 uses the floor
        assert_eq!(r[12].ops, 7.0);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn read_catches_wrong_data_and_delete_a_stray_file() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            sizes: vec![5000],
            data_bytes: 0,
            min_files: 12,
            per_dir: 5,
        };
        let set = FileSet::new(d.path(), &cfg, 5000);
        set.create().unwrap();
        set.read().unwrap();
        assert!(set.spot_check(1).is_err(), "not overwritten yet");
        set.overwrite().unwrap();
        set.spot_check(1).unwrap();
        assert!(set.read().is_err(), "generation 1 is not generation 0");
        let mut buf = Vec::new();
        set.content(&mut buf, 3, 1);
        fs::write(set.path(4), &buf).unwrap();
        assert!(set.spot_check(1).is_ok(), "file 4 is not sampled");
        fs::write(set.path(11), &buf).unwrap();
        assert!(set.spot_check(1).is_err());
        fs::write(set.subdir(0).join("stray"), b"x").unwrap();
        assert!(set.delete().is_err());
    }

    #[test]
    fn empty_sweep_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let mut cfg = Config::scaled(0.001);
        cfg.sizes.clear();
        assert!(run(&mut PlainDir::new(d.path()), &cfg).is_err());
    }
}
