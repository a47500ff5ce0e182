//! The log-structured format's crash states that the campaign once failed, re-checked one
//! by one from the recordings that showed them (recordings are deterministic, so the same
//! workload gives the same epochs and writes).

use cairn_crash::check::Checker;
use cairn_crash::states::{CrashState, Torn};
use cairn_crash::{modes, workload};

fn state(epoch: usize, kept: Vec<u32>, torn: Option<Torn>) -> CrashState {
    CrashState {
        epoch,
        kept,
        torn,
        at_end: false,
    }
}

/// `cairn crash run --modes lfs-cleaning --workloads random-5:600,random-6:600 --states
/// 20000 --seed 11` failed 9 states on format version 1: a partial segment written into a
/// segment the cleaner had freed lands torn — its summary and some blocks, not all — and
/// an inode block of the segment's previous life, still in place, passed the summary's
/// CRC32C over the blocks (each inode record ends in its own CRC32C, which cancels out of a
/// CRC run over it), so roll-forward applied stale inodes: "directory reached twice",
/// "block 15714 owned by inodes 65 and 88", names of long-returned calls missing. These
/// are the states that failed; with the summary's hash (format version 2) each is the
/// flush not yet committed, and clean.
#[test]
fn a_torn_partial_segment_in_a_reused_segment_is_not_rolled_forward() {
    let e = modes::expectation("lfs-cleaning").unwrap();
    let cases: [(&str, Vec<CrashState>); 2] = [
        (
            "random-5:600",
            vec![
                state(351, (0..4).collect(), None),
                state(351, (0..240).filter(|&i| i != 4).collect(), None),
                state(388, (0..6).collect(), None),
            ],
        ),
        (
            "random-6:600",
            vec![
                state(281, (0..3).collect(), None),
                state(
                    281,
                    (0..3).collect(),
                    Some(Torn {
                        write: 2,
                        sectors: vec![0, 1, 2, 3],
                    }),
                ),
                state(299, (0..7).collect(), None),
            ],
        ),
    ];
    for (name, states) in cases {
        let w = workload::by_name(name).unwrap();
        let rec = workload::record(&w, "lfs-cleaning", &Default::default()).unwrap();
        let c = Checker::new(rec, e.clone()).unwrap();
        // The recording is the one that failed: its log reuses segments the cleaner freed.
        assert!(c.epochs.len() > 388, "{name}: {} epochs", c.epochs.len());
        for st in states {
            let out = c.check_one(&st);
            assert!(
                !out.unexpected(&e),
                "{name} {}: {:?} {:?} {:?}",
                st.describe(&c.epochs),
                out.class,
                out.findings,
                out.violations
            );
        }
    }
}

/// What the workloads written for the log-structured design reach, read off the
/// recordings (every summary block the log writes, decoded): `log-wrap` makes the log wrap
/// round and write segments it wrote before (the cleaner or a checkpoint freed them), in
/// `lfs` and `lfs-cleaning`; `flush-split` makes flushes whose partial segments before the
/// COMMIT carry inode blocks, in both.
#[test]
fn the_designed_workloads_wrap_the_log_and_split_flushes() {
    use cairn_crash::record::{BlockData, Event};
    use cairn_lfs::format::summary::{Kind, Summary};
    for mode in ["lfs", "lfs-cleaning"] {
        let mut reused = 0;
        let mut split = 0;
        for name in ["log-wrap", "flush-split"] {
            let w = workload::by_name(name).unwrap();
            let rec = workload::record(&w, mode, &Default::default()).unwrap();
            let mut serials: std::collections::HashMap<u64, Vec<u64>> = Default::default();
            for ev in &rec.events[rec.header.start..] {
                let Event::Write {
                    block,
                    data: BlockData::Bytes(b),
                    ..
                } = ev
                else {
                    continue;
                };
                let Ok(s) = Summary::decode(b, 1024, u32::MAX) else {
                    continue;
                };
                serials.entry(*block).or_default().push(s.serial);
                if !s.commit() && s.entries.iter().any(|e| e.kind == Kind::Inode) {
                    split += usize::from(name == "flush-split");
                }
            }
            if name == "log-wrap" {
                reused = serials.values().filter(|v| v.len() > 1).count();
            }
        }
        assert!(reused > 0, "{mode}: log-wrap never wrote a segment twice");
        assert!(
            split > 0,
            "{mode}: no partial without COMMIT held an inode block"
        );
        println!(
            "{mode}: log-wrap rewrote {reused} summary blocks; flush-split wrote {split} partial segments with inode blocks and no COMMIT"
        );
    }
}
