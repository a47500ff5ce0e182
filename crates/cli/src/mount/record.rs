//! `-o record=PATH`: a crash-harness recording of the mount (see `cairn_crash::record`).
//!
//! Before the file system is mounted, the image is copied (sparsely) to `PATH.base`; then
//! every block write (with its contents) and flush of the device, and a marker for every
//! operation the kernel sends (its kind, path and the moment it returned), go to `PATH` as
//! JSON lines. `cairn crash run --recording PATH` checks every crash state of the run.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use cairn_crash::record::{self, Base, FORMAT, Header, Recorder};
use cairn_ffs::format::{Superblock, superblock};
use cairn_ffs::{Ffs, MountOptions};

/// Mounts `image` with its device recorded to `out`; returns the file system and the
/// recorder (call `finish` after the final flush).
pub fn mount_recorded(
    image: &Path,
    plan: &super::Plan,
    out: &Path,
) -> Result<(Arc<Ffs>, Arc<Recorder>)> {
    if !std::ptr::eq(plan.fs, cairn_fstypes::ffs()) {
        anyhow::bail!("record= is supported on ffs images only");
    }
    // The recording holds one device. A journal whose log is on a device of its own writes
    // half of every crash state there: checked without it, the states would be wrong, so
    // refuse rather than record them (`cairn crash run --modes journal-2sync` checks that
    // configuration on two recorded memory devices).
    if plan
        .fs_options
        .iter()
        .any(|(k, v)| k == "log" && v.as_deref().is_some_and(|v| v.starts_with("dev:")))
    {
        anyhow::bail!(
            "record= records the image's device only, not a log=dev:PATH log device (see `cairn crash run --modes journal-2sync`)"
        );
    }
    let mut opts = MountOptions {
        read_only: plan.read_only,
        ..Default::default()
    };
    for (k, v) in &plan.fs_options {
        opts.set(k, v.as_deref()).map_err(|e| anyhow!(e))?;
    }
    let opts = &opts;
    let head = cairn_blockdev::read_bytes_at(image, 0, superblock::SB_BYTES)
        .with_context(|| format!("cannot read the superblock of {}", image.display()))?;
    let sb = Superblock::decode(&head).map_err(|e| anyhow!("{}: {}", image.display(), e.0))?;
    let mut base = out.as_os_str().to_owned();
    base.push(".base");
    let base = PathBuf::from(base);
    record::snapshot_image(image, &base).map_err(|e| anyhow!("recording base image: {e}"))?;
    let dev = cairn_blockdev::open_path(image, sb.block_size, opts.read_only)
        .with_context(|| format!("cannot open {}", image.display()))?;
    let header = Header {
        recording: FORMAT,
        block_size: dev.block_size(),
        num_blocks: dev.num_blocks(),
        // Relative to the recording, so the pair can be moved together.
        base: Base::File(PathBuf::from(base.file_name().unwrap_or_default())),
        mode: opts.mode.clone(),
        workload: format!("mount:{}", image.display()),
        start: 0,
        tagged: false,
        log_blocks: 0,
        repro: None,
    };
    let rec = Arc::new(Recorder::to_file(out, &header).map_err(|e| anyhow!("{e}"))?);
    dev.set_trace(Some(rec.clone()));
    let ffs = Ffs::mount_device(dev, opts)
        .map_err(|e| anyhow!("cannot mount {}: {e}", image.display()))?;
    Ok((ffs, rec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_crash::record::Event;
    use cairn_ffs::MkfsOptions;
    use cairn_vfs::{Ctx, FileSystem};

    /// A fresh 16 MiB FFS image in `dir`.
    fn image(dir: &Path) -> PathBuf {
        let img = dir.join("disk.img");
        cairn_ffs::mkfs(
            &img,
            &MkfsOptions {
                size: Some(16 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        img
    }

    #[test]
    fn a_log_on_its_own_device_is_refused_not_half_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path());
        let ffs_type = cairn_fstypes::by_name("ffs").unwrap();
        let opts = ["mode=journal,log=dev:/tmp/nonexistent-log".to_string()];
        let plan = crate::mount::parse_options(&opts, false, ffs_type).unwrap();
        let err = mount_recorded(&img, &plan, &dir.path().join("rec.jsonl"))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("log=dev"), "{err}");
        assert!(!dir.path().join("rec.jsonl.base").exists());
    }

    #[test]
    fn recording_holds_writes_flushes_and_a_loadable_header() {
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path());
        let out = dir.path().join("rec.jsonl");
        let ffs_type = cairn_fstypes::by_name("ffs").unwrap();
        let plan = crate::mount::parse_options(&[], false, ffs_type).unwrap();
        let (fs, rec) = mount_recorded(&img, &plan, &out).unwrap();
        fs.mkdir(&Ctx::root(), fs.root_ino(), "d".as_ref(), 0o755, 0)
            .unwrap();
        fs.unmount().unwrap();
        rec.finish().unwrap();
        let r = record::load(&out).unwrap();
        assert_eq!(r.header.mode, "sync");
        assert_eq!(r.header.base, Base::File(dir.path().join("rec.jsonl.base")));
        assert!(r.events.iter().any(|e| matches!(e, Event::Write { .. })));
        assert!(r.events.iter().any(|e| matches!(e, Event::Flush)));
        assert_eq!(
            std::fs::metadata(dir.path().join("rec.jsonl.base"))
                .unwrap()
                .len(),
            16 << 20
        );
    }
}
