//! `cairn help mount`'s list of modes and options, generated from the lists each layer keeps
//! beside its parser: the registry's formats and modes (`cairn_fstypes`), each mode's and
//! format's options, the disk model's presets, the FUSE adapter's options and the
//! command's own. Nothing here names a mode or an option: a new one shows up by being
//! registered, and the tests below fail if one is left out or one listed is not parsed.

use cairn_vfs::options::OptionSpec;

/// Width of the help text, and the column option descriptions start in.
const WIDTH: usize = 92;
const COLUMN: usize = 24;

/// The options `cairn mount` takes itself, before the FUSE adapter and the format see
/// them (`parse_options` and `run`).
pub const COMMAND_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        key: "ro",
        values: "",
        default: "",
        help: "read-only (rw, the default: read-write)",
    },
    OptionSpec {
        key: "sync",
        values: "",
        default: "",
        help: "as mode=sync; `async` as mode=async (fstab's generic flags)",
    },
    OptionSpec {
        key: "remount",
        values: "",
        default: "",
        help: "with ro/rw, (no)suid, (no)dev, (no)exec, noatime: change the flags of a mount in place (mount -o remount,ro MNT); other options are kept",
    },
    OptionSpec {
        key: "logfile",
        values: "PATH",
        default: "",
        help: "the daemon's log file (log=/ABSOLUTE/PATH still works, with a warning: log= belongs to the journal modes)",
    },
    OptionSpec {
        key: "record",
        values: "PATH",
        default: "",
        help: "record every block write (with contents), flush and operation to PATH (JSON lines; the image is first copied to PATH.base) for `cairn crash run --recording PATH`",
    },
];

const TAIL: &str = "\
Options mount(8) passes (defaults, auto, noauto, user, users, nofail, _netdev, x-*, ...)
are ignored.

The daemon logs to RUNTIME/<mount point>.log, where RUNTIME is /run/cairn for root
($XDG_RUNTIME_DIR/cairn or /tmp/cairn-UID otherwise; $CAIRN_RUNTIME_DIR overrides); with
-f it logs to stderr. RUST_LOG sets the level (default info). Its pid file and control
socket (used by `cairn umount` and `cairn stats`) live in the same directory.
SIGTERM or SIGINT makes the daemon flush everything, unmount and exit 0.";

/// The text after `cairn mount --help`'s usage.
pub fn text() -> String {
    let mut out = String::new();
    let types = cairn_fstypes::types();
    let names: Vec<_> = types.iter().map(|t| t.name).collect();
    out += &format!(
        "Modes (-o mode=NAME), by format (chosen at mkfs: cairn mkfs --format {}):\n",
        names.join("|")
    );
    for t in types {
        entry(&mut out, 2, &format!("{}:", t.name), t.description);
        for (i, m) in (t.modes)().iter().enumerate() {
            let name = if i == 0 {
                format!("{} (default)", m.name)
            } else {
                m.name.to_string()
            };
            entry(&mut out, 4, &name, m.description);
            entry(&mut out, 4, "", &format!("promise: {}", m.promise()));
            for o in m.options {
                entry(&mut out, 6, &o.usage(), &described(o));
            }
        }
    }
    for t in types {
        out += &format!("\nOptions of the {} format:\n", t.name);
        list(&mut out, t.options);
    }
    out += "\nOptions of every format:\n";
    let presets: Vec<_> = cairn_blockdev::disk::presets()
        .iter()
        .map(|p| p.name)
        .collect();
    let disk = cairn_fstypes::DISK;
    entry(
        &mut out,
        2,
        &disk.usage(),
        &format!("{} (presets: {})", described(&disk), presets.join(", ")),
    );
    out += "\nFUSE options (every format; yes|no options also take on|off, 1|0):\n";
    list(&mut out, cairn_fuse::OPTIONS);
    out += "\nOptions of the command:\n";
    list(&mut out, COMMAND_OPTIONS);
    out += "\n";
    out += TAIL;
    out
}

