// Opens Skyport's pages in the machine's Chromium (headless, driven by
// playwright-core; no browser is downloaded) for tests/tests/system/browser.rs.
//
//   NODE_PATH=target/tools/node/node_modules node pages.cjs dashboard BASE_URL OUT_DIR
//   NODE_PATH=… node pages.cjs status OUT_DIR NAME STATUS_URL EXPECTED_JSON
//   NODE_PATH=… node pages.cjs signin BASE_URL API_KEY
//
// dashboard: loads BASE_URL/dashboard on a laptop-sized and a phone-sized
// screen and waits until its figures have changed while the test posts
// deliveries, with quotas on, and its top clients name "flood", the client
// over its quota; the status page: loads a status URL as a browser does and
// checks what it shows against EXPECTED_JSON ({state, steps, succeeded,
// drone} or {state, failedStep, reason}); signin: with auth on, the
// dashboard asks for credentials and shows its figures once given the key
// (quotas off: no top clients).
// Every page must load with no
// console error, no failed request, no answer of 400 or more and nothing
// fetched from another origin. Screenshots go to OUT_DIR. Prints one line
// per check; exits 1 on any mismatch.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { chromium } = require("playwright-core");

const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const WAIT_MS = 60_000;

const mismatches = [];

function expect(condition, what) {
  console.log((condition ? "ok       " : "MISMATCH ") + what);
  if (!condition) mismatches.push(what);
}

async function launch() {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`no browser at ${CHROMIUM}: install Debian's chromium (the browser tests do, as root) or set CHROMIUM`);
  }
  // The machine's network is closed: Chromium's own background traffic would
  // only be refused, so it is switched off.
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--disable-features=Translate,MediaRouter"],
  });
}

// A page that records what went wrong while it loads and runs.
async function watchedPage(browser, origin, viewport) {
  const page = await browser.newPage({ viewport });
  const problems = [];
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(`console error: ${message.text()}`);
  });
  page.on("pageerror", (error) => problems.push(`uncaught: ${error.message}`));
  page.on("requestfailed", (request) =>
    problems.push(`failed request: ${request.url()} (${request.failure()?.errorText})`));
  page.on("request", (request) => {
    const url = request.url();
    if (!url.startsWith(origin) && !url.startsWith("data:")) problems.push(`outside request: ${url}`);
  });
  page.on("response", (response) => {
    if (response.status() >= 400) problems.push(`answer ${response.status()}: ${response.url()}`);
  });
  return { page, problems };
}

function checkClean(problems, what) {
  expect(problems.length === 0, `${what}: no console error, failed request or outside request`
    + (problems.length ? ` (${problems.join("; ")})` : ""));
}

const figure = (page, id) => page.$eval(`#${id}`, (element) => element.textContent.trim());
const numeric = (text) => {
  const value = parseFloat(text);
  return Number.isNaN(value) ? 0 : text.endsWith("k") ? value * 1000 : value;
};

