// The Wharf dashboard: a single page over the admin API (/api/v1) and /readyz. No build
// step and no external assets; every value from the API is inserted as text, never as HTML.
"use strict";

const TOKEN_KEY = "wharf-admin-token";
const REFRESH_MS = 5000;
let refreshTimer = null;

// ---- DOM helpers -----------------------------------------------------------------------

/** An element with attributes (on* are listeners) and children (strings become text). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes);
}

function flash(text, bad) {
  const el = document.getElementById("flash");
  el.textContent = text;
  el.className = bad ? "bad" : "";
  el.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { el.hidden = true; }, 5000);
}

const pad = (n) => String(n).padStart(2, "0");

/** `ms` in the browser's time zone as ISO 8601 with its explicit offset (for tooltips). */
function localIso(ms) {
  const d = new Date(ms);
  const offset = -d.getTimezoneOffset();
  const sign = offset < 0 ? "-" : "+";
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:` +
    `${pad(d.getMinutes())}:${pad(d.getSeconds())}${sign}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)}`;
}

/** How long ago (or how far ahead) `ms` is, in words: "3 min ago", "in 12 s". */
function ago(ms) {
  const delta = Date.now() - ms;
  const s = Math.abs(delta) / 1000;
  if (s < 1) return "just now";
  const text = s < 90 ? `${Math.round(s)} s` : s < 90 * 60 ? `${Math.round(s / 60)} min`
    : s < 48 * 3600 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} d`;
  return delta >= 0 ? `${text} ago` : `in ${text}`;
}

/**
 * A time as the CLI prints it, ISO 8601 in UTC ("2026-06-12T01:04:44.123Z"; the browser's
 * locale plays no part), with its age beside it and the local time with its offset as a
 * tooltip. `value` is ms since the epoch or an RFC 3339 string.
 */
function time(value) {
  if (value === null || value === undefined || value === "") return "–";
  const ms = typeof value === "number" ? value : Date.parse(value);
  if (Number.isNaN(ms)) return String(value);
  const text = typeof value === "string" && value.endsWith("Z") ? value : new Date(ms).toISOString();
  return h("span", { class: "when" },
    h("time", { datetime: text, title: `${localIso(ms)} in this browser's time zone` }, text),
    h("span", { class: "age", "data-age": "" }, ago(ms)));
}

/** How long ago the oldest of the queues' counts was taken, in words. */
function age(queues) {
  if (queues.length === 0) return "now";
  const oldest = Math.min(...queues.map((q) => q.counted_at_ms));
  const seconds = Math.max(0, Math.round((Date.now() - oldest) / 1000));
  return seconds < 2 ? "just now" : `${seconds} s ago`;
}

function rate(perSecond) {
  return perSecond >= 10 ? perSecond.toFixed(0) : perSecond.toFixed(2);
}

function statusBadge(status) {
  const kind = { processed: "ok", failed: "bad", processing: "warn", pending: "", sleeping: "" }[status];
  return h("span", { class: `badge ${kind || ""}`, "data-status": status }, status);
}

/** Whether `error` is the message's state: it failed, or it waits to run again after failing
 * (pending or sleeping with attempts made). Otherwise the error is an earlier attempt's: the
 * message was retried and processed, resubmitted by an operator, parked, moved, … */
function errorIsCurrent(status, attempts) {
  return status === "failed" || ((status === "pending" || status === "sleeping") && attempts !== 0);
}

/** A list's error cell: red when the error is the message's state, grey when it is history. */
function errorCell(status, attempts, error) {
  if (!error) return h("td", {});
  if (errorIsCurrent(status, attempts)) return h("td", { class: "clip error", title: error }, error);
  return h("td", { class: "clip muted", title: error, "data-earlier-error": "" }, `Earlier attempt failed: ${error}`);
}

/** The current view's tab; links to a message carry it, so the message keeps it highlighted. */
let currentNav = "overview";
const NAVS = ["overview", "failed", "messages", "handlers", "schedules", "state"];

function messageHref(key) {
  return `#/message/${key}?from=${currentNav}`;
}

function table(headers, rows, empty) {
  if (rows.length === 0) return h("p", { class: "muted" }, empty);
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map((c) => h("th", { class: c.num ? "num" : null }, c.label || c)))),
    h("tbody", {}, rows));
}

// ---- Charts ----------------------------------------------------------------------------

// The namespace URI names SVG elements; nothing is fetched from it.
const SVG_NS = "http://www.w3.org/2000/svg";

