//! `cairn wal`: make, inspect and measure a stand-alone write-ahead log (`crates/wal`), the
//! log device of a journaled mount (LFFS-wafs, 001 §5.2).

use std::io::{self, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use cairn_blockdev::{BlockDevice, FileDevice, Lock};
use cairn_wal::format::{self, SB_BYTES, Superblock};
use cairn_wal::{FormatOptions, Lsn, Region, Wal, WalError};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Make a write-ahead log on an image file (created if missing) or a block device
    Mkfs {
        /// Image file or block device
        path: PathBuf,
        /// Log size (e.g. 64M); default: the size of the existing image or device
        #[arg(long, short = 's')]
        size: Option<String>,
        /// Block size in bytes, a power of two from 512 to 65536
        #[arg(long, short = 'b', default_value_t = 4096)]
        block_size: u32,
        /// Overwrite an image or device that already holds a log, a file system or other
        /// data (one in use is refused regardless)
        #[arg(long, short = 'F')]
        force: bool,
    },
    /// Print the superblocks and every record from the checkpoint to the end
    Dump {
        path: PathBuf,
        /// Print each record's whole payload in hex (default: its first 16 bytes)
        #[arg(long)]
        data: bool,
    },
    /// Summarize a log: geometry, checkpoint, end, records, space
    Stat {
        path: PathBuf,
        /// One JSON object instead
        #[arg(long)]
        json: bool,
    },
    /// Measure forced appends/s with 1..N concurrent forcers against the device's raw flush
    /// rate measured in the same run. Reformats the log at PATH (made by `cairn wal mkfs`)
    Bench {
        path: PathBuf,
        /// Seconds of forcing per row (its raw flush measurement adds a third of that)
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Forcing threads, comma-separated
        #[arg(long, default_value = "1,2,4,8,16")]
        threads: String,
        /// Payload bytes per record
        #[arg(long, default_value_t = 128)]
        record: usize,
        /// Group-commit wait: `auto` (the measured flush time, at most 10 ms), `off`, a number
        /// of microseconds, or `both` (auto and off for each thread count)
        #[arg(long, default_value = "both")]
        group_wait: String,
        /// One JSON object instead of the table
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: Args) -> Result<i32> {
    match args.cmd {
        Cmd::Mkfs {
            path,
            size,
            block_size,
            force,
        } => mkfs(&path, size.as_deref(), block_size, force),
        Cmd::Dump { path, data } => dump(&path, data),
        Cmd::Stat { path, json } => stat(&path, json),
        Cmd::Bench {
            path,
            secs,
            threads,
            record,
            group_wait,
            json,
        } => bench(&path, secs, &threads, record, &group_wait, json),
    }
}

// ----- mkfs ------------------------------------------------------------------------------

fn mkfs(path: &Path, size: Option<&str>, bs: u32, force: bool) -> Result<i32> {
    match mkfs_checked(path, size, bs, force) {
        Ok(msg) => {
            println!("{msg}");
            Ok(0)
        }
        Err(e) => {
            eprintln!("cairn wal mkfs: {}: {e:#}", path.display());
            Ok(1)
        }
    }
}

/// Refusals first (geometry, a holder, existing contents, host space), then the log. An image
/// file this call created is removed again if it fails.
fn mkfs_checked(path: &Path, size: Option<&str>, bs: u32, force: bool) -> Result<String> {
    if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
        bail!("block size {bs} is not a power of two from 512 to 65536");
    }
    let meta = std::fs::metadata(path).ok();
    let is_blockdev = meta
        .as_ref()
        .is_some_and(|m| m.file_type().is_block_device());
    let size = match (size, &meta) {
        (Some(s), _) => Some(cairn_ffs::parse_size(s).map_err(|e| anyhow!(e))?),
        (None, _) if is_blockdev => None,
        (None, Some(m)) if m.len() > 0 => Some(m.len()),
        _ => bail!("no --size given and the image does not exist (or is empty)"),
    };
    let min = Region::MIN_BLOCKS * u64::from(bs);
    if let Some(s) = size
        && s < min
    {
        bail!("size {s} bytes is below the minimum of {min} bytes for {bs}-byte blocks");
    }
    let created = meta.is_none();
    let r = mkfs_locked(path, size, bs, force, is_blockdev);
    if r.is_err() && created {
        let _ = std::fs::remove_file(path);
    }
    r
}

