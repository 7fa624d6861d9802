// Polls dashboard/data every second and draws each panel from the difference
// between the last two snapshots: counters become rates, histogram buckets
// percentiles, gauges are shown as they are.
"use strict";

const POLL_MS = 1000;
const HISTORY = 120;
const STEP_ORDER = ["account", "package", "delivery", "thirdparty", "drone"];
const REASONS = {
  400: "malformed", 401: "no credentials", 403: "scope", 408: "body too slow",
  409: "conflict", 413: "too large", 415: "media type", 422: "invalid",
  429: "throttled", 431: "head too large", 503: "overloaded",
};
const BREAKERS = ["closed", "half-open", "open"];
const POST_ROUTE = "/api/deliveryrequests";
const TOP_CLIENTS = 10;

const history = { accepted: [], outcomes: [] };
let previous = null;
let credential = sessionStorage.getItem("skyport.credential");
let bearer = sessionStorage.getItem("skyport.bearer") === "true";

const $ = (id) => document.getElementById(id);

function samples(snapshot, name, filter = {}) {
  return (snapshot.metrics[name] || []).filter((s) =>
    Object.entries(filter).every(([k, v]) => s.labels[k] === v));
}

function total(snapshot, name, filter) {
  return samples(snapshot, name, filter).reduce((sum, s) => sum + s.value, 0);
}

function has(snapshot, name) {
  return (snapshot.metrics[name] || []).length > 0;
}

// Sums of `name` per value of `label`.
function byLabel(snapshot, name, label, filter) {
  const out = new Map();
  for (const s of samples(snapshot, name, filter)) {
    out.set(s.labels[label], (out.get(s.labels[label]) || 0) + s.value);
  }
  return out;
}

// Per-second rate of counter `name` per value of `label` between the snapshots.
function ratesBy(now, then, name, label, filter) {
  const seconds = (now.at - then.at) / 1000;
  const before = byLabel(then, name, label, filter);
  const out = new Map();
  for (const [key, value] of byLabel(now, name, label, filter)) {
    out.set(key, Math.max(0, value - (before.get(key) || 0)) / seconds);
  }
  return out;
}

function rate(now, then, name, filter) {
  const seconds = (now.at - then.at) / 1000;
  return Math.max(0, total(now, name, filter) - total(then, name, filter)) / seconds;
}

// The q-quantile of the observations of histogram `name` between the
// snapshots, interpolated within its bucket as Prometheus does; null if none.
function quantile(now, then, name, filter, q) {
  const cumulative = (snapshot) => {
    const out = new Map();
    for (const s of samples(snapshot, name + "_bucket", filter)) {
      const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
      out.set(le, (out.get(le) || 0) + s.value);
    }
    return out;
  };
  const before = cumulative(then);
  const buckets = [...cumulative(now)]
    .map(([le, count]) => [le, count - (before.get(le) || 0)])
    .sort((a, b) => a[0] - b[0]);
  const count = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (count <= 0) return null;
  const rank = q * count;
  let lower = 0;
  let below = 0;
  for (const [le, cumulativeCount] of buckets) {
    if (cumulativeCount >= rank) {
      if (le === Infinity) return lower;
      const inBucket = cumulativeCount - below;
      return inBucket > 0 ? lower + (le - lower) * (rank - below) / inBucket : le;
    }
    lower = le;
    below = cumulativeCount;
  }
  return lower;
}

function number(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (Math.abs(value) >= 10000) return (value / 1000).toFixed(1) + "k";
  if (Math.abs(value) >= 100 || Number.isInteger(value)) return Math.round(value).toString();
  return value.toFixed(1);
}

// Seconds as milliseconds (the unit is in the column's heading).
function millis(seconds) {
  if (seconds === null) return "–";
  const ms = seconds * 1000;
  return ms >= 100 ? Math.round(ms).toString() : ms.toFixed(ms >= 10 ? 1 : 2);
}