/** An SVG element with attributes and children (strings become text). */
function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) el.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child !== undefined && child !== null) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** A round upper bound for a scale: 1, 2, 2.5 or 5 times a power of ten (1 for all zeros). */
function niceMax(values) {
  const max = values.reduce((a, b) => Math.max(a, b), 0);
  if (max <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(max));
  return [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= max);
}

/** An SVG path through the points of one series; a missing value (depth not counted) breaks it. */
function seriesPath(points, x, y, value) {
  let d = "";
  let pen = false;
  for (const p of points) {
    const v = value(p);
    if (v === null || v === undefined) { pen = false; continue; }
    d += `${pen ? "L" : "M"}${x(p.at_ms).toFixed(1)},${y(v).toFixed(1)}`;
    pen = true;
  }
  return d;
}

const CHART = { width: 420, height: 156, left: 46, right: 8, rates: [8, 72], depth: [92, 132], axis: 150 };

/** One queue's card: processed and failed per second above, depth below, over the kept history. */
function chartCard(queue, history) {
  const points = history ? history.points : [];
  const card = h("div", { class: "card chart", "data-chart": queue }, h("h3", {}, queue));
  if (points.length === 0) {
    card.append(h("p", { class: "muted" }, history ? "No samples yet." : "History unavailable."));
    return card;
  }
  const last = points[points.length - 1];
  const t0 = points[0].at_ms;
  const t1 = Math.max(last.at_ms, t0 + history.interval_ms);
  const { width, left, right } = CHART;
  const x = (at) => left + ((at - t0) / (t1 - t0)) * (width - left - right);
  const panel = ([top, bottom], max) => (v) => bottom - (v / max) * (bottom - top);
  const rateValues = points.flatMap((p) => [p.processed_per_s, p.failed_per_s]);
  const depths = points.map((p) => p.depth).filter((d) => d !== null && d !== undefined);
  const rateMax = niceMax(rateValues);
  const depthMax = niceMax(depths);
  const yRate = panel(CHART.rates, rateMax);
  const yDepth = panel(CHART.depth, depthMax);
  const series = (name, y, value, values) => svg("path", {
    class: `series ${name}`, "data-series": name, d: seriesPath(points, x, y, value),
    "data-max": values.reduce((a, b) => Math.max(a, b), 0), "data-last": value(last) ?? "",
  });
  const gridline = (y) => svg("line", { class: "grid", x1: left, x2: width - right, y1: y, y2: y });
  const label = (text, y, anchor) => svg("text", { x: anchor === "end" ? left - 4 : left, y, "text-anchor": anchor || "start" }, text);
  const spanText = `${points.length} samples since ${new Date(t0).toISOString()}`;
  const drawing = svg("svg", {
    viewBox: `0 0 ${width} ${CHART.height}`, role: "img", "data-points": points.length,
    "aria-label": `${queue}: processed and failed per second, and depth; ${spanText}`,
  },
  svg("title", {}, spanText),
  gridline(CHART.rates[0]), gridline(CHART.rates[1]), gridline(CHART.depth[0]), gridline(CHART.depth[1]),
  label(`${Number(rateMax.toPrecision(3))}/s`, CHART.rates[0] + 4, "end"), label("0", CHART.rates[1] + 3, "end"),
  label(String(depthMax), CHART.depth[0] + 4, "end"), label("0", CHART.depth[1] + 3, "end"),
  series("processed", yRate, (p) => p.processed_per_s, rateValues.filter((_, n) => n % 2 === 0)),
  series("failed", yRate, (p) => p.failed_per_s, rateValues.filter((_, n) => n % 2 === 1)),
  series("depth", yDepth, (p) => p.depth, depths),
  svg("text", { x: width - right, y: CHART.rates[0] + 10, "text-anchor": "end", class: "panel" }, "messages/s"),
  svg("text", { x: width - right, y: CHART.depth[0] + 10, "text-anchor": "end", class: "panel" }, "depth"),
  svg("text", { x: left, y: CHART.axis }, ago(t0)),
  svg("text", { x: width - right, y: CHART.axis, "text-anchor": "end" }, ago(t1)));
  const latest = (name, text) => h("span", { class: `legend ${name}` }, h("i", {}), text);
  card.append(
    h("div", { class: "legends" },
      latest("processed", `processed/s ${rate(last.processed_per_s)}`),
      latest("failed", `failed/s ${rate(last.failed_per_s)}`),
      latest("depth", `depth ${last.depth ?? "unknown"}`)),
    drawing);
  return card;
}