fn mkfs_locked(
    path: &Path,
    size: Option<u64>,
    bs: u32,
    force: bool,
    is_blockdev: bool,
) -> Result<String> {
    // The exclusive lock before looking at anything: a log a journaled mount is using, or
    // another tool, is never touched.
    let file = cairn_blockdev::open_locked(path, false, Lock::Exclusive, !is_blockdev)?;
    if !force && let Some(what) = existing_contents(&file)? {
        bail!("it already holds {what}; use --force (-F) to overwrite it");
    }
    if !is_blockdev && let Some(size) = size {
        let have = file.metadata()?.len();
        if size > have {
            check_host_space(path, size - have)?;
        }
        file.set_len(size)?;
    }
    let dev = FileDevice::from_file(file, path, bs, false)?;
    let blocks = match size {
        Some(s) => (s / u64::from(bs)).min(dev.num_blocks()),
        None => dev.num_blocks(),
    };
    let region = Region {
        first_block: 0,
        blocks,
    };
    // Zero the data area: the log's writes then never land in holes of an image file, which
    // would make every flush commit the host file system's metadata too.
    let opts = FormatOptions {
        zero: true,
        ..Default::default()
    };
    let sb = Wal::format(&dev, region, &opts)?;
    Ok(format!(
        "created a cairn write-ahead log on {}: {} blocks of {bs} bytes, {} bytes of log, uuid {}",
        path.display(),
        blocks,
        sb.capacity(),
        hex(&sb.uuid)
    ))
}

/// What the image already holds: a log (with its size), a cairn file system, a foreign
/// signature, or non-zero bytes.
fn existing_contents(file: &std::fs::File) -> Result<Option<String>> {
    let head = cairn_blockdev::image::head(file)?;
    if let Some(sb) = find_superblock(&head) {
        return Ok(Some(format!(
            "a cairn write-ahead log ({} KiB of log)",
            sb.capacity() >> 10
        )));
    }
    if format::has_magic(&head) || head.chunks(512).any(format::has_magic) {
        return Ok(Some("a damaged cairn write-ahead log".into()));
    }
    if head.starts_with(b"CAIRNFFS") {
        return Ok(Some("a cairn file system".into()));
    }
    Ok(cairn_blockdev::contents::describe(&head))
}

/// A valid superblock copy in `head`: copy 0 at offset 0, or copy 1 at the offset of block 1
/// for its own block size.
fn find_superblock(head: &[u8]) -> Option<Superblock> {
    if let Ok(sb) = Superblock::decode(head) {
        return Some(sb);
    }
    (9..=16).find_map(|shift| {
        let off = 1usize << shift;
        let sb = Superblock::decode(head.get(off..off + SB_BYTES)?).ok()?;
        (sb.block_size as usize == off).then_some(sb)
    })
}

fn check_host_space(path: &Path, grow: u64) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(vfs) = nix::sys::statvfs::statvfs(dir) else {
        return Ok(());
    };
    let free = vfs.blocks_available() * vfs.fragment_size();
    if grow > free {
        bail!(
            "it needs {} MiB more but its file system has only {} MiB free",
            grow >> 20,
            free >> 20
        );
    }
    Ok(())
}

// ----- opening an existing log -----------------------------------------------------------

/// Opens the log at `path` read-only (or, for `bench`, exclusively), with the block size its
/// superblock names. A log a journaled mount holds is still shown read-only, with a warning.
fn open_dev(path: &Path, write: bool) -> Result<Arc<FileDevice>> {
    let bs = probe_block_size(path)?;
    let lock = Lock::for_access(!write);
    match FileDevice::open_with(path, bs, !write, lock) {
        Ok(d) => Ok(Arc::new(d)),
        Err(e) if e.kind() == io::ErrorKind::ResourceBusy && !write => {
            eprintln!("cairn wal: warning: {e}; what is shown may be changing");
            Ok(Arc::new(FileDevice::open_with(path, bs, true, Lock::None)?))
        }
        Err(e) => Err(anyhow!(e)).with_context(|| format!("cannot open {}", path.display())),
    }
}

