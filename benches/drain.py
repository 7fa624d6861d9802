"""Whether the all-in-one's drain slows as its store grows: posts N distinct
requests while the worker is held to one workflow a second, restarts it at
its defaults on the same data directory, and prints the process's CPU per
workflow in each tenth of the drain, the last against the first
(BENCHMARKS.md, "A drain as the store grows"). Then, for each of the
process's threads by name (`/proc/PID/task/*/stat`), its CPU per delivery
while the requests were taken and per workflow while they drained, and for
a thread that runs alone (not a runtime's pool) the rate at which it would
be busy all the time: its serial ceiling (BENCHMARKS.md, "Issue 50, third part").
Then each kind of long-lived task's time in poll per workflow drained (the
HTTP/2 drivers, the partition loops: `skyport_task_poll_seconds_total`), and,
from a binary built with `--features lock-timing`, each named lock's hold and
wait time per workflow, with their ceilings:

    cargo build --release [--features lock-timing]
    cargo bench --bench skyport --no-run   # prints the bench binary, the poster
    python3 benches/drain.py target/release/skyport target/release/deps/skyport-HASH 1000000 [--keyed] [KEY=VALUE…]

Each KEY=VALUE is a `--set` for both of the process's starts. `--keyed`
gives every request an `Idempotency-Key`, so that each is reserved and the
reservation fold works too.

Standard library only. The data directory is made under /tmp and removed.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

PORT = 18095
BASE = f"http://127.0.0.1:{PORT}"
TICK = os.sysconf("SC_CLK_TCK")
DONE = re.compile(r'^skyport_workflow_events_total\{[^}]*outcome="(scheduled|failed|already_terminal)"[^}]*\} (\d+)', re.M)
TASK_POLLS = re.compile(r'^skyport_task_poll_seconds_total\{task="([^"]+)"\} (\S+)', re.M)
TASKS = re.compile(r'^skyport_tasks\{task="([^"]+)"\} (\S+)', re.M)
LOCKS = re.compile(r'^skyport_lock_(held|wait)_seconds_total\{lock="([^"]+)"\} (\S+)', re.M)


def start(skyport: str, data: str, *sets: str) -> subprocess.Popen:
    try:
        urllib.request.urlopen(BASE + "/healthz", timeout=1).read()
        raise SystemExit(f"something already answers on {BASE}: stop it first")
    except OSError:
        pass
    args = [skyport, "--data-dir", data, "--listen", f"127.0.0.1:{PORT}"]
    for assignment in sets:
        args += ["--set", assignment]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(BASE + "/healthz", timeout=1).read()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("Skyport did not answer /healthz within 30 s")


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    process.wait(timeout=120)


def metrics() -> str:
    return urllib.request.urlopen(BASE + "/metrics", timeout=5).read().decode()


def done() -> int:
    return sum(int(count) for _, count in DONE.findall(metrics()))


def serial(text: str) -> dict[str, float]:
    """Seconds each long-lived task kind spent in poll, and each named lock
    was held or waited for (built with --features lock-timing), by name."""
    found = {f"task {task}": float(s) for task, s in TASK_POLLS.findall(text)}
    found.update({f"lock {lock} {what}": float(s) for what, lock, s in LOCKS.findall(text)})
    return found


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def threads(pid: int) -> dict[str, tuple[float, int]]:
    """CPU seconds of the process's threads summed by name, and how many carry it."""
    found: dict[str, tuple[float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        cpu, count = found.get(name, (0.0, 0))
        found[name] = (cpu + (int(fields[11]) + int(fields[12])) / TICK, count + 1)
    return found


Threads = dict[str, tuple[float, int]]


def per_unit(before: Threads, after: Threads, units: int) -> dict[str, float]:
    """µs of CPU per unit of work of each thread name between two samples."""
    return {
        name: (cpu - before.get(name, (0.0, 0))[0]) * 1e6 / max(units, 1)
        for name, (cpu, _) in after.items()
    }


def main() -> None:
    skyport, poster, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    keyed = "--keyed" in sys.argv[4:]
    sets = [arg for arg in sys.argv[4:] if arg != "--keyed"]
    data = tempfile.mkdtemp(prefix="skyport-drain-")
    try:
        process = start(skyport, data, "worker.rate_limit_per_s=1", *sets)
        job = {
            "url": BASE + "/api/deliveryrequests",
            "schedule": {"Requests": count},
            "connections": 64,
            "naming": "Keyed" if keyed else "Unnamed",
            "first": 0,
            "callback": None,
            "api_key": None,
        }
        began = time.monotonic()
        taking = threads(process.pid)
        posted = json.loads(subprocess.run([poster, "--post", json.dumps(job)], check=True, capture_output=True).stdout)
        accepted = posted["statuses"].get("202", 0)
        ingest = per_unit(taking, threads(process.pid), accepted)
        print(f"posted {count}: {accepted} accepted in {time.monotonic() - began:.0f} s", flush=True)
        before = done()
        stop(process)
        pending = accepted - before
        process = start(skyport, data, *sets)
        samples = [(0, cpu_s(process.pid), time.monotonic())]
        draining = threads(process.pid)
        serial_before = serial(metrics())
        while samples[-1][0] < pending:
            time.sleep(1)
            samples.append((done(), cpu_s(process.pid), time.monotonic()))
        drained = threads(process.pid)
        text = metrics()
        serial_after = serial(text)
        running = {task: float(n) for task, n in TASKS.findall(text)}
        drain = per_unit(draining, drained, samples[-1][0])
        sizes = {name: count for name, (_, count) in drained.items()}
        stop(process)
        size = os.path.getsize(os.path.join(data, "skyport.redb"))
    finally:
        shutil.rmtree(data, ignore_errors=True)

    def at(n: float) -> tuple[float, float]:
        """CPU seconds and time when n workflows were done, interpolated."""
        for (n0, c0, t0), (n1, c1, t1) in zip(samples, samples[1:]):
            if n0 <= n <= n1 and n1 > n0:
                f = (n - n0) / (n1 - n0)
                return c0 + f * (c1 - c0), t0 + f * (t1 - t0)
        return samples[-1][1], samples[-1][2]

    tenths = []
    for k in range(10):
        (c0, t0), (c1, t1) = at(pending * k / 10), at(pending * (k + 1) / 10)
        tenths.append(((c1 - c0) * 1e6 / (pending / 10), (pending / 10) / (t1 - t0)))
    print(f"drained {pending} in {samples[-1][2] - samples[0][2]:.0f} s; skyport.redb {size} bytes")
    for k, (us, rate) in enumerate(tenths):
        print(f"tenth {k + 1:2}: {us:6.0f} µs of CPU a workflow, {rate:6.0f} workflows/s")
    print(f"last tenth against the first: {tenths[-1][0] / tenths[0][0]:.3f} × the CPU, "
          f"{tenths[-1][1] / tenths[0][1]:.3f} × the rate")
    print("thread (how many) | µs a delivery taken | µs a workflow drained | serial ceiling, /s")
    for name in sorted(drain, key=lambda name: -max(drain[name], ingest.get(name, 0.0))):
        busiest = max(drain[name], ingest.get(name, 0.0))
        alone = sizes[name] == 1
        ceiling = f"{1e6 / busiest:,.0f}" if alone and busiest > 0 else "a pool" if not alone else "idle"
        print(f"{name} ({sizes[name]}) | {ingest.get(name, 0.0):.1f} | {drain[name]:.1f} | {ceiling}")
    workflows = max(samples[-1][0], 1)
    print("task (how many) | µs in poll a workflow drained | serial ceiling, /s (how many × 10⁶ ÷ µs)")
    for task, n in sorted(running.items()):
        us = (serial_after.get(f"task {task}", 0.0) - serial_before.get(f"task {task}", 0.0)) * 1e6 / workflows
        ceiling = f"{max(n, 1) * 1e6 / us:,.0f}" if us > 0 else "idle"
        print(f"{task} ({n:.0f}) | {us:.1f} | {ceiling}")
    locks = sorted({key.split()[1] for key in serial_after if key.startswith("lock ")})
    if locks:
        print("lock | µs held a workflow drained | µs waited | serial ceiling, /s (10⁶ ÷ µs held)")
    for lock in locks:
        held, wait = ((serial_after.get(f"lock {lock} {what}", 0.0)
                       - serial_before.get(f"lock {lock} {what}", 0.0)) * 1e6 / workflows
                      for what in ("held", "wait"))
        ceiling = f"{1e6 / held:,.0f}" if held > 0 else "idle"
        print(f"{lock} | {held:.2f} | {wait:.2f} | {ceiling}")


if __name__ == "__main__":
    main()
