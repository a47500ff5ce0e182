//! The mount(8)/umount(8) helpers: `mount -t cairn IMAGE DIR` runs
//! `/sbin/mount.cairn IMAGE DIR [-sfnv] [-o OPTIONS]`, `mount -t fuse.cairn IMAGE DIR` (the
//! type the mount table shows, and what fstests' FUSE support mounts with) runs
//! `/sbin/mount.fuse.cairn` the same way, and `umount DIR` of a `fuse.cairn`
//! mount runs `/sbin/umount.fuse.cairn DIR [-flnrv]`. All are symlinks to a copy of `cairn`
//! in /usr/local/lib/cairn (`cairn install-helper`; the copy keeps fstab mounts working after
//! the build tree is cleaned), which recognises them by its argv[0] and turns them into
//! `cairn mount` / `cairn umount` (the latter waits for the final flush, which plain
//! umount(2) does not). `mount -t fuse.umbrella CONFIG DIR` and the unmount of such a mount
//! run `mount.fuse.umbrella` / `umount.fuse.umbrella` the same way, turned into
//! `cairn umbrella` / `cairn umount`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// What a helper name stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A mount helper, turned into this `cairn` subcommand (`mount`, `umbrella`).
    Mount(&'static str),
    /// An unmount helper, turned into `cairn umount`.
    Umount,
}

/// Every helper by the name mount(8) and umount(8) run it under (`-t cairn`, `-t
/// fuse.cairn`, `-t fuse.umbrella`; a FUSE mount's type is `fuse.SUBTYPE`).
pub const HELPERS: [(&str, Role); 5] = [
    ("mount.cairn", Role::Mount("mount")),
    ("mount.fuse.cairn", Role::Mount("mount")),
    ("umount.fuse.cairn", Role::Umount),
    ("mount.fuse.umbrella", Role::Mount("umbrella")),
    ("umount.fuse.umbrella", Role::Umount),
];

/// The `cairn` command line a helper invocation (`argv[0]` a name of [`HELPERS`]) stands
/// for, with the helper's name for messages; None when `argv[0]` names no helper.
pub fn translate(argv: &[OsString]) -> Option<(&'static str, Result<Helper, String>)> {
    let name = Path::new(argv.first()?).file_name()?.to_str()?;
    let (name, role) = HELPERS.iter().find(|(n, _)| *n == name)?;
    Some(match role {
        Role::Mount(sub) => (*name, mount_args(argv, sub)),
        Role::Umount => (*name, umount_args(argv)),
    })
}

/// What a helper invocation amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Helper {
    /// Run `cairn` with these arguments (argv[0] included).
    Run(Vec<OsString>),
    /// Exit at once with this code (mount's -f "fake" mode).
    Exit(i32),
}

/// Parsed helper arguments: bare flags, flags with values, positionals.
type Parsed = (Vec<char>, Vec<(char, String)>, Vec<OsString>);

/// Flag clusters like `-sv` and options with attached or separate values (`-oro`, `-o ro`).
fn parse_flags(argv: &[OsString], with_value: &[char]) -> Result<Parsed, String> {
    let (mut flags, mut values, mut pos) = (Vec::new(), Vec::new(), Vec::new());
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if !s.starts_with('-') || s.len() == 1 {
            pos.push(a.clone());
            continue;
        }
        for (i, c) in s[1..].char_indices() {
            if with_value.contains(&c) {
                let rest = &s[1 + i + c.len_utf8()..];
                let v = if rest.is_empty() {
                    it.next()
                        .ok_or(format!("option -{c} needs a value"))?
                        .to_string_lossy()
                        .into_owned()
                } else {
                    rest.to_string()
                };
                values.push((c, v));
                break;
            }
            flags.push(c);
        }
    }
    Ok((flags, values, pos))
}

