#!/usr/bin/env python3
"""Benchmarks of the umbrella policy layer (issue 3), against the raw branch directory and
mergerfs, on the same ext4 file system (a loop image in /var/tmp).

    scripts/bench-umbrella.py [--quick] [--reps N] [--only postmark,create,seq,rules,overflow,oscillation]
    scripts/bench-umbrella.py --only isolation --base OLD-CAIRN [--pin]   # issue 20
    scripts/bench-umbrella.py --only distfs,hang [--pin]                  # issue 20

Needs root, postmark, mergerfs and target/release/cairn. Prints a Markdown report (the
section of docs/BENCHMARKS.md) and writes the raw numbers as JSON next to it
(results/umbrella-<timestamp>.json).

Workloads (Garrison & Reddy, TOS 2009, section 4):
- postmark: the paper's configuration, 12,500 files of 8-64 KiB in 200 directories,
  25,000 transactions (PostMark 1.51, seed 42);
- create: 20,000 0-length files created and each unlinked right after;
- seq: 1 GiB written in 1 MiB requests + fsync, caches dropped, read back;
- rules: PostMark and create over 2 branches with 1 rule and with 32 rules, the worst case
  (no match until the last rule), as in the paper's overhead study;
- overflow: PostMark with the rule's first branch full (a small ext4 image filled up);
- oscillation: 35,000 files of 6.5 KiB; append 1 KiB, truncate 1 KiB, append 1 KiB, with
  the middle round crossing an 8 KiB threshold; time of the crossing rounds with and
  without 1 KiB hysteresis.

Branch isolation and distributed file systems (issue 20):
- isolation: create+unlink and PostMark over two local branches, the layer of --base (a
  `cairn` built from before the isolation) against this one, and this one with every
  branch forced to isolated workers (`isolate = true`), repetitions alternated;
- distfs: create+unlink and PostMark over a local branch plus the GlusterFS volume of
  scripts/distfs/gluster.sh, umbrella beside mergerfs, files placed on the local branch by
  both (mergerfs `category.create=ff`, the local branch first; umbrella: the local branch
  first in every rule); PostMark also beside mergerfs with `moveonenospc=true`, which like
  the layer's default rule moves a file whose write gets ENOSPC (the row's ratios are to
  that one), and the layer with `passthrough_headroom = "1G"`;
- nooverflow: PostMark with the rule's `overflow = false` (a write's ENOSPC reaches the
  program: the layer then passes the file's data through to the kernel) beside mergerfs's
  default, which does not move files either;
- hang: the same two unions; the GlusterFS client is stopped (SIGSTOP) and a file on the
  local branch is read (open, read, close) for 5 s: latencies, and how long a merged
  listing of the root takes (capped at 15 s).
With --pin the daemons run on CPU 1 and the workload on CPU 0 (taskset); with --cpu N all
of them on CPU N (the placement `cairn bench --cpu N` uses).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAIRN = os.environ.get("CAIRN", os.path.join(ROOT, "target/release/cairn"))
PIN_DAEMON = []
PIN_LOAD = []
WORK = "/var/tmp/cairn-umbrella-bench"


def sh(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, **kw)


def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_ext4(name, size):
    img = os.path.join(WORK, name + ".img")
    mnt = os.path.join(WORK, name)
    os.makedirs(mnt, exist_ok=True)
    if os.path.ismount(mnt):
        sh("umount", mnt)
    with open(img, "wb") as f:
        f.truncate(size)
    sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", img)
    sh("mount", "-o", "loop", img, mnt)
    return mnt


def umount(mnt):
    if os.path.ismount(mnt):
        sh(CAIRN, "umount", mnt, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if os.path.ismount(mnt):
        sh("umount", mnt, check=False)
        time.sleep(0.2)


def fresh(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def config(branches, rules=1, extra="", branch_extra="", rule_extra=""):
    """branches: list of (name, path). `rules` metadata rules, all but the last never match
    (uid 4242), the last matches everything: the paper's worst case."""
    t = "[umbrella]\nindex = \"%s\"\n%s\n" % (branches[0][0], extra)
    for n, p in branches:
        t += '[[branch]]\nname = "%s"\npath = "%s"\n%s' % (n, p, branch_extra)
    names = ", ".join('"%s"' % n for n, _ in branches)
    for k in range(rules - 1):
        t += '[[rule]]\nname = "never %d"\nuid = 4242\nbranches = [%s]\n' % (k, names)
    if rules > 0:
        t += '[[rule]]\nname = "last"\ntype = "file"\nbranches = [%s]\n%s' % (names, rule_extra)
    return t


