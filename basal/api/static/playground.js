// The basal playground: build a request, send it with diagnostics, show why the answer came out as it did, keep
// runs to compare, copy the request. Plain browser JavaScript; every request goes to the server that served it.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const KEY_STORE = "basal-playground-api-key"; // sessionStorage only: gone when the tab closes
const TIMING_HEADERS = [
  "x-basal-queue-ms", "x-basal-compute-ms", "x-basal-total-ms", "x-basal-batch-requests",
  "x-basal-warnings", "x-request-id",
];
const OPTION_HINTS = {
  noul: "criteria (optional): true: … / false: …",
  choice: "options, one a line: key: description (2–10; up to 255 on /v1/systemone)",
  score: "levels, lowest first, one a line",
  multi: "labels, one a line",
  act: "criteria (optional): true: … / false: …",
};
const DEFAULTS = {
  noul: { instructions: "Does this convey urgency?", options: "", extra: "" },
  choice: {
    instructions: "Which team should handle this?",
    options: "billing: Payments, invoicing, refunds\ntechnical: Bugs, outages",
    extra: "",
  },
  score: { instructions: "How urgent is it?", options: "low\nmedium\nhigh", extra: "" },
  multi: { instructions: "Which topics does it touch?", options: "payments\ndelivery\naccount", extra: "" },
  act: {
    instructions: "Should we escalate?",
    options: "",
    extra: '{"costs": {"escalate": {"true": 0, "false": 1}, "wait": {"true": 3, "false": 0}}}',
  },
};

const state = { models: [], runs: [], counter: 0 };

// ---- the editor -------------------------------------------------------------------------------------------

function addQuestion(type, q = null) {
  const card = $("#question-card").content.firstElementChild.cloneNode(true);
  state.counter += 1;
  const d = q || DEFAULTS[type];
  $(".q-name", card).value = q ? q.name : `q${state.counter}`;
  $(".q-type", card).value = type;
  $(".q-instructions", card).value = d.instructions || "";
  $(".q-options", card).value = d.options || "";
  $(".q-extra", card).value = d.extra || "";
  $(".q-evidence", card).checked = Boolean(q && q.evidence);
  const hint = () => { $(".q-options-label", card).textContent = OPTION_HINTS[$(".q-type", card).value]; };
  $(".q-type", card).addEventListener("change", () => {
    const t = $(".q-type", card).value;
    $(".q-options", card).value = DEFAULTS[t].options;
    $(".q-extra", card).value = DEFAULTS[t].extra;
    hint();
  });
  $(".q-remove", card).addEventListener("click", () => card.remove());
  hint();
  $("#questions").append(card);
  return card;
}

function parseLines(text, type) {
  // "key: text" lines -> an object (noul, choice, act); plain lines -> a list (score, multi). A value that is
  // JSON (starts with { or [) is sent as it is.
  const trimmed = text.trim();
  if (!trimmed) return undefined;
  if (trimmed.startsWith("{") || trimmed.startsWith("[")) return JSON.parse(trimmed);
  const lines = trimmed.split("\n").map((l) => l.trim()).filter(Boolean);
  if (type === "score" || type === "multi") return lines;
  const out = {};
  for (const line of lines) {
    const at = line.indexOf(":");
    if (at < 0) out[line] = null;
    else out[line.slice(0, at).trim()] = line.slice(at + 1).trim() || null;
  }
  return out;
}

function readState() {
  const text = $("#state").value;
  if ($("input[name=state-kind]:checked").value !== "json") return text;
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`the state is not JSON: ${e.message}`);
  }
}

function buildRequest(dialect) {
  // The request of the editor in a dialect: /v1/systemone names the model (or jev-latest), /v1/basal too.
  const questions = {};
  for (const card of $$("#questions .question")) {
    const name = $(".q-name", card).value.trim();
    const type = $(".q-type", card).value;
    const q = { type, instructions: $(".q-instructions", card).value };
    let criteria;
    try {
      criteria = parseLines($(".q-options", card).value, type);
    } catch (e) {
      throw new Error(`question ${name}: the options are not JSON: ${e.message}`);
    }
    if (criteria !== undefined) q.criteria = criteria;
    if ($(".q-evidence", card).checked) q.evidence = true;
    const extra = $(".q-extra", card).value.trim();
    if (extra) {
      try {
        Object.assign(q, JSON.parse(extra));
      } catch (e) {
        throw new Error(`question ${name}: more fields are not a JSON object: ${e.message}`);
      }
    }
    questions[name] = q;
  }
  const body = { model: $("#model").value || undefined, state: readState(), questions };
  if ($("#facts").checked) body.facts = "auto";
  return JSON.parse(JSON.stringify(body)); // drops undefined members
}

