"""Drives a running Skyport gateway through the Python client generated from
openapi/openapi.json by openapi-python-client (tests/tests/system/openapi_clients.rs).

    openapi-python-client generate --path openapi/openapi.json --meta none --output-path DIR/skyport_client
    PYTHONPATH=DIR python tests/clients/python_driver.py http://127.0.0.1:8080

Posts a delivery request, reads its status (getDeliveryStatus with the id and
receipt of the 202, held with wait=10 and If-None-Match naming the copy it
has) until it is terminal and Scheduled, reschedules it (PATCH with If-Match),
posts a batch and a request that waits for its outcome, cancels another one,
and checks that a bad body (422) and a malformed receipt (404) come back as
the client's typed Problem. SKYPORT_API_KEY, when set, is sent as X-API-Key
(and a request without it must be a 401 Problem with WWW-Authenticate).
Prints what it saw; exits 1 on any mismatch.
"""

import datetime
import os
import sys
import time
import uuid

from skyport_client import AuthenticatedClient, Client
from skyport_client.api.deliveries import (
    cancel_delivery_request,
    create_delivery_request,
    create_delivery_request_batch,
    get_delivery_status,
    list_delivery_requests,
    reschedule_delivery_request,
)
from skyport_client.types import UNSET
from skyport_client.models import (
    Accepted,
    ChangeOutcome,
    ConfirmationType,
    DeliveryRequest,
    DeliveryRequestBatch,
    DeliveryState,
    DeliveryStatus,
    PackageInfo,
    PackageSize,
    Problem,
    Reschedule,
)

POLL_TIMEOUT_S = 60.0
WAIT_S = 10
POLL_INTERVAL_S = 0.1

mismatches: list[str] = []


def expect(condition: bool, what: str) -> None:
    print(("ok      " if condition else "MISMATCH ") + what, flush=True)
    if not condition:
        mismatches.append(what)


def client_for(base_url: str) -> Client | AuthenticatedClient:
    # The spec puts every delivery operation behind apiKey or bearer, so the generated
    # functions are typed for an AuthenticatedClient; TestApp runs with auth off.
    key = os.environ.get("SKYPORT_API_KEY")
    if key:
        return AuthenticatedClient(
            base_url=base_url,
            token=key,
            prefix="",
            auth_header_name="X-API-Key",
            raise_on_unexpected_status=True,
        )
    return Client(base_url=base_url, raise_on_unexpected_status=True)


def delivery_request(weight: float) -> DeliveryRequest:
    pickup = datetime.datetime(2030, 1, 1, 10, 0, tzinfo=datetime.UTC)
    return DeliveryRequest(
        delivery_id=f"py-{uuid.uuid4()}",
        owner_id="owner-python",
        pickup_location="47.6423,-122.1368",
        pickup_time=pickup,
        deadline=pickup + datetime.timedelta(hours=2),
        dropoff_location="47.6101,-122.2015",
        expedited=False,
        confirmation_required=ConfirmationType.PICTURE,
        package_info=PackageInfo(
            package_id=f"pkg-{uuid.uuid4().hex[:12]}",
            size=PackageSize.SMALL,
            weight=weight,
            tag="python-client",
        ),
    )


def post(client, request: DeliveryRequest) -> Accepted | None:
    response = create_delivery_request.sync_detailed(client=client, body=request)
    print(f"POST -> {response.status_code.value} {response.headers.get('location')!r} {response.content.decode()}")
    accepted = response.parsed
    expect(response.status_code == 202, "a valid request is accepted with 202")
    if not isinstance(accepted, Accepted):
        expect(False, f"the 202 body parses as Accepted (got {type(accepted).__name__})")
        return None
    expect(accepted.delivery_id == request.delivery_id, "the 202 names the client-chosen deliveryId")
    expect(accepted.status == DeliveryState.ACCEPTED, "the 202 says Accepted")
    expect(bool(accepted.receipt), "the 202 carries a receipt")
    expect(
        accepted.status_url.endswith(
            f"/api/deliveryrequests/{accepted.delivery_id}/status?receipt={accepted.receipt}"
        ),
        "statusUrl is the status resource of the delivery, with its receipt",
    )
    expect(response.headers.get("location") == accepted.status_url, "Location is the statusUrl")
    expect(response.headers.get("retry-after", "").isdigit(), "the 202 has Retry-After in seconds")
    return accepted