// ---- API -------------------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(`/api/v1${path}`, Object.assign({}, options, { headers }));
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = { error: text }; }
  if (response.status === 401) throw new Unauthorized(body && body.error);
  if (!response.ok) throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
  return body;
}

async function readiness() {
  try {
    const response = await fetch("/readyz");
    return await response.json();
  } catch (e) {
    return { status: "unreachable", checks: {} };
  }
}

async function healthBadge() {
  const report = await readiness();
  const badge = document.getElementById("health-badge");
  badge.textContent = report.status === "healthy" ? "ready" : report.status;
  badge.className = `badge ${report.status === "healthy" ? "ok" : "bad"}`;
  return report;
}

// ---- Views -----------------------------------------------------------------------------

async function overview() {
  const [queues, report, blocked] = await Promise.all([api("/queues"), healthBadge(), api("/sessions?limit=50")]);
  const histories = await Promise.all(queues.map((q) => api(`/queues/${encodeURIComponent(q.name)}/history`)
    .catch((e) => { if (e instanceof Unauthorized) throw e; return null; })));
  const rows = queues.map((q) => {
    const counts = Object.entries(q.counts);
    return h("tr", { "data-queue": q.name },
      h("td", {}, h("a", { href: `#/messages?queue=${encodeURIComponent(q.name)}` }, q.name)),
      h("td", {}, q.storage === "external" ? `external (${q.provider})` : "sql"),
      h("td", {}, q.handler ? [q.handler, " ", q.handler_deployed ? null : h("span", { class: "badge bad" }, "not deployed")]
        : h("span", { class: "muted" }, "none")),
      h("td", {}, h("div", { class: "chips" }, counts.length === 0 && q.storage !== "external" ? h("span", { class: "muted" }, "empty") :
        counts.map(([status, n]) => h("a", {
          class: `badge ${status === "failed" ? "bad" : status === "processed" ? "ok" : ""}`,
          href: `#/messages?queue=${encodeURIComponent(q.name)}&status=${encodeURIComponent(status)}`,
          "data-count": status,
        }, `${status} ${n}`)),
        // The broker keeps no record of successes: this host's own count.
        q.storage === "external" && q.since_start
          ? h("span", { class: "badge ok", "data-count": "processed-since-start", title: "processed by this host since it started" },
            `processed since start ${q.since_start.processed}`)
          : null,
        // Handlers' follow-ups committed but not yet published into the broker.
        q.outbox
          ? h("span", { class: `badge ${q.outbox.last_error ? "bad" : ""}`, "data-count": "outbox",
            title: q.outbox.last_error || "follow-ups waiting for the outbox relay" },
            `outbox ${q.outbox.rows}`)
          : null)),
      h("td", { class: "num", "data-rate": "processed" }, rate(q.rates.processed_per_s)),
      h("td", { class: "num", "data-rate": "failed" }, rate(q.rates.failed_per_s)));
  });
  const checks = Object.entries(report.checks || {}).map(([name, check]) =>
    h("tr", { "data-check": name },
      h("td", {}, name),
      h("td", {}, h("span", { class: `badge ${check.healthy ? "ok" : "bad"}` }, check.healthy ? "healthy" : "unhealthy")),
      h("td", { class: "muted" }, check.detail)));
  return [
    h("h1", {}, "Queues"),
    table(["Queue", "Storage", "Handler", "Messages by status", { label: "Processed/s", num: true },
      { label: "Failed/s", num: true }], rows, "No queues are configured."),
    h("p", { class: "muted" }, `Counts taken ${age(queues)}; rates are per second over the last minute. Refreshes every 5 s.`),
    h("h2", {}, "Since the host started (last hour at most)"),
    queues.length === 0 ? null : h("div", { class: "charts" }, queues.map((q, n) => chartCard(q.name, histories[n]))),
    h("h2", {}, "Blocked sessions"),
    table(["Queue", "Session", { label: "Blocked by", num: true }, "Status", { label: "Parked", num: true }, "Since", "Error"],
      blocked.map((b) => h("tr", { "data-session": b.session },
        h("td", {}, b.queue),
        h("td", {}, h("a", { href: `#/messages?queue=${encodeURIComponent(b.queue)}&session=${encodeURIComponent(b.session)}` }, b.session)),
        h("td", { class: "num" }, h("a", { href: messageHref(b.blocked_by_key) }, b.blocked_by_key)),
        h("td", {}, statusBadge(b.status)),
        h("td", { class: "num" }, b.parked),
        h("td", { class: "muted" }, time(b.since_ms)),
        errorCell(b.status, undefined, b.last_error))),
      "No session is blocked."),
    h("h2", {}, "Health"),
    table(["Check", "State", "Detail"], checks, "No health checks are registered.")];
}

