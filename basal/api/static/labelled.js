// A labelled file scored in the page: every request sent to this server as /v1/systemone, the answers against
// their gold answers. The numbers follow basal/calibration/metrics.py (tests/calibration/test_labelled_page.py
// checks them against it): the decision is the first most probable option, log-loss floors p at 1e-12, ECE cuts
// the answers sorted by confidence into 10 bins of equal count (as numpy's array_split).
"use strict";

const FLOOR = 1e-12;
const BINS = 10;
const SCORED = new Set(["choice", "noul", "score"]);
const $ = (id) => document.getElementById(id);

function parseFile(text) {
  const lines = [];
  text.split("\n").forEach((raw, i) => {
    if (!raw.trim()) return;
    let line;
    try { line = JSON.parse(raw); } catch (e) { throw new Error(`line ${i + 1}: not JSON (${e.message})`); }
    const gold = {};
    for (const [name, q] of Object.entries(line.questions || {})) {
      if (!("gold" in q)) throw new Error(`line ${i + 1}: question ${name} has no gold`);
      gold[name] = q.gold;
      delete q.gold;
    }
    const id = line.id ?? `line:${i + 1}`;
    delete line.id; delete line.group;
    line.model = line.model || "jev-latest";
    lines.push({ number: i + 1, id: String(id), body: line, gold });
  });
  if (!lines.length) throw new Error("no labelled requests");
  return lines;
}

function goldKey(gold) {
  if (gold === true) return "true";
  if (gold === false) return "false";
  return String(gold);
}

async function send(body) {
  const headers = { "content-type": "application/json" };
  const key = $("api-key").value;
  if (key) headers.authorization = `Bearer ${key}`;
  const r = await fetch("../v1/systemone", { method: "POST", headers, body: JSON.stringify(body) });
  const data = await r.json();
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${JSON.stringify(data).slice(0, 300)}`);
  return data.answers;
}

// -> [{id, number, question, type, keys, p, gold}] for the scored questions of every line
async function answerAll(lines, rewrite) {
  const out = [];
  let done = 0;
  for (const line of lines) {
    const body = structuredClone(line.body);
    if (rewrite && body.questions[rewrite.name]) body.questions[rewrite.name].instructions = rewrite.text;
    const answers = await send(body);
    for (const [name, q] of Object.entries(body.questions)) {
      const type = q.type;
      if (!SCORED.has(type)) continue;
      const a = answers[name];
      const probs = type === "noul" ? { true: a.noul, false: 1 - a.noul } : a.probabilities;
      const keys = Object.keys(probs);
      const gold = keys.indexOf(goldKey(line.gold[name]));
      if (gold < 0) throw new Error(`line ${line.number}: gold ${JSON.stringify(line.gold[name])} of ${name} is not an option`);
      if (keys.length < 2) continue;
      out.push({ id: line.id, number: line.number, question: name, type, keys, p: keys.map((k) => probs[k]), gold });
    }
    $("status").textContent = `${++done} of ${lines.length} requests answered`;
  }
  return out;
}

const argmax = (p) => p.reduce((best, v, i) => (v > p[best] ? i : best), 0);

function bins(conf, hit) {
  const order = conf.map((c, i) => i).sort((a, b) => conf[a] - conf[b] || a - b);
  const n = order.length, k = Math.min(BINS, n), out = [];
  let at = 0;
  for (let b = 0; b < k; b++) {
    const size = Math.floor(n / k) + (b < n % k ? 1 : 0);
    const idx = order.slice(at, at + size);
    at += size;
    out.push({
      count: size,
      confidence: idx.reduce((s, i) => s + conf[i], 0) / size,
      accuracy: idx.reduce((s, i) => s + hit[i], 0) / size,
    });
  }
  return out;
}

function metrics(rows) {
  const n = rows.length;
  const hit = rows.map((r) => (argmax(r.p) === r.gold ? 1 : 0));
  const conf = rows.map((r) => Math.max(...r.p));
  const ll = rows.map((r) => -Math.log(Math.max(r.p[r.gold], FLOOR)));
  const br = rows.map((r) => r.p.reduce((s, v, k) => s + (v - (k === r.gold ? 1 : 0)) ** 2, 0));
  const mean = (xs) => xs.reduce((s, x) => s + x, 0) / n;
  const bs = bins(conf, hit);
  return {
    count: n, accuracy: mean(hit), log_loss: mean(ll), brier: mean(br),
    ece: bs.reduce((s, b) => s + (b.count / n) * Math.abs(b.accuracy - b.confidence), 0), bins: bs,
    coverage: coverage(conf, hit),
  };
}

function coverage(conf, hit) {
  const order = conf.map((c, i) => i).sort((a, b) => conf[b] - conf[a] || a - b);
  let right = 0;
  return order.map((i, k) => { right += hit[i]; return [(k + 1) / order.length, right / (k + 1)]; });
}

function report(rows) {
  const out = { overall: metrics(rows), by_type: {} };
  for (const t of [...new Set(rows.map((r) => r.type))].sort()) out.by_type[t] = metrics(rows.filter((r) => r.type === t));
  return out;
}

const fmt = (v) => (typeof v === "number" && !Number.isInteger(v) ? v.toFixed(4) : String(v));

function table(head, rows) {
  const t = document.createElement("table");
  const tr = t.createTHead().insertRow();
  head.forEach((h) => { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); });
  const body = t.createTBody();
  rows.forEach((r) => { const row = body.insertRow(); r.forEach((c) => { row.insertCell().textContent = fmt(c); }); });
  return t;
}

const escapeText = (t) => t.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// An inline SVG line plot on [0, 1] x [0, 1] (the HTML parser puts <svg> in its namespace: no URI needed)
function plot(title, series, diagonal) {
  const w = 320, h = 240, pad = 30;
  const x = (v) => (pad + v * (w - 2 * pad)).toFixed(1), y = (v) => (h - pad - v * (h - 2 * pad)).toFixed(1);
  const line = (pts, color, dash) =>
    `<polyline fill="none" stroke="${color}"${dash ? ' stroke-dasharray="4 3"' : ""} points="${pts.map(([a, b]) => `${x(a)},${y(b)}`).join(" ")}"/>`;
  const colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];
  const parts = [line([[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]], "#999")];
  if (diagonal) parts.push(line([[0, 0], [1, 1]], "#999", true));
  series.forEach(([, pts], i) => parts.push(line(pts, colors[i % colors.length])));
  const label = escapeText(`${title}: ${series.map((s) => s[0]).join(", ")}`);
  const holder = document.createElement("div");
  holder.innerHTML = `<svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${label}">${parts.join("")}<text x="${pad}" y="16">${label}</text></svg>`;
  return holder.firstChild;
}