function age(seconds) {
  return seconds >= 120 ? Math.round(seconds / 60) + " min" : seconds.toFixed(1) + " s";
}

function set(id, text) {
  $(id).textContent = text;
}

// Replaces the rows of `table` (its caption kept) with `head` and `rows`,
// or a line saying there are none (`empty`).
function fill(table, head, rows, empty = "nothing recorded in this process") {
  const element = $(table);
  const caption = element.querySelector("caption");
  element.replaceChildren(caption);
  if (rows.length === 0) {
    const cell = element.insertRow().insertCell();
    cell.colSpan = head.length;
    cell.className = "none";
    cell.textContent = empty;
    return;
  }
  const header = element.insertRow();
  for (const title of head) {
    const th = document.createElement("th");
    th.textContent = title;
    header.appendChild(th);
  }
  for (const row of rows) {
    const tr = element.insertRow();
    for (const value of row) {
      const cell = tr.insertCell();
      if (value && typeof value === "object") {
        cell.textContent = value.text;
        cell.className = value.className;
      } else {
        cell.textContent = value;
      }
    }
  }
}

function spark(id, values) {
  const svg = $(id);
  const max = Math.max(1, ...values);
  const step = 240 / (HISTORY - 1);
  const offset = (HISTORY - values.length) * step;
  const points = values
    .map((v, i) => `${(offset + i * step).toFixed(1)},${(46 - 44 * v / max).toFixed(1)}`)
    .join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.replaceChildren(line);
}

function remember(series, value) {
  series.push(value);
  if (series.length > HISTORY) series.shift();
}

function stepOrder(a, b) {
  const rank = (s) => {
    const i = STEP_ORDER.indexOf(s);
    return i < 0 ? STEP_ORDER.length : i;
  };
  return rank(a) - rank(b) || a.localeCompare(b);
}

function ingest(now, then) {
  const post = { route: POST_ROUTE, method: "POST" };
  const statuses = ratesBy(now, then, "skyport_http_requests_total", "status", post);
  // New deliveries, each POST's and each request of a batch (a batch is
  // answered 200 whatever its requests' answers).
  const deliveries = "skyport_deliveries_accepted_total";
  const accepted = has(now, deliveries) ? rate(now, then, deliveries) : statuses.get("202") || 0;
  let rejected = 0;
  const rows = [];
  for (const [status, perSecond] of [...statuses].sort()) {
    if (status === "202") continue;
    rejected += perSecond;
    rows.push([`${status} ${REASONS[status] || ""}`.trim(), number(perSecond)]);
  }
  const refused = ratesBy(now, then, "skyport_batch_refused_total", "class");
  for (const [kind, perSecond] of [...refused].sort()) {
    if (perSecond <= 0) continue;
    rejected += perSecond;
    rows.push([`${kind} in batches`, number(perSecond)]);
  }
  set("accepted", number(accepted));
  set("rejected", number(rejected));
  set("connections", has(now, "skyport_http_connections") ? number(total(now, "skyport_http_connections")) : "–");
  remember(history.accepted, accepted);
  spark("accepted-spark", history.accepted);
  const answered202 = { ...post, class: "2xx" };
  for (const q of [50, 90, 99]) {
    set(`post-p${q}`, millis(quantile(now, then, "skyport_http_request_duration_seconds", answered202, q / 100)));
  }
  fill("rejections", ["reason", "per second"], rows,
    statuses.size ? "none" : "nothing recorded in this process");
}

// Each client's accepted and refused requests per second between the
// snapshots. Counts are differentiated within one entry of the gateway's
// summary; an entry the earlier snapshot does not hold began after it, so
// all of its counts fall within the interval.
function clientRates(now, then) {
  const seconds = (now.at - then.at) / 1000;
  const before = new Map((then.topClients || []).map((c) => [c.entry, c]));
  return now.topClients.map((c) => {
    const earlier = before.get(c.entry) || { accepted: 0, refused: 0 };
    return {
      name: c.name,
      accepted: Math.max(0, c.accepted - earlier.accepted) / seconds,
      refused: Math.max(0, c.refused - earlier.refused) / seconds,
    };
  });
}

