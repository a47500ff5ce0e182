//! The papers' published numbers, printed beside ours. Values are transcribed from the texts in
//! `../shared/papers/` (000 = Seltzer et al., Tables 4–7; 004 = Rosenblum & Ousterhout, Table
//! III and the text around Fig. 8). Our copy of 002 (Ganger et al.) has its numbers stripped,
//! so its tables are quoted by their claims, not invented.
//!
//! `analogue` maps each of the papers' systems to the targets here that play its role, so a
//! reader can line up "FFS 0.13" against cairn-sync's and ext4 -o sync's own ratios.

/// One published table: rows of a system and its values (None where the paper has none).
pub struct Published {
    /// Where it comes from, e.g. "000 Table 5".
    pub source: &'static str,
    pub title: &'static str,
    pub columns: &'static [&'static str],
    pub rows: &'static [(&'static str, &'static [Option<f64>])],
    /// How the values are expressed (units or normalization).
    pub note: &'static str,
}

/// The workload each published table belongs to.
pub fn for_workload(workload: &str) -> Vec<&'static Published> {
    match workload {
        "create-unlink" => vec![&TABLE4],
        "ssh" => vec![&TABLE5],
        "netnews" => vec![&TABLE6],
        "postmark" => vec![&TABLE7],
        "recovery" => vec![&LFS_TABLE3],
        _ => vec![],
    }
}

/// Claims without numbers (figures we cannot read off, or 002's stripped tables).
pub fn claims(workload: &str) -> &'static [&'static str] {
    match workload {
        "micro" => &[
            "000 Figs. 1–2: read and write throughput do not differ between the systems (same on-disk layout).",
            "000 Fig. 3: Soft Updates creates faster than even FFS-async for small files; FFS (synchronous) is far below the rest.",
            "000 Fig. 4: Soft Updates deletes fastest (frees blocks in the background); logging slows as files gain blocks (a log record per freed block).",
        ],
        "smallfile" => &[
            "004 Fig. 8: Sprite LFS creates and deletes 10,000 1-KB files almost ten times as fast as SunOS (FFS) and reads them back faster.",
            "004 §5.1: during the create phase SunOS kept the disk 85% busy (using 1.2% of its bandwidth for new data); Sprite LFS kept it 17% busy while saturating the CPU.",
        ],
        "largefile" => &[
            "004 Fig. 9: LFS writes faster than SunOS in every write phase (random writes most: they become sequential in the log); reads are equal except a sequential re-read after random writes, where LFS is substantially slower.",
        ],
        "sdet" => &[
            "000 Fig. 5: the asynchronous systems (Soft Updates, LFFS-file, LFFS-wafs-async) stay near FFS-async; the synchronous ones (FFS, LFFS-wafs-sync) fall further behind as concurrency rises because scripts compete for the disk.",
            "002 Fig. 6: throughput of No Order and Soft Updates rises with concurrency while Conventional (synchronous) stays disk-bound.",
        ],
        "postmark" => &[
            "002 Table I: Soft Updates performs on the order of No Order (FFS-async) and outperforms Conventional (synchronous) FFS several-fold.",
            "002 Table II: on a production mail server, Soft Updates cut the disk writes per second and the share of synchronous writes sharply against Conventional FFS, roughly tripling the mail load the machine could carry.",
            "002 Table IV: a write-ahead-logging FFS (delayed group commit) runs PostMark below both No Order and Soft Updates, the extra log writes competing with the file system's own.",
        ],
        "postmark-umbrella" => {
            &["003 Fig. 8: UmbrellaFS adds under 1% (never over 3%) to PostMark on ext2."]
        }
        "recovery" => &[
            "002 Table III: conventional FFS needs fsck after a crash — seconds on an empty file system, minutes on a full one; Soft Updates mounts in seconds regardless of how full it is (fsck runs in the background).",
            "000 Table 3: recovery of FFS needs a full scan, the logging systems a log replay, FFS-async may be unrecoverable.",
        ],
        _ => &[],
    }
}

/// Targets here that play each published system's role.
pub fn analogue(system: &str) -> &'static str {
    match system {
        "FFS" | "Conventional" => "cairn-sync, ext4-sync",
        "FFS-async" | "No Order" => "cairn-async, ext2",
        "Soft-Updates" => "cairn-softdep (when it lands)",
        "LFFS-file" => "cairn journal in a file (when it lands)",
        "LFFS-wafs-1sync" | "LFFS-wafs-2sync" => "cairn journal, synchronous (when it lands)",
        "LFFS-wafs-1async" => "ext4 (journal on the same disk, async commit)",
        "LFFS-wafs-2async" => "xfs-logdev (log on a second device)",
        "Sprite LFS" => "cairn-lfs (when it lands)",
        _ => "",
    }
}

