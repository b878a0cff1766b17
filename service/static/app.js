// memplan's page: plain JavaScript, no build step, no library. Every number shown comes from the
// server's API (the same origin; the page's Content-Security-Policy allows nothing else).
"use strict";

const $ = (sel) => document.querySelector(sel);
const SVGNS = "http://www.w3.org/2000/svg";
const KEY_STORE = "memplan.apiKey";
const SLIDER_STEPS = 1000;

const state = {
  profile: null,      // the Profile JSON being planned
  frontier: null,     // POST /v1/plans/frontier's answer
  lo: 0, hi: 0,       // the slider's byte range: least feasible peak .. store-all peak
  budget: null,       // the budget of the plan asked for (bytes)
  seq: 0,             // requests in flight: only the latest one is drawn
  timeline: null,     // the drawn PlanTimeline
  cursor: null,       // op index under the cursor
  watching: new Set(),
};

// ---- units, as memplan.units ------------------------------------------------------------------
const UNITS = { "": 1, b: 1, k: 1e3, kb: 1e3, m: 1e6, mb: 1e6, g: 1e9, gb: 1e9, t: 1e12, tb: 1e12,
                kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40 };

function parseBytes(text) {
  const m = /^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$/.exec(String(text));
  if (!m || !(m[2].toLowerCase() in UNITS)) {
    throw new Error(`cannot read ${JSON.stringify(text)} as a size; write e.g. 8GiB, 512MiB or 6e9`);
  }
  const v = parseFloat(m[1]) * UNITS[m[2].toLowerCase()];
  if (!Number.isFinite(v)) throw new Error(`${text} is not a finite size`);
  return Math.round(v);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  let v = Number(n);
  for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
    if (Math.abs(v) < 1024 || unit === "TiB") return unit === "B" ? `${Math.trunc(v)} B` : `${v.toFixed(2)} ${unit}`;
    v /= 1024;
  }
  return `${v.toFixed(2)} TiB`;
}
const fmtPct = (x) => `+${(100 * x).toFixed(1)}%`;
const fmtS = (s) => (s >= 1 ? `${s.toPrecision(4)} s` : `${(s * 1e3).toPrecision(4)} ms`);
const group = (n) => Number(n).toLocaleString("en-US");

function status(text) { $("#status").textContent = text; }

// ---- the API, with the key asked for once -----------------------------------------------------
let keyPrompt = null;

function askKey(message) {
  if (keyPrompt) return keyPrompt;
  const dialog = $("#key-dialog");
  $("#key-error").textContent = message || "";
  keyPrompt = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const key = $("#api-key").value.trim();
      if (key) sessionStorage.setItem(KEY_STORE, key);
      keyPrompt = null;
      resolve(Boolean(key));
    }, { once: true });
  });
  document.body.dataset.keyPrompts = String(Number(document.body.dataset.keyPrompts || 0) + 1);
  dialog.showModal();
  $("#api-key").focus();
  return keyPrompt;
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path, { method = "GET", body, headers = {}, raw = false } = {}) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const sentKey = sessionStorage.getItem(KEY_STORE);
    const init = { method, headers: { Accept: "application/json", ...authHeaders(), ...headers } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    const r = await fetch(path, init);
    if (r.status === 401) {
      // a refusal of a request sent before the current key was given says nothing about that
      // key: retry with it, and ask (once, for every request waiting) only when none is stored
      // or the key this request carried is the one refused
      const stored = sessionStorage.getItem(KEY_STORE);
      if (stored && stored !== sentKey) continue;
      if (stored) sessionStorage.removeItem(KEY_STORE);
      if (await askKey(stored ? "That key was refused; try again." : "")) continue;
      throw new Error("this server needs an API key");
    }
    if (raw) return r;
    const text = await r.text();
    const data = text ? JSON.parse(text) : null;
    if (!r.ok) {
      const detail = (data && (data.detail || data.title)) || `HTTP ${r.status}`;
      // name each refused field once: the detail usually says "field: why" already
      const fields = data && Array.isArray(data.errors)
        ? [...new Set(data.errors.map((e) => e.field))].filter((f) => f && !detail.includes(f)) : [];
      throw new Error(detail + (fields.length ? ` (${fields.join(", ")})` : ""));
    }
    return data;
  }
  throw new Error("this server needs an API key");
}

// ---- small DOM helpers ------------------------------------------------------------------------
function el(tag, attrs = {}, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  if (text !== undefined) node.textContent = text;
  return node;
}

function fillRows(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const c of cells) {
      const td = typeof c === "object" && c !== null ? el("td", c.attrs || {}, c.text) : el("td", {}, c);
      tr.append(td);
    }
    return tr;
  }));
}

