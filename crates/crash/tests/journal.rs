//! The journal (`mode=journal`, its log in the image's log area) under the crash harness:
//! a bounded campaign over the scripted workloads must find nothing it forbids (clean after
//! recovery, atomic rename, returned calls durable — for `journal-async` returned fsyncs),
//! and the journal that writes a call's
//! blocks before its log records must be caught in its workload.

use cairn_crash::campaign::{self, CampaignOptions, CampaignResult};
use cairn_crash::planted::JOURNAL_CATALOGUE;
use cairn_crash::workload;

fn quiet(_: campaign::Progress) {}

fn run(mode: &str, workloads: Vec<workload::Workload>, states: usize) -> CampaignResult {
    let opts = CampaignOptions {
        modes: vec![mode.to_string()],
        workloads,
        states,
        threads: 2,
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

#[test]
fn the_journal_delivers_what_it_declares() {
    delivers("journal");
}

/// commit=async: integrity (clean, atomic rename) and fsync, no durability on return.
#[test]
fn the_asynchronous_journal_delivers_what_it_declares() {
    delivers("journal-async");
}

/// commit=group: as `journal` (every returned call durable), its force made after the lock.
#[test]
fn the_group_commit_journal_delivers_what_it_declares() {
    delivers("journal-group");
}

fn delivers(mode: &str) {
    let mut w = workload::scripted_set();
    w.push(workload::by_name("random-1").unwrap());
    let r = run(mode, w, 3000);
    assert!(r.states >= 1500, "only {} states", r.states);
    assert!(r.passed(), "{}", show(&r));
    let (corrupt, leak): (u64, u64) = r
        .cells
        .iter()
        .fold((0, 0), |(c, l), x| (c + x.corrupt, l + x.leak_only));
    assert_eq!((corrupt, leak), (0, 0), "{}", show(&r));
}

#[test]
fn a_journal_writing_before_its_log_is_caught() {
    for p in JOURNAL_CATALOGUE {
        let w = vec![workload::by_name(p.workload).unwrap()];
        let r = run(p.name, w, 1200);
        let caught: u64 = r.cells.iter().map(|c| c.unexpected).sum();
        assert!(
            !r.passed() && caught > 0,
            "planted {} not caught in {} states",
            p.name,
            r.states
        );
    }
}