pub static TABLE4: Published = Published {
    source: "000 Table 4",
    title: "0-length file create/delete",
    columns: &["files/s"],
    rows: &[
        ("FFS", &[Some(80.4)]),
        ("FFS-async", &[Some(10782.8)]),
        ("Soft-Updates", &[Some(4962.0)]),
        ("LFFS-file", &[Some(7695.7)]),
        ("LFFS-wafs-1sync", &[Some(80.3)]),
        ("LFFS-wafs-1async", &[Some(4846.4)]),
        ("LFFS-wafs-2sync", &[Some(80.5)]),
        ("LFFS-wafs-2async", &[Some(4692.7)]),
    ],
    note: "files per second, 1999 hardware (FreeBSD, one disk)",
};

pub static TABLE5: Published = Published {
    source: "000 Table 5",
    title: "ssh build",
    columns: &["unpack", "config", "build", "total"],
    rows: &[
        ("FFS", &[Some(0.13), Some(0.73), Some(0.83), Some(0.74)]),
        (
            "Soft-Updates",
            &[Some(0.98), Some(0.99), Some(1.01), Some(1.01)],
        ),
        (
            "LFFS-file",
            &[Some(0.79), Some(0.98), Some(0.99), Some(1.01)],
        ),
        (
            "LFFS-wafs-1sync",
            &[Some(0.17), Some(0.92), Some(0.92), Some(0.84)],
        ),
        (
            "LFFS-wafs-1async",
            &[Some(0.91), Some(0.98), Some(0.99), Some(0.99)],
        ),
        (
            "LFFS-wafs-2sync",
            &[Some(0.20), Some(0.93), Some(0.94), Some(0.87)],
        ),
        (
            "LFFS-wafs-2async",
            &[Some(0.91), Some(0.99), Some(1.00), Some(1.00)],
        ),
    ],
    note: "FFS-async time ÷ time (FFS-async = 1.00)",
};

pub static TABLE6: Published = Published {
    source: "000 Table 6",
    title: "Netnews",
    columns: &["unbatch", "expire", "total"],
    rows: &[
        ("FFS", &[Some(0.57), Some(0.37), Some(0.48)]),
        ("Soft-Updates", &[Some(0.86), Some(0.76), Some(0.82)]),
        ("LFFS-file", &[Some(0.95), Some(0.95), Some(0.95)]),
        ("LFFS-wafs-1sync", &[Some(0.67), Some(0.46), Some(0.58)]),
        ("LFFS-wafs-1async", &[Some(0.98), Some(0.94), Some(0.97)]),
        ("LFFS-wafs-2sync", &[Some(0.88), Some(0.58), Some(0.96)]),
        ("LFFS-wafs-2async", &[Some(0.99), Some(0.96), Some(0.98)]),
    ],
    note: "FFS-async time ÷ time (FFS-async = 1.00; a single run in the paper)",
};

pub static TABLE7: Published = Published {
    source: "000 Table 7",
    title: "PostMark (10,000 files, 512 B–16 KB, 20,000 transactions)",
    columns: &["transactions/s ÷ FFS-async"],
    rows: &[
        ("FFS", &[Some(0.24)]),
        ("Soft-Updates", &[Some(1.15)]),
        ("LFFS-file", &[Some(0.95)]),
        ("LFFS-wafs-1sync", &[Some(0.37)]),
        ("LFFS-wafs-1async", &[Some(0.95)]),
        ("LFFS-wafs-2sync", &[Some(0.61)]),
        ("LFFS-wafs-2async", &[Some(0.99)]),
    ],
    note: "throughput ÷ FFS-async's",
};

pub static LFS_TABLE3: Published = Published {
    source: "004 Table III",
    title: "Sprite LFS recovery time (roll-forward), seconds",
    columns: &["1 MB recovered", "10 MB", "50 MB"],
    rows: &[
        ("1 KB files", &[Some(1.0), Some(21.0), Some(132.0)]),
        ("10 KB files", &[Some(0.5), Some(3.0), Some(17.0)]),
        ("100 KB files", &[Some(0.5), Some(1.0), Some(8.0)]),
    ],
    note: "seconds; '< 1' in the paper is shown as 0.5",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_one_value_per_column() {
        for t in [&TABLE4, &TABLE5, &TABLE6, &TABLE7, &LFS_TABLE3] {
            for (sys, vals) in t.rows {
                assert_eq!(vals.len(), t.columns.len(), "{} {sys}", t.source);
            }
        }
    }

    #[test]
    fn table4_normalizes_to_the_papers_ratios() {
        let async_ = TABLE4.rows[1].1[0].unwrap();
        let su = TABLE4.rows[2].1[0].unwrap();
        assert!((su / async_ - 0.46).abs() < 0.01);
        assert_eq!(analogue("FFS"), "cairn-sync, ext4-sync");
        assert!(for_workload("ssh")[0].source.contains("Table 5"));
        assert!(for_workload("seq").is_empty());
    }
}