function loadRequest(text) {
  // A pasted request of either dialect -> the editor (the dialect is guessed from the model name).
  const body = JSON.parse(text);
  if (typeof body !== "object" || body === null || typeof body.questions !== "object") {
    throw new Error("a request is a JSON object with state and questions");
  }
  const isJson = typeof body.state !== "string";
  $("#state").value = isJson ? JSON.stringify(body.state, null, 2) : body.state;
  $(`input[name=state-kind][value=${isJson ? "json" : "text"}]`).checked = true;
  $("#facts").checked = body.facts === "auto";
  if (body.model && state.models.some((m) => m.name === body.model)) $("#model").value = body.model;
  $("#dialect").value = body.model && body.model.startsWith("jev-") ? "systemone" : $("#dialect").value;
  $("#questions").replaceChildren();
  for (const [name, q] of Object.entries(body.questions)) {
    const type = q.type || "choice";
    const { type: _t, instructions, criteria, evidence, ...rest } = q;
    let options = "";
    if (Array.isArray(criteria) && criteria.every((c) => typeof c === "string")) options = criteria.join("\n");
    else if (criteria && typeof criteria === "object" && !Array.isArray(criteria)
      && Object.values(criteria).every((v) => v === null || typeof v === "string")) {
      options = Object.entries(criteria).map(([k, v]) => (v === null ? k : `${k}: ${v}`)).join("\n");
    } else if (criteria !== undefined) options = JSON.stringify(criteria);
    const extra = Object.keys(rest).length ? JSON.stringify(rest) : "";
    addQuestion(type, { name, instructions: instructions || "", options, extra, evidence });
  }
}

// ---- talking to the server --------------------------------------------------------------------------------

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { authorization: `Bearer ${key}` } : {};
}

function serverMessage(status, body) {
  // The message of an error body of either dialect: {"error": ...}, {"detail": "..."}, {"detail": {"message"}},
  // {"detail": [{"msg", "loc"}]}.
  if (body && typeof body === "object") {
    // `/v1/basal` keeps upstream's wording on the wire ("1 options"); the page shows it in plain English
    if (typeof body.error === "string" && !body.detail) return body.error.replace(/\b1 options\b/g, "1 option");
    const d = body.detail;
    if (typeof d === "string") return d;
    if (d && typeof d === "object" && !Array.isArray(d) && d.message) return d.message;
    if (Array.isArray(d)) return d.map((e) => `${(e.loc || []).slice(1).join(".")}: ${e.msg}`).join("\n");
  }
  return typeof body === "string" ? body : JSON.stringify(body);
}

async function loadModels() {
  try {
    const r = await fetch("v1/models", { headers: authHeaders() });
    const body = await r.json();
    if (!r.ok) throw new Error(`${r.status}: ${serverMessage(r.status, body)}`);
    state.models = body.models;
    $("#model").replaceChildren(...body.models.map((m) => new Option(m.name, m.name)));
    showModelInfo();
  } catch (e) {
    $("#model-info").textContent = `models: ${e.message}`;
  }
}

function showModelInfo() {
  const m = state.models.find((x) => x.name === $("#model").value);
  if (!m) return;
  $("#model-info").textContent =
    `types ${m.types.join(", ")} · evidence ${m.evidence ? "yes" : "no"} · calibrated ${m.calibrated ? "yes" : "no"}`;
  $("#synthetic-note").hidden = !m.synthetic;
  for (const el of $$(".q-evidence-label")) el.hidden = !m.evidence;
  for (const option of $$("#new-type option, .q-type option")) option.disabled = !m.types.includes(option.value);
}

