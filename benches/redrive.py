"""Measures a redrive of N Failed deliveries by the gateway alone on the
embedded store: how many calls, how long, and the gateway's peak resident
memory (BENCHMARKS.md, "Redrive of 500,000"; docs/operations.md, "Retention,
redrive and resend"):

    cargo build --release --bin skyport --bin skyport-gateway
    # 1. N deliveries that fail at Account (their owner is suspended), through the all-in-one:
    target/release/skyport --listen 127.0.0.1:18480 --set embedded.data_dir=/tmp/redrive/500k \\
        --set 'simulator.suspended_owners=["suspended"]' &
    python3 benches/redrive.py post 500000 http://127.0.0.1:18480
    kill -INT %1; wait
    # 2. the gateway alone on the same data, redriving them LIMIT a call (dry first):
    target/release/skyport-gateway --listen 127.0.0.1:18481 --set embedded.data_dir=/tmp/redrive/500k &
    python3 benches/redrive.py redrive http://127.0.0.1:18481 $! 10000 --dry-run
    python3 benches/redrive.py redrive http://127.0.0.1:18481 $! 10000

`post` returns once the workflow has failed every delivery it posted (the
all-in-one's `skyport_workflow_events_total{outcome="failed"}`). `redrive`
prints each call's answer and, at the end, the calls, the time and the
gateway's VmHWM (its peak resident set since it started, from
/proc/PID/status). Standard library only.
"""

import http.client
import json
import sys
import threading
import time
import urllib.parse
import urllib.request

THREADS = 32


def body(n: int) -> bytes:
    return json.dumps({
        "deliveryId": f"redrive-{n}",
        "ownerId": "suspended",
        "pickupLocation": "47.6423,-122.1368",
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "dropoffLocation": "47.6101,-122.2015",
        "confirmationRequired": "Picture",
        "packageInfo": {"packageId": f"pkg-{n}", "size": "Small", "weight": 2.5, "tag": "fragile"},
    }).encode()


def post_range(host: str, port: int, start: int, count: int) -> None:
    connection = http.client.HTTPConnection(host, port)
    for n in range(start, count, THREADS):
        connection.request("POST", "/api/deliveryrequests", body(n), {"content-type": "application/json"})
        response = connection.getresponse()
        response.read()
        assert response.status == 202, response.status


def failed(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics") as response:
        for line in response.read().decode().splitlines():
            if line.startswith('skyport_workflow_events_total{') and 'outcome="failed"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def post(count: int, base: str) -> None:
    url = urllib.parse.urlsplit(base)
    began = time.monotonic()
    threads = [
        threading.Thread(target=post_range, args=(url.hostname, url.port, i, count))
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"posted {count} in {time.monotonic() - began:.1f} s", flush=True)
    while failed(base) < count:
        time.sleep(1)
    print(f"all {count} Failed after {time.monotonic() - began:.1f} s", flush=True)


def peak_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def redrive(base: str, pid: int, limit: int, dry_run: bool) -> None:
    request = json.dumps({"reason": "measured redrive"}).encode()
    cursor, calls, totals = None, 0, {}
    began = time.monotonic()
    while True:
        query = {"limit": limit}
        if dry_run:
            query["dryRun"] = "true"
        if cursor:
            query["cursor"] = cursor
        call = urllib.request.Request(
            f"{base}/admin/redrive?{urllib.parse.urlencode(query)}",
            data=request,
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(call, timeout=600) as response:
            answer = json.loads(response.read())
        calls += 1
        for field in ("matched", "queued", "alreadyQueued", "withoutRequest"):
            totals[field] = totals.get(field, 0) + answer[field]
        print(calls, answer, flush=True)
        cursor = answer.get("next")
        if not cursor:
            break
    seconds = time.monotonic() - began
    print(
        f"{'dry run' if dry_run else 'redrive'}: {totals} in {calls} calls of at most {limit}, "
        f"{seconds:.1f} s; the gateway's peak RSS {peak_mib(pid):.1f} MiB",
        flush=True,
    )


def main() -> None:
    if sys.argv[1] == "post":
        post(int(sys.argv[2]), sys.argv[3].rstrip("/"))
    elif sys.argv[1] == "redrive":
        redrive(sys.argv[2].rstrip("/"), int(sys.argv[3]), int(sys.argv[4]), "--dry-run" in sys.argv)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
