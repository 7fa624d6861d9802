"""Verifies recorded callbacks with the standardwebhooks package, as a receiver would.

Usage: verify_webhooks.py FILE, with the receiver's secret in
SKYPORT_TEST_WEBHOOK_SECRET. FILE is a JSON list of {"headers": {...}, "body": "..."}.
Prints "verified N of M"; exits non-zero unless every callback verifies, naming
the first that does not on stderr.
"""

import json
import os
import sys

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


def main() -> int:
    webhook = Webhook(os.environ["SKYPORT_TEST_WEBHOOK_SECRET"])
    with open(sys.argv[1], encoding="utf-8") as recorded:
        messages = json.load(recorded)
    verified = 0
    refused = None
    for message in messages:
        try:
            payload = webhook.verify(message["body"], message["headers"])
        except WebhookVerificationError as error:
            refused = refused or f"refused {message['headers']['webhook-id']}: {error}"
            continue
        if not payload.get("type", "").startswith("delivery."):
            print(f"unexpected payload type: {payload!r}", file=sys.stderr)
            return 2
        verified += 1
    print(f"verified {verified} of {len(messages)}")
    if refused:
        print(refused, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
