#!/usr/bin/env python3
"""Run a command under a memory and a time limit; find the longest sequence a command trains (issue 29).

Shared by bench/long_sequence_memory.sh, bench/cp_overlap.sh and bench/torch_long_sequence.py; standard library
only, so any python3 runs it.

  limited_run.py run [LIMITS] [--stdout F] [--stderr F] [--report F.json] -- COMMAND ...
      Runs COMMAND once. Exit status: COMMAND's (0 when it passed), 3 when it went over the memory limit, 124 on the
      time limit. The report (JSON) holds status (ok, over_memory, timeout, failed), rc, wall_s, the sampled peak
      resident memory of COMMAND's whole process tree (peak_tree_rss_mib) and the limits.

  limited_run.py longest --granule G [--start S] [--max-seq M] [LIMITS] [--log-dir D] [--report F.json] -- COMMAND ...
      Searches the longest sequence (a multiple of G) for which COMMAND, with every "{seq}" in its arguments replaced
      by the sequence, exits 0: doubling from S (default 4096, rounded down to a multiple of G) until a try fails
      (halving instead when S fails), then bisecting between the longest pass and the shortest failure down to G.
      Each try's output goes to D/try-SEQ.out and .err. Prints one line per try to stderr and the result as JSON.

LIMITS: --mem-limit SIZE (default 22G; K, M, G, T suffixes are powers of 1024, plain numbers bytes), --time-limit
SECONDS (default 1800) and --method:
  systemd  systemd-run --scope -p MemoryMax=SIZE -p MemorySwapMax=0: the kernel's own accounting (needs a systemd
           user or system manager; refused in containers without one);
  watch    this program samples the resident memory of the whole process tree every --poll seconds (default 0.05)
           and kills the tree (SIGKILL) when the sum goes over the limit. An allocation faster than the sampling can
           overshoot by what it touches in one interval;
  prlimit  RLIMIT_AS (what prlimit --as sets) on the command: it limits address space, not resident memory, and a
           troupe process reserves far more than it touches (thread stacks, malloc arenas: 2.9 GB of address space
           for 213 MB resident at cp 4, hidden 64), so it fails earlier than the limit suggests; worse, OpenBLAS's
           blas_memory_alloc retries a refused 128 MiB buffer forever (seen: troupe at cp 4 under a 1 GiB RLIMIT_AS
           spinning at 100% CPU), so such a try ends only at the time limit;
  none     no limit (the peak is still sampled);
  auto     (default) systemd when a probe scope starts, else watch.
Whatever the method, the tree's peak resident memory is sampled. The time limit sends SIGTERM to the tree, then
SIGKILL 10 s later.
"""

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def parse_size(text):
    """'22G', '22GiB', '512M', '1.5T', '1000000' -> bytes (suffixes are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 22G, 512M, 1073741824)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def size_text(n):
    return f"{n / (1 << 30):.3g} GiB" if n >= (1 << 30) else f"{n / (1 << 20):.0f} MiB"


def systemd_usable():
    try:
        r = subprocess.run(["systemd-run", "--scope", "--quiet", "-p", "MemoryMax=256M", "true"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def resolve_method(method):
    if method == "auto":
        return "systemd" if systemd_usable() else "watch"
    if method == "systemd" and not systemd_usable():
        sys.exit("limited_run.py: --method systemd: `systemd-run --scope -p MemoryMax=...` does not work here "
                 "(no systemd manager); use --method watch")
    return method


def process_table():
    """{pid: (ppid, rss_bytes)} of every process whose /proc/PID/stat is readable."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid ... ; rss is field 24
        try:
            table[int(name)] = (int(rest[1]), int(rest[21]) * PAGE)
        except (IndexError, ValueError):
            continue
    return table


def tree(root, table):
    """root and its descendants in table."""
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def kill_tree(root, sig):
    pids = tree(root, process_table())
    try:
        os.killpg(root, sig)  # the command's own process group (it starts a new session)
    except OSError:
        pass
    for pid in pids:  # and anything that left the group
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def run_limited(cmd, mem_limit, time_limit, method, stdout=None, stderr=None, poll=0.05):
    """Runs cmd (a list) under the limits; method already resolved. Returns the report dict."""
    argv = list(cmd)
    preexec = None
    if method == "systemd":
        argv = ["systemd-run", "--scope", "--quiet", "-p", f"MemoryMax={mem_limit}", "-p", "MemorySwapMax=0",
                "--"] + argv
    elif method == "prlimit":
        def preexec():
            resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    out = open(stdout, "wb") if stdout else None
    err = open(stderr, "wb") if stderr else None
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True, preexec_fn=preexec)
    status, peak, term_at = None, 0, None

    def forward_signal(signum, _frame):  # stopping this program stops the command too
        kill_tree(proc.pid, signal.SIGKILL)
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, forward_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while proc.poll() is None:
            table = process_table()
            rss = sum(table[p][1] for p in tree(proc.pid, table))
            peak = max(peak, rss)
            now = time.monotonic()
            if method == "watch" and rss > mem_limit and status is None:
                status = "over_memory"
                kill_tree(proc.pid, signal.SIGKILL)
            elif time_limit > 0 and now - start > time_limit and status is None:
                status, term_at = "timeout", now
                kill_tree(proc.pid, signal.SIGTERM)
            elif term_at is not None and now - term_at > 10:
                kill_tree(proc.pid, signal.SIGKILL)
                term_at = None
            time.sleep(poll)
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for f in (out, err):
            if f:
                f.close()
    wall = time.monotonic() - start
    if status is None:
        status = "ok" if rc == 0 else "failed"
        if status == "failed":
            tail = ""
            if stderr and os.path.exists(stderr):
                with open(stderr, "rb") as f:
                    f.seek(max(0, os.path.getsize(stderr) - 4000))
                    tail = f.read().decode("utf-8", "replace")
            # the kernel's OOM kill inside a systemd scope, or an allocation refused under RLIMIT_AS
            if (method == "systemd" and rc in (-9, 137)) or re.search(
                    r"bad_alloc|can't allocate memory|Cannot allocate memory|out of memory|MemoryError", tail):
                status = "over_memory"
    return {
        "status": status, "rc": rc, "wall_s": round(wall, 3), "peak_tree_rss_mib": round(peak / (1 << 20), 1),
        "method": method, "mem_limit_bytes": mem_limit, "time_limit_s": time_limit, "cmd": list(cmd),
    }


