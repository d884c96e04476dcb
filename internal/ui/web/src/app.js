// corral's dashboard: polls the node's API (Connect JSON) and /metrics once
// a second and follows the event stream; charts are uPlot, bundled by
// esbuild into internal/ui/dist (`make ui`), so nothing loads from a CDN.
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import "./app.css";

const POLL_MS = 1000;
const POINTS = 180; // three minutes of history per chart

// A token from ?token= is kept for the tab's session and sent as a bearer
// token on every request.
const params = new URLSearchParams(location.search);
if (params.has("token")) {
  sessionStorage.setItem("corral-token", params.get("token"));
  params.delete("token");
  history.replaceState(null, "", location.pathname + (params.size ? "?" + params : ""));
}
const token = sessionStorage.getItem("corral-token");

function headers(extra) {
  const h = Object.assign({}, extra);
  if (token) h.Authorization = "Bearer " + token;
  return h;
}

async function rpc(method, body) {
  const r = await fetch("/corral.v1." + method, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body || {}),
  });
  if (!r.ok) throw new Error(method + ": HTTP " + r.status);
  return r.json();
}

async function metrics() {
  const r = await fetch("/metrics", { headers: headers() });
  if (!r.ok) throw new Error("/metrics: HTTP " + r.status);
  return parseProm(await r.text());
}

// parseProm reads the Prometheus text format into [{name, labels, value}].
function parseProm(text) {
  const out = [];
  const re = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const lre = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = re.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(lre)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

const sum = (ms, name, pred) =>
  ms.filter((m) => m.name === name && (!pred || pred(m.labels))).reduce((a, m) => a + m.value, 0);

function groupBy(ms, name, key) {
  const g = {};
  for (const m of ms) if (m.name === name) g[key(m.labels)] = (g[key(m.labels)] || 0) + m.value;
  return g;
}

// quantile estimates a quantile from cumulative bucket counts {le: count},
// as PromQL's histogram_quantile does.
function quantile(q, buckets) {
  const les = Object.keys(buckets).map(Number).sort((a, b) => a - b);
  const total = buckets[les.find((x) => x === Infinity)] ?? 0;
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0, prevCount = 0;
  for (const le of les) {
    const c = buckets[le];
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + ((le - prevLe) * (rank - prevCount)) / Math.max(c - prevCount, 1e-9);
    }
    prevLe = le; prevCount = c;
  }
  return null;
}

// Chart is a uPlot time series whose set of series may grow: it is rebuilt
// when a new key appears.
const palette = ["#1a73e8", "#d93025", "#188038", "#f9ab00", "#9334e6", "#e8710a", "#12b5cb", "#5f6368"];
class Chart {
  constructor(el, opts = {}) {
    this.el = document.getElementById(el);
    this.keys = [];
    this.times = [];
    this.values = {};
    this.opts = opts;
    this.plot = null;
  }
  push(t, point) {
    for (const k of Object.keys(point)) if (!this.keys.includes(k)) {
      this.keys.push(k);
      this.values[k] = this.times.map(() => null);
      this.destroy();
    }
    this.times.push(t);
    for (const k of this.keys) this.values[k].push(point[k] ?? null);
    if (this.times.length > POINTS) {
      this.times.shift();
      for (const k of this.keys) this.values[k].shift();
    }
    this.draw();
  }
  data() { return [this.times, ...this.keys.map((k) => this.values[k])]; }
  destroy() { if (this.plot) { this.plot.destroy(); this.plot = null; } }
  draw() {
    if (this.plot) { this.plot.setData(this.data()); return; }
    this.plot = new uPlot({
      width: this.opts.width || 420, height: 180,
      scales: { x: { time: true }, y: { range: (u, lo, hi) => [Math.min(0, lo ?? 0), Math.max(hi ?? 1, this.opts.minMax || 1)] } },
      series: [{}, ...this.keys.map((k, i) => ({ label: k, stroke: palette[i % palette.length], width: 1.5, spanGaps: true }))],
      axes: [{}, { size: 50 }],
      legend: { show: true },
    }, this.data(), this.el);
  }
}

const charts = {
  creates: new Chart("c-creates"),
  latency: new Chart("c-latency"),
  sandboxes: new Chart("c-sandboxes"),
  verdicts: new Chart("c-verdicts"),
  refusals: new Chart("c-refusals"),
  cpu: new Chart("c-cpu", { minMax: 100 }),
  mem: new Chart("c-mem"),
};