async function send() {
  $("#error").hidden = true;
  let request;
  const dialect = $("#dialect").value;
  try {
    request = buildRequest(dialect);
  } catch (e) {
    showError(e.message);
    return;
  }
  $("#status").textContent = "sending…";
  const started = performance.now();
  let r, body;
  try {
    r = await fetch(`v1/${dialect}`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-basal-diagnostics": "1", ...authHeaders() },
      body: JSON.stringify(request),
    });
    body = await r.json();
  } catch (e) {
    $("#status").textContent = "";
    showError(`no answer from the server: ${e.message}`);
    return;
  }
  const elapsed = performance.now() - started;
  const headers = {};
  for (const h of TIMING_HEADERS) if (r.headers.get(h) !== null) headers[h] = r.headers.get(h);
  $("#status").textContent = `${r.status} · ${elapsed.toFixed(0)} ms in the browser`;
  if (!r.ok) {
    showError(`${r.status}: ${serverMessage(r.status, body)}`);
    return;
  }
  const run = { id: state.runs.length + 1, dialect, request, body, headers };
  state.runs.push(run);
  renderRun(run, $("#result"));
  renderRuns();
}

function showError(message) {
  $("#error").textContent = message;
  $("#error").hidden = false;
}

// ---- results ----------------------------------------------------------------------------------------------

const fmt = (p) => (p === undefined || p === null ? "–" : p.toFixed(4));
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children);
  return node;
};
const bar = (p, small = false) => {
  const fill = el("span");
  fill.style.width = `${Math.max(0, Math.min(1, p || 0)) * 100}%`;
  return el("div", { class: small ? "bar small" : "bar" }, fill);
};

function headline(a) {
  if (a.type === "noul") return `noul ${fmt(a.noul)}`;
  if (a.type === "choice") return `choice ${a.choice}`;
  if (a.type === "score") return `score ${fmt(a.score)}`;
  if (a.type === "multi") return `selected [${a.selected.join(", ")}] (threshold ${fmt(a.threshold)})`;
  if (a.type === "act") return `action ${JSON.stringify(a.action)} (answer ${a.answer})`;
  return a.type;
}

function answerProbabilities(a, diag) {
  // The answer's option probabilities (a TypeSafe noul answer has only P(true): both options from diagnostics).
  if (a.probabilities) return a.probabilities;
  if (a.type === "noul") return diag ? diag.readouts[0].calibrated : { true: a.noul, false: 1 - a.noul };
  return {};
}

function renderAnswer(name, a, diag) {
  const box = el("div", { class: "answer", "data-question": name });
  const conf = a.confidence !== undefined ? ` · confidence ${fmt(a.confidence)}` : "";
  box.append(el("div", { class: "headline" }, `${name}: ${headline(a)}${conf}`));
  const probs = answerProbabilities(a, diag);
  const top = Object.entries(probs).reduce((b, kv) => (b === null || kv[1] > b[1] ? kv : b), null);
  const table = el("table", { class: "bars" });
  for (const [k, p] of Object.entries(probs)) {
    const row = el("tr", { class: top && k === top[0] && a.type !== "multi" ? "top" : "", "data-option": k },
      el("td", { class: "key" }, k), el("td", {}, bar(p)), el("td", { class: "num", "data-p": String(p) }, fmt(p)));
    table.append(row);
  }
  box.append(table);
  if (diag) box.append(renderParts(diag));
  if (a.evidence) {
    box.append(el("div", { class: "parts" }, `evidence: ${a.evidence.map((s) => `“${s.text}” ${fmt(s.probability)}`).join(" · ")}`));
  }
  return box;
}

