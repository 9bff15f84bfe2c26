// edgewatch web UI: plain JavaScript and SVG, no framework, nothing loaded from outside.
// It only reads the JSON API (/api/v1/...). Every chart of the overview shares one time axis;
// hovering any chart shows the values of every chart at that time.
'use strict';

const RANGES = {
  '15m': { s: 900, step: '10s', stepS: 10, live: 5000 },
  '1h': { s: 3600, step: '1m', stepS: 60, live: 10000 },
  '24h': { s: 86400, step: '5m', stepS: 300 },
  '7d': { s: 604800, step: '1h', stepS: 3600 },
  '30d': { s: 2592000, step: '1h', stepS: 3600 },
};
const C = { p50: '#3fb37f', p95: '#e0a526', p99: '#ef5350', g50: '#4da3ff', g99: '#9cc9ff' };
const PALETTE = ['#4da3ff', '#ef5350', '#3fb37f', '#e0a526', '#b388ff', '#26c6da', '#ff8a65', '#d4e157', '#f06292', '#90a4ae'];

// Overview panels below inference: [section, id, title, unit, queries, options].
// A query is {m, f, n (series name prefix), agg, by (tag naming the series), g (group_by)}.
const PANELS = [
  ['GPU', 'gpu_util', 'GPU utilization', '%', [{ m: 'gpu', f: 'util_gpu_pct' }, { m: 'jetson_gpu', f: 'load_pct', n: 'GR3D', g: '' }], { max: 100 }],
  ['GPU', 'gpu_throttle', 'GPU throttle reasons', '', [
    { m: 'gpu', f: 'throttle_hw_thermal', n: 'hw thermal', agg: 'max' },
    { m: 'gpu', f: 'throttle_sw_thermal', n: 'sw thermal', agg: 'max' },
    { m: 'gpu', f: 'throttle_power_cap', n: 'power cap', agg: 'max' },
    { m: 'gpu', f: 'throttle_hw_slowdown', n: 'hw slowdown', agg: 'max' },
    { m: 'jetson_throttle', f: 'throttled', n: 'Jetson throttled', agg: 'max', g: '' },
  ], { flags: true }],
  ['GPU', 'gpu_temp', 'GPU temperature', '°C', [{ m: 'gpu', f: 'temp_c' }], {}],
  ['GPU', 'gpu_clock', 'GPU clocks', 'MHz', [{ m: 'gpu', f: 'clock_sm_mhz', n: 'SM' }, { m: 'gpu', f: 'clock_graphics_mhz', n: 'graphics' }, { m: 'jetson_gpu', f: 'freq_mhz', n: 'GR3D', g: '' }], {}],
  ['GPU', 'gpu_power', 'GPU power', 'W', [{ m: 'gpu', f: 'power_w' }], {}],
  ['GPU', 'gpu_mem', 'GPU memory used', 'MB', [{ m: 'gpu', f: 'mem_used_mb' }], {}],
  // jetson_* points carry the identity tags (power_mode, jetson_clocks, ...): group them away.
  ['Jetson', 'j_power', 'Power rails', 'mW', [{ m: 'jetson_power', f: 'current_mw', by: 'rail', g: 'rail' }], {}],
  ['Jetson', 'j_temp', 'SoC temperatures', '°C', [{ m: 'jetson_temp', f: 'temp_c', by: 'zone', g: 'zone' }], {}],
  ['Jetson', 'j_emc', 'Memory controller (EMC) load', '%', [{ m: 'jetson_emc', f: 'load_pct', n: 'EMC', g: '' }], { max: 100 }],
  ['Jetson', 'j_clocks', 'Clocks against their cap', 'MHz', [
    { m: 'jetson_throttle', f: 'gpu_freq_mhz', n: 'GPU', g: '' },
    { m: 'jetson_throttle', f: 'gpu_max_mhz', n: 'GPU cap', agg: 'min', g: '' },
    { m: 'jetson_throttle', f: 'cpu_freq_mhz', n: 'CPU', g: '' },
    { m: 'jetson_throttle', f: 'cpu_max_mhz', n: 'CPU cap', agg: 'min', g: '' },
  ], {}],
  ['Jetson', 'j_proc', 'GPU memory per process (nvmap)', 'MB', [{ m: 'jetson_process', f: 'gpu_mem_mb', by: 'process', g: 'process' }], {}],
  ['Jetson', 'j_engine', 'Engines load', '%', [{ m: 'jetson_engine', f: 'load_pct', by: 'engine', g: 'engine' }], { max: 100 }],
  ['Thermal', 'thermal', 'Thermal zones', '°C', [{ m: 'thermal', f: 'temp_c', by: 'zone' }], {}],
  ['Host', 'cpu', 'Host CPU', '%', [{ m: 'host', f: 'cpu_pct', n: 'CPU' }], { max: 100 }],
  ['Host', 'mem', 'Host memory used', '%', [{ m: 'host', f: 'mem_used_pct', n: 'memory' }, { m: 'jetson_mem', f: 'ram_used_pct', n: 'RAM', g: '' }], { max: 100 }],
  ['Host', 'load', 'Load average', '', [{ m: 'host', f: 'load1', n: 'load1' }], {}],
];

const S = { range: '1h', tab: 'overview', fields: null, fieldsAt: 0, list: { rows: [], next: null, total: 0, q: '', gen: 0 }, status: null, charts: [], hover: null, gen: 0, timer: null, picked: null, stored: false };