/// The block size of the log at `path`, from whichever superblock copy is readable; 512 when
/// none is (the log's own open then says what is wrong).
fn probe_block_size(path: &Path) -> Result<u32> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .len();
    let want = (128u64 << 10).min(if len == 0 { 128 << 10 } else { len }) as usize;
    let head = cairn_blockdev::read_bytes_at(path, 0, want)
        .or_else(|_| cairn_blockdev::read_bytes_at(path, 0, SB_BYTES))
        .unwrap_or_default();
    Ok(find_superblock(&head).map_or(512, |sb| sb.block_size))
}

/// Refuses an image shorter than one block, saying what it holds (the log's own open can
/// only say it is too small).
fn refuse_tiny(path: &Path, dev: &FileDevice) -> Result<()> {
    if dev.num_blocks() > 0 {
        return Ok(());
    }
    let len = std::fs::metadata(path)?.len() as usize;
    let head = cairn_blockdev::read_bytes_at(path, 0, len)?;
    let what = cairn_blockdev::contents::describe(&head).unwrap_or_else(|| "only zeros".into());
    bail!("not a cairn write-ahead log (it holds {what})");
}

fn open_log(path: &Path) -> Result<(Arc<FileDevice>, Wal)> {
    let dev = open_dev(path, false)?;
    refuse_tiny(path, &dev)?;
    let d: Arc<dyn BlockDevice> = dev.clone();
    let wal = Wal::open_read_only(d, Region::whole(&*dev)).map_err(|e| anyhow!(e))?;
    Ok((dev, wal))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `ns` since the Unix epoch as a UTC date and time.
fn when(ns: i64) -> String {
    let (y, m, d, hh, mm, ss) = cairn_vfs::time::utc_civil(ns.div_euclid(1_000_000_000));
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}:{ss:02} UTC")
}

// ----- dump and stat ---------------------------------------------------------------------

fn dump(path: &Path, data: bool) -> Result<i32> {
    let (dev, wal) = match open_log(path) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("cairn wal dump: {}: {e:#}", path.display());
            return Ok(1);
        }
    };
    match dump_to(&mut io::stdout().lock(), path, &dev, &wal, data) {
        // `cairn wal dump | head`: the reader has seen enough.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
        r => Ok(r?),
    }
}

fn dump_to(
    out: &mut impl Write,
    path: &Path,
    dev: &FileDevice,
    wal: &Wal,
    data: bool,
) -> io::Result<i32> {
    let region = wal.region();
    writeln!(
        out,
        "log {}: {} blocks of {} bytes, {} bytes of log, uuid {}, owner {}",
        path.display(),
        region.blocks,
        wal.block_size(),
        wal.capacity(),
        hex(&wal.uuid()),
        hex(&wal.owner())
    )?;
    let copies = cairn_wal::read_superblocks(dev, region).map_err(io::Error::other)?;
    for (i, c) in copies.iter().enumerate() {
        match c {
            Ok(sb) => writeln!(
                out,
                "superblock copy {i}: sequence {}, checkpoint {}, epoch {} from LSN {}, written {}",
                sb.sequence,
                sb.checkpoint,
                sb.epoch,
                sb.epoch_start,
                when(sb.written_ns)
            )?,
            Err(e) => writeln!(out, "superblock copy {i}: unusable: {e}")?,
        }
    }
    let rec = wal.recovery();
    writeln!(out, "checkpoint {}", rec.checkpoint)?;
    writeln!(out, "{:>14} {:>6} {:>8}  payload", "LSN", "epoch", "bytes")?;
    let mut n = 0u64;
    for r in wal.scan(Lsn(rec.checkpoint)) {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                writeln!(out, "error: {e}")?;
                return Ok(1);
            }
        };
        n += 1;
        let shown = if data {
            &r.data[..]
        } else {
            &r.data[..r.data.len().min(16)]
        };
        let more = if shown.len() < r.data.len() {
            " …"
        } else {
            ""
        };
        writeln!(
            out,
            "{:>14} {:>6} {:>8}  {}{more}",
            r.lsn,
            r.epoch,
            r.data.len(),
            spaced_hex(shown)
        )?;
    }
    writeln!(
        out,
        "end {}: {} ({n} records, {} bytes since the checkpoint)",
        rec.end,
        rec.stop,
        rec.end - rec.checkpoint
    )?;
    Ok(0)
}

