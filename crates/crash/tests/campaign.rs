//! Bounded campaigns: CI's guard that every mode delivers what it declares (a few thousand
//! crash states over the scripted workloads, `sync` and `async`), and proof that the
//! checker can fail: deliberately broken modes must be caught.

use cairn_crash::campaign::{self, CampaignOptions, CampaignResult};
use cairn_crash::modes::{DIRENT_FIRST, LAZY_RETURN};
use cairn_crash::workload;

fn quiet(_: campaign::Progress) {}

fn run(
    modes: &[&str],
    workloads: Vec<workload::Workload>,
    states: usize,
    repro: Option<&std::path::Path>,
) -> CampaignResult {
    let opts = CampaignOptions {
        modes: modes.iter().map(|s| s.to_string()).collect(),
        workloads,
        states,
        threads: 2,
        repro_dir: repro.map(|p| p.to_path_buf()),
        ..Default::default()
    };
    campaign::run(&opts, &quiet).expect("campaign runs")
}

fn show(r: &CampaignResult) -> String {
    let mut s = r.markdown();
    for c in &r.cells {
        for f in c.failures.iter().take(2) {
            s.push_str(&format!("\n{} / {}: {f}", c.mode, c.workload));
        }
    }
    s
}

/// The CI campaign: sync must show no corruption and no durability violation; async must
/// show its corruption (the baseline's weakness is demonstrated, not hidden).
#[test]
fn sync_and_async_deliver_what_they_declare() {
    let mut w = workload::scripted_set();
    w.push(workload::by_name("random-1").unwrap());
    w.push(workload::by_name("random-2").unwrap());
    let r = run(&["sync", "async"], w, 4000, None);
    assert!(r.states >= 2500, "only {} states", r.states);
    let async_corrupt: u64 = r
        .cells
        .iter()
        .filter(|c| c.mode == "async")
        .map(|c| c.corrupt)
        .sum();
    assert!(
        async_corrupt > 0,
        "async showed no corruption:\n{}",
        show(&r)
    );
    assert!(r.passed(), "{}", show(&r));
}

/// A mode claiming sync's guarantees that writes a new entry before its inode is caught as
/// corruption: the campaign fails, and the reproducer it saved replays to the same failure.
#[test]
fn a_mode_writing_the_entry_before_the_inode_is_caught_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let w = vec![
        workload::by_name("create").unwrap(),
        workload::by_name("mkdir").unwrap(),
    ];
    let r = run(&[DIRENT_FIRST], w, 300, Some(dir.path()));
    assert!(!r.passed());
    let corrupt: u64 = r.cells.iter().map(|c| c.corrupt).sum();
    assert!(corrupt > 0, "{}", show(&r));
    assert!(
        r.cells
            .iter()
            .flat_map(|c| &c.failures)
            .any(|f| f.contains("has free inode")),
        "{}",
        show(&r)
    );
    let repro = r
        .cells
        .iter()
        .flat_map(|c| &c.reproducers)
        .next()
        .expect("a reproducer");
    let (_, _, out, failing) = campaign::replay(std::path::Path::new(repro)).unwrap();
    assert!(failing, "reproducer {repro} no longer fails: {out:?}");
}

/// A mode whose calls return before their last step is flushed is caught by the durability
/// oracle (fsck alone cannot see it: its states are consistent).
#[test]
fn a_mode_returning_before_its_flush_breaks_durability() {
    let w = vec![
        workload::by_name("unlink").unwrap(),
        workload::by_name("rename-file").unwrap(),
        workload::by_name("hardlinks").unwrap(),
    ];
    let r = run(&[LAZY_RETURN], w, 300, None);
    let v: u64 = r.cells.iter().map(|c| c.durability_violations).sum();
    assert!(v > 0, "{}", show(&r));
    assert!(!r.passed());
}
