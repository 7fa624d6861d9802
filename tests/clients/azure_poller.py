"""Drives deliveries to their outcome with the Azure SDKs' own long-running-operation
poller (azure-core's LROPoller with OperationResourcePolling), as an Azure client
of Skyport would (tests/tests/system/long_running.rs).

    python tests/clients/azure_poller.py http://127.0.0.1:8080 REFUSED_ID

Posts a delivery with `Prefer: respond-async`, hands the 202 to the poller and
waits for its result: the poller follows `Operation-Location` while it answers
202, stops at the 200 whose `status` is Succeeded, and reads the outcome from
`Location`. Then the same for REFUSED_ID, a delivery the simulated Drone service
refuses: the poller must raise, its status Failed. Every answer the poller
read is recorded by a pipeline policy and checked. Prints what it saw; exits 1
on any mismatch.
"""

import json
import sys
import uuid

from azure.core import PipelineClient
from azure.core.exceptions import HttpResponseError
from azure.core.pipeline.policies import RequestIdPolicy, RetryPolicy, SansIOHTTPPolicy
from azure.core.polling import LROPoller
from azure.core.polling.base_polling import LROBasePolling, OperationResourcePolling
from azure.core.rest import HttpRequest

mismatches: list[str] = []


def expect(condition: bool, what: str) -> None:
    print(("ok      " if condition else "MISMATCH ") + what, flush=True)
    if not condition:
        mismatches.append(what)


class Recorder(SansIOHTTPPolicy):
    """Keeps the method, URL, status and body of every answer."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, str, int, dict]] = []

    def on_response(self, request, response) -> None:
        http = response.http_response
        try:
            body = json.loads(http.body() or b"null")
        except ValueError:
            body = None
        self.answers.append((request.http_request.method, request.http_request.url, http.status_code, body))


def delivery(delivery_id: str) -> dict:
    return {
        "deliveryId": delivery_id,
        "ownerId": "owner-azure",
        "pickupLocation": "47.6423,-122.1368",
        "pickupTime": "2030-01-01T10:00:00Z",
        "deadline": "2030-01-01T12:00:00Z",
        "dropoffLocation": "47.6101,-122.2015",
        "packageInfo": {"packageId": f"pkg-{uuid.uuid4().hex[:12]}", "size": "Small", "weight": 1.5},
    }


def start(client: PipelineClient, recorder: Recorder, delivery_id: str) -> LROPoller:
    request = HttpRequest(
        "POST",
        client.format_url("/api/deliveryrequests"),
        json=delivery(delivery_id),
        headers={"Prefer": "respond-async"},
    )
    # The pipeline response the poller starts from, as the Azure SDKs' generated code gets it.
    initial = client.send_request(request, _return_pipeline_response=True)
    response = initial.http_response
    print(f"POST {delivery_id} -> {response.status_code} Operation-Location: {response.headers.get('operation-location')}")
    expect(response.status_code == 202, "the POST answers 202")
    expect(
        response.headers.get("operation-location", "").endswith("&respond=async"),
        "Operation-Location is the status URL answering as an operation",
    )
    expect(response.headers.get("preference-applied") == "respond-async", "Preference-Applied: respond-async")
    polling = LROBasePolling(timeout=0.05, lro_algorithms=[OperationResourcePolling()])
    return LROPoller(client, initial, lambda pipeline_response: json.loads(pipeline_response.http_response.text()), polling)


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: azure_poller.py BASE_URL REFUSED_ID", file=sys.stderr)
        return 2
    base_url, refused = sys.argv[1].rstrip("/"), sys.argv[2]
    recorder = Recorder()
    client = PipelineClient(base_url=base_url, policies=[RequestIdPolicy(), RetryPolicy(retry_total=0), recorder])

    print("== a delivery that is scheduled")
    poller = start(client, recorder, f"azure-{uuid.uuid4()}")
    result = poller.result(timeout=60)
    print(f"result: {json.dumps(result)}")
    expect(poller.done() and poller.status() == "Succeeded", f"the poller ends Succeeded (got {poller.status()})")
    expect(result.get("state") == "Scheduled" and result.get("status") == "Succeeded", "the result is the Scheduled status")
    polls = [(status, body.get("status")) for method, url, status, body in recorder.answers if method == "GET" and "respond=async" in url]
    print(f"polls: {polls}")
    expect(any(status == 202 and op in ("NotStarted", "Running") for status, op in polls), "a poll answered 202 while the delivery ran")
    expect(polls and polls[-1] == (200, "Succeeded"), "the last poll answered 200 Succeeded")
    finals = [(url, status) for method, url, status, _ in recorder.answers if method == "GET" and "respond=async" not in url]
    expect(len(finals) == 1 and finals[0][1] == 200, f"the outcome was read once from Location (got {finals})")

    print("== a delivery the Drone service refuses")
    recorder.answers.clear()
    poller = start(client, recorder, refused)
    try:
        poller.result(timeout=60)
        expect(False, "the poller raises for a failed delivery")
    except HttpResponseError as error:
        print(f"raised: {type(error).__name__}: {error}")
        expect(poller.status() == "Failed", f"the poller's status is Failed (got {poller.status()})")
    last = recorder.answers[-1]
    expect(last[2] == 200 and last[3].get("state") == "Failed", "the last answer is the 200 of the Failed status")

    if mismatches:
        print(f"\n{len(mismatches)} mismatch(es):", *mismatches, sep="\n  ")
        return 1
    print("\nazure-core's LROPoller drove both deliveries to their outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main())
