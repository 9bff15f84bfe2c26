// Opens the Alerts tab of a running agent that has a real firing alert (no request routing)
// in Debian's chromium and prints one JSON report on stdout: the badge, the active and
// history rows, and the incident page opened from the active row. tests/alerts_e2e.rs
// starts the agent, makes the alert fire and asserts.
// Usage: node alerts_live.mjs <agent URL>
import { chromium } from 'playwright-core';

const [url] = process.argv.slice(2);
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
  const texts = (sel) => page.$$eval(sel, (rows) => rows.map((r) => r.textContent));

  await page.goto(url + '/?range=1h#alerts', { waitUntil: 'load' });
  await page.waitForSelector('#alerts-active tbody tr', { timeout: T });
  await page.waitForSelector('#alert-badge:not([hidden])', { timeout: T });
  report.badge = await page.textContent('#alert-badge');
  report.active = await texts('#alerts-active tbody tr');
  report.history = await texts('#alerts-history tbody tr');
  report.link = await page.$eval('#alerts-active a[href^="#/incidents/"]', (a) => a.getAttribute('href'));
  await page.click('#alerts-active a[href^="#/incidents/"]');
  await page.waitForSelector('#incident-title', { timeout: T });
  report.title = await page.textContent('#incident-title');
} catch (e) {
  report.failure = String(e && e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