function renderParts(diag) {
  // Per readout: each option order's probabilities, their average, and the calibrated result (temperature T).
  const parts = el("details", { class: "parts", open: "" });
  parts.append(el("summary", {}, `per-order parts · T = ${diag.temperature.toFixed(4)}${diag.rounds > 1 ? " · 2 rounds (large choice: joint of the groups)" : ""}`));
  for (const r of diag.readouts) {
    const table = el("table", { class: "bars parts-table", "data-readout": r.name });
    const head = el("tr", {}, el("td", { class: "key" }, r.name));
    r.orders.forEach((o, i) => head.append(el("td", { class: "num" }, `order ${i + 1}`)));
    head.append(el("td", { class: "num" }, "average"), el("td", { class: "num" }, "calibrated"), el("td", {}, ""));
    table.append(head);
    for (const k of Object.keys(r.average)) {
      const row = el("tr", { "data-option": k }, el("td", { class: "key" }, k));
      r.orders.forEach((o) => row.append(el("td", { class: "num order" }, fmt(o.probabilities[k]))));
      row.append(el("td", { class: "num" }, fmt(r.average[k])), el("td", { class: "num" }, fmt(r.calibrated[k])),
        el("td", {}, bar(r.calibrated[k], true)));
      table.append(row);
    }
    if (r.orders.some((o) => o.letter_mass != null)) {
      // each order's letters' share of the full-vocabulary softmax at the answer position
      const row = el("tr", { class: "letter-mass", title: "the option letters' share of the whole vocabulary's probability at the answer position" },
        el("td", { class: "key" }, "letter mass"));
      r.orders.forEach((o) => row.append(el("td", { class: "num order" }, fmt(o.letter_mass))));
      row.append(el("td", {}, ""), el("td", {}, ""), el("td", {}, ""));
      table.append(row);
    }
    parts.append(table);
    if (r.orders.length) {
      parts.append(el("div", {}, r.orders.map((o, i) => `order ${i + 1}: ${o.letters.map((k, j) => `${String.fromCharCode(65 + j)}=${k}`).join(" ")}`).join(" · ")));
    }
  }
  return parts;
}

function stateText(request) {
  // The state as the server reads it: a string as it is, an object as Python's json.dumps writes it.
  const s = request.state;
  return typeof s === "string" ? s : pyJson(s);
}

function pyJson(v) {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (v && typeof v === "object") return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`).join(", ")}}`;
  return JSON.stringify(v);
}

function renderState(run) {
  // The state with every evidence span highlighted (offsets into the state as sent).
  const text = stateText(run.request);
  const spans = [];
  for (const a of Object.values(run.body.answers)) for (const s of a.evidence || []) spans.push(s);
  spans.sort((x, y) => x.start - y.start);
  const view = el("div", { class: "state-view" });
  let at = 0;
  for (const s of spans) {
    if (s.start < at) continue;
    view.append(text.slice(at, s.start), el("mark", { title: `p = ${fmt(s.probability)}` }, text.slice(s.start, s.end)));
    at = s.end;
  }
  view.append(text.slice(at));
  return view;
}

function renderRun(run, into) {
  into.replaceChildren();
  const { body, headers } = run;
  const diags = (body.diagnostics || {}).questions || {};
  into.append(el("h3", {}, `run #${run.id} · ${run.dialect} · ${body.model}`));
  for (const [name, a] of Object.entries(body.answers)) into.append(renderAnswer(name, a, diags[name]));
  if (Object.values(run.body.answers).some((a) => a.evidence)) {
    into.append(el("h3", {}, "Evidence in the state"), renderState(run));
  }
  const facts = Object.values(diags).map((d) => d.facts).find((f) => f);
  if (facts) into.append(el("h3", {}, "Facts block (appended to the state)"), el("div", { class: "state-view facts" }, facts.trim()));
  const kv = el("dl", { class: "kv" });
  for (const [k, v] of Object.entries(body.usage)) kv.append(el("dt", {}, `usage.${k}`), el("dd", {}, String(v)));
  if (body.diagnostics) {
    kv.append(el("dt", {}, "packed tokens"), el("dd", {}, String(body.diagnostics.packed_tokens)));
  }
  for (const [k, v] of Object.entries(headers)) kv.append(el("dt", {}, k), el("dd", { "data-header": k }, v));
  into.append(kv);
}

