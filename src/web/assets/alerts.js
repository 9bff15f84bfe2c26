// edgewatch web UI, the Alerts tab: active alerts (/api/v1/alerts), the transition history
// (/api/v1/alerts/history), incidents (/api/v1/incidents), an incident's page
// (#/incidents/{id}: its ranked findings next to the latency chart of that moment), and the
// firing badge in the tab bar, seen from every tab. It only reads the JSON API. Loaded before
// app.js: it uses app.js's helpers (el, $, getJSON, Chart, RANGES, S) only when called.
'use strict';

const ALERTS_POLL_MS = 15000;
const STATE_ORDER = { firing: 0, pending: 1, inactive: 2 };

// GET that answers null on 404 (an API this agent does not have).
async function getOptional(url, stored = S.stored) {
  const r = await fetch(url, { headers: apiHeaders(stored) });
  if (r.status === 404) return null;
  if (!r.ok) throw new Error(url + ': HTTP ' + r.status);
  return r.json();
}

// `{alerts: [...]}`, null without the API, undefined when it failed; updates the badge.
// From other tabs (`probe`), /api/v1/alerts is asked only when the status document has an
// `alerts` part (an agent evaluating rules), so an agent without rules is never asked for it.
// `stored`: the timer's refresh, which reads what is stored (see app.js's `apiHeaders`).
async function refreshAlertBadge(probe, stored = S.stored) {
  const b = document.querySelector('#alert-badge');
  let a;
  try {
    if (probe) {
      const st = await getJSON('/api/v1/status', stored);
      if (st.alerts == null) a = null;
    }
    if (a !== null) a = await getOptional('/api/v1/alerts', stored);
  } catch (err) { a = undefined; }
  const n = a ? (a.alerts || []).filter((x) => x.state === 'firing').length : 0;
  if (b) {
    b.textContent = String(n);
    b.hidden = n === 0;
    b.title = n + ' firing';
  }
  return a;
}

function when(v) {
  if (v == null) return null;
  const d = new Date(typeof v === 'number' ? v / 1e6 : v);
  if (isNaN(d)) return String(v);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}
const labelText = (l) => Object.entries(l || {}).map(([k, v]) => `${k}=${v}`).join(', ');
const incidentLink = (id, text) => el('a', { href: '#/incidents/' + id }, text || '#' + id);

function alertsTable(id, rows, cols) {
  const t = table(rows, cols);
  t.id = id;
  return el('div', { class: 'panel' }, t);
}

