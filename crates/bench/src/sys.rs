//! Thin wrappers over the host: running tools, CPU placement, the page cache, mount tables and
//! daemon processes. Everything here is Linux-specific on purpose: the benchmark compares Linux
//! file systems on the machine it runs on.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// Runs `cmd` to completion and returns its stdout; a nonzero exit is an error carrying the
/// command line and the tool's own stderr, which is usually the only useful diagnostic.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether an executable named `name` is on PATH (or is itself a path that exists).
pub fn have_tool(name: &str) -> bool {
    if name.contains('/') {
        return Path::new(name).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// Pins this process (and so every child it starts afterwards: FUSE daemons, postmark) to the
/// given CPUs, and returns the CPU list now in force. Pinning the benchmark and the daemon to
/// the same core makes a FUSE round trip cost two context switches on one CPU rather than a
/// cross-CPU wake-up whose cost depends on what else the shared machine is doing.
pub fn set_cpus(cpus: Option<&[usize]>) -> Result<Vec<usize>> {
    if let Some(cpus) = cpus {
        let mut set = CpuSet::new();
        for &c in cpus {
            set.set(c)
                .with_context(|| format!("CPU {c} out of range"))?;
        }
        sched_setaffinity(Pid::from_raw(0), &set).context("sched_setaffinity")?;
    }
    current_cpus()
}

pub fn current_cpus() -> Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0)).context("sched_getaffinity")?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// `Cpus_allowed_list` of a process, as the kernel prints it (e.g. "0" or "0-1").
pub fn cpus_allowed(pid: u32) -> Option<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

/// Writes dirty data back and empties the page, dentry and inode caches, so that the next
/// reads of any file system (and of the image files under FUSE file systems) hit the device.
pub fn drop_caches() -> Result<()> {
    run(&mut Command::new("sync"))?;
    fs::write("/proc/sys/vm/drop_caches", "3\n")
        .context("writing /proc/sys/vm/drop_caches (needs root)")
}

use cairn_blockdev::lock::unescape as unescape_mount_field;

/// The file-system type mounted at `mnt` (e.g. "ext4", "fuse", "fuse.mergerfs"), if any.
pub fn mounted_fstype(mnt: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo_fstype(&info, mnt)
}

/// Every mount point in a mountinfo text, in mount order (unescaped).
pub fn mount_points(info: &str) -> Vec<PathBuf> {
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|mp| PathBuf::from(unescape_mount_field(mp)))
        .collect()
}

/// The backing file of a loop device (`/dev/loopN`), as the kernel reports it; a backing file
/// deleted since it was attached keeps its old path here.
pub fn loop_backing_file(dev: &str) -> Option<PathBuf> {
    let name = Path::new(dev).file_name()?.to_str()?;
    let s = fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let s = s.trim_end_matches('\n');
    Some(PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(s)))
}

/// Loop devices (`/dev/loopN`) whose backing file lies at or below `dir` (canonical).
pub fn loop_devices_backed_under(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut v: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("loop"))
        .map(|n| format!("/dev/{n}"))
        .filter(|dev| loop_backing_file(dev).is_some_and(|b| b.starts_with(dir)))
        .collect();
    v.sort();
    v
}

fn parse_mountinfo_fstype(info: &str, mnt: &Path) -> Option<String> {
    // mountinfo: id parent maj:min root mountpoint opts [optional...] - fstype source superopts.
    // The last matching line wins: it is the mount on top.
    info.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mp = left.split(' ').nth(4)?;
        (Path::new(&unescape_mount_field(mp)) == mnt)
            .then(|| right.split(' ').next().unwrap_or("").to_string())
    })
}