function changes(before, after) {
  // What differs between two requests: the model, the state, each question added, removed or changed (by field).
  const out = [];
  const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
  for (const key of new Set([...Object.keys(before), ...Object.keys(after)])) {
    if (key === "questions" || same(before[key], after[key])) continue;
    out.push(key);
  }
  const qa = before.questions || {}, qb = after.questions || {};
  for (const name of Object.keys(qa)) if (!(name in qb)) out.push(`−${name}`);
  for (const [name, q] of Object.entries(qb)) {
    if (!(name in qa)) out.push(`+${name}`);
    else if (!same(qa[name], q)) {
      const fields = [...new Set([...Object.keys(qa[name]), ...Object.keys(q)])].filter((f) => !same(qa[name][f], q[f]));
      out.push(`${name}.${fields.join("/")}`);
    }
  }
  return out;
}

function runLabel(run) {
  // The first run names its questions; every later one says what changed since the run before it.
  const names = Object.keys(run.request.questions);
  const previous = state.runs[run.id - 2];
  if (!previous) {
    const first = run.request.questions[names[0]];
    return `#${run.id} ${run.dialect}: ${names.join(", ")} — ${(first && first.instructions) || ""}`.slice(0, 120);
  }
  const diff = changes(previous.request, run.request);
  const dialect = previous.dialect === run.dialect ? run.dialect : `${previous.dialect} → ${run.dialect}`;
  const what = diff.length ? `changed ${diff.join(", ")}` : "the same request again";
  return `#${run.id} ${dialect}: ${what}`.slice(0, 120);
}

function renderRuns() {
  $("#runs").replaceChildren(...state.runs.map((run) => {
    const li = el("li", { "data-run": String(run.id) }, runLabel(run));
    li.addEventListener("click", () => renderRun(run, $("#result")));
    return li;
  }));
  for (const id of ["#compare-a", "#compare-b"]) {
    const select = $(id);
    const kept = select.value;
    select.replaceChildren(...state.runs.map((run) => new Option(`#${run.id}`, String(run.id))));
    if (kept) select.value = kept;
  }
  const n = state.runs.length;
  if (n >= 2) {
    $("#compare-a").value = String(n - 1);
    $("#compare-b").value = String(n);
  }
}

function pairs(a, b) {
  // Questions of two runs side by side: by name; two runs with no name in common, in order.
  const na = Object.keys(a.body.answers), nb = Object.keys(b.body.answers);
  const common = na.filter((n) => nb.includes(n));
  if (common.length) return common.map((n) => [n, n]);
  return na.slice(0, nb.length).map((n, i) => [n, nb[i]]);
}

function compare() {
  const a = state.runs[Number($("#compare-a").value) - 1];
  const b = state.runs[Number($("#compare-b").value) - 1];
  const out = $("#comparison");
  out.replaceChildren();
  if (!a || !b) return;
  for (const [qa, qb] of pairs(a, b)) {
    const da = ((a.body.diagnostics || {}).questions || {})[qa];
    const db = ((b.body.diagnostics || {}).questions || {})[qb];
    const pa = answerProbabilities(a.body.answers[qa], da), pb = answerProbabilities(b.body.answers[qb], db);
    const table = el("table", { class: "bars deltas", "data-pair": `${qa}|${qb}` });
    table.append(el("tr", {}, el("td", { class: "key" }, "option"), el("td", { class: "num" }, `A #${a.id}`),
      el("td", { class: "num" }, `B #${b.id}`), el("td", { class: "num" }, "B − A")));
    for (const k of [...new Set([...Object.keys(pa), ...Object.keys(pb)])]) {
      const d = (pb[k] ?? 0) - (pa[k] ?? 0);
      const sign = d > 0 ? "+" : "";
      table.append(el("tr", { "data-option": k }, el("td", { class: "key" }, k), el("td", { class: "num" }, fmt(pa[k])),
        el("td", { class: "num" }, fmt(pb[k])),
        el("td", { class: `num delta ${d > 0 ? "delta-up" : d < 0 ? "delta-down" : ""}`, "data-delta": String(d) }, `${sign}${d.toFixed(4)}`)));
    }
    const left = el("div", {}, el("div", { class: "muted" }, `A #${a.id}: ${a.request.questions[qa].instructions || ""}`),
      renderAnswer(qa, a.body.answers[qa], da));
    const right = el("div", {}, el("div", { class: "muted" }, `B #${b.id}: ${b.request.questions[qb].instructions || ""}`),
      renderAnswer(qb, b.body.answers[qb], db));
    out.append(el("h3", {}, qa === qb ? qa : `${qa} ↔ ${qb}`), table, el("div", { class: "side" }, left, right));
  }
}

