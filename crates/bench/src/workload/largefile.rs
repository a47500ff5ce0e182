//! Large-file benchmark of the Sprite LFS paper (004 §5.1, Fig. 9): a 100 MB file written
//! sequentially, read sequentially, written randomly, read randomly, and read sequentially
//! again. The last phase is the one where layouts differ: a log-structured file system has
//! scattered the randomly written blocks (temporal locality), an update-in-place one has not
//! (logical locality).
//!
//! Every `io_size` block carries its block number and a write generation (0 after the
//! sequential write, 1 after the random one), so each read phase checks that it got the right
//! block from the right write, and the final sequential read proves the random write reached
//! every block.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use super::rng::SplitMix64;
use super::{PhaseResult, Stage, measure, measure_cold, read_full};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// File size; a multiple of `io_size`.
    pub bytes: u64,
    /// Request size of the random phases, and the unit whose tag the reads check.
    pub io_size: u64,
    /// Request size of the sequential phases; a multiple of `io_size`.
    pub seq_chunk: u64,
    /// Seeds the random write and random read orders (two different permutations: reading in
    /// the order of writing would flatter a log-structured layout, 004 §5.1).
    pub seed: u64,
}

const MIB: u64 = 1 << 20;

impl Config {
    pub fn paper() -> Config {
        Config {
            bytes: 100 * MIB,
            io_size: 4096,
            seq_chunk: MIB,
            seed: 0x5eed_0004,
        }
    }

    /// The file shrinks with `scale`, never below 1 MiB (256 random requests).
    pub fn scaled(scale: f64) -> Config {
        let p = Config::paper();
        let blocks = ((p.bytes / p.io_size) as f64 * scale).round() as u64;
        Config {
            bytes: blocks.max(MIB / p.io_size) * p.io_size,
            ..p
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} file: sequential write ({} KiB requests, then fsync), sequential read, random write ({} KiB, every block once, then fsync), random read, sequential re-read; cold cache before each read; rate in MiB/s per phase",
            super::fmt_bytes_human(self.bytes),
            self.seq_chunk >> 10,
            self.io_size >> 10
        )
    }

    fn blocks(&self) -> u64 {
        self.bytes / self.io_size
    }

    fn check(&self) -> Result<()> {
        ensure!(
            self.io_size >= 16 && self.io_size <= 1 << 30,
            "largefile: io_size {} must be between 16 B and 1 GiB (each block carries a 16-byte tag)",
            self.io_size
        );
        ensure!(
            self.bytes > 0 && self.bytes.is_multiple_of(self.io_size),
            "largefile: bytes {} must be a positive multiple of io_size {}",
            self.bytes,
            self.io_size
        );
        ensure!(
            self.seq_chunk > 0
                && self.seq_chunk.is_multiple_of(self.io_size)
                && self.seq_chunk <= 1 << 30,
            "largefile: seq_chunk {} must be a multiple of io_size {} (at most 1 GiB)",
            self.seq_chunk,
            self.io_size
        );
        Ok(())
    }
}

pub fn run(stage: &mut dyn Stage, cfg: &Config) -> Result<Vec<PhaseResult>> {
    cfg.check()?;
    let path = stage.dir().join("large.dat");
    let mib = cfg.bytes as f64 / MIB as f64;
    let mut rng = SplitMix64::new(cfg.seed);
    let write_order = permutation(cfg.blocks(), &mut rng);
    let read_order = permutation(cfg.blocks(), &mut rng);
    let mut out = Vec::with_capacity(5);
    out.push(measure(stage, "seq-write", mib, "MiB", || {
        seq_write(&path, cfg)
    })?);
    out.extend(measure_cold(stage, "seq-read", None, mib, "MiB", || {
        seq_read(&path, cfg, 0)
    })?);
    out.push(measure(stage, "rand-write", mib, "MiB", || {
        rand_write(&path, cfg, &write_order)
    })?);
    out.extend(measure_cold(stage, "rand-read", None, mib, "MiB", || {
        rand_read(&path, cfg, &read_order)
    })?);
    out.extend(measure_cold(stage, "seq-reread", None, mib, "MiB", || {
        seq_read(&path, cfg, 1)
    })?);
    std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
    Ok(out)
}

