//! `cairn mkfs`: a thin front for the format's mkfs (see `cairn_fstypes`).

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use cairn_fstypes::MkfsArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Image file (created sparse if missing) or block device
    pub image: PathBuf,
    /// File-system size (e.g. 512M, 1G); default: the size of the existing image or device
    #[arg(long, short = 's')]
    pub size: Option<String>,
    /// Block size in bytes, a power of two from 4096 to 65536 (default 4096)
    #[arg(long, short = 'b')]
    pub block_size: Option<u32>,
    /// On-disk format: ffs (default) or lfs (`cairn modes` lists each format's modes)
    #[arg(long, default_value = "ffs")]
    pub format: String,
    /// Segment size of a log-structured format (e.g. 512K, 1M; default 512K)
    #[arg(long)]
    pub segment_size: Option<String>,
    /// Number of inodes (default: one per 16 KiB)
    #[arg(long, short = 'N')]
    pub inodes: Option<u64>,
    /// Volume label
    #[arg(long, short = 'L', default_value = "")]
    pub label: String,
    /// Overwrite an image or device that already holds a file system or other data (a
    /// mounted one is refused regardless)
    #[arg(long, short = 'F')]
    pub force: bool,
    /// Allow an image file larger than the free space of the file system holding it (it
    /// is sparse; writes into it may later fail when the host fills up)
    #[arg(long)]
    pub sparse: bool,
    /// Size of the log area at the end of the file system for `-o mode=journal,log=file`
    /// (default: about 1% of the size, at least 272K, at most 128M, none under 8M; 0: none)
    #[arg(long)]
    pub journal_size: Option<String>,
}

pub fn run(args: Args) -> Result<i32> {
    let Some(fs) = cairn_fstypes::by_name(&args.format) else {
        let known: Vec<_> = cairn_fstypes::all_types().iter().map(|t| t.name).collect();
        bail!(
            "unknown format '{}' (known: {})",
            args.format,
            known.join(", ")
        );
    };
    let size = args
        .size
        .as_deref()
        .map(cairn_ffs::parse_size)
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let journal_size = args
        .journal_size
        .as_deref()
        .map(cairn_ffs::parse_size)
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let segment_size = args
        .segment_size
        .as_deref()
        .map(cairn_ffs::parse_size)
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let opts = MkfsArgs {
        journal_size,
        segment_size,
        size,
        block_size: args.block_size,
        inodes: args.inodes,
        label: args.label,
        force: args.force,
        sparse: args.sparse,
    };
    // An image just unmounted may still be held by its daemon's final flush.
    crate::runtime::wait_for_image(&args.image, true)?;
    if let Err(e) = (fs.mkfs)(&args.image, &opts) {
        eprintln!("cairn mkfs: {}: {e}", args.image.display());
        return Ok(1);
    }
    println!(
        "created a cairn {} file system on {}",
        fs.name,
        args.image.display()
    );
    Ok(0)
}
