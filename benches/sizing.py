"""Posts N distinct delivery requests to a running Skyport, 32 at a time, for
measuring what each delivery keeps in the embedded store (docs/operations.md,
"Sizing the embedded store"):

    cargo run --release -- --set embedded.data_dir=/tmp/sizing
    python3 benches/sizing.py 20000 http://127.0.0.1:8080
    # once skyport_workflow_events_total{outcome="scheduled"} reaches 20000:
    ls -l /tmp/sizing/skyport.redb

Standard library only; every request must be accepted (202).
"""

import json
import sys
import threading
import urllib.request

THREADS = 32


def body(n: int) -> bytes:
    return json.dumps({
        "ownerId": f"owner-{n % 97}",
        "pickupLocation": "47.6423,-122.1368",
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "dropoffLocation": "47.6101,-122.2015",
        "confirmationRequired": "Picture",
        "packageInfo": {"packageId": f"pkg-{n}", "size": "Small", "weight": 2.5, "tag": "fragile"},
    }).encode()


def post(base: str, start: int, count: int) -> None:
    for n in range(start, count, THREADS):
        request = urllib.request.Request(
            base + "/api/deliveryrequests", data=body(n), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request) as response:
            assert response.status == 202, response.status


def main() -> None:
    count, base = int(sys.argv[1]), sys.argv[2].rstrip("/")
    threads = [threading.Thread(target=post, args=(base, i, count)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
