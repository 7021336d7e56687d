// delayq dashboard: vanilla JavaScript, no dependencies, no network beyond this service.
//
// Rules this file keeps (tests/service/test_dashboard.py checks them in a real browser):
// - data from the API is only ever written with textContent / text nodes, never as markup, so
//   an id, payload, header or reason is shown, never run (the CSP forbids inline scripts too);
// - a payload is shown only up to PREVIEW_CHARS characters;
// - only the visible page polls, one request at a time, and not while the tab is hidden: an
//   open dashboard costs the service one cached read every few seconds.
"use strict";

(() => {
  const topic = document.querySelector('meta[name="delayq-topic"]').content;
  const API = `v1/topics/${encodeURIComponent(topic)}`;
  const TOKEN_KEY = "delayq-token";
  const POLL_MS = { overview: 5000, slots: 10000, schedules: 10000 };
  const PREVIEW_CHARS = 2000;
  const LIST_PREVIEW_CHARS = 80;
  const REASON_CHARS = 200;
  const SLOT_PAGE = 256;
  const DEAD_PAGE = 50;
  const HISTORY = 60;

  const $ = (id) => document.getElementById(id);
  let token = sessionStorage.getItem(TOKEN_KEY) || "";
  let timer = null;
  let busy = false;

  // ---- helpers ---------------------------------------------------------------------------

  /** An element with attributes and children; strings become text nodes (never markup). */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (name === "className") node.className = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function fill(list, pairs) {
    list.replaceChildren(
      ...pairs.flatMap(([term, value]) => [el("dt", {}, term), el("dd", {}, value)]),
    );
  }

  const number = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));

  function duration(ms) {
    if (ms === null || ms === undefined) return "—";
    const abs = Math.abs(ms);
    if (abs < 1000) return `${Math.round(ms)} ms`;
    if (abs < 60000) return `${(ms / 1000).toFixed(1)} s`;
    const s = Math.round(abs / 1000);
    const parts = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
    const out = [];
    let rest = s;
    for (const [unit, name] of parts) {
      if (rest >= unit && out.length < 2) {
        out.push(`${Math.floor(rest / unit)} ${name}`);
        rest %= unit;
      }
    }
    return (ms < 0 ? "-" : "") + out.join(" ");
  }

  function instant(ms, nowMs) {
    if (ms === null || ms === undefined) return "—";
    const text = new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC");
    if (nowMs === undefined) return text;
    const delta = ms - nowMs;
    return `${text} (${delta >= 0 ? "in " + duration(delta) : duration(-delta) + " ago"})`;
  }

  function clip(text, limit) {
    return text.length > limit ? text.slice(0, limit) + "…" : text;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  class ApiError extends Error {
    constructor(status, message, field) {
      super(message);
      this.status = status;
      this.field = field;
    }
  }

  /** One JSON call with the bearer token; errors carry the API's message and field. A status
   * in `answered` whose body is no error is an answer (a dead action's 404 lists each id). */
  async function call(method, path, body, answered = []) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new ApiError(0, `the service does not answer (${error.message})`);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (error) {
      data = null;
    }
    if (!response.ok && !(answered.includes(response.status) && data && !data.error)) {
      const message = data && data.error ? data.error : `HTTP ${response.status}`;
      throw new ApiError(response.status, message, data && data.field);
    }
    return data;
  }

  function explain(error) {
    if (error.status === 401) {
      $("token-input").focus();
      return "this service needs a token: enter the API token (or the read-only token) above";
    }
    return error.message + (error.field ? ` (field: ${error.field})` : "");
  }

  function stamp(id) {
    $(id).textContent = `updated ${new Date().toLocaleTimeString("en-GB")}`;
  }

  function markLoaded(section) {
    const node = $(section);
    node.dataset.loads = String(Number(node.dataset.loads || 0) + 1);
  }

  /** A modal confirmation; resolves true only on the explicit "Do it" (Escape keeps). */
  function confirmAction(text, verb) {
    const dialog = $("confirm");
    return new Promise((resolve) => {
      $("confirm-text").textContent = text;
      $("confirm-yes").textContent = verb;
      const finish = (answer) => {
        $("confirm-yes").onclick = null;
        $("confirm-no").onclick = null;
        dialog.oncancel = null;
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      $("confirm-yes").onclick = () => finish(true);
      $("confirm-no").onclick = () => finish(false);
      dialog.oncancel = () => finish(false);
      dialog.showModal();
      $("confirm-no").focus();
    });
  }

  // ---- overview --------------------------------------------------------------------------

  let previous = null; // the last process reading, for rates over the poll window
  const history = [];

  function windowQuantile(bounds, before, after, q) {
    const counts = after.map((c, i) => c - (before ? before[i] : 0));
    const total = counts[counts.length - 1];
    if (!total) return null;
    for (let i = 0; i < counts.length; i++) {
      if (counts[i] >= q * total) return i < bounds.length ? bounds[i] : bounds[bounds.length - 1];
    }
    return bounds[bounds.length - 1];
  }

  function delivered(process) {
    const d = process.deliveries;
    return (d.acked || 0) + (d.leased || 0);
  }

  async function loadOverview() {
    const o = await call("GET", `${API}/overview`);
    const d = o.depth;
    fill($("depth"), [
      ["Waiting (not yet due)", number(d.scheduled - d.due)],
      ["Due, not yet claimed", number(d.due)],
      ["In flight (leased)", number(d.prepared)],
      ["Dead", number(d.dead)],
      ["Total", number(d.scheduled + d.prepared + d.dead)],
    ]);
    fill($("timing"), [
      ["Next due", instant(o.nextDueMs, o.nowMs)],
      ["Oldest overdue", o.oldestOverdueMs ? duration(o.oldestOverdueMs) : "none"],
      ["Redis time", instant(o.nowMs)],
      ["Delivery", `${o.topicType}, ${number(o.slotAmount)} slots`],
    ]);
    const f = o.fleet;
    const listed = (count, slots) =>
      `⚠ ${number(count)}: ${slots.join(", ")}${count > slots.length ? ", …" : ""}`;
    fill($("fleet"), f.error ? [
      ["Ownership", `⚠ unknown (${f.error})`],
      ["Stalled slots", f.stalledSlots ? listed(f.stalledSlots, f.stalled) : "none"],
    ] : [
      ["Processes", `${f.members.length}: ${f.members.join(", ") || "none"}`],
      ["Slots held", `${number(f.heldSlots)} of ${number(o.slotAmount)}`],
      ["Unowned slots", f.unownedSlots ? listed(f.unownedSlots, f.unowned) : "none"],
      ["Stalled slots", f.stalledSlots ? listed(f.stalledSlots, f.stalled) : "none"],
    ]);
    const p = o.process;
    const lateness = p.lateness;
    let rate = "— (next poll)";
    let window = null;
    if (previous && previous.member === p.member) {
      const seconds = (Date.now() - previous.at) / 1000;
      if (seconds > 0) rate = `${(Math.max(0, delivered(p) - delivered(previous.p)) / seconds).toFixed(1)} /s`;
      window = {
        p50: windowQuantile(lateness.boundsMs, previous.p.lateness.counts, lateness.counts, 0.5),
        p99: windowQuantile(lateness.boundsMs, previous.p.lateness.counts, lateness.counts, 0.99),
        n: lateness.counts[lateness.counts.length - 1] - previous.p.lateness.counts[lateness.counts.length - 1],
      };
      history.push({ p50: window.p50, p99: window.p99 });
      if (history.length > HISTORY) history.shift();
    }
    previous = { member: p.member, p, at: Date.now() };
    fill($("process"), [
      ["Process", p.member],
      ["Delivery rate", rate],
      ["Delivered", number(delivered(p))],
      ["Failed attempts", number(p.deliveries.failed || 0)],
      ["Sent to dead", number(p.dead)],
      ["Lateness p50 / p99", `≤ ${p.latenessP50Ms ?? "—"} ms / ≤ ${p.latenessP99Ms ?? "—"} ms`],
      ["Lateness objective", objectiveText(o.latenessObjectiveMs, o.objectiveWindowMs, window)],
      ...(o.webhookConcurrency == null ? [] : [[
        "Webhook POSTs allowed",
        `${number(o.webhookConcurrency)} of ${number(o.webhookMaxInFlight)}` +
          (o.webhookConcurrency < o.webhookMaxInFlight
            ? " (halved on timeouts and 5xx, growing back)" : ""),
      ]]),
    ]);
    renderDelivery(o.pausedBrokers, o.brokers, o.paced, o.rateLimitPerSecond, o.receiverHoldMs);
    renderHistogram(o.dueHistogram);
    renderLateness(window, o.latenessObjectiveMs);
    stamp("overview-updated");
    markLoaded("page-overview");
    return o;
  }

  /** Paused or running, in words (the colour only repeats it), and the button that changes
   *  it: a topic paused on some brokers only (a pause that failed half-way) offers both. */
  function renderDelivery(pausedBrokers, brokers, paced, rateLimit, holdMs) {
    const paused = pausedBrokers.length > 0;
    const partly = paused && pausedBrokers.length < brokers;
    const pace = rateLimit ? ` at most ${rateLimit}/s` : "";
    const held = holdMs > 0
      ? `▶ running, held by the receiver's Retry-After for ${Math.ceil(holdMs / 1000)} s more`
      : null;
    $("delivery-state").textContent = !paused
      ? (held ?? (paced ? `▶ running, paced${pace} (rate limit or the receiver's Retry-After)`
                        : `▶ running${pace}`))
      : `⏸ paused${partly ? ` on broker(s) ${pausedBrokers.join(", ")}` : ""} — nothing is ` +
        "claimed; scheduling goes on";
    $("delivery").classList.toggle("paused", paused);
    $("pause-button").hidden = paused && !partly;
    $("resume-button").hidden = !paused;
  }

  async function setPaused(paused) {
    const text = paused
      ? "Pause delivery of the whole topic? Nothing is claimed until it is resumed; " +
        "scheduling goes on and what is in flight finishes."
      : "Resume delivery? The backlog of due messages is delivered now.";
    if (!(await confirmAction(text, paused ? "Pause" : "Resume"))) return;
    await call("POST", `${API}/${paused ? "pause" : "resume"}`);
    await loadOverview();
  }

  function renderHistogram(h) {
    const rows = [
      ["Overdue (due, not claimed)", h.overdue],
      ["Next minute", h.nextMinute],
      ["Next hour", h.nextHour],
      ["Next day", h.nextDay],
      ["Later", h.later],
    ];
    const max = Math.max(1, ...rows.map((r) => r[1]));
    $("histogram").tBodies[0].replaceChildren(
      ...rows.map(([label, count]) => {
        const bar = el("span", { className: "bar-fill" });
        bar.style.width = `${(100 * count) / max}%`;
        return el(
          "tr", {},
          el("th", { scope: "row" }, label),
          el("td", { className: "num" }, number(count)),
          el("td", { className: "bar", "aria-hidden": "true" }, bar),
        );
      }),
    );
  }

  /** spec.objectives against this process's p99 of the last poll window, in words (the
   *  operator's ObjectiveMet condition measures every pod over the objective's window). */
  function objectiveText(objectiveMs, windowMs, window) {
    if (!objectiveMs) return "none (spec.objectives.latenessP99)";
    const stated = `p99 ≤ ${duration(objectiveMs)} over ${duration(windowMs)}`;
    if (!window || window.n <= 0 || window.p99 === null) return `${stated}; no deliveries in the last poll`;
    const verdict = window.p99 > objectiveMs ? "⚠ above it" : "within it";
    return `${stated}; last poll p99 ≤ ${window.p99} ms: ${verdict}`;
  }

  function renderLateness(window, objectiveMs) {
    const svg = $("lateness-chart");
    const ns = "http://www.w3.org/2000/svg";
    const values = history.flatMap((h) => [h.p50, h.p99]).filter((v) => v !== null);
    const top = Math.max(1, objectiveMs || 0, ...values);
    const line = (key, cls) => {
      const points = history
        .map((h, i) => (h[key] === null ? null : `${(i * 600) / (HISTORY - 1)},${120 - (h[key] / top) * 110}`))
        .filter((p) => p !== null)
        .join(" ");
      const node = document.createElementNS(ns, "polyline");
      node.setAttribute("points", points);
      node.setAttribute("class", cls);
      return node;
    };
    const lines = [line("p50", "p50"), line("p99", "p99")];
    if (objectiveMs) {
      const y = 120 - (objectiveMs / top) * 110;
      const objective = document.createElementNS(ns, "line");
      for (const [name, value] of [["x1", 0], ["x2", 600], ["y1", y], ["y2", y]]) {
        objective.setAttribute(name, value);
      }
      objective.setAttribute("class", "objective");
      lines.push(objective);
    }
    svg.replaceChildren(...lines);
    const goal = objectiveMs ? ` The dotted line is the p99 objective, ${objectiveMs} ms.` : "";
    $("lateness-summary").textContent = (window && window.n > 0
      ? `Last poll window: ${number(window.n)} deliveries, p50 ≤ ${window.p50} ms (solid line), ` +
        `p99 ≤ ${window.p99} ms (dashed line); chart top ${top} ms.`
      : "No deliveries by this process in the last poll window.") + goal;
  }

  // ---- slots -----------------------------------------------------------------------------
  //
  // A heat map of every slot (one canvas, one cell a slot: readable at 16,384 slots, where a
  // table is not) from `/slots/heat`, and the table for a selection of it (`/slots`).

  const HEAT_WIDTH_PX = 768;
  const MAX_TABLE = 1024; // the API's page bound
  let slotStart = 0;
  let slotCount = SLOT_PAGE;
  const slotStarts = [];
  let heat = null; // the last `/slots/heat` answer
  let heatLayout = null; // {cols, cell}
  let dragFrom = null;

  /** `t` in 0..1 between two RGB colours. */
  function mix(from, to, t) {
    const c = from.map((v, i) => Math.round(v + (to[i] - v) * t));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  const EMPTY = [246, 248, 250];
  const EMPTY_COLOUR = mix(EMPTY, EMPTY, 0);
  const BLUE = [5, 80, 174];
  const RED = [164, 14, 38];

  /** A colour per slot for the chosen measure, and the legend that says what it means. */
  function heatColours(h, measure) {
    if (measure === "owner") {
      const colours = h.members.map((_, i) => `hsl(${(i * 137.5) % 360},60%,55%)`);
      const legend = h.owner === null
        ? `ownership unknown: ${h.fleetError}`
        : `${h.members.length} member(s), hue by member; black: unowned`;
      const of = (i) => (h.owner === null ? "rgb(200,200,200)" : h.owner[i] < 0 ? "rgb(27,31,36)" : colours[h.owner[i]]);
      return { of, legend };
    }
    const values = h[measure];
    const top = Math.max(1, ...values);
    const scale = Math.log1p(top);
    const hot = measure === "oldestOverdueMs" ? RED : BLUE;
    const what = measure === "oldestOverdueMs" ? duration(top) : number(top);
    return {
      of: (i) => (values[i] === 0 ? EMPTY_COLOUR : mix(EMPTY, hot, 0.15 + 0.85 * (Math.log1p(values[i]) / scale))),
      legend: `pale: 0, darkest: ${what} (log scale); red: stalled, black: unowned; amber outline: the table's slots`,
    };
  }

  /** Slots `first`..`last` (a run in slot order) as at most three rectangles of cells
   *  [x, y, width, height]: the part of the first row, the full rows, the part of the last. */
  function runRects(first, last, cols) {
    const top = Math.floor(first / cols);
    const bottom = Math.floor(last / cols);
    if (top === bottom) return [[first % cols, top, (last % cols) - (first % cols) + 1, 1]];
    const rects = [];
    let fullTop = top;
    let fullBottom = bottom;
    if (first % cols !== 0) {
      rects.push([first % cols, top, cols - (first % cols), 1]);
      fullTop += 1;
    }
    if (last % cols !== cols - 1) {
      rects.push([0, bottom, (last % cols) + 1, 1]);
      fullBottom -= 1;
    }
    if (fullBottom >= fullTop) rects.push([0, fullTop, cols, fullBottom - fullTop + 1]);
    return rects;
  }

  function drawHeat() {
    const h = heat;
    const n = h.slotAmount;
    const cols = 2 ** Math.ceil(Math.log2(Math.sqrt(n)));
    const cell = Math.max(3, Math.min(40, Math.floor(HEAT_WIDTH_PX / cols)));
    const rows = Math.ceil(n / cols);
    heatLayout = { cols, cell };
    const canvas = $("heat-map");
    canvas.width = cols * cell;
    canvas.height = rows * cell;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    const measure = $("heat-colour").value;
    const { of, legend } = heatColours(h, measure);
    const gap = cell >= 6 ? 1 : 0;
    for (let i = 0; i < n; i += 1) {
      ctx.fillStyle = of(i);
      ctx.fillRect((i % cols) * cell, Math.floor(i / cols) * cell, cell - gap, cell - gap);
    }
    if (measure !== "owner") {
      // what needs attention covers the measure: a stalled or unowned slot at 16,384 cells
      // must be found at a glance (the table says which, in words)
      for (let i = 0; i < n; i += 1) {
        const unowned = h.owner !== null && h.owner[i] < 0;
        if (!h.stalled[i] && !unowned) continue;
        ctx.fillStyle = unowned ? "rgb(27,31,36)" : "rgb(164,14,38)";
        ctx.fillRect((i % cols) * cell, Math.floor(i / cols) * cell, cell - gap, cell - gap);
      }
    }
    // the table's slots: an amber outline around their run of cells, which covers nothing
    ctx.strokeStyle = "rgb(230,150,0)";
    ctx.lineWidth = 2;
    const last = Math.min(n, slotStart + slotCount) - 1;
    for (const [x, y, w, hgt] of runRects(slotStart, last, cols)) {
      ctx.strokeRect(x * cell + 1, y * cell + 1, w * cell - 2, hgt * cell - 2);
    }
    $("heat-legend").textContent = legend;
    const unownedNote = h.owner === null ? "unknown" : number(h.owner.filter((o) => o < 0).length);
    canvas.setAttribute(
      "aria-label",
      `Heat map of ${number(n)} slots by ${$("heat-colour").selectedOptions[0].text}: ` +
        `${number(h.stalled.filter(Boolean).length)} stalled, ${unownedNote} unowned`,
    );
  }

  /** The slot under a mouse event on the map (null outside its cells). */
  function slotAt(event) {
    if (heat === null || heatLayout === null) return null;
    const canvas = $("heat-map");
    const box = canvas.getBoundingClientRect();
    const x = Math.floor(((event.clientX - box.left) * canvas.width) / box.width / heatLayout.cell);
    const y = Math.floor(((event.clientY - box.top) * canvas.height) / box.height / heatLayout.cell);
    const slot = y * heatLayout.cols + x;
    return x >= 0 && x < heatLayout.cols && slot >= 0 && slot < heat.slotAmount ? slot : null;
  }

  function describeSlot(slot) {
    const h = heat;
    const owner = h.owner === null ? "unknown" : h.owner[slot] < 0 ? "none" : h.members[h.owner[slot]];
    const overdue = h.oldestOverdueMs[slot] ? `, oldest overdue ${duration(h.oldestOverdueMs[slot])}` : "";
    return `slot ${slot}: ${number(h.scheduled[slot])} scheduled, ${number(h.due[slot])} due${overdue}, owner ${owner}`;
  }

  /** Show slots `from`..`to` in the table (at most MAX_TABLE). */
  function selectSlots(from, to) {
    const low = Math.max(0, Math.min(from, to));
    slotStart = low;
    slotCount = Math.max(1, Math.min(MAX_TABLE, Math.abs(to - from) + 1));
    slotStarts.length = 0;
    $("slots-from").value = String(low);
    $("slots-to").value = String(low + slotCount - 1);
    refresh();
  }

  async function loadSlots() {
    const only = $("slots-only").value;
    const [page, o, h] = await Promise.all([
      call("GET", `${API}/slots?start=${slotStart}&count=${slotCount}&only=${only}`),
      call("GET", `${API}/overview`),
      call("GET", `${API}/slots/heat`),
    ]);
    heat = h;
    drawHeat();
    const f = o.fleet;
    $("slots-summary").textContent =
      `${number(o.slotAmount)} slots, ${number(f.heldSlots)} held by ${f.members.length} ` +
      `process(es); unowned: ${number(f.unownedSlots)}; stalled (due unclaimed for ` +
      `${duration(f.stalledAfterMs)} or more): ${number(f.stalledSlots)}.`;
    $("slots-table").tBodies[0].replaceChildren(
      ...page.slots.map((s) => {
        const status = !s.held ? "⚠ unowned" : s.stalled ? "⚠ stalled" : s.paused ? "⏸ paused" : "ok";
        const owner = s.owner ?? (s.assigned ? `none (assigned to ${s.assigned})` : "none");
        return el(
          "tr", { className: !s.held ? "unowned" : s.stalled ? "stalled" : "", "data-slot": String(s.slot) },
          el("th", { scope: "row" }, String(s.slot)),
          el("td", {}, status),
          el("td", {}, owner),
          el("td", { className: "num" }, s.epoch === null ? "—" : String(s.epoch)),
          el("td", { className: "num" }, String(s.broker)),
          el("td", { className: "num" }, number(s.scheduled)),
          el("td", { className: "num" }, number(s.due)),
          el("td", { className: "num" }, number(s.prepared)),
          el("td", { className: "num" }, number(s.dead)),
          el("td", { className: "num" }, s.oldestOverdueMs ? duration(s.oldestOverdueMs) : "—"),
        );
      }),
    );
    $("slots-next").disabled = page.nextStart === null;
    $("slots-next").dataset.next = page.nextStart === null ? "" : String(page.nextStart);
    $("slots-prev").disabled = slotStarts.length === 0;
    stamp("slots-updated");
    markLoaded("page-slots");
  }

  // ---- message ---------------------------------------------------------------------------

  // {id, slot} of the message on screen: its actions address it by the slot the lookup
  // answered, whether it was found by id, slot basis or slot
  let shown = null;

  /** The API path of a message, addressed by at most one of `where.basis` and `where.slot`
   *  (strings; empty when not given). */
  function messagePath(id, where, suffix = "") {
    const query = new URLSearchParams();
    if (where.basis) query.set("slotBasis", where.basis);
    if (where.slot !== "") query.set("slot", where.slot);
    const text = query.toString();
    return `${API}/messages/${encodeURIComponent(id)}${suffix}${text ? "?" + text : ""}`;
  }

  /** The message page's address for a message in a known slot (the dead list's links):
   *  `#/message/<percent-encoded id>?slot=N`; `#/message/<id>` alone looks it up by id. */
  function messageHash(id, slot) {
    return `#/message/${encodeURIComponent(id)}?slot=${slot}`;
  }

  async function lookUp(id, where) {
    $("message-status").textContent = "";
    $("message-result").hidden = true;
    shown = null;
    let m;
    try {
      m = await call("GET", messagePath(id, where));
    } catch (error) {
      if (error.status === 404) {
        $("message-status").textContent = `Not found: ${error.message}`;
        return;
      }
      throw error;
    }
    shown = { id, slot: String(m.slot) };
    const nowMs = Date.now();
    fill($("message-fields"), [
      ["Id", m.id],
      ["State", m.state],
      ["Slot", String(m.slot)],
      ["Due", instant(m.dueMs, nowMs)],
      ["Attempts", number(m.attempts)],
      ["Priority", number(m.priority)],
      ["Group", m.group ?? "—"],
      ["Lease deadline", instant(m.leaseDeadlineMs, nowMs)],
      ["Died", instant(m.diedMs, nowMs)],
      ["Last error", m.deadReason ?? "—"],
    ]);
    $("message-headers").tBodies[0].replaceChildren(
      ...Object.entries(m.headers || {}).map(([name, value]) =>
        el("tr", {}, el("td", { className: "id" }, name), el("td", { className: "id" }, value)),
      ),
    );
    const payload = m.payload || "";
    $("message-payload").textContent = clip(payload, PREVIEW_CHARS);
    $("payload-note").textContent =
      `(${m.encoding}, ${number(payload.length)} characters` +
      (payload.length > PREVIEW_CHARS ? `, first ${number(PREVIEW_CHARS)} shown)` : ")");
    $("reschedule-form").hidden = m.state !== "scheduled";
    $("redrive-button").hidden = m.state !== "dead";
    $("cancel-button").hidden = m.state === "dead";
    $("message-result").hidden = false;
    markLoaded("page-message");
  }

  async function cancelShown() {
    if (!shown) return;
    const ok = await confirmAction(`Cancel message “${shown.id}”? It will never be delivered.`, "Cancel message");
    if (!ok) return;
    const answer = await call("DELETE", messagePath(shown.id, shown));
    $("message-result").hidden = true;
    $("message-status").textContent = `Message “${answer.id}”: ${answer.result}.`;
    shown = null;
  }

  async function redriveShown() {
    if (!shown) return;
    const ok = await confirmAction(`Redrive dead message “${shown.id}”? It is delivered again now.`, "Redrive");
    if (!ok) return;
    const target = { id: shown.id, slot: Number(shown.slot) };
    const answer = await call("POST", `${API}/dead/redrive`, { ids: [target] });
    await lookUp(shown.id, shown);
    $("message-status").textContent = `Message “${answer.results[0].id}”: ${answer.results[0].result}.`;
  }

  async function rescheduleShown(seconds) {
    if (!shown) return;
    const answer = await call("POST", messagePath(shown.id, shown, "/reschedule"), {
      delayMs: Math.round(seconds * 1000),
    });
    await lookUp(shown.id, shown);
    $("message-status").textContent = `Message “${answer.id}”: ${answer.result}, due ${instant(answer.dueMs)}.`;
  }

  // ---- dead letters ----------------------------------------------------------------------

  let deadCursor = null;
  let deadNext = null;

  async function loadDead() {
    const cursor = deadCursor ? `&cursor=${encodeURIComponent(deadCursor)}` : "";
    const [page, stats] = await Promise.all([
      call("GET", `${API}/dead?count=${DEAD_PAGE}${cursor}`),
      call("GET", `${API}/stats`),
    ]);
    deadNext = page.nextCursor;
    $("dead-count").textContent = `${number(stats.dead)} dead in the topic`;
    const nowMs = Date.now();
    $("dead-table").tBodies[0].replaceChildren(
      ...page.messages.map((m) => {
        const box = el("input", { type: "checkbox", "aria-label": `Select ${clip(m.id, 80)}` });
        box.dataset.id = m.id;
        box.dataset.slot = String(m.slot);
        // with its slot: the dead record does not keep a slot basis, so the id may not find it
        const link = el("a", { href: messageHash(m.id, m.slot), className: "id" }, clip(m.id, 120));
        return el(
          "tr", {},
          el("td", {}, box),
          el("td", {}, link),
          el("td", { className: "num" }, String(m.slot)),
          el("td", { className: "num" }, number(m.attempts)),
          el("td", { className: "num" }, number(m.priority)),
          el("td", { className: "id" }, clip(m.group ?? "—", LIST_PREVIEW_CHARS)),
          el("td", {}, instant(m.diedMs, nowMs)),
          el("td", {}, clip(m.deadReason || "—", REASON_CHARS)),
          el("td", { className: "preview" }, clip(m.payload || "", LIST_PREVIEW_CHARS)),
        );
      }),
    );
    $("dead-select-all").checked = false;
    $("dead-next").disabled = deadNext === null;
    markLoaded("page-dead");
  }

  /** The checked rows as {id, slot}: the slot the page lists routes a message scheduled
   *  with a slot basis, which its id alone would not find. */
  function selectedDead() {
    return [...$("dead-table").tBodies[0].querySelectorAll("input[type=checkbox]:checked")].map(
      (box) => ({ id: box.dataset.id, slot: Number(box.dataset.slot) }),
    );
  }

  async function deadAction(action, all) {
    const ids = all ? [] : selectedDead();
    if (!all && ids.length === 0) {
      $("dead-status").textContent = "Select dead messages first.";
      return;
    }
    const what = all ? "every dead message of the topic" : `${ids.length} selected dead message(s)`;
    const text = action === "redrive"
      ? `Redrive ${what}? They are scheduled again and delivered now.`
      : `Purge ${what}? They are deleted for good.`;
    const verb = action === "redrive" ? "Redrive" : "Purge";
    if (!(await confirmAction(text, verb))) return;
    const answer = await call("POST", `${API}/dead/${action}`, all ? { all: true } : { ids }, [404]);
    // the list is reloaded before the outcome is told, so what the status says is on screen
    deadCursor = null;
    await loadDead();
    if (all) {
      $("dead-status").textContent = `${verb}: ${number(answer.moved)} message(s).`;
    } else {
      const done = answer.results.filter((r) => r.result === "redriven" || r.result === "purged" || r.result === "ok").length;
      const other = answer.results.filter((r) => !(r.result === "redriven" || r.result === "purged" || r.result === "ok"));
      $("dead-status").textContent =
        `${verb}: ${done} of ${answer.results.length}` +
        (other.length ? `; not done: ${other.map((r) => `${clip(r.id, 60)} (${r.result})`).join(", ")}` : ".");
    }
  }

  // ---- schedules -------------------------------------------------------------------------

  /** `cron <expr> (<zone>)` or `every <duration>`, as the schedule was put. */
  function recurrence(s) {
    return s.cron !== undefined ? `cron ${s.cron} (${s.timeZone})` : `every ${duration(s.everyMs)}`;
  }

  async function loadSchedules() {
    const found = await call("GET", `${API}/schedules`);
    const nowMs = Date.now();
    $("schedules-table").tBodies[0].replaceChildren(
      ...found.schedules.map((s) => {
        // the waiting occurrence fires next; without one, the precomputed next due time
        const next = s.ended ? "ended" : instant(s.currentDueMs ?? s.nextDueMs, nowMs);
        return el(
          "tr", {},
          el("td", { className: "id" }, clip(s.id, 120)),
          el("td", {}, clip(recurrence(s), 160)),
          el("td", {}, next),
          el("td", {}, `${s.catchUp} (≤ ${number(s.catchUpMax)})`),
          el("td", { className: "num" }, String(s.slot)),
          el("td", { className: "preview" }, clip(s.payload || "", LIST_PREVIEW_CHARS)),
        );
      }),
    );
    $("schedules-status").textContent = found.schedules.length ? "" : "No recurring schedules.";
    stamp("schedules-updated");
    markLoaded("page-schedules");
  }

  // ---- pages and polling -----------------------------------------------------------------

  const PAGES = ["overview", "slots", "message", "dead", "schedules"];

  function route() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [page, ...rest] = hash.split("/");
    return { page: PAGES.includes(page) ? page : "overview", arg: rest.join("/") };
  }

  let again = false; // a refresh asked for while one ran (a new selection): run once more

  async function refresh() {
    const { page } = route();
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      if (page === "overview") await loadOverview();
      else if (page === "slots") await loadSlots();
      else if (page === "dead") await loadDead();
      else if (page === "schedules") await loadSchedules();
      clearError();
    } catch (error) {
      showError(explain(error));
    } finally {
      busy = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  function schedulePoll() {
    clearTimeout(timer);
    const every = POLL_MS[route().page];
    if (every) timer = setTimeout(tick, every);
  }

  async function tick() {
    if (document.visibilityState === "visible") await refresh();
    schedulePoll();
  }

  async function show() {
    const { page, arg } = route();
    for (const name of PAGES) {
      $(`page-${name}`).hidden = name !== page;
      const link = $(`nav-${name}`);
      if (name === page) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    if (page === "message" && arg) {
      // the id is percent-encoded, so the first "?" starts the query (`?slot=N`)
      const [encoded, query = ""] = arg.split("?", 2);
      let id = null;
      try {
        id = decodeURIComponent(encoded);
      } catch (error) {
        showError("the message id in the address is not valid percent-encoding");
      }
      if (id !== null) {
        const slot = new URLSearchParams(query).get("slot") ?? "";
        $("lookup-id").value = id;
        $("lookup-basis").value = "";
        $("lookup-slot").value = slot;
        await guarded(() => lookUp(id, { basis: "", slot }));
      }
    }
    await refresh();
    schedulePoll();
  }

  /** Run an action; show its error in the alert region instead of the console. */
  async function guarded(action) {
    try {
      await action();
      clearError();
    } catch (error) {
      showError(explain(error));
    }
  }

  function updateTokenState() {
    $("token-state").textContent = token ? "token set" : "no token";
  }

  function wire() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      token = $("token-input").value.trim();
      $("token-input").value = "";
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      else sessionStorage.removeItem(TOKEN_KEY);
      updateTokenState();
      show();
    });
    $("lookup-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = $("lookup-id").value;
      guarded(() => lookUp(id, { basis: $("lookup-basis").value, slot: $("lookup-slot").value }));
    });
    $("reschedule-form").addEventListener("submit", (event) => {
      event.preventDefault();
      guarded(() => rescheduleShown(Number($("reschedule-delay").value)));
    });
    $("cancel-button").addEventListener("click", () => guarded(cancelShown));
    $("redrive-button").addEventListener("click", () => guarded(redriveShown));
    $("pause-button").addEventListener("click", () => guarded(() => setPaused(true)));
    $("resume-button").addEventListener("click", () => guarded(() => setPaused(false)));
    $("heat-colour").addEventListener("change", () => {
      if (heat !== null) drawHeat();
    });
    const map = $("heat-map");
    map.addEventListener("mousedown", (event) => {
      dragFrom = slotAt(event);
    });
    map.addEventListener("mouseup", (event) => {
      const to = slotAt(event);
      if (dragFrom !== null && to !== null) selectSlots(dragFrom, to);
      dragFrom = null;
    });
    map.addEventListener("mousemove", (event) => {
      const slot = slotAt(event);
      map.title = slot === null ? "" : describeSlot(slot);
    });
    $("slots-range").addEventListener("submit", (event) => {
      event.preventDefault();
      const from = Number($("slots-from").value || 0);
      const to = $("slots-to").value === "" ? from + SLOT_PAGE - 1 : Number($("slots-to").value);
      selectSlots(from, to);
    });
    $("slots-only").addEventListener("change", () => {
      slotStart = 0;
      slotStarts.length = 0;
      refresh();
    });
    $("slots-next").addEventListener("click", () => {
      if (!$("slots-next").dataset.next) return;
      slotStarts.push(slotStart);
      slotStart = Number($("slots-next").dataset.next);
      refresh();
    });
    $("slots-prev").addEventListener("click", () => {
      if (slotStarts.length === 0) return;
      slotStart = slotStarts.pop();
      refresh();
    });
    $("dead-refresh").addEventListener("click", () => {
      deadCursor = null;
      refresh();
    });
    $("dead-next").addEventListener("click", () => {
      if (deadNext === null) return;
      deadCursor = deadNext;
      refresh();
    });
    $("dead-select-all").addEventListener("change", (event) => {
      for (const box of $("dead-table").tBodies[0].querySelectorAll("input[type=checkbox]")) {
        box.checked = event.target.checked;
      }
    });
    $("dead-redrive-selected").addEventListener("click", () => guarded(() => deadAction("redrive", false)));
    $("dead-purge-selected").addEventListener("click", () => guarded(() => deadAction("purge", false)));
    $("dead-redrive-all").addEventListener("click", () => guarded(() => deadAction("redrive", true)));
    $("dead-purge-all").addEventListener("click", () => guarded(() => deadAction("purge", true)));
    window.addEventListener("hashchange", show);
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") tick();
    });
  }

  wire();
  updateTokenState();
  show();
})();
