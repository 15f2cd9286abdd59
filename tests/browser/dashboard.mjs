// Drives the Wharf dashboard in headless Chromium, as an operator would, and prints what it
// did as one JSON line for the Rust test (tests/tests/dashboard.rs) to check against the store.
//
//   node dashboard.mjs BASE_URL TOKEN CANDIDATE.wasm SCREENSHOT_DIR
//
// Every step waits for what it expects on the page; a missing element fails the run with the
// step's name. Screenshots of each view go to SCREENSHOT_DIR.

import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const [base, token, candidate, shots] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node dashboard.mjs BASE_URL TOKEN CANDIDATE.wasm SCREENSHOT_DIR");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });

const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
// A locale and a time zone far from UTC: dates must still read as ISO 8601 in UTC.
const page = await browser.newPage({
  viewport: { width: 1366, height: 800 }, locale: "en-US", timezoneId: "America/New_York",
});
const problems = [];
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
// A refused request shows in the console too: responses are checked below instead. The only
// error answers expected are the API's 401s that make the page ask for the token.
page.on("console", (m) => {
  if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console: ${m.text()}`);
});
page.on("response", (r) => {
  const expected = r.status() === 401 && r.url().startsWith(`${base}api/v1/`);
  if (r.status() >= 400 && !expected) problems.push(`${r.status()} for ${r.url()}`);
});
page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()}`));
page.on("request", (r) => {
  if (!r.url().startsWith(base)) problems.push(`external request: ${r.url()}`);
});
page.on("dialog", (d) => d.accept());

const report = { steps: [] };
async function step(name, work) {
  try {
    await work();
    report.steps.push(name);
  } catch (e) {
    await page.screenshot({ path: `${shots}/failed-step.png`, fullPage: true }).catch(() => {});
    console.error(`step "${name}" failed: ${e.message}`);
    await browser.close();
    process.exit(1);
  }
}
// ISO 8601 with an explicit zone (the CLI's format: UTC with milliseconds), and an age in words.
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3})?(Z|[+-]\d{2}:\d{2})$/;
const AGE = /^(just now|(in )?\d+ (s|min|h|d)( ago)?)$/;
/** The ISO times (and ages) shown under `scope`; throws when one has another shape. */
async function times(scope) {
  const found = await page.$$eval(`${scope} .when`, (all) => all.map((w) => ({
    text: w.querySelector("time").textContent, datetime: w.querySelector("time").getAttribute("datetime"),
    age: w.querySelector("[data-age]").textContent,
  })));
  if (found.length === 0) throw new Error(`no time under ${scope}`);
  for (const t of found) {
    if (!ISO.test(t.text) || t.datetime !== t.text) throw new Error(`not ISO 8601 with a zone: ${JSON.stringify(t)}`);
    if (!AGE.test(t.age)) throw new Error(`not an age: ${JSON.stringify(t)}`);
  }
  return found;
}
const activeNav = () => page.$$eval("[data-nav].active", (links) => links.map((l) => l.dataset.nav));
const actions = (scope) => page.$$eval(`${scope} [data-action]`, (all) => all.map((b) => b.dataset.action));
const shot = (name) => page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });
const timeout = { timeout: 15000 };

await step("the dashboard asks for the token", async () => {
  await page.goto(base, { waitUntil: "load" });
  await page.waitForSelector("form#token", timeout);
  await shot("01-token");
});

await step("a wrong token is refused", async () => {
  await page.fill("form#token input[name=token]", "wrong-token");
  await page.click("form#token button[type=submit]");
  await page.waitForSelector("form#token [data-error]:text('wrong')", timeout);
});

await step("the right token opens the overview with counts and health", async () => {
  await page.fill("form#token input[name=token]", token);
  await page.click("form#token button[type=submit]");
  await page.waitForSelector("tr[data-queue=work] a[data-count=failed]:text('failed 3')", timeout);
  await page.waitForSelector("tr[data-queue=work] a[data-count=processed]:text('processed 2')", timeout);
  await page.waitForSelector("tr[data-check=sql_storage] .badge.ok", timeout);
  await page.waitForSelector("#health-badge.ok", timeout);
  report.processedRate = Number(await page.textContent("tr[data-queue=work] td[data-rate=processed]"));
});

