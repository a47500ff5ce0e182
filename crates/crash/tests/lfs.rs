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
