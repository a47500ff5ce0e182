//! The papers' published numbers, printed beside ours. Values are transcribed from the texts in
//! `../shared/papers/` exactly as printed there (000 = Seltzer et al., Tables 4–7; 004 =
//! Rosenblum & Ousterhout, Table III and the text around Fig. 8). Our copy of 002 (Ganger et
//! al.) has its numbers and figure numbers stripped (its figures are counted in order: 3–5 the
//! create/delete/read sweeps, 6 writes per create, 7 SDET, 8 SDET with logging), so its tables
//! are quoted by their claims, not invented. Our copy of 001 has no tables; its numbers are
//! 000's.
//!
//! `analogue` maps each of the papers' systems to the targets here that play its role, so a
//! reader can line up "FFS 0.13" against cairn-sync's and ext4 -o sync's own ratios.

/// One published table: rows and their values, as the paper prints them.
pub struct Published {
    /// Where it comes from, e.g. "000 Table 5".
    pub source: &'static str,
    pub title: &'static str,
    /// What the rows are: "system" (each row one of the paper's systems), or e.g. "file size"
    /// for a table of one system, named in `system`.
    pub row_header: &'static str,
    /// The one system a table of non-system rows is about.
    pub system: Option<&'static str>,
    pub columns: &'static [&'static str],
    pub rows: &'static [(&'static str, &'static [&'static str])],
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
            "002 Fig. 7: throughput of No Order and Soft Updates rises with concurrency while Conventional (synchronous) is disk-bound and falls as scripts compete for the disk.",
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
        "FFS" | "Conventional" => "cairn-sync",
        "FFS-async" | "No Order" => "cairn-async, ext2",
        "Soft-Updates" => "cairn-softdep",
        "LFFS-file" => "cairn-journal (log=file: the image's log area)",
        // The -1 systems log to a region of the file system's own disk: cairn's log=file is
        // that placement. ext4 (-o sync) is the kernel's journal on the same disk whose every
        // operation waits for its commit (or not): the kernel peers, not FFS (which has no log).
        "LFFS-wafs-1sync" => {
            "cairn-journal (log in a region of the same device); kernel peer ext4-sync"
        }
        "LFFS-wafs-1async" => {
            "cairn-journal-async (log in a region of the same device); kernel peer ext4"
        }
        "LFFS-wafs-2sync" => "cairn-journal-2sync (log=dev: a second image)",
        "LFFS-wafs-2async" => {
            "cairn-journal-2async (log=dev: a second image); kernel peer xfs-logdev"
        }
        "Sprite LFS" => "cairn-lfs",
        _ => "",
    }
}

/// The one target here whose numbers stand for a published system in a table of paper /
/// model / this device (`device`): the closest analogue of [`analogue`]'s list. LFFS-file
/// and LFFS-wafs-1async both log asynchronously to their own disk: cairn-journal-async.
pub fn primary(system: &str) -> Option<&'static str> {
    Some(match system {
        "FFS" | "Conventional" | "SunOS" => "cairn-sync",
        "FFS-async" | "No Order" => "cairn-async",
        "Soft-Updates" => "cairn-softdep",
        "LFFS-file" | "LFFS-wafs-1async" => "cairn-journal-async",
        "LFFS-wafs-1sync" => "cairn-journal",
        "LFFS-wafs-2sync" => "cairn-journal-2sync",
        "LFFS-wafs-2async" => "cairn-journal-2async",
        "Sprite LFS" => "cairn-lfs",
        _ => return None,
    })
}

pub static TABLE4: Published = Published {
    source: "000 Table 4",
    title: "0-length file create/delete",
    row_header: "system",
    system: None,
    columns: &["files/s"],
    rows: &[
        ("FFS", &["80.4"]),
        ("FFS-async", &["10782.8"]),
        ("Soft-Updates", &["4962.0"]),
        ("LFFS-file", &["7695.7"]),
        ("LFFS-wafs-1sync", &["80.3"]),
        ("LFFS-wafs-1async", &["4846.4"]),
        ("LFFS-wafs-2sync", &["80.5"]),
        ("LFFS-wafs-2async", &["4692.7"]),
    ],
    note: "files per second on 1999 hardware (FreeBSD, 500 MHz Pentium III, 10,000 RPM disks; the -2 systems log to a second disk); standard deviations left out",
};

pub static TABLE5: Published = Published {
    source: "000 Table 5",
    title: "ssh build",
    row_header: "system",
    system: None,
    columns: &["unpack", "config", "build", "total"],
    rows: &[
        ("FFS", &["0.13", "0.73", "0.83", "0.74"]),
        ("Soft-Updates", &["0.98", "0.99", "1.01", "1.01"]),
        ("LFFS-file", &["0.79", "0.98", "0.99", "1.01"]),
        ("LFFS-wafs-1sync", &["0.17", "0.92", "0.92", "0.84"]),
        ("LFFS-wafs-1async", &["0.91", "0.98", "0.99", "0.99"]),
        ("LFFS-wafs-2sync", &["0.20", "0.93", "0.94", "0.87"]),
        ("LFFS-wafs-2async", &["0.91", "0.99", "1.00", "1.00"]),
    ],
    note: "FFS-async time ÷ time (FFS-async = 1.00)",
};

