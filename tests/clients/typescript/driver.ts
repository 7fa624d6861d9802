// Drives a running Skyport gateway through the TypeScript client generated from
// openapi/openapi.json by openapi-generator (-g typescript-fetch) into ./generated
// (tests/tests/system/openapi_clients.rs does this in a temporary directory, then
// `tsc -p DIR` and `node DIR/out/driver.js BASE_URL`).
//
// Posts a delivery request, reads its status (getDeliveryStatus with the id and
// receipt of the 202, held with `Prefer: wait=10`) until it is terminal and Scheduled,
// reschedules it (PATCH with If-Match), posts a batch and a request that waits for
// its outcome, cancels another one,
// and checks that a bad body (422) and a malformed receipt (404) surface as the
// client's ResponseError carrying a typed Problem. SKYPORT_API_KEY, when set,
// is sent as X-API-Key (and a request without it must be a 401 Problem with
// WWW-Authenticate). Prints what it saw; exits 1 on any mismatch.

import { randomUUID } from "node:crypto";

import {
  type Accepted,
  ChangeOutcome,
  Configuration,
  ConfirmationType,
  DeliveriesApi,
  type DeliveryRequest,
  DeliveryState,
  type DeliveryStatus,
  PackageSize,
  type Problem,
  ProblemFromJSON,
  ResponseError,
  instanceOfAccepted,
  instanceOfDeliveryStatus,
  instanceOfProblem,
} from "./generated";

const POLL_TIMEOUT_MS = 60_000;
const WAIT_S = 10;
const POLL_INTERVAL_MS = 100;

const mismatches: string[] = [];

function expect(condition: boolean, what: string): void {
  console.log(`${condition ? "ok      " : "MISMATCH "}${what}`);
  if (!condition) {
    mismatches.push(what);
  }
}

function deliveryRequest(weight: number): DeliveryRequest {
  const pickupTime = new Date("2030-01-01T10:00:00Z");
  return {
    deliveryId: `ts-${randomUUID()}`,
    ownerId: "owner-typescript",
    pickupLocation: "47.6423,-122.1368",
    pickupTime,
    deadline: new Date(pickupTime.getTime() + 2 * 3600 * 1000),
    dropoffLocation: "47.6101,-122.2015",
    expedited: true,
    confirmationRequired: ConfirmationType.FingerPrint,
    packageInfo: {
      packageId: `pkg-${randomUUID().slice(0, 12)}`,
      size: PackageSize.Medium,
      weight,
      tag: "typescript-client",
    },
  };
}

async function post(api: DeliveriesApi, request: DeliveryRequest): Promise<Accepted | undefined> {
  let response;
  try {
    response = await api.createDeliveryRequestRaw({ deliveryRequest: request });
  } catch (error) {
    await report("POST", error);
    expect(false, "a valid request is accepted with 202");
    return undefined;
  }
  const body: unknown = await response.raw.clone().json();
  console.log(`POST -> ${response.raw.status} ${JSON.stringify(response.raw.headers.get("location"))} ${JSON.stringify(body)}`);
  expect(response.raw.status === 202, "a valid request is accepted with 202");
  if (typeof body !== "object" || body === null || !instanceOfAccepted(body)) {
    expect(false, "the 202 body is an Accepted");
    return undefined;
  }
  const accepted = await response.value();
  expect(accepted.deliveryId === request.deliveryId, "the 202 names the client-chosen deliveryId");
  expect(accepted.status === DeliveryState.Accepted, "the 202 says Accepted");
  expect(accepted.receipt.length > 0, "the 202 carries a receipt");
  expect(
    accepted.statusUrl.endsWith(`/api/deliveryrequests/${accepted.deliveryId}/status?receipt=${accepted.receipt}`),
    "statusUrl is the status resource of the delivery, with its receipt",
  );
  expect(response.raw.headers.get("location") === accepted.statusUrl, "Location is the statusUrl");
  expect(/^\d+$/.test(response.raw.headers.get("retry-after") ?? ""), "the 202 has Retry-After in seconds");
  return accepted;
}

