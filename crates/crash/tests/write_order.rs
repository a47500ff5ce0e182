//! The golden write order: what `sync` and `async` write, to which blocks, between which
//! flushes, call by call, for every scripted workload and two random ones.
//!
//! Stricter than a crash campaign and fully deterministic (recordings are: see
//! `recordings_are_deterministic`): any change to the engine or a strategy that moves a
//! write to another epoch, adds or drops a flush, or writes another block shows here as a
//! diff against `tests/write_order.golden`. An intended change is re-blessed with
//! `CAIRN_BLESS=1 cargo test -p cairn-crash --test write_order`, and the commit that does
//! so says why the order changed.
//!
//! Each line is one call (`b<id> <op>` … `e<id> <errno>`), or the writes of one stretch
//! between two events (`w <block> <block> …`, in issue order), or a flush (`f`). Contents
//! are not compared: inode blocks and the superblock carry timestamps.

use cairn_crash::record::Event;
use cairn_crash::workload;

const GOLDEN: &str = "tests/write_order.golden";

/// The recording of `workload` in `mode`, reduced to its shape.
fn shape(workload: &str, mode: &str) -> Vec<String> {
    let w = workload::by_name(workload).unwrap();
    let rec = workload::record(&w, mode, &Default::default())
        .unwrap_or_else(|e| panic!("{workload} in {mode}: {e}"));
    let mut out = vec![format!("== {mode} {workload}")];
    let mut writes: Vec<String> = Vec::new();
    let flush_writes = |out: &mut Vec<String>, writes: &mut Vec<String>| {
        if !writes.is_empty() {
            out.push(format!("w {}", writes.join(" ")));
            writes.clear();
        }
    };
    for e in &rec.events {
        match e {
            Event::Write { block, .. } => writes.push(block.to_string()),
            Event::Flush => {
                flush_writes(&mut out, &mut writes);
                out.push("f".into());
            }
            Event::LogFlush => {
                flush_writes(&mut out, &mut writes);
                out.push("lf".into());
            }
            Event::Begin { id, op } => {
                flush_writes(&mut out, &mut writes);
                let mut v = serde_json::to_value(op).unwrap();
                if let Some(m) = v.as_object_mut()
                    && let Some(d) = m.remove("data")
                {
                    let len = d.as_str().map_or(0, str::len);
                    m.insert("b64".into(), len.into());
                }
                out.push(format!("b{id} {v}"));
            }
            Event::End { id, result } => {
                flush_writes(&mut out, &mut writes);
                out.push(format!("e{id} {}", result.errno));
            }
        }
    }
    flush_writes(&mut out, &mut writes);
    out
}

#[test]
fn sync_and_async_write_in_the_golden_order() {
    let mut names: Vec<String> = workload::scripted_set()
        .into_iter()
        .map(|w| w.name)
        .collect();
    names.push("random-1".into());
    names.push("random-2".into());
    let mut got = Vec::new();
    for mode in ["sync", "async"] {
        for name in &names {
            got.extend(shape(name, mode));
        }
    }
    let got = got.join("\n") + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN);
    if std::env::var_os("CAIRN_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with CAIRN_BLESS=1)", path.display()));
    if got != want {
        let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
        let at = g
            .iter()
            .zip(&w)
            .position(|(a, b)| a != b)
            .unwrap_or(g.len().min(w.len()));
        // The workload the first difference is in, and a few lines around it.
        let section = w[..at.min(w.len())]
            .iter()
            .rev()
            .find(|l| l.starts_with("== "))
            .copied()
            .unwrap_or("(start)");
        let lo = at.saturating_sub(3);
        panic!(
            "write order differs from {GOLDEN} at line {} (in {section}):\n--- golden\n{}\n--- now\n{}\n\
             (an intended change: re-bless with CAIRN_BLESS=1 and say why in the commit)",
            at + 1,
            w[lo..(at + 4).min(w.len())].join("\n"),
            g[lo..(at + 4).min(g.len())].join("\n"),
        );
    }
}
