// Headrace dashboard: polls /dashboard/data once a second and draws it with uPlot.
// The server keeps no history for the page: counters become rates here (change between two
// polls) and the last HISTORY points of every series live in this page only.
"use strict";

const POLL_MS = 1000;
const HISTORY = 300;
const RATE_POLLS = 5; // rates over the last 5 polls: requests finish in waves, not evenly
const COLORS = ["#3b6fd4", "#e67e22", "#2a8a4a", "#c0392b", "#8e44ad", "#16a085", "#7f8c8d",
  "#d35400", "#2c3e50", "#f1c40f"];

// One time-series chart whose set of series may grow (a new tenant, a new replica): uPlot
// charts have fixed series, so a new name rebuilds the chart from the kept history.
class SeriesChart {
  constructor(id, opts = {}) {
    this.el = document.getElementById(id);
    this.opts = opts;
    this.names = [];
    this.data = [[]];
    this.plot = null;
  }

  push(t, values) {
    for (const name of Object.keys(values)) {
      if (!this.names.includes(name)) {
        this.names.push(name);
        this.data.push(this.data[0].map(() => null));
        this.rebuild();
      }
    }
    this.data[0].push(t);
    this.names.forEach((name, i) => this.data[i + 1].push(values[name] ?? null));
    if (this.data[0].length > HISTORY) this.data.forEach((column) => column.shift());
    if (this.plot === null) this.rebuild();
    else this.plot.setData(this.data);
  }

  rebuild() {
    if (this.plot !== null) this.plot.destroy();
    const series = [{}, ...this.names.map((name, i) => ({
      label: name, stroke: this.opts.colors?.[name] ?? COLORS[i % COLORS.length], width: 1.5,
      dash: name.startsWith("target") ? [6, 4] : undefined, spanGaps: true, points: { show: false },
    }))];
    const width = Math.max(300, this.el.clientWidth || 400);
    this.plot = new uPlot({
      width, height: 170, series, legend: { live: false },
      scales: { y: { range: (u, min, max) => [Math.min(0, min), Math.max(1, max) * 1.05] } },
      axes: [{ values: (u, ticks) => ticks.map(clock) }, { size: 55 }],
    }, this.data, this.el);
  }
}

const charts = {};
for (const id of ["requests", "batch", "kv", "step", "tps", "admitted", "refused", "tenant-tps",
  "tier-ttft", "slo-ttft", "slo-tpot", "goodput", "routed", "batch-lines"]) {
  charts[id] = new SeriesChart("c-" + id);
}

const recent = []; // the last RATE_POLLS snapshots
let previous = null; // the snapshot RATE_POLLS polls ago: rates are taken against it

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

function rate(now, before, dt) {
  return before === undefined || dt <= 0 ? null : Math.max(0, (now - before) / dt);
}

function ms(seconds) {
  return seconds === null || seconds === undefined ? null : seconds * 1000;
}

function fmt(value, digits = 0) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

// {key: summed value} of a counter family's rows, keyed by the label positions in `by`.
function sumBy(rows, by, filter = () => true) {
  const out = {};
  for (const row of rows ?? []) {
    if (!filter(row)) continue;
    const key = by.map((i) => row[i]).join(" ");
    out[key] = (out[key] ?? 0) + row[row.length - 1];
  }
  return out;
}

function rates(now, before, dt) {
  const out = {};
  for (const [key, value] of Object.entries(now)) out[key] = rate(value, before?.[key], dt);
  return out;
}

function drawEngine(t, snap, dt) {
  const requests = {}, batch = {}, kv = {}, step = {}, tps = {};
  for (const [model, m] of Object.entries(snap.models)) {
    const s = m.step;
    requests[model + " running"] = s.num_running;
    requests[model + " waiting"] = s.num_waiting;
    batch[model + " prefill"] = s.num_prefill_tokens;
    batch[model + " decode"] = s.num_decode_tokens;
    kv[model + " used"] = s.kv_blocks_used;
    kv[model + " cached"] = s.kv_blocks_cached;
    kv[model + " total"] = s.kv_blocks_total;
    step[model] = s.step_duration * 1000;
    tps[model] = rate(s.num_tokens_total, previous?.models[model]?.step.num_tokens_total, dt);
  }
  charts.requests.push(t, requests);
  charts.batch.push(t, batch);
  charts.kv.push(t, kv);
  charts.step.push(t, step);
  charts.tps.push(t, tps);
}

function drawTenants(t, snap, dt) {
  const c = snap.counters, p = previous?.counters ?? {};
  const admitted = "headrace:gateway_requests_admitted", rejected = "headrace:gateway_requests_rejected";
  charts.admitted.push(t, rates(sumBy(c[admitted], [1]), sumBy(p[admitted], [1]), dt));
  charts.refused.push(t, rates(sumBy(c[rejected], [2]), sumBy(p[rejected], [2]), dt));
  const tenants = snap.requests.tenants, tiers = snap.requests.tiers;
  const tps = {}, ttft = {};
  for (const [name, s] of Object.entries(tenants)) tps[name] = s.tokens_per_s;
  for (const [name, s] of Object.entries(tiers)) ttft[name] = ms(s.ttft_p95);
  charts["tenant-tps"].push(t, tps);
  charts["tier-ttft"].push(t, ttft);
  tenantTable(snap);
}

