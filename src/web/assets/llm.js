// The overview's LLM section (app.js calls renderLlm when `llm` data exists): a card per
// model (TTFT p99, ITL, tokens/s, tokens/J), charts of TTFT and ITL percentiles, output
// tokens per second and tokens per joule over time, and TTFT against prompt length with its
// knee. Reads /api/v1/llm only; uses app.js's helpers (el, sv, num, Chart, C, PALETTE).
'use strict';

// A model's label and chart key: app-reported by name, scraped ones with their server.
function llmLabel(m) {
  return m.source === 'scrape' ? `${m.model} (${m.server})` : m.model;
}
function llmKey(m) {
  return m.source === 'scrape' ? `${m.server}-${m.scrape}-${m.model}` : m.model;
}

function llmCard(m) {
  const s = m.summary;
  const r = s.ttft_p99_p50;
  const scr = m.source === 'scrape';
  const per = s.tokens_per_s && s.tokens_per_s.p50 != null ? ` · ${num(s.tokens_per_s.p50)} tok/s per request` : '';
  const energy = s.tokens_per_joule == null
    ? el('div', { class: 's energy muted', title: 'no power samples cover these requests (tegrastats rails or NVML power)' }, 'energy: no power data')
    : el('div', { class: 's energy', title: `${num((s.energy_token_coverage || 0) * 100, '%')} of the output tokens fall in time the power samples cover` },
      `${num(s.tokens_per_joule)} tokens/J · ${num(s.joules_per_1k_tokens, 'J')} per 1k tokens`);
  return el('div', { class: 'card', 'data-llm': m.model, 'data-source': m.source },
    el('div', { class: 's' }, m.model,
      scr ? el('span', { class: 'badge triton', title: `${m.server}, scrape ${m.scrape}: percentiles per scrape interval from its histograms (a step shows its worst interval)` }, m.server) : null,
      ' · p99 time to first token'),
    el('div', { class: 'v ' + (r >= 4 ? 'bad' : r >= 2.5 ? 'warn' : 'good') }, num(s.ttft_ms.p99, 'ms')),
    el('div', { class: 's' }, `TTFT p50 ${num(s.ttft_ms.p50, 'ms')} · P99/P50 ${num(r)}× · ITL p50 ${num(s.itl_ms.p50, 'ms')} p99 ${num(s.itl_ms.p99, 'ms')}`),
    el('div', { class: 's' }, `${num(s.output_tokens_per_s)} tokens/s · ${num(s.requests_per_s)} req/s` + per + (s.errors ? ` · ${s.errors} failed` : '')),
    energy);
}

// TTFT (p50, p99) against prompt length, with the knee as a vertical line. Its x axis is
// tokens, not time, so it has its own small drawing and ignores the time crosshair.
function promptChart(m) {
  const c = m.prompt_curve;
  const svg = sv('svg', { height: H, 'data-chart': 'prompt-' + llmKey(m) });
  const legend = el('div', { class: 'legend' });
  const knee = c.knee ? ` · knee at ${num(c.knee.prompt_tokens)} tokens` : '';
  const slope = c.ttft_ms_per_1k_prompt_tokens == null ? '' : ` · ${num(c.ttft_ms_per_1k_prompt_tokens, 'ms')}/1k tokens` +
    (c.ttft_ms_per_1k_prompt_tokens_above_knee == null ? '' : `, then ${num(c.ttft_ms_per_1k_prompt_tokens_above_knee, 'ms')}/1k`);
  const panel = el('div', { class: 'panel', id: 'chart-prompt-' + llmKey(m) },
    el('h3', {}, `${llmLabel(m)}: TTFT by prompt length`, el('span', { class: 'muted' }, 'ms'), el('span', { class: 'big muted', id: 'knee-' + llmKey(m) }, knee)),
    legend, svg);
  const b = c.buckets;
  const lines = [
    { name: 'p99', color: C.p99, pts: b.map((x) => [x.prompt_tokens_mean, x.ttft_p99_ms]) },
    { name: 'p50', color: C.p50, pts: b.map((x) => [x.prompt_tokens_mean, x.ttft_p50_ms]) },
  ];
  for (const l of lines) legend.append(el('span', {}, el('i', { style: `background:${l.color}` }), l.name));
  legend.append(el('span', {}, `${c.requests} requests` + slope));
  const draw = () => {
    const W = svg.clientWidth || 440;
    svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
    svg.textContent = '';
    const pw = W - ML - MR, ph = H - MT - MB;
    const xs = b.map((x) => x.prompt_tokens_mean);
    const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    const ymax = niceMax(Math.max(...b.map((x) => x.ttft_p99_ms)));
    const x = (v) => ML + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * pw;
    const y = (v) => MT + (1 - v / ymax) * ph;
    const g = sv('g', { class: 'grid' });
    svg.append(g);
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4;
      g.append(sv('line', { x1: ML, x2: W - MR, y1: y(v), y2: y(v) }));
      const t = sv('text', { x: ML - 4, y: y(v) + 3, 'text-anchor': 'end' }); t.textContent = +v.toPrecision(3); svg.append(t);
    }
    for (let i = 0; i <= 4; i++) {
      const v = x0 + ((x1 - x0) * i) / 4;
      const t = sv('text', { x: x(v), y: H - 4, 'text-anchor': 'middle' }); t.textContent = Math.round(v) + (i === 4 ? ' tok' : ''); svg.append(t);
    }
    if (c.knee) svg.append(sv('line', { class: 'xh', 'data-knee': c.knee.prompt_tokens, x1: x(c.knee.prompt_tokens), x2: x(c.knee.prompt_tokens), y1: MT, y2: H - MB }));
    for (const l of lines) {
      const d = l.pts.map((p, i) => (i ? 'L' : 'M') + x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join('');
      svg.append(sv('path', { d, fill: 'none', stroke: l.color, 'stroke-width': 1.6, 'data-series': l.name, 'data-points': l.pts.length }));
      for (const p of l.pts) svg.append(sv('circle', { cx: x(p[0]), cy: y(p[1]), r: 2, fill: l.color }));
    }
  };
  return { o: { lines: [] }, panel, draw, hover: () => {} };
}