pub static TABLE6: Published = Published {
    source: "000 Table 6",
    title: "Netnews",
    row_header: "system",
    system: None,
    columns: &["unbatch", "expire", "total"],
    rows: &[
        ("FFS", &["0.57", "0.37", "0.48"]),
        ("Soft-Updates", &["0.86", "0.76", "0.82"]),
        ("LFFS-file", &["0.95", "0.95", "0.95"]),
        ("LFFS-wafs-1sync", &["0.67", "0.46", "0.58"]),
        ("LFFS-wafs-1async", &["0.98", "0.94", "0.97"]),
        ("LFFS-wafs-2sync", &["0.88", "0.58", "0.96"]),
        ("LFFS-wafs-2async", &["0.99", "0.96", "0.98"]),
    ],
    note: "FFS-async time ÷ time (FFS-async = 1.00; a single run in the paper)",
};

pub static TABLE7: Published = Published {
    source: "000 Table 7",
    title: "PostMark (10,000 files, 512 B–16 KB, 20,000 transactions)",
    row_header: "system",
    system: None,
    columns: &["transactions/s ÷ FFS-async"],
    rows: &[
        ("FFS", &["0.24"]),
        ("Soft-Updates", &["1.15"]),
        ("LFFS-file", &["0.95"]),
        ("LFFS-wafs-1sync", &["0.37"]),
        ("LFFS-wafs-1async", &["0.95"]),
        ("LFFS-wafs-2sync", &["0.61"]),
        ("LFFS-wafs-2async", &["0.99"]),
    ],
    note: "throughput ÷ FFS-async's",
};

pub static LFS_TABLE3: Published = Published {
    source: "004 Table III",
    title: "recovery time for various crash configurations",
    row_header: "file size",
    system: Some("Sprite LFS"),
    columns: &["1 MB recovered", "10 MB", "50 MB"],
    rows: &[
        ("1 KB", &["1", "21", "132"]),
        ("10 KB", &["< 1", "3", "17"]),
        ("100 KB", &["< 1", "1", "8"]),
    ],
    note: "seconds of roll-forward after a crash, by the size of the files written since the last checkpoint and their total",
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
        let v = |row: usize| TABLE4.rows[row].1[0].parse::<f64>().unwrap();
        assert_eq!(TABLE4.rows[1].0, "FFS-async");
        assert!((v(2) / v(1) - 0.46).abs() < 0.01);
        assert_eq!(analogue("FFS"), "cairn-sync");
        // 001's log placements by the targets that have them.
        assert!(analogue("LFFS-wafs-2sync").starts_with("cairn-journal-2sync"));
        assert!(analogue("LFFS-wafs-2async").starts_with("cairn-journal-2async"));
        assert!(analogue("LFFS-wafs-2async").contains("xfs-logdev"));
        assert!(analogue("LFFS-wafs-1sync").contains("ext4-sync"));
        assert!(analogue("LFFS-wafs-1async").starts_with("cairn-journal-async"));
        assert!(for_workload("ssh")[0].source.contains("Table 5"));
        assert!(for_workload("seq").is_empty());
    }

    #[test]
    fn every_system_of_the_ratio_tables_has_a_primary_target() {
        for t in [&TABLE4, &TABLE7] {
            for (sys, _) in t.rows {
                let p = primary(sys).unwrap_or_else(|| panic!("{sys}"));
                assert!(
                    analogue(sys).contains(p) || sys.starts_with("LFFS"),
                    "{sys}: {p}"
                );
            }
        }
        assert_eq!(primary("Sprite LFS"), Some("cairn-lfs"));
        assert_eq!(primary("SunOS"), Some("cairn-sync"));
    }

    /// Every system row names one of 000 Table 2's systems, which `analogue` knows; a table of
    /// other rows names its one system.
    #[test]
    fn rows_name_the_papers_systems() {
        for t in [&TABLE4, &TABLE5, &TABLE6, &TABLE7, &LFS_TABLE3] {
            match t.system {
                None => {
                    assert_eq!(t.row_header, "system", "{}", t.source);
                    for (sys, _) in t.rows {
                        assert!(!analogue(sys).is_empty(), "{} {sys}", t.source);
                    }
                }
                Some(sys) => {
                    assert_ne!(t.row_header, "system", "{}", t.source);
                    assert!(!analogue(sys).is_empty(), "{sys}");
                }
            }
        }
    }
}