const $ = (s) => document.querySelector(s);
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'style') setStyle(e, v); // CSSOM: the CSP allows no inline style attributes
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids.flat()) if (k != null) e.append(k.nodeType ? k : String(k));
  return e;
}
function setStyle(e, css) {
  for (const decl of css.split(';')) {
    const i = decl.indexOf(':');
    if (i > 0) e.style.setProperty(decl.slice(0, i).trim(), decl.slice(i + 1).trim());
  }
}
function sv(tag, attrs) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
// A read the user asked for (a page, tab or range opened) sees every point written before it:
// the agent first takes what is queued before the read. A refresh on a timer (`S.stored`, or
// `stored`) does not wait for that (`X-Edgewatch-Read: stored`): its queries still include the
// points the agent holds for its next commit. Neither costs the device a commit, except the
// status of a read of the latest (its counters are of committed points).
function apiHeaders(stored) {
  return stored ? { Accept: 'application/json', 'X-Edgewatch-Read': 'stored' } : { Accept: 'application/json' };
}
async function getJSON(url, stored = S.stored) {
  const r = await fetch(url, { headers: apiHeaders(stored) });
  if (!r.ok) throw new Error(url + ': HTTP ' + r.status);
  return r.json();
}
function num(v, unit) {
  if (v == null || !isFinite(v)) return '–';
  const a = Math.abs(v);
  const s = a >= 1000 ? v.toFixed(0) : a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toPrecision(2);
  return unit ? s + (unit === '%' || unit === '°C' ? '' : ' ') + unit : s;
}
function bytes(b) {
  if (b == null) return '–';
  const u = ['B', 'KB', 'MB', 'GB', 'TB']; let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function dur(s) {
  if (s == null) return 'forever';
  if (s >= 86400) return +(s / 86400).toFixed(1) + ' d';
  if (s >= 3600) return +(s / 3600).toFixed(1) + ' h';
  if (s >= 60) return +(s / 60).toFixed(1) + ' min';
  return +(+s).toFixed(1) + ' s';
}
const pad = (n) => String(n).padStart(2, '0');
function clock(ms, long) {
  const d = new Date(ms);
  const hm = pad(d.getHours()) + ':' + pad(d.getMinutes());
  if (RANGES[S.range].s > 86400) return pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + (long ? ' ' + hm : '');
  return long && RANGES[S.range].s <= 3600 ? hm + ':' + pad(d.getSeconds()) : hm;
}
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// ---- charts -------------------------------------------------------------------------------

const H = 130, ML = 46, MR = 10, MT = 6, MB = 18;

// One chart: {id, title, unit, lines: [{name, color, dash, pts: [[ms, v]]}], flags, max, big}.
function Chart(o) {
  const legend = el('div', { class: 'legend' });
  const svg = sv('svg', { height: o.flags ? 16 * Math.max(1, o.lines.length) + MB + MT : H, 'data-chart': o.id });
  const head = el('h3', {}, o.title, o.unit ? el('span', { class: 'muted' }, o.unit) : null, o.big || null);
  const panel = el('div', { class: 'panel', id: 'chart-' + o.id }, head, legend, svg);
  const c = { o, panel, svg, legend };
  c.draw = () => drawChart(c);
  c.hover = (t) => hoverChart(c, t);
  return c;
}

function drawChart(c) {
  const { o, svg } = c;
  const W = svg.clientWidth || 440;
  const h = +svg.getAttribute('height');
  svg.setAttribute('viewBox', `0 0 ${W} ${h}`);
  svg.textContent = '';
  const [t0, t1] = S.domain;
  const pw = W - ML - MR, ph = h - MT - MB;
  const x = (t) => ML + ((t - t0) / (t1 - t0)) * pw;
  c.x = x; c.W = W; c.pw = pw;
  const g = sv('g', { class: 'grid' });
  svg.append(g);
  // x ticks
  const span = t1 - t0, stepsX = [60e3, 120e3, 300e3, 600e3, 900e3, 1800e3, 3600e3, 7200e3, 14400e3, 21600e3, 43200e3, 86400e3, 172800e3, 345600e3, 604800e3];
  const tick = stepsX.find((s) => span / s <= Math.max(3, pw / 90)) || 604800e3;
  const off = new Date(t0).getTimezoneOffset() * 60e3;
  for (let t = Math.ceil((t0 - off) / tick) * tick + off; t <= t1; t += tick) {
    g.append(sv('line', { x1: x(t), x2: x(t), y1: MT, y2: h - MB }));
    const tx = sv('text', { x: x(t), y: h - 4, 'text-anchor': 'middle' }); tx.textContent = clock(t); svg.append(tx);
  }
  if (o.flags) {
    o.lines.forEach((l, i) => {
      const y = MT + i * 16;
      const lab = sv('text', { x: ML - 4, y: y + 11, 'text-anchor': 'end' }); lab.textContent = l.name; svg.append(lab);
      g.append(sv('line', { x1: ML, x2: W - MR, y1: y + 15, y2: y + 15 }));
      const gr = sv('g', { 'data-series': l.name, 'data-points': l.pts.length });
      const wStep = Math.max(2, (RANGES[S.range].stepS * 1000 / span) * pw);
      for (const [t, v] of l.pts) if (v > 0) gr.append(sv('rect', { x: x(t), y: y + 2, width: wStep, height: 12, fill: C.p99, rx: 1 }));
      svg.append(gr);
    });
  } else {
    let max = 0, min = 0;
    for (const l of o.lines) for (const p of l.pts) { if (p[1] > max) max = p[1]; if (p[1] < min) min = p[1]; }
    max = o.max && max <= o.max ? o.max : niceMax(max);
    const y = (v) => MT + (1 - (v - min) / (max - min || 1)) * ph;
    for (let i = 0; i <= 4; i++) {
      const v = min + ((max - min) * i) / 4;
      g.append(sv('line', { x1: ML, x2: W - MR, y1: y(v), y2: y(v) }));
      const tx = sv('text', { x: ML - 4, y: y(v) + 3, 'text-anchor': 'end' }); tx.textContent = +v.toPrecision(3); svg.append(tx);
    }
    // Throttling, shaded on every chart so its overlap with a latency spike shows at once.
    for (const [a, b] of S.bands || []) {
      if (b < t0 || a > t1) continue;
      svg.append(sv('rect', { class: 'band', x: x(Math.max(a, t0)), y: MT, width: Math.max(2, x(Math.min(b, t1)) - x(Math.max(a, t0))), height: ph }));
    }
    const gap = RANGES[S.range].stepS * 1000 * 2.5;
    for (const l of o.lines) {
      let d = '', prev = null;
      const dots = [];
      l.pts.forEach((p, i) => {
        const lone = (prev == null || p[0] - prev > gap) && (i + 1 >= l.pts.length || l.pts[i + 1][0] - p[0] > gap);
        if (lone) dots.push(p);
        d += (prev == null || p[0] - prev > gap ? 'M' : 'L') + x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1);
        prev = p[0];
      });
      const path = sv('path', { d, fill: 'none', stroke: l.color, 'stroke-width': l.width || 1.6, 'data-series': l.name, 'data-points': l.pts.length, 'stroke-linejoin': 'round' });
      if (l.dash) path.setAttribute('stroke-dasharray', '4 3');
      svg.append(path);
      for (const p of dots) svg.append(sv('circle', { cx: x(p[0]), cy: y(p[1]), r: 2, fill: l.color }));
    }
  }
  // The device's events, on every chart's timeline.
  drawEvents(svg, x, t0, t1, h);
  c.xh = sv('line', { class: 'xh', y1: MT, y2: h - MB, visibility: 'hidden' });
  svg.append(c.xh);
  svg.onmousemove = (e) => {
    const r = svg.getBoundingClientRect();
    const px = ((e.clientX - r.left) / r.width) * W;
    if (px < ML || px > W - MR) return setHover(null);
    setHover(t0 + ((px - ML) / pw) * (t1 - t0), c, e);
  };
  svg.onmouseleave = () => setHover(null);
  hoverChart(c, S.hover);
}