fn spaced_hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn stat(path: &Path, json: bool) -> Result<i32> {
    let (_dev, wal) = match open_log(path) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("cairn wal stat: {}: {e:#}", path.display());
            return Ok(1);
        }
    };
    let rec = wal.recovery();
    let space = wal.space();
    let v = serde_json::json!({
        "path": path.display().to_string(),
        "block_size": wal.block_size(),
        "region_blocks": wal.region().blocks,
        "capacity": wal.capacity(),
        "uuid": hex(&wal.uuid()),
        "owner": hex(&wal.owner()),
        "created_ns": wal.created_ns(),
        "epoch": wal.epoch(),
        "checkpoint": rec.checkpoint,
        "end": rec.end,
        "records": rec.records,
        "end_reason": rec.stop.to_string(),
        "used_bytes": space.used,
        "free_bytes": space.free,
        "max_record": wal.max_record(),
    });
    if json {
        println!("{v}");
        return Ok(0);
    }
    println!("log:         {}", path.display());
    println!(
        "geometry:    {} blocks of {} bytes ({} bytes of log)",
        wal.region().blocks,
        wal.block_size(),
        wal.capacity()
    );
    println!("uuid:        {}", hex(&wal.uuid()));
    println!("owner:       {}", hex(&wal.owner()));
    println!("created:     {}", when(wal.created_ns()));
    println!("epoch:       {} (opens so far)", wal.epoch());
    println!("checkpoint:  {}", rec.checkpoint);
    println!("end:         {} ({})", rec.end, rec.stop);
    println!("records:     {} since the checkpoint", rec.records);
    println!(
        "space:       {} bytes used, {} free ({:.1}% used); largest record {} bytes",
        space.used,
        space.free,
        100.0 * space.used as f64 / wal.capacity() as f64,
        wal.max_record()
    );
    Ok(0)
}

// ----- bench -----------------------------------------------------------------------------