async function dashboard(base, out) {
  const browser = await launch();
  try {
    const origin = new URL(base).origin;
    const { page, problems } = await watchedPage(browser, origin, { width: 1280, height: 760 });
    await page.goto(`${base}/dashboard`);
    await page.waitForFunction(() => document.getElementById("status").classList.contains("live"),
      null, { timeout: WAIT_MS });
    expect(true, "the dashboard is live");

    // Its figures while the test posts: accepted/s, then outcomes and steps.
    const seen = new Set();
    const deadline = Date.now() + WAIT_MS;
    let ready = false;
    while (Date.now() < deadline && !ready) {
      const accepted = await figure(page, "accepted");
      seen.add(accepted);
      const scheduled = numeric(await figure(page, "scheduled"));
      const steps = await page.$$eval("#steps tr", (rows) => rows.length - 1);
      const partitions = await page.$$eval("#partitions tr", (rows) => rows.length - 1);
      // A quarter of a minute of history, for a sparkline worth a screenshot.
      const points = await page.$$eval("#accepted-spark polyline",
        (lines) => (lines.length ? lines[0].points.numberOfItems : 0));
      const refusedFirst = await page.$$eval("#top-refused tr",
        (rows) => (rows.length > 1 ? rows[1].cells[0].textContent : ""));
      ready = seen.size >= 3 && numeric(accepted) > 0 && scheduled > 0 && steps >= 5 && partitions > 0
        && points >= 15 && refusedFirst === "flood";
      await page.waitForTimeout(500);
    }
    expect(seen.size >= 3, `accepted/s changed while deliveries were posted (${[...seen].join(", ")})`);
    expect(numeric(await figure(page, "accepted")) > 0, "accepted/s is above 0");
    expect(numeric(await figure(page, "scheduled")) > 0, "scheduled/s is above 0");
    const steps = await page.$$eval("#steps tr", (rows) =>
      rows.slice(1).map((row) => row.cells[0].textContent));
    expect(steps.join(",") === "account,package,delivery,thirdparty,drone",
      `the five steps are listed in order (${steps.join(",")})`);
    const breakers = await page.$$eval("#steps tr", (rows) =>
      rows.slice(1).map((row) => row.cells[5].textContent));
    expect(breakers.every((state) => state === "closed"), `every breaker is closed (${breakers.join(",")})`);
    const partitions = await page.$$eval("#partitions tr", (rows) => rows.length - 1);
    expect(partitions > 0, `partitions are listed (${partitions})`);
    expect(numeric(await figure(page, "post-p99")) > 0, "the 202s' p99 is shown");
    expect(!(await page.$eval("#top-clients", (element) => element.hidden)), "with quotas on, the top clients are shown");
    const topAccepted = await page.$$eval("#top-accepted tr", (rows) =>
      rows.slice(1).map((row) => [row.cells[0].textContent, row.cells[1].textContent]));
    expect(topAccepted.length > 0 && topAccepted.length <= 10
      && topAccepted.every(([name, perSecond]) => name.length > 0 && numeric(perSecond) > 0),
      `at most ten clients by accepted/s, each named with its rate (${topAccepted.map((r) => r.join(" ")).join(", ")})`);
    const topRefused = await page.$$eval("#top-refused tr", (rows) =>
      rows.slice(1).map((row) => [row.cells[0].textContent, row.cells[2].textContent]));
    expect(topRefused.length > 0 && topRefused[0][0] === "flood" && numeric(topRefused[0][1]) > 0,
      `the client over its quota leads by refused/s (${topRefused.map((r) => r.join(" ")).join(", ")})`);
    await page.screenshot({ path: path.join(out, "dashboard.png"), fullPage: true });
    checkClean(problems, "the dashboard");

    const phone = await watchedPage(browser, origin, { width: 390, height: 844 });
    await phone.page.goto(`${base}/dashboard`);
    await phone.page.waitForFunction(() => document.getElementById("status").classList.contains("live"),
      null, { timeout: WAIT_MS });
    await phone.page.waitForTimeout(2500);
    const overflow = await phone.page.evaluate(() =>
      document.documentElement.scrollWidth - window.innerWidth);
    expect(overflow <= 0, `on a phone's width nothing runs off the side (${overflow} px)`);
    await phone.page.screenshot({ path: path.join(out, "dashboard-phone.png"), fullPage: true });
    checkClean(phone.problems, "the dashboard on a phone");
  } finally {
    await browser.close();
  }
}

