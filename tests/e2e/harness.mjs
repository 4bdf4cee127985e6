// What every end-to-end test file shares: the served page (`tensormem serve`, one per file, started
// before its tests), headless Chromium (playwright-core driving the system Chromium), and the
// helpers that open files, wait for the page and ask the CLI what it reports.
import { before, after } from 'node:test';
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS } from './chromium.mjs';

export const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const bin = process.env.TENSORMEM_BIN || join(root, 'target/release/tensormem');
export const fixtures = process.env.TENSORMEM_FIXTURES || resolve(root, '../shared/fixtures/pytorch-snapshots');
export const shots = join(root, 'target/e2e-screenshots');
export const scratch = join(root, 'target/e2e-files');
mkdirSync(shots, { recursive: true });
mkdirSync(scratch, { recursive: true });

export let server;
export let baseUrl;
export let browser;

export function serve(args = []) {
  return new Promise((ok, fail) => {
    const child = spawn(bin, ['serve', '--port', '0', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
    child.stdout.setEncoding('utf8');
    child.stdout.once('data', (line) => {
      const m = /serving (\S+)/.exec(line);
      if (m) ok({ child, url: m[1] }); else fail(new Error(`unexpected first line: ${line}`));
    });
    child.once('exit', (code) => fail(new Error(`tensormem serve exited with ${code}`)));
  });
}

before(async () => {
  ({ child: server, url: baseUrl } = await serve());
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: CHROMIUM_ARGS });
});
after(async () => {
  await browser?.close();
  server?.kill();
});

export async function newPage() {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.errors = errors;
  return page;
}

// Waits for the n-th `tensormem:painted` mark (one per newly loaded trace).
export async function painted(page, n = 1) {
  await page.waitForFunction((k) => performance.getEntriesByName('tensormem:painted').length >= k, n, { timeout: 60000 });
}

export async function peaks(page) {
  return {
    allocated: Number(await page.getAttribute('[data-testid=peak-allocated]', 'data-bytes')),
    reserved: Number(await page.getAttribute('[data-testid=peak-reserved]', 'data-bytes')),
  };
}

export async function openFile(page, path, paints) {
  await page.setInputFiles('[data-testid=open-file]', path);
  await painted(page, paints);
}

// What the CLI reports as recorded, per device.
export function cliPeaks(path) {
  const out = execFileSync(bin, ['replay', path, '--json'], { encoding: 'utf8', maxBuffer: 1 << 26 });
  return out.trim().split('\n').map((l) => JSON.parse(l)).map((r) => ({
    device: r.device, allocated: r.recorded.peak_allocated_bytes, reserved: r.recorded.peak_reserved_bytes,
  }));
}

// Fraction of the timeline canvas's pixels that are not blank.
export async function inkedFraction(page) {
  return page.$eval('[data-testid=timeline]', (c) => {
    const { data } = c.getContext('2d').getImageData(0, 0, c.width, c.height);
    let inked = 0;
    for (let i = 3; i < data.length; i += 4 * 7) if (data[i] > 0) inked++;
    return inked / (data.length / (4 * 7));
  });
}

// Colours the timeline by `by` (recorded, inferred or frame) and waits for the legend to say so.
export const LEGEND_CAPTION = { recorded: 'category (recorded):', inferred: 'category (inferred):', frame: 'stack frame:' };
export async function colorBy(page, by) {
  await page.selectOption('[data-testid=color-by]', by);
  await page.waitForFunction((text) => document.querySelector('[data-testid=legend-caption]')?.textContent === text, LEGEND_CAPTION[by]);
}

// Waits until the timeline canvas's data- attribute `key` (cursor, selected, pinned) is `want`
// (a string), or is set and is not `want.not` (by default: is set at all); returns it.
export async function timelineState(page, key, want = { not: '' }) {
  await page.waitForFunction(([k, w]) => {
    const v = document.querySelector('[data-testid=timeline]').dataset[k];
    return typeof w === 'string' ? v === w : v !== undefined && v !== '' && v !== w.not;
  }, [key, want], { timeout: 10000 });
  return page.getAttribute('[data-testid=timeline]', `data-${key}`);
}
// After the next frame is drawn (the timeline draws in requestAnimationFrame).
export const frame = (page) => page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
export const viewOf = async (page) => ({
  x0: Number(await page.getAttribute('#view-range', 'data-x0')),
  x1: Number(await page.getAttribute('#view-range', 'data-x1')),
});

// The doctor's findings as `tensormem doctor ... --json` reports them.
export function cliDoctor(args) {
  return JSON.parse(execFileSync(bin, ['doctor', ...args, '--json'], { encoding: 'utf8', maxBuffer: 1 << 26 })).findings;
}
