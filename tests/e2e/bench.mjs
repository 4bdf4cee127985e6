// Browser benchmark of the page (a script, not a test): for each snapshot given, the time from
// choosing the file to `tensormem:painted` and to the doctor's findings, how long a hover waits
// while the doctor runs, then frame times while panning and zooming, the
// renderer's peak memory, when the file's decode is kept, and the same file opened again then (read back from the decode kept). Then "Size a model": Llama-3-70B's training step under FSDP on 64
// simulated GPUs, its time and the wasm memory it leaves, beside the same step on 8 GPUs (the
// baseline, in the same run): the ranks are simulated one at a time, so 64 should cost what 8
// do. Run by scripts/bench-web.sh, which builds everything and generates the synthetic 100 k and
// 1 M entry snapshots.
//
//   [DOCTOR_APART=off|always] node bench.mjs URL FILE...
import { chromium } from 'playwright-core';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { basename } from 'node:path';
import { CHROMIUM_ARGS } from './chromium.mjs';

const [url, ...files] = process.argv.slice(2);
if (!url || !files.length) {
  console.error('usage: node bench.mjs URL FILE...');
  process.exit(2);
}

// Chromium's renderer processes (it keeps spare ones; the page's is the largest), found once
// per browser: the memory sampler then reads only their status files.
function rendererPids() {
  return readdirSync('/proc').filter((p) => /^\d+$/.test(p)).filter((pid) => {
    try { return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('--type=renderer'); } catch { return false; }
  });
}

// The largest value of `measure(kb)` over `pids`, where kb(KEY) reads a /proc/PID/status field in kB.
function largestRenderer(pids, measure) {
  let largest = 0;
  for (const pid of pids) {
    try {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const kb = (key) => Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(status)?.[1] || 0);
      largest = Math.max(largest, measure(kb) * 1024);
    } catch { /* the process ended */ }
  }
  return largest;
}

// Peak resident memory (VmHWM), in bytes: counts ~120 MB of Chromium's shared library pages.
const rendererPeak = (pids) => largestRenderer(pids, (kb) => kb('VmHWM'));
// Chrome's own measure (its task manager's "memory footprint"): private memory, RssAnon +
// RssShmem. Linux keeps no peak of it, so the benchmark samples it every 20 ms while the file
// loads (not while frames are timed) and once after.
const rendererPrivate = (pids) => largestRenderer(pids, (kb) => kb('RssAnon') + kb('RssShmem'));

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q) => s[Math.min(s.length - 1, Math.floor(q * s.length))];
  return { median: at(0.5), p95: at(0.95), max: s[s.length - 1], frames: s.length };
};
// A figure to one decimal; null where none was measured (no frame drawn while panning).
const tenths = (v) => (v === undefined ? null : +v.toFixed(1));