def poll_until_terminal(client, accepted: Accepted, cancelled: bool = False) -> DeliveryStatus | None:
    """Reads until the status is terminal, each read held until the status
    differs from the copy it names; with `cancelled`, a Scheduled one is read
    on, as a cancelled Scheduled delivery is undone and then Cancelled."""
    deadline = time.monotonic() + POLL_TIMEOUT_S
    seen: list[str] = []
    etag = UNSET
    reads = 0
    while True:
        response = get_delivery_status.sync_detailed(
            accepted.delivery_id, client=client, receipt=accepted.receipt, wait=WAIT_S, if_none_match=etag
        )
        reads += 1
        if response.status_code == 304:
            expect(response.headers.get("etag") == etag, "a 304 names the copy held")
            if time.monotonic() > deadline:
                expect(False, f"the delivery is terminal within {POLL_TIMEOUT_S} s")
                return None
            continue
        etag = response.headers.get("etag", UNSET)
        status = response.parsed
        if response.status_code != 200 or not isinstance(status, DeliveryStatus):
            print(f"GET status -> {response.status_code.value} {response.content.decode()}")
            expect(False, "the status of an accepted delivery answers 200 with a DeliveryStatus")
            return None
        if not seen or seen[-1] != status.state.value:
            seen.append(status.state.value)
        if status.terminal and not (cancelled and status.state == DeliveryState.SCHEDULED):
            print(f"GET status -> 200 {response.content.decode()}")
            print(f"states seen: {' -> '.join(seen)}, in {reads} held read(s)")
            expect("retry-after" not in response.headers, "a terminal status has no Retry-After")
            expect(reads <= len(seen) + 1, f"each held read answered a change ({reads} reads, {len(seen)} states)")
            return status
        if not status.terminal and "retry-after" not in response.headers:
            expect(False, f"a {status.state.value} (not terminal) status has Retry-After")
        if time.monotonic() > deadline:
            expect(False, f"the delivery is terminal within {POLL_TIMEOUT_S} s (still {status.state.value})")
            return None
        if status.terminal:
            # A Scheduled delivery being cancelled: a terminal status is
            # answered at once, so wait before reading again.
            time.sleep(POLL_INTERVAL_S)


def reschedule(client, accepted: Accepted) -> None:
    """Moves a Scheduled delivery an hour later (If-Match: the ETag read),
    reads until its revision is 1, and checks that a stale If-Match is a 412."""
    current = get_delivery_status.sync_detailed(accepted.delivery_id, client=client, receipt=accepted.receipt)
    etag = current.headers.get("etag", "")
    pickup = datetime.datetime(2030, 1, 1, 11, 0, tzinfo=datetime.UTC)
    later = Reschedule(pickup_time=pickup, deadline=pickup + datetime.timedelta(hours=2))
    response = reschedule_delivery_request.sync_detailed(
        accepted.delivery_id, client=client, receipt=accepted.receipt, body=later, if_match=etag
    )
    print(f"PATCH -> {response.status_code.value} {response.content.decode()}")
    expect(response.status_code == 202, "a reschedule is accepted with 202")
    expect(isinstance(response.parsed, Accepted), "the reschedule's body parses as Accepted")
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while True:
        read = get_delivery_status.sync_detailed(
            accepted.delivery_id, client=client, receipt=accepted.receipt, wait=WAIT_S, if_none_match=etag
        )
        if read.status_code == 200 and isinstance(read.parsed, DeliveryStatus) and read.parsed.revision == 1:
            status = read.parsed
            break
        if read.status_code == 200:
            etag = read.headers.get("etag", "")
        if time.monotonic() > deadline:
            expect(False, f"the reschedule is applied within {POLL_TIMEOUT_S} s")
            return
    print(f"rescheduled: revision {status.revision}, changes {[c.to_dict() for c in status.changes]}")
    expect(status.state == DeliveryState.SCHEDULED, "a rescheduled delivery stays Scheduled")
    expect(
        len(status.changes) == 1 and status.changes[0].outcome == ChangeOutcome.APPLIED,
        "its history holds the change, applied",
    )
    expect(status.request.pickup_time == pickup, "its request has the new pickup time")
    response = reschedule_delivery_request.sync_detailed(
        accepted.delivery_id, client=client, receipt=accepted.receipt, body=later, if_match=current.headers.get("etag", "")
    )
    expect_problem(response, 412, "PreconditionFailed", "PATCH with a stale If-Match")