function messageActions(m, after) {
  const act = async (what, call) => {
    try {
      await call();
      flash(`${what}: message ${m.key}`);
      after();
    } catch (e) {
      if (e instanceof Unauthorized) return askToken(e.message);
      flash(`${what} failed: ${e.message}`, true);
    }
  };
  const offered = actionsFor(m.status);
  if (offered.length === 0) {
    return h("div", { class: "actions muted", title: "The API refuses changes while a message runs" }, "running");
  }
  const buttons = {
    complete: () => h("button", {
      "data-action": "complete",
      onclick: () => act("Completed", () => api(`/messages/${m.key}/complete`, { method: "POST" })),
    }, "Complete"),
    fail: () => h("button", {
      class: "danger", "data-action": "fail",
      onclick: () => {
        const error = prompt(`Settle message ${m.key} as failed — why?`, "the handoff failed");
        if (error !== null) {
          act("Failed", () => api(`/messages/${m.key}/fail`, {
            method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ error }),
          }));
        }
      },
    }, "Fail"),
    retry: () => h("button", {
      "data-action": "retry", title: "Run it again now as a new delivery, attempts reset",
      onclick: () => act("Retried", () => api(`/messages/${m.key}/retry`, { method: "POST" })),
    }, "Retry"),
    delete: () => h("button", {
      class: "danger", "data-action": "delete",
      onclick: () => {
        const what = m.status === "processed" ? `the record of processed message ${m.key}` : `message ${m.key}`;
        if (confirm(`Delete ${what}? This cannot be undone.`)) {
          act("Deleted", () => api(`/messages/${m.key}`, { method: "DELETE" }));
        }
      },
    }, "Delete"),
  };
  return h("div", { class: "actions" }, offered.map((action) => buttons[action]()));
}

/**
 * The actions offered on a message in `status`. The API refuses retry and delete only while a
 * message runs (processing, awaiting release); of the rest, Retry is offered where running
 * the message again is what an operator wants — it failed, waits for a retry (sleeping: run
 * it now), was set aside in a custom status, or is a handed-off session blocker — and not on
 * a processed message (it succeeded), a pending one (it runs anyway) or a parked one (it runs
 * when its session is unblocked). Delete is offered on every message the API may delete.
 */
function actionsFor(status) {
  switch (status) {
    case "processing": case "awaiting-release": return [];
    case "handed-off": return ["complete", "fail", "retry", "delete"];
    case "processed": case "pending": case "parked": return ["delete"];
    default: return ["retry", "delete"];
  }
}