class Target:
    def __init__(self, kind, branches, rules=1, extra="", cairn=None, branch_extra="", rule_extra=""):
        self.kind = kind
        self.branches = branches
        self.rules = rules
        self.extra = extra
        self.branch_extra = branch_extra
        self.rule_extra = rule_extra
        if cairn:
            self.cairn = cairn
        self.mnt = os.path.join(WORK, "mnt-" + kind)

    def mount(self):
        os.makedirs(self.mnt, exist_ok=True)
        umount(self.mnt)
        if not os.path.ismount(self.mnt):
            fresh(self.mnt)  # leftovers of an earlier broken run
        if self.kind == "raw":
            return self.branches[0][1]
        if self.kind.startswith("umbrella"):
            cfg = os.path.join(WORK, self.kind + ".toml")
            with open(cfg, "w") as f:
                f.write(config(self.branches, self.rules, self.extra, self.branch_extra,
                               self.rule_extra))
            opts = os.environ.get("UMBRELLA_OPTS", "")
            sh(*PIN_DAEMON, getattr(self, "cairn", CAIRN), "umbrella",
               *(["-o", opts] if opts else []), cfg, self.mnt)
        elif self.kind.startswith("mergerfs"):
            opts = "allow_other,use_ino,minfreespace=16M,category.create=ff"
            sh(*PIN_DAEMON, "mergerfs", "-o", opts + ("," + self.extra if self.extra else ""),
               ":".join(p for _, p in self.branches), self.mnt)
        return self.mnt

    def unmount(self):
        if self.kind != "raw":
            umount(self.mnt)

    def check(self):
        if self.kind != "raw":
            assert os.path.ismount(self.mnt), "%s is not mounted" % self.mnt


def postmark(dirpath, files=12500, trans=25000, subdirs=200, lo=8192, hi=65536):
    cfg = "\n".join([
        "set location %s" % dirpath,
        "set number %d" % files,
        "set transactions %d" % trans,
        "set subdirectories %d" % subdirs,
        "set size %d %d" % (lo, hi),
        "set read 512", "set write 512", "set buffering false", "set seed 42",
        "run", "quit", ""])
    t = time.monotonic()
    sh(*PIN_LOAD, "postmark", input=cfg.encode(), stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def create_unlink(dirpath, n=20000):
    t = time.monotonic()
    for i in range(n):
        p = os.path.join(dirpath, "f%06d" % i)
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        os.unlink(p)
    return n / (time.monotonic() - t)


def seq(dirpath, target, mib=1024):
    p = os.path.join(dirpath, "seq")
    buf = os.urandom(1 << 20)
    t = time.monotonic()
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    for _ in range(mib):
        os.write(fd, buf)
    os.fsync(fd)
    os.close(fd)
    w = mib / (time.monotonic() - t)
    target.unmount()
    drop_caches()
    p = os.path.join(target.mount(), "w", "seq")
    t = time.monotonic()
    fd = os.open(p, os.O_RDONLY)
    while os.read(fd, 1 << 20):
        pass
    os.close(fd)
    r = mib / (time.monotonic() - t)
    os.unlink(p)
    return w, r


def gluster_client_pid():
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts/distfs/gluster.sh"), "pids"],
                         capture_output=True, text=True).stdout
    for l in out.splitlines():
        if l.startswith("client "):
            return int(l.split()[1])
    raise RuntimeError("no GlusterFS client: " + out)


