// Drives Debian's chromium (headless, through playwright-core) against a running agent and
// prints one JSON report on stdout; tests/web.rs starts the agents, feeds them and asserts.
// Usage: node ui.mjs <agent URL with data> <agent URL without data> <screenshot.png>
//        [<agent URL replaying tegrastats>]
import { chromium } from 'playwright-core';

const [url, emptyUrl, shot, jetsonUrl] = process.argv.slice(2);
const T = 20000;
const report = { errors: [], charts: {}, ranges: {}, steps: [] };

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on('console', (m) => { if (m.type() === 'error') report.errors.push(m.text()); });
  page.on('pageerror', (e) => report.errors.push(String(e)));
  page.on('requestfailed', (r) => report.errors.push('request failed: ' + r.url()));
  page.on('request', (r) => { if (r.url().includes('/api/')) report.steps.push(r.url().replace(url, '')); });
  // How each read asked the agent to treat the points it holds (X-Edgewatch-Read).
  const readOf = (r) => r.headers()['x-edgewatch-read'] || 'latest';

  // Every chart of the overview, with its series and their point counts, from the DOM.
  const charts = () => page.$$eval('svg[data-chart]', (svgs) => Object.fromEntries(svgs.map((s) => [
    s.dataset.chart,
    Object.fromEntries([...s.querySelectorAll('[data-series]')].map((p) => [p.dataset.series, +p.dataset.points])),
  ])));

  // The latest /api/v1/inference answer the page got (the cards render it).
  let lastInference = null;
  page.on('response', (r) => { if (r.url().includes('/api/v1/inference')) lastInference = r.json().catch(() => null); });
  const firstInference = page.waitForRequest((q) => q.url().includes('/api/v1/inference'), { timeout: T });
  await page.goto(url + '/?range=15m', { waitUntil: 'load' });
  report.firstRead = readOf(await firstInference);
  await page.waitForSelector('svg[data-chart="latency-yolov8n"] path[data-series="p99"]', { timeout: T });
  await page.waitForSelector('svg[data-chart="gpu_temp"] path', { timeout: T });
  report.charts = await charts();
  report.findings = await page.$$eval('#findings .find', (f) => f.map((x) => x.textContent));
  report.bannerHidden = await page.$eval('#banner', (b) => b.hidden);
  report.cards = await page.$$eval('.card[data-model]', (c) => c.map((x) => x.textContent));
  report.energyCards = await page.$$eval('.card[data-model]', (c) => Object.fromEntries(c.map((x) => [x.dataset.model, x.querySelector('.energy')?.textContent])));
  const inf = await lastInference;
  report.tritonCards = await page.$$eval('.card[data-source="triton"]', (c) => Object.fromEntries(c.map((x) => [x.dataset.model, x.textContent])));
  report.tritonApi = inf && Object.fromEntries(inf.models.filter((m) => m.source === 'triton').map((m) => [m.model, m.summary]));
  report.energyApi = inf && { energy: inf.energy, summary: Object.fromEntries(inf.models.filter((m) => m.source !== 'triton').map((m) => [m.model, m.summary])) };

  // Hover the middle of the latency chart: the tooltip and every legend show that time.
  const box = await (await page.$('svg[data-chart="latency-yolov8n"]')).boundingBox();
  await page.mouse.move(box.x + box.width * 0.55, box.y + box.height / 2);
  await page.waitForSelector('#tip:not([hidden])', { timeout: T });
  report.tip = await page.textContent('#tip');
  report.tempLegendHover = await page.textContent('#chart-gpu_temp .legend');
  // Legend swatches are coloured through CSSOM (the CSP forbids inline style attributes).
  report.swatch = await page.$eval('#chart-gpu_temp .legend i', (i) => getComputedStyle(i).backgroundColor);
  report.csp = await page.evaluate(async () => (await fetch('/')).headers.get('content-security-policy'));
  report.crosshairs = await page.$$eval('line.xh[visibility="visible"]', (l) => l.length);
  await page.screenshot({ path: shot, fullPage: true });
  await page.mouse.move(5, 5);

  // The live refresh comes on a timer (the range's period, or the agent's hold if longer)
  // and reads what the agent has taken, held points included, without waiting: an open tab
  // commits nothing of its own.
  report.live = await page.textContent('#live');
  const refresh = await page.waitForRequest((q) => q.url().includes('/api/v1/inference'), { timeout: 30000 });
  const refreshQueries = [];
  const onQuery = (q) => { if (q.url().includes('/api/v1/query') || q.url().includes('/api/v1/status')) refreshQueries.push(readOf(q)); };
  page.on('request', onQuery);
  report.refreshRead = readOf(refresh);
  await page.waitForResponse((q) => q.url().includes('/api/v1/query'), { timeout: T });
  await page.waitForTimeout(500);
  page.off('request', onQuery);
  report.refreshQueryReads = refreshQueries;

  // The range picker changes the query's range and step (rollup tiers for long ranges).
  for (const [r, step] of [['1h', '1m'], ['24h', '5m'], ['7d', '1h']]) {
    const req = page.waitForRequest((q) => q.url().includes('/api/v1/inference') && q.url().includes(`from=-${r}`) && q.url().includes(`step=${step}`), { timeout: T });
    const resp = page.waitForResponse((q) => q.url().includes('/api/v1/query') && q.url().includes(`step=${step}`), { timeout: T });
    await page.click(`#ranges button[data-range="${r}"]`);
    await req;
    await resp;
    await page.waitForFunction((r) => location.search.includes('range=' + r), r, { timeout: T });
    await page.waitForTimeout(300);
    report.ranges[r] = { charts: await charts(), active: await page.textContent('#ranges button.on') };
  }

  await page.click('#ranges button[data-range="15m"]');
  await page.waitForSelector('svg[data-chart="latency-yolov8n"] path[data-series="p99"][data-points="0"], svg[data-chart="gpu_temp"]', { timeout: T });

  // Series browser: search, click, plot with a chosen aggregation.
  await page.click('#tabs a[data-tab="series"]');
  await page.waitForSelector('#series-list tbody tr', { timeout: T });
  // The agent filters (after a short pause in typing): wait for that answer and its rows.
  const filtered = page.waitForResponse((q) => q.url().includes('/api/v1/series') && q.url().includes('match=gpu'), { timeout: T });
  await page.fill('#search', 'gpu temp_c');
  await filtered;
  await page.waitForFunction(() => document.querySelector('#series-count').textContent.includes('matching'), null, { timeout: T });
  report.seriesRows = await page.$$eval('#series-list tbody tr', (r) => r.length);
  report.seriesCount = await page.textContent('#series-count');
  const agg = page.waitForRequest((q) => q.url().includes('agg=max') && q.url().includes('field=temp_c'), { timeout: T });
  await page.selectOption('#agg', 'max');
  await page.click('#series-list tbody tr');
  await agg;
  await page.waitForSelector('svg[data-chart="series"] path[data-series="max"]', { timeout: T });
  report.seriesPlot = await page.$eval('svg[data-chart="series"] path[data-series="max"]', (p) => +p.dataset.points);

  await page.click('#tabs a[data-tab="forwarding"]');
  await page.waitForSelector('#forwarding .empty, #forwarding table', { timeout: T });
  report.forwarding = await page.textContent('#forwarding');
  await page.click('#tabs a[data-tab="storage"]');
  await page.waitForSelector('#db-size', { timeout: T });
  report.storage = await page.textContent('#storage');
  // The budget meter's fill, as a share of its track (set through CSSOM under the CSP).
  report.meterFill = await page.$eval('#storage .meter div', (d) => d.offsetWidth / d.parentElement.offsetWidth);
  await page.setViewportSize({ width: 1400, height: 700 });
  await page.screenshot({ path: shot.replace(/\.png$/, '-storage.png') });

  // An agent with no data: clear empty states, still no console error.
  const empty = await browser.newPage({ viewport: { width: 420, height: 900 } });
  empty.on('console', (m) => { if (m.type() === 'error') report.errors.push('empty: ' + m.text()); });
  empty.on('pageerror', (e) => report.errors.push('empty: ' + String(e)));
  await empty.goto(emptyUrl + '/', { waitUntil: 'load' });
  await empty.waitForSelector('#empty-inference', { timeout: T });
  report.emptyInference = await empty.textContent('#empty-inference');
  report.emptyGpu = await empty.textContent('#empty-gpu');
  await empty.waitForSelector('#banner:not([hidden])', { timeout: T });
  report.emptyBanner = await empty.textContent('#banner');
  await empty.screenshot({ path: shot.replace(/\.png$/, '-empty-phone.png'), fullPage: true });

  // A Jetson (tegrastats replay, no NVML): the GPU panels come from GR3D, the Jetson ones
  // from rails, SoC zones, EMC and engines.
  if (jetsonUrl) {
    const jet = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    jet.on('console', (m) => { if (m.type() === 'error') report.errors.push('jetson: ' + m.text()); });
    jet.on('pageerror', (e) => report.errors.push('jetson: ' + String(e)));
    await jet.goto(jetsonUrl + '/?range=15m', { waitUntil: 'load' });
    await jet.waitForSelector('svg[data-chart="j_power"] path[data-series]', { state: 'attached', timeout: T });
    await jet.waitForSelector('svg[data-chart="gpu_throttle"] [data-series="Jetson throttled"]', { state: 'attached', timeout: T });
    report.jetsonCharts = await jet.$$eval('svg[data-chart]', (svgs) => Object.fromEntries(svgs.map((s) => [
      s.dataset.chart,
      Object.fromEntries([...s.querySelectorAll('[data-series]')].map((p) => [p.dataset.series, +p.dataset.points])),
    ])));
    report.jetsonSections = await jet.$$eval('h2', (h) => h.map((x) => x.textContent));
    report.jetsonFindings = await jet.$$eval('#findings .find', (f) => f.map((x) => x.textContent));
    await jet.screenshot({ path: shot.replace(/\.png$/, '-jetson.png'), fullPage: true });
    // Its sink is down: wait until the status says so, then read the forwarding table.
    for (let i = 0; i < 100; i++) {
      const st = await (await fetch(jetsonUrl + '/api/v1/status')).json();
      if (st.forward.sinks.length && st.forward.sinks[0].last_error) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    await jet.click('#tabs a[data-tab="forwarding"]');
    await jet.waitForSelector('#forwarding table', { timeout: T });
    report.jetsonForwarding = {
      head: await jet.$$eval('#forwarding thead th', (c) => c.map((x) => x.textContent)),
      rows: await jet.$$eval('#forwarding tbody tr', (r) => r.map((x) => [...x.children].map((c) => c.textContent))),
    };
  }
} catch (e) {
  report.failure = String(e && e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
