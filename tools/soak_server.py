"""kvtrimd for the soak test: private copies of the binaries (checked with ldd), start on
loopback with a port file, /proc samples (RSS, threads, descriptors, CPU), a metrics
scrape, and the SIGTERM stop with its exit code and time."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from typing import Dict, List, Optional, Tuple

from soak_loadgen import child_prefix

BINARIES = {"kvtrimd": "service/kvtrimd", "kvtrim-loadgen": "client/loadgen/kvtrim-loadgen",
            "libkvtrim.so": "libkvtrim/libkvtrim.so"}
ALT_PATHS = {"kvtrim-loadgen": "client/kvtrim-loadgen"}
# Debian's libraries, and the CUDA 13 toolkit's runtime of a CUDA build (the default build
# where nvcc is installed); anything else (a sanitizer's runtime, a stray copy) is refused.
SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/cuda/")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def ldd_check(path: str) -> Tuple[bool, List[str]]:
    """(only system libraries, the resolved library paths) of `path`'s ldd."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
    libraries, ok = [], True
    for line in out.splitlines():
        line = line.strip()
        if "not found" in line:
            ok = False
            libraries.append(line)
        elif "=>" in line:
            target = line.split("=>")[1].split("(")[0].strip()
            if target:
                libraries.append(target)
                ok = ok and target.startswith(SYSTEM_DIRS)
        elif line.startswith("/"):
            libraries.append(line.split()[0])
            ok = ok and line.startswith(SYSTEM_DIRS)
    return ok, libraries


def wait_settled(path: str, quiet_s: float = 5.0, limit_s: float = 120.0) -> None:
    """Waits until `path` has not changed for `quiet_s` seconds (a build may be linking it
    right now), at most `limit_s`."""
    deadline = time.time() + limit_s
    while time.time() < deadline and time.time() - os.path.getmtime(path) < quiet_s:
        time.sleep(1.0)


def copy_binaries(build_dir: str, dest: str) -> Dict[str, dict]:
    """Copies kvtrimd, kvtrim-loadgen and libkvtrim.so out of `build_dir` (rebuilt by
    others meanwhile) into `dest`; {name: {path, ok, libraries, size}} (absent: path None)."""
    found = {}
    for name, relative in BINARIES.items():
        candidates = [relative] + ([ALT_PATHS[name]] if name in ALT_PATHS else [])
        source = next((os.path.join(build_dir, c) for c in candidates
                       if os.path.isfile(os.path.join(build_dir, c))), None)
        if source is None:
            found[name] = {"path": None, "source": None, "ok": False, "libraries": []}
            continue
        target = os.path.join(dest, name)
        wait_settled(source)
        shutil.copy2(source, target)
        ok, libraries = ldd_check(target)
        found[name] = {"path": target, "source": source, "ok": ok, "libraries": libraries,
                       "size": os.path.getsize(target)}
    return found


def start_kvtrimd(binary: str, tmp: str, extra: List[str], env: Dict[str, str],
                  backend: str = "cpu") -> Tuple[subprocess.Popen, dict]:
    """Starts kvtrimd on 127.0.0.1 port 0 (metrics too) with a port file and a data dir
    under `tmp`, host shm allowed, `backend` (cpu or gpu), `env` added to its environment;
    returns the process and its paths."""
    paths = {"port_file": os.path.join(tmp, "kvtrimd.ports"),
             "data_dir": os.path.join(tmp, "data"), "log": os.path.join(tmp, "kvtrimd.log")}
    argv = [binary, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
            f"--port_file={paths['port_file']}", f"--data_dir={paths['data_dir']}",
            "--allow_client_shm", f"--backend={backend}", *extra]
    with open(paths["log"], "w") as log:
        proc = subprocess.Popen(child_prefix() + argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(os.environ, **env))
    paths["argv"] = argv
    return proc, paths


