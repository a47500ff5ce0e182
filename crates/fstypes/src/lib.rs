//! cairn-fstypes: the one registry of cairn's on-disk formats and their metadata-update
//! modes.
//!
//! Every tool that has to know "which formats and modes exist" asks here and nowhere else:
//! `cairn mkfs --format`, `cairn mount` (which format an image holds, which mode options it
//! takes), `cairn fsck` and `cairn inspect`, `cairn modes` (and `--json`, which the
//! benchmark reads without linking cairn's crates), the crash harness (every mode and what
//! it promises) and the real-mount test suites (every mode gets every suite). A second
//! format, or a new mode of an existing one, is one entry in its own crate plus one line
//! in [`types`]; none of those tools change.
//!
//! Layering: this crate sits above the formats and the checker (it has to construct mounts
//! and run checks) and below the command and the tools. The vocabulary of guarantees is in
//! `cairn_vfs::modes`, so a format can declare its modes without depending on this crate.

use std::path::Path;
use std::sync::Arc;

use cairn_fsck::{CheckOptions, FsckError, Report};
use cairn_vfs::modes::{AfterCrash, ModeSpec};
use cairn_vfs::{Errno, FileSystem, FsError};

/// Mount options a format understands, as `(key, value)` pairs from `-o` (the FUSE
/// adapter's own options already taken out). `mode=` is among them.
pub type Options = [(String, Option<String>)];

/// Mounts an image with the format's options, read-only or not.
pub type MountFn = fn(&Path, &Options, bool) -> Result<Arc<dyn FileSystem>, FsError>;

/// An on-disk format.
pub struct FsType {
    /// `cairn mkfs --format NAME`.
    pub name: &'static str,
    pub description: &'static str,
    /// How many leading bytes [`FsType::probe`] needs.
    pub probe_bytes: usize,
    /// Whether an image's leading bytes hold this format (its magic number).
    pub probe: fn(&[u8]) -> bool,
    /// The metadata-update modes, the default first.
    pub modes: fn() -> Vec<ModeSpec>,
    /// Checks one mount option on its own: a key the format (or one of its modes) parses,
    /// with a value it accepts where that does not depend on the other options. The command
    /// uses it to drop bad options one by one under `mount -s`.
    pub check_option: fn(&str, Option<&str>) -> Result<(), String>,
    /// Checks the mount options as a whole (unknown keys, bad values, a mode's own options
    /// against the mode chosen, in any order) without mounting: the command does this
    /// before it daemonizes, so a typo is reported at once.
    pub check_options: fn(&Options, read_only: bool) -> Result<(), String>,
    /// Creates a file system on an image file or device.
    pub mkfs: fn(&Path, &MkfsArgs) -> Result<(), FsError>,
    /// Mounts the image (taking its lock: see `cairn_blockdev::lock`).
    pub mount: MountFn,
    /// Checks (and with `repair`, repairs) the image, as `cairn fsck`.
    pub check: fn(&Path, CheckOptions) -> Result<Report, FsckError>,
}

/// What `cairn mkfs` was asked, for any format.
#[derive(Clone, Debug, Default)]
pub struct MkfsArgs {
    pub size: Option<u64>,
    pub block_size: Option<u32>,
    pub inodes: Option<u64>,
    pub label: String,
    pub force: bool,
    pub sparse: bool,
}

/// Every format this build knows, the default (`mkfs` without `--format`) first.
pub fn types() -> &'static [&'static FsType] {
    static TYPES: [&FsType; 1] = [&FFS];
    &TYPES
}

/// The format called `name`.
pub fn by_name(name: &str) -> Option<&'static FsType> {
    types().iter().copied().find(|t| t.name == name)
}

/// The format whose magic starts `head`.
pub fn probe(head: &[u8]) -> Option<&'static FsType> {
    types().iter().copied().find(|t| (t.probe)(head))
}

/// The format of the image at `path`, or a one-line refusal: "not a cairn file system".
pub fn probe_path(path: &Path) -> Result<&'static FsType, FsError> {
    let want = types().iter().map(|t| t.probe_bytes).max().unwrap_or(512);
    let head = read_head(path, want)?;
    probe(&head).ok_or_else(|| {
        FsError::Refused(
            Errno::EINVAL,
            format!(
                "{}: not a cairn file system (no {} superblock at its start)",
                path.display(),
                types()
                    .iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        )
    })
}

/// Up to `len` leading bytes of a file or device (fewer if it is shorter).
fn read_head(path: &Path, len: usize) -> Result<Vec<u8>, FsError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| {
        FsError::Refused(
            Errno(e.raw_os_error().unwrap_or(Errno::EIO.0)),
            format!("cannot open {}: {e}", path.display()),
        )
    })?;
    let mut head = Vec::with_capacity(len);
    f.take(len as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// One mode of one format, as the tools iterate them.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    pub fs: &'static FsType,
    pub spec: ModeSpec,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        self.spec.name
    }

    /// The benchmark's and the crash harness's name for a mount in this mode.
    pub fn target(&self) -> String {
        format!("cairn-{}", self.spec.name)
    }

    /// Whether an image left by a crash must be repaired by fsck before it is mounted.
    pub fn needs_fsck_after_crash(&self) -> bool {
        self.spec.guarantees.after_crash == AfterCrash::Fsck
    }

    /// `cairn modes --json`: one object per mode.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": self.fs.name,
            "mode": self.spec.name,
            "target": self.target(),
            "description": self.spec.description,
            "after_crash": self.spec.guarantees.after_crash,
            "mount_options": format!("mode={}", self.spec.name),
            "options": self.spec.options,
            "guarantees": self.spec.guarantees,
        })
    }
}