async function messages(params) {
  const queue = params.get("queue") || "";
  const status = params.get("status") || "";
  const id = params.get("id") || "";
  const session = params.get("session") || "";
  const cursor = params.get("cursor") || "";
  const query = new URLSearchParams();
  for (const [k, v] of [["queue", queue], ["status", status], ["id", id], ["session", session], ["cursor", cursor]]) {
    if (v) query.set(k, v);
  }
  query.set("limit", "50");
  const [queues, page] = await Promise.all([api("/queues"), api(`/messages?${query}`)]);
  const go = (changes) => {
    const next = new URLSearchParams(params);
    next.delete("cursor");
    for (const [k, v] of Object.entries(changes)) { if (v) next.set(k, v); else next.delete(k); }
    location.hash = `#/messages?${next}`;
  };
  const statuses = ["", "pending", "processing", "failed", "sleeping", "processed", "awaiting-release", "parked", "handed-off"];
  if (status && !statuses.includes(status)) statuses.push(status);
  const filters = h("form", { class: "toolbar", onsubmit: (e) => {
    e.preventDefault();
    const form = new FormData(e.target);
    go({ queue: form.get("queue"), status: form.get("status"), id: form.get("id").trim(), session: form.get("session").trim() });
  } },
  h("label", {}, "Queue", h("select", { name: "queue" },
    h("option", { value: "" }, "all queues"),
    queues.map((q) => h("option", { value: q.name, selected: q.name === queue }, q.name)))),
  h("label", {}, "Status", h("select", { name: "status" },
    statuses.map((s) => h("option", { value: s, selected: s === status }, s || "any status")))),
  h("label", {}, "MessageId", h("input", { name: "id", value: id, placeholder: "exact id" })),
  h("label", {}, "Session", h("input", { name: "session", value: session, placeholder: "session key" })),
  h("button", { type: "submit" }, "Filter"),
  queue && status && actionsFor(status).includes("retry") ? h("button", {
    type: "button", "data-action": "retry-all",
    onclick: async () => {
      if (!confirm(`Retry every ${status} message of ${queue}?`)) return;
      try {
        const done = await api(`/messages/retry?queue=${encodeURIComponent(queue)}&status=${encodeURIComponent(status)}`, { method: "POST" });
        flash(`Retried ${done.changed} messages`);
        route();
      } catch (e) {
        if (e instanceof Unauthorized) return askToken(e.message);
        flash(`Retry failed: ${e.message}`, true);
      }
    },
  }, `Retry all ${status}`) : null);
  const refresh = () => route();
  const rows = page.messages.map((m) => h("tr", { "data-key": m.key },
    h("td", { class: "num" }, h("a", { href: messageHref(m.key) }, m.key)),
    h("td", {}, m.queue),
    h("td", {}, statusBadge(m.status)),
    h("td", { class: "mono clip", title: m.id || "" }, m.id || "–"),
    h("td", { class: "num" }, m.attempts),
    errorCell(m.status, m.attempts, m.last_error),
    h("td", { class: "muted" }, time(m.updated_at_ms)),
    h("td", {}, messageActions(m, refresh))));
  const title = `${status ? `${status[0].toUpperCase()}${status.slice(1)} messages` : "Messages"}${queue ? ` in ${queue}` : ""}`;
  return [
    h("h1", {}, title),
    filters,
    table(["Key", "Queue", "Status", "MessageId", { label: "Attempts", num: true }, "Error", "Updated", ""],
      rows, "No messages match."),
    h("div", { class: "pager" },
      cursor ? h("a", { class: "button", href: `#/messages?${withoutCursor(params)}` }, "Newest") : null,
      page.next_cursor ? h("a", {
        class: "button", "data-action": "older",
        href: `#/messages?${withCursor(params, page.next_cursor)}`,
      }, "Older →") : null,
      h("span", { class: "muted" }, `${page.messages.length} shown, newest first`)),
    queue && status ? replayForm({ queue, status }) : null].filter(Boolean);
}

function withCursor(params, cursor) {
  const next = new URLSearchParams(params);
  next.set("cursor", cursor);
  return next;
}

function withoutCursor(params) {
  const next = new URLSearchParams(params);
  next.delete("cursor");
  return next;
}

/** Upload a candidate component and replay one message (`key`) or a queue's messages. */
function replayForm(target) {
  const result = h("div", { class: "replay-result" });
  const what = target.key !== undefined
    ? `message ${target.key}`
    : `the newest ${target.status} messages of ${target.queue} (up to 20)`;
  const form = h("form", { class: "card replay", "data-replay": "", onsubmit: async (e) => {
    e.preventDefault();
    const file = e.target.candidate.files[0];
    if (!file) return;
    const query = target.key !== undefined
      ? `key=${target.key}`
      : `queue=${encodeURIComponent(target.queue)}&status=${encodeURIComponent(target.status)}`;
    const button = e.target.querySelector("button");
    button.disabled = true;
    result.replaceChildren(h("p", { class: "muted" }, "Compiling the candidate and replaying…"));
    try {
      const report = await api(`/replay?${query}`, {
        method: "POST", headers: { "Content-Type": "application/wasm" }, body: file,
      });
      result.replaceChildren(replayReport(report));
    } catch (err) {
      if (err instanceof Unauthorized) return askToken(err.message);
      result.replaceChildren(h("p", { class: "error" }, err.message));
    } finally {
      button.disabled = false;
    }
  } },
  h("h2", {}, "Replay against a candidate"),
  h("p", { class: "muted" },
    `Runs ${what} against a new version of the handler, in the same sandbox and limits, without side effects: its enqueues are shown, not executed, and stored messages are not changed.`),
  h("div", { class: "toolbar" },
    h("label", {}, "Candidate component (.wasm)", h("input", { type: "file", name: "candidate", accept: ".wasm", required: true })),
    h("button", { type: "submit", class: "primary" }, "Replay")),
  result);
  return form;
}