// ---- profile sources --------------------------------------------------------------------------
async function loadExamples() {
  const list = await api("/v1/examples");
  const sel = $("#example");
  for (const ex of list) {
    sel.append(el("option", { value: ex.name }, `${ex.profile_name} (${ex.n_stages} stages)`));
  }
  return list;
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const jsonKind = (v) => (v === null ? "null" : Array.isArray(v) ? "an array" : `a ${typeof v}`);

// Plan `profile`: it becomes the page's profile only once the server accepted it (its frontier
// came back); a refused one leaves the previous profile, its plan and frontier as they were, and
// the error (naming the field) is thrown to the caller.
let profileSeq = 0;
async function useProfile(profile, source) {
  if (!isObject(profile)) {
    throw new Error(`a profile is a JSON object ({"name": ..., "layers": [...]}), not ${jsonKind(profile)}`);
  }
  const mine = ++profileSeq;
  status("tracing the frontier...");
  const fr = await api("/v1/plans/frontier", { method: "POST", body: { profile, options: { points: 60 } } });
  if (mine !== profileSeq) return; // a profile picked later replaces this one
  state.profile = profile;
  const n = Array.isArray(profile.layers) ? profile.layers.length : 0;
  const info = $("#profile-info");
  info.textContent = `${profile.name || "profile"}: ${n} stages, fixed ${fmtBytes(profile.fixed_bytes || 0)} (${source}).`;
  info.dataset.source = source;
  state.frontier = fr;
  state.lo = fr.least_peak_bytes;
  state.hi = fr.store_all_peak_bytes;
  renderFrontierTables(fr);
  markStale("the new profile is being planned");
  for (const id of ["#budget-range", "#budget-text"]) $(id).disabled = false;
  // start halfway between the least feasible budget and store-all
  setBudget(Math.round(state.lo + 0.5 * (state.hi - state.lo)));
  status("");
}

async function onExample() {
  const name = $("#example").value;
  if (!name) return;
  try {
    await useProfile(await api(`/v1/examples/${encodeURIComponent(name)}`), `example ${name}`);
  } catch (err) { status(`example: ${err.message}${keeping()}`); }
}

// what a refused profile leaves in place, for the status line
function keeping() {
  return state.profile ? `; still planning ${state.profile.name || "the previous profile"}` : "";
}

function onUpload() {
  const file = $("#upload").files[0];
  if (!file) return;
  const reader = new FileReader();
  reader.onload = async () => {
    let data;
    try { data = JSON.parse(reader.result); } catch (err) {
      status(`upload: ${file.name} is not JSON (${err.message})`);
      return;
    }
    try { await useProfile(data, `uploaded ${file.name}`); } catch (err) {
      status(`upload: ${file.name} refused: ${err.message}${keeping()}`);
      $("#upload").value = ""; // the input does not name a file that is not the one planned
    }
  };
  reader.readAsText(file);
}

// Hugging Face config names -> memplan's GPTConfig names
const HF_NAMES = { num_hidden_layers: "n_layer", n_layer: "n_layer", hidden_size: "n_embd", n_embd: "n_embd",
                   num_attention_heads: "n_head", n_head: "n_head", n_positions: "block_size",
                   max_position_embeddings: "block_size", vocab_size: "vocab_size",
                   intermediate_size: "ffn_hidden", n_inner: "ffn_hidden" };

async function onHfConfig() {
  let cfg;
  try { cfg = JSON.parse($("#hf-config").value); } catch (err) {
    status(`config.json: not JSON (${err.message})`);
    return;
  }
  if (!isObject(cfg)) {
    status(`config.json: must be a JSON object ({"n_layer": 12, ...}), not ${jsonKind(cfg)}`);
    return;
  }
  const batchText = $("#hf-batch").value.trim();
  const batch = Number(batchText);
  if (!batchText || !Number.isInteger(batch) || batch < 1) {
    status(`batch size: must be a whole number of 1 or more, not ${JSON.stringify(batchText)}`);
    return;
  }
  const config = { batch_size: batch, dtype: $("#hf-dtype").value };
  for (const [k, v] of Object.entries(cfg)) {
    if (k in HF_NAMES && v !== null) config[HF_NAMES[k]] = v;
  }
  if (!Object.keys(cfg).some((k) => k in HF_NAMES && cfg[k] !== null)) {
    // with none of them the server would plan its default GPT, not the model meant
    const byName = {};
    for (const [k, name] of Object.entries(HF_NAMES)) byName[name] = [...(byName[name] || []), k];
    const known = Object.values(byName).map((ks) => ks.join("/")).join(", ");
    status(`config.json: none of ${known} found (it has ${Object.keys(cfg).join(", ") || "no keys"})`);
    return;
  }
  status("deriving the analytic profile...");
  try {
    const job = await api("/v1/profiles", { method: "POST", headers: { Prefer: "wait=60" },
                                            body: { model: "gpt", analytic: true, config } });
    if (job.state !== "succeeded") throw new Error(job.error ? job.error.detail : `the profile job is ${job.state}`);
    await useProfile(job.result, "analytic GPT from a config");
    refreshJobs();
  } catch (err) { status(`config: ${err.message}`); }
}

// ---- the budget and the plan ------------------------------------------------------------------
function setBudget(bytes, { fromSlider = false } = {}) {
  state.budget = bytes;
  const range = $("#budget-range");
  if (!fromSlider && state.hi > state.lo) {
    range.value = String(Math.round(SLIDER_STEPS * (bytes - state.lo) / (state.hi - state.lo)));
  }
  range.setAttribute("aria-valuetext", fmtBytes(bytes));
  if (document.activeElement !== $("#budget-text")) $("#budget-text").value = fmtBytes(bytes).replace(" ", "");
  schedulePlan();
}

function onSlider() {
  $("#budget-error").textContent = "";
  const pos = Number($("#budget-range").value);
  setBudget(Math.round(state.lo + (state.hi - state.lo) * pos / SLIDER_STEPS), { fromSlider: true });
}

function onBudgetText() {
  try {
    const bytes = parseBytes($("#budget-text").value);
    $("#budget-error").textContent = "";
    setBudget(bytes);
  } catch (err) {
    $("#budget-error").textContent = `budget: ${err.message}`;
    markStale("the budget typed cannot be read");
  }
}

let planTimer = null;
function schedulePlan() {
  clearTimeout(planTimer);
  planTimer = setTimeout(requestPlan, 120);
}

// the offload bandwidth typed (bytes/s: 25GB/s, 25GiB/s, 25e9), or null for none; only optimal
// plans offload (docs/chain-model.md section 10.9)
function offloadBandwidth() {
  const text = $("#offload-text").value.trim();
  $("#offload-error").textContent = "";
  if (!text) return null;
  try {
    const bw = parseBytes(text.replace(/\/s$/i, ""));
    if (!(bw > 0)) throw new Error("must be above 0 bytes/s; leave it empty for no offload");
    return bw;
  } catch (err) {
    $("#offload-error").textContent = `offload bandwidth: ${err.message.replace("a size", "bytes/s")}`;
    throw err;
  }
}

async function requestPlan() {
  if (!state.profile || state.budget === null) return;
  const seq = ++state.seq;
  const budget = state.budget;
  const strategy = $("#strategy").value;
  let bw;
  try { bw = offloadBandwidth(); } catch (err) {
    $("#plan-message").textContent = ""; // the reason is beside the field
    markStale("the offload bandwidth cannot be read");
    return;
  }
  const body = { profile: state.profile, budget_bytes: budget, strategy };
  if (bw !== null && strategy === "optimal") body.options = { offload_bandwidth: bw };
  else if (bw !== null) $("#offload-error").textContent = `offload bandwidth: only the optimal strategy plans offload; this ${strategy} plan has none`;
  try {
    const data = await api("/v1/plans/timeline", { method: "POST", body });
    if (seq !== state.seq) return; // a newer request is on its way
    clearStale();
    renderPlan(data.plan, data.timeline);
    const sec = $("#plan-section");
    sec.dataset.budget = String(budget);
    sec.dataset.strategy = strategy;
    sec.dataset.offload = body.options ? String(body.options.offload_bandwidth) : "";
    sec.dataset.seq = String(seq);
  } catch (err) {
    if (seq !== state.seq) return;
    markStale("the last request was refused");
    $("#plan-message").textContent = `plan: ${err.message}`;
  }
}

// A plan request that was refused (or could not be sent) leaves the last plan drawn: grey out its
// summary, stage table, timeline and frontier ring and say so, until a plan request succeeds.
function markStale(why) {
  const sec = $("#plan-section");
  if (!sec.dataset.seq || sec.dataset.seq === "0") return; // nothing drawn yet
  sec.dataset.stale = "1";
  const offload = sec.dataset.offload ? `, offload at ${fmtBytes(Number(sec.dataset.offload))}/s` : "";
  $("#plan-stale").textContent = `Not updated: ${why}. The plan below is the last one planned ` +
    `(budget ${fmtBytes(Number(sec.dataset.budget))}, ${sec.dataset.strategy}${offload}).`;
  $("#plan-stale").hidden = false;
  if (state.timelineFromPlan) $("#timeline-section").dataset.stale = "1";
  $("#frontier-section").dataset.stale = "1";
}

function clearStale() {
  delete $("#plan-section").dataset.stale;
  delete $("#timeline-section").dataset.stale;
  delete $("#frontier-section").dataset.stale;
  $("#plan-stale").textContent = "";
  $("#plan-stale").hidden = true;
}

function renderPlan(plan, tl) {
  const p = plan.predicted;
  $("#sum-feasible").textContent = plan.feasible ? `${plan.strategy}: fits the budget` : `${plan.strategy}: infeasible`;
  const peak = $("#sum-peak");
  peak.textContent = p ? `${fmtBytes(p.peak_bytes)} (${group(p.peak_bytes)} B)` : "-";
  peak.dataset.bytes = p ? String(p.peak_bytes) : "";
  $("#sum-total").textContent = p ? fmtBytes(p.total_peak_bytes) : "-";
  const time = $("#sum-time");
  time.textContent = p ? fmtS(p.time_s) : "-";
  time.dataset.seconds = p ? String(p.time_s) : "";
  const over = $("#sum-overhead");
  over.textContent = p ? fmtPct(p.overhead) : "-";
  over.dataset.overhead = p ? String(p.overhead) : "";
  const offloaded = bw(plan) !== null;
  const host = $("#sum-host");
  host.textContent = p && offloaded ? `${fmtBytes(p.host_peak_bytes)} (${group(p.host_peak_bytes)} B)` : "-";
  host.dataset.bytes = p && offloaded ? String(p.host_peak_bytes) : "";
  const wait = $("#sum-wait");
  wait.textContent = p && offloaded ? fmtS(p.transfer_wait_s) : "-";
  wait.dataset.seconds = p && offloaded ? String(p.transfer_wait_s) : "";
  $("#plan-message").textContent = plan.message || "";
  const moved = offloadedByStage(plan.schedule);
  const rows = tl ? tl.stages.map((s) => [
    String(s.stage), s.name, { text: s.role, attrs: { class: `role-${s.role}` } }, String(s.forwards),
    s.checkpoint ? `checkpoint${s.checkpoint_dtype ? ` (${s.checkpoint_dtype})` : ""}` : "",
    s.policy || "all",
    fmtBytes(s.saved_bytes),
    (moved[s.stage] || []).join(", "),
  ]) : [];
  fillRows($("#stages tbody"), rows);
  state.timeline = tl;
  state.timelineFromPlan = true;
  state.cursor = tl ? tl.peak_op : null;
  $("#timeline-source").textContent = tl ? "the plan above (predicted)" : "";
  renderTimeline();
  renderTimelineTable();
  renderFrontierChart(p);
}

const bw = (plan) => (plan.options && plan.options.offload_bandwidth != null ? plan.options.offload_bandwidth : null);

// stage -> what the schedule moves to host memory: "output" (offload i), "record" (offload_record i)
function offloadedByStage(schedule) {
  const names = { offload: "output", offload_record: "record" };
  const out = {};
  for (const op of schedule || []) {
    const what = names[op[0]];
    if (!what) continue;
    out[op[1]] = out[op[1]] || [];
    if (!out[op[1]].includes(what)) out[op[1]].push(what);
  }
  for (const moved of Object.values(out)) moved.sort(); // "output" before "record", as the CLI
  return out;
}

// ---- the timeline chart -----------------------------------------------------------------------
const TL = { w: 860, h: 280, l: 70, r: 12, t: 14, b: 34 };

function roleOf(tl, k) {
  const s = tl.stage_of_op[k];
  return s === 0 ? "loss" : tl.stages[s - 1].role;
}

function renderTimeline() {
  const svg = $("#timeline-chart");
  svg.replaceChildren();
  const tl = state.timeline;
  if (!tl) {
    svg.append(el("svg:text", { x: 20, y: 40 }, "no schedule: the plan is infeasible at this budget"));
    $("#timeline-cursor").textContent = "no timeline";
    return;
  }
  const n = tl.ops.length;
  const measured = tl.measured_bytes || null;
  const top = Math.max(tl.peak_bytes, tl.budget_bytes || 0, ...(measured || []),
                       tl.host_peak_bytes || 0) * 1.1 || 1;
  const x = (k) => TL.l + (TL.w - TL.l - TL.r) * k / n;
  const y = (b) => TL.h - TL.b - (TL.h - TL.t - TL.b) * b / top;
  for (let j = 0; j <= 4; j++) {
    const b = top * j / 4;
    svg.append(el("svg:line", { x1: TL.l, x2: TL.w - TL.r, y1: y(b), y2: y(b), class: "grid" }));
    svg.append(el("svg:text", { x: TL.l - 6, y: y(b) + 4, "text-anchor": "end" }, fmtBytes(b)));
  }
  const bands = el("svg:g", { "aria-hidden": "true" });
  let d = "";
  for (let k = 0; k < n; k++) {
    const b = tl.predicted_bytes[k];
    bands.append(el("svg:rect", { x: x(k), y: y(b), width: Math.max(0.5, x(k + 1) - x(k)),
                                  height: y(0) - y(b), class: `band-${roleOf(tl, k)}` }));
    d += `${k === 0 ? "M" : "L"}${x(k).toFixed(2)},${y(b).toFixed(2)}H${x(k + 1).toFixed(2)}`;
  }
  svg.append(bands);
  svg.append(el("svg:path", { d, class: "line", id: "timeline-line", "data-ops": n }));
  if (measured) {
    let dm = "";
    for (let k = 0; k < n; k++) {
      dm += `${k === 0 ? "M" : "L"}${x(k).toFixed(2)},${y(measured[k]).toFixed(2)}H${x(k + 1).toFixed(2)}`;
    }
    svg.append(el("svg:path", { d: dm, class: "measured", id: "timeline-measured", "data-ops": n,
                                "data-peak": Math.max(...measured) }));
  }
  const host = tl.predicted_host_bytes;
  if (host && host.some((b) => b > 0)) { // offload: bytes held in host memory, on the same scale
    let dh = "";
    for (let k = 0; k < n; k++) {
      dh += `${k === 0 ? "M" : "L"}${x(k).toFixed(2)},${y(host[k]).toFixed(2)}H${x(k + 1).toFixed(2)}`;
    }
    svg.append(el("svg:path", { d: dh, class: "host", id: "timeline-host", "data-ops": n,
                                "data-peak": tl.host_peak_bytes }));
  }
  if (tl.budget_bytes !== null && tl.budget_bytes !== undefined) {
    svg.append(el("svg:line", { x1: TL.l, x2: TL.w - TL.r, y1: y(tl.budget_bytes), y2: y(tl.budget_bytes), class: "budget" }));
    svg.append(el("svg:text", { x: TL.w - TL.r - 4, y: y(tl.budget_bytes) - 4, "text-anchor": "end" },
                  `budget ${fmtBytes(tl.budget_bytes)}`));
  }
  const k = tl.peak_op;
  const px = (x(k) + x(k + 1)) / 2, py = y(tl.peak_bytes);
  const peak = el("svg:path", { d: `M${px - 6},${py - 12}L${px + 6},${py - 12}L${px},${py - 2}Z`, class: "peak",
                                id: "timeline-peak", "data-bytes": tl.peak_bytes, "data-op": k });
  peak.append(el("svg:title", {}, `peak ${fmtBytes(tl.peak_bytes)} at op ${k} (${tl.ops[k]})`));
  svg.append(peak);
  svg.append(el("svg:text", { x: Math.min(Math.max(px, TL.l + 90), TL.w - 110), y: Math.max(py - 16, 12), "text-anchor": "middle" },
                `peak ${fmtBytes(tl.peak_bytes)} (op ${k}, ${tl.ops[k]})`));
  svg.append(el("svg:line", { x1: TL.l, x2: TL.w - TL.r, y1: y(0), y2: y(0), class: "axis" }));
  svg.append(el("svg:line", { x1: TL.l, x2: TL.l, y1: TL.t, y2: y(0), class: "axis" }));
  svg.append(el("svg:text", { x: (TL.l + TL.w) / 2, y: TL.h - 8, "text-anchor": "middle" }, `op of the schedule (${n} ops)`));
  svg.append(el("svg:line", { id: "timeline-cursor-line", class: "cursor", x1: 0, x2: 0, y1: TL.t, y2: y(0), visibility: "hidden" }));
  moveCursor(state.cursor);
}

function moveCursor(k) {
  const tl = state.timeline;
  if (!tl || k === null) return;
  k = Math.max(0, Math.min(tl.ops.length - 1, k));
  state.cursor = k;
  const n = tl.ops.length;
  const xm = TL.l + (TL.w - TL.l - TL.r) * (k + 0.5) / n;
  const line = $("#timeline-cursor-line");
  if (line) {
    line.setAttribute("x1", xm);
    line.setAttribute("x2", xm);
    line.setAttribute("visibility", "visible");
  }
  const b = tl.predicted_bytes[k];
  const m = tl.measured_bytes ? `, ${fmtBytes(tl.measured_bytes[k])} measured` : "";
  const h = tl.predicted_host_bytes && tl.host_peak_bytes ? `, ${fmtBytes(tl.predicted_host_bytes[k])} on the host` : "";
  const label = `op ${k} of ${n}: ${tl.ops[k]} (${roleOf(tl, k)}), ${fmtBytes(b)} live${m}${h}` +
    (k === tl.peak_op ? " - the peak" : "");
  const out = $("#timeline-cursor");
  out.textContent = label;
  out.dataset.op = String(k);
  out.dataset.bytes = String(b);
}

function onTimelinePointer(ev) {
  const tl = state.timeline;
  if (!tl) return;
  const svg = $("#timeline-chart");
  const box = svg.getBoundingClientRect();
  const sx = (ev.clientX - box.left) * TL.w / box.width;
  const k = Math.floor((sx - TL.l) / (TL.w - TL.l - TL.r) * tl.ops.length);
  if (k >= 0 && k < tl.ops.length) moveCursor(k);
}

function onTimelineKey(ev) {
  const tl = state.timeline;
  if (!tl) return;
  const k = state.cursor ?? tl.peak_op;
  const step = ev.shiftKey ? 10 : 1;
  const moves = { ArrowRight: k + step, ArrowLeft: k - step, Home: 0, End: tl.ops.length - 1, p: tl.peak_op };
  if (ev.key in moves) {
    ev.preventDefault();
    moveCursor(moves[ev.key]);
  }
}

function renderTimelineTable() {
  const tl = state.timeline;
  fillRows($("#timeline-table tbody"), tl ? tl.ops.map((op, k) => [
    String(k), op, { text: group(tl.predicted_bytes[k]), attrs: { "data-bytes": tl.predicted_bytes[k] } }, roleOf(tl, k),
    tl.measured_bytes ? { text: group(tl.measured_bytes[k]), attrs: { "data-bytes": tl.measured_bytes[k] } } : "",
  ]) : []);
}

// a run's timeline (memplan run --plot keeps <stem>.timeline.json; a run job keeps timeline.json):
// measured over predicted. `source` names where it came from; `snapshot` where its allocator
// snapshot is (a file beside it, or the job's download link).
function showRunTimeline(tl, source, snapshot) {
  const problem = timelineProblem(tl);
  if (problem) {
    throw new Error(`not a memplan-timeline/1 file: ${problem} (memplan run --plot and run jobs write one)`);
  }
  state.timeline = tl;
  state.timelineFromPlan = false;
  delete $("#timeline-section").dataset.stale;
  state.cursor = tl.peak_op;
  const m = tl.measured_bytes;
  const snap = snapshot || (tl.snapshot ? `kept beside it: ${tl.snapshot}` : "");
  const src = $("#timeline-source");
  src.textContent = `${source}: ${tl.profile_name}, ${tl.strategy} plan, ` +
    (m ? `measured on ${tl.measured_device || "a run"}: peak ${fmtBytes(Math.max(...m))} measured, ` +
         `${fmtBytes(tl.peak_bytes)} predicted` : `peak ${fmtBytes(tl.peak_bytes)} predicted`) +
    (snap ? `; allocator snapshot ${snap} (open it at pytorch.org/memory_viz)` : "");
  src.dataset.source = source;
  renderTimeline();
  renderTimelineTable();
}

// what a timeline file lacks for the chart (null when it has everything): checked before it
// replaces the drawn timeline, so that a hand-edited file cannot leave the chart half drawn
function timelineProblem(tl) {
  if (!isObject(tl)) return `the file holds ${jsonKind(tl)}, not an object`;
  if (tl.format !== "memplan-timeline/1") {
    return tl.format === undefined ? "no format" : `format is ${JSON.stringify(tl.format)}`;
  }
  const nums = (a) => Array.isArray(a) && a.every((b) => typeof b === "number" && Number.isFinite(b));
  if (!Array.isArray(tl.ops) || tl.ops.length === 0) return "no ops";
  const n = tl.ops.length;
  if (!Array.isArray(tl.stages) || !tl.stages.every((s) => isObject(s) && typeof s.role === "string")) {
    return "no stages (each with its role)";
  }
  if (!nums(tl.predicted_bytes)) return "no predicted_bytes (a number per op)";
  if (tl.predicted_bytes.length !== n) return `predicted_bytes has ${tl.predicted_bytes.length} entries for ${n} ops`;
  if (!Array.isArray(tl.stage_of_op)) return "no stage_of_op (the stage of each op)";
  if (tl.stage_of_op.length !== n) return `stage_of_op has ${tl.stage_of_op.length} entries for ${n} ops`;
  const bad = tl.stage_of_op.findIndex((s) => !Number.isInteger(s) || s < 0 || s > tl.stages.length);
  if (bad >= 0) return `stage_of_op[${bad}] is ${JSON.stringify(tl.stage_of_op[bad])}, not a stage 0..${tl.stages.length}`;
  if (!Number.isInteger(tl.peak_op) || tl.peak_op < 0 || tl.peak_op >= n) {
    return `peak_op is ${JSON.stringify(tl.peak_op)}, not an op 0..${n - 1}`;
  }
  if (typeof tl.peak_bytes !== "number" || !Number.isFinite(tl.peak_bytes)) return "no peak_bytes";
  for (const key of ["measured_bytes", "predicted_host_bytes"]) {
    if (tl[key] === null || tl[key] === undefined) continue;
    if (!nums(tl[key])) return `${key} is not a number per op`;
    if (tl[key].length !== n) return `${key} has ${tl[key].length} entries for ${n} ops`;
  }
  return null;
}

function onRunTimeline() {
  const file = $("#run-timeline").files[0];
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    const still = () => (state.timeline ? "; the chart still shows the previous timeline" : "");
    let data;
    try { data = JSON.parse(reader.result); } catch (err) {
      $("#timeline-source").textContent = `run timeline: ${file.name} is not JSON (${err.message})${still()}`;
      return;
    }
    try { showRunTimeline(data, file.name); } catch (err) {
      $("#timeline-source").textContent = `run timeline: ${err.message}${still()}`;
    }
  };
  reader.readAsText(file);
}