// Polls until the status is terminal; with `cancelled`, a Scheduled one is
// polled on, as a cancelled Scheduled delivery is undone and then Cancelled.
async function pollUntilTerminal(
  api: DeliveriesApi,
  accepted: Accepted,
  cancelled = false,
): Promise<DeliveryStatus | undefined> {
  const deadline = Date.now() + POLL_TIMEOUT_MS;
  const seen: string[] = [];
  for (;;) {
    let response;
    try {
      // Held until the status differs from the one current when the read arrived.
      response = await api.getDeliveryStatusRaw({
        id: accepted.deliveryId,
        receipt: accepted.receipt,
        prefer: `wait=${WAIT_S}`,
      });
    } catch (error) {
      await report("GET status", error);
      expect(false, "the status of an accepted delivery answers 200");
      return undefined;
    }
    const body: unknown = await response.raw.clone().json();
    if (response.raw.status !== 200 || typeof body !== "object" || body === null || !instanceOfDeliveryStatus(body)) {
      console.log(`GET status -> ${response.raw.status} ${JSON.stringify(body)}`);
      expect(false, "the status of an accepted delivery answers 200 with a DeliveryStatus");
      return undefined;
    }
    const status = await response.value();
    if (seen[seen.length - 1] !== status.state) {
      seen.push(status.state);
    }
    if (status.terminal && !(cancelled && status.state === DeliveryState.Scheduled)) {
      console.log(`GET status -> 200 ${JSON.stringify(body)}`);
      console.log(`states seen: ${seen.join(" -> ")}`);
      expect(!response.raw.headers.has("retry-after"), "a terminal status has no Retry-After");
      return status;
    }
    if (!status.terminal && !response.raw.headers.has("retry-after")) {
      expect(false, `a ${status.state} (not terminal) status has Retry-After`);
    }
    if (Date.now() > deadline) {
      expect(false, `the delivery is terminal within ${POLL_TIMEOUT_MS} ms (still ${status.state})`);
      return undefined;
    }
    if (status.terminal) {
      // A Scheduled delivery being cancelled: a terminal status is answered
      // at once, so wait before reading again.
      await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
    }
  }
}

// Moves a Scheduled delivery an hour later (If-Match: the ETag read), reads
// until its revision is 1, and checks that a stale If-Match is a 412.
async function reschedule(api: DeliveriesApi, accepted: Accepted): Promise<void> {
  const ids = { id: accepted.deliveryId, receipt: accepted.receipt };
  const current = await api.getDeliveryStatusRaw(ids);
  const etag = current.raw.headers.get("etag") ?? "";
  const pickupTime = new Date("2030-01-01T11:00:00Z");
  const later = { pickupTime, deadline: new Date("2030-01-01T13:00:00Z") };
  try {
    const patched = await api.rescheduleDeliveryRequestRaw({ ...ids, reschedule: later, ifMatch: etag });
    const body: unknown = await patched.raw.clone().json();
    console.log(`PATCH -> ${patched.raw.status} ${JSON.stringify(body)}`);
    expect(patched.raw.status === 202, "a reschedule is accepted with 202");
    expect(typeof body === "object" && body !== null && instanceOfAccepted(body), "the reschedule's body is an Accepted");
  } catch (error) {
    await report("PATCH", error);
    expect(false, "a reschedule is accepted with 202");
    return;
  }
  const deadline = Date.now() + POLL_TIMEOUT_MS;
  let status = await api.getDeliveryStatus({ ...ids, prefer: `wait=${WAIT_S}` });
  while (status.revision !== 1 && Date.now() < deadline) {
    status = await api.getDeliveryStatus({ ...ids, prefer: `wait=${WAIT_S}` });
  }
  console.log(`rescheduled: revision ${status.revision}, changes ${JSON.stringify(status.changes)}`);
  expect(status.revision === 1, "the reschedule makes revision 1");
  expect(status.state === DeliveryState.Scheduled, "a rescheduled delivery stays Scheduled");
  expect(status.changes?.[0]?.outcome === ChangeOutcome.Applied, "its history holds the change, applied");
  expect(status.request?.pickupTime.getTime() === pickupTime.getTime(), "its request has the new pickup time");
  await expectProblem(
    api.rescheduleDeliveryRequest({ ...ids, reschedule: later, ifMatch: etag }),
    412,
    "PreconditionFailed",
    "PATCH with a stale If-Match",
  );
}