/// Writes block `blk`'s tag into `buf` (one `io_size` block): its number and generation, then
/// a pattern that depends on both so a stale or misplaced block differs past the tag too.
fn fill_block(buf: &mut [u8], blk: u64, generation: u64) {
    buf[..8].copy_from_slice(&blk.to_le_bytes());
    buf[8..16].copy_from_slice(&generation.to_le_bytes());
    let seed = (blk.wrapping_mul(0x9e37_79b9) ^ generation.wrapping_mul(0x85eb_ca6b)) as u8;
    for (k, b) in buf[16..].iter_mut().enumerate().step_by(512) {
        *b = seed.wrapping_add(k as u8);
    }
}

fn check_block(
    buf: &[u8],
    blk: u64,
    generation: u64,
    scratch: &mut [u8],
    path: &Path,
) -> Result<()> {
    fill_block(scratch, blk, generation);
    if buf != scratch {
        let got_blk = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
        let got_gen = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
        anyhow::bail!(
            "{}: block {blk} (generation {generation}) read back wrong: its tag says block {got_blk}, generation {got_gen}",
            path.display()
        );
    }
    Ok(())
}

fn seq_write(path: &Path, cfg: &Config) -> Result<serde_json::Value> {
    let io = cfg.io_size as usize;
    let mut buf = vec![0u8; cfg.seq_chunk as usize];
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let mut blk = 0;
    while blk < cfg.blocks() {
        let n = (cfg.seq_chunk / cfg.io_size).min(cfg.blocks() - blk);
        for (k, b) in buf.chunks_mut(io).take(n as usize).enumerate() {
            fill_block(b, blk + k as u64, 0);
        }
        f.write_all(&buf[..n as usize * io])
            .with_context(|| format!("write {}", path.display()))?;
        blk += n;
    }
    // A write is done when it is on the device, in every target alike.
    f.sync_all()
        .with_context(|| format!("fsync {}", path.display()))?;
    Ok(serde_json::Value::Null)
}

fn seq_read(path: &Path, cfg: &Config, generation: u64) -> Result<serde_json::Value> {
    let io = cfg.io_size as usize;
    let mut f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut buf = vec![0u8; cfg.seq_chunk as usize];
    let mut scratch = vec![0u8; io];
    let mut blk = 0;
    loop {
        let got =
            read_full(&mut f, &mut buf).with_context(|| format!("read {}", path.display()))?;
        if got == 0 {
            break;
        }
        ensure!(
            got % io == 0,
            "{}: file ends inside block {} ({} stray bytes)",
            path.display(),
            blk + (got / io) as u64,
            got % io
        );
        for b in buf[..got].chunks(io) {
            ensure!(
                blk < cfg.blocks(),
                "{}: longer than the {} bytes written",
                path.display(),
                cfg.bytes
            );
            check_block(b, blk, generation, &mut scratch, path)?;
            blk += 1;
        }
    }
    ensure!(
        blk == cfg.blocks(),
        "{}: read {} bytes, wrote {}",
        path.display(),
        blk * cfg.io_size,
        cfg.bytes
    );
    Ok(serde_json::Value::Null)
}

fn rand_write(path: &Path, cfg: &Config, order: &[u64]) -> Result<serde_json::Value> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    let mut buf = vec![0u8; cfg.io_size as usize];
    for &blk in order {
        fill_block(&mut buf, blk, 1);
        f.write_all_at(&buf, blk * cfg.io_size)
            .with_context(|| format!("write block {blk} of {}", path.display()))?;
    }
    f.sync_all()
        .with_context(|| format!("fsync {}", path.display()))?;
    Ok(serde_json::Value::Null)
}