impl std::fmt::Debug for FsType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsType").field("name", &self.name).finish()
    }
}

/// Every mode of every format, in listing order. Mode names are unique across formats, so
/// `-o mode=NAME` alone names one.
pub fn modes() -> Vec<Mode> {
    types()
        .iter()
        .flat_map(|&fs| (fs.modes)().into_iter().map(move |spec| Mode { fs, spec }))
        .collect()
}

/// The mode called `name`, with its format.
pub fn mode(name: &str) -> Option<Mode> {
    modes().into_iter().find(|m| m.spec.name == name)
}

// ---- the FFS-style format -------------------------------------------------------------

static FFS: FsType = FsType {
    name: "ffs",
    description: "the FFS-style format (cylinder groups, bitmaps, block-mapped inodes): sync, async and later soft updates and journaling",
    probe_bytes: cairn_ffs::format::superblock::SB_BYTES,
    probe: cairn_ffs::format::superblock::has_magic,
    modes: || cairn_ffs::modes().iter().map(|m| m.spec()).collect(),
    check_option: ffs_check_option,
    check_options: ffs_check_options,
    mkfs: ffs_mkfs,
    mount: ffs_mount,
    check: cairn_fsck::check_path,
};

/// The options as the engine takes them, each key known to the format or one of its
/// modes (the mode's own are checked against the mode at mount: `MountOptions::check`).
fn ffs_options(opts: &Options, read_only: bool) -> Result<cairn_ffs::MountOptions, String> {
    let mut o = cairn_ffs::MountOptions {
        read_only,
        ..Default::default()
    };
    for (k, v) in opts {
        o.set(k, v.as_deref())?;
    }
    Ok(o)
}

fn ffs_check_option(key: &str, value: Option<&str>) -> Result<(), String> {
    cairn_ffs::MountOptions::default().set(key, value)
}

fn ffs_check_options(opts: &Options, read_only: bool) -> Result<(), String> {
    ffs_options(opts, read_only)?.check()
}

fn ffs_mkfs(path: &Path, a: &MkfsArgs) -> Result<(), FsError> {
    let defaults = cairn_ffs::MkfsOptions::default();
    cairn_ffs::mkfs(
        path,
        &cairn_ffs::MkfsOptions {
            size: a.size,
            block_size: a.block_size.unwrap_or(defaults.block_size),
            inodes: a.inodes,
            label: a.label.clone(),
            force: a.force,
            sparse: a.sparse,
            ..defaults
        },
    )
}

fn ffs_mount(path: &Path, opts: &Options, read_only: bool) -> Result<Arc<dyn FileSystem>, FsError> {
    let o = ffs_options(opts, read_only).map_err(|e| FsError::Refused(Errno::EINVAL, e))?;
    Ok(cairn_ffs::Ffs::mount(path, &o)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names_are_unique_and_every_mode_is_found() {
        let all = modes();
        assert!(all.iter().any(|m| m.name() == "sync"));
        assert!(all.iter().any(|m| m.name() == "async"));
        for m in &all {
            assert_eq!(mode(m.name()).unwrap().fs.name, m.fs.name);
            assert_eq!(all.iter().filter(|x| x.name() == m.name()).count(), 1);
        }
        assert!(mode("turbo").is_none());
        assert_eq!(by_name("ffs").unwrap().name, "ffs");
    }

    #[test]
    fn probe_names_the_format_or_refuses_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        (FFS.mkfs)(
            &img,
            &MkfsArgs {
                size: Some(8 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(probe_path(&img).unwrap().name, "ffs");
        let other = dir.path().join("zeros");
        std::fs::write(&other, vec![0u8; 4096]).unwrap();
        let e = probe_path(&other).unwrap_err().to_string();
        assert!(e.contains("not a cairn file system"), "{e}");
        assert_eq!(e.lines().count(), 1);
        assert!(probe_path(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn options_are_checked_before_mounting() {
        let opt = |k: &str, v: Option<&str>| vec![(k.to_string(), v.map(str::to_string))];
        assert!((FFS.check_options)(&opt("mode", Some("async")), false).is_ok());
        let e = (FFS.check_options)(&opt("mode", Some("turbo")), false).unwrap_err();
        assert!(e.contains("turbo"), "{e}");
        assert!((FFS.check_options)(&opt("frobnicate", None), false).is_err());
        assert!((FFS.check_option)("cache", Some("64M")).is_ok());
        assert!((FFS.check_option)("frobnicate", None).is_err());
        // The daemon's old log option is no option of any mode of this build (issue 12's
        // journal will parse log=file|dev:PATH itself).
        assert!((FFS.check_option)("log", Some("file")).is_err());
    }
}
