//! cairn-ffs: the FFS-style on-disk format and its metadata-update strategies.
//!
//! (Work in progress: the public API below is stable; the engine is being filled in.)

pub mod format;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cairn_vfs::{Errno, FsError};

/// A metadata-update discipline that can be chosen at mount time.
#[derive(Clone, Copy, Debug)]
pub struct ModeInfo {
    pub name: &'static str,
    pub description: &'static str,
}

/// Every mode this build knows, in the order tools list them.
pub fn modes() -> &'static [ModeInfo] {
    &[
        ModeInfo {
            name: "sync",
            description: "classic FFS: metadata calls durable on return, written in rule order with flushes as barriers",
        },
        ModeInfo {
            name: "async",
            description: "FFS mounted async: delayed writes, no ordering (the unsafe upper bound)",
        },
    ]
}

/// Options of `cairn mount -o ...`.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// One of [`modes`]' names.
    pub mode: String,
    /// Buffer-cache budget in bytes.
    pub cache_bytes: u64,
    /// How often the syncer writes dirty buffers; `None` = the mode's default (30 s for async).
    pub syncer_interval: Option<Duration>,
    pub read_only: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions { mode: "sync".into(), cache_bytes: 256 << 20, syncer_interval: None, read_only: false }
    }
}

impl MountOptions {
    /// Applies one `-o key[=value]` option. Unknown keys are an error naming the key.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<(), String> {
        let need = |v: Option<&'_ str>| -> Result<String, String> {
            v.map(str::to_string).ok_or_else(|| format!("option '{key}' needs a value"))
        };
        match key {
            "mode" => {
                let v = need(value)?;
                if !modes().iter().any(|m| m.name == v.as_str()) {
                    let names: Vec<_> = modes().iter().map(|m| m.name).collect();
                    return Err(format!("unknown mode '{v}' (known: {})", names.join(", ")));
                }
                self.mode = v;
            }
            "cache" => self.cache_bytes = parse_size(&need(value)?)?,
            "syncer" => {
                let secs: f64 = need(value)?.parse().map_err(|_| format!("bad syncer interval '{}'", value.unwrap_or("")))?;
                if !(secs.is_finite() && secs > 0.0) {
                    return Err("syncer interval must be > 0 seconds".into());
                }
                self.syncer_interval = Some(Duration::from_secs_f64(secs));
            }
            "ro" => self.read_only = true,
            "rw" => self.read_only = false,
            _ => return Err(format!("unknown mount option '{key}'")),
        }
        Ok(())
    }
}

/// Parses sizes such as `4096`, `64K`, `256M`, `1G`, `2T` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("bad size '{s}'")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size '{s}'"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size '{s}' too large"))
}

/// Options of `cairn mkfs`.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Size of the file system in bytes; `None` = the whole device/image as it is.
    pub size: Option<u64>,
    pub block_size: u32,
    /// Number of inodes; `None` = one per 16 KiB.
    pub inodes: Option<u64>,
    pub label: String,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions { size: None, block_size: 4096, inodes: None, label: String::new() }
    }
}

/// Creates a file system on `path` (an image file, created sparse if missing, or a block device).
pub fn mkfs(_path: &Path, _opts: &MkfsOptions) -> Result<(), FsError> {
    Err(FsError::Errno(Errno::ENOSYS))
}

/// A mounted file system. Implements [`cairn_vfs::FileSystem`].
pub struct Ffs {
    _private: (),
}

impl Ffs {
    /// Opens and mounts the file system on `path`. A bad image gives an error whose message
    /// is one line naming the problem.
    pub fn mount(_path: &Path, _opts: &MountOptions) -> Result<Arc<Ffs>, FsError> {
        Err(FsError::Errno(Errno::ENOSYS))
    }
}