async function status(out, name, url, expected) {
  const browser = await launch();
  try {
    const { page, problems } = await watchedPage(browser, new URL(url).origin, { width: 900, height: 600 });
    const response = await page.goto(url);
    expect(response.headers()["content-type"].startsWith("text/html"), "a browser is answered HTML");
    const state = await page.$eval("[data-state]", (element) => element.dataset.state);
    expect(state === expected.state, `the state is ${expected.state} (${state})`);
    const ran = await page.$$eval(".step:not(.pending)", (items) => items.length);
    if (expected.steps !== undefined) {
      expect(ran === expected.steps, `${expected.steps} steps on the timeline (${ran})`);
      const succeeded = await page.$$eval(".step.succeeded", (items) => items.length);
      expect(succeeded === expected.succeeded, `${expected.succeeded} succeeded (${succeeded})`);
      const calls = await page.$$eval(".step:not(.pending) .calls", (items) => items.map((i) => i.textContent));
      expect(calls.length === ran && calls.every((c) => /^\d+ calls?$/.test(c)), `each step shows its calls (${calls})`);
      const times = await page.$$eval(".step:not(.pending) .time", (items) => items.length);
      expect(times === ran, `each step shows its time (${times})`);
    }
    if (expected.drone !== undefined) {
      const drone = await page.$eval(".drone", (element) => element.textContent);
      expect(drone === expected.drone, `the drone is ${expected.drone} (${drone})`);
    }
    if (expected.failedStep !== undefined) {
      const heading = await page.$eval(".failure h2", (element) => element.textContent);
      expect(heading === `Failed at ${expected.failedStep}`, `the failed step is named (${heading})`);
      const reason = await page.$eval(".failure .reason", (element) => element.textContent);
      expect(reason === expected.reason, `the reason is given (${reason})`);
      const failed = await page.$$eval(".step.failed .name", (items) => items.map((i) => i.textContent));
      expect(failed.join() === expected.failedStep, `the timeline marks ${expected.failedStep} failed (${failed})`);
    }
    await page.screenshot({ path: path.join(out, `status-${name}.png`), fullPage: true });
    checkClean(problems, `the ${name} status page`);
  } finally {
    await browser.close();
  }
}

async function signin(base, key) {
  const browser = await launch();
  try {
    const { page, problems } = await watchedPage(browser, new URL(base).origin, { width: 1280, height: 1000 });
    await page.goto(`${base}/dashboard`);
    await page.waitForSelector("#signin:not([hidden])", { timeout: WAIT_MS });
    expect(await page.$eval("#panels", (element) => element.hidden), "no figures are shown before signing in");
    // Asking without credentials is what made the page ask for them.
    const refused = problems.splice(0).filter((p) => !/401/.test(p));
    expect(refused.length === 0, `the only failure before signing in is the 401 (${refused.join("; ")})`);
    await page.fill("#credential", "not-the-key-but-long-enough-to-be-one");
    await page.click("#signin button");
    await page.waitForFunction(() => document.getElementById("signin-error").textContent.includes("401"),
      null, { timeout: WAIT_MS });
    expect(true, "a wrong key is refused on the page");
    problems.splice(0);
    await page.fill("#credential", key);
    await page.click("#signin button");
    await page.waitForFunction(() => document.getElementById("status").classList.contains("live"),
      null, { timeout: WAIT_MS });
    await page.waitForTimeout(2500);
    expect(!(await page.$eval("#panels", (element) => element.hidden)), "the figures are shown once signed in");
    expect(await page.$eval("#signin", (element) => element.hidden), "the form is gone once signed in");
    expect(await page.$eval("#top-clients", (element) => element.hidden), "with quotas off, no top clients are shown");
    checkClean(problems, "the signed-in dashboard");
  } finally {
    await browser.close();
  }
}

async function main() {
  const [command, ...args] = process.argv.slice(2);
  if (command === "dashboard") {
    await dashboard(args[0], args[1]);
  } else if (command === "status") {
    await status(args[0], args[1], args[2], JSON.parse(args[3]));
  } else if (command === "signin") {
    await signin(args[0], args[1]);
  } else {
    throw new Error(`unknown command ${command}: dashboard, status or signin`);
  }
  if (mismatches.length) {
    console.log(`${mismatches.length} mismatches`);
    process.exit(1);
  }
}

main().catch((error) => {
  console.log(`MISMATCH ${error.stack || error}`);
  process.exit(1);
});