function replayReport(report) {
  const rows = report.results.map((r) => h("tr", { "data-replayed": r.key },
    h("td", { class: "num" }, h("a", { href: messageHref(r.key) }, r.key)),
    h("td", { class: "clip", title: r.last || "" }, r.last || r.status),
    h("td", {}, h("span", { class: `badge ${r.succeeded ? "ok" : "bad"}` }, r.candidate)),
    h("td", {}, r.enqueues.map((e) => h("div", { class: "mono" }, `→ ${e.queue}: ${e.payload}`))),
    h("td", {}, r.logs.map((l) => h("div", { class: "mono" }, l)))));
  return h("div", {},
    h("p", { "data-summary": "" }, h("strong", {}, report.summary)),
    table(["Key", "Last outcome", "Candidate", "Would enqueue", "Logs"], rows, "No messages to replay."));
}

function payloadText(payload) {
  try { return JSON.stringify(JSON.parse(payload), null, 2); } catch (_) { return payload; }
}

async function message(key) {
  const detail = await api(`/messages/${encodeURIComponent(key)}`);
  const m = detail.message;
  const field = (name, value) => [h("dt", {}, name), h("dd", {}, value === null || value === undefined || value === "" ? "–" : value)];
  const history = detail.history.map((v) => h("tr", {},
    h("td", { class: "num" }, v.version),
    h("td", {}, statusBadge(v.status)),
    h("td", { class: "num" }, v.attempts),
    h("td", { class: "clip mono", title: v.payload }, v.payload),
    errorCell(v.status, v.attempts, v.last_error),
    h("td", { class: "muted" }, time(v.enqueued_at_ms))));
  const back = `#/messages?queue=${encodeURIComponent(m.queue)}&status=${encodeURIComponent(m.status)}`;
  return [
    h("h1", {}, `Message ${m.key} `, statusBadge(m.status)),
    h("div", { class: "toolbar" },
      h("a", { class: "button", href: back }, `← ${m.status} in ${m.queue}`),
      messageActions(m, () => route())),
    h("div", { class: "grid2" },
      h("div", { class: "card" }, h("dl", { class: "fields" },
        field("Queue", m.queue), field("MessageId", m.id), field("Delivery", m.delivery_id),
        field("Version", m.version), field("Attempts", m.attempts), field("Priority", m.priority),
        field("Enqueued", time(m.enqueued_at_ms)), field("Process at", time(m.process_at_ms)),
        field("Updated", time(m.updated_at_ms)), field("Processed", time(m.processed_at_ms)),
        field("Outcome", m.outcome),
        field("Trace", detail.trace_id ? h("span", { class: "mono", "data-trace": "" }, detail.trace_id) : null),
        m.last_error && !errorIsCurrent(m.status, m.attempts)
          ? field("Earlier attempt failed", h("span", { class: "muted", "data-earlier-error": "" }, m.last_error))
          : field("Last error", m.last_error ? h("span", { class: "error", "data-error": "" }, m.last_error) : null))),
      h("div", {},
        h("h2", { class: "flush" }, "Payload"), h("pre", { "data-payload": "" }, payloadText(m.payload)),
        h("h2", {}, "Headers"),
        m.headers.length === 0 ? h("p", { class: "muted" }, "None.") :
          h("dl", { class: "fields card" }, m.headers.map(([k, v]) => field(k, v))))),
    h("h2", {}, "History of this MessageId"),
    table([{ label: "Version", num: true }, "Status", { label: "Attempts", num: true }, "Payload", "Error", "Enqueued"],
      history, m.id ? "No earlier versions." : "This message has no MessageId, so no history."),
    replayForm({ key: m.key })];
}