// The busiest clients by accepted/s and by refused/s; hidden unless the
// process meters clients (the gateway with quotas on).
function topClients(now, then) {
  const metered = Array.isArray(now.topClients);
  $("top-clients").hidden = !metered;
  if (!metered) return;
  const rates = clientRates(now, then);
  const top = (by) => rates
    .filter((c) => c[by] > 0)
    .sort((a, b) => b[by] - a[by] || a.name.localeCompare(b.name))
    .slice(0, TOP_CLIENTS)
    .map((c) => [c.name, number(c.accepted), number(c.refused)]);
  const head = ["client", "accepted/s", "refused/s"];
  fill("top-accepted", head, top("accepted"), "none");
  fill("top-refused", head, top("refused"), "none");
}

function stream(now) {
  const lag = byLabel(now, "skyport_consumer_lag_events", "partition");
  const inFlight = byLabel(now, "skyport_events_in_flight", "partition");
  const ages = byLabel(now, "skyport_checkpoint_age_seconds", "partition");
  const partitions = [...new Set([...lag.keys(), ...inFlight.keys(), ...ages.keys()])]
    .sort((a, b) => Number(a) - Number(b));
  const read = partitions.length > 0;
  set("lag", read ? number(total(now, "skyport_consumer_lag_events")) : "–");
  set("in-flight", read ? number(total(now, "skyport_events_in_flight")) : "–");
  set("window", read ? number(total(now, "skyport_worker_window")) : "–");
  fill("partitions", ["partition", "behind", "in flight", "checkpoint age"], partitions.map((p) => [
    p, number(lag.get(p) || 0), number(inFlight.get(p) || 0),
    ages.has(p) ? age(ages.get(p)) : "–",
  ]));
}

function workflow(now, then) {
  const outcomes = ratesBy(now, then, "skyport_workflow_events_total", "outcome");
  set("scheduled", number(outcomes.get("scheduled") || 0));
  set("failed", number(outcomes.get("failed") || 0));
  set("replays", number(rate(now, then, "skyport_workflow_replays_total")));
  remember(history.outcomes, [...outcomes.values()].reduce((a, b) => a + b, 0));
  spark("outcome-spark", history.outcomes);
  fill("outcomes", ["outcome", "per second"], [...outcomes].sort().map(([o, r]) => [o, number(r)]));

  const histogram = "skyport_step_call_duration_seconds";
  const breakers = byLabel(now, "skyport_breaker_state", "step");
  const steps = new Set([...byLabel(now, histogram + "_count", "step").keys(), ...breakers.keys()]);
  const errors = ratesBy(now, then, "skyport_step_errors_total", "step");
  const rows = [...steps].sort(stepOrder).map((step) => {
    const state = breakers.get(step);
    const breaker = state === undefined ? "–"
      : { text: BREAKERS[state] || String(state), className: "breaker-" + (BREAKERS[state] || "unknown") };
    return [step, number(rate(now, then, histogram + "_count", { step })),
      millis(quantile(now, then, histogram, { step }, 0.5)),
      millis(quantile(now, then, histogram, { step }, 0.99)),
      number(errors.get(step) || 0), breaker];
  });
  fill("steps", ["step", "calls/s", "p50 ms", "p99 ms", "errors/s", "breaker"], rows);
}

