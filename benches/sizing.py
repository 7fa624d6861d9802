"""Posts N distinct delivery requests to a running Skyport, 32 at a time, for
measuring what each delivery keeps in the embedded store (docs/operations.md,
"Sizing the embedded store"):

    cargo run --release -- --set embedded.data_dir=/tmp/sizing
    python3 benches/sizing.py 20000 http://127.0.0.1:8080
    # once skyport_workflow_events_total{outcome="scheduled"} reaches 20000:
    ls -l /tmp/sizing/skyport.redb

With `--key KEY` each request carries `X-API-Key: KEY` (auth on); with
`--named`, a `deliveryId` of its own (so the store keeps its reservation). With
`--callback` each carries a `callbackUrl` on a receiver this script serves on
127.0.0.1 (answering 204), and the script waits until N callbacks arrived:
start Skyport with `--set 'callbacks.allow=["127.0.0.0/8"]'`.

Standard library only; every request must be accepted (202).
"""

import argparse
import http.server
import json
import threading
import time
import urllib.request

THREADS = 32


def body(n: int, callback: str | None, named: bool) -> bytes:
    request = {
        "ownerId": f"owner-{n % 97}",
        "pickupLocation": "47.6423,-122.1368",
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "dropoffLocation": "47.6101,-122.2015",
        "confirmationRequired": "Picture",
        "packageInfo": {"packageId": f"pkg-{n}", "size": "Small", "weight": 2.5, "tag": "fragile"},
    }
    if callback:
        request["callbackUrl"] = callback
    if named:
        request["deliveryId"] = f"order-{n:08}"
    return json.dumps(request).encode()


def post(base: str, start: int, count: int, key: str | None, callback: str | None, named: bool) -> None:
    headers = {"content-type": "application/json"}
    if key:
        headers["x-api-key"] = key
    for n in range(start, count, THREADS):
        request = urllib.request.Request(
            base + "/api/deliveryrequests", data=body(n, callback, named), headers=headers
        )
        with urllib.request.urlopen(request) as response:
            assert response.status == 202, response.status


class Receiver(http.server.BaseHTTPRequestHandler):
    """Answers every callback 204 and counts them."""

    received = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (the handler's name is http.server's)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(204)
        self.end_headers()
        with Receiver.lock:
            Receiver.received += 1

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int)
    parser.add_argument("base")
    parser.add_argument("--key")
    parser.add_argument("--callback", action="store_true")
    parser.add_argument("--named", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    base = args.base.rstrip("/")
    callback = None
    if args.callback:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        callback = f"http://127.0.0.1:{server.server_address[1]}/hook"
    threads = [
        threading.Thread(target=post, args=(base, i, args.count, args.key, callback, args.named))
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if args.callback:
        deadline = time.monotonic() + args.timeout_s
        while Receiver.received < args.count:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {Receiver.received} of {args.count} callbacks arrived")
            time.sleep(0.5)
        print(f"{Receiver.received} callbacks received")
        server.shutdown()


if __name__ == "__main__":
    main()