async function loadAlerts() {
  const box = $('#alerts');
  const m = (location.hash || '').match(/^#\/incidents\/(.*)$/);
  if (m) return loadIncident(box, decodeURIComponent(m[1]));
  const [alerts, hist, inc] = await Promise.all([
    refreshAlertBadge(),
    getOptional(`/api/v1/alerts/history?from=-${S.range}`).catch(() => undefined),
    getJSON('/api/v1/incidents?from=-30d&limit=50'),
  ]);
  box.textContent = '';
  box.append(el('h2', {}, 'Active alerts'));
  if (alerts === null) {
    box.append(el('div', { class: 'empty', id: 'alerts-active' }, 'Alert rules are not available on this agent (no /api/v1/alerts); incidents are listed below.'));
  } else if (alerts === undefined) {
    box.append(el('div', { class: 'empty', id: 'alerts-active' }, 'Cannot read the alerts right now.'));
  } else {
    const active = (alerts.alerts || []).filter((a) => a.state !== 'inactive')
      .sort((a, b) => (STATE_ORDER[a.state] ?? 3) - (STATE_ORDER[b.state] ?? 3) || String(a.name).localeCompare(String(b.name)));
    if (!active.length) {
      box.append(el('div', { class: 'empty', id: 'alerts-active' }, `No alert pending or firing (${(alerts.alerts || []).length} instances watched).`));
    } else {
      box.append(alertsTable('alerts-active', active, [
        ['alert', (a) => a.name],
        ['state', (a) => el('span', { class: a.state === 'firing' ? 'bad' : 'warn' }, a.state)],
        ['labels', (a) => labelText(a.labels)],
        ['value', (a) => (a.value == null ? null : num(a.value))],
        ['since', (a) => when(a.active_since)],
        ['incident', (a) => (a.incident_id == null ? null : incidentLink(a.incident_id))],
      ]));
    }
  }
  box.append(el('h2', {}, `History (${S.range})`));
  if (hist === null || hist === undefined) {
    box.append(el('div', { class: 'empty', id: 'alerts-history' }, hist === null ? 'No alert history on this agent.' : 'Cannot read the alert history right now.'));
  } else {
    // The API's rows are `{time, name, labels, transition, value}` (`history`); `transitions`
    // of `{at, from, to}` are read too.
    const tr = (hist.transitions || (hist.history || []).map((h) => ({ ...h, at: h.time, to: h.transition })))
      .slice().sort((a, b) => String(b.at).localeCompare(String(a.at)));
    if (!tr.length) box.append(el('div', { class: 'empty', id: 'alerts-history' }, 'No transitions in this range.'));
    else {
      box.append(alertsTable('alerts-history', tr, [
        ['at', (t) => when(t.at)],
        ['alert', (t) => t.name],
        ['labels', (t) => labelText(t.labels)],
        ['change', (t) => el('span', { class: t.to === 'firing' ? 'bad' : t.to === 'pending' ? 'warn' : 'good' }, t.from ? `${t.from} → ${t.to}` : t.to)],
        ['value', (t) => (t.value == null ? null : num(t.value))],
      ]));
    }
  }
  box.append(el('h2', {}, 'Incidents (30 d)'));
  const list = inc.incidents || [];
  if (!list.length) box.append(el('div', { class: 'empty', id: 'incidents-list' }, 'No incident yet: one is recorded, with its triage snapshot, each time an alert fires.'));
  else {
    box.append(alertsTable('incidents-list', list, [
      ['fired', (i) => incidentLink(i.id, when(i.fired))],
      ['alert', (i) => i.rule],
      ['labels', (i) => labelText(i.labels)],
      ['value', (i) => (i.value == null ? null : num(i.value))],
      ['likely cause', (i) => i.top_finding || 'nothing moved'],
      ['resolved', (i) => when(i.resolved) || 'no'],
    ]));
  }
}

async function loadIncident(box, id) {
  let inc;
  try { inc = await getJSON('/api/v1/incidents/' + encodeURIComponent(id)); } catch (err) {
    box.textContent = '';
    box.append(el('h2', {}, 'Incident'), el('div', { class: 'empty', id: 'incident-missing' }, `no incident ${id}`));
    return;
  }
  const snap = inc.snapshot || {};
  const win = snap.window || { from_ns: inc.started_ns, to_ns: inc.fired_ns };
  const base = snap.baseline || { from_ns: win.from_ns - 3600e9, to_ns: win.from_ns };
  box.textContent = '';
  box.append(el('h2', { id: 'incident-title' }, `Incident #${inc.id} · ${inc.rule}`),
    el('p', { class: 'muted' }, [labelText(inc.labels), inc.value == null ? null : `value ${num(inc.value)}` + (inc.threshold == null ? '' : ` (threshold ${num(inc.threshold)})`),
      `pending since ${when(inc.started)}`, `fired ${when(inc.fired)}`, inc.resolved ? `resolved ${when(inc.resolved)}` : 'not resolved'].filter(Boolean).join(' · '),
    ' · ', el('a', { href: '#alerts' }, 'all alerts')));
  const findings = snap.findings || [];
  const left = el('div', { class: 'panel' }, el('h3', {}, 'Findings, likely cause first'),
    findings.length
      ? el('ol', { id: 'incident-findings' }, findings.map((f) => el('li', { 'data-key': f.key }, f.message, ' ', el('span', { class: 'muted' }, `${f.step}${f.scope ? ' · ' + f.scope : ''} · score ${num(f.score)}`))))
      : el('div', { class: 'empty', id: 'incident-findings' }, 'Nothing moved against the hour before.'),
    snap.split ? el('p', { id: 'incident-split' }, snap.split.message) : null,
    el('p', { class: 'muted', id: 'incident-window' }, `window ${when(win.from_ns)} – ${when(win.to_ns)} against ${when(base.from_ns)} – ${when(base.to_ns)}` +
      (snap.window_note ? ` (${snap.window_note})` : '')),
    Object.entries(snap.checked || {}).some(([, v]) => !v)
      ? el('p', { class: 'muted' }, 'no data for: ' + Object.entries(snap.checked).filter(([, v]) => !v).map(([k]) => k).join(', '))
      : null);
  const chartBox = el('div', {});
  box.append(el('div', { class: 'grid' }, left, chartBox));
  // The device's events of the window (and the lead before it), oldest first.
  const events = snap.events || [];
  const ew = snap.events_window || win;
  box.append(el('h2', {}, `Events ${when(ew.from_ns)} – ${when(ew.to_ns)}`),
    events.length
      ? alertsTable('incident-events', events, [
        ['time', (e) => when(e.at_ns)],
        ['kind', (e) => e.kind],
        ['severity', (e) => el('span', { class: e.severity === 'critical' ? 'bad' : e.severity === 'warning' ? 'warn' : 'muted' }, e.severity)],
        ['source', (e) => e.source],
        ['message', (e) => e.message],
      ])
      : el('div', { class: 'empty', id: 'incident-events' }, 'No event in the window.'));
  const procs = snap.processes || {};
  const procTable = (id, rows, cols) => (rows && rows.length ? alertsTable(id, rows, cols) : el('div', { class: 'empty', id }, 'none seen'));
  box.append(el('h2', {}, 'Top processes at fire time'), el('div', { class: 'grid' },
    procTable('incident-cpu', procs.by_cpu, [['pid', (p) => p.pid], ['process', (p) => p.name], ['CPU %', (p) => num(p.cpu_pct)], ['RSS MB', (p) => num(p.rss_mb)]]),
    procTable('incident-gpu', procs.by_gpu_mem, [['pid', (p) => p.pid], ['process', (p) => p.name], ['GPU MB', (p) => num(p.gpu_mem_mb)], ['from', (p) => p.source]])));
  // The latency of that moment: the baseline hour and the window, the window shaded.
  const R = RANGES[S.range];
  const step = R.stepS <= 60 ? R.step : '1m';
  const tags = Object.entries(snap.scope || {}).map(([k, v]) => `&tag.${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join('');
  const q = (agg) => getJSON(`/api/v1/query?measurement=inference&field=wall_ms&agg=${agg}&step=${step}&from=${base.from_ns}&to=${win.to_ns}&group_by=${tags}`).catch(() => null);
  const [p50, p99] = await Promise.all([q('p50'), q('p99')]);
  const pts = (r) => (r && r.series[0] ? r.series[0].points.map((p) => [p[0] / 1e6, p[1]]) : []);
  S.domain = [base.from_ns / 1e6, win.to_ns / 1e6];
  S.bands = [[win.from_ns / 1e6, win.to_ns / 1e6]];
  // Its events marked on the chart (not the overview's).
  S.starts = [];
  S.events = events.map((e) => ({ t: e.at_ns / 1e6, kind: e.kind, severity: e.severity, source: e.source, message: e.message }));
  const c = Chart({ id: 'incident-latency', title: `Inference latency (wall_ms per ${step})` + (tags ? ' · ' + labelText(snap.scope) : ''), unit: 'ms', lines: [
    { name: 'p50', color: C.p50, pts: pts(p50) },
    { name: 'p99', color: C.p99, pts: pts(p99) },
  ] });
  chartBox.append(c.panel);
  S.charts = [c];
  c.draw();
}

// The incident page shades its window on its chart; no other tab's chart keeps that shade
// (runs before app.js's own hashchange handler, which loads the next tab).
addEventListener('hashchange', () => { if (!/^#\/incidents\//.test(location.hash)) S.bands = []; });

addEventListener('DOMContentLoaded', () => {
  refreshAlertBadge(true);
  setInterval(() => { if (!document.hidden) refreshAlertBadge(true, true); }, ALERTS_POLL_MS);
});