function valueAt(pts, t) {
  if (!pts.length) return null;
  if (t == null) return pts[pts.length - 1];
  let best = null;
  for (const p of pts) if (best == null || Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p;
  return Math.abs(best[0] - t) <= RANGES[S.range].stepS * 1000 * 1.5 ? best : null;
}

function hoverChart(c, t) {
  if (c.xh) {
    if (t == null) c.xh.setAttribute('visibility', 'hidden');
    else { c.xh.setAttribute('x1', c.x(t)); c.xh.setAttribute('x2', c.x(t)); c.xh.setAttribute('visibility', 'visible'); }
  }
  c.legend.textContent = '';
  for (const l of c.o.lines) {
    const p = valueAt(l.pts, t);
    const v = c.o.flags ? (p ? (p[1] > 0 ? 'yes' : 'no') : '–') : num(p && p[1], c.o.unit);
    c.legend.append(el('span', {}, el('i', { style: `background:${l.color}` }), l.name + ' ', el('b', {}, v)));
  }
}

function setHover(t, chart, e) {
  S.hover = t;
  for (const c of S.charts) c.hover(t);
  const tip = $('#tip');
  if (t == null || !chart) { tip.hidden = true; return; }
  tip.textContent = '';
  tip.append(el('div', { class: 'muted' }, clock(t, true)));
  const near = RANGES[S.range].stepS * 1000;
  for (const ev of markedEvents()) {
    if (Math.abs(ev.t - t) <= near) tip.append(el('div', { class: 'ev-tip ' + (ev.severity === 'critical' ? 'bad' : ev.severity === 'warning' ? 'warn' : 'muted') }, `⚑ ${clock(ev.t, true)} ${ev.kind}: ${ev.message}`));
  }
  for (const l of chart.o.lines) {
    const p = valueAt(l.pts, t);
    if (p) tip.append(el('div', {}, el('span', { style: `color:${l.color}` }, '■ '), l.name + ': ', el('b', {}, chart.o.flags ? (p[1] > 0 ? 'yes' : 'no') : num(p[1], chart.o.unit))));
  }
  tip.hidden = false;
  tip.style.left = Math.min(e.clientX + 14, innerWidth - tip.offsetWidth - 8) + 'px';
  tip.style.top = e.clientY + 14 + 'px';
}

// ---- overview -------------------------------------------------------------------------------

const ms = (ns) => ns / 1e6;
function seriesName(q, tags, many) {
  const t = tags || {};
  const by = q.by ? t[q.by] : ['gpu', 'zone', 'rail', 'engine', 'core'].map((k) => t[k] != null && (k === 'gpu' ? 'GPU ' + t[k] : t[k])).find(Boolean);
  return q.n && (by == null || !many) ? q.n : [q.n, by].filter((v) => v != null && v !== '').join(' ') || q.m;
}

async function pool(jobs, n) {
  const out = new Array(jobs.length);
  let i = 0;
  await Promise.all(Array.from({ length: Math.min(n, jobs.length) }, async () => {
    while (i < jobs.length) { const k = i++; try { out[k] = await jobs[k](); } catch (err) { out[k] = null; } }
  }));
  return out;
}

// Which measurement/field pairs exist (not every series: there may be 100,000 of them).
async function refreshFields() {
  if (Date.now() - S.fieldsAt < 60000 && S.fields) return;
  S.fields = new Set(((await getJSON('/api/v1/fields')).fields || []).map((f) => f.measurement + '/' + f.field));
  S.fieldsAt = Date.now();
}

async function loadOverview() {
  const gen = ++S.gen;
  const R = RANGES[S.range];
  const q = `from=-${S.range}&step=${R.step}`;
  const [inf, status] = await Promise.all([getJSON(`/api/v1/inference?${q}`), getJSON('/api/v1/status'), refreshFields()]);
  const have = S.fields;
  const jobs = [], where = [];
  PANELS.forEach((p, pi) => p[4].forEach((qq) => {
    if (!have.has(qq.m + '/' + qq.f)) return;
    const g = qq.g != null ? `&group_by=${encodeURIComponent(qq.g)}` : '';
    jobs.push(() => getJSON(`/api/v1/query?measurement=${encodeURIComponent(qq.m)}&field=${encodeURIComponent(qq.f)}&${q}&agg=${qq.agg || 'mean'}${g}`));
    where.push([pi, qq]);
  }));
  // Agent (re)starts in the range: one point each (measurement edgewatch_event).
  const starts = have.has('edgewatch_event/pid')
    ? getJSON(`/api/v1/query?measurement=edgewatch_event&tag.kind=start&field=pid&from=-${S.range}`)
      .then((r) => (r.series || []).flatMap((x) => x.points.map((p) => ms(p[0]))).sort((a, b) => a - b))
      .catch(() => [])
    : Promise.resolve([]);
  // The device's events (Xid errors, OOM kills, restarts, ...): each point's `message` field
  // with its kind, severity and source tags; drawn on every chart's timeline.
  const eventsP = [...have].some((k) => k.startsWith('edgewatch_event/'))
    ? getJSON(`/api/v1/query?measurement=edgewatch_event&field=message&from=-${S.range}&limit=2000`)
      .then(eventList).catch(() => [])
    : Promise.resolve([]);
  // LLM serving signals, when an app or a scrape preset wrote `llm` points.
  const llmP = [...have].some((k) => k.startsWith('llm/'))
    ? getJSON(`/api/v1/llm?${q}`).catch(() => null) : Promise.resolve(null);
  const res = await pool(jobs, 4);
  S.starts = await starts;
  S.events = await eventsP;
  const llm = await llmP;
  if (gen !== S.gen) return;
  S.status = status;
  const to = ms(inf.to || Date.now() * 1e6);
  S.domain = [to - R.s * 1000, to];
  renderOverview(inf, res, where, status, llm);
  renderMeta(status);
}

function renderMeta(st) {
  $('#meta').textContent = st ? `v${st.version} · up ${dur(st.uptime_s)} · ${st.ingest.points_written} points` : '';
  // A device clock that is not set explains an idle forwarder and missing rollups.
  const c = st && st.clock;
  const banner = $('#banner');
  let text = '';
  if (c && c.set === false) {
    text = `The device clock is not set yet (it reads earlier than ${new Date(c.min_valid_ns / 1e6).toISOString().slice(0, 10)}): ` +
      'data is stored, but rollup and forwarding wait until NTP sets it; the times of what is written meanwhile are corrected then.';
  } else if (c && c.held_from_chunk_id != null) {
    text = 'The device clock was just set: correcting the times of the points written before; rollup and forwarding resume in a few seconds.';
  }
  banner.textContent = text;
  banner.hidden = !text;
}

function renderOverview(inf, res, where, status, llm) {
  const secs = $('#sections');
  secs.textContent = '';
  S.charts = [];
  // Worst tail first: the model the engineer is looking for.
  const models = (inf.models || []).filter((m) => m.steps && m.steps.length)
    .sort((a, b) => (b.summary.p99_p50 || 0) - (a.summary.p99_p50 || 0));
  const add = (grid, c) => { grid.append(c.panel); S.charts.push(c); };

  // Inference: what the engineer came for (an LLM-only device shows its LLM section alone).
  const llmOnly = !models.length && llm && (llm.models || []).length;
  if (!llmOnly) secs.append(el('h2', {}, 'Inference'));
  if (!models.length) {
    if (!llmOnly) secs.append(el('div', { class: 'empty', id: 'empty-inference' },
      el('p', {}, 'No inference data yet in this range. Report each request’s latency to the agent (InfluxDB line protocol, HTTP or UDP):'),
      el('pre', {}, `curl -XPOST 'http://${location.host}/write' --data-binary 'inference,model=yolov8n wall_ms=41.2,gpu_ms=30.5,batch_size=1i'\n` +
        `echo 'inference,model=yolov8n wall_ms=41.2,gpu_ms=30.5' | nc -u -w0 127.0.0.1 8089`),
      el('p', {}, 'wall_ms is the time the caller waited, gpu_ms the time the GPU computed (CUDA events); tags model, model_version, app.')));
  } else {
    const cards = el('div', { class: 'cards' });
    for (const m of models) {
      const s = m.summary;
      const ratio = s.p99_p50;
      const tri = m.source === 'triton';
      // Triton without latency summaries has means only: show the mean, never a made-up p99.
      const big = s.wall_ms.p99 != null || !tri ? ['p99', s.wall_ms.p99] : ['mean', s.wall_ms.mean];
      cards.append(el('div', { class: 'card', 'data-model': m.model, 'data-source': m.source || 'app' },
        el('div', { class: 's' }, m.model, tri ? el('span', { class: 'badge triton', title: `Triton Inference Server (scrape ${m.scrape}), model version ${m.version}` }, 'Triton') : null, ` · ${big[0]} wall`),
        el('div', { class: 'v ' + (ratio >= 3 ? 'bad' : ratio >= 2 ? 'warn' : 'good') }, num(big[1], 'ms')),
        el('div', { class: 's' }, tri && s.wall_ms.p50 == null ? `mean GPU ${num(s.gpu_ms.mean, 'ms')} · queue ${num(s.queue_ms, 'ms')} · no percentiles (Triton summaries off)`
          : `p50 ${num(s.wall_ms.p50, 'ms')} · p95 ${num(s.wall_ms.p95, 'ms')} · P99/P50 ${num(ratio)}×`),
        el('div', { class: 's' }, `${num(s.throughput_per_s)} req/s · GPU ${s.gpu_share == null ? '–' : Math.round(s.gpu_share * 100) + '%'} of wall · overhead ${num(s.overhead_ms, 'ms')}` +
          (tri ? ` · ${s.failures} failed` : '')),
        tri ? el('div', { class: 's energy muted', title: 'energy is attributed to app-reported models only' }, 'energy: not attributed (Triton)') : energyLine(s, inf.energy)));
    }
    secs.append(cards);
    const grid = el('div', { class: 'grid' });
    secs.append(grid);
    for (const m of models) {
      const pick = (f, k) => m.steps.filter((s) => s[f] && s[f][k] != null).map((s) => [ms(s.t), s[f][k]]);
      const tri = m.source === 'triton';
      add(grid, Chart({
        id: 'latency-' + chartKey(m), title: `${label(m)} latency`, unit: 'ms',
        big: el('span', { class: 'big ' + (m.summary.p99_p50 >= 3 ? 'bad' : '') }, tri && m.summary.wall_ms.p99 == null ? 'mean ' + num(m.summary.wall_ms.mean, 'ms') : 'p99 ' + num(m.summary.wall_ms.p99, 'ms')),
        lines: [
          { name: 'p99', color: C.p99, pts: pick('wall_ms', 'p99'), width: 2 },
          { name: 'p95', color: C.p95, pts: pick('wall_ms', 'p95') },
          { name: 'p50', color: C.p50, pts: pick('wall_ms', 'p50') },
          { name: 'GPU p99', color: C.g99, dash: 1, pts: pick('gpu_ms', 'p99') },
          { name: 'GPU p50', color: C.g50, dash: 1, pts: pick('gpu_ms', 'p50') },
          // Triton reports per-request means; apps' percentiles already say more.
          ...(tri ? [{ name: 'mean', color: '#b388ff', pts: pick('wall_ms', 'mean') }, { name: 'GPU mean', color: C.g50, dash: 1, pts: pick('gpu_ms', 'mean') }] : []),
        ].filter((l) => l.pts.length),
      }));
    }
    const per = (k) => models.map((m, i) => ({ name: label(m), color: PALETTE[i % PALETTE.length], pts: m.steps.filter((s) => s[k] != null).map((s) => [ms(s.t), s[k]]) }));
    add(grid, Chart({ id: 'ratio', title: 'P99 / P50 (tail)', unit: '×', lines: per('p99_p50') }));
    add(grid, Chart({ id: 'throughput', title: 'Throughput', unit: 'req/s', lines: per('throughput_per_s') }));
    const energy = per('energy_mj_per_inference').filter((l) => l.pts.length);
    if (energy.length) add(grid, Chart({ id: 'energy', title: 'Energy per inference' + (inf.energy && inf.energy.lower_bound ? ' (lower bound)' : ''), unit: 'mJ', lines: energy }));
  }
  renderLlm(secs, llm, add);

  // GPU, Jetson, thermal, host: only panels with data.
  const built = {};
  res.forEach((r, i) => {
    if (!r || !r.series) return;
    const [pi, q] = where[i];
    const b = (built[pi] = built[pi] || []);
    for (const s of r.series) if (s.points.length) b.push({ q, s, many: r.series.length > 1 });
  });
  const sections = {};
  PANELS.forEach((p, pi) => {
    const [sec, id, title, unit, , opt] = p;
    const sl = built[pi];
    if (!sl || !sl.length) return;
    const lines = sl.map((x, i) => ({ name: seriesName(x.q, x.s.tags, x.many), color: PALETTE[i % PALETTE.length], pts: x.s.points.map((pt) => [ms(pt[0]), pt[1]]) }));
    (sections[sec] = sections[sec] || []).push(Chart({ id, title, unit, lines, flags: opt.flags, max: opt.max }));
  });
  const jet = status.collectors.jetson;
  for (const sec of ['GPU', 'Jetson', 'Thermal', 'Host']) {
    const list = sections[sec];
    const jetsonOn = sec === 'Jetson' && jet && jet.state === 'running';
    if (!list && sec !== 'GPU' && !jetsonOn) continue;
    secs.append(el('h2', {}, sec));
    if (jetsonOn) secs.append(el('div', { class: 'muted', id: 'jetson-id' }, jetsonLine(jet)));
    if (!list && sec === 'Jetson') continue;
    if (!list) {
      const { nvml, tegrastats } = status.collectors;
      const nv = nvml.state;
      const tg = tegrastats.state + (tegrastats.detail ? ` (${tegrastats.detail})` : '');
      secs.append(el('div', { class: 'empty', id: 'empty-gpu' }, `No GPU found: no gpu (NVML) or jetson_gpu (tegrastats) data in this range. NVML collector: ${nv}. tegrastats collector: ${tg}. On a Jetson, check [tegrastats] path; on x86, the NVIDIA driver.`));
      continue;
    }
    const grid = el('div', { class: 'grid' });
    secs.append(grid);
    for (const c of list) add(grid, c);
  }
  S.bands = throttleBands(sections);
  for (const c of S.charts) c.draw();
  renderFindings(models, sections, S.starts || []);
}

// The Jetson's identity and state (collectors.jetson): what every jetson_* point is tagged with.
function jetsonLine(j) {
  const mode = j.power_mode != null ? j.power_mode + (j.power_mode_id != null ? ` (id ${j.power_mode_id})` : '') : (j.power_mode_id != null ? `id ${j.power_mode_id}` : '?');
  const thr = j.throttled ? 'throttled now' : (j.last_throttled_ns != null ? `last throttled at ${clock(j.last_throttled_ns / 1e6, true)}` : 'not throttled since start');
  return [j.module || 'Jetson', `L4T ${j.l4t || '?'}` + (j.jetpack ? ` (JetPack ${j.jetpack})` : ''), `power mode ${mode}`,
    `jetson_clocks ${j.jetson_clocks || '?'}`, thr].concat(j.gpu_source ? [`GPU ${j.gpu_source}`] : []).join(' · ');
}

// A model's name in charts and findings: app-reported ones by name, Triton's marked.
function label(m) {
  return m.source === 'triton' ? `${m.model} (Triton v${m.version})` : m.model;
}
// A model's chart id: its name, or for Triton its name, version and scrape target.
function chartKey(m) {
  return m.source === 'triton' ? `triton-${m.model}-${m.version}-${m.scrape}` : m.model;
}

// The card's energy line: board (and GPU rail) millijoules per inference, inferences per
// joule and the power source; or why there is none (never a made-up number).
function energyLine(s, e) {
  const src = e && e.source ? ` · ${e.source}${e.lower_bound ? ' (lower bound)' : ''}` : '';
  if (s.energy_mj_per_inference == null) {
    return el('div', { class: 's energy muted', title: (e && e.reason) || 'power samples cover less than 50% of the steps with inferences' }, 'energy: no power data' + src);
  }
  const gpu = s.gpu_energy_mj_per_inference == null ? '' : ` (GPU ${num(s.gpu_energy_mj_per_inference, 'mJ')})`;
  return el('div', { class: 's energy' }, `${num(s.energy_mj_per_inference, 'mJ')}/inference${gpu} · ${num(s.inferences_per_joule)} inf/J${src}`);
}

// The events of a raw `edgewatch_event` `message` query, oldest first: `{t (ms), kind,
// severity, source, message}` (the kind from `kind`, or `event` on points stored before it).
function eventList(r) {
  return (r.series || []).flatMap((x) => {
    const t = x.tags || {};
    return x.points.map((p) => ({ t: ms(p[0]), kind: t.kind || t.event || '?', severity: t.severity || 'info', source: t.source || '', message: String(p[1]) }));
  }).sort((a, b) => a.t - b.t);
}

// What the timelines mark: warning and critical events, and agent starts.
function markedEvents() {
  const ev = (S.events || []).filter((e) => e.severity === 'warning' || e.severity === 'critical' || e.kind === 'start');
  // Starts stored without a message still come from the `pid` query.
  for (const t of S.starts || []) if (!ev.some((e) => e.kind === 'start' && Math.abs(e.t - t) < 1)) ev.push({ t, kind: 'start', severity: 'info', source: 'agent', message: 'edgewatch agent started' });
  return ev.sort((a, b) => a.t - b.t);
}

// One marker per event on a chart: a line across the plot and a triangle above it, red for
// critical, amber for warning, grey for an agent start; its message as the title.
function drawEvents(svg, x, t0, t1, h) {
  for (const e of markedEvents()) {
    if (e.t < t0 || e.t > t1) continue;
    const cx = x(e.t);
    const g = sv('g', { class: 'ev ev-' + (e.kind === 'start' && e.severity === 'info' ? 'start' : e.severity), 'data-kind': e.kind, 'data-severity': e.severity, 'data-t': e.t });
    const title = sv('title', {});
    title.textContent = `${clock(e.t, true)} · ${e.kind} (${e.severity}${e.source ? ', ' + e.source : ''}): ${e.message}`;
    g.append(title, sv('line', { x1: cx, x2: cx, y1: MT, y2: h - MB }), sv('path', { d: `M${(cx - 5).toFixed(1)},0L${(cx + 5).toFixed(1)},0L${cx.toFixed(1)},${MT + 4}Z` }));
    svg.append(g);
  }
}

// Time intervals in which any throttle reason was active.
function throttleBands(sections) {
  const c = (sections.GPU || []).find((x) => x.o.id === 'gpu_throttle');
  if (!c) return [];
  const step = RANGES[S.range].stepS * 1000;
  const on = [...new Set(c.o.lines.flatMap((l) => l.pts.filter((p) => p[1] > 0).map((p) => p[0])))].sort((a, b) => a - b);
  const bands = [];
  for (const t of on) {
    const last = bands[bands.length - 1];
    if (last && t - last[1] <= step * 1.5) last[1] = t + step; else bands.push([t, t + step]);
  }
  return bands;
}

// The answer to "is inference slow, and why" in a few lines.
function renderFindings(models, sections, starts) {
  const out = [];
  const find = (id) => Object.values(sections).flat().find((c) => c.o.id === id);
  const throttle = find('gpu_throttle');
  const throttled = [];
  if (throttle) for (const l of throttle.o.lines) { const on = l.pts.filter((p) => p[1] > 0); if (on.length) throttled.push([l.name, on]); }
  for (const m of models) {
    const steps = m.steps.filter((s) => s.wall_ms.p99 != null);
    if (!steps.length) continue;
    const p99s = steps.map((s) => s.wall_ms.p99).sort((a, b) => a - b);
    const med = p99s[Math.floor(p99s.length / 2)];
    const peak = steps.reduce((a, b) => (b.wall_ms.p99 > a.wall_ms.p99 ? b : a));
    const r = m.summary.p99_p50;
    if (peak.wall_ms.p99 > 1.8 * med) {
      const tp = ms(peak.t);
      const cause = throttled.filter(([, on]) => on.some((p) => Math.abs(p[0] - tp) <= RANGES[S.range].stepS * 1500)).map(([n]) => n);
      out.push(['bad', `${label(m)}: p99 peaked at ${num(peak.wall_ms.p99, 'ms')} at ${clock(tp, true)} (typical ${num(med, 'ms')})` +
        (cause.length ? ` — while the GPU was throttled (${cause.join(', ')})` : '')]);
    } else if (r >= 3) out.push(['bad', `${label(m)}: long tail, p99 is ${num(r)}× p50`]);
    const share = m.summary.gpu_share;
    if (share != null && share < 0.6) out.push(['warn', `${label(m)}: the GPU computes only ${Math.round(share * 100)}% of wall time; the rest is queueing, copies or CPU work`]);
  }
  // A restart explains a gap, a warm-up or a latency step: say when it happened.
  if (starts.length) {
    const when = starts.slice(-3).map((t) => clock(t, true)).join(', ');
    out.push(['warn', starts.length === 1 ? `edgewatch agent started at ${when}`
      : `edgewatch agent started ${starts.length}× in this range (${starts.length > 3 ? 'last: ' : ''}${when})`]);
  }
  for (const [n, on] of throttled) out.push(['bad', `GPU throttled (${n}) in ${on.length} step${on.length > 1 ? 's' : ''}, first at ${clock(on[0][0], true)}`]);
  const peakOf = (id, lim, what, unit) => {
    const c = find(id);
    if (!c) return;
    for (const l of c.o.lines) { const mx = Math.max(...l.pts.map((p) => p[1])); if (mx >= lim) out.push(['warn', `${what} ${l.name} reached ${num(mx, unit)}`]); }
  };
  peakOf('gpu_temp', 80, 'GPU temperature', '°C');
  peakOf('gpu_util', 97, 'GPU utilization', '%');
  peakOf('cpu', 90, 'Host CPU', '%');
  peakOf('mem', 90, 'Memory', '%');
  if (!out.length && models.length) out.push(['ok', 'No latency spike, throttling or saturation in this range.']);
  const box = $('#findings');
  box.textContent = '';
  box.className = 'findings';
  for (const [k, t] of out) box.append(el('div', { class: 'find ' + k }, t));
}

// ---- series browser -------------------------------------------------------------------------

function seriesKey(s) {
  return s.measurement + Object.entries(s.tags).map(([k, v]) => `,${k}=${v}`).join('') + ' ' + s.field;
}
// The agent filters and pages the listing: the page holds one page of rows at a time.
const PAGE = 200;
async function loadSeries() {
  await fetchSeries(false);
  if (S.picked) await plotSeries(S.picked);
}
// The first page for the filter in the box, or (more) the next page, appended.
async function fetchSeries(more) {
  const L = S.list;
  const q = $('#search').value.trim();
  const gen = ++L.gen;
  const cursor = more && L.next ? `&cursor=${encodeURIComponent(L.next)}` : '';
  const r = await getJSON(`/api/v1/series?limit=${PAGE}${q ? '&match=' + encodeURIComponent(q) : ''}${cursor}`);
  if (gen !== L.gen) return; // a newer filter was typed meanwhile
  if (!more) Object.assign(L, { rows: [], total: r.total ?? 0, q });
  L.rows = L.rows.concat(r.series || []);
  L.next = r.next || null;
  renderSeriesList();
}
function renderSeriesList() {
  const L = S.list;
  $('#series-count').textContent = `${L.rows.length} of ${L.total} series${L.q ? ' matching' : ''}`;
  const tb = el('tbody');
  for (const s of L.rows) {
    tb.append(el('tr', { onclick: () => plotSeries(s) },
      el('td', {}, s.measurement), el('td', {}, Object.entries(s.tags).map(([k, v]) => `${k}=${v}`).join(', ')), el('td', {}, s.field), el('td', { class: 'muted' }, s.type)));
  }
  const list = $('#series-list');
  list.textContent = '';
  list.append(el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'measurement'), el('th', {}, 'tags'), el('th', {}, 'field'), el('th', {}, 'type'))), tb));
  if (L.next) list.append(el('button', { id: 'series-more', onclick: () => fetchSeries(true).catch(() => {}) }, `${Math.min(PAGE, L.total - L.rows.length)} more (of ${L.total - L.rows.length}); or refine the filter`));
  if (!L.rows.length) list.append(el('div', { class: 'empty' }, L.q ? 'No series match.' : 'No series stored yet.'));
}
async function plotSeries(s) {
  S.picked = s;
  const R = RANGES[S.range];
  const tags = Object.entries(s.tags).map(([k, v]) => `&tag.${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join('');
  const base = `/api/v1/query?measurement=${encodeURIComponent(s.measurement)}&field=${encodeURIComponent(s.field)}${tags}&from=-${S.range}`;
  const box = $('#series-plot');
  if (s.type === 'string') {
    const r = await getJSON(base + '&limit=20');
    const pts = (r.series[0] || { points: [] }).points;
    box.textContent = '';
    box.append(el('div', { class: 'panel' }, el('h3', {}, seriesKey(s)), el('p', { class: 'muted' }, 'Text values are stored, not plotted. Latest:'),
      el('pre', {}, pts.slice(-20).map((p) => clock(ms(p[0]), true) + '  ' + p[1]).join('\n') || '–')));
    return;
  }
  const agg = $('#agg').value;
  const r = await getJSON(`${base}&step=${R.step}&agg=${agg}&group_by=`);
  S.domain = [ms(r.to) - R.s * 1000, ms(r.to)];
  const pts = (r.series[0] || { points: [] }).points.map((p) => [ms(p[0]), p[1]]);
  const c = Chart({ id: 'series', title: seriesKey(s), unit: `${agg} per ${R.step} · tier ${r.tier}`, lines: [{ name: agg, color: C.g50, pts }] });
  box.textContent = '';
  box.append(c.panel);
  S.charts = [c];
  c.draw();
}

// ---- forwarding and storage -----------------------------------------------------------------

function table(rows, cols) {
  return el('table', {}, el('thead', {}, el('tr', {}, cols.map((c) => el('th', {}, c[0])))),
    el('tbody', {}, rows.map((r) => el('tr', {}, cols.map((c) => { const v = c[1](r); return el('td', { class: typeof v === 'number' ? 'n' : '' }, v == null ? '–' : v); })))));
}

async function loadForwarding() {
  const st = await getJSON('/api/v1/status');
  S.status = st;
  renderMeta(st);
  const box = $('#forwarding');
  box.textContent = '';
  box.append(el('h2', {}, 'Forwarding'));
  const sinks = st.forward.sinks;
  const evicted = {};
  for (const s of st.rollup ? st.rollup.sinks : []) evicted[s.name] = s.evicted_unforwarded_points;
  if (!sinks.length) {
    box.append(el('div', { class: 'empty', id: 'empty-forwarding' }, 'No sinks configured: data stays on this device. Add a [[sink]] (InfluxDB or MQTT) to the config to ship it to the fleet.'));
    return;
  }
  box.append(el('div', { class: 'panel' }, table(sinks, [
    ['sink', (o) => o.name],
    ['kind', (o) => o.type],
    ['connection', (o) => (o.paused ? 'paused' : o.connected ? 'connected' : 'disconnected')],
    ['backlog (points)', (o) => o.backlog_points],
    ['oldest unsent', (o) => (o.oldest_unsent_age_s == null ? null : dur(o.oldest_unsent_age_s))],
    ['last error', (o) => o.last_error],
    ['dead letters', (o) => o.dead_letter_batches],
    ['evicted before sent', (o) => evicted[o.name]],
  ])));
}

// The write rate and how long the budget holds at it (`store.write`, null before data).
function storageRunway(w) {
  const card = el('div', { class: 'card', id: 'runway' }, el('div', { class: 's' }, 'offline runway'));
  if (!w) return (card.append(el('div', { class: 'v' }, '–'), el('div', { class: 's' }, 'nothing written yet')), card);
  card.append(el('div', { class: 'v' }, w.runway_s == null ? 'no budget' : dur(Math.round(w.runway_s))),
    el('div', { class: 's' }, `before eviction begins, writing ${Math.round(w.values_per_s)} values/s · ${bytes(w.bytes_per_s)}/s · ${w.bytes_per_value.toFixed(2)} B/value`));
  return card;
}

// What the agent has caused to be written to storage since it started (`/proc/self/io`):
// its wear on the device's flash, with the hourly rate once it has run a minute.
function diskWritten(st) {
  const b = st.disk_written_bytes;
  const rate = b != null && st.uptime_s >= 60 ? `${bytes((b * 3600) / st.uptime_s)}/h · ` : '';
  return el('div', { class: 'card', id: 'disk-written' }, el('div', { class: 's' }, 'written to storage'), el('div', { class: 'v' }, b == null ? '?' : bytes(b)),
    el('div', { class: 's' }, b == null ? 'not accounted by this kernel' : `${rate}since start: the agent's wear on the flash`));
}

async function loadStorage() {
  const st = await getJSON('/api/v1/status');
  S.status = st;
  renderMeta(st);
  const box = $('#storage');
  box.textContent = '';
  // `rollup` is null when the agent could not read its store.
  const ro = st.rollup || { tiers: [], evicted: null, budget: { max_bytes: 0 } };
  const b = ro.budget;
  const used = st.store.db_bytes;
  const pct = b.max_bytes ? Math.min(100, (used / b.max_bytes) * 100) : null;
  box.append(el('h2', {}, 'Storage'),
    el('div', { class: 'cards' },
      el('div', { class: 'card', id: 'db-size' }, el('div', { class: 's' }, 'database on disk'), el('div', { class: 'v' }, bytes(used)),
        el('div', { class: 'meter' }, el('div', { style: `width:${pct == null ? 0 : pct}%` })),
        el('div', { class: 's' }, b.max_bytes ? `${pct.toFixed(1)}% of the ${bytes(b.max_bytes)} budget` : 'no disk budget')),
      el('div', { class: 'card' }, el('div', { class: 's' }, 'series'), el('div', { class: 'v' }, st.store.series ?? '?'), el('div', { class: 's' }, `limit ${st.store.max_series}`)),
      el('div', { class: 'card' }, el('div', { class: 's' }, 'ingest'), el('div', { class: 'v' }, st.ingest.points_written),
        el('div', { class: 's' }, `rejected ${st.ingest.points_rejected} · dropped ${st.ingest.points_dropped} · queue ${st.ingest.queue_points}/${st.ingest.queue_capacity} · last commit ${num(st.ingest.last_commit_ms, 'ms')}`)),
      storageRunway(st.store.write),
      diskWritten(st)),
    el('h2', {}, 'Retention per tier'),
    el('div', { class: 'panel' }, table([{ name: 'raw', retention_s: ro.raw_retention_s, res: 'every point', raw: true }].concat(ro.tiers), [
      ['tier', (t) => t.name],
      ['resolution', (t) => t.res || dur(t.resolution_s)],
      ['kept for', (t) => dur(t.retention_s)],
      ['rows', (t) => t.rows],
      ['rollup lag', (t) => (t.raw ? null : t.lag_s == null ? 'not run yet' : dur(t.lag_s))],
      ['late points', (t) => t.late_points],
    ])),
    el('h2', {}, 'Evicted'),
    el('div', { class: 'panel' }, table(ro.evicted ? [['raw chunks', ro.evicted.raw_chunks], ['raw points', ro.evicted.raw_points]].concat(ro.tiers.map((t) => [`rows ${t.name}`, t.evicted_rows])) : [], [['what', (e) => e[0]], ['count', (e) => e[1]]])));
}

// ---- wiring ---------------------------------------------------------------------------------

// The range's period, or the agent's hold (`[ingest] flush_interval`) when that is longer: a
// refresh is a dozen queries, and on the reference workload a refresh every 10 s instead of
// 15 s took the agent from 0.96 % to 1.04 % of a core (docs/performance.md). Each refresh
// shows every point received before it, held ones included.
function livePeriod(R) {
  const hold = (S.status && S.status.ingest && S.status.ingest.hold_ms) || 0;
  return Math.max(R.live, hold);
}

async function load(live) {
  clearTimeout(S.timer);
  const R = RANGES[S.range];
  S.stored = !!live;
  try {
    if (S.tab === 'overview') await loadOverview();
    else if (S.tab === 'series') await loadSeries();
    else if (S.tab === 'forwarding') await loadForwarding();
    else if (S.tab === 'alerts') await loadAlerts(); // alerts.js
    else await loadStorage();
    $('#live').textContent = R.live && S.tab === 'overview' ? `live · every ${livePeriod(R) / 1000} s` : '';
  } catch (err) {
    $('#live').textContent = 'cannot reach the agent: ' + err.message;
  }
  S.stored = false;
  if (R.live && S.tab === 'overview' && !document.hidden) S.timer = setTimeout(() => load(true), livePeriod(R));
}

function route() {
  const hash = (location.hash || '#overview').slice(1);
  // An incident's page (#/incidents/{id}) belongs to the Alerts tab (alerts.js).
  const tab = hash.startsWith('/incidents/') ? 'alerts' : hash;
  S.tab = ['overview', 'series', 'forwarding', 'storage', 'alerts'].includes(tab) ? tab : 'overview';
  for (const s of document.querySelectorAll('.tab')) s.hidden = s.id !== S.tab;
  for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('on', a.dataset.tab === S.tab);
  load();
}

function setRange(r) {
  S.range = r;
  for (const b of document.querySelectorAll('#ranges button')) b.classList.toggle('on', b.dataset.range === r);
  const u = new URL(location.href);
  u.searchParams.set('range', r);
  history.replaceState(null, '', u);
  load();
}

$('#host').textContent = location.host;
for (const b of document.querySelectorAll('#ranges button')) b.addEventListener('click', () => setRange(b.dataset.range));
let searchT;
$('#search').addEventListener('input', () => {
  clearTimeout(searchT);
  searchT = setTimeout(() => fetchSeries(false).catch((err) => { $('#series-count').textContent = 'cannot list series: ' + err.message; }), 200);
});
$('#agg').addEventListener('change', () => S.picked && plotSeries(S.picked));
addEventListener('hashchange', route);
document.addEventListener('visibilitychange', () => { if (!document.hidden) load(); });
let resizeT;
addEventListener('resize', () => { clearTimeout(resizeT); resizeT = setTimeout(() => S.charts.forEach((c) => c.draw()), 150); });
const r0 = new URLSearchParams(location.search).get('range');
S.range = RANGES[r0] ? r0 : '1h';
for (const b of document.querySelectorAll('#ranges button')) b.classList.toggle('on', b.dataset.range === S.range);
route();