def wait_ready(proc: subprocess.Popen, port_file: str, timeout: float) -> Dict[str, str]:
    """{grpc, metrics} addresses once kvtrimd wrote its port file (RuntimeError if it
    exits or takes longer than `timeout`)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kvtrimd exited with {proc.returncode} before serving")
        if os.path.exists(port_file):
            with open(port_file) as handle:
                pairs = dict(line.strip().split("=", 1) for line in handle if "=" in line)
            if pairs.get("grpc"):
                return pairs
        time.sleep(0.1)
    raise RuntimeError(f"kvtrimd wrote no port file within {timeout} s")


def sample(pid: int) -> Optional[dict]:
    """VmRSS / RssAnon / VmHWM (KiB), Threads, open descriptors and CPU seconds of `pid`
    (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            status = dict(line.split(":", 1) for line in handle if ":" in line)
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None

    def kib(key: str) -> int:
        """A /proc/PID/status size field in KiB."""
        return int(status.get(key, "0 kB").split()[0])

    return {"rss_kib": kib("VmRSS"), "rss_anon_kib": kib("RssAnon"), "hwm_kib": kib("VmHWM"),
            "threads": int(status["Threads"].strip()), "fds": fds,
            "cpu_s": round((int(fields[11]) + int(fields[12])) / _CLK_TCK, 2)}


_SERIES = re.compile(r"^(kvtrim_[a-z_]+)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$")
WANTED = ("kvtrim_requests_total", "kvtrim_inflight_requests", "kvtrim_region_leases",
          "kvtrim_regions", "kvtrim_layers_total", "kvtrim_tensor_bytes_total",
          "kvtrim_stage_duration_seconds_bucket", "kvtrim_stage_duration_seconds_count",
          "kvtrim_stage_duration_seconds_sum", "kvtrim_heap_bytes", "kvtrim_host_buffer_bytes")


def scrape(address: str) -> Dict[str, float]:
    """The WANTED series of kvtrimd's /metrics ({"name{labels}": value}); {} on failure."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match and match.group(1) in WANTED:
            out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return out


def memory_figures(address: str) -> Dict[str, int]:
    """kvtrimd's published memory figures in KiB (kvtrim_heap_bytes, updated every 10 s,
    and kvtrim_host_buffer_bytes): heap_in_use_kib, heap_free_kib, heap_mmapped_kib,
    pool_idle_kib, pool_in_use_kib; {} when the scrape fails."""
    metrics = scrape(address)
    names = {"heap_in_use_kib": 'kvtrim_heap_bytes{state="in_use"}',
             "heap_free_kib": 'kvtrim_heap_bytes{state="free"}',
             "heap_mmapped_kib": 'kvtrim_heap_bytes{state="mmapped"}',
             "pool_idle_kib": 'kvtrim_host_buffer_bytes{state="idle"}',
             "pool_in_use_kib": 'kvtrim_host_buffer_bytes{state="in_use"}'}
    return {key: int(metrics[series]) // 1024 for key, series in names.items()
            if series in metrics}


def stop_kvtrimd(proc: subprocess.Popen, port_file: str, timeout: float) -> dict:
    """SIGTERM, then wait up to `timeout` s (SIGKILL after): exit code, seconds to exit,
    whether the port file was removed."""
    started = time.time()
    proc.send_signal(signal.SIGTERM)
    killed = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        killed = True
    return {"exit_code": proc.returncode, "seconds": round(time.time() - started, 3),
            "killed_after_timeout": killed, "port_file_removed": not os.path.exists(port_file)}


def log_summary(path: str, tail: int = 15) -> dict:
    """Line count, the first line and the last lines of kvtrimd's log."""
    try:
        with open(path, errors="replace") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return {"lines": 0}
    return {"lines": len(lines), "first": lines[:1], "last": lines[-tail:]}


def _malloc_totals(text: str) -> List[Dict[str, int]]:
    """The "Total (incl. mmap)" blocks of glibc malloc_stats() output, in order."""
    totals = []
    for block in text.split("Total (incl. mmap):")[1:]:
        numbers = dict(re.findall(r"(system bytes|in use bytes)\s*=\s*(\d+)", block)[:2])
        totals.append({k.replace(" ", "_"): int(v) for k, v in numbers.items()})
    return totals


def malloc_probe(pid: int, log_path: str) -> dict:
    """Diagnostics after the load (opt-in: it stops kvtrimd briefly under gdb): glibc's
    malloc_stats(), malloc_trim(0), malloc_stats() again, with VmRSS before and after. The
    bytes malloc holds but that are not in use show up as RSS the trim gives back."""
    if shutil.which("gdb") is None:
        return {"error": "gdb not found"}
    before = sample(pid)
    offset = os.path.getsize(log_path)
    commands = ["call (void)malloc_stats()", "call (int)malloc_trim(0)",
                "call (void)malloc_stats()"]
    argv = ["gdb", "-p", str(pid), "-batch", "-nx"] + [a for c in commands for a in ("-ex", c)]
    try:
        subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "gdb timed out"}
    time.sleep(0.5)
    after = sample(pid)
    with open(log_path, errors="replace") as handle:
        handle.seek(offset)
        text = handle.read()
    totals = _malloc_totals(text)

    def mib(size: int) -> float:
        """Bytes in MiB, one decimal."""
        return round(size / 2**20, 1)

    out = {"rss_before_mib": mib(before["rss_kib"] * 1024),
           "rss_after_trim_mib": mib(after["rss_kib"] * 1024),
           "arenas": text.count("Arena ") // max(len(totals), 1)}
    for name, total in zip(("before", "after_trim"), totals):
        out[f"malloc_in_use_{name}_mib"] = mib(total.get("in_use_bytes", 0))
        out[f"malloc_system_{name}_mib"] = mib(total.get("system_bytes", 0))
    return out
