//! `cairn inspect`: the format inspector of crates/fsck, one structure at a time.

use std::path::PathBuf;

use anyhow::Result;
use cairn_fsck::inspect::{InspectError, Inspector};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Image file or block device
    pub image: PathBuf,
    /// What to show: superblock | group N | inode N | dir PATH | block N (lfs: superblock |
    /// checkpoint | segment N | imap | inode N | dir PATH)
    #[arg(trailing_var_arg = true)]
    pub what: Vec<String>,
}

pub fn run(args: Args) -> Result<i32> {
    // A format with its own inspector (lfs: superblock | checkpoint | segment N | imap |
    // inode N | dir PATH); anything else goes to the FFS inspector.
    let own = cairn_fstypes::probe_path(&args.image)
        .ok()
        .and_then(|t| t.inspect);
    let shown = match own {
        Some(inspect) => inspect(&args.image, &args.what),
        None => Inspector::open(&args.image).and_then(|i| {
            if let Some(warning) = &i.live {
                eprintln!("cairn inspect: warning: {warning}");
            }
            i.run(&args.what)
        }),
    };
    match shown {
        Ok(text) => {
            print!("{text}");
            Ok(0)
        }
        Err(e) => {
            eprintln!("cairn inspect: {}: {e}", args.image.display());
            Ok(match e {
                InspectError::Usage(_) => 2,
                InspectError::NotFound(_) => 1,
                InspectError::Open(_) => 8,
            })
        }
    }
}