/// Waits until something is mounted at `mnt`.
pub fn wait_mounted(mnt: &Path, timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    while mounted_fstype(mnt).is_none() {
        if t0.elapsed() > timeout {
            bail!("{} not mounted after {:?}", mnt.display(), timeout);
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The process whose command line names `mnt` as an argument: a FUSE daemon serving it.
/// Used to check the daemon's CPU placement and to wait for it to exit after unmount (a FUSE
/// daemon writes its last dirty blocks after the kernel has already detached the mount).
pub fn find_daemon(mnt: &Path) -> Option<u32> {
    let me = std::process::id();
    let want = mnt.as_os_str().as_encoded_bytes();
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|&b| b == 0).skip(1).any(|a| a == want) {
            return Some(pid);
        }
    }
    None
}

pub use cairn_blockdev::lock::pid_alive;

pub fn wait_pid_exit(pid: u32, timeout: Duration) -> Result<()> {
    let t0 = Instant::now();
    while pid_alive(pid) {
        if t0.elapsed() > timeout {
            bail!("daemon {pid} still running {:?} after unmount", timeout);
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The type of the file system holding `path` as `stat -f` names it ("ext2/ext3", "tmpfs"…).
pub fn fs_type_of(path: &Path) -> Result<String> {
    Ok(
        run(Command::new("stat").args(["-f", "-c", "%T"]).arg(path))?
            .trim()
            .to_string(),
    )
}

/// Bytes available to this user on the file system holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    Some(st.blocks_available().saturating_mul(st.fragment_size()))
}

/// Canonical absolute form of a directory that may not exist yet (created if missing).
pub fn ensure_dir(p: &Path) -> Result<PathBuf> {
    fs::create_dir_all(p).with_context(|| format!("mkdir -p {}", p.display()))?;
    p.canonicalize()
        .with_context(|| format!("canonicalize {}", p.display()))
}

/// The first line of /proc/cpuinfo's "model name", for the record.
pub fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The machine's 1-minute load average (/proc/loadavg), recorded beside every repetition: the
/// machine is shared, and a reader of a result needs to know how busy it was.
pub fn load_avg() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPUs the machine has online, whatever this process is pinned to (a pinned run's own
/// affinity would say 1).
pub fn online_cpus() -> Option<usize> {
    count_cpu_list(&fs::read_to_string("/sys/devices/system/cpu/online").ok()?)
}

/// How many CPUs a kernel CPU list names ("0-1,4,6-7": 5).
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// UTC timestamp `YYYYMMDDTHHMMSSZ` for result directory names (sorts by time as text).
pub fn utc_stamp(unix_secs: u64) -> String {
    let (y, m, d, hh, mm, ss) = cairn_vfs::time::utc_civil(unix_secs as i64);
    format!("{y:04}{m:02}{d:02}T{hh:02}{mm:02}{ss:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0-1,4,6-7"), Some(5));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
    }

    #[test]
    fn utc_stamp_known_dates() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_700_000_000), "20231114T221320Z");
    }

    #[test]
    fn mountinfo_lookup_unescapes_and_takes_topmost() {
        let info = "\
22 1 8:1 / / rw - ext4 /dev/vda rw
40 22 7:0 / /mnt/a\\040b rw,relatime shared:1 - ext4 /dev/loop0 rw
41 40 0:50 / /mnt/a\\040b rw - fuse.mergerfs x rw
";
        assert_eq!(
            parse_mountinfo_fstype(info, Path::new("/mnt/a b")).as_deref(),
            Some("fuse.mergerfs")
        );
        assert_eq!(
            parse_mountinfo_fstype(info, Path::new("/")).as_deref(),
            Some("ext4")
        );
        assert_eq!(parse_mountinfo_fstype(info, Path::new("/mnt")), None);
        assert_eq!(
            mount_points(info),
            [Path::new("/"), Path::new("/mnt/a b"), Path::new("/mnt/a b")]
        );
    }

    #[test]
    fn own_affinity_is_reported() {
        let cpus = current_cpus().unwrap();
        assert!(!cpus.is_empty());
        let listed = cpus_allowed(std::process::id()).unwrap();
        assert!(!listed.is_empty());
    }

    #[test]
    fn daemon_lookup_finds_a_child_by_argument() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30; :", "sh"])
            .arg(dir.path())
            .spawn()
            .unwrap();
        // The child's command line appears in /proc only once its exec has completed.
        let t0 = Instant::now();
        let mut found = None;
        while found.is_none() && t0.elapsed() < Duration::from_secs(5) {
            found = find_daemon(dir.path());
            thread::sleep(Duration::from_millis(10));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, Some(child.id()));
        assert!(!pid_alive(child.id()));
    }
}