async function handlers() {
  const [loaded, deploys, stored] = await Promise.all([api("/handlers"), api("/deploys"), api("/handler-versions")]);
  const rows = loaded.map((x) => h("tr", { "data-handler": x.name },
    h("td", {}, x.name),
    h("td", { class: "num", "data-version": "" }, x.version === undefined ? "–" : x.version),
    h("td", { class: "mono", title: x.sha256 }, x.sha256.slice(0, 16)),
    h("td", { class: "num" }, `${(x.size / 1024).toFixed(0)} KiB`),
    h("td", {}, x.memory_limit),
    h("td", { class: "muted" }, time(x.loaded_at)),
    h("td", { class: "muted clip", title: x.file }, x.file)));
  const log = deploys.map((d) => h("tr", { "data-deploy": d.result },
    h("td", { class: "muted" }, time(d.at)),
    h("td", {}, d.handler),
    h("td", {}, h("span", { class: `badge ${d.result === "deployed" ? "ok" : d.result === "rejected" ? "bad" : ""}` }, d.result)),
    h("td", { class: "mono" }, d.sha256 ? d.sha256.slice(0, 16) : "–"),
    h("td", { class: "error" }, d.reason || "")));
  const out = [
    h("h1", {}, "Handlers"),
    table(["Name", { label: "Version", num: true }, "SHA-256", { label: "Size", num: true }, "Memory cap", "Loaded", "File"], rows,
      "No handler is deployed: drop a .wasm file into the handlers directory, or `wharf handlers deploy FILE` with handlers_source = \"store\"."),
    h("h2", {}, "Deploy log"),
    table(["When", "Handler", "Result", "SHA-256", "Reason"], log, "Nothing deployed since the host started.")];
  if (stored.current.length || stored.hosts.length) {
    // Handlers from the shared store: the current versions and which host serves which since when.
    const current = stored.current.map((c) => h("tr", { "data-current": c.name },
      h("td", {}, c.name), h("td", { class: "num" }, c.version),
      h("td", { class: "mono", title: c.sha256 }, c.sha256.slice(0, 16))));
    const served = stored.hosts.slice().reverse().map((s) => h("tr", { "data-served": s.host },
      h("td", { class: "muted" }, time(s.since_ms)),
      h("td", { class: "mono" }, s.host),
      h("td", {}, s.name),
      h("td", { class: "num" }, s.version),
      h("td", {}, h("span", { class: `badge ${s.result === "serving" ? "ok" : "bad"}` }, s.result)),
      h("td", { class: "error" }, s.error || "")));
    out.push(h("h2", {}, "Shared store: current versions"),
      table(["Handler", { label: "Version", num: true }, "SHA-256"], current, "No handler in the store."),
      h("h2", {}, "Shared store: which host serves which version"),
      table(["Since", "Host", "Handler", { label: "Version", num: true }, "Result", "Reason"], served, "No host has served a stored version yet."));
  }
  return out;
}

// ---- Schedules and hosts -------------------------------------------------------------------

async function schedules() {
  const [all, hosts] = await Promise.all([api("/schedules"), api("/hosts")]);
  const rows = all.map((s) => h("tr", { "data-schedule": s.name },
    h("td", {}, s.name),
    h("td", { class: "mono" }, s.cron, h("span", { class: "muted" }, ` ${s.timezone}`)),
    h("td", {}, h("a", { href: `#/messages?queue=${encodeURIComponent(s.queue)}` }, s.queue)),
    h("td", { "data-next": "" }, s.next_tick_ms === null ? "never again" : time(s.next_tick_ms)),
    h("td", { "data-last": "" }, time(s.last_tick_ms)),
    h("td", { class: "mono", "data-host": "" }, s.last_host || "–"),
    h("td", { class: "num", "data-enqueued": "" }, s.enqueued),
    h("td", { class: "num" }, s.missed),
    h("td", {}, s.catch_up)));
  const hostRows = hosts.map((x) => h("tr", { "data-host-id": x.id },
    h("td", { class: "mono" }, x.id),
    h("td", {}, h("span", { class: `badge ${x.alive ? "ok" : ""}` },
      x.alive ? "alive" : x.stopped_at_ms !== null ? "stopped" : "gone")),
    h("td", { class: "muted" }, time(x.started_at_ms)),
    h("td", { class: "muted" }, time(x.seen_at_ms))));
  return [
    h("h1", {}, "Schedules"),
    h("p", { class: "muted" }, "Each tick is enqueued once, by one of the hosts sharing the store. Times are UTC."),
    table(["Name", "Cron", "Queue", "Next tick", "Last tick", "Enqueued by", { label: "Enqueued", num: true },
      { label: "Missed", num: true }, "Catch-up"], rows,
      "No schedule: add [schedules.NAME] with cron and queue to wharf.toml."),
    h("h2", {}, "Hosts"),
    table(["Host", "State", "Started", "Last seen"], hostRows, "No host has used this store yet.")];
}

// ---- Handlers' key-value state (read-only) -----------------------------------------------

const STATE_PAGE = 100;

