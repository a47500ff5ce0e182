//! `cairn mkfs`: a thin front for `cairn_ffs::mkfs`.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use cairn_ffs::MkfsOptions;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Image file (created sparse if missing) or block device
    pub image: PathBuf,
    /// File-system size (e.g. 512M, 1G); default: the size of the existing image or device
    #[arg(long, short = 's')]
    pub size: Option<String>,
    /// Block size in bytes, a power of two from 4096 to 65536
    #[arg(long, short = 'b', default_value_t = 4096)]
    pub block_size: u32,
    /// Number of inodes (default: one per 16 KiB)
    #[arg(long, short = 'N')]
    pub inodes: Option<u64>,
    /// Volume label
    #[arg(long, short = 'L', default_value = "")]
    pub label: String,
}

pub fn run(args: Args) -> Result<i32> {
    let size = args
        .size
        .as_deref()
        .map(cairn_ffs::parse_size)
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let opts = MkfsOptions {
        size,
        block_size: args.block_size,
        inodes: args.inodes,
        label: args.label,
        ..Default::default()
    };
    cairn_ffs::mkfs(&args.image, &opts)
        .map_err(|e| anyhow!("mkfs {}: {e}", args.image.display()))?;
    println!("created a cairn file system on {}", args.image.display());
    Ok(0)
}