function tenantTable(snap) {
  const c = snap.counters;
  const admitted = sumBy(c["headrace:gateway_requests_admitted"], [0]);
  const inFlight = sumBy(c["headrace:gateway_requests_in_flight"], [0]);
  const refusedRows = c["headrace:gateway_requests_rejected"] ?? [];
  const tiers = {};
  for (const row of [...(c["headrace:gateway_requests_admitted"] ?? []), ...refusedRows]) tiers[row[0]] = row[1];
  const names = new Set([...Object.keys(admitted), ...Object.keys(snap.requests.tenants)]);
  const body = document.querySelector("#tenants tbody");
  body.replaceChildren(...[...names].sort().map((name) => {
    const s = snap.requests.tenants[name] ?? {};
    const refused = refusedRows.filter((r) => r[0] === name && r[3] > 0)
      .map((r) => `${r[2]} ${r[3]}`).join(", ");
    return row([name, s.tier ?? tiers[name] ?? "", fmt(admitted[name]), refused || "0",
      fmt(inFlight[name]), fmt(ms(s.ttft_p50)) + " ms", fmt(ms(s.ttft_p95)) + " ms",
      fmt(s.tokens_per_s, 1), shareBar(s.share ?? 0, s.fair_share ?? 0)]);
  }));
}

function shareBar(share, fair) {
  const bar = document.createElement("span");
  bar.className = "bar";
  bar.title = `share ${(share * 100).toFixed(1)}%, fair share ${(fair * 100).toFixed(1)}%`;
  const fill = document.createElement("span");
  fill.className = "fill";
  fill.style.width = `${share * 100}%`;
  const mark = document.createElement("span");
  mark.className = "fair";
  mark.style.left = `${fair * 100}%`;
  bar.append(fill, mark);
  const cell = document.createElement("span");
  cell.append(bar, ` ${(share * 100).toFixed(0)}% / ${(fair * 100).toFixed(0)}%`);
  return cell;
}

function row(cells, classes = []) {
  const tr = document.createElement("tr");
  cells.forEach((value, i) => {
    const td = document.createElement("td");
    if (value instanceof Node) td.append(value);
    else td.textContent = String(value);
    if (classes[i]) td.className = classes[i];
    tr.append(td);
  });
  return tr;
}

function drawSlo(t, snap) {
  const all = snap.requests.all, slo = snap.slo;
  charts["slo-ttft"].push(t, { p50: ms(all.ttft_p50), p95: ms(all.ttft_p95), target: slo.ttft_s * 1000 });
  charts["slo-tpot"].push(t, { p50: ms(all.tpot_p50), p95: ms(all.tpot_p95), target: slo.tpot_s * 1000 });
  const goodput = all.goodput === null ? null : all.goodput * 100;
  charts.goodput.push(t, { goodput });
  document.getElementById("goodput").textContent = goodput === null ? "–" : goodput.toFixed(0) + "%";
  document.getElementById("goodput-rate").textContent =
    `${fmt(all.goodput_per_s, 2)} good requests/s of ${all.requests} finished in ${fmt(snap.requests.span_s)} s`;
  document.getElementById("span").textContent = fmt(snap.requests.span_s);
}

function drawRouter(t, snap, dt) {
  const routed = "headrace:router_requests_routed";
  charts.routed.push(t, rates(sumBy(snap.counters[routed], [0, 1]),
    sumBy(previous?.counters[routed], [0, 1]), dt));
  const rows = [];
  for (const [model, m] of Object.entries(snap.models)) {
    for (const r of m.replicas) {
      rows.push(row([model, r.name, r.state, r.restarts, r.routed, r.in_flight, r.num_running,
        r.num_waiting, `${r.kv_blocks_used} / ${r.kv_blocks_total}`, r.last_error ?? ""],
        [null, null, "state-" + r.state]));
    }
  }
  if (rows.length === 0) rows.push(row(["(one engine per model, no router)"]));
  document.querySelector("#replicas tbody").replaceChildren(...rows);
}

function drawBatches(t, snap, dt) {
  const total = (name) => sumBy(snap.counters[name], [])[""] ?? 0;
  const done = "headrace:batch_lines";
  const finished = rates(sumBy(snap.counters[done], [0]), sumBy(previous?.counters[done], [0]), dt);
  const series = { "in flight": total("headrace:batch_lines_running") };
  for (const [outcome, perSecond] of Object.entries(finished)) series[outcome + " / s"] = perSecond;
  charts["batch-lines"].push(t, series);
  document.getElementById("batches-running").textContent = fmt(total("headrace:batches_running"));
}