async function buckets() {
  const all = await api("/state");
  const rows = all.map((b) => h("tr", { "data-bucket": b.bucket },
    h("td", {}, h("a", { href: `#/state/${encodeURIComponent(b.bucket)}` }, b.bucket)),
    h("td", { class: "num" }, b.keys),
    h("td", {}, b.granted_to.length ? b.granted_to.join(", ")
      : h("span", { class: "muted" }, "no handler (its keys stay until deleted)"))));
  return [
    h("h1", {}, "State"),
    h("p", { class: "muted" }, "Handlers' key-value buckets (wasi:keyvalue), as committed with their messages' outcomes. ",
      "Read-only here; ", h("code", {}, "wharf state delete BUCKET KEY"), " removes a key."),
    table(["Bucket", { label: "Keys", num: true }, "Granted to"], rows,
      "No bucket: grant one to a handler with [handlers.NAME] keyvalue = [\"BUCKET\"] in wharf.toml.")];
}

async function bucket(name, params) {
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  // One more than a page tells whether a next page exists.
  const entries = await api(`/state/${encodeURIComponent(name)}?limit=${STATE_PAGE + 1}&offset=${offset}`);
  const page = entries.slice(0, STATE_PAGE);
  const at = (o) => `#/state/${encodeURIComponent(name)}${o ? `?offset=${o}` : ""}`;
  const rows = page.map((e) => h("tr", { "data-key": e.key },
    h("td", { class: "mono" }, e.key),
    h("td", { class: "mono clip", title: e.value, "data-value": "" }, e.value),
    h("td", { class: "num" }, e.revision)));
  return [
    h("h1", {}, `State: ${name}`),
    table(["Key", "Value", { label: "Revision", num: true }], rows,
      offset ? "No keys past this point." : "This bucket holds no key."),
    h("div", { class: "pager" },
      offset ? h("a", { class: "button", href: at(Math.max(0, offset - STATE_PAGE)) }, "← Previous") : null,
      entries.length > STATE_PAGE ? h("a", { class: "button", "data-action": "next", href: at(offset + STATE_PAGE) }, "Next →") : null,
      h("span", { class: "muted" }, page.length ? `keys ${offset + 1}–${offset + page.length}, in key order` : "")),
    h("p", {}, h("a", { href: "#/state" }, "All buckets"))];
}

// ---- Token and routing ------------------------------------------------------------------

function askToken(reason) {
  clearTimeout(refreshTimer);
  const form = document.getElementById("token-form").content.cloneNode(true).firstElementChild;
  const stored = sessionStorage.getItem(TOKEN_KEY);
  if (stored) form.querySelector("[data-error]").textContent = reason || "The token was refused.";
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, form.token.value);
    route();
  });
  show(form);
  form.token.focus();
}

/** Bumped by every navigation: a slower, earlier view never replaces a newer one. */
let generation = 0;

async function route() {
  clearTimeout(refreshTimer);
  const mine = ++generation;
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, search] = hash.split("?");
  const params = new URLSearchParams(search || "");
  const nav = path === "/messages" ? (params.get("status") === "failed" ? "failed" : "messages")
    : path.startsWith("/message/") ? (NAVS.includes(params.get("from")) ? params.get("from") : "messages")
    : path === "/handlers" ? "handlers"
    : path === "/schedules" ? "schedules"
    : path === "/state" || path.startsWith("/state/") ? "state" : "overview";
  currentNav = nav;
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", link.dataset.nav === nav);
  }
  document.getElementById("sign-out").hidden = !sessionStorage.getItem(TOKEN_KEY);
  try {
    let nodes;
    if (path === "/messages") nodes = await messages(params);
    else if (path.startsWith("/message/")) nodes = await message(decodeURIComponent(path.slice("/message/".length)));
    else if (path === "/handlers") nodes = await handlers();
    else if (path === "/schedules") nodes = await schedules();
    else if (path === "/state") nodes = await buckets();
    else if (path.startsWith("/state/")) nodes = await bucket(decodeURIComponent(path.slice("/state/".length)), params);
    else nodes = await overview();
    if (mine !== generation) return;
    show(...nodes);
    if (nav === "overview") refreshTimer = setTimeout(route, REFRESH_MS);
    else healthBadge();
  } catch (e) {
    if (mine !== generation) return;
    if (e instanceof Unauthorized) askToken(e.message);
    else show(h("div", { class: "card error", "data-error": "" }, e.message));
  }
}

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  route();
});
window.addEventListener("hashchange", route);
route();