// a finished run job's timeline artifact, drawn over its prediction
async function showJobTimeline(job, info) {
  try {
    const r = await api(info.href, { raw: true, headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const snap = (job.artifacts || []).find((a) => a.name === "snapshot.pickle" && a.href);
    showRunTimeline(await r.json(), `run ${job.id.slice(0, 12)}`, snap ? "in the run's downloads" : "");
    $("#timeline-section").scrollIntoView();
    $("#timeline-chart").focus();
  } catch (err) { $("#timeline-source").textContent = `run timeline: ${err.message}`; }
}

// an artifact's link downloads through fetch, so that the API key goes with it
async function downloadArtifact(ev) {
  ev.preventDefault();
  const a = ev.currentTarget;
  try {
    const r = await api(a.getAttribute("href"), { raw: true, headers: { Accept: "*/*" } });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const url = URL.createObjectURL(await r.blob());
    const tmp = el("a", { href: url, download: a.getAttribute("download") });
    document.body.append(tmp);
    tmp.click();
    tmp.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    document.body.dataset.downloads = String(Number(document.body.dataset.downloads || 0) + 1);
  } catch (err) { $("#jobs-error").textContent = `download ${a.getAttribute("download")}: ${err.message}`; }
}

// ---- the frontier -----------------------------------------------------------------------------
function renderFrontierTables(fr) {
  fillRows($("#frontier-table tbody"), fr.points.map((p) => [
    fmtBytes(p.peak_bytes), { text: group(p.peak_bytes), attrs: { "data-bytes": p.peak_bytes } },
    p.time_s.toPrecision(6), fmtPct(p.overhead),
  ]));
  fillRows($("#baselines-table tbody"), fr.baselines.map((b) => [
    b.label, { text: group(b.peak_bytes), attrs: { "data-bytes": b.peak_bytes } }, b.time_s.toPrecision(6),
    fmtPct(b.overhead), b.dominated ? "yes" : "no",
  ]));
  $("#frontier-alt").textContent = `${fr.points.length} Pareto points from ${fmtBytes(fr.least_peak_bytes)} ` +
    `(least feasible) to ${fmtBytes(fr.store_all_peak_bytes)} (store-all), and ${fr.baselines.length} baseline points; ` +
    "the numbers are in the tables below.";
}

const FR = { w: 860, h: 300, l: 70, r: 14, t: 14, b: 40 };

function renderFrontierChart(predicted) {
  const fr = state.frontier;
  const svg = $("#frontier-chart");
  svg.replaceChildren();
  if (!fr) return;
  const all = [...fr.points, ...fr.baselines];
  const xmin = Math.min(...all.map((p) => p.peak_bytes)), xmax = Math.max(...all.map((p) => p.peak_bytes));
  const ymax = Math.max(0.01, ...all.map((p) => p.overhead)) * 1.1;
  const x = (b) => FR.l + (FR.w - FR.l - FR.r) * (xmax > xmin ? (b - xmin) / (xmax - xmin) : 0.5);
  const y = (o) => FR.h - FR.b - (FR.h - FR.t - FR.b) * o / ymax;
  for (let j = 0; j <= 4; j++) {
    svg.append(el("svg:line", { x1: FR.l, x2: FR.w - FR.r, y1: y(ymax * j / 4), y2: y(ymax * j / 4), class: "grid" }));
    svg.append(el("svg:text", { x: FR.l - 6, y: y(ymax * j / 4) + 4, "text-anchor": "end" }, fmtPct(ymax * j / 4)));
    const b = xmin + (xmax - xmin) * j / 4;
    // the last label ends at its grid line, so that it stays inside the chart
    svg.append(el("svg:text", { x: x(b), y: FR.h - FR.b + 16, "text-anchor": j === 4 ? "end" : "middle",
                                class: "x-tick" }, fmtBytes(b)));
  }
  let d = "";
  fr.points.forEach((p, i) => {
    d += i === 0 ? `M${x(p.peak_bytes)},${y(p.overhead)}` : `H${x(p.peak_bytes)}V${y(p.overhead)}`;
  });
  svg.append(el("svg:path", { d, class: "frontier", id: "frontier-line", "data-points": fr.points.length }));
  for (const p of fr.points) {
    const c = el("svg:circle", { cx: x(p.peak_bytes), cy: y(p.overhead), r: 2.5, class: "pt", "data-bytes": p.peak_bytes });
    c.append(el("svg:title", {}, `optimal: ${fmtBytes(p.peak_bytes)}, ${fmtPct(p.overhead)}`));
    svg.append(c);
  }
  for (const b of fr.baselines) {
    const m = el("svg:rect", { x: x(b.peak_bytes) - 3.5, y: y(b.overhead) - 3.5, width: 7, height: 7,
                               class: `b-${b.strategy} baseline`, "data-bytes": b.peak_bytes });
    m.append(el("svg:title", {}, `${b.label}: ${fmtBytes(b.peak_bytes)}, ${fmtPct(b.overhead)}`));
    svg.append(m);
  }
  const legend = [["optimal (line)", "pt"], ["store-all", "b-store-all"], ["sqrt", "b-sqrt"], ["uniform", "b-uniform"], ["heuristic", "b-heuristic"]];
  legend.forEach(([name, cls], i) => {
    svg.append(el("svg:rect", { x: FR.w - 150, y: FR.t + 6 + 15 * i, width: 8, height: 8, class: cls }));
    svg.append(el("svg:text", { x: FR.w - 136, y: FR.t + 14 + 15 * i }, name));
  });
  svg.append(el("svg:line", { x1: FR.l, x2: FR.w - FR.r, y1: y(0), y2: y(0), class: "axis" }));
  svg.append(el("svg:line", { x1: FR.l, x2: FR.l, y1: FR.t, y2: y(0), class: "axis" }));
  svg.append(el("svg:text", { x: (FR.l + FR.w) / 2, y: FR.h - 6, "text-anchor": "middle" }, "activation peak (bytes above fixed memory)"));
  if (predicted) {
    const cur = el("svg:circle", { cx: x(predicted.peak_bytes), cy: y(predicted.overhead), r: 7, class: "current",
                                   id: "frontier-current", "data-bytes": predicted.peak_bytes });
    cur.append(el("svg:title", {}, `this plan: ${fmtBytes(predicted.peak_bytes)}, ${fmtPct(predicted.overhead)}`));
    svg.append(cur);
  }
}

// ---- sizing -----------------------------------------------------------------------------------
// counts (layers, devices, bytes, parameters) as the integers they are, as `memplan size` prints
// them; other numbers to 5 significant digits
const fmtNumber = (v) => (Number.isSafeInteger(v) ? String(v) : v.toPrecision(5));

async function onSizing(ev) {
  ev.preventDefault();
  $("#sizing-error").textContent = "";
  const q = new URLSearchParams();
  try {
    for (const name of ["compute_flops", "params", "target_loss"]) {
      const v = ev.target.elements[name].value.trim();
      if (v) {
        const num = Number(v);
        if (!Number.isFinite(num)) throw new Error(`${name}: ${JSON.stringify(v)} is not a number`);
        q.set(name, String(num));
      }
    }
    const mem = ev.target.elements.memory_bytes.value.trim();
    if (mem) q.set("memory_bytes", String(parseBytes(mem)));
    q.set("devices", ev.target.elements.devices.value || "1");
    if (ev.target.elements.law.value) q.set("law", ev.target.elements.law.value);
    const out = await api(`/v1/sizing?${q}`);
    const dl = $("#sizing-out");
    dl.replaceChildren();
    for (const [k, v] of Object.entries(out)) {
      if (v === null || typeof v === "object") continue;
      dl.append(el("dt", {}, k), el("dd", { "data-key": k }, typeof v === "number" ? fmtNumber(v) : String(v)));
    }
  } catch (err) { $("#sizing-error").textContent = `sizing: ${err.message}`; }
}

// ---- jobs: list, live progress (server-sent events over fetch, so that the key is sent), cancel
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

async function refreshJobs() {
  $("#jobs-error").textContent = "";
  try {
    const [runs, profiles] = await Promise.all([api("/v1/runs?limit=20"), api("/v1/profiles?limit=20")]);
    const jobs = [...runs.items, ...profiles.items].sort((a, b) => b.created_at - a.created_at).slice(0, 20);
    $("#jobs").replaceChildren(...jobs.map(jobItem));
    for (const job of jobs) if (job.kind === "run" && !TERMINAL.has(job.state)) watch(job.id);
  } catch (err) { $("#jobs-error").textContent = `jobs: ${err.message}`; }
}

// A finished job's result, in words: a validation run's verdict (ok or mismatch, its message,
// predicted against measured peak, the gradient check), a Hugging Face run's comparison, a
// profile's stages. Returns {verdict, text} (verdict: the run's status, or "" when it has none).
function resultSummary(job) {
  const r = job.result;
  if (job.state !== "succeeded" || !isObject(r)) return null;
  const small = (x) => (typeof x !== "number" ? "-" : x === 0 ? "0" : x.toPrecision(3));
  const pct = (x) => (typeof x === "number" ? ` (${x >= 0 ? "+" : ""}${x.toFixed(2)}%)` : "");
  const peak = r.measured_peak_bytes !== undefined
    ? `peak ${fmtBytes(r.predicted_peak_bytes)} predicted, ${fmtBytes(r.measured_peak_bytes)} measured${pct(r.peak_error_pct)}` : "";
  if (job.kind === "run" && r.kind === "hf") {
    // its message compares the peaks already
    return { verdict: "", text: `${r.model}, ${r.strategy} plan: ${r.message || peak}` };
  }
  if (job.kind === "run") {
    const grads = typeof r.grad_max_abs_diff === "number"
      ? `gradients: max |diff| ${small(r.grad_max_abs_diff)}, relative ${small(r.grad_max_rel_diff)}` +
        (typeof r.tolerance === "number" ? ` (tolerance ${r.tolerance})` : "") : "";
    const status = typeof r.status === "string" ? r.status : "";
    return { verdict: status, text: [status && `${status}: ${r.message || ""}`.replace(/: $/, ""), peak, grads]
      .filter(Boolean).join("; ") };
  }
  if (Array.isArray(r.layers)) return { verdict: "", text: `${r.name || "profile"}: ${r.layers.length} stages` };
  return null;
}

function jobItem(job) {
  const li = el("li", { id: `job-${job.id}`, "data-state": job.state });
  li.append(el("span", { class: "id" }, `${job.kind} ${job.id.slice(0, 12)}`));
  const summary = resultSummary(job);
  // a run whose comparison failed finished, but it is not a success: the state says so
  const verdict = summary && summary.verdict;
  li.append(el("span", { class: verdict ? `state verdict-${verdict}` : "state" },
               verdict ? `${job.state}: ${verdict}` : job.state));
  if (verdict) li.dataset.verdict = verdict;
  const bar = el("progress", { max: 1, value: job.progress, "aria-label": `progress of ${job.kind} ${job.id}` });
  li.append(bar);
  li.append(el("span", { class: "msg" }, job.error ? job.error.detail : job.message || ""));
  if (summary && summary.text) {
    li.append(el("span", { class: verdict ? `result verdict-${verdict}` : "result" }, summary.text));
  }
  const arts = job.artifacts || [];
  if (arts.length) {
    const box = el("span", { class: "artifacts" });
    for (const info of arts) {
      if (info.href) {
        const a = el("a", { href: info.href, download: `${job.kind}-${job.id.slice(0, 12)}-${info.name}`,
                            class: "artifact", "data-name": info.name,
                            "aria-label": `download ${info.name} of ${job.kind} ${job.id} (${fmtBytes(info.size_bytes)})` },
                     `${info.name} (${fmtBytes(info.size_bytes)})`);
        a.addEventListener("click", downloadArtifact);
        box.append(a);
        if (info.name === "timeline.json") {
          const b = el("button", { type: "button", class: "show-timeline",
                                   "aria-label": `show the measured timeline of ${job.kind} ${job.id}` }, "Show timeline");
          b.addEventListener("click", () => showJobTimeline(job, info));
          box.append(b);
        }
      } else {
        box.append(el("span", { class: "absent", "data-name": info.name, title: info.reason || "" },
                      `no ${info.name}: ${info.reason || "not kept"}`));
      }
    }
    li.append(box);
  }
  if (!TERMINAL.has(job.state)) {
    const b = el("button", { type: "button", "aria-label": `cancel ${job.kind} ${job.id}` }, "Cancel");
    b.addEventListener("click", () => cancelJob(job));
    li.append(b);
  }
  return li;
}

function updateJob(job) {
  const old = document.getElementById(`job-${job.id}`);
  if (old) old.replaceWith(jobItem(job));
}

async function watch(id) {
  if (state.watching.has(id)) return;
  state.watching.add(id);
  try {
    const r = await api(`/v1/runs/${encodeURIComponent(id)}/events`, { raw: true, headers: { Accept: "text/event-stream" } });
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
        }
        if (!data) continue;
        const msg = JSON.parse(data);
        const li = document.getElementById(`job-${id}`);
        if (event === "progress" && li) {
          li.querySelector("progress").value = msg.progress;
          li.querySelector(".msg").textContent = msg.message || "";
        } else if (event === "state" && li) {
          li.querySelector(".state").textContent = msg.state || "";
          li.dataset.state = msg.state || li.dataset.state;
        } else if (event === "end") {
          updateJob(msg);
        }
      }
    }
  } catch (err) {
    $("#jobs-error").textContent = `events of ${id}: ${err.message}`;
  } finally {
    state.watching.delete(id);
  }
}