/// `mount.cairn SOURCE DIR [-sfnvrw] [-o OPTIONS] [-t TYPE]` → `cairn SUB ...` (SUB: `mount`,
/// or `umbrella`, which has no sloppy mode: an option it does not know is refused).
pub fn mount_args(argv: &[OsString], sub: &str) -> Result<Helper, String> {
    let (flags, values, pos) = parse_flags(argv, &['o', 't', 'N'])?;
    let [source, dir] = <[OsString; 2]>::try_from(pos)
        .map_err(|_| "usage: mount.cairn IMAGE DIR [-sfnv] [-o OPTIONS]".to_string())?;
    let mut opts: Vec<String> = Vec::new();
    let mut sloppy = false;
    for f in flags {
        match f {
            'f' => return Ok(Helper::Exit(0)),
            's' => sloppy = true,
            'n' | 'v' => {}
            'r' => opts.push("ro".into()),
            'w' => opts.push("rw".into()),
            c => return Err(format!("unknown flag -{c}")),
        }
    }
    for (c, v) in values {
        match c {
            'o' => opts.push(v),
            'N' => return Err("mount namespaces (-N) are not supported".into()),
            _ => {} // -t cairn: we know.
        }
    }
    let mut out: Vec<OsString> = vec!["cairn".into(), sub.into()];
    if sloppy && sub == "mount" {
        out.push("--sloppy".into());
    }
    let mut opts: Vec<String> = opts.into_iter().filter(|o| !o.is_empty()).collect();
    // mount(8) passes a helper `nodev` and `nosuid` when they are asked for, and drops
    // `dev` and `suid`, its defaults: so, as libfuse's mount.fuse does, their absence means
    // dev and suid (a `user` fstab entry gets nodev,nosuid from mount(8) itself). `cairn
    // mount` run directly keeps FUSE's nodev,nosuid default.
    let given = |o: &str| opts.iter().flat_map(|s| s.split(',')).any(|x| x == o);
    let defaults: Vec<&str> = [("dev", "nodev"), ("suid", "nosuid")]
        .into_iter()
        .filter(|(on, off)| !given(on) && !given(off))
        .map(|(on, _)| on)
        .collect();
    opts.extend(defaults.into_iter().map(String::from));
    if !opts.is_empty() {
        out.push("-o".into());
        out.push(opts.join(",").into());
    }
    out.push(source);
    out.push(dir);
    Ok(Helper::Run(out))
}

/// `umount.fuse.cairn DIR [-flnrv] [-t TYPE]` → `cairn umount [-l] DIR`.
pub fn umount_args(argv: &[OsString]) -> Result<Helper, String> {
    let (flags, values, pos) = parse_flags(argv, &['t', 'N'])?;
    if values.iter().any(|(c, _)| *c == 'N') {
        return Err("mount namespaces (-N) are not supported".into());
    }
    let [dir] = <[OsString; 1]>::try_from(pos)
        .map_err(|_| "usage: umount.fuse.cairn DIR [-l]".to_string())?;
    let mut out: Vec<OsString> = vec!["cairn".into(), "umount".into()];
    if flags.contains(&'l') {
        out.push("--lazy".into());
    }
    out.push(dir);
    Ok(Helper::Run(out))
}

#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    /// Directory for the helpers (where mount(8) looks for them)
    #[arg(long, default_value = "/sbin")]
    pub prefix: PathBuf,
    /// Directory the helpers' copy of this binary goes to, so that a rebuild or
    /// `cargo clean` of the tree it came from cannot break fstab mounts
    #[arg(long, default_value = "/usr/local/lib/cairn")]
    pub lib_dir: PathBuf,
    /// Point the helpers at this binary where it is instead of at a copy (for a binary
    /// already installed in a stable place, as `make install` does)
    #[arg(long)]
    pub link: bool,
}

/// Creates the [`HELPERS`] in PREFIX (`mount.cairn`, `mount.fuse.cairn`,
/// `umount.fuse.cairn`, `mount.fuse.umbrella`, `umount.fuse.umbrella`), symlinks to a copy of this
/// binary in `LIB_DIR` (or, with `--link`, to this binary itself), and says where.
pub fn install(args: InstallArgs) -> Result<i32> {
    let exe = std::env::current_exe().context("cannot find the cairn binary")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    // A relative directory would make relative symlinks that resolve against /sbin.
    let lib_dir = std::path::absolute(&args.lib_dir)
        .with_context(|| format!("bad directory {}", args.lib_dir.display()))?;
    let target = if args.link {
        exe
    } else {
        std::fs::create_dir_all(&lib_dir)
            .with_context(|| format!("cannot create {}", lib_dir.display()))?;
        let copy = lib_dir.join("cairn");
        if copy != exe {
            // Copy beside, then rename: a mount starting meanwhile runs the old binary or
            // the new one, never half of one.
            let tmp = lib_dir.join(format!(".cairn.{}", std::process::id()));
            std::fs::copy(&exe, &tmp)
                .with_context(|| format!("cannot copy {} to {}", exe.display(), tmp.display()))?;
            std::fs::rename(&tmp, &copy)
                .with_context(|| format!("cannot install {}", copy.display()))?;
        }
        println!("{} (a copy of {})", copy.display(), exe.display());
        copy
    };
    std::fs::create_dir_all(&args.prefix)
        .with_context(|| format!("cannot create {}", args.prefix.display()))?;
    for (name, _) in HELPERS {
        let link = args.prefix.join(name);
        match replace_symlink(&target, &link)? {
            Some(old) if old != target => println!(
                "{} -> {} (replaced a link to {})",
                link.display(),
                target.display(),
                old.display()
            ),
            _ => println!("{} -> {}", link.display(), target.display()),
        }
    }
    Ok(0)
}