await step("the overview draws each queue's processed, failed and depth since start", async () => {
  // Points come from the host's sampling passes; the page refreshes every 5 s.
  await page.waitForFunction(() => {
    const work = document.querySelector("[data-chart=work] svg[data-points]");
    const depth = document.querySelector("[data-chart=orders] [data-series=depth]");
    return work && Number(work.dataset.points) >= 2 && depth && depth.dataset.last === "2";
  }, null, { timeout: 20000 });
  report.chart = await page.$eval("[data-chart=work] svg", (svg) => {
    const series = (name) => svg.querySelector(`[data-series=${name}]`);
    return {
      points: Number(svg.dataset.points),
      processedMax: Number(series("processed").dataset.max),
      failedMax: Number(series("failed").dataset.max),
      drawn: ["processed", "failed", "depth"].map((name) => (series(name).getAttribute("d").match(/[ML]/g) || []).length),
    };
  });
  report.chart.ordersDepth = Number(await page.getAttribute("[data-chart=orders] [data-series=depth]", "data-last"));
  report.sessionSince = (await times("tr[data-session=order-7]"))[0].text;
  await shot("02-overview");
});

await step("the failed count opens the failed messages with their errors", async () => {
  await page.click("tr[data-queue=work] a[data-count=failed]");
  await page.waitForFunction(() => document.querySelectorAll("tr[data-key]").length === 3, null, timeout);
  report.failedKeys = await page.$$eval("tr[data-key]", (rows) => rows.map((r) => Number(r.dataset.key)));
  report.errors = await page.$$eval("tr[data-key] td.error", (cells) => cells.map((c) => c.textContent));
  report.failedActions = await actions(`tr[data-key="${report.failedKeys[0]}"]`);
  report.failedListNav = await activeNav();
  report.failedRetryAll = await page.$$eval("[data-action=retry-all]", (all) => all.length);
  report.listTimes = (await times("tbody")).map((t) => t.text);
  await shot("03-failed");
});

await step("retry resubmits a failed message, which the fixed handler processes", async () => {
  const key = report.failedKeys[0];
  await page.click(`tr[data-key="${key}"] button[data-action=retry]`);
  await page.waitForSelector(`#flash:text('Retried: message ${key}')`, timeout);
  report.retried = key;
  const listing = page.url();
  await page.goto(`${base}#/message/${key}`);
  const deadline = Date.now() + 15000;
  for (;;) {
    await page.waitForSelector("h1 [data-status]", timeout);
    report.retriedStatus = await page.getAttribute("h1 [data-status]", "data-status");
    if (report.retriedStatus === "processed" || Date.now() > deadline) break;
    await page.waitForTimeout(200);
    await page.reload();
  }
  if (report.retriedStatus !== "processed") throw new Error(`still ${report.retriedStatus}`);
  await shot("04-retried");
  // Processed after a failed attempt: the error is history, not the message's state.
  report.retriedDetail = {
    currentError: await page.$$eval("[data-error]", (all) => all.map((e) => e.textContent)),
    earlierError: await page.$$eval("[data-earlier-error]", (all) => all.map((e) => e.textContent)),
    earlierRed: await page.$$eval("[data-earlier-error]", (all) => all.some((e) => e.closest(".error") !== null)),
    actions: await actions(".toolbar"),
    trace: await page.$$eval("[data-trace]", (all) => all.map((e) => e.textContent)),
    headers: await page.$$eval("dl.fields.card dt", (all) => all.map((e) => e.textContent)),
  };
  await page.goto(`${base}#/messages?queue=work&status=processed`);
  await page.waitForSelector(`tr[data-key="${key}"]`, timeout);
  report.retriedRow = {
    redErrors: await page.$$eval(`tr[data-key="${key}"] td.error`, (all) => all.length),
    earlierError: await page.$$eval(`tr[data-key="${key}"] [data-earlier-error]`, (all) => all.map((e) => e.textContent)),
    actions: await actions(`tr[data-key="${key}"]`),
    retryAll: await page.$$eval("[data-action=retry-all]", (all) => all.length),
  };
  await shot("04b-processed-list");
  await page.goto(listing);
  await page.waitForFunction(() => document.querySelectorAll("tr[data-key]").length === 2, null, timeout);
});

await step("delete removes a failed message from the list", async () => {
  const key = report.failedKeys[1];
  await page.click(`tr[data-key="${key}"] button[data-action=delete]`);
  await page.waitForSelector(`#flash:text('Deleted: message ${key}')`, timeout);
  await page.waitForSelector(`tr[data-key="${key}"]`, { state: "detached", timeout: 15000 });
  report.deleted = key;
});

await step("the detail shows payload, error and history", async () => {
  const key = report.failedKeys[2];
  await page.click(`tr[data-key="${key}"] a`);
  await page.waitForSelector("pre[data-payload]", timeout);
  report.detailPayload = JSON.parse(await page.textContent("pre[data-payload]"));
  report.detailError = await page.textContent("[data-error]");
  report.detailHistoryHeading = await page.isVisible("h2:text('History of this MessageId')");
  report.detailNav = await activeNav();
  const enqueued = await page.$eval("dt:text-is('Enqueued') + dd time", (t) => t.textContent);
  report.detailEnqueued = { text: enqueued, ms: Date.parse(enqueued) };
  await times("dl.fields");
  await shot("05-detail");
});