let prev = null; // the previous scrape, for rates and latency windows
let selected = null; // the sandbox shown in detail
let filterText = "";

const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const mib = (b) => (Number(b || 0) / 1048576).toFixed(1) + " MiB";
const gib = (b) => (Number(b || 0) / 1073741824).toFixed(1) + " GiB";
const stateName = (s) => String(s || "").replace("SANDBOX_STATE_", "").toLowerCase();

function chartMetrics(t, ms) {
  const creates = sum(ms, "corral_sandbox_operation_duration_seconds_count", (l) => l.operation === "create");
  const buckets = groupBy(ms.filter((m) => m.labels.operation === "create"), "corral_sandbox_operation_duration_seconds_bucket", (l) => (l.le === "+Inf" ? Infinity : Number(l.le)));
  const verdicts = groupBy(ms, "corral_fncall_calls_total", (l) => l.verdict);
  if (prev) {
    const dt = (t - prev.t) || 1;
    charts.creates.push(t, { "creates/s": Math.max(0, creates - prev.creates) / dt });
    const window = {};
    for (const le of Object.keys(buckets)) window[le] = buckets[le] - (prev.buckets[le] || 0);
    const p50 = quantile(0.5, window), p99 = quantile(0.99, window);
    charts.latency.push(t, { p50: p50 == null ? null : p50 * 1000, p99: p99 == null ? null : p99 * 1000 });
    const rates = {};
    for (const v of Object.keys(verdicts)) rates[v] = Math.max(0, verdicts[v] - (prev.verdicts[v] || 0)) / dt;
    charts.verdicts.push(t, Object.keys(rates).length ? rates : { "no calls": 0 });
  } else {
    charts.creates.push(t, { "creates/s": 0 });
    charts.latency.push(t, { p50: null, p99: null });
    charts.verdicts.push(t, { "no calls": 0 });
  }
  const byState = groupBy(ms, "corral_sandboxes", (l) => l.backend + " " + l.state);
  charts.sandboxes.push(t, Object.keys(byState).length ? byState : { none: 0 });
  const dests = groupBy(ms, "corral_network_refused_destination_total", (l) => (l.name ? l.name + " (dns)" : `${l.address}:${l.port}/${l.protocol}`));
  const top = Object.entries(dests).sort((a, b) => b[1] - a[1]).slice(0, 6);
  charts.refusals.push(t, top.length ? Object.fromEntries(top) : { none: 0 });
  prev = { t, creates, buckets, verdicts };
}

function renderNodes(nodes) {
  $("nodes").tBodies[0].innerHTML = (nodes.nodes || []).map((n) => {
    const c = n.capacity || {}, k = n.committed || {}, u = n.used || {};
    const states = Object.entries(n.sandboxesByState || {}).map(([s, v]) => `${esc(s)} ${esc(v)}`).join(", ") || "none";
    return `<tr><td>${esc(n.id)}</td><td>${esc((n.backends || []).join(", "))}</td><td>${states}</td>` +
      `<td>${Number(u.cpuMillis || 0)}m / ${Number(k.cpuMillis || 0)}m / ${Number(c.cpuMillis || 0)}m</td>` +
      `<td>${mib(u.memoryBytes)} / ${mib(k.memoryBytes)} / ${gib(c.memoryBytes)}</td>` +
      `<td>${mib(u.diskBytes)} / ${gib(k.diskBytes)} / ${gib(c.diskBytes)}</td>` +
      `<td>${Number(u.pids || 0)} / ${Number(k.pids || 0)} / ${Number(c.pids || 0)}</td></tr>`;
  }).join("");
}

