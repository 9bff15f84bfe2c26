// The overview's LLM section against an agent holding `llm` points (tests/llm.rs starts and
// feeds it): cards, TTFT/ITL/tokens charts and the TTFT-by-prompt-length chart with its
// knee. Prints one JSON report: what the page shows beside the /api/v1/llm answer it got.
// Usage: node llm.mjs <agent URL> <screenshot.png>
import { chromium } from 'playwright-core';

const [url, shot] = process.argv.slice(2);
const T = 20000;
const report = { errors: [] };
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
  let api = null;
  page.on('response', (r) => { if (r.url().includes('/api/v1/llm')) api = r.json().catch(() => null); });
  await page.goto(url + '/?range=15m', { waitUntil: 'load' });
  await page.waitForSelector('svg[data-chart="ttft-chat"] path[data-series="p99"]', { timeout: T });
  await page.waitForSelector('svg[data-chart^="prompt-"] path[data-series="p50"]', { timeout: T });
  report.charts = await page.$$eval('svg[data-chart]', (svgs) => Object.fromEntries(svgs.map((s) => [
    s.dataset.chart,
    Object.fromEntries([...s.querySelectorAll('[data-series]')].map((p) => [p.dataset.series, +p.dataset.points])),
  ])));
  report.cards = await page.$$eval('.card[data-llm]', (c) => Object.fromEntries(c.map((x) => [x.dataset.llm + '/' + x.dataset.source, x.textContent])));
  report.headings = await page.$$eval('#sections h2', (h) => h.map((x) => x.textContent));
  report.knee = await page.$$eval('svg[data-chart^="prompt-"] line[data-knee]', (l) => l.map((x) => +x.dataset.knee));
  report.kneeText = await page.$$eval('[id^="knee-"]', (k) => k.map((x) => x.textContent));
  report.emptyInference = await page.$$eval('#empty-inference', (e) => e.length);
  report.api = await api;
  await page.screenshot({ path: shot, fullPage: true });
} catch (e) {
  report.failure = String(e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
