//! cairn-fsck: the checker and repairer of cairn's FFS-style format, and the format inspector
//! behind `cairn inspect`.
//!
//! The checker follows the passes of FFS fsck (McKusick and Kowalski, *Fsck: The UNIX File
//! System Check Program*), reading the device directly rather than through the buffer cache:
//!
//! 0. superblock (falling back to a backup copy) and group descriptors;
//! 1. every inode: type, checksum, block pointers in range, outside group metadata and
//!    claimed once (an in-memory bitmap of one bit per block), indirect blocks walked with
//!    bounds, size against the blocks mapped, block count;
//! 2. every directory block: record structure, `.` and `..`, entries naming valid in-use
//!    inodes with the right `d_type`, duplicate names;
//! 3. connectivity from the root: directories with more than one name, unreachable
//!    directories and cycles (reconnected to `lost+found`), `..` of every directory;
//! 4. link counts against references (unreferenced inodes reconnected or freed);
//! 5. bitmaps and summary counts against what passes 1–4 found.
//!
//! Every finding is classed as a [`Class::Leak`] (what an interrupted `sync`-mode operation
//! may legitimately leave: resources allocated but unreferenced, link counts too high,
//! summaries off — FFS's "safe" inconsistencies, Ganger et al. 2000 §3) or a
//! [`Class::Corruption`] (anything the ordering rules forbid). With `repair`, fsck fixes
//! what it finds so that a second run is clean, never dropping reachable data it can keep.
//!
//! Memory is bounded by the geometry: one bit per block plus nine bytes per inode, and a
//! small record per directory.

use std::io;
use std::path::Path;

use cairn_blockdev::{BlockDevice, FileDevice, Lock};

mod check;
mod disk;
pub mod fuzz;
pub mod inspect;
#[doc(hidden)]
pub mod testimage;

#[cfg(test)]
mod tests;

/// What a finding means for the file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Class {
    /// An inconsistency the ordering rules forbid (wrong data may be visible).
    Corruption,
    /// Lost space or a summary that is off: what a crash in `sync` mode may leave.
    Leak,
}

/// The pass that produced a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Pass {
    Superblock,
    Inodes,
    Directories,
    Connectivity,
    LinkCounts,
    Bitmaps,
}

impl Pass {
    pub fn name(self) -> &'static str {
        match self {
            Pass::Superblock => "superblock and group descriptors",
            Pass::Inodes => "inodes and block maps",
            Pass::Directories => "directory structure",
            Pass::Connectivity => "connectivity",
            Pass::LinkCounts => "link counts",
            Pass::Bitmaps => "bitmaps and summary counts",
        }
    }
    pub fn number(self) -> u8 {
        self as u8
    }
}

/// What a finding is, where a tool must tell it apart from others of its class (never by
/// its message): the footprints of a directory rename caught between its steps, which the
/// crash harness classes apart (001 §6: without a log, "both old and new names persist").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Kind {
    /// A directory named in two directories (fsck keeps the name its `..` agrees with): a
    /// rename caught after its new name and before the old one's removal.
    SecondDirectoryName,
    /// A directory whose `..` names another directory than the one naming it: a rename
    /// caught before `..` was rewritten.
    StaleDotDot,
    /// Anything else.
    Other,
}

impl Kind {
    /// Whether a directory rename caught between its steps leaves this.
    pub fn is_rename_footprint(self) -> bool {
        matches!(self, Kind::SecondDirectoryName | Kind::StaleDotDot)
    }
}

/// One inconsistency, as one line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub class: Class,
    pub pass: Pass,
    pub kind: Kind,
    pub message: String,
    /// True when repair corrected it on the device.
    pub fixed: bool,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let class = match self.class {
            Class::Corruption => "CORRUPTION",
            Class::Leak => "LEAK",
        };
        write!(
            f,
            "{class}: {}{}",
            self.message,
            if self.fixed { " [fixed]" } else { "" }
        )
    }
}

/// What the file system holds, as counted by the check (after repairs, when repairing).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub block_size: u32,
    pub groups: u64,
    pub blocks_total: u64,
    /// Blocks in use, group metadata included.
    pub blocks_used: u64,
    pub inodes_total: u64,
    /// Inodes in use (the two reserved inodes are not counted).
    pub inodes_used: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Fifos, sockets and device nodes.
    pub specials: u64,
}

/// The outcome of [`check`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// How many findings were corrected.
    pub fixed: usize,
    pub stats: Stats,
    /// The group whose backup superblock was used because the primary was unusable.
    pub backup_superblock: Option<u64>,
    pub repaired: bool,
}