function drawHeader(snap) {
  const status = document.getElementById("status");
  status.textContent = snap.status;
  status.className = "pill " + (snap.status === "ok" ? "ok" : "bad");
  document.getElementById("models").textContent = Object.keys(snap.models).join(", ");
  document.getElementById("updated").textContent = "updated " + new Date(snap.time * 1000).toLocaleTimeString();
}

function draw(snap) {
  const oldest = recent.length > 0 ? recent[0] : null;
  const t = snap.time, dt = oldest === null ? 0 : t - oldest.time;
  previous = oldest; // what rates are taken against
  drawHeader(snap);
  drawEngine(t, snap, dt);
  drawTenants(t, snap, dt);
  drawSlo(t, snap);
  drawRouter(t, snap, dt);
  drawBatches(t, snap, dt);
  drawLora(snap, previous, dt);
  recent.push(snap);
  if (recent.length > RATE_POLLS) recent.shift();
}

// The ledger panel: hourly totals that the server reads from its ledger every LEDGER_MS; the
// charts are drawn anew from each answer (the hours are the ledger's, not this page's polls).
const LEDGER_MS = 30000;
const ledgerPlots = {};

function hourChart(id, hours, columns) {
  ledgerPlots[id]?.destroy();
  const el = document.getElementById(id);
  const series = [{}, ...Object.keys(columns).map((name, i) => ({
    label: name, stroke: COLORS[i % COLORS.length], width: 1.5, points: { show: true },
  }))];
  ledgerPlots[id] = new uPlot({
    width: Math.max(300, el.clientWidth || 400), height: 170, series, legend: { live: false },
    scales: { y: { range: (u, min, max) => [0, Math.max(1, max) * 1.05] } },
    axes: [{ values: (u, ticks) => ticks.map(clock) }, { size: 55 }],
  }, [hours, ...Object.values(columns)], el);
}

function drawLedger(body) {
  if (!body.enabled || body.error) {
    const note = body.enabled ? "the ledger cannot be read: " + body.error : "no ledger (--no-ledger)";
    document.querySelector("#ledger tbody").replaceChildren(row([note]));
    return;
  }
  const hours = [...new Set(body.data.map((r) => r.hour))].sort();
  const tenants = [...new Set(body.data.map((r) => r.tenant))].sort();
  const at = {};
  for (const r of body.data) at[r.tenant + " " + r.hour] = r;
  const tokens = {}, cached = {}, rows = [];
  for (const name of tenants) {
    const own = hours.map((h) => at[name + " " + h]);
    tokens[name] = own.map((r) => r?.total_tokens ?? 0);
    cached[name] = own.map((r) => (r && r.prompt_tokens > 0 ? 100 * r.cached_tokens / r.prompt_tokens : null));
    const sum = (key) => own.reduce((total, r) => total + (r?.[key] ?? 0), 0);
    const prompt = sum("prompt_tokens");
    rows.push(row([name, sum("requests"), prompt, prompt > 0 ? fmt(100 * sum("cached_tokens") / prompt) + "%" : "–",
      sum("completion_tokens"), sum("errors")]));
  }
  if (rows.length === 0) rows.push(row(["(no request recorded in the last 24 h)"]));
  document.querySelector("#ledger tbody").replaceChildren(...rows);
  const xs = hours.map((h) => Date.parse(h) / 1000);
  hourChart("c-ledger", xs, tokens);
  hourChart("c-ledger-cached", xs, cached);
}

async function refreshLedger() {
  try {
    const response = await fetch("/dashboard/ledger", { cache: "no-store" });
    if (response.ok) drawLedger(await response.json());
  } catch (e) {
    // the status pill already says when the server is unreachable
  }
}

async function pollLedger() {
  await refreshLedger();
  setTimeout(pollLedger, LEDGER_MS);
}

function dataUrl() {
  const ttft = document.getElementById("ttft").value, tpot = document.getElementById("tpot").value;
  return `/dashboard/data?ttft_ms=${encodeURIComponent(ttft)}&tpot_ms=${encodeURIComponent(tpot)}`;
}

async function poll() {
  try {
    const response = await fetch(dataUrl(), { cache: "no-store" });
    if (response.ok) draw(await response.json());
    else document.getElementById("status").textContent = `HTTP ${response.status}`;
  } catch (e) {
    const status = document.getElementById("status");
    status.textContent = "unreachable";
    status.className = "pill bad";
  }
  setTimeout(poll, POLL_MS);
}

function initSlo() {
  const params = new URLSearchParams(location.search);
  for (const [id, key] of [["ttft", "ttft_ms"], ["tpot", "tpot_ms"]]) {
    if (params.has(key)) document.getElementById(id).value = params.get(key);
  }
  document.getElementById("slo").addEventListener("submit", (e) => e.preventDefault());
}

initSlo();
poll();
pollLedger();