const results = [];
for (const file of files) {
  // A fresh browser per file, so each renderer's peak memory is its own.
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: CHROMIUM_ARGS });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on('crash', () => console.error(`${basename(file)}: the renderer crashed`));
  page.on('pageerror', (e) => console.error(`${basename(file)}: page error: ${e.message}`));
  await page.goto(url);
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:painted').length >= 1, null, { timeout: 120000 });
  // DOCTOR_APART=off: every file diagnosed by the page's worker; =always: large files diagnosed in
  // the doctor's own worker whatever the cores (by default it takes four).
  if (process.env.DOCTOR_APART === 'off') await page.evaluate(() => { window.__tensormem.doctorApart.fromBytes = Infinity; });
  if (process.env.DOCTOR_APART === 'always') await page.evaluate(() => { window.__tensormem.doctorApart.fromCores = 0; });
  const pids = rendererPids();
  let privatePeak = 0;
  const sampler = setInterval(() => { privatePeak = Math.max(privatePeak, rendererPrivate(pids)); }, 20);
  await page.setInputFiles('[data-testid=open-file]', file);
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:painted').length >= 2, null, { timeout: 600000 });
  const load = await page.evaluate(() => {
    const chosen = performance.getEntriesByName('tensormem:file-chosen').at(-1).startTime;
    const painted = performance.getEntriesByName('tensormem:painted').at(-1).startTime;
    return painted - chosen;
  });
  // While the doctor reads the file (its findings not yet shown), a hover every 50 ms: how
  // long the page's worker takes to say what is under the pointer.
  const whileDiagnosing = await page.evaluate(async () => {
    const t = window.__tensormem.timeline;
    const p = t.plot;
    const diagnosed = () => performance.getEntriesByName('tensormem:diagnosed').length >= 2;
    const waits = [];
    for (let k = 0; !diagnosed() && k < 2400; k++) {
      const start = performance.now();
      await t.hitTest(p.x + ((k * 37) % p.w), p.y + p.h * 0.9);
      waits.push(performance.now() - start);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await new Promise((resolve) => { const wait = () => (diagnosed() ? resolve() : setTimeout(wait, 50)); wait(); });
    const at = (name) => performance.getEntriesByName(`tensormem:${name}`).at(-1).startTime;
    return { waits, diagnosed: Math.round(at('diagnosed') - at('file-chosen')), apart: document.querySelector('#diagnosis').dataset.apart === 'true' };
  });
  const events = await page.textContent('#trace-events');
  const { wasmBytes, parsed: wasmParsed, laidOut: wasmLaidOut } = await page.evaluate(() => window.__tensormem.ask('memory'));
  // Where the time went: file chosen -> parsed (worker) -> timeline laid out (worker) -> painted.
  const phases = await page.evaluate(() => {
    const at = (name) => performance.getEntriesByName(`tensormem:${name}`).at(-1).startTime;
    const chosen = at('file-chosen');
    return { parsed: Math.round(at('parsed') - chosen), laid_out: Math.round(at('timeline-received') - chosen), painted: Math.round(at('painted') - chosen) };
  });

  const hovers = whileDiagnosing.waits.length ? stats(whileDiagnosing.waits) : {};
  clearInterval(sampler);
  // Pan and zoom for a while; the page records how long each frame's drawing took.
  await page.evaluate(() => { window.__frameTimes = []; });
  // A file with warnings pushes the timeline down: it is scrolled into view to be panned.
  await page.locator('[data-testid=timeline]').scrollIntoViewIfNeeded();
  const box = await page.locator('[data-testid=timeline]').boundingBox();
  const cx = box.x + box.width / 2;
  const cy = box.y + box.height / 2;
  await page.mouse.move(cx, cy);
  for (let i = 0; i < 20; i++) { await page.mouse.wheel(0, -120); await page.waitForTimeout(16); }
  // A pause: the view settles and is re-rendered at full quality (counted in the frame times).
  await page.waitForTimeout(300);
  for (let round = 0; round < 3; round++) {
    await page.mouse.move(cx, cy);
    await page.mouse.down();
    for (let i = 0; i < 30; i++) { await page.mouse.move(cx + (round % 2 ? 1 : -1) * i * 12, cy); await page.waitForTimeout(16); }
    await page.mouse.up();
  }
  for (let i = 0; i < 20; i++) { await page.mouse.wheel(0, 120); await page.waitForTimeout(16); }
  await page.waitForTimeout(200);
  const frameTimes = await page.evaluate(() => window.__frameTimes);
  const frames = stats(frameTimes);
  const peak = rendererPeak(pids);
  privatePeak = Math.max(privatePeak, rendererPrivate(pids));
  // The same file again: read back from the decode the page kept (files of 16 MiB or more),
  // once kept (the page keeps it after the doctor's findings, in the background).
  const keptAt = statSync(file).size < 16 << 20 ? null : await page.waitForFunction(() => {
    const kept = performance.getEntriesByName('tensormem:kept').at(-1);
    return kept && Math.round(kept.startTime - performance.getEntriesByName('tensormem:file-chosen').at(-1).startTime);
  }, null, { timeout: 600000 }).then((h) => h.jsonValue());
  await page.setInputFiles('[data-testid=open-file]', file);
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:painted').length >= 3, null, { timeout: 600000 });
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 3, null, { timeout: 600000 });
  const again = await page.evaluate(() => {
    const at = (name) => performance.getEntriesByName(`tensormem:${name}`).at(-1).startTime;
    const chosen = at('file-chosen');
    const preview = performance.getEntriesByName('tensormem:preview').at(-1);
    return {
      reopened: document.querySelector('#source-name').dataset.reopened === 'true',
      // The view kept by the first open, shown before the timeline is laid out.
      preview: preview && preview.startTime > chosen ? Math.round(preview.startTime - chosen) : null,
      parsed: Math.round(at('parsed') - chosen),
      painted: Math.round(at('painted') - chosen),
      diagnosed: Math.round(at('diagnosed') - chosen),
    };
  });
  await browser.close();
  const r = {
    file: basename(file), megabytes: +(statSync(file).size / 1048576).toFixed(1), events,
    choose_to_painted_ms: Math.round(load), phases_ms: phases, diagnosed_ms: whileDiagnosing.diagnosed, kept_ms: keptAt, doctor_apart: whileDiagnosing.apart,
    hover_ms_while_diagnosing: { median: tenths(hovers.median), max: tenths(hovers.max), hovers: whileDiagnosing.waits.length }, again_ms: again, frame_ms_median: tenths(frames.median), frame_ms_p95: tenths(frames.p95),
    frame_ms_max: tenths(frames.max), frames: frames.frames, renderer_peak_mb: Math.round(peak / 1048576), renderer_private_peak_mb: Math.round(privatePeak / 1048576), wasm_memory_mb: Math.round(wasmBytes / 1048576), wasm_mb_parsed: Math.round(wasmParsed / 1048576), wasm_mb_laid_out: Math.round(wasmLaidOut / 1048576),
  };
  results.push(r);
  console.log(JSON.stringify(r));
}
console.table(results);

