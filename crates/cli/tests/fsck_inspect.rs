//! `cairn fsck` and `cairn inspect` end to end: exit codes (e2fsck's), text and JSON output,
//! repair, and every inspect view on a real image. No mount needed.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

fn cairn(args: &[&str]) -> Output {
    Command::new(CAIRN).args(args).output().unwrap()
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn mkfs(img: &Path) {
    let o = cairn(&["mkfs", img.to_str().unwrap(), "--size", "32M"]);
    assert!(o.status.success(), "{}", out(&o));
}

#[test]
fn fsck_exit_codes_and_repair() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let s = img.to_str().unwrap();
    mkfs(&img);
    let o = cairn(&["fsck", s]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(out(&o).contains("clean"));
    let o = cairn(&["fsck", "--json", s]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["stats"]["dirs"], 2);
    // Mark a free data block in use in group 0's block bitmap: a leak.
    let mut bytes = fs::read(&img).unwrap();
    bytes[2 * 4096 + 1000 / 8] |= 1 << (1000 % 8);
    fs::write(&img, &bytes).unwrap();
    let o = cairn(&["fsck", "-n", s]);
    assert_eq!(o.status.code(), Some(4), "{}", out(&o));
    assert!(
        out(&o).contains("LEAK: group 0: 1 blocks marked in use but unused"),
        "{}",
        out(&o)
    );
    assert_eq!(fs::read(&img).unwrap(), bytes, "-n wrote to the image");
    let o = cairn(&["fsck", "-y", s]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let o = cairn(&["fsck", s]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    // -y and -n together are refused by the argument parser.
    assert_ne!(cairn(&["fsck", "-y", "-n", s]).status.code(), Some(0));
}

#[test]
fn fsck_operational_errors_exit_8() {
    let dir = tempfile::tempdir().unwrap();
    let zeros = dir.path().join("zeros");
    fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    let o = cairn(&["fsck", zeros.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(8), "{}", out(&o));
    assert!(out(&o).contains("not a cairn file system"), "{}", out(&o));
    let o = cairn(&["fsck", dir.path().join("missing").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(8), "{}", out(&o));
    // One group: no backup superblock to fall back on.
    let img = dir.path().join("img");
    mkfs(&img);
    let mut bytes = fs::read(&img).unwrap();
    bytes[20] ^= 0xff;
    fs::write(&img, &bytes).unwrap();
    let o = cairn(&["fsck", "--json", img.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(8), "{}", out(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["error"].as_str().unwrap().contains("checksum"), "{v}");
}

#[test]
fn inspect_views() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let s = img.to_str().unwrap();
    mkfs(&img);
    for (args, want) in [
        (vec![], "blocks_per_group"),
        (vec!["superblock"], "crc32c"),
        (vec!["group", "0"], "inode bitmap"),
        (vec!["inode", "2"], "direct[ 0]"),
        (vec!["dir", "/"], "\"lost+found\""),
        (vec!["dir", "/lost+found"], "\"..\""),
        (vec!["block", "0"], "CAIRNFFS"),
    ] {
        let mut a = vec!["inspect", s];
        a.extend(&args);
        let o = cairn(&a);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", out(&o));
        assert!(out(&o).contains(want), "{args:?}: {}", out(&o));
    }
    assert_eq!(cairn(&["inspect", s, "frobnicate"]).status.code(), Some(2));
    assert_eq!(
        cairn(&["inspect", s, "dir", "/nope"]).status.code(),
        Some(1)
    );
    assert_eq!(
        cairn(&["inspect", s, "inode", "99999999"]).status.code(),
        Some(1)
    );
}