await step("replay runs the message against an uploaded candidate", async () => {
  await page.setInputFiles("form[data-replay] input[type=file]", candidate);
  await page.click("form[data-replay] button[type=submit]");
  await page.waitForSelector("[data-summary]", { timeout: 120000 });
  report.replaySummary = (await page.textContent("[data-summary]")).trim();
  report.replayCandidate = await page.textContent("tr[data-replayed] .badge");
  await shot("06-replay");
});

await step("handlers and the deploy log, with the rejected file's reason", async () => {
  await page.click("a[data-nav=handlers]");
  await page.waitForSelector("tr[data-handler=export]", timeout);
  await page.waitForSelector("tr[data-deploy=rejected]", timeout);
  report.rejectedReason = await page.textContent("tr[data-deploy=rejected] td.error");
  report.deployTimes = (await times("tr[data-deploy]")).map((t) => t.text);
  // The shared store's tables: the current version and which host serves which.
  await page.waitForSelector("tr[data-current=archive]", timeout);
  report.storeCurrent = await page.$$eval("tr[data-current] td", (tds) => tds.map((td) => td.textContent));
  report.storeServed = await page.$$eval("tr[data-served]", (rows) =>
    rows.map((r) => [...r.querySelectorAll("td")].slice(1).map((td) => td.textContent)));
  await shot("07-handlers");
});

await step("a blocked session shows its blocker, and Complete settles its handoff", async () => {
  await page.click("a[data-nav=overview]");
  await page.waitForSelector("tr[data-session=order-7]", timeout);
  report.blockedBy = Number(await page.textContent("tr[data-session=order-7] td:nth-child(3)"));
  report.parked = Number(await page.textContent("tr[data-session=order-7] td:nth-child(5)"));
  await shot("08-sessions");
  await page.click("tr[data-session=order-7] td:nth-child(2) a");
  await page.waitForSelector(`tr[data-key="${report.blockedBy}"] button[data-action=complete]`, timeout);
  report.handedOffActions = await actions(`tr[data-key="${report.blockedBy}"]`);
  report.parkedActions = await actions(`tr[data-key]:has([data-status=parked])`);
  await page.click(`tr[data-key="${report.blockedBy}"] button[data-action=complete]`);
  await page.waitForSelector(`#flash:text('Completed: message ${report.blockedBy}')`, timeout);
  await page.click("a[data-nav=overview]");
  await page.waitForSelector("p:text('No session is blocked.')", timeout);
});

await step("the state view lists the buckets and a bucket's keys, read-only", async () => {
  await page.click("a[data-nav=state]");
  await page.waitForSelector("tr[data-bucket=counters]", timeout);
  report.buckets = await page.$$eval("tr[data-bucket]", (rows) => rows.map((r) => ({
    bucket: r.dataset.bucket,
    keys: Number(r.querySelector("td:nth-child(2)").textContent),
    grantedTo: r.querySelector("td:nth-child(3)").textContent,
  })));
  await page.click("tr[data-bucket=counters] a");
  await page.waitForSelector("tr[data-key=hits]", timeout);
  report.entries = await page.$$eval("tr[data-key]", (rows) => rows.map((r) => ({
    key: r.dataset.key,
    value: r.querySelector("[data-value]").textContent,
    revision: Number(r.querySelector("td:nth-child(3)").textContent),
  })));
  report.stateButtons = await page.$$eval("main button", (all) => all.length);
  await shot("09-state");
});

await step("the schedules view shows each schedule's ticks and the hosts", async () => {
  await page.click("a[data-nav=schedules]");
  await page.waitForSelector("tr[data-schedule=pulse] [data-host]", timeout);
  report.schedule = await page.$eval("tr[data-schedule=pulse]", (r) => ({
    cron: r.querySelector("td:nth-child(2)").textContent,
    queue: r.querySelector("td:nth-child(3) a").getAttribute("href"),
    host: r.querySelector("[data-host]").textContent,
    enqueued: Number(r.querySelector("[data-enqueued]").textContent),
  }));
  report.scheduleTimes = (await times("tr[data-schedule=pulse]")).length;
  report.hosts = await page.$$eval("tr[data-host-id]", (rows) => rows.map((r) => ({
    id: r.dataset.hostId, state: r.querySelector(".badge").textContent,
  })));
  report.schedulesNav = await activeNav();
  await shot("10-schedules");
});

await step("forgetting the token asks for it again", async () => {
  await page.click("#sign-out");
  await page.waitForSelector("form#token", timeout);
});

report.problems = problems;
await browser.close();
console.log(JSON.stringify(report));