// ---- copy as ----------------------------------------------------------------------------------------------

const shellQuote = (s) => `'${s.replace(/'/g, "'\\''")}'`;
const py = (v) => pyLiteral(v);

function pyLiteral(v) {
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "number" || typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(pyLiteral).join(", ")}]`;
  return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${pyLiteral(x)}`).join(", ")}}`;
}

function serverRoot() {
  return new URL(".", window.location.href).href.replace(/\/$/, "");
}

function snippet(kind) {
  const key = sessionStorage.getItem(KEY_STORE);
  if (kind === "curl") {
    const dialect = $("#dialect").value;
    const auth = key ? ` -H ${shellQuote(`authorization: Bearer ${key}`)}` : "";
    return `curl -s ${serverRoot()}/v1/${dialect} -H 'content-type: application/json'${auth} -d ${shellQuote(JSON.stringify(buildRequest(dialect)))}`;
  }
  if (kind === "typesafe") {
    const request = buildRequest("systemone");
    const classes = { noul: "Noul", choice: "Choice", score: "Score" };
    const lines = [];
    const skipped = [];
    for (const [name, q] of Object.entries(request.questions)) {
      if (!classes[q.type] || q.evidence || Object.keys(q).some((k) => !["type", "instructions", "criteria"].includes(k))) {
        skipped.push(name);
        continue;
      }
      const crit = q.criteria !== undefined ? `, criteria=${py(q.criteria)}` : "";
      lines.push(`            ${JSON.stringify(name)}: ${classes[q.type]}(instructions=${py(q.instructions)}${crit}),`);
    }
    const note = skipped.length
      ? `# ${skipped.join(", ")}: basal extensions (multi, act, evidence, extra fields) that the TypeSafe SDK has no class\n# for; send them with curl or the native SDK.\n`
      : "";
    const extra = request.facts ? `\n        extra_body={"facts": "auto"},` : "";
    return `${note}from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

with TypeSafeClient(api_key=${py(key || "any")}, base_url=${py(serverRoot())}) as client:
    result = client.system_one(
        model=${py(request.model || "jev-latest")},
        state=${py(request.state)},
        questions={
${lines.join("\n")}
        },${extra}
    )
print(result.model_dump_json(indent=2))`;
  }
  const request = buildRequest("basal");
  const note = key ? "# basal-client 0.6 sends no API key: serve this model without keys, or put a proxy in front\n" : "";
  return `${note}import json

from basal_client import BasalClient

request = ${py(request)}
with BasalClient(${py(serverRoot())}) as client:
    response = client.decide(request)
print(json.dumps(response, indent=2, ensure_ascii=False))`;
}

async function copy(kind) {
  let text;
  try {
    text = snippet(kind);
  } catch (e) {
    showError(e.message);
    return;
  }
  $("#snippet").textContent = text;
  $("#snippet").dataset.kind = kind;
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {
    // no clipboard permission (an http page on another host): the text is shown to copy by hand
  }
}

// ---- start ------------------------------------------------------------------------------------------------

function start() {
  const key = $("#api-key");
  key.value = sessionStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => {
    if (key.value) sessionStorage.setItem(KEY_STORE, key.value);
    else sessionStorage.removeItem(KEY_STORE);
    loadModels();
  });
  $("#model").addEventListener("change", showModelInfo);
  $("#add-question").addEventListener("click", () => {
    addQuestion($("#new-type").value);
    showModelInfo();
  });
  $("#send").addEventListener("click", send);
  $("#compare").addEventListener("click", compare);
  $("#load-paste").addEventListener("click", () => {
    $("#paste-error").textContent = "";
    try {
      loadRequest($("#paste").value);
      showModelInfo();
    } catch (e) {
      $("#paste-error").textContent = e.message;
    }
  });
  for (const b of $$("button[data-copy]")) b.addEventListener("click", () => copy(b.dataset.copy));
  addQuestion("noul");
  addQuestion("choice");
  loadModels();
}

start();
