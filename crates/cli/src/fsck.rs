//! `cairn fsck`: placeholder until crates/fsck provides the checker.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Repair what is found (default: check only)
    #[arg(short = 'y')]
    pub yes: bool,
    /// Image file or block device
    pub image: PathBuf,
}

/// Exit codes follow e2fsck: 0 clean, 1 errors fixed, 4 errors left, 8 operational error.
pub fn run(_args: Args) -> Result<i32> {
    eprintln!("cairn fsck: not yet implemented");
    Ok(8)
}
