// Drives Debian's chromium (headless, through playwright-core) through the Alerts tab and an
// incident's page of a running agent and prints one JSON report on stdout; tests/incidents.rs
// starts the agent, stores the incident and asserts.
// Usage: node alerts.mjs <agent URL> <incident id> <screenshot.png>
// First without an alerts API (the agent answers 404), then with /api/v1/alerts and
// /api/v1/alerts/history answered in their documented shape by the browser's request routing.
import { chromium } from 'playwright-core';

const [url, id, shot] = process.argv.slice(2);
const T = 20000;
const report = { errors: [] };

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  // A 404 is an answer the Alerts tab handles (no alerts API, an unknown incident); the
  // report counts them, the test checks where they came from.
  report.notFound = [];
  page.on('response', (r) => { if (r.status() === 404) report.notFound.push(new URL(r.url()).pathname); });
  page.on('console', (m) => { if (m.type() === 'error' && !m.text().includes('status of 404')) report.errors.push(m.text()); });
  page.on('pageerror', (e) => report.errors.push(String(e)));
  page.on('requestfailed', (r) => report.errors.push('request failed: ' + r.url()));
  const texts = (sel) => page.$$eval(sel, (rows) => rows.map((r) => r.textContent));
  // WCAG 2 contrast of each link matched by `sel`: its computed colour over its effective
  // background (the backgrounds of it and its ancestors composited over a white canvas).
  const contrast = (sel) => page.$$eval(sel, (links) => {
    const rgba = (c) => {
      const m = c.match(/rgba?\(([^)]+)\)/);
      if (!m) throw new Error('unparsed colour ' + c);
      const p = m[1].split(/[\s,/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    };
    const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3])).concat(1);
    const lum = (c) => {
      const f = (v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
      return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
    };
    return links.map((a) => {
      const chain = [];
      for (let e = a; e; e = e.parentElement) chain.unshift(getComputedStyle(e).backgroundColor);
      const bg = chain.reduce((under, c) => over(rgba(c), under), [255, 255, 255, 1]);
      const fg = over(rgba(getComputedStyle(a).color), bg);
      const [hi, lo] = [lum(fg), lum(bg)].sort((x, y) => y - x);
      return { text: a.textContent, color: getComputedStyle(a).color, background: 'rgb(' + bg.slice(0, 3).map(Math.round).join(', ') + ')', ratio: (hi + 0.05) / (lo + 0.05) };
    });
  });

  // 1. No alerts API: the tab says so and still lists the incident; no badge.
  await page.goto(url + '/#alerts', { waitUntil: 'load' });
  await page.waitForSelector('#alerts-active', { timeout: T });
  await page.waitForSelector('#incidents-list tbody tr', { timeout: T });
  report.noApi = {
    active: await page.textContent('#alerts-active'),
    badgeHidden: await page.$eval('#alert-badge', (b) => b.hidden),
    incidents: await texts('#incidents-list tbody tr'),
  };
  report.contrast = { incidents: await contrast('#incidents-list td a') };

  // 2. With the alerts API: two firing, one pending, one inactive.
  const now = Date.now();
  const iso = (ms) => new Date(ms).toISOString();
  const alerts = { alerts: [
    { name: 'InferenceP99High', state: 'firing', labels: { model: 'yolov8n' }, value: 80, active_since: iso(now - 180e3), incident_id: +id },
    { name: 'GpuThrottled', state: 'pending', labels: { gpu: '0' }, value: 1, active_since: iso(now - 30e3), incident_id: null },
    { name: 'AgentDropping', state: 'firing', labels: {}, value: 12, active_since: iso(now - 600e3), incident_id: null },
    { name: 'ClockNotSet', state: 'inactive', labels: {}, value: null, active_since: null, incident_id: null },
  ] };
  const history = { transitions: [
    { name: 'InferenceP99High', labels: { model: 'yolov8n' }, from: 'inactive', to: 'pending', value: 55, at: iso(now - 180e3) },
    { name: 'InferenceP99High', labels: { model: 'yolov8n' }, from: 'pending', to: 'firing', value: 80, at: iso(now - 60e3) },
  ] };
  const json = (body) => ({ status: 200, contentType: 'application/json', body: JSON.stringify(body) });
  await page.route((u) => u.pathname === '/api/v1/alerts', (r) => r.fulfill(json(alerts)));
  await page.route((u) => u.pathname === '/api/v1/alerts/history', (r) => r.fulfill(json(history)));
  // An agent that evaluates rules has an `alerts` part in its status (the badge's probe).
  await page.route((u) => u.pathname === '/api/v1/status', async (r) => {
    const st = await (await r.fetch()).json();
    r.fulfill(json({ ...st, alerts: { rules: 4, firing: 2, pending: 1 } }));
  });
  report.badge = {};
  await page.goto(url + '/?range=1h#overview', { waitUntil: 'load' });
  await page.waitForSelector('#alert-badge:not([hidden])', { timeout: T });
  report.badge.overview = await page.textContent('#alert-badge');
  // The device's events on the overview's timelines: every chart marks the warning and
  // critical ones (and agent starts), with the message as the marker's title; hovering one
  // names it in the tooltip.
  await page.waitForSelector('#chart-ratio svg g.ev-critical', { timeout: T });
  const markers = (sel) => page.$$eval(sel, (gs) => gs.map((g) => ({
    kind: g.dataset.kind, severity: g.dataset.severity, cls: g.getAttribute('class'),
    title: g.querySelector('title').textContent, stroke: getComputedStyle(g.querySelector('line')).stroke,
  })));
  report.overviewEvents = {
    ratio: await markers('#chart-ratio svg g.ev'),
    charts: await page.$$eval('.panel svg', (ss) => ss.map((s) => s.querySelectorAll('g.ev-critical').length)),
  };
  const tri = await page.$('#chart-ratio svg g.ev-critical path');
  const box = await tri.boundingBox();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2 + 4);
  await page.waitForSelector('#tip:not([hidden]) .ev-tip', { timeout: T });
  report.overviewEvents.tip = await texts('#tip .ev-tip');
  await page.mouse.move(5, 5);
  await page.evaluate(() => { location.hash = '#storage'; });
  await page.waitForSelector('#storage .card', { timeout: T });
  report.badge.storage = await page.$eval('#alert-badge', (b) => (b.hidden ? 'hidden' : b.textContent));
  await page.evaluate(() => { location.hash = '#alerts'; });
  await page.waitForSelector('#alerts-active tbody tr', { timeout: T });
  report.active = await texts('#alerts-active tbody tr');
  report.activeLink = await page.$eval('#alerts-active a[href^="#/incidents/"]', (a) => a.getAttribute('href'));
  report.contrast.active = await contrast('#alerts-active td a');
  report.history = await texts('#alerts-history tbody tr');

  // 3. The incident's page, from the incidents list: findings beside the latency chart.
  await page.click(`#incidents-list a[href="#/incidents/${id}"]`);
  await page.waitForSelector('#incident-findings li', { timeout: T });
  await page.waitForSelector('svg[data-chart="incident-latency"] path[data-series="p99"]', { timeout: T });
  report.page = {
    title: await page.textContent('#incident-title'),
    findings: await texts('#incident-findings li'),
    split: await page.textContent('#incident-split'),
    chartPoints: await page.$$eval('svg[data-chart="incident-latency"] [data-series]', (ps) => Object.fromEntries(ps.map((p) => [p.dataset.series, +p.dataset.points]))),
    band: await page.$$eval('svg[data-chart="incident-latency"] rect.band', (r) => r.length),
    events: await texts('#incident-events tbody tr'),
    eventMarkers: await page.$$eval('svg[data-chart="incident-latency"] g.ev', (gs) => gs.map((g) => g.dataset.kind + '/' + g.dataset.severity)),
    windowNote: await page.textContent('#incident-window'),
    tabOn: await page.$eval('#tabs a.on', (a) => a.dataset.tab),
  };
  await page.screenshot({ path: shot, fullPage: true });

  // 4. An unknown incident.
  await page.evaluate(() => { location.hash = '#/incidents/999999'; });
  await page.waitForSelector('#incident-missing', { timeout: T });
  report.page.missing = await page.textContent('#incident-missing');
  // Leaving the incident pages drops the window's shade (other tabs' charts never show it).
  report.page.bandsBefore = await page.evaluate(() => S.bands.length);
  await page.evaluate(() => { location.hash = '#alerts'; });
  await page.waitForSelector('#alerts-active tbody tr', { timeout: T });
  report.page.bandsAfter = await page.evaluate(() => S.bands.length);
} catch (e) {
  report.failure = String(e && e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