/// `cairn wal bench`: the arguments are checked before the log is opened; the benchmark
/// itself is `cairn_bench::wal`.
fn bench(
    path: &Path,
    secs: f64,
    threads: &str,
    record: usize,
    group_wait: &str,
    json: bool,
) -> Result<i32> {
    let plan = cairn_bench::wal::Plan::parse(threads, group_wait, secs, record)?;
    let dev = open_dev(path, true)?;
    refuse_tiny(path, &dev)?;
    // Only a log is benchmarked (and so reformatted): refuse anything else.
    match Wal::open_read_only(dev.clone(), Region::whole(&*dev)) {
        Ok(_) => {}
        Err(WalError::NotALog { found }) => bail!(
            "{} is not a cairn write-ahead log ({}); make one with cairn wal mkfs",
            path.display(),
            found.unwrap_or_default()
        ),
        Err(e) => bail!("{}: {e}", path.display()),
    }
    plan.run(dev, path, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc() {
        assert_eq!(when(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(when(951_782_400_000_000_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(when(1_700_000_000_123_456_789), "2023-11-14 22:13:20 UTC");
        assert_eq!(when(-1_000_000_000), "1969-12-31 23:59:59 UTC");
    }

    #[test]
    fn a_superblock_copy_is_found_at_its_block() {
        let mut head = vec![0u8; 128 << 10];
        assert!(find_superblock(&head).is_none());
        let sb = Superblock {
            version: format::VERSION,
            block_size: 4096,
            region_blocks: 100,
            uuid: [1; 16],
            sequence: 1,
            checkpoint: 98 * 4096,
            epoch_start: 98 * 4096,
            epoch: 0,
            created_ns: 0,
            written_ns: 0,
            owner: [0; 16],
        };
        sb.encode(&mut head[4096..]);
        assert_eq!(find_superblock(&head), Some(sb.clone()));
        // At the wrong block for its block size it is not a copy 1.
        let mut other = vec![0u8; 128 << 10];
        sb.encode(&mut other[8192..]);
        assert!(find_superblock(&other).is_none());
    }

    fn refusal(r: Result<String>) -> String {
        let e = format!("{:#}", r.unwrap_err());
        assert!(!e.contains('\n'), "{e}");
        e
    }

    #[test]
    fn mkfs_makes_a_zeroed_log_and_refuses_existing_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let msg = mkfs_checked(&p("w.log"), Some("1M"), 4096, false).unwrap();
        assert!(msg.contains("256 blocks of 4096 bytes"), "{msg}");
        let bytes = std::fs::read(p("w.log")).unwrap();
        assert_eq!(bytes.len(), 1 << 20);
        use std::os::unix::fs::MetadataExt;
        assert!(
            std::fs::metadata(p("w.log")).unwrap().blocks() * 512 >= 1 << 20,
            "the data area is allocated, not sparse"
        );
        // Again: a log is data.
        let e = refusal(mkfs_checked(&p("w.log"), Some("1M"), 4096, false));
        assert!(
            e.contains("already holds a cairn write-ahead log (1016 KiB of log)"),
            "{e}"
        );
        mkfs_checked(&p("w.log"), None, 512, true).unwrap();
        // Copy 0 damaged: still recognized as a log by copy 1.
        let mut b = std::fs::read(p("w.log")).unwrap();
        b[0] = b'X';
        std::fs::write(p("w.log"), &b).unwrap();
        let e = refusal(mkfs_checked(&p("w.log"), None, 512, false));
        assert!(e.contains("cairn write-ahead log"), "{e}");
        // Text, a foreign signature, a cairn file system.
        std::fs::write(p("t.txt"), b"notes\n").unwrap();
        let e = refusal(mkfs_checked(&p("t.txt"), Some("1M"), 4096, false));
        assert!(e.contains("already holds text"), "{e}");
        assert_eq!(std::fs::read(p("t.txt")).unwrap(), b"notes\n");
        let mut ext = vec![0u8; 1 << 20];
        ext[1080] = 0x53;
        ext[1081] = 0xef;
        std::fs::write(p("ext.img"), &ext).unwrap();
        let e = refusal(mkfs_checked(&p("ext.img"), None, 4096, false));
        assert!(e.contains("ext2/ext3/ext4"), "{e}");
        let mut ffs = vec![0u8; 1 << 20];
        ffs[..8].copy_from_slice(b"CAIRNFFS");
        std::fs::write(p("ffs.img"), &ffs).unwrap();
        let e = refusal(mkfs_checked(&p("ffs.img"), None, 4096, false));
        assert!(e.contains("a cairn file system"), "{e}");
        // Too small, a bad block size, no size for a new file: refused, nothing left behind.
        let e = refusal(mkfs_checked(&p("tiny.log"), Some("16K"), 4096, false));
        assert!(e.contains("below the minimum of 40960 bytes"), "{e}");
        assert!(!p("tiny.log").exists());
        let e = refusal(mkfs_checked(&p("x.log"), Some("1M"), 3000, false));
        assert!(e.contains("power of two"), "{e}");
        let e = refusal(mkfs_checked(&p("y.log"), None, 4096, false));
        assert!(e.contains("no --size"), "{e}");
        assert!(!p("x.log").exists() && !p("y.log").exists());
    }

    #[test]
    fn mkfs_refuses_a_log_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.log");
        mkfs_checked(&path, Some("1M"), 4096, false).unwrap();
        let _held = FileDevice::open(&path, 4096, false).unwrap();
        let e = refusal(mkfs_checked(&path, Some("1M"), 4096, true));
        assert!(e.contains("in use by"), "{e}");
    }

    #[test]
    fn dump_and_stat_show_the_records_and_refuse_what_is_not_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.log");
        mkfs_checked(&path, Some("256K"), 4096, false).unwrap();
        {
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&path, 4096, false).unwrap());
            let w = Wal::open(dev.clone(), Region::whole(&*dev)).unwrap();
            for i in 0..3u8 {
                let l = w.append(&[i; 20]).unwrap();
                w.force(l).unwrap();
            }
        }
        let (dev, wal) = open_log(&path).unwrap();
        let mut out = Vec::new();
        dump_to(&mut out, &path, &dev, &wal, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("superblock copy 0: sequence 2"), "{text}");
        assert!(text.contains("02 02 02"), "{text}");
        assert!(
            text.contains("(3 records, 168 bytes since the checkpoint)"),
            "{text}"
        );
        assert_eq!(stat(&path, true).unwrap(), 0);
        std::fs::write(dir.path().join("t.txt"), b"hello\n").unwrap();
        let e = format!("{:#}", open_log(&dir.path().join("t.txt")).unwrap_err());
        assert!(
            e.contains("not a cairn write-ahead log (it holds text"),
            "{e}"
        );
        std::fs::write(dir.path().join("z.img"), vec![0u8; 1 << 20]).unwrap();
        let e = format!("{:#}", open_log(&dir.path().join("z.img")).unwrap_err());
        assert!(e.contains("it holds only zeros"), "{e}");
    }
}