/** Prints a failed call: the problem of a ResponseError, or the error itself. */
async function report(what: string, error: unknown): Promise<void> {
  if (error instanceof ResponseError) {
    console.log(`${what} -> ${error.response.status} ${await error.response.text()}`);
  } else {
    console.log(`${what} -> ${String(error)}`);
  }
}

/** The typed Problem a call failed with, checked against the expected status, code and headers. */
async function expectProblem(
  call: Promise<unknown>,
  status: number,
  code: string,
  what: string,
  headers: string[] = [],
): Promise<Problem | undefined> {
  try {
    const value = await call;
    console.log(`${what} -> succeeded: ${JSON.stringify(value)}`);
    expect(false, `${what} fails with a ResponseError`);
    return undefined;
  } catch (error) {
    if (!(error instanceof ResponseError)) {
      console.log(`${what} -> ${String(error)}`);
      expect(false, `${what} fails with a ResponseError`);
      return undefined;
    }
    const contentType = error.response.headers.get("content-type") ?? "";
    const body: unknown = await error.response.json();
    console.log(`${what} -> ${error.response.status} ${JSON.stringify(contentType)} ${JSON.stringify(body)}`);
    expect(error.response.status === status, `${what} answers ${status}`);
    expect(contentType.split(";")[0].trim() === "application/problem+json", `${what} answers application/problem+json`);
    for (const header of headers) {
      expect(error.response.headers.has(header), `${what} has ${header}`);
    }
    if (typeof body !== "object" || body === null || !instanceOfProblem(body)) {
      expect(false, `${what} carries a Problem`);
      return undefined;
    }
    const problem = ProblemFromJSON(body);
    expect(problem.status === status, `${what}: Problem.status is ${status}`);
    expect(problem.code === code, `${what}: Problem.code is ${code}`);
    return problem;
  }
}

