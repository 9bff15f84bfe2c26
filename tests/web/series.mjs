// The Series tab against an agent holding many series (tests/web.rs starts and feeds it):
// the first page, a filter down to one series, the next page. Prints one JSON report with
// the rows shown, the count line, the requests made and how long each step took (ms).
// Usage: node series.mjs <agent URL> <series id to find>
import { chromium } from 'playwright-core';

const [url, wanted] = process.argv.slice(2);
const T = 20000;
const report = { errors: [], requests: [], ms: {} };
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.on('console', (m) => { if (m.type() === 'error') report.errors.push(m.text()); });
  page.on('pageerror', (e) => report.errors.push(String(e)));
  page.on('request', (r) => { if (r.url().includes('/api/v1/series')) report.requests.push(r.url().replace(url, '')); });
  page.on('response', async (r) => {
    if (r.url().includes('/api/v1/series')) report.maxBody = Math.max(report.maxBody || 0, (await r.body()).length);
  });
  let t = Date.now();
  await page.goto(url + '/#series', { waitUntil: 'load' });
  await page.waitForSelector('#series-list tbody tr', { timeout: T });
  report.ms.first = Date.now() - t;
  report.firstRows = await page.$$eval('#series-list tbody tr', (r) => r.length);
  report.firstCount = await page.textContent('#series-count');

  // The next page, appended.
  t = Date.now();
  await page.click('#series-more');
  await page.waitForFunction((n) => document.querySelectorAll('#series-list tbody tr').length > n, report.firstRows, { timeout: T });
  report.ms.more = Date.now() - t;
  report.moreRows = await page.$$eval('#series-list tbody tr', (r) => r.length);

  // Typing a filter: one series left.
  t = Date.now();
  await page.fill('#search', `req ${wanted}`);
  await page.waitForFunction(() => document.querySelector('#series-count').textContent.includes('matching'), null, { timeout: T });
  report.ms.filter = Date.now() - t;
  report.filterRows = await page.$$eval('#series-list tbody tr', (r) => r.map((x) => x.textContent));
  report.filterCount = await page.textContent('#series-count');
  // The page stayed interactive throughout: a task queued now runs at once.
  t = Date.now();
  await page.evaluate(() => new Promise((r) => setTimeout(r, 0)));
  report.ms.idle = Date.now() - t;
} catch (e) {
  report.failure = String(e && e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