def search_longest(try_seq, start, granule, max_seq=None, log=None):
    """try_seq(seq) -> report dict (status "ok" passes). Returns {longest, first_failure, capped, tries}."""
    say = log or (lambda msg: None)
    if granule < 1:
        raise ValueError("granule must be >= 1")
    cap = None if max_seq is None else max(granule, max_seq // granule * granule)
    tries = {}

    def attempt(seq):
        if seq not in tries:
            rep = try_seq(seq)
            tries[seq] = rep
            say(f"seq {seq}: {rep['status']} ({rep['wall_s']:.1f} s, sampled peak {rep['peak_tree_rss_mib']:.0f} MiB)")
        return tries[seq]["status"] == "ok"

    seq = max(granule, start // granule * granule)
    if cap is not None:
        seq = min(seq, cap)
    lo = hi = None
    if attempt(seq):
        lo = seq
        while cap is None or lo < cap:
            nxt = 2 * lo if cap is None else min(2 * lo, cap)
            if attempt(nxt):
                lo = nxt
            else:
                hi = nxt
                break
    else:
        hi = seq
        while hi > granule:
            nxt = max(granule, hi // 2 // granule * granule)
            if attempt(nxt):
                lo = nxt
                break
            hi = nxt
    if lo is not None and hi is not None:
        while hi - lo > granule:
            mid = lo + (hi - lo) // granule // 2 * granule
            if attempt(mid):
                lo = mid
            else:
                hi = mid
    return {
        "longest": lo, "first_failure": hi, "capped": hi is None and lo is not None,
        "failure": None if hi is None else tries[hi],
        "tries": [dict(seq=s, **{k: v for k, v in r.items() if k != "cmd"}) for s, r in sorted(tries.items())],
    }


def add_limit_args(p):
    p.add_argument("--mem-limit", type=parse_size, default=parse_size("22G"), help="memory limit (default 22G)")
    p.add_argument("--time-limit", type=float, default=1800.0, help="seconds per run (default 1800; 0: none)")
    p.add_argument("--method", choices=["auto", "systemd", "watch", "prlimit", "none"], default="auto")
    p.add_argument("--poll", type=float, default=0.05, help="seconds between memory samples (default 0.05)")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    add_limit_args(r)
    r.add_argument("--stdout")
    r.add_argument("--stderr")
    r.add_argument("--report")
    r.add_argument("command", nargs=argparse.REMAINDER)
    s = sub.add_parser("longest")
    add_limit_args(s)
    s.add_argument("--granule", type=int, required=True)
    s.add_argument("--start", type=int, default=4096)
    s.add_argument("--max-seq", type=int)
    s.add_argument("--log-dir", default=".")
    s.add_argument("--report")
    s.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command given (after --)")
    method = resolve_method(a.method)
    if a.mode == "run":
        rep = run_limited(cmd, a.mem_limit, a.time_limit, method, a.stdout, a.stderr, a.poll)
        if a.report:
            with open(a.report, "w") as f:
                json.dump(rep, f, indent=1)
        return {"ok": 0, "over_memory": 3, "timeout": 124}.get(rep["status"], rep["rc"] if rep["rc"] > 0 else 1)
    if not any("{seq}" in c for c in cmd):
        ap.error('the command has no "{seq}" to replace')
    os.makedirs(a.log_dir, exist_ok=True)

    def try_seq(seq):
        return run_limited([c.replace("{seq}", str(seq)) for c in cmd], a.mem_limit, a.time_limit, method,
                           os.path.join(a.log_dir, f"try-{seq}.out"), os.path.join(a.log_dir, f"try-{seq}.err"), a.poll)

    res = search_longest(try_seq, a.start, a.granule, a.max_seq,
                         log=lambda msg: print(f"limited_run.py: {msg}", file=sys.stderr, flush=True))
    res.update(granule=a.granule, method=method, mem_limit_bytes=a.mem_limit, time_limit_s=a.time_limit,
               log_dir=a.log_dir)
    text = json.dumps(res, indent=1)
    if a.report:
        with open(a.report, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
