"""Verifies recorded callbacks with the standardwebhooks package, as a receiver would.

Usage: verify_webhooks.py FILE, with the secret in SKYPORT_TEST_WEBHOOK_SECRET.
FILE is a JSON list of {"headers": {...}, "body": "..."}. Prints "verified N";
exits non-zero on the first callback that does not verify.
"""

import json
import os
import sys

from standardwebhooks import Webhook


def main() -> int:
    webhook = Webhook(os.environ["SKYPORT_TEST_WEBHOOK_SECRET"])
    with open(sys.argv[1], encoding="utf-8") as recorded:
        messages = json.load(recorded)
    for message in messages:
        payload = webhook.verify(message["body"], message["headers"])
        if not payload.get("type", "").startswith("delivery."):
            print(f"unexpected payload type: {payload!r}")
            return 1
    print(f"verified {len(messages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