async function main(): Promise<number> {
  const [baseUrl] = process.argv.slice(2);
  if (baseUrl === undefined) {
    console.error("usage: node driver.js BASE_URL");
    return 2;
  }
  const basePath = baseUrl.replace(/\/$/, "");
  const apiKey = process.env.SKYPORT_API_KEY || undefined;
  const api = new DeliveriesApi(new Configuration({ basePath, apiKey }));

  console.log(`== a delivery request through the generated client, against ${baseUrl}`);
  let accepted = await post(api, deliveryRequest(2.5));
  if (accepted !== undefined) {
    const status = await pollUntilTerminal(api, accepted);
    if (status !== undefined) {
      expect(status.state === DeliveryState.Scheduled, `the delivery ends Scheduled (got ${status.state})`);
      expect(status.id === accepted.deliveryId, "the status is of the delivery posted");
      expect(typeof status.droneId === "string" && status.droneId.length > 0, "a Scheduled delivery names its drone");
      expect(status.links.self === accepted.statusUrl, "links.self is the statusUrl");
      console.log("== the delivery in a listing");
      try {
        const page = await api.listDeliveryRequests({ limit: 500 });
        expect(page.items.some((item) => item.id === accepted?.deliveryId), "the listing holds the delivery, newest first");
      } catch (error) {
        await report("GET list", error);
        expect(false, "a listing answers 200");
      }
      console.log("== the delivery rescheduled");
      await reschedule(api, accepted);
    }
  }

  console.log("== a batch: two requests, the second invalid");
  try {
    const answer = await api.createDeliveryRequestBatch({
      deliveryRequestBatch: { requests: [deliveryRequest(2.5), deliveryRequest(-1)] },
      idempotencyKey: `ts-batch-${randomUUID()}`,
    });
    console.log(`POST batch -> ${JSON.stringify(answer)}`);
    expect(answer.results.length === 2, "a batch answers each request");
    const [first, second] = answer.results;
    expect(second?.status === 422 && second.problem?.code === "ValidationFailed", "the invalid request is answered with its own 422 Problem");
    expect(first?.status === 202 && first.accepted !== undefined, "the valid request is accepted");
    if (first?.accepted !== undefined) {
      const status = await pollUntilTerminal(api, first.accepted);
      expect(status?.state === DeliveryState.Scheduled, "the batch's delivery ends Scheduled");
    }
  } catch (error) {
    await report("POST batch", error);
    expect(false, "a batch is answered 200 with its results");
  }

  console.log("== a POST that waits for its outcome");
  try {
    const waited = await api.createDeliveryRequestRaw({ deliveryRequest: deliveryRequest(2.5), prefer: "wait=10" });
    const answer = await waited.value();
    console.log(`POST (Prefer: wait=10) -> ${waited.raw.status} ${JSON.stringify(answer)}`);
    expect(waited.raw.status === 200, "a POST with Prefer: wait=10 is answered 200 once its delivery is over");
    expect(
      answer.status === DeliveryState.Scheduled && answer.outcome?.terminal === true,
      "its body is the Accepted, Scheduled, with the outcome",
    );
  } catch (error) {
    await report("POST (Prefer: wait=10)", error);
    expect(false, "a POST with Prefer: wait=10 is answered");
  }

  console.log("== a cancelled delivery request");
  accepted = await post(api, deliveryRequest(1.0));
  if (accepted !== undefined) {
    try {
      const cancelled = await api.cancelDeliveryRequestRaw({ id: accepted.deliveryId, receipt: accepted.receipt });
      const body: unknown = await cancelled.raw.clone().json();
      console.log(`DELETE -> ${cancelled.raw.status} ${JSON.stringify(body)}`);
      expect(cancelled.raw.status === 202, "a cancellation is accepted with 202");
      expect(typeof body === "object" && body !== null && instanceOfAccepted(body), "the cancellation's body is an Accepted");
    } catch (error) {
      await report("DELETE", error);
      expect(false, "a cancellation is accepted with 202");
    }
    const status = await pollUntilTerminal(api, accepted, true);
    if (status !== undefined) {
      expect(status.state === DeliveryState.Cancelled, `the delivery ends Cancelled (got ${status.state})`);
    }
  }

  console.log("== a bad request: weight -1");
  const problem = await expectProblem(
    api.createDeliveryRequest({ deliveryRequest: deliveryRequest(-1) }),
    422,
    "ValidationFailed",
    "POST with weight -1",
  );
  if (problem !== undefined) {
    const fields = (problem.errors ?? []).map((error) => error.field);
    expect(JSON.stringify(fields) === JSON.stringify(["packageInfo.weight"]), `the 422 names packageInfo.weight (got ${JSON.stringify(fields)})`);
  }

  console.log("== a malformed receipt");
  await expectProblem(
    api.getDeliveryStatus({ id: "ts-unknown", receipt: "not-a-receipt" }),
    404,
    "NotFound",
    "GET status with a malformed receipt",
  );

  if (apiKey !== undefined) {
    console.log("== no credentials");
    const anonymous = new DeliveriesApi(new Configuration({ basePath }));
    await expectProblem(
      anonymous.createDeliveryRequest({ deliveryRequest: deliveryRequest(2.5) }),
      401,
      "Unauthorized",
      "POST without credentials",
      ["www-authenticate"],
    );
  }

  if (mismatches.length > 0) {
    console.log(`\n${mismatches.length} mismatch(es):\n  ${mismatches.join("\n  ")}`);
    return 1;
  }
  console.log("\nthe generated TypeScript client drove the gateway as the spec says");
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
