//! `cairn inspect`: placeholder until crates/fsck provides the format inspector.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Image file or block device
    pub image: PathBuf,
    /// What to show: superblock | group N | inode N | dir PATH
    #[arg(trailing_var_arg = true)]
    pub what: Vec<String>,
}

pub fn run(_args: Args) -> Result<i32> {
    eprintln!("cairn inspect: not yet implemented");
    Ok(8)
}