/// Points `link` at `target`; returns where an existing symlink pointed (so the caller can
/// say what it replaced). A file that is not a symlink is never replaced.
fn replace_symlink(target: &Path, link: &Path) -> Result<Option<PathBuf>> {
    let old = match std::fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => {
            let old = std::fs::read_link(link).ok();
            std::fs::remove_file(link)?;
            old
        }
        Ok(_) => bail!(
            "{} exists and is not a symlink; not replacing it",
            link.display()
        ),
        Err(_) => None,
    };
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot create {}", link.display()))?;
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount_helper_translates_like_mount_dot_fuse() {
        assert_eq!(
            mount_args(
                &v(&["mount.cairn", "/img", "/mnt", "-o", "rw,mode=async", "-n"]),
                "mount"
            ),
            Ok(Helper::Run(v(&[
                "cairn",
                "mount",
                "-o",
                "rw,mode=async,dev,suid",
                "/img",
                "/mnt"
            ])))
        );
        assert_eq!(
            mount_args(
                &v(&["mount.cairn", "-sv", "-oro", "/img", "/mnt", "-t", "cairn"]),
                "mount"
            ),
            Ok(Helper::Run(v(&[
                "cairn",
                "mount",
                "--sloppy",
                "-o",
                "ro,dev,suid",
                "/img",
                "/mnt"
            ])))
        );
        // mount(8) passes nodev and nosuid when asked for (and drops dev and suid).
        assert_eq!(
            mount_args(
                &v(&["mount.cairn", "/img", "/mnt", "-o", "rw,nodev,nosuid"]),
                "mount"
            ),
            Ok(Helper::Run(v(&[
                "cairn",
                "mount",
                "-o",
                "rw,nodev,nosuid",
                "/img",
                "/mnt"
            ])))
        );
        assert_eq!(
            mount_args(&v(&["mount.cairn", "/img", "/mnt", "-f"]), "mount"),
            Ok(Helper::Exit(0))
        );
        assert!(mount_args(&v(&["mount.cairn", "/img"]), "mount").is_err());
        assert!(mount_args(&v(&["mount.cairn", "/img", "/mnt", "-o"]), "mount").is_err());
    }

    /// `mount -t fuse.umbrella CONFIG DIR`: the umbrella layer's helper gets dev and suid
    /// as a disk file system does (generic/184's device node), no sloppy mode, and its
    /// unmount helper waits for the daemon as `cairn umount` does.
    #[test]
    fn umbrella_helpers_translate_to_cairn_umbrella() {
        assert_eq!(
            translate(&v(&[
                "/sbin/mount.fuse.umbrella",
                "/c.toml",
                "/mnt",
                "-s",
                "-o",
                "rw"
            ]))
            .map(|(n, h)| (n, h.unwrap())),
            Some((
                "mount.fuse.umbrella",
                Helper::Run(v(&[
                    "cairn",
                    "umbrella",
                    "-o",
                    "rw,dev,suid",
                    "/c.toml",
                    "/mnt"
                ]))
            ))
        );
        assert_eq!(
            translate(&v(&["umount.fuse.umbrella", "/mnt"])).map(|(_, h)| h.unwrap()),
            Some(Helper::Run(v(&["cairn", "umount", "/mnt"])))
        );
        assert!(translate(&v(&["cairn", "mount"])).is_none());
        // Every mount helper's subcommand is one `cairn` has.
        for (name, role) in HELPERS {
            if let Role::Mount(sub) = role {
                assert!(["mount", "umbrella"].contains(&sub), "{name}");
            }
        }
    }

    #[test]
    fn umount_helper_keeps_lazy() {
        assert_eq!(
            umount_args(&v(&["umount.fuse.cairn", "/mnt", "-l", "-t", "fuse.cairn"])),
            Ok(Helper::Run(v(&["cairn", "umount", "--lazy", "/mnt"])))
        );
        assert!(umount_args(&v(&["umount.fuse.cairn"])).is_err());
    }
}