def expect_problem(response, status: int, code: str, what: str) -> Problem | None:
    print(
        f"{what} -> {response.status_code.value} {response.headers.get('content-type')!r} "
        f"{response.content.decode()}"
    )
    expect(response.status_code == status, f"{what} answers {status}")
    expect(
        response.headers.get("content-type", "").split(";")[0].strip() == "application/problem+json",
        f"{what} answers application/problem+json",
    )
    problem = response.parsed
    if not isinstance(problem, Problem):
        expect(False, f"{what} parses as the typed Problem (got {type(problem).__name__})")
        return None
    expect(problem.status == status, f"{what}: Problem.status is {status}")
    expect(problem.code == code, f"{what}: Problem.code is {code}")
    return problem


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python_driver.py BASE_URL", file=sys.stderr)
        return 2
    base_url = sys.argv[1].rstrip("/")
    with client_for(base_url) as client:
        print(f"== a delivery request through the generated client, against {base_url}")
        accepted = post(client, delivery_request(2.5))
        if accepted is not None:
            status = poll_until_terminal(client, accepted)
            if status is not None:
                expect(status.state == DeliveryState.SCHEDULED, f"the delivery ends Scheduled (got {status.state.value})")
                expect(status.id == accepted.delivery_id, "the status is of the delivery posted")
                expect(isinstance(status.drone_id, str) and bool(status.drone_id), "a Scheduled delivery names its drone")
                expect(status.links.self_ == accepted.status_url, "links.self is the statusUrl")
                print("== the delivery in a listing")
                response = list_delivery_requests.sync_detailed(client=client, limit=500)
                print(f"GET list -> {response.status_code.value}")
                expect(response.status_code == 200, "a listing answers 200")
                listed = [item.id for item in response.parsed.items] if response.parsed else []
                expect(accepted.delivery_id in listed, "the listing holds the delivery, newest first")
                print("== the delivery rescheduled")
                reschedule(client, accepted)

        print("== a batch: two requests, the second invalid")
        response = create_delivery_request_batch.sync_detailed(
            client=client,
            body=DeliveryRequestBatch(requests=[delivery_request(2.5), delivery_request(-1.0)]),
            idempotency_key=f"py-batch-{uuid.uuid4()}",
        )
        print(f"POST batch -> {response.status_code.value} {response.content.decode()}")
        expect(response.status_code == 200, "a batch is answered 200")
        results = response.parsed.results if response.parsed else []
        expect(len(results) == 2, "a batch answers each request")
        if len(results) == 2:
            first, second = results
            expect(first.status == 202 and isinstance(first.accepted, Accepted), "the valid request is accepted")
            expect(
                second.status == 422 and isinstance(second.problem, Problem) and second.problem.code == "ValidationFailed",
                "the invalid request is answered with its own 422 Problem",
            )
            if isinstance(first.accepted, Accepted):
                status = poll_until_terminal(client, first.accepted)
                expect(status is not None and status.state == DeliveryState.SCHEDULED, "the batch's delivery ends Scheduled")

        print("== a POST that waits for its outcome")
        response = create_delivery_request.sync_detailed(client=client, body=delivery_request(2.5), prefer="wait=10")
        print(f"POST (Prefer: wait=10) -> {response.status_code.value} {response.content.decode()}")
        answer = response.parsed
        expect(response.status_code == 200, "a POST with Prefer: wait=10 is answered 200 once its delivery is over")
        expect(
            isinstance(answer, Accepted) and answer.status == DeliveryState.SCHEDULED and bool(answer.outcome) and answer.outcome.terminal,
            "its body is the Accepted, Scheduled, with the outcome",
        )

        print("== a cancelled delivery request")
        accepted = post(client, delivery_request(1.0))
        if accepted is not None:
            response = cancel_delivery_request.sync_detailed(
                accepted.delivery_id, client=client, receipt=accepted.receipt
            )
            print(f"DELETE -> {response.status_code.value} {response.content.decode()}")
            expect(response.status_code == 202, "a cancellation is accepted with 202")
            expect(isinstance(response.parsed, Accepted), "the cancellation's body parses as Accepted")
            status = poll_until_terminal(client, accepted, cancelled=True)
            if status is not None:
                expect(status.state == DeliveryState.CANCELLED, f"the delivery ends Cancelled (got {status.state.value})")

        print("== a bad request: weight -1")
        response = create_delivery_request.sync_detailed(client=client, body=delivery_request(-1.0))
        problem = expect_problem(response, 422, "ValidationFailed", "POST with weight -1")
        if problem is not None:
            fields = [error.field for error in problem.errors or []]
            expect(fields == ["packageInfo.weight"], f"the 422 names packageInfo.weight (got {fields})")

        print("== a malformed receipt")
        response = get_delivery_status.sync_detailed("py-unknown", client=client, receipt="not-a-receipt")
        expect_problem(response, 404, "NotFound", "GET status with a malformed receipt")

    if os.environ.get("SKYPORT_API_KEY"):
        print("== no credentials")
        with Client(base_url=base_url, raise_on_unexpected_status=True) as anonymous:
            response = create_delivery_request.sync_detailed(client=anonymous, body=delivery_request(2.5))
            expect_problem(response, 401, "Unauthorized", "POST without credentials")
            expect("www-authenticate" in response.headers, "the 401 has WWW-Authenticate")

    if mismatches:
        print(f"\n{len(mismatches)} mismatch(es):", *mismatches, sep="\n  ")
        return 1
    print("\nthe generated Python client drove the gateway as the spec says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