function renderSandboxes(list, stats) {
  const byId = {};
  for (const s of stats.sandboxes || []) byId[s.id] = s;
  const rows = (list.sandboxes || []).map((sb) => {
    const st = byId[sb.id] || {}, cur = st.current || {};
    const labels = Object.entries(sb.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    return { sb, cur, labels, text: [sb.id, sb.backend, sb.image, stateName(sb.state), labels].join(" ").toLowerCase() };
  });
  const words = filterText.toLowerCase().split(/\s+/).filter(Boolean);
  $("sandboxes").tBodies[0].innerHTML = rows.filter((r) => words.every((w) => r.text.includes(w))).map((r) =>
    `<tr data-id="${esc(r.sb.id)}"><td>${esc(r.sb.id)}</td><td>${esc(r.sb.backend)}</td><td>${esc(r.sb.image)}</td>` +
    `<td class="state-${esc(stateName(r.sb.state))}">${esc(stateName(r.sb.state))}</td>` +
    `<td>${Number(r.cur.cpuPercent || 0).toFixed(1)}</td><td>${mib(r.cur.memoryBytes)}</td><td>${mib(r.cur.diskBytes)}</td>` +
    `<td>${Number(r.cur.pids || 0)}</td><td>${esc(r.labels)}</td></tr>`).join("");
}

async function renderDetail() {
  if (!selected) return;
  const res = await rpc("ObserveService/Stats", { ids: [selected], history: true });
  const st = (res.sandboxes || [])[0];
  if (!st) return;
  $("detail-id").textContent = st.id;
  for (const c of [charts.cpu, charts.mem]) { c.destroy(); c.keys = []; c.times = []; c.values = {}; }
  for (const h of st.history || []) {
    const t = Date.parse(h.time) / 1000;
    charts.cpu.push(t, { "cpu %": Number(h.cpuPercent || 0) });
    charts.mem.push(t, { memory: Number(h.memoryBytes || 0) / 1048576, limit: Number(st.memoryLimitBytes || 0) / 1048576 });
  }
  $("execs").tBodies[0].innerHTML = (st.recentExecs || []).slice().reverse().map((x) =>
    `<tr><td>${esc(new Date(x.startedAt).toLocaleTimeString())}</td><td>${esc((x.argv || []).join(" "))}</td>` +
    `<td>${x.timedOut ? "timed out" : x.oomKilled ? "OOM" : Number(x.exitCode || 0)}</td><td>${esc(x.duration || "")}</td></tr>`).join("");
}

async function tick() {
  const t = Date.now() / 1000;
  try {
    const [ms, nodes, list, stats] = await Promise.all([
      metrics(), rpc("ObserveService/Nodes"), rpc("SandboxService/List", { pageSize: 1000 }), rpc("ObserveService/Stats"),
    ]);
    chartMetrics(t, ms);
    renderNodes(nodes);
    renderSandboxes(list, stats);
    await renderDetail();
    $("status").textContent = "live · " + new Date().toLocaleTimeString();
  } catch (e) {
    $("status").textContent = /HTTP 401/.test(e.message)
      ? "the node wants a token: open /ui/?token=YOUR_TOKEN"
      : "cannot reach the node: " + e.message;
  }
  setTimeout(tick, POLL_MS);
}

// followEvents reads the server-sent event stream with fetch (EventSource
// cannot send a bearer token), reconnecting from the last sequence seen.
async function followEvents() {
  let last = null;
  for (;;) {
    try {
      const q = last == null ? "?recent=50" : "?since=" + last;
      const r = await fetch("/ui/api/events" + q, { headers: headers({ Accept: "text/event-stream" }) });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, i);
          buf = buf.slice(i + 2);
          const data = chunk.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("");
          if (!data) continue;
          const e = JSON.parse(data);
          last = Number(e.seq);
          addEvent(e);
        }
      }
    } catch (e) {
      // The daemon restarted or the network blinked: retry shortly.
    }
    await new Promise((ok) => setTimeout(ok, 2000));
  }
}

function addEvent(e) {
  const li = document.createElement("li");
  li.value = Number(e.seq);
  const figs = Object.entries(e.figures || {}).map(([k, v]) => `${k}=${v}`).join(" ");
  li.textContent = `${new Date(e.time).toLocaleTimeString()} ${e.type} ${e.sandboxId} ${e.reason || ""} ${figs}`;
  const ol = $("events");
  ol.prepend(li);
  while (ol.children.length > 200) ol.lastChild.remove();
}

$("filter").addEventListener("input", (ev) => { filterText = ev.target.value; });
$("sandboxes").addEventListener("click", (ev) => {
  const tr = ev.target.closest("tr[data-id]");
  if (!tr) return;
  selected = tr.dataset.id;
  $("detail").hidden = false;
  renderDetail().catch(() => {});
});
$("detail-close").addEventListener("click", () => { selected = null; $("detail").hidden = true; });

tick();
followEvents();