async function cancelJob(job) {
  try {
    updateJob(await api(`/v1/${job.kind === "run" ? "runs" : "profiles"}/${encodeURIComponent(job.id)}/cancel`, { method: "POST" }));
  } catch (err) { $("#jobs-error").textContent = `cancel: ${err.message}`; }
}

// a run plans with the page's strategy and, when optimal, its offload bandwidth (POST /v1/runs
// offload_bandwidth; the server's CPU refuses a plan that moves activations, in one line)
function withOffload(body) {
  const bw = offloadBandwidth(); // throws, and says why beside the field, when it cannot read it
  if (bw !== null && body.strategy === "optimal") body.offload_bandwidth = bw;
  return body;
}

async function onRun(ev) {
  ev.preventDefault();
  $("#jobs-error").textContent = "";
  try {
    const budget = $("#run-budget").value.trim();
    const width = Number($("#run-width").value);
    const body = withOffload({ model: "gpt", strategy: $("#strategy").value, steps: Number($("#run-steps").value),
                   budget_bytes: budget ? parseBytes(budget) : null,
                   config: { n_layer: Number($("#run-layers").value), n_embd: width, n_head: Math.max(1, Math.round(width / 32)) } });
    const job = await api("/v1/runs", { method: "POST", body });
    await refreshJobs();
    watch(job.id);
  } catch (err) { $("#jobs-error").textContent = `run: ${err.message}`; }
}