def hang(t, local, gdir, secs=5.0, cap=15.0):
    """A local file read (open, read, close) again and again while the GlusterFS client is
    stopped, and one merged listing of the root (in a child, killed after `cap` s)."""
    fresh(local)
    fresh(gdir)
    d = t.mount()
    os.makedirs(os.path.join(d, "w"), exist_ok=True)
    with open(os.path.join(d, "w", "local.txt"), "wb") as f:
        f.write(b"x" * 4096)
    with open(os.path.join(d, "remote.txt"), "wb") as f:
        f.write(b"y")
    assert os.path.exists(os.path.join(local, "w", "local.txt")), "not on the local branch"
    pid = gluster_client_pid()
    os.kill(pid, signal.SIGSTOP)
    lat = []
    ls_s = None
    try:
        ls = subprocess.Popen(["ls", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < secs:
            s = time.monotonic()
            with open(os.path.join(d, "w", "local.txt"), "rb") as f:
                f.read()
            lat.append(time.monotonic() - s)
            if ls_s is None and ls.poll() is not None:
                ls_s = time.monotonic() - t0
        if ls_s is None:
            try:
                ls.wait(timeout=max(0.0, cap - (time.monotonic() - t0)))
                ls_s = time.monotonic() - t0
            except subprocess.TimeoutExpired:
                ls.kill()
    finally:
        os.kill(pid, signal.SIGCONT)
    if ls_s is None:
        ls.wait()
    t.unmount()
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(len(lat) * p))] if lat else float("nan")
    r = {"reads": len(lat), "p50_ms": q(0.5) * 1e3, "p99_ms": q(0.99) * 1e3,
         "max_ms": (lat[-1] if lat else float("nan")) * 1e3, "listing_s": ls_s}
    print("hang %s: %s" % (t.kind, r), file=sys.stderr, flush=True)
    return r


