//! The journal (`mode=journal`, its log in the image's log area, or on a device of its own
//! for `journal-2sync`, `journal-2async` and `journal-2group`) under the crash harness: a bounded campaign
//! over the scripted workloads must find nothing it forbids (clean after recovery, atomic
//! rename, returned calls durable — for the asynchronous ones returned fsyncs), and the
//! journals that write a call's blocks before its log records, or force the log by
//! flushing the wrong device, must be caught in their workload. The last must be caught
//! only because a flush makes only its own device's writes durable: a model that let one
//! device's flush cover the other's writes misses it.

use cairn_crash::campaign::{self, CampaignOptions, CampaignResult};
use cairn_crash::planted::JOURNAL_CATALOGUE;
use cairn_crash::record::{Event, Recording};
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

/// The journal with its log on a device of its own (001's LFFS-wafs-2sync): the same
/// promises as `journal`, over two devices whose flushes say nothing about each other.
#[test]
fn the_journal_with_a_log_device_delivers_what_it_declares() {
    delivers("journal-2sync");
}

/// LFFS-wafs-2async: `journal-async`'s promises with the log on its own device.
#[test]
fn the_asynchronous_journal_with_a_log_device_delivers_what_it_declares() {
    delivers("journal-2async");
}

/// Group commit with the log on its own device: `journal-group`'s promises.
#[test]
fn the_group_commit_journal_with_a_log_device_delivers_what_it_declares() {
    delivers("journal-2group");
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

/// The wrong crash model: a flush of either device taken as a flush of both (every flush
/// followed at once by one of the other device, so the per-device model sees a shared one).
fn one_flush_for_both(rec: &Recording) -> Recording {
    let mut out = rec.clone();
    out.events.clear();
    for (i, e) in rec.events.iter().enumerate() {
        if i == rec.header.start {
            out.header.start = out.events.len();
        }
        out.events.push(e.clone());
        match e {
            Event::Flush => out.events.push(Event::LogFlush),
            Event::LogFlush => out.events.push(Event::Flush),
            _ => {}
        }
    }
    out
}

/// Checks a recording (saved and loaded as `cairn crash run --recording` would): the
/// unexpected states and the states checked.
fn check_recording(rec: &Recording, dir: &std::path::Path, name: &str) -> (u64, u64) {
    let p = dir.join(format!("{name}.jsonl"));
    rec.save(&p).unwrap();
    let opts = CampaignOptions {
        modes: Vec::new(),
        workloads: Vec::new(),
        recordings: vec![p],
        states: 600,
        threads: 2,
        ..Default::default()
    };
    let r = campaign::run(&opts, &quiet).expect("campaign runs");
    (r.cells.iter().map(|c| c.unexpected).sum(), r.states)
}

/// Two devices, one crash model per device. A journal whose log "force" flushes the file
/// system's device leaves its log records volatile while the home blocks written after it
/// become durable: write-ahead broken, and returned calls lost. The harness catches it, and
/// catches it only because its flushes are per device — with a flush of either device taken
/// for both (the broken model) the same recording passes. The real journal passes both.
/// (`journal-2sync-write-before-log` is caught under either model: its home blocks and its
/// log records are written in one epoch, before the log's flush.)
#[test]
fn only_a_per_device_crash_model_catches_a_log_forced_on_the_wrong_device() {
    let dir = tempfile::tempdir().unwrap();
    let create = workload::by_name("create").unwrap();
    let mut lines = Vec::new();
    let mut got = std::collections::HashMap::new();
    for mode in [
        "journal-2sync",
        "journal-2sync-force-flushes-home",
        "journal-2sync-write-before-log",
    ] {
        let rec = workload::record(&create, mode, &Default::default()).unwrap();
        assert!(rec.header.log_blocks > 0, "{mode}: one device recorded");
        for (model, r) in [
            ("per-device", rec.clone()),
            ("shared", one_flush_for_both(&rec)),
        ] {
            let (bad, states) = check_recording(&r, dir.path(), &format!("{mode}-{model}"));
            assert!(states >= 200, "{mode} {model}: only {states} states");
            lines.push(format!(
                "{mode}, {model} flushes: {bad} unexpected of {states}"
            ));
            got.insert((mode, model), bad);
        }
    }
    let msg = lines.join("\n");
    println!("{msg}");
    assert_eq!(got[&("journal-2sync", "per-device")], 0, "{msg}");
    assert_eq!(got[&("journal-2sync", "shared")], 0, "{msg}");
    assert!(
        got[&("journal-2sync-force-flushes-home", "per-device")] > 0,
        "{msg}"
    );
    assert_eq!(
        got[&("journal-2sync-force-flushes-home", "shared")],
        0,
        "{msg}"
    );
    assert!(
        got[&("journal-2sync-write-before-log", "per-device")] > 0,
        "{msg}"
    );
}

/// A two-device reproducer (the recording cut at the state's epoch, both devices' events
/// and the log device's size in its header) replays to the same failure.
#[test]
fn a_two_device_reproducer_replays() {
    let dir = tempfile::tempdir().unwrap();
    let opts = CampaignOptions {
        modes: vec!["journal-2sync-force-flushes-home".into()],
        workloads: vec![workload::by_name("create").unwrap()],
        states: 300,
        threads: 2,
        repro_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let r = campaign::run(&opts, &quiet).expect("campaign runs");
    assert!(!r.passed(), "{}", show(&r));
    let repro = r
        .cells
        .iter()
        .flat_map(|c| &c.reproducers)
        .next()
        .expect("a reproducer");
    let (c, _, out, failing) = campaign::replay(std::path::Path::new(repro)).unwrap();
    assert!(c.rec.header.log_blocks > 0);
    assert!(failing, "reproducer {repro} no longer fails: {out:?}");
}