function cosmos(now, then) {
  fill("throttling", ["from", "per second"],
    [...ratesBy(now, then, "skyport_throttled_total", "dependency")].sort().map(([d, r]) => [d, number(r)]));
  fill("units", ["operation", "RU/s"],
    [...ratesBy(now, then, "skyport_cosmos_request_units_total", "operation")].sort().map(([o, r]) => [o, number(r)]));
  const spent = ratesBy(now, then, "skyport_throughput_group_request_units_total", "group");
  const budget = byLabel(now, "skyport_throughput_group_budget_ru_per_s", "group");
  const allocated = byLabel(now, "skyport_throughput_group_allocated_ru_per_s", "group");
  const delayed = ratesBy(now, then, "skyport_throughput_group_delayed_total", "group");
  const refused = ratesBy(now, then, "skyport_throughput_group_throttled_total", "group");
  const groups = [...new Set([...spent.keys(), ...budget.keys()])].sort();
  fill("groups", ["group", "RU/s", "allocated", "budget", "delayed/s", "refused/s"], groups.map((g) => [
    g, number(spent.get(g) || 0), number(allocated.get(g)), number(budget.get(g)),
    number(delayed.get(g) || 0), number(refused.get(g) || 0),
  ]));
}

function callbacks(now, then) {
  const feed = has(now, "skyport_change_feed_leases_owned");
  set("feed-lag", has(now, "skyport_change_feed_lag_events") ? number(total(now, "skyport_change_feed_lag_events")) : (feed ? "0" : "–"));
  set("leases", feed ? number(total(now, "skyport_change_feed_leases_owned")) : "–");
  set("handler-errors", feed ? number(rate(now, then, "skyport_change_feed_handler_errors_total")) : "–");
  fill("callback-outcomes", ["outcome", "per second"],
    [...ratesBy(now, then, "skyport_callbacks_total", "outcome")].sort().map(([o, r]) => [o, number(r)]));
}

function retention(now, then) {
  const redrives = has(now, "skyport_redrives_total");
  set("redrives-began", redrives ? number(rate(now, then, "skyport_redrives_total", { outcome: "began" })) : "–");
  set("redrives-skipped", redrives ? number(rate(now, then, "skyport_redrives_total", { outcome: "skipped" })) : "–");
  const removed = ratesBy(now, then, "skyport_retention_removed_total", "kind");
  const oldest = byLabel(now, "skyport_retention_oldest_seconds", "kind");
  const kinds = [...new Set([...removed.keys(), ...oldest.keys()])].sort();
  fill("retention-kinds", ["kind", "removed/hour", "oldest kept (hours)"], kinds.map((k) => [
    k, number((removed.get(k) || 0) * 3600), oldest.has(k) ? number(oldest.get(k) / 3600) : "–",
  ]));
}

function draw(now, then) {
  ingest(now, then);
  topClients(now, then);
  stream(now);
  workflow(now, then);
  cosmos(now, then);
  callbacks(now, then);
  retention(now, then);
}

function headers() {
  if (!credential) return {};
  return bearer ? { Authorization: "Bearer " + credential } : { "X-API-Key": credential };
}

function showStatus(text, className) {
  const status = $("status");
  status.textContent = text;
  status.className = "status " + className;
}

async function poll() {
  try {
    const response = await fetch("dashboard/data", { headers: headers(), cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      previous = null;
      $("signin").hidden = false;
      $("panels").hidden = true;
      set("signin-error", credential ? `The credentials were refused (${response.status}).` : "");
      showStatus("signed out", "stale");
      return;
    }
    if (!response.ok) throw new Error(`dashboard/data answered ${response.status}`);
    const snapshot = await response.json();
    $("signin").hidden = true;
    $("panels").hidden = false;
    if (previous && snapshot.at > previous.at) draw(snapshot, previous);
    previous = snapshot;
    showStatus("live · " + new Date(snapshot.at).toLocaleTimeString(), "live");
  } catch (error) {
    showStatus("no answer: " + error.message, "stale");
  } finally {
    if ($("signin").hidden) setTimeout(poll, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("submit", (event) => {
    event.preventDefault();
    credential = $("credential").value.trim();
    bearer = $("bearer").checked;
    sessionStorage.setItem("skyport.credential", credential);
    sessionStorage.setItem("skyport.bearer", String(bearer));
    poll();
  });
  poll();
});