def med(v):
    return statistics.median(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--scale", type=float, help="the workloads' scale (--quick is 0.2)")
    ap.add_argument("--only", default="postmark,create,seq,rules,overflow,oscillation")
    ap.add_argument("--base", help="a cairn binary from before the isolation (--only isolation)")
    ap.add_argument("--pin", action="store_true", help="daemons on CPU 1, the workload on CPU 0")
    ap.add_argument("--cpu", type=int, help="daemons and workload together on this CPU (as `cairn bench --cpu`)")
    a = ap.parse_args()
    if a.pin:
        PIN_DAEMON[:] = ["taskset", "-c", "1"]
        PIN_LOAD[:] = ["taskset", "-c", "0"]
        os.sched_setaffinity(0, {0})
    elif a.cpu is not None:
        PIN_DAEMON[:] = ["taskset", "-c", str(a.cpu)]
        PIN_LOAD[:] = ["taskset", "-c", str(a.cpu)]
        os.sched_setaffinity(0, {a.cpu})
    only = set(a.only.split(","))
    scale = a.scale or (0.2 if a.quick else 1.0)
    os.makedirs(WORK, exist_ok=True)
    ext4 = make_ext4("ext4", 8 << 30)
    b1 = os.path.join(ext4, "b1")
    b2 = os.path.join(ext4, "b2")
    res = {"meta": {"kernel": os.uname().release, "reps": a.reps, "quick": a.quick, "pin": a.pin, "cpu": a.cpu,
                    "load_start": os.getloadavg()[0],
                    "mergerfs": subprocess.run(["mergerfs", "-V"], capture_output=True, text=True).stdout.strip()}}
    one = [("b1", b1)]
    targets = [Target("raw", one), Target("umbrella", one), Target("mergerfs", one)]
    pm_files, pm_trans = int(12500 * scale), int(25000 * scale)

    def run(name, fn, tgts):
        out = {t.kind: [] for t in tgts}
        for rep in range(a.reps):
            for t in tgts:
                for _, p in t.branches:
                    fresh(p)
                d = t.mount()
                t.check()
                wd = os.path.join(d, "w")
                os.makedirs(wd, exist_ok=True)
                v = fn(wd, t)
                out[t.kind].append(v)
                t.unmount()
                print("%s rep %d %s: %s" % (name, rep, t.kind, v), file=sys.stderr, flush=True)
        res[name] = out
        return out

    def run_with(name, fn, tgts, clean):
        out = {t.kind: [] for t in tgts}
        for rep in range(a.reps):
            for t in tgts:
                clean()
                d = t.mount()
                t.check()
                wd = os.path.join(d, "w")
                os.makedirs(wd, exist_ok=True)
                v = fn(wd, t)
                out[t.kind].append(v)
                t.unmount()
                print("%s rep %d %s: %s" % (name, rep, t.kind, v), file=sys.stderr, flush=True)
        res[name] = out
        return out

    if "postmark" in only:
        run("postmark_s", lambda d, t: postmark(d, pm_files, pm_trans), targets)
    if "create" in only:
        run("create_per_s", lambda d, t: create_unlink(d, int(20000 * scale)), targets)
    if "seq" in only:
        run("seq_mib_s", lambda d, t: seq(d, t, int(1024 * scale)), targets)
    if "rules" in only:
        two = [("b1", b1), ("b2", b2)]
        rt = [Target("umbrella-2br-1rule", two, 1), Target("umbrella-2br-32rules", two, 32),
              Target("mergerfs-2br", two)]
        run("rules_postmark_s", lambda d, t: postmark(d, pm_files, pm_trans), rt)
        run("rules_create_per_s", lambda d, t: create_unlink(d, int(20000 * scale)), rt)
    if "overflow" in only:
        small = make_ext4("small", 256 << 20)
        fresh(os.path.join(small, "full"))
        # Fill the small branch.
        with open(os.path.join(small, "full", "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        ov = [("full", os.path.join(small, "full")), ("b2", b2)]
        tg = [Target("umbrella-overflow", ov, 1), Target("umbrella", one), Target("raw", one)]
        out = {t.kind: [] for t in tg}
        for rep in range(a.reps):
            for t in tg:
                fresh(b1)
                fresh(b2)
                d = t.mount()
                wd = os.path.join(d, "w")
                os.makedirs(wd, exist_ok=True)
                out[t.kind].append(postmark(wd, pm_files, pm_trans))
                t.unmount()
                print("overflow rep %d %s: %s" % (rep, t.kind, out[t.kind][-1]), file=sys.stderr, flush=True)
        res["overflow_postmark_s"] = out
        sh("umount", small)
    if "oscillation" in only:
        n = int(35000 * scale)
        two = [("fast", b1), ("slow", b2)]
        out = {}
        for margin in ["0", "1K"]:
            extra = ""
            rules = '[[rule]]\nname = "large"\nsize = "> 8K"\nsize_margin = "%s"\nbranches = ["slow"]\n' % margin
            kind = "umbrella-osc-margin-" + margin
            t = Target(kind, two, 0, extra)
            cfg_text = config(two, 0) + rules
            samples = {"append_cross_s": [], "truncate_cross_s": [], "append_plain_s": [], "moves": []}
            for rep in range(a.reps):
                fresh(b1)
                fresh(b2)
                os.makedirs(t.mnt, exist_ok=True)
                umount(t.mnt)
                cfg = os.path.join(WORK, kind + ".toml")
                with open(cfg, "w") as f:
                    f.write(cfg_text)
                sh(CAIRN, "umbrella", cfg, t.mnt)
                d = os.path.join(t.mnt, "w")
                os.makedirs(d)
                base = b"x" * 6656
                for i in range(n):
                    with open(os.path.join(d, "f%05d" % i), "wb") as f:
                        f.write(base)
                kb = b"y" * 1024

                def append_all():
                    t0 = time.monotonic()
                    for i in range(n):
                        with open(os.path.join(d, "f%05d" % i), "ab") as f:
                            f.write(kb)
                    return time.monotonic() - t0

                def trunc_all(size):
                    t0 = time.monotonic()
                    for i in range(n):
                        os.truncate(os.path.join(d, "f%05d" % i), size)
                    return time.monotonic() - t0

                def settle():
                    # Moves run after the last close: wait for them so they count.
                    sh(CAIRN, "umbrella", "status", "--json", t.mnt, stdout=subprocess.DEVNULL)
                    import socket  # noqa: F401
                    q = subprocess.run([CAIRN, "umbrella", "status", "--json", t.mnt], capture_output=True, text=True)
                    while json.loads(q.stdout)["migrations"]["pending"] > 0:
                        time.sleep(0.05)
                        q = subprocess.run([CAIRN, "umbrella", "status", "--json", t.mnt], capture_output=True, text=True)

                # Round 1, not crossing: 6.5 -> 7.5 -> 6.5 -> 7.5.
                t1 = append_all(); settle()
                trunc_all(6656); settle()
                append_all(); settle()
                # Round 2, crossing: 7.5 -> 8.5 -> 7.5 -> 8.5 (with settle inside the timing).
                t0 = time.monotonic(); append_all(); settle(); ta = time.monotonic() - t0
                t0 = time.monotonic(); trunc_all(7680); settle(); tt = time.monotonic() - t0
                t0 = time.monotonic(); append_all(); settle(); ta2 = time.monotonic() - t0
                q = subprocess.run([CAIRN, "umbrella", "status", "--json", t.mnt], capture_output=True, text=True)
                moves = json.loads(q.stdout)["migrations"]["done"]
                samples["append_plain_s"].append(t1)
                samples["append_cross_s"].append((ta + ta2) / 2)
                samples["truncate_cross_s"].append(tt)
                samples["moves"].append(moves)
                umount(t.mnt)
                print("oscillation rep %d margin %s: plain append %.2f s, crossing append %.2f s, truncate %.2f s, %d moves"
                      % (rep, margin, t1, (ta + ta2) / 2, tt, moves), file=sys.stderr, flush=True)
            out[margin] = samples
        res["oscillation"] = out
        res["oscillation_files"] = n

    if "isolation" in only:
        two = [("b1", b1), ("b2", b2)]
        base = a.base or CAIRN
        tg = [Target("umbrella-base", two, 1, cairn=base), Target("umbrella", two, 1),
              Target("umbrella-isolated", two, 1, branch_extra="isolate = true\n")]
        run("isolation_create_per_s", lambda d, t: create_unlink(d, int(20000 * scale)), tg)
        run("isolation_postmark_s", lambda d, t: postmark(d, pm_files, pm_trans), tg)
        res["meta"]["base"] = base
    if "distfs" in only or "hang" in only or "nooverflow" in only:
        gl = subprocess.run(["bash", os.path.join(ROOT, "scripts/distfs/gluster.sh"), "start"],
                            check=True, capture_output=True, text=True).stdout.strip()
        gdir = os.path.join(gl, "bench")
        os.makedirs(gdir, exist_ok=True)
        two = [("local", b1), ("gluster", gdir)]
        # `and`: a listing while the volume hangs shows the local entries.
        tg = [Target("umbrella-gluster", two, 1, extra='errors = "and"'),
              Target("mergerfs-gluster", two)]
        if "nooverflow" in only:
            # Files kept on the local branch without overflow: the layer then hands their
            # data to the kernel (FUSE passthrough), which mergerfs cannot.
            nt = Target("umbrella-gluster-nooverflow", two, 1, extra='errors = "and"',
                        rule_extra="overflow = false\n")
            run_with("distfs_nooverflow_postmark_s", lambda d, t: postmark(d, pm_files, pm_trans),
                     [nt, tg[1]], lambda: (fresh(b1), fresh(gdir)))
        if "distfs" in only:
            def fresh_both():
                fresh(b1)
                fresh(gdir)
            run_fresh = lambda name, fn: run_with(name, fn, tg, fresh_both)
            run_fresh("distfs_create_per_s", lambda d, t: create_unlink(d, int(20000 * scale)))
            # Like for like: mergerfs moves a file whose write gets ENOSPC only with
            # moveonenospc (off by default in 2.33), the layer's default rule overflows.
            mv = Target("mergerfs-gluster-move", two, extra="moveonenospc=true")
            # The layer's overflowing rule with its files passed through while the local
            # branch has 1 GiB of room (docs/UMBRELLA.md, passthrough_headroom).
            hr = Target("umbrella-gluster-headroom", two, 1,
                        extra='errors = "and"\npassthrough_headroom = "1G"')
            run_with("distfs_postmark_s", lambda d, t: postmark(d, pm_files, pm_trans),
                     [tg[0], hr, tg[1], mv], fresh_both)
        if "hang" in only:
            res["hang"] = {t.kind: hang(t, b1, gdir) for t in tg}
        subprocess.run(["bash", os.path.join(ROOT, "scripts/distfs/gluster.sh"), "cleanup"])

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    os.makedirs(os.path.join(ROOT, "results"), exist_ok=True)
    path = os.path.join(ROOT, "results", "umbrella-%s.json" % stamp)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(report(res))
    print("\n(raw numbers: %s)" % path)
    sh("umount", ext4, check=False)


def report(res):
    L = []

    def row(name, d, unit, higher_better, base):
        b = med(d.get(base, [])) if base in d else None
        for k, v in d.items():
            m = med(v)
            ratio = ""
            if b:
                ratio = "%.2f" % ((m / b) if higher_better else (b / m))
            L.append("| %s | %s | %.1f | %.1f | %.1f | %s |" % (name, k, min(v), m, max(v), ratio))

    L.append("| workload | target | min | median | max | speed vs %s |" % "first")
    L.append("|---|---|---|---|---|---|")
    if "postmark_s" in res:
        row("PostMark (s)", res["postmark_s"], "s", False, "raw")
    if "create_per_s" in res:
        row("create+unlink (files/s)", res["create_per_s"], "/s", True, "raw")
    if "seq_mib_s" in res:
        w = {k: [x[0] for x in v] for k, v in res["seq_mib_s"].items()}
        r = {k: [x[1] for x in v] for k, v in res["seq_mib_s"].items()}
        row("seq write+fsync (MiB/s)", w, "", True, "raw")
        row("seq read, cold (MiB/s)", r, "", True, "raw")
    if "rules_postmark_s" in res:
        row("PostMark, 2 branches (s)", res["rules_postmark_s"], "s", False, "umbrella-2br-1rule")
        row("create+unlink, 2 branches (files/s)", res["rules_create_per_s"], "/s", True, "umbrella-2br-1rule")
    if "isolation_create_per_s" in res:
        row("isolation: create+unlink (files/s)", res["isolation_create_per_s"], "/s", True, "umbrella-base")
        row("isolation: PostMark (s)", res["isolation_postmark_s"], "s", False, "umbrella-base")
    if "distfs_nooverflow_postmark_s" in res:
        row("local+GlusterFS: PostMark, no overflow (s)", res["distfs_nooverflow_postmark_s"], "s", False, "mergerfs-gluster")
    if "distfs_create_per_s" in res:
        row("local+GlusterFS: create+unlink (files/s)", res["distfs_create_per_s"], "/s", True, "mergerfs-gluster")
        row("local+GlusterFS: PostMark (s)", res["distfs_postmark_s"], "s", False, "mergerfs-gluster-move"
            if "mergerfs-gluster-move" in res["distfs_postmark_s"] else "mergerfs-gluster")
    if "hang" in res:
        L.append("")
        L.append("| GlusterFS client stopped | local reads in 5 s | p50 (ms) | p99 (ms) | max (ms) | listing of the root |")
        L.append("|---|---|---|---|---|---|")
        for k, h in res["hang"].items():
            ls = "%.2f s" % h["listing_s"] if h["listing_s"] is not None else "> 15 s (still blocked, killed)"
            L.append("| %s | %d | %.2f | %.2f | %.1f | %s |" % (k, h["reads"], h["p50_ms"], h["p99_ms"], h["max_ms"], ls))
    if "overflow_postmark_s" in res:
        row("PostMark, overflow (s)", res["overflow_postmark_s"], "s", False, "raw")
    if "oscillation" in res:
        L.append("")
        L.append("| oscillation (%d files) | plain append (s) | crossing append (s) | crossing truncate (s) | moves |" % res["oscillation_files"])
        L.append("|---|---|---|---|---|")
        for m, s in res["oscillation"].items():
            L.append("| margin %s | %.2f | %.2f | %.2f | %d |" % (
                m, med(s["append_plain_s"]), med(s["append_cross_s"]), med(s["truncate_cross_s"]), med(s["moves"])))
    return "\n".join(L)


if __name__ == "__main__":
    main()