// a Hugging Face run: the server builds the model from its config and installs the plan
async function onHfRun(ev) {
  ev.preventDefault();
  $("#jobs-error").textContent = "";
  try {
    let cfg;
    try { cfg = JSON.parse($("#hf-run-config").value); } catch (err) {
      throw new Error(`config.json is not JSON (${err.message})`);
    }
    const budget = $("#run-budget").value.trim();
    const body = withOffload({ model: "hf", strategy: $("#strategy").value, steps: Number($("#run-steps").value),
                   budget_bytes: budget ? parseBytes(budget) : null,
                   config: { hf_config: cfg, seq: Number($("#hf-run-seq").value),
                             batch_size: Number($("#hf-run-batch").value),
                             lean_loss: $("#hf-run-loss").value !== "hf",
                             reuse_logits: $("#hf-run-loss").value === "reuse" } });
    const job = await api("/v1/runs", { method: "POST", body });
    await refreshJobs();
    watch(job.id);
  } catch (err) { $("#jobs-error").textContent = `Hugging Face run: ${err.message}`; }
}

// ---- start ------------------------------------------------------------------------------------
function init() {
  $("#example").addEventListener("change", onExample);
  $("#upload").addEventListener("change", onUpload);
  $("#run-timeline").addEventListener("change", onRunTimeline);
  $("#hf-go").addEventListener("click", onHfConfig);
  $("#budget-range").addEventListener("input", onSlider);
  $("#budget-text").addEventListener("change", onBudgetText);
  $("#budget-text").addEventListener("keydown", (ev) => { if (ev.key === "Enter") onBudgetText(); });
  $("#strategy").addEventListener("change", schedulePlan);
  $("#offload-text").addEventListener("change", schedulePlan);
  const chart = $("#timeline-chart");
  chart.addEventListener("pointermove", onTimelinePointer);
  chart.addEventListener("keydown", onTimelineKey);
  $("#sizing-form").addEventListener("submit", onSizing);
  $("#run-form").addEventListener("submit", onRun);
  $("#hf-run-form").addEventListener("submit", onHfRun);
  $("#jobs-refresh").addEventListener("click", refreshJobs);
  loadExamples()
    .then(() => { document.body.dataset.ready = "1"; })
    .catch((err) => status(`examples: ${err.message}`));
  refreshJobs();
}

document.addEventListener("DOMContentLoaded", init);