/// The option's help with its default, when it has one.
fn described(o: &OptionSpec) -> String {
    if o.default.is_empty() {
        o.help.to_string()
    } else {
        format!("{} (default {})", o.help, o.default)
    }
}

fn list(out: &mut String, options: &[OptionSpec]) {
    for o in options {
        entry(out, 2, &o.usage(), &described(o));
    }
}

/// One `name  text` entry, `name` indented by `indent`, `text` from [`COLUMN`] and wrapped
/// to [`WIDTH`] (on the next line when `name` reaches the column).
fn entry(out: &mut String, indent: usize, name: &str, text: &str) {
    let mut line = format!("{:indent$}{name}", "");
    if line.len() + 2 > COLUMN {
        out.push_str(&line);
        out.push('\n');
        line.clear();
    }
    let mut first = true;
    for word in text.split_whitespace() {
        let room = if first { COLUMN } else { line.len() + 1 };
        if !first && room + word.len() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line.clear();
            first = true;
        }
        if first {
            line = format!("{line:COLUMN$}{word}");
            first = false;
        } else {
            line.push(' ');
            line.push_str(word);
        }
    }
    out.push_str(&line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every registered format, mode and option — the formats', the modes', the disk
    /// model's presets, the adapter's, the command's — is in the help, and no line is wider
    /// than the help's width.
    #[test]
    fn the_help_names_every_registered_mode_and_option() {
        let h = text();
        for t in cairn_fstypes::types() {
            assert!(h.contains(&format!("  {}:", t.name)), "format {}", t.name);
            for o in t.options {
                assert!(h.contains(&o.usage()), "{} option {}", t.name, o.key);
            }
        }
        for m in cairn_fstypes::modes() {
            assert!(
                h.contains(&format!("    {}", m.name())),
                "mode {}",
                m.name()
            );
            assert!(h.contains(m.spec.description.split_whitespace().next().unwrap()));
            for o in m.spec.options {
                assert!(h.contains(&o.usage()), "mode {} option {}", m.name(), o.key);
            }
        }
        for p in cairn_blockdev::disk::presets() {
            assert!(h.contains(p.name), "disk preset {}", p.name);
        }
        for o in cairn_fuse::OPTIONS.iter().chain(COMMAND_OPTIONS) {
            assert!(h.contains(&o.usage()), "option {}", o.key);
        }
        for l in h.lines() {
            assert!(l.chars().count() <= WIDTH, "too wide: {l}");
        }
    }

    /// Each format's listed options, and each mode's, are taken by its parser with their
    /// defaults (a mode's with the mode chosen): the help lists no option a mount refuses.
    #[test]
    fn every_listed_option_is_accepted() {
        for m in cairn_fstypes::modes() {
            let fs = m.fs;
            let mut opts = vec![("mode".to_string(), Some(m.name().to_string()))];
            for o in m.spec.options.iter().filter(|o| !o.default.is_empty()) {
                (fs.check_option)(o.key, Some(o.default))
                    .unwrap_or_else(|e| panic!("{} {}: {e}", m.name(), o.key));
                opts.push((o.key.to_string(), Some(o.default.to_string())));
            }
            (fs.check_options)(&opts, false)
                .unwrap_or_else(|e| panic!("{}: {opts:?}: {e}", m.name()));
            for o in fs.options.iter().filter(|o| o.key != "mode") {
                let v = (!o.default.is_empty()).then_some(o.default);
                if v.is_some() || o.values.is_empty() {
                    (fs.check_option)(o.key, v)
                        .unwrap_or_else(|e| panic!("{} {}: {e}", fs.name, o.key));
                }
            }
        }
        let fs = cairn_fstypes::types()[0];
        for o in COMMAND_OPTIONS.iter().filter(|o| o.key != "remount") {
            let v = (!o.values.is_empty()).then_some("/tmp/x");
            let item = match v {
                Some(v) => format!("{}={v}", o.key),
                None => o.key.to_string(),
            };
            crate::mount::parse_options(&[item], false, fs)
                .unwrap_or_else(|e| panic!("command option {}: {e}", o.key));
        }
    }
}