// Appends the LLM section to `secs`; `add(grid, chart)` registers a chart for drawing.
function renderLlm(secs, v, add) {
  const models = ((v && v.models) || []).filter((m) => m.steps && m.steps.length)
    .sort((a, b) => (b.summary.ttft_ms.p99 || 0) - (a.summary.ttft_ms.p99 || 0));
  if (!models.length) return;
  secs.append(el('h2', { id: 'llm' }, 'LLM'));
  const cards = el('div', { class: 'cards', id: 'llm-cards' });
  for (const m of models) cards.append(llmCard(m));
  secs.append(cards);
  const grid = el('div', { class: 'grid' });
  secs.append(grid);
  const pick = (m, f, k) => m.steps.filter((s) => s[f] && s[f][k] != null).map((s) => [ms(s.t), s[f][k]]);
  for (const m of models) {
    const mid = m.source === 'scrape' ? 'p90' : 'p95';
    add(grid, Chart({
      id: 'ttft-' + llmKey(m), title: `${llmLabel(m)} time to first token`, unit: 'ms',
      big: el('span', { class: 'big' }, 'p99 ' + num(m.summary.ttft_ms.p99, 'ms')),
      lines: [
        { name: 'p99', color: C.p99, pts: pick(m, 'ttft_ms', 'p99'), width: 2 },
        { name: mid, color: C.p95, pts: pick(m, 'ttft_ms', mid) },
        { name: 'p50', color: C.p50, pts: pick(m, 'ttft_ms', 'p50') },
      ].filter((l) => l.pts.length),
    }));
    add(grid, Chart({
      id: 'itl-' + llmKey(m), title: `${llmLabel(m)} inter-token latency`, unit: 'ms',
      lines: [
        { name: 'p99', color: C.p99, pts: pick(m, 'itl_ms', 'p99'), width: 2 },
        { name: 'p50', color: C.p50, pts: pick(m, 'itl_ms', 'p50') },
      ].filter((l) => l.pts.length),
    }));
    if (m.prompt_curve && m.prompt_curve.buckets.length >= 2) add(grid, promptChart(m));
  }
  const per = (k) => models.map((m, i) => ({ name: llmLabel(m), color: PALETTE[i % PALETTE.length], pts: m.steps.filter((s) => s[k] != null).map((s) => [ms(s.t), s[k]]) }))
    .filter((l) => l.pts.length);
  add(grid, Chart({ id: 'llm-tokens', title: 'Output tokens per second', unit: 'tok/s', lines: per('output_tokens_per_s') }));
  const tpj = per('tokens_per_joule');
  if (tpj.length) add(grid, Chart({ id: 'llm-tokens-per-joule', title: 'Tokens per joule' + (v.energy && v.energy.lower_bound ? ' (upper bound: rails summed)' : ''), unit: 'tok/J', lines: tpj }));
}