function show(rep, rows, other) {
  const results = $("results");
  results.replaceChildren();
  const o = rep.overall;
  const head = document.createElement("p");
  head.id = "headline";
  head.textContent = `${o.count} labelled answers: accuracy ${(100 * o.accuracy).toFixed(1)} %, log-loss ${fmt(o.log_loss)}, Brier ${fmt(o.brier)}, ECE ${fmt(o.ece)}`;
  results.appendChild(head);
  const cols = ["count", "accuracy", "log_loss", "brier", "ece"];
  results.appendChild(table(["", ...cols], [["all", ...cols.map((c) => o[c])],
    ...Object.entries(rep.by_type).map(([t, m]) => [t, ...cols.map((c) => m[c])])]));
  const types = Object.entries(rep.by_type);
  results.appendChild(plot("reliability", types.map(([t, m]) => [t, m.bins.map((b) => [b.confidence, b.accuracy])]), true));
  results.appendChild(plot("accuracy against coverage", types.map(([t, m]) => [t, m.coverage]), false));
  if (other) {
    const h = document.createElement("h2");
    h.textContent = `Rephrased: ${other.name}`;
    results.appendChild(h);
    const a = report(rows.filter((r) => r.question === other.name));
    const b = report(other.rows.filter((r) => r.question === other.name));
    results.appendChild(table(["", ...cols], [["as written", ...cols.map((c) => a.overall[c])],
      ["rephrased", ...cols.map((c) => b.overall[c])]]));
    const flips = [];
    rows.forEach((r, i) => {
      const s = other.rows[i];
      if (r.question === other.name && argmax(r.p) !== argmax(s.p)) flips.push([r.number, r.id, r.keys[r.gold], r.keys[argmax(r.p)], s.keys[argmax(s.p)]]);
    });
    const f = table(["line", "id", "gold", "as written", "rephrased"], flips);
    f.id = "flips";
    results.appendChild(f);
    rep.rephrased = { as_written: a.overall, rephrased: b.overall, flips: flips.length };
  }
  window.basalLabelled = rep;
}

async function run() {
  $("status").textContent = "";
  window.basalLabelled = null;
  try {
    const file = $("file").files[0];
    const text = file ? await file.text() : $("text").value;
    const lines = parseFile(text);
    const rows = await answerAll(lines);
    const rep = report(rows);
    const name = $("rephrase-name").value.trim(), newText = $("rephrase-text").value.trim();
    let other = null;
    if (name && newText) other = { name, rows: await answerAll(parseFile(text), { name, text: newText }) };
    show(rep, rows, other);
    $("status").textContent = "done";
  } catch (e) {
    $("status").textContent = `error: ${e.message}`;
  }
}

$("score").addEventListener("click", run);