// Size a model: one browser; each world size twice, the second run timed (the first warms up).
{
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: CHROMIUM_ARGS });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  await page.goto(url);
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:painted').length >= 1, null, { timeout: 120000 });
  const size = async (world) => {
    await page.selectOption('[data-testid=size-model]', 'llama-3-70b');
    for (const [name, value] of Object.entries({ context: '4096', world })) await page.fill(`[data-testid=size-${name}]`, value);
    for (const [name, value] of Object.entries({ attn: 'sdpa', amp: 'bfloat16', strategy: 'fsdp' })) await page.selectOption(`[data-testid=size-${name}]`, value);
    await page.check('[data-testid=size-checkpointing]');
    const started = Date.now();
    await page.click('[data-testid=size-run]');
    await page.waitForFunction(() => !document.querySelector('[data-testid=size-run]').disabled
      && document.querySelector('[data-testid=size-verdict]'), null, { timeout: 600000 });
    const ms = Date.now() - started;
    const { wasmBytes } = await page.evaluate(() => window.__tensormem.ask('memory'));
    const verdict = await page.textContent('[data-testid=size-verdict]');
    return { ms, wasm_mb: Math.round(wasmBytes / 1048576), verdict };
  };
  const sized = {};
  for (const world of ['8', '64']) {
    await size(world);
    sized[world] = await size(world);
  }
  await browser.close();
  const r = {
    benchmark: 'size a model: llama-3-70b fsdp, context 4096, sdpa, bf16 autocast, checkpointing',
    world_8_ms: sized['8'].ms, world_64_ms: sized['64'].ms, time_ratio_64_to_8: +(sized['64'].ms / sized['8'].ms).toFixed(2),
    world_8_wasm_mb: sized['8'].wasm_mb, world_64_wasm_mb: sized['64'].wasm_mb, verdict_64: sized['64'].verdict,
  };
  console.log(JSON.stringify(r));
}