impl Report {
    /// No findings at all.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
    pub fn corruptions(&self) -> impl Iterator<Item = &Finding> {
        self.findings
            .iter()
            .filter(|f| f.class == Class::Corruption)
    }
    pub fn leaks(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.class == Class::Leak)
    }
    /// Findings that remain on the device.
    pub fn unfixed(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| !f.fixed)
    }
    /// e2fsck's exit status, bits OR-ed: 0 clean, 1 errors corrected, 4 errors left
    /// uncorrected. (8, an operational error, is [`FsckError::exit_code`].)
    pub fn exit_code(&self) -> i32 {
        let mut c = 0;
        if self.fixed > 0 {
            c |= 1;
        }
        if self.unfixed().next().is_some() {
            c |= 4;
        }
        c
    }
}

/// Where the checker is, for a progress bar: `done` of `total` units of `pass`.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub pass: Pass,
    pub done: u64,
    pub total: u64,
}

/// A progress callback (see [`CheckOptions::progress`]).
pub type ProgressFn = Box<dyn FnMut(&Progress) + Send>;

/// Options of [`check`].
#[derive(Default)]
pub struct CheckOptions {
    /// Fix what is found (`-y`); otherwise the device is never written.
    pub repair: bool,
    /// Called as the check advances (at most a few thousand times per run).
    pub progress: Option<ProgressFn>,
    /// Check an image even while a read-write mount holds it (`--force`): read-only, no
    /// lock, and the findings may be stale because the mount keeps changing the image.
    /// Never combined with `repair`.
    pub force: bool,
}

/// Why the check could not run at all (exit code 8).
#[derive(Debug, thiserror::Error)]
pub enum FsckError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// No cairn superblock anywhere we looked.
    #[error("not a cairn file system: {0}")]
    NotCairn(String),
    /// A cairn file system this fsck cannot work on (no usable superblock, device too small).
    #[error("{0}")]
    Unusable(String),
    /// The image is in use (a read-write mount, or any mount when repairing): checking it
    /// would read a moving target, repairing it would corrupt a live file system.
    #[error("{0}")]
    Busy(String),
}

impl FsckError {
    pub fn exit_code(&self) -> i32 {
        8
    }
}

/// Checks (and with `opts.repair`, repairs) the file system on `dev`. The device's block
/// size need not be the file system's.
pub fn check(dev: &dyn BlockDevice, opts: CheckOptions) -> Result<Report, FsckError> {
    check::run(dev, opts)
}

/// Opens `path` (an image file or a block device; read-only unless repairing) and checks it.
///
/// The image is locked like a mount locks it (see `cairn_blockdev::lock`): a check takes a
/// shared lock, so it is refused while a read-write mount holds the image; a repair takes
/// an exclusive one, refused while anything holds it. `opts.force` checks without a lock.
pub fn check_path(path: &Path, opts: CheckOptions) -> Result<Report, FsckError> {
    if opts.force && opts.repair {
        return Err(FsckError::Unusable(
            "--force only checks; a repair needs the image unmounted".into(),
        ));
    }
    let lock = if opts.force {
        Lock::None
    } else {
        Lock::for_access(!opts.repair)
    };
    let dev = open(path, !opts.repair, lock).map_err(|e| match e {
        FsckError::Busy(msg) if opts.repair => FsckError::Busy(format!(
            "{msg}: refusing to repair a mounted file system (unmount it first)"
        )),
        FsckError::Busy(msg) => FsckError::Busy(format!(
            "{msg}: refusing to check a live file system (unmount it, or use --force to \
             check it read-only anyway; findings may then be stale)"
        )),
        other => other,
    })?;
    check(&*dev, opts)
}

/// Opens an image or device with a 4 KiB device block: every cairn block size (4–64 KiB) is
/// a multiple of it, and the superblock is read before the real block size is known.
pub(crate) fn open(
    path: &Path,
    read_only: bool,
    lock: Lock,
) -> Result<std::sync::Arc<dyn BlockDevice>, FsckError> {
    match FileDevice::open_with(path, cairn_ffs::format::MIN_BLOCK_SIZE, read_only, lock) {
        Ok(d) => Ok(std::sync::Arc::new(d)),
        Err(e) if e.kind() == io::ErrorKind::ResourceBusy => Err(FsckError::Busy(e.to_string())),
        Err(e) => Err(FsckError::Io(io::Error::new(
            e.kind(),
            format!("cannot open {}: {e}", path.display()),
        ))),
    }
}