fn rand_read(path: &Path, cfg: &Config, order: &[u64]) -> Result<serde_json::Value> {
    let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut buf = vec![0u8; cfg.io_size as usize];
    let mut scratch = vec![0u8; cfg.io_size as usize];
    for &blk in order {
        f.read_exact_at(&mut buf, blk * cfg.io_size)
            .with_context(|| format!("read block {blk} of {}", path.display()))?;
        check_block(&buf, blk, 1, &mut scratch, path)?;
    }
    Ok(serde_json::Value::Null)
}

/// All of `0..n` in a seeded random order (Fisher–Yates).
pub(crate) fn permutation(n: u64, rng: &mut SplitMix64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PlainDir;

    #[test]
    fn paper_and_scaled_sizes() {
        let p = Config::paper();
        assert_eq!(p, Config::scaled(1.0));
        assert_eq!(p.bytes, 100 << 20);
        assert_eq!(p.blocks(), 25_600);
        assert_eq!(Config::scaled(0.1).bytes, 10 << 20);
        assert_eq!(Config::scaled(0.001).bytes, 1 << 20);
        assert_eq!(Config::scaled(0.0).bytes, 1 << 20);
        for s in [1.0, 0.37, 0.01, 0.001] {
            Config::scaled(s).check().unwrap();
        }
        assert!(p.describe().contains("100 MiB"));
    }

    #[test]
    fn permutations_cover_every_block_once_and_are_seeded() {
        let mut a = SplitMix64::new(7);
        let w = permutation(1000, &mut a);
        let r = permutation(1000, &mut a);
        assert_ne!(w, r, "read order must differ from write order");
        let mut sorted = w.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(w, sorted, "not shuffled");
        assert_eq!(w, permutation(1000, &mut SplitMix64::new(7)));
    }

    #[test]
    fn normal_has_the_right_moments() {
        let mut r = SplitMix64::new(1);
        let n = 100_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "variance {var}");
    }

    #[test]
    fn bad_configs_are_errors() {
        let mut c = Config::scaled(0.01);
        c.bytes += 1;
        assert!(c.check().is_err());
        let mut c = Config::scaled(0.01);
        c.seq_chunk = 6000;
        assert!(c.check().is_err());
        let mut c = Config::scaled(0.01);
        c.io_size = 8;
        assert!(c.check().is_err());
        let d = tempfile::tempdir().unwrap();
        assert!(run(&mut PlainDir::new(d.path()), &c).is_err());
    }

    #[test]
    fn runs_end_to_end_and_checks_generations() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            bytes: 64 * 4096,
            io_size: 4096,
            seq_chunk: 5 * 4096,
            seed: 3,
        };
        let r = run(&mut PlainDir::new(d.path()), &cfg).unwrap();
        let names: Vec<_> = r.iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(
            names,
            [
                "seq-write",
                "seq-read",
                "rand-write",
                "rand-read",
                "seq-reread"
            ]
        );
        assert!(
            r.iter()
                .all(|p| p.unit == "MiB" && p.ops == 0.25 && p.rate > 0.0)
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);

        // The generation check is what proves the random write reached every block.
        let path = d.path().join("large.dat");
        seq_write(&path, &cfg).unwrap();
        seq_read(&path, &cfg, 0).unwrap();
        assert!(seq_read(&path, &cfg, 1).is_err());
        let order = permutation(cfg.blocks(), &mut SplitMix64::new(1));
        rand_write(&path, &cfg, &order[..63]).unwrap();
        assert!(seq_read(&path, &cfg, 1).is_err(), "one block missed");
        rand_write(&path, &cfg, &order).unwrap();
        seq_read(&path, &cfg, 1).unwrap();
        rand_read(&path, &cfg, &order).unwrap();
        // A block written in the wrong place is caught by both readers.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        let mut b = vec![0u8; 4096];
        fill_block(&mut b, 5, 1);
        f.write_all_at(&b, 6 * 4096).unwrap();
        assert!(seq_read(&path, &cfg, 1).is_err());
        assert!(rand_read(&path, &cfg, &order).is_err());
        f.set_len(63 * 4096 + 10).unwrap();
        assert!(seq_read(&path, &cfg, 1).is_err());
    }
}
