// End-to-end tests of the page served by `tensormem serve`, in headless Chromium (playwright-core
// driving the system Chromium). Run by scripts/test-e2e.sh, which builds the page and the binary.
// Screenshots of every state land in target/e2e-screenshots/.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, writeFileSync, existsSync, utimesSync } from 'node:fs';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS } from './chromium.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const bin = process.env.TENSORMEM_BIN || join(root, 'target/release/tensormem');
const fixtures = process.env.TENSORMEM_FIXTURES || resolve(root, '../shared/fixtures/pytorch-snapshots');
const shots = join(root, 'target/e2e-screenshots');
const scratch = join(root, 'target/e2e-files');
mkdirSync(shots, { recursive: true });
mkdirSync(scratch, { recursive: true });

let server;
let baseUrl;
let browser;

function serve(args = []) {
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

async function newPage() {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 }, acceptDownloads: true });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.errors = errors;
  return page;
}

// Waits for the n-th `tensormem:painted` mark (one per newly loaded trace).
async function painted(page, n = 1) {
  await page.waitForFunction((k) => performance.getEntriesByName('tensormem:painted').length >= k, n, { timeout: 60000 });
}

async function peaks(page) {
  return {
    allocated: Number(await page.getAttribute('[data-testid=peak-allocated]', 'data-bytes')),
    reserved: Number(await page.getAttribute('[data-testid=peak-reserved]', 'data-bytes')),
  };
}

async function openFile(page, path, paints) {
  await page.setInputFiles('[data-testid=open-file]', path);
  await painted(page, paints);
}

// What the CLI reports as recorded, per device.
function cliPeaks(path) {
  const out = execFileSync(bin, ['replay', path, '--json'], { encoding: 'utf8', maxBuffer: 1 << 26 });
  return out.trim().split('\n').map((l) => JSON.parse(l)).map((r) => ({
    device: r.device, allocated: r.recorded.peak_allocated_bytes, reserved: r.recorded.peak_reserved_bytes,
  }));
}

// Fraction of the timeline canvas's pixels that are not blank.
async function inkedFraction(page) {
  return page.$eval('[data-testid=timeline]', (c) => {
    const { data } = c.getContext('2d').getImageData(0, 0, c.width, c.height);
    let inked = 0;
    for (let i = 3; i < data.length; i += 4 * 7) if (data[i] > 0) inked++;
    return inked / (data.length / (4 * 7));
  });
}

// Colours the timeline by `by` (recorded, inferred or frame) and waits for the legend to say so.
const LEGEND_CAPTION = { recorded: 'category (recorded):', inferred: 'category (inferred):', frame: 'stack frame:' };
async function colorBy(page, by) {
  await page.selectOption('[data-testid=color-by]', by);
  await page.waitForFunction((text) => document.querySelector('[data-testid=legend-caption]')?.textContent === text, LEGEND_CAPTION[by]);
}

test('the default page runs the default scenario and draws its timeline', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  const p = await peaks(page);
  assert.ok(p.allocated > 0 && p.reserved >= p.allocated, JSON.stringify(p));
  assert.ok(await inkedFraction(page) > 0.1, 'the timeline has bands');
  assert.equal(await page.isVisible('[data-testid=error]'), false);
  // Hovering a band names it.
  const box = await page.locator('[data-testid=timeline]').boundingBox();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height - 40);
  await page.waitForSelector('#tooltip:not([hidden])');
  assert.match(await page.textContent('#tooltip'), /MiB|KiB/);
  await page.mouse.click(box.x + box.width * 0.5, box.y + box.height - 40);
  // The worker answers which band was clicked; the details follow.
  await page.waitForFunction(() => /address/.test(document.querySelector('#details').textContent), null, { timeout: 5000 });
  assert.match(await page.textContent('#details'), /address/);
  await page.screenshot({ path: join(shots, 'default-scenario.png'), fullPage: true });
  // tensormem's own traces carry time: modelled on the simulated card, and said so.
  assert.match(await page.textContent('#trace-settings'), /time modelled on sim \(H100-80GB\)/);
  await page.selectOption('#axis-select', 'time');
  await page.waitForTimeout(100);
  assert.equal(await page.$eval('#axis-select', (s) => s.value), 'time');
  await page.locator('[data-testid=timeline]').screenshot({ path: join(shots, 'default-scenario-time-axis.png') });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('every fixture loads and shows the peaks the CLI reports', async () => {
  const files = readdirSync(fixtures).filter((f) => /\.(pickle|json)$/.test(f)).sort();
  assert.ok(files.length >= 7, `fixtures in ${fixtures}`);
  const page = await newPage();
  await page.goto(baseUrl);
  let paints = await painted(page).then(() => 1);
  for (const f of files) {
    const path = join(fixtures, f);
    const expected = cliPeaks(path);
    // A file with several devices opens on the one the doctor diagnoses unless told (the one
    // with an out-of-memory entry, else the one that reserved the most).
    const opened = expected.length > 1 ? cliDoctor([path])[0].evidence.device : expected[0].device;
    const order = [expected.find((d) => d.device === opened), ...expected.filter((d) => d.device !== opened)];
    paints += 1;
    await openFile(page, path, paints);
    const shown = await peaks(page);
    assert.deepEqual(shown, { allocated: order[0].allocated, reserved: order[0].reserved }, f);
    assert.equal(await page.isVisible('[data-testid=error]'), false, f);
    assert.equal(await page.textContent('#source-name'), f);
    assert.match(await page.textContent('#trace-settings'), new RegExp(`^device ${opened} `), f);
    await page.screenshot({ path: join(shots, `fixture-${f}.png`) });
    // A multi-device file switches devices, and each device shows its own peaks.
    if (expected.length > 1) {
      assert.equal(await page.isVisible('[data-testid=device-select]'), true, f);
      assert.equal(await page.$eval('[data-testid=device-select]', (s) => s.value), String(opened), f);
      if (f === 'expandable-3gpu-oom.pickle') {
        // Device 1 ran out of memory: the page opens on it, and says so in the device list, in a
        // warning, and on the timeline.
        assert.equal(opened, 1);
        assert.match(await page.textContent('[data-testid=device-select] option[value="1"]'), /out of memory/);
        assert.match(await page.textContent('#warnings'), /out-of-memory error at event \d+: out of memory: 4\.94 GiB requested with 91\.\d+ MiB free/);
      }
      for (const d of order.slice(1)) {
        paints += 1;
        await page.selectOption('[data-testid=device-select]', String(d.device));
        await painted(page, paints);
        assert.deepEqual(await peaks(page), { allocated: d.allocated, reserved: d.reserved }, `${f} device ${d.device}`);
      }
      await page.screenshot({ path: join(shots, `fixture-${f}-device-${order.at(-1).device}.png`) });
    }
  }
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a big file opened again is read back from the decode the browser kept, with the same peaks; a damaged one is parsed again', async () => {
  // 16 training steps of the LM scenario: a 19 MB pickle, over the 16 MiB worth keeping.
  const big = join(scratch, 'lm-train-16-steps.pickle');
  execFileSync(bin, ['run', 'lm-train', '--set', 'size=medium,steps=16', '--snapshot', big], { stdio: 'ignore' });
  assert.ok(readFileSync(big).length >= 16 << 20);
  const expected = cliPeaks(big)[0];
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page, 1);
  const opened = async (paints) => {
    await openFile(page, big, paints);
    assert.deepEqual(await peaks(page), { allocated: expected.allocated, reserved: expected.reserved });
    return page.getAttribute('#source-name', 'data-reopened');
  };
  // Every progress line shown, to check what a big file's reading says.
  await page.evaluate(() => {
    window.__progressTexts = [];
    new MutationObserver((records) => records.forEach((r) => r.addedNodes.forEach((n) => window.__progressTexts.push(n.textContent))))
      .observe(document.querySelector('#progress-text'), { childList: true });
  });
  assert.equal(await opened(2), 'false');
  const said = await page.evaluate(() => window.__progressTexts);
  assert.ok(said.some((t) => /^reading lm-train-16-steps\.pickle: [\d.]+ of 1\d\.\d MB, [\d,]+ trace entries decoded$/.test(t)), said.join('\n'));
  assert.equal(await opened(3), 'true');
  assert.ok((await page.evaluate(() => window.__progressTexts)).some((t) => /^reading back the decode of lm-train-16-steps\.pickle kept by this browser$/.test(t)));
  assert.match(await page.getAttribute('#source-name', 'title'), /read back from the decode this browser kept/);
  // Another file between: still kept.
  await openFile(page, join(fixtures, 'tiny-settings.pickle'), 4);
  assert.equal(await page.getAttribute('#source-name', 'data-reopened'), 'false');
  assert.equal(await opened(5), 'true');
  // A kept decode cut short (a browser killed while writing it) is never used: parsed again.
  const cut = await page.evaluate(async () => {
    const db = await new Promise((ok, fail) => { const r = indexedDB.open('tensormem'); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
    const store = db.transaction('decoded', 'readwrite').objectStore('decoded');
    const keys = await new Promise((ok) => { store.getAllKeys().onsuccess = (e) => ok(e.target.result); });
    const tx = db.transaction('decoded', 'readwrite');
    for (const k of keys) tx.objectStore('decoded').put(new Blob([new Uint8Array(1000)]), k);
    await new Promise((ok) => { tx.oncomplete = ok; });
    db.close();
    return keys.length;
  });
  assert.equal(cut, 1);
  assert.equal(await opened(6), 'false');
  assert.equal(await opened(7), 'true');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a big file opened again shows its last view at once, and one changed in place (same name, size and time) is parsed again', async () => {
  const big = join(scratch, 'lm-train-16-steps.pickle');
  if (!existsSync(big)) execFileSync(bin, ['run', 'lm-train', '--set', 'size=medium,steps=16', '--snapshot', big], { stdio: 'ignore' });
  const changing = join(scratch, 'changed-in-place.pickle');
  writeFileSync(changing, readFileSync(big));
  // A whole second: the time the browser reads back is the same after each edit below.
  const seconds = Math.floor(Date.now() / 1000) - 60;
  utimesSync(changing, seconds, seconds);
  const expected = cliPeaks(big)[0];
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page, 1);
  const marks = (name) => page.evaluate((n) => performance.getEntriesByName(`tensormem:${n}`).length, name);
  await openFile(page, changing, 2);
  assert.equal(await marks('preview'), 0);
  // The view kept once drawn: the second open shows it before the kept decode is read back.
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 2, null, { timeout: 60000 });
  await openFile(page, changing, 3);
  assert.equal(await marks('preview'), 1);
  assert.equal(await page.getAttribute('#source-name', 'data-reopened'), 'true');
  assert.deepEqual(await peaks(page), { allocated: expected.allocated, reserved: expected.reserved });
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 3, null, { timeout: 60000 });
  // The same file edited in place, its size and modification time kept: read back at first (only
  // its hash tells), then found changed once hashed, and parsed again.
  const bytes = readFileSync(changing);
  const at = bytes.indexOf('src/nn/lm.rs');
  assert.ok(at > 0);
  bytes[at + 'src/nn/l'.length] = 'x'.charCodeAt(0);
  writeFileSync(changing, bytes);
  utimesSync(changing, seconds, seconds);
  await openFile(page, changing, 5);
  assert.equal(await page.getAttribute('#source-name', 'data-reopened'), 'false');
  assert.deepEqual(await peaks(page), { allocated: expected.allocated, reserved: expected.reserved });
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 4, null, { timeout: 60000 });
  assert.match(await page.textContent('#diagnosis-status'), /problem|no problem/);
  // The trace read back from the old bytes was drawn (the 4th paint) but never diagnosed.
  assert.equal(await marks('diagnosed'), 4);
  // Parsed, its decode kept anew: the next open reads it back, the hash agreeing.
  await openFile(page, changing, 6);
  assert.equal(await page.getAttribute('#source-name', 'data-reopened'), 'true');
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 5, null, { timeout: 60000 });
  // Its kept decode damaged and the file itself broken in place: the preview is shown, then
  // withdrawn when neither can be read, and the trace shown before comes back.
  await page.evaluate(async () => {
    const db = await new Promise((ok, fail) => { const r = indexedDB.open('tensormem'); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
    const keys = await new Promise((ok) => { db.transaction('decoded').objectStore('decoded').getAllKeys().onsuccess = (e) => ok(e.target.result); });
    const tx = db.transaction('decoded', 'readwrite');
    for (const k of keys) tx.objectStore('decoded').put(new Blob([new Uint8Array(1000)]), k);
    await new Promise((ok) => { tx.oncomplete = ok; });
    db.close();
  });
  const previews = await marks('preview');
  writeFileSync(changing, Buffer.alloc(bytes.length));
  utimesSync(changing, seconds, seconds);
  await page.setInputFiles('[data-testid=open-file]', changing);
  await page.waitForSelector('[data-testid=error]:not([hidden])', { timeout: 60000 });
  assert.equal(await marks('preview'), previews + 1);
  assert.match(await page.textContent('[data-testid=error]'), /Still showing changed-in-place\.pickle/);
  await page.screenshot({ path: join(shots, 'reopen-preview-withdrawn.png') });
  assert.ok(await page.evaluate(() => window.__tensormem.timeline.data !== null && !window.__tensormem.timeline.preview));
  assert.deepEqual(await peaks(page), { allocated: expected.allocated, reserved: expected.reserved });
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 6, null, { timeout: 60000 });
  // A preview abandoned for a newer file that fails: withdrawn all the same.
  writeFileSync(changing, readFileSync(big));
  utimesSync(changing, seconds, seconds);
  await openFile(page, changing, 7);
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 7, null, { timeout: 60000 });
  const notes = join(scratch, 'not-a-snapshot.txt');
  writeFileSync(notes, 'these are my notes, not a snapshot\n');
  await page.setInputFiles('[data-testid=open-file]', changing);
  await page.waitForFunction((n) => performance.getEntriesByName('tensormem:preview').length >= n, previews + 2, { timeout: 60000 });
  await page.setInputFiles('[data-testid=open-file]', notes);
  await page.waitForSelector('[data-testid=error]:not([hidden])', { timeout: 60000 });
  await page.waitForFunction(() => window.__tensormem.timeline.data !== null && !window.__tensormem.timeline.preview, null, { timeout: 60000 });
  assert.deepEqual(await peaks(page), { allocated: expected.allocated, reserved: expected.reserved });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a truncated file and a non-pickle show an error, and the next file still loads', async () => {
  const good = join(fixtures, 'small-state.pickle');
  const bytes = readFileSync(good);
  const truncated = join(scratch, 'truncated.pickle');
  writeFileSync(truncated, bytes.subarray(0, Math.floor(bytes.length / 2)));
  const notPickle = join(scratch, 'notes.txt');
  writeFileSync(notPickle, 'these are my notes, not a snapshot\n');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  for (const [path, pattern] of [[truncated, /truncated|end of (the )?(data|file|input)|unexpected end/i], [notPickle, /not a snapshot|expected a pickle/i]]) {
    await page.setInputFiles('[data-testid=open-file]', path);
    await page.waitForSelector('[data-testid=error]:not([hidden])');
    assert.match(await page.textContent('[data-testid=error]'), pattern);
    await page.screenshot({ path: join(shots, `error-${path.split('/').pop()}.png`) });
  }
  await openFile(page, good, 2);
  assert.equal(await page.isVisible('[data-testid=error]'), false);
  assert.deepEqual(await peaks(page), { allocated: cliPeaks(good)[0].allocated, reserved: cliPeaks(good)[0].reserved });
  // Two files chosen in quick succession: the last one chosen wins, even if the first, bigger
  // one finishes parsing later.
  const big = join(fixtures, 'gpt-medium-ctx128-training.pickle');
  const small = join(fixtures, 'tiny-settings.pickle');
  await page.setInputFiles('[data-testid=open-file]', big);
  await page.setInputFiles('[data-testid=open-file]', small);
  await page.waitForFunction(() => document.querySelector('#source-name').textContent === 'tiny-settings.pickle');
  await page.waitForTimeout(1500);
  assert.equal(await page.textContent('#source-name'), 'tiny-settings.pickle');
  assert.equal(Number(await page.getAttribute('[data-testid=peak-reserved]', 'data-bytes')), cliPeaks(small)[0].reserved);
  await page.close();
});

test('a scenario run with changed parameters shows what tensormem run --json reports', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.selectOption('[data-testid=scenario-select]', 'variable-batch');
  await page.fill('input[data-param=layers]', '4');
  await page.fill('input[data-param=batches]', '32,31,40,36');
  await page.selectOption('#variant-select', 'fix');
  await page.selectOption('#card-select', 'T4-16GB');
  await page.click('[data-testid=run-scenario]');
  await painted(page, 2);
  const shown = JSON.parse(await page.getAttribute('#scenario-result', 'data-run'));
  const cli = JSON.parse(execFileSync(bin, ['run', 'variable-batch', '--variant', 'fix', '--set', 'layers=4', '--set', 'batches=32,31,40,36',
    '--device', 'sim:T4-16GB', '--json'], { encoding: 'utf8' }));
  for (const key of ['scenario', 'variant', 'device', 'parameters', 'steps', 'peak_allocated_bytes', 'peak_reserved_bytes', 'explanation']) {
    assert.deepEqual(shown[key], cli[key], key);
  }
  assert.equal(Number(await page.getAttribute('[data-testid=scenario-peak-allocated]', 'data-bytes')), cli.peak_allocated_bytes);
  assert.equal(Number(await page.getAttribute('[data-testid=scenario-peak-reserved]', 'data-bytes')), cli.peak_reserved_bytes);
  assert.equal(await page.locator('[data-testid=scenario-steps] tr').count(), cli.steps.length + 1);
  await page.screenshot({ path: join(shots, 'scenario-run.png'), fullPage: true });
  await page.close();
});

test('a training scenario run from the page matches tensormem run, with its choices and flags as lists', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.selectOption('[data-testid=scenario-select]', 'lm-train');
  assert.deepEqual(await page.locator('select[data-param=size] option').allTextContents(), ['small', 'medium', 'large', 'xl', '2.7b']);
  await page.selectOption('select[data-param=size]', 'small');
  await page.fill('input[data-param=batch]', '2');
  await page.selectOption('select[data-param=checkpointing]', 'true');
  await page.selectOption('#card-select', 'A100-40GB');
  await page.click('[data-testid=run-scenario]');
  await painted(page, 2);
  const shown = JSON.parse(await page.getAttribute('#scenario-result', 'data-run'));
  const cli = JSON.parse(execFileSync(bin, ['run', 'lm-train', '--set', 'size=small,batch=2,checkpointing=true', '--device', 'sim:A100-40GB', '--json'],
    { encoding: 'utf8' }));
  for (const key of ['scenario', 'parameters', 'model_parameters', 'steps', 'peak_allocated_bytes', 'peak_reserved_bytes', 'explanation']) {
    assert.deepEqual(shown[key], cli[key], key);
  }
  assert.equal(Number(await page.getAttribute('[data-testid=scenario-peak-allocated]', 'data-bytes')), cli.peak_allocated_bytes);
  // The timeline counts what the tensors requested, as a PyTorch trace does: a little less than
  // whole blocks.
  const requested = Number(await page.getAttribute('[data-testid=peak-allocated]', 'data-bytes'));
  assert.ok(requested <= cli.peak_allocated_bytes && requested > 0.98 * cli.peak_allocated_bytes, `${requested}`);
  await page.screenshot({ path: join(shots, 'scenario-lm-train.png'), fullPage: true });
  await page.close();
});

test('a scenario runs on this browser\'s WebGPU adapter and allocates exactly as on the simulated card', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  // The default scenario's trace says what its memory is for: the legend shows categories.
  const legend = page.locator('#legend button[data-category=true]');
  assert.deepEqual((await legend.allTextContents()).map((t) => t.split(' ')[0]).sort(), ['input', 'parameter']);
  await page.selectOption('[data-testid=scenario-select]', 'variable-batch');
  for (const [name, value] of [['layers', '2'], ['hidden', '64'], ['seq', '8'], ['batches', '4,5,3,6']]) {
    await page.fill(`input[data-param=${name}]`, value);
  }
  await page.selectOption('#variant-select', 'mistake');
  await page.selectOption('#card-select', 'gpu');
  await page.click('[data-testid=run-scenario]');
  await painted(page, 2);
  const shown = JSON.parse(await page.getAttribute('#scenario-result', 'data-run'));
  assert.match(shown.device, /^gpu \(/);
  const cli = JSON.parse(execFileSync(bin, ['run', 'variable-batch', '--set', 'layers=2', '--set', 'hidden=64', '--set', 'seq=8',
    '--set', 'batches=4,5,3,6', '--device', 'sim:H100-80GB', '--json'], { encoding: 'utf8' }));
  for (const key of ['scenario', 'variant', 'parameters', 'steps', 'peak_allocated_bytes', 'peak_reserved_bytes']) {
    assert.deepEqual(shown[key], cli[key], key);
  }
  assert.equal(Number(await page.getAttribute('[data-testid=peak-allocated]', 'data-bytes')), cli.peak_allocated_bytes);
  await page.screenshot({ path: join(shots, 'scenario-webgpu.png'), fullPage: true });
  // Expandable segments need virtual memory mapping, which WebGPU lacks: said, and the page stays.
  await page.selectOption('#variant-select', 'fix');
  await page.click('[data-testid=run-scenario]');
  await page.waitForSelector('[data-testid=error]:visible');
  assert.match(await page.textContent('[data-testid=error]'), /expandable_segments needs virtual memory mapping/);
  // The GPU run stays on screen.
  assert.equal(Number(await page.getAttribute('[data-testid=peak-allocated]', 'data-bytes')), cli.peak_allocated_bytes);
  assert.match(JSON.parse(await page.getAttribute('#scenario-result', 'data-run')).device, /^gpu \(/);
  await page.close();
});

test('an exported snapshot reloads with the same peaks, as pickle and as JSON', async () => {
  const source = join(fixtures, 'gpt-ctx128-forward.pickle');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await openFile(page, source, 2);
  const before = await peaks(page);
  let paints = 2;
  for (const button of ['#export-pickle', '#export-json']) {
    const [download] = await Promise.all([page.waitForEvent('download'), page.click(button)]);
    const saved = join(scratch, download.suggestedFilename());
    await download.saveAs(saved);
    assert.ok(existsSync(saved));
    paints += 1;
    await openFile(page, saved, paints);
    assert.deepEqual(await peaks(page), before, button);
    // The CLI reads the export the same way.
    assert.deepEqual(cliPeaks(saved).map((d) => ({ allocated: d.allocated, reserved: d.reserved }))[0], before, button);
  }
  await page.close();
});

test('the Python wheel serves the page with a snapshot loaded (tensormem.serve, as tensormem.show does)', async () => {
  // scripts/test-python.sh installs the wheel here (the python suite runs before this one).
  const python = join(root, 'target/python-test-venv/bin/python');
  if (!existsSync(python)) {
    assert.notEqual(process.env.CI, 'true', `no wheel installed at ${python}: run scripts/test-python.sh first`);
    console.log(`SKIPPED page_wheel_serve: no wheel installed at ${python} (scripts/test-python.sh installs it)`);
    return;
  }
  const file = join(fixtures, 'gpt-medium-ctx128-training.pickle');
  const script = 'import sys, time, tensormem; print(tensormem.serve(sys.argv[1]), flush=True); time.sleep(3600)';
  // Its own process group: the server it starts goes with it.
  const child = spawn(python, ['-c', script, file], { cwd: scratch, detached: true, stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    child.stdout.setEncoding('utf8');
    const url = await new Promise((ok, fail) => {
      child.stdout.once('data', (line) => ok(line.trim()));
      child.once('exit', (code) => fail(new Error(`python exited with ${code}`)));
    });
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/\?file=\/snapshot\/gpt-medium-ctx128-training\.pickle$/);
    const page = await newPage();
    await page.goto(url);
    await painted(page);
    assert.deepEqual(await peaks(page), { allocated: cliPeaks(file)[0].allocated, reserved: cliPeaks(file)[0].reserved });
    await page.screenshot({ path: join(shots, 'wheel-serve.png') });
    assert.deepEqual(page.errors, []);
    await page.close();
  } finally {
    process.kill(-child.pid, 'SIGTERM');
  }
});

test('tensormem serve FILE opens the page with that snapshot loaded, and what-if replays it', async () => {
  const file = join(fixtures, 'gpt-medium-ctx128-training.pickle');
  const { child, url } = await serve([file]);
  try {
    assert.match(url, /\?file=\/snapshot\/gpt-medium-ctx128-training\.pickle$/);
    const page = await newPage();
    await page.goto(url);
    await painted(page);
    assert.deepEqual(await peaks(page), { allocated: cliPeaks(file)[0].allocated, reserved: cliPeaks(file)[0].reserved });
    assert.match(await page.textContent('#warnings'), /does not start at the beginning/);
    // Coloured by stack frame, the legend names the groups, biggest at the peak first.
    await colorBy(page, 'frame');
    assert.match(await page.textContent('#legend button'), /^\(allocated before the trace, no stack\) 1\.59 GiB at peak · 226 allocs/);
    assert.match(await page.textContent('#legend'), /step \(cs336_basics\/optimizer\.py:74\) 1\.54 GiB at peak/);
    // The record_function scope of the optimizer step is drawn, and named on hover.
    const span = await page.evaluate(() => {
      const t = window.__tensormem.timeline;
      const b = t.spanBox(t.data.meta.spans[0]);
      const r = t.canvas.getBoundingClientRect();
      return { x: r.left + (b.left + b.right) / 2, y: r.top + b.top + 2 };
    });
    await page.mouse.move(span.x, span.y);
    await page.waitForSelector('#tooltip:not([hidden])');
    assert.match(await page.textContent('#tooltip'), /Optimizer\.step#AdamW\.step/);
    // What is live at the peak, by stack: the user's outermost Python frame carries most of it.
    await page.locator('#icicle').scrollIntoViewIfNeeded();
    const icicle = await page.locator('#icicle').boundingBox();
    assert.ok(icicle.height >= 5 * 20, `${icicle.height}`);
    await page.mouse.move(icicle.x + 100, icicle.y + 30);
    await page.waitForSelector('#icicle-tooltip:not([hidden])');
    assert.match(await page.textContent('#icicle-tooltip'), /<module> \(cs336_systems\/nsys_profile\.py:249\): 3\.\d+ GiB/);
    // By module scope: the lines that called each nn.Module, outermost first.
    await page.selectOption('#icicle-by', 'module');
    await page.waitForFunction(() => /by module scope/.test(document.querySelector('#icicle-title').textContent));
    const scopes = await page.evaluate(() => {
      const labels = (node, depth) => (depth === 0 ? [node.label] : [...node.children.values()].flatMap((c) => labels(c, depth - 1)));
      return labels(window.__tensormem.icicle.root, 3);
    });
    assert.ok(scopes.some((l) => /^forward \(cs336_basics\/model\.py:\d+\)$/.test(l)), JSON.stringify(scopes));
    assert.ok((await page.evaluate(() => [...window.__tensormem.icicle.root.children.values()].map((c) => c.label))).some((l) => /^memory_profile \(cs336_systems\/nsys_profile\.py:142\)$/.test(l)));
    await page.locator('#icicle-card').screenshot({ path: join(shots, 'icicle-module-scope.png') });
    // The allocator's state at the peak: its segments, and what is cached free.
    await page.waitForFunction(() => /segments/.test(document.querySelector('#state-figures').textContent));
    assert.match(await page.textContent('#state-figures'), /^\d+ segments, 6\.74 GiB reserved: 6\.53 GiB requested by live tensors, .* cached free \(largest block .*fragmentation \d+%, the share of free bytes outside the largest free block\)/);
    assert.match(await page.textContent('#summary'), /PyTorch CUDA memory summary/);
    // Search: only the optimizer's allocations, then only the big ones; hidden ones are counted.
    const total = Number((await page.textContent('#filter-count')).replace(/\D/g, ''));
    assert.equal(total, 7190);
    await page.fill('#filter-text', 'optimizer.py');
    await page.waitForFunction(() => /hidden/.test(document.querySelector('#filter-count').textContent));
    const [shown, of, hidden] = (await page.textContent('#filter-count')).match(/[\d,]+/g).map((n) => Number(n.replace(/,/g, '')));
    assert.equal(of, total);
    assert.equal(shown + hidden, total);
    assert.ok(shown > 0 && hidden > 0);
    // The largest allocation still shown has optimizer.py in its stack.
    await page.click('#live tr[data-alloc]');
    assert.match(await page.textContent('#details .stack'), /optimizer\.py/);
    assert.match(await page.textContent('#live'), /hidden by the filter/);
    await page.fill('#filter-min', '30MiB');
    await page.waitForFunction((n) => !document.querySelector('#filter-count').textContent.startsWith(`showing ${n.toLocaleString('en-US')} `), shown);
    for (const size of await page.locator('#live tr[data-alloc] td.num').allTextContents()) {
      assert.ok(/GiB/.test(size) || Number(size.split(' ')[0]) >= 30, size);
    }
    await page.fill('#filter-max', 'lots');
    await page.waitForSelector('#filter-max.bad');
    await page.screenshot({ path: join(shots, 'filtered.png') });
    for (const id of ['#filter-text', '#filter-min', '#filter-max']) await page.fill(id, '');
    await page.waitForFunction(() => !/hidden/.test(document.querySelector('#filter-count').textContent));

    // A 6.4 GiB card from a replaced start: the trace runs out of memory (6.6 GiB is enough once
    // the cached segments are released and the request retried).
    await page.fill('#whatif-capacity', '6.4GiB');
    await page.selectOption('#whatif-start', 'replaced');
    await page.click('#whatif-run');
    await page.waitForSelector('#whatif-result table');
    assert.match(await page.textContent('#whatif-result'), /would have stopped with "CUDA out of memory" at event \d+/);
    assert.match(await page.textContent('#whatif-result'), /PyTorch CUDA memory summary/);
    await page.screenshot({ path: join(shots, 'whatif-capacity.png'), fullPage: true });
    // Expandable segments reserve less than the recorded run.
    await page.fill('#whatif-capacity', '');
    await page.fill('#whatif-conf', 'expandable_segments:True');
    await page.click('#whatif-run');
    await page.waitForFunction(() => /expandable_segments:True/.test(document.querySelector('#whatif-result').textContent));
    const whatIf = Number(await page.getAttribute('[data-testid=whatif-peak-reserved]', 'data-bytes'));
    assert.ok(whatIf < (await peaks(page)).reserved, `${whatIf}`);
    // Compare the trace with its what-if run: B's peak is the what-if's, and the what-if trace
    // can be saved and read back by the CLI with the same peak.
    await page.click('#compare-whatif');
    await page.waitForSelector('[data-testid=compare-peak-reserved]');
    assert.equal(Number(await page.getAttribute('[data-testid=compare-peak-reserved]', 'data-bytes')), whatIf);
    // The what-if run has the file's events, plus the segment calls its own allocator made (the
    // recording had every segment already reserved), so the curves line up.
    const [eventsA, eventsB] = (await page.locator('.compare-figures tr:nth-child(4) td.num').allTextContents()).map((t) => Number(t.replace(/,/g, '')));
    assert.equal(eventsA, 19136);
    assert.ok(eventsB >= eventsA && eventsB - eventsA < 200, `${eventsB}`);
    assert.match(await page.textContent('#compare-result'), /same bytes are live at both peaks|Where the peaks differ/);
    assert.equal(await page.isVisible('#export-other'), true);
    const [download] = await Promise.all([page.waitForEvent('download'), page.click('#export-other')]);
    const saved = join(scratch, 'what-if.pickle');
    await download.saveAs(saved);
    assert.equal(cliPeaks(saved)[0].reserved, whatIf);
    await page.locator('#compare-card').screenshot({ path: join(shots, 'compare-what-if.png') });
    // Compare with another file: its peaks, and where the peaks differ.
    const otherFile = join(fixtures, 'gpt-ctx128-forward.pickle');
    await page.setInputFiles('#compare-file', otherFile);
    await page.waitForFunction(() => /gpt-ctx128-forward/.test(document.querySelector('#compare-result').textContent));
    assert.equal(Number(await page.getAttribute('[data-testid=compare-peak-allocated]', 'data-bytes')), cliPeaks(otherFile)[0].allocated);
    assert.ok(await page.locator('[data-testid=compare-attribution] tr').count() > 2);
    await page.locator('#compare-card').screenshot({ path: join(shots, 'compare-files.png') });

    // A bad setting is a clear error, and the page keeps its trace.
    await page.fill('#whatif-conf', 'expandable_segments:Maybe');
    await page.click('#whatif-run');
    await page.waitForSelector('[data-testid=error]:not([hidden])');
    assert.match(await page.textContent('[data-testid=error]'), /expandable_segments/);
    assert.deepEqual(page.errors, []);
    await page.close();
  } finally {
    child.kill();
  }
});

// Waits until the timeline canvas's data- attribute `key` (cursor, selected, pinned) is `want`
// (a string), or is set and is not `want.not` (by default: is set at all); returns it.
async function timelineState(page, key, want = { not: '' }) {
  await page.waitForFunction(([k, w]) => {
    const v = document.querySelector('[data-testid=timeline]').dataset[k];
    return typeof w === 'string' ? v === w : v !== undefined && v !== '' && v !== w.not;
  }, [key, want], { timeout: 10000 });
  return page.getAttribute('[data-testid=timeline]', `data-${key}`);
}
// After the next frame is drawn (the timeline draws in requestAnimationFrame).
const frame = (page) => page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
const viewOf = async (page) => ({
  x0: Number(await page.getAttribute('#view-range', 'data-x0')),
  x1: Number(await page.getAttribute('#view-range', 'data-x1')),
});

test('a state with private pools (vLLM\'s, in an RL worker) shows each pool, what it reserves, and draws one pool at a time', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await openFile(page, join(root, 'tests/data/real/verl-mem.pickle'), 2);
  await page.waitForFunction(() => /Private pools/.test(document.querySelector('#state-figures').textContent));
  // 68 of the 127 segments are in pools (0,1) and (0,2), as the snapshot's segment_pool_id says.
  assert.match(await page.textContent('#state-figures'), /^127 segments, 24\.39 GiB reserved: .* Private pools \(CUDA graphs, MemPool\) hold 20\.84 GiB: pool \(0,2\) 20\.30 GiB in 24 segments, pool \(0,1\) 558\.00 MiB in 44 segments \(82\.55 MiB cached free\)\. A pool's free blocks serve only what is allocated into that pool\.$/);
  assert.equal(await page.isVisible('[data-testid=pool-filter]'), true);
  const height = () => page.$eval('#segments', (c) => c.getBoundingClientRect().height);
  const all = await height();
  await page.selectOption('[data-testid=pool-filter]', '0,2');
  await page.waitForFunction((h) => document.querySelector('#segments').getBoundingClientRect().height < h, all);
  // 24 rows of 18 px, and the 4 px margin.
  assert.equal(await height(), 24 * 18 + 4);
  await page.locator('#state-card').screenshot({ path: join(shots, 'private-pools.png') });
  await page.selectOption('[data-testid=pool-filter]', '0,0');
  await page.waitForFunction(() => document.querySelector('#segments').getBoundingClientRect().height === 59 * 18 + 4);
  // A file without private pools hides the choice.
  await openFile(page, join(fixtures, 'gpt-medium-ctx128-training.pickle'), 3);
  await page.waitForFunction(() => !/Private pools/.test(document.querySelector('#state-figures').textContent) && /segments/.test(document.querySelector('#state-figures').textContent));
  assert.equal(await page.isVisible('[data-testid=pool-filter]'), false);
  assert.deepEqual(page.errors, []);
});

test('the timeline is driven by keyboard: the cursor, the bands at it, zoom and pinning', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  // The progress bar says what it is to assistive technology.
  assert.equal(await page.getAttribute('#progress', 'role'), 'progressbar');
  assert.equal(await page.getAttribute('#progress', 'aria-valuemin'), '0');
  assert.equal(await page.getAttribute('#progress', 'aria-valuemax'), '100');
  assert.match(await page.getAttribute('#progress', 'aria-valuenow'), /^\d+$/);
  await page.waitForFunction(() => /^after event \d+$/.test(document.querySelector('#cursor-label').textContent));

  // Tab reaches the timeline from the control before it, and the focus shows.
  await page.focus('#filter-range');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.dataset.testid), 'timeline');
  const ring = await page.$eval('[data-testid=timeline]', (c) => {
    const s = getComputedStyle(c);
    return { focusVisible: c.matches(':focus-visible'), style: s.outlineStyle, width: parseFloat(s.outlineWidth) };
  });
  assert.deepEqual([ring.focusVisible, ring.style], [true, 'solid']);
  assert.ok(ring.width >= 2, JSON.stringify(ring));
  const peak = Number(await timelineState(page, 'cursor'));
  const events = await page.evaluate(() => window.__tensormem.timeline.positions - 1);
  assert.ok(peak > 0 && peak <= events, `${peak} of ${events}`);
  const arrays = (id) => page.evaluate((i) => {
    const a = window.__tensormem.timeline.data.arrays;
    return { size: a.allocSize[i], addr: a.allocAddr[i], start: a.allocStart[i], end: a.allocEnd[i] };
  }, id);

  // ↑ picks the bottom band at the cursor, ↑ again the one above it, ↓ comes back: each is
  // outlined, described beside the cursor and announced.
  assert.equal(await page.getAttribute('[data-testid=timeline]', 'data-selected'), '');
  await page.keyboard.press('ArrowUp');
  const bottom = Number(await timelineState(page, 'selected'));
  await page.waitForSelector('#tooltip:not([hidden])');
  assert.match(await page.textContent('#tooltip'), /\d (B|KiB|MiB|GiB) · /);
  assert.match(await page.textContent('#timeline-status'), /\d (B|KiB|MiB|GiB) · .*address 0x/);
  const b = await arrays(bottom);
  assert.ok(b.start <= peak && peak < b.end, `band ${bottom} is live at the cursor`);
  await page.keyboard.press('ArrowUp');
  const above = Number(await timelineState(page, 'selected', { not: String(bottom) }));
  const a = await arrays(above);
  assert.ok(a.start <= peak && peak < a.end, `band ${above} is live at the cursor`);
  await page.keyboard.press('ArrowDown');
  await timelineState(page, 'selected', String(bottom));
  // Enter pins it: its details, and its address, in the panel; Escape unpins.
  await page.keyboard.press('Enter');
  await timelineState(page, 'pinned', String(bottom));
  await page.waitForFunction(() => /address/.test(document.querySelector('#details').textContent));
  assert.match(await page.textContent('#details'), new RegExp(`0x${b.addr.toString(16)}\\b`));
  assert.match(await page.textContent('#timeline-status'), /^Pinned: /);
  // The pinned band is outlined once its rectangles come from the worker (a request whose
  // payload once named the allocation `id`, the very key of the worker's replies, and was lost).
  await page.waitForFunction((id) => window.__tensormem.timeline.pieceCache.get(id)?.length > 0, bottom, { timeout: 5000 });
  await frame(page);
  await page.locator('.timeline-card').screenshot({ path: join(shots, 'timeline-keyboard-focus.png') });
  await page.keyboard.press('Escape');
  await timelineState(page, 'pinned', '');
  assert.match(await page.textContent('#details'), /Hover a band/);
  // Escape again lets the band go; Enter with none picked pins the top one at the cursor, and
  // Enter again unpins it.
  await page.keyboard.press('Escape');
  await timelineState(page, 'selected', '');
  await page.waitForSelector('#tooltip', { state: 'hidden' });
  await page.keyboard.press('Enter');
  const top = Number(await timelineState(page, 'pinned'));
  const t = await arrays(top);
  assert.ok(top !== bottom && t.start <= peak && peak < t.end, `band ${top} is live at the cursor`);
  await page.keyboard.press('Enter');
  await timelineState(page, 'pinned', '');

  // ←/→ move the cursor one event; the panels follow, and the band picked follows the cursor.
  await page.keyboard.press('ArrowLeft');
  await timelineState(page, 'cursor', String(peak - 1));
  await page.waitForFunction((p) => document.querySelector('#cursor-label').textContent === (p === 0 ? 'at the start of the trace' : `after event ${p - 1}`), peak - 1);
  assert.match(await page.textContent('#timeline-status'), /^Cursor (after event \d+|at the start of the trace): .* allocated, .* reserved\.$/);
  const followed = await page.getAttribute('[data-testid=timeline]', 'data-selected');
  if (followed !== '') {
    const f = await arrays(Number(followed));
    assert.ok(f.start <= peak - 1 && peak - 1 < f.end, `band ${followed} is live at the new cursor`);
  }
  await page.keyboard.press('ArrowRight');
  await page.keyboard.press('ArrowRight');
  await timelineState(page, 'cursor', String(Math.min(events, peak + 1)));
  // Home and End reach the ends; Shift+→ moves a tenth of the view at once.
  await page.keyboard.press('Home');
  await timelineState(page, 'cursor', '0');
  await page.waitForFunction(() => document.querySelector('#cursor-label').textContent === 'at the start of the trace');
  await page.keyboard.press('Shift+ArrowRight');
  const tenth = Number(await timelineState(page, 'cursor', { not: '0' }));
  assert.ok(tenth >= Math.floor(events / 10) - 1 && tenth <= Math.ceil(events / 10) + 1, `${tenth} of ${events}`);
  await page.keyboard.press('End');
  await timelineState(page, 'cursor', String(events));
  await page.waitForFunction((e) => document.querySelector('#cursor-label').textContent === `after event ${e - 1}`, events);

  // + and − zoom around the cursor, 0 resets; moving the cursor out of the view pans it.
  const full = await viewOf(page);
  assert.deepEqual(full, { x0: 0, x1: events + 1 });
  await page.keyboard.press('Home');
  await page.keyboard.press('+');
  await frame(page);
  assert.ok((await viewOf(page)).x1 < 0.7 * (events + 1));
  await page.keyboard.press('=');
  await frame(page);
  const zoomed = await viewOf(page);
  assert.ok(Math.abs((zoomed.x1 - zoomed.x0) - (events + 1) / 2.25) < 1e-6 * (events + 1), JSON.stringify(zoomed));
  assert.equal(zoomed.x0, 0);
  assert.match(await page.textContent('#view-range'), /^events 0 to [\d,]+ of [\d,]+ \(zoomed 2\.[23]×\)$/);
  await page.keyboard.press('-');
  await frame(page);
  const wider = await viewOf(page);
  assert.ok(wider.x1 - wider.x0 > zoomed.x1 - zoomed.x0 && wider.x1 - wider.x0 < events + 1, JSON.stringify(wider));
  await page.keyboard.press('End');
  await frame(page);
  const panned = await viewOf(page);
  assert.ok(Math.abs(panned.x1 - (events + 1)) < 1e-6 && Math.abs((panned.x1 - panned.x0) - (wider.x1 - wider.x0)) < 1e-6, JSON.stringify(panned));
  await page.keyboard.press('0');
  await frame(page);
  assert.deepEqual(await viewOf(page), full);
  assert.doesNotMatch(await page.textContent('#view-range'), /zoomed/);
  // The mouse still works beside the keyboard: a click places the cursor and pins.
  const box = await page.locator('[data-testid=timeline]').boundingBox();
  await page.mouse.click(box.x + box.width * 0.5, box.y + box.height - 40);
  await timelineState(page, 'pinned');
  assert.notEqual(await page.getAttribute('[data-testid=timeline]', 'data-cursor'), String(events));
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('the page hit-tests the bands itself, answering as the worker does; a band drawn as a ghost is not hit', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  const compared = await page.evaluate(async () => {
    const t = window.__tensormem.timeline;
    const p = t.plot;
    let hits = 0;
    const differ = [];
    for (let i = 0; i < 40; i++) {
      for (let j = 0; j < 24; j++) {
        const px = p.x + ((i + 0.5) / 40) * p.w;
        const py = p.y + ((j + 0.5) / 24) * p.h;
        const request = { pos: t.positionAt(t.xOfPx(px, p)), bytes: ((p.y + p.h - py) / p.h) * t.yMax(), slack: t.yMax() / p.h };
        const mine = await t.backend.hitTest(request);
        const worker = await window.__tensormem.ask('hitTest', { view: t.data.view, ...request });
        if (mine !== worker) differ.push({ ...request, mine, worker });
        if (mine !== null) hits++;
      }
    }
    // A band hit, its group hidden in the legend: drawn as a ghost, it is not hit any more.
    const x = p.x + p.w / 2;
    let at = null;
    for (let y = p.y + p.h - 1; y > p.y && at === null; y -= 2) {
      const id = await t.hitTest(x, y);
      if (id !== null) at = { y, id };
    }
    t.toggleGroup(t.data.arrays.allocGroup[at.id]);
    const hidden = await t.hitTest(x, at.y);
    t.toggleGroup(t.data.arrays.allocGroup[at.id]);
    return { hits, differ: differ.slice(0, 5), ghostHit: hidden === at.id, again: await t.hitTest(x, at.y) === at.id };
  });
  assert.deepEqual(compared.differ, []);
  assert.ok(compared.hits >= 100, `${compared.hits} points on a band`);
  assert.deepEqual([compared.ghostHit, compared.again], [false, true]);
});

test('names from a snapshot are shown as text, never run as markup', async () => {
  // A trace of tensormem's whose frames are renamed with HTML, and whose categories are dropped
  // so that its bands are grouped, and named, by those frames.
  const recorded = join(scratch, 'recorded.json');
  execFileSync(bin, ['run', 'seed-basics', '--snapshot', recorded], { stdio: 'ignore' });
  const snapshot = JSON.parse(readFileSync(recorded, 'utf8'));
  const markup = '<img src=x onerror="window.__injected=1">';
  let renamed = 0;
  const walk = (v) => {
    if (Array.isArray(v)) return v.forEach(walk);
    if (!v || typeof v !== 'object') return;
    delete v.category;
    if (Array.isArray(v.frames)) for (const f of v.frames) { f.name = `${markup}${f.name}`; renamed++; }
    Object.values(v).forEach(walk);
  };
  walk(snapshot);
  assert.ok(renamed > 0, 'the trace has frames');
  const path = join(scratch, 'markup.json');
  writeFileSync(path, JSON.stringify(snapshot));
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await openFile(page, path, 2);
  await page.waitForFunction(() => /^after event/.test(document.querySelector('#cursor-label').textContent));
  await colorBy(page, 'frame');
  assert.ok((await page.textContent('#legend')).includes(markup), await page.textContent('#legend'));
  assert.ok((await page.textContent('#live')).includes(markup));
  // The tooltip and the details panel, reached by keyboard.
  await page.focus('[data-testid=timeline]');
  await page.keyboard.press('ArrowDown');
  await page.waitForSelector('#tooltip:not([hidden])');
  assert.ok((await page.textContent('#tooltip')).includes(markup), await page.textContent('#tooltip'));
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => /address/.test(document.querySelector('#details').textContent));
  assert.ok((await page.textContent('#details')).includes(markup), await page.textContent('#details'));
  assert.ok((await page.textContent('#timeline-status')).includes(markup));
  // The doctor's findings name the same frames, unfolded: as text too.
  await page.waitForSelector('[data-testid=diagnosis][data-state=ready]', { timeout: 60000 });
  for (const toggle of await page.locator('.finding-toggle').all()) await toggle.click();
  assert.ok((await page.textContent('#diagnosis')).includes(markup), await page.textContent('#diagnosis'));
  await page.waitForTimeout(300);
  assert.equal(await page.locator('img').count(), 0, 'no element was made from a name');
  assert.equal(await page.evaluate(() => window.__injected), undefined);
  assert.deepEqual(page.errors, []);
  await page.close();
});

// ---- the Diagnosis panel (issue 23): the doctor's findings as cards above the timeline

// The doctor's findings as `tensormem doctor ... --json` reports them.
function cliDoctor(args) {
  return JSON.parse(execFileSync(bin, ['doctor', ...args, '--json'], { encoding: 'utf8', maxBuffer: 1 << 26 })).findings;
}
const kindsAndBytes = (findings) => findings.map((f) => ({ kind: f.kind, bytes: f.bytes }));

async function shownFindings(page) {
  await page.waitForSelector('[data-testid=diagnosis][data-state=ready]', { timeout: 60000 });
  return page.$$eval('[data-testid=finding]', (cards) => cards.map((c) => ({ kind: c.dataset.kind, bytes: Number(c.dataset.bytes) })));
}

// Where a finding's evidence puts it: what was live at its moment (the peak; the state just
// before a failed request), the position a fragmentation finding examined; a truncated trace: its start.
function evidencePosition(f) {
  const e = f.evidence;
  if (f.kind === 'peak') { assert.equal(e.live.position, e.event + 1); return e.live.position; }
  if (f.kind === 'oom') { assert.equal(e.live.position, e.event); return e.live.position; }
  if (f.kind === 'fragmentation') return e.position;
  if (f.kind === 'truncated-trace') return 0;
  throw new Error(`no position for ${f.kind}`);
}

// Activates a finding (a click, or Enter on its focused button) and checks the timeline: the
// cursor where the evidence says, the allocations it names outlined, the largest pinned and its
// stack in the details panel.
async function activateFinding(page, f, how) {
  const go = page.locator(`[data-testid=finding][data-kind=${f.kind}] .finding-go`);
  if (how === 'keyboard') {
    await go.focus();
    await page.keyboard.press('Enter');
  } else {
    await go.click();
  }
  await timelineState(page, 'cursor', String(evidencePosition(f)));
  const largest = f.evidence.live?.largest || [];
  if (!largest.length) {
    await timelineState(page, 'highlighted', '');
    return null;
  }
  const ids = (await timelineState(page, 'highlighted')).split(' ').map(Number);
  const outlined = await page.evaluate((list) => {
    const a = window.__tensormem.timeline.data.arrays;
    return list.map((i) => ({ trace_index: a.allocStart[i] === 0 ? null : a.allocStart[i] - 1, address: a.allocAddr[i], bytes: a.allocSize[i] }));
  }, ids);
  assert.deepEqual(outlined, largest.map(({ trace_index: t, address, bytes }) => ({ trace_index: t, address, bytes })), f.kind);
  await timelineState(page, 'pinned', String(ids[0]));
  const address = `0x${largest[0].address.toString(16)}`;
  await page.waitForFunction((text) => document.querySelector('#details').textContent.includes(text), address, { timeout: 5000 });
  const hasStack = await page.evaluate((i) => window.__tensormem.timeline.data.arrays.allocStack[i] !== 0xffffffff, ids[0]);
  if (hasStack) assert.ok(await page.locator('#details .stack').count() > 0, 'the details show the stack');
  // The outlines are drawn once the worker has sent their rectangles.
  await page.waitForFunction((list) => list.every((i) => window.__tensormem.timeline.pieceCache.get(i)?.length > 0), ids, { timeout: 5000 });
  await frame(page);
  return ids;
}

// The timeline stays on the first screen of a 1400 x 1000 window, under the panel.
async function timelineOnFirstScreen(page) {
  await page.evaluate(() => window.scrollTo(0, 0));
  const panel = await page.locator('[data-testid=diagnosis]').boundingBox();
  const box = await page.locator('[data-testid=timeline]').boundingBox();
  assert.ok(panel.y + panel.height <= box.y, 'the panel is above the timeline');
  assert.ok(box.y + box.height <= 1000, `the timeline ends at ${box.y + box.height} px`);
}

test('the Diagnosis panel shows the doctor\'s findings on a snapshot; a finding moves the cursor, outlines its allocations and shows the fix', async () => {
  const path = join(fixtures, 'small-state.pickle');
  const expected = cliDoctor([path, '--device', '0']);
  assert.deepEqual(expected.map((f) => f.kind).sort(), ['fragmentation', 'outside-allocator', 'peak']);
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await openFile(page, path, 2);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(expected));
  await timelineOnFirstScreen(page);
  await page.screenshot({ path: join(shots, 'diagnosis-small-state.png') });

  // Keyboard: Tab from the last control of the bar reaches the first finding; Enter activates it.
  await page.focus('#export-json');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.closest('[data-testid=finding]')?.dataset.kind), expected[0].kind);
  assert.equal(await page.evaluate(() => document.activeElement.matches(':focus-visible')), true);
  const first = await activateFinding(page, expected[0], 'keyboard');
  assert.match(await page.textContent('#timeline-status'), /Cursor after event \d+\./);
  const peak = expected.find((f) => f.kind === 'peak');
  if (peak !== expected[0]) await activateFinding(page, peak, 'click');
  else assert.ok(first && first.length > 0, 'the peak names its largest allocations');
  assert.equal(await page.getAttribute('[data-testid=finding][data-kind=peak]', 'class'), 'finding active');
  await page.locator('.timeline-card').screenshot({ path: join(shots, 'diagnosis-peak-on-timeline.png') });
  // On the timeline, Escape unpins, then clears the finding's outlines.
  await page.focus('[data-testid=timeline]');
  await page.keyboard.press('Escape');
  await timelineState(page, 'pinned', '');
  await page.keyboard.press('Escape');
  await timelineState(page, 'highlighted', '');
  assert.equal(await page.locator('[data-testid=finding].active').count(), 0);

  // Fragmentation: the cursor at the position examined; its why, fix and evidence unfold.
  const fragmentation = expected.find((f) => f.kind === 'fragmentation');
  await activateFinding(page, fragmentation, 'click');
  const card = page.locator('[data-testid=finding][data-kind=fragmentation]');
  await card.locator('.finding-toggle').click();
  assert.equal(await card.locator('.finding-toggle').getAttribute('aria-expanded'), 'true');
  assert.ok((await card.locator('.finding-why').textContent()).includes(fragmentation.why));
  assert.ok((await card.locator('.finding-fix').textContent()).includes(fragmentation.fix));

  // "show the fix": the what-if replay with the verified settings, its reserved curve beside the
  // recorded one, and the peak the doctor measured.
  const v = fragmentation.verified;
  assert.ok(v && v.command, 'fragmentation is verified by a replay of the file');
  await card.locator('[data-testid=show-fix]').click();
  await page.waitForSelector('#replay-key:not([hidden])', { timeout: 30000 });
  await page.waitForSelector('[data-testid=whatif-peak-reserved]');
  assert.equal(Number(await page.getAttribute('[data-testid=whatif-peak-reserved]', 'data-bytes')), v.after_peak_reserved_bytes);
  assert.equal(await page.inputValue('#whatif-conf'), v.alloc_conf);
  assert.equal(await page.inputValue('#whatif-start'), v.start);
  assert.equal(await page.evaluate(() => window.__tensormem.timeline.replay.reserved_curve.length), await page.evaluate(() => window.__tensormem.timeline.positions));
  await page.waitForFunction(() => /drawn beside the recorded one/.test(document.querySelector('.finding-fixed')?.textContent || ''));
  await frame(page);
  await page.screenshot({ path: join(shots, 'diagnosis-show-fix.png') });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('the Diagnosis panel finds the recorded out-of-memory on the device that ran out, and points at it', async () => {
  const path = join(fixtures, 'expandable-3gpu-oom.pickle');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await openFile(page, path, 2);
  // The page opens on the doctor's own choice (no --device): the device with the OOM.
  const expected = cliDoctor([path]);
  const oom = expected.find((f) => f.kind === 'oom');
  assert.ok(oom, 'the doctor finds the OOM');
  assert.equal(await page.$eval('[data-testid=device-select]', (s) => s.value), String(oom.evidence.device));
  assert.match(await page.$eval('[data-testid=device-select]', (s) => s.selectedOptions[0].textContent), /out of memory/);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(expected));
  await activateFinding(page, oom, 'keyboard');
  await page.screenshot({ path: join(shots, 'diagnosis-oom.png') });
  // Another device: its own diagnosis. The findings shown go at once (they are the other
  // device's), not when the new device's timeline arrives.
  const other = oom.evidence.device === 0 ? 1 : 0;
  const atSwitch = await page.evaluate((d) => {
    const select = document.querySelector('[data-testid=device-select]');
    select.value = String(d);
    select.dispatchEvent(new Event('change'));
    return [document.querySelector('[data-testid=diagnosis]').dataset.state, document.querySelectorAll('[data-testid=finding]').length];
  }, other);
  assert.deepEqual(atSwitch, ['pending', 0]);
  await painted(page, 3);
  const healthy = cliDoctor([path, '--device', String(other)]);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(healthy));
  // A healthy device of the run holds its forward's tensors at the end: a backward the
  // recording missed may have needed them, so missing-no-grad is inconclusive, shown apart
  // under its own heading, its confidence beside its title.
  assert.deepEqual(healthy.filter((f) => f.confidence === 'inconclusive').map((f) => f.kind), ['missing-no-grad']);
  assert.deepEqual(await page.$$eval('[data-testid=finding][data-confidence=inconclusive]', (cards) => cards.map((c) => c.dataset.kind)), ['missing-no-grad']);
  assert.equal(await page.$eval('[data-testid=inconclusive-heading]', (h) => h.nextElementSibling.dataset.confidence), 'inconclusive');
  assert.equal(await page.$eval('[data-testid=finding][data-confidence=inconclusive] .finding-confidence', (b) => b.textContent), 'inconclusive');
  await page.screenshot({ path: join(shots, 'diagnosis-inconclusive.png') });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a finder that fails is named in a note and the other findings stand (a panic in the worker is not the end)', async () => {
  // Issue 50: no finder may take the doctor down. wasm cannot catch a panic: the worker asks
  // which finder was running and diagnoses again without it.
  const path = join(fixtures, 'expandable-3gpu-oom.pickle');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await openFile(page, path, 2);
  const expected = cliDoctor([path]);
  const oom = expected.find((f) => f.kind === 'oom');
  const other = oom.evidence.device === 0 ? 1 : 0;
  await page.evaluate(() => window.__tensormem.ask('makeFinderFailForTests', { kind: 'outside-allocator' }));
  await page.selectOption('[data-testid=device-select]', String(other));
  await painted(page, 3);
  const healthy = cliDoctor([path, '--device', String(other)]);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(healthy.filter((f) => f.kind !== 'outside-allocator')));
  const notes = await page.$$eval('[data-testid=diagnosis-note]', (ns) => ns.map((n) => n.textContent));
  assert.ok(notes.some((n) => /the outside-allocator finder failed on this trace/.test(n)), notes.join('\n'));
  // The worker still works: with no finder failing, the device's diagnosis is whole again.
  await page.evaluate(() => window.__tensormem.ask('makeFinderFailForTests', { kind: null }));
  await page.selectOption('[data-testid=device-select]', String(oom.evidence.device));
  // The fourth paint: waiting for the third returned at once, and the findings read then were
  // the other device's, cleared before they were read (once, on a loaded machine).
  await painted(page, 4);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(expected));
  await page.close();
});

test('a large file is diagnosed in the doctor\'s own worker, with the findings the CLI reports on each device; a smaller one by the page\'s worker', async () => {
  // Issue 51: the doctor held the page's worker for seconds after a 1 GB file was drawn. A large
  // file is opened by a second worker too, which diagnoses it, where there are cores to spare;
  // "large" and the cores are lowered here.
  const path = join(fixtures, 'expandable-3gpu-oom.pickle');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.evaluate(() => Object.assign(window.__tensormem.doctorApart, { fromBytes: 0, memoryPerFileByte: 0, fromCores: 0 }));
  await openFile(page, path, 2);
  const expected = cliDoctor([path]);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(expected));
  assert.equal(await page.getAttribute('[data-testid=diagnosis]', 'data-apart'), 'true');
  // Another device: diagnosed apart as well, from the copy the doctor's worker holds.
  const other = expected.find((f) => f.kind === 'oom').evidence.device === 0 ? 1 : 0;
  await page.selectOption('[data-testid=device-select]', String(other));
  await painted(page, 3);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(cliDoctor([path, '--device', String(other)])));
  assert.equal(await page.getAttribute('[data-testid=diagnosis]', 'data-apart'), 'true');
  // A file worth keeping: the page's worker keeps its decode; opened again, both workers read
  // back the decode kept.
  const big = join(scratch, 'lm-train-16-steps.pickle');
  if (!existsSync(big)) execFileSync(bin, ['run', 'lm-train', '--set', 'size=medium,steps=16', '--snapshot', big], { stdio: 'ignore' });
  const bigFindings = kindsAndBytes(cliDoctor([big]));
  for (const [paints, reopened] of [[4, 'false'], [5, 'true']]) {
    await openFile(page, big, paints);
    assert.equal(await page.getAttribute('#source-name', 'data-reopened'), reopened);
    assert.deepEqual(await shownFindings(page), bigFindings);
    assert.equal(await page.getAttribute('[data-testid=diagnosis]', 'data-apart'), 'true');
  }
  // A file below the size (or beyond the memory) stays with the page's worker.
  await page.evaluate(() => Object.assign(window.__tensormem.doctorApart, { fromBytes: 32 << 20, memoryPerFileByte: 5 }));
  const small = join(fixtures, 'gpt-ctx128-forward.pickle');
  await openFile(page, small, 6);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(cliDoctor([small])));
  assert.equal(await page.getAttribute('[data-testid=diagnosis]', 'data-apart'), 'false');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a finding measured on an edited trace shows both figures as text, not a replay it cannot run', async () => {
  // Issue 50: missing-no-grad replays the trace with what the graph saved freed where no_grad
  // frees it. The What if panel replays files, not edited traces: the card says the figures.
  const path = resolve(root, 'tests/data/real/linear-grad.pickle');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await openFile(page, path);
  const expected = cliDoctor([path]);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(expected));
  const v = expected.find((f) => f.kind === 'missing-no-grad').verified;
  assert.ok(v && !v.command && v.after_peak_allocated_bytes < v.before_peak_allocated_bytes, JSON.stringify(v));
  const card = page.locator('[data-testid=finding][data-kind=missing-no-grad]');
  assert.equal(await card.locator('[data-testid=show-fix]').count(), 0);
  const measured = await card.locator('[data-testid=finding-measured]').textContent();
  assert.match(measured, /peak allocated 4\.13 GiB → 3\.95 GiB/);
  await page.locator('.findings-card, #findings').first().screenshot({ path: join(shots, 'diagnosis-measured.png') });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('the default scenario\'s findings, and the doctor\'s verdict on its mistake and on its fix', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  const name = await page.$eval('[data-testid=scenario-select]', (s) => s.value);
  const variant = await page.$eval('#variant-select', (s) => s.value);
  const expected = cliDoctor(['--scenario', name, '--variant', variant]);
  assert.deepEqual(await shownFindings(page), kindsAndBytes(expected));
  await timelineOnFirstScreen(page);
  const peak = expected.find((f) => f.kind === 'peak');
  await activateFinding(page, peak, 'click');
  await page.screenshot({ path: join(shots, 'diagnosis-scenario.png') });

  // The scenario panel: the verdict on both variants, each as the CLI finds it.
  const variants = await page.$$eval('#variant-select option', (options) => options.map((o) => o.value));
  assert.deepEqual(variants, ['mistake', 'fix']);
  await page.waitForFunction(() => document.querySelectorAll('#verdict-list > li').length === 2, null, { timeout: 60000 });
  const verdict = await page.$$eval('#verdict-list > li', (rows) => rows.map((r) => ({ variant: r.dataset.variant, kinds: r.dataset.kinds })));
  assert.deepEqual(verdict, variants.map((v) => ({ variant: v, kinds: cliDoctor(['--scenario', name, '--variant', v]).map((f) => f.kind).join(' ') })));
  // The mistake has a problem the fix does not.
  assert.notEqual(verdict[0].kinds, verdict[1].kinds);
  // Captured from the whole page, where the sticky bar stays at the top and covers nothing.
  await page.evaluate(() => window.scrollTo(0, 0));
  const card = await page.locator('#scenario-card').boundingBox();
  await page.screenshot({ path: join(shots, 'diagnosis-scenario-verdict.png'), fullPage: true, clip: card });
  assert.deepEqual(page.errors, []);
  await page.close();
});

// ---- colour by category (issue 23): PyTorch's snapshots record none; the doctor infers them

// The legend's groups as {kind, bytes (at the peak), allocations, hidden}.
function legendGroups(page) {
  return page.$$eval('#legend button', (buttons) => buttons.map((b) => ({
    kind: b.dataset.kind, bytes: Number(b.dataset.bytes), allocations: Number(b.dataset.allocations), category: b.dataset.category === 'true', off: b.classList.contains('off'),
  })));
}

test('a PyTorch snapshot is coloured by the categories the doctor infers; the legend, the details and the colour-by control say so', async () => {
  const path = join(fixtures, 'gpt-medium-ctx128-training.pickle');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  // tensormem's own trace (the default scenario) keeps the categories it records.
  assert.equal(await page.$eval('[data-testid=color-by]', (s) => s.value), 'recorded');
  assert.deepEqual(await page.$$eval('[data-testid=color-by] option', (o) => o.map((x) => x.textContent)), ['category (recorded)', 'category (inferred)', 'stack frame']);
  assert.equal(await page.textContent('[data-testid=legend-caption]'), LEGEND_CAPTION.recorded);

  await openFile(page, path, 2);
  assert.equal(await page.$eval('[data-testid=color-by]', (s) => s.value), 'inferred');
  assert.deepEqual(await page.$$eval('[data-testid=color-by] option', (o) => o.map((x) => x.textContent)), ['category (inferred)', 'stack frame']);
  assert.equal(await page.textContent('[data-testid=legend-caption]'), LEGEND_CAPTION.inferred);
  // What the doctor reports live at the peak by inferred category (`tensormem doctor --json`,
  // the peak's evidence) is what the legend shows, category by category.
  const peak = cliDoctor([path, '--device', '0']).find((f) => f.kind === 'peak');
  const reported = peak.evidence.inferred_categories;
  assert.ok(reported.length >= 3, JSON.stringify(reported));
  const legend = await legendGroups(page);
  assert.ok(legend.every((g) => g.category), JSON.stringify(legend));
  const byKind = new Map(legend.map((g) => [g.kind, g]));
  assert.deepEqual(reported.map((c) => [c.category, byKind.get(c.category)?.bytes]), reported.map((c) => [c.category, c.bytes]));
  assert.ok(legend.filter((g) => g.bytes > 0).every((g) => reported.some((c) => c.category === g.kind)), 'no category live at the peak that the doctor does not report');
  assert.equal(legend.reduce((n, g) => n + g.allocations, 0), 7190);
  // Allocation by allocation, the page's inferred categories add up, at the peak, to the
  // doctor's figures: the allocations and the bytes of each confidence.
  const pageAtPeak = await page.evaluate(() => {
    const { data, cursor } = window.__tensormem.timeline;
    const { arrays: a, inferred, meta } = data;
    const out = {};
    const x = meta.summary.peak_x;
    for (let id = 0; id < a.allocSize.length; id++) {
      if (a.allocStart[id] > x || a.allocEnd[id] <= x) continue;
      const c = (out[inferred.categories[inferred.category[id]]] ||= { allocations: 0, high_bytes: 0, medium_bytes: 0, low_bytes: 0 });
      c.allocations++;
      c[`${inferred.confidences[inferred.confidence[id]]}_bytes`] += a.allocSize[id];
    }
    return { out, cursor, peak: x };
  });
  for (const c of reported) {
    assert.deepEqual(pageAtPeak.out[c.category], { allocations: c.allocations, high_bytes: c.high_bytes, medium_bytes: c.medium_bytes, low_bytes: c.low_bytes }, c.category);
  }
  assert.equal(Object.keys(pageAtPeak.out).length, reported.length);
  await page.screenshot({ path: join(shots, 'inferred-categories.png') });

  // The details panel: the pinned allocation's inferred category and how sure (the largest at the peak).
  await page.waitForSelector('[data-testid=diagnosis][data-state=ready]', { timeout: 60000 });
  await page.click('[data-testid=finding][data-kind=peak] .finding-go');
  const pinned = Number(await timelineState(page, 'pinned'));
  const expectedDetails = await page.evaluate((id) => {
    const i = window.__tensormem.timeline.data.inferred;
    return { category: i.categories[i.category[id]], confidence: i.confidences[i.confidence[id]], reason: i.reasons[i.reason[id]] };
  }, pinned);
  assert.ok(reported.some((c) => c.category === expectedDetails.category), JSON.stringify(expectedDetails));
  const cell = page.locator('#details [data-testid=inferred-category]');
  await cell.waitFor();
  assert.deepEqual({ category: await cell.getAttribute('data-category'), confidence: await cell.getAttribute('data-confidence') },
    { category: expectedDetails.category, confidence: expectedDetails.confidence });
  assert.equal(await cell.textContent(), `${expectedDetails.category.replace(/_/g, ' ')} · ${expectedDetails.confidence} confidence${expectedDetails.reason}`);
  assert.equal(await page.textContent('#details dd[data-testid=inferred-category] >> xpath=preceding-sibling::dt[1]'), 'category (inferred)');
  await page.locator('#details-card').screenshot({ path: join(shots, 'inferred-category-details.png') });
  // Hovering a band names its inferred category and how sure.
  await page.focus('[data-testid=timeline]');
  await page.keyboard.press('ArrowUp');
  await page.waitForSelector('#tooltip:not([hidden])');
  assert.match(await page.textContent('#tooltip'), /^[\d.]+ (B|KiB|MiB|GiB) · (parameter|gradient|optimizer state|activation|temporary|input|autograd detail|unknown) \(inferred, (high|medium|low) confidence\)/);

  // The legend hides and shows a category: its allocations are counted as hidden at the cursor.
  const biggest = legend[0];
  const button = page.locator(`#legend button[data-kind=${biggest.kind}]`);
  await button.click();
  await page.waitForFunction((k) => document.querySelector(`#legend button[data-kind=${k}]`).classList.contains('off'), biggest.kind);
  await page.waitForFunction(() => /hidden by the filter or the legend/.test(document.querySelector('#live').textContent));
  assert.match(await page.textContent('#live th'), /^by category \(inferred\)$/);
  await frame(page);
  await page.locator('.timeline-card').screenshot({ path: join(shots, 'inferred-categories-hidden.png') });
  await page.locator(`#legend button[data-kind=${biggest.kind}]`).click();
  await page.waitForFunction((k) => !document.querySelector(`#legend button[data-kind=${k}]`).classList.contains('off'), biggest.kind);
  await page.waitForFunction(() => !/hidden by the filter or the legend/.test(document.querySelector('#live').textContent));

  // Colour by stack frame: the legend's groups are frames (and the blocks from before the trace);
  // the details still say the inferred category; and back.
  await colorBy(page, 'frame');
  const frames = await legendGroups(page);
  assert.ok(frames.every((g) => ['frame', 'before_trace', 'no_stack'].includes(g.kind)), JSON.stringify(frames));
  assert.match(await page.textContent('#legend'), /step \(cs336_basics\/optimizer\.py:74\) 1\.54 GiB at peak/);
  assert.match(await page.textContent('#live th'), /^by where it was allocated$/);
  assert.equal(await page.getAttribute('#details [data-testid=inferred-category]', 'data-category'), expectedDetails.category);
  assert.match(await page.textContent('#details'), /group/);
  await frame(page);
  await page.screenshot({ path: join(shots, 'inferred-categories-by-frame.png') });
  await colorBy(page, 'inferred');
  assert.deepEqual(await legendGroups(page), legend);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('What fits predicts from two real snapshots as tensormem predict does, plots the peaks per value and the largest that fits', async () => {
  const a = join(fixtures, 'gpt-medium-ctx128-inference.pickle');
  const b = join(fixtures, 'gpt-medium-ctx256-inference.pickle');
  const cli = JSON.parse(execFileSync(bin, ['predict', `${a}@context=128`, `${b}@context=256`, '--to', 'context=1024', '--fit', 'context', '--capacity', 'H100-80GB', '--json'], { encoding: 'utf8', maxBuffer: 1 << 26 }));
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  // A bad input first: one snapshot only, then a missing value.
  await page.setInputFiles('[data-testid=fits-file-0]', a);
  await page.waitForFunction(() => /peak/.test(document.querySelector('.fits-row .fits-name').textContent), null, { timeout: 30000 });
  await page.click('[data-testid=fits-run]');
  await page.waitForSelector('[data-testid=fits-error]:not([hidden])');
  assert.match(await page.textContent('[data-testid=fits-error]'), /two or three snapshots/);
  await page.setInputFiles('[data-testid=fits-file-1]', b);
  await page.waitForFunction(() => /peak/.test(document.querySelectorAll('.fits-row .fits-name')[1].textContent), null, { timeout: 30000 });
  // The value is guessed from the file name; clear it to see the error.
  assert.equal(await page.inputValue('[data-testid=fits-values-1]'), 'context=256');
  await page.fill('[data-testid=fits-values-0]', '');
  await page.click('[data-testid=fits-run]');
  await page.waitForFunction(() => /say which value/.test(document.querySelector('[data-testid=fits-error]').textContent));
  // Values that differ in name: the engine's message, in the view; the page keeps working.
  await page.fill('[data-testid=fits-values-0]', 'batch=4');
  await page.fill('[data-testid=fits-target]', 'context=1024');
  await page.click('[data-testid=fits-run]');
  await page.waitForFunction(() => /every recording must give the same variables/.test(document.querySelector('[data-testid=fits-error]').textContent), null, { timeout: 30000 });
  // The sticky header would cover the card's top in its screenshots.
  await page.addStyleTag({ content: 'header.bar { position: static !important; }' });
  await page.locator('#fits-card').screenshot({ path: join(shots, 'fits-error.png') });
  assert.equal(await page.isVisible('[data-testid=error]'), false);

  await page.fill('[data-testid=fits-values-0]', 'context=128');
  await page.fill('[data-testid=fits-target]', '1024');
  await page.selectOption('[data-testid=fits-card-select]', 'H100-80GB');
  await page.click('[data-testid=fits-run]');
  await page.waitForSelector('[data-testid=fits-peak-allocated]', { timeout: 60000 });
  assert.equal(await page.isVisible('[data-testid=fits-error]'), false);
  assert.equal(Number(await page.getAttribute('[data-testid=fits-peak-allocated]', 'data-bytes')), cli.peak_allocated_bytes);
  assert.equal(Number(await page.getAttribute('[data-testid=fits-peak-reserved]', 'data-bytes')), cli.peak_reserved_bytes);
  // How sure, as the CLI says it: the share on checked laws, and the warning (1024 is 4x past 256: none).
  assert.equal(Number(await page.getAttribute('[data-testid=fits-how-sure]', 'data-checked-share')), cli.how_sure.checked_share);
  assert.equal(await page.isVisible('[data-testid=fits-warning]'), cli.how_sure.warning != null);
  const largest = page.locator('[data-testid=fits-largest]');
  assert.equal(Number(await largest.getAttribute('data-value')), cli.fit.largest);
  assert.equal(Number(await largest.getAttribute('data-expandable')), cli.fit.largest_expandable);
  assert.match(await largest.textContent(), new RegExp(cli.fit.largest.toLocaleString('en-US')));
  // Thousands of tokens from recordings at 128 and 256: said to lie far beyond them, as the CLI says.
  assert.ok(cli.fit.warning.includes('beyond the largest recorded context'), cli.fit.warning);
  assert.equal(await page.textContent('[data-testid=fits-largest-warning]'), cli.fit.warning);
  // Both plots are drawn.
  for (const id of ['fits-curves', 'fits-sweep']) {
    const inked = await page.$eval(`[data-testid=${id}]`, (c) => {
      const { data } = c.getContext('2d').getImageData(0, 0, c.width, c.height);
      let n = 0;
      for (let i = 3; i < data.length; i += 4) if (data[i] > 0) n++;
      return n / (data.length / 4);
    });
    assert.ok(inked > 0.005, `${id}: ${inked}`);
  }
  // The sweep's values include the recorded ones, the target and the largest that fits, up to past it.
  const values = (await page.$$eval('[data-testid=fits-sweep-table] tr td:first-child', (tds) => tds.map((td) => Number(td.textContent))));
  for (const v of [128, 256, 1024, cli.fit.largest]) assert.ok(values.includes(v), `${v} in ${values}`);
  assert.ok(values.length >= 8 && values.length <= 20, String(values));
  await page.locator('#fits-card').screenshot({ path: join(shots, 'fits.png') });
  // Another program in the second slot: said in the view, and the next prediction still works.
  await page.setInputFiles('[data-testid=fits-file-1]', join(fixtures, 'gpt-medium-ctx128-training.pickle'));
  await page.waitForFunction(() => /training.*peak/.test(document.querySelectorAll('.fits-row .fits-name')[1].textContent), null, { timeout: 30000 });
  await page.click('[data-testid=fits-run]');
  await page.waitForFunction(() => /do not look like one program/.test(document.querySelector('[data-testid=fits-error]').textContent), null, { timeout: 30000 });
  await page.locator('#fits-card').screenshot({ path: join(shots, 'fits-mismatch.png') });
  await page.setInputFiles('[data-testid=fits-file-1]', b);
  await page.waitForFunction(() => /ctx256.*peak/.test(document.querySelectorAll('.fits-row .fits-name')[1].textContent), null, { timeout: 30000 });
  await page.selectOption('[data-testid=fits-card-select]', '');
  await page.click('[data-testid=fits-run]');
  await page.waitForFunction(() => document.querySelector('[data-testid=fits-error]').hidden && !document.querySelector('[data-testid=fits-largest]'), null, { timeout: 60000 });
  assert.equal(Number(await page.getAttribute('[data-testid=fits-peak-allocated]', 'data-bytes')), cli.peak_allocated_bytes);
  // The predicted trace opens in the timeline, with the peaks the CLI's predicted snapshot shows
  // (the trace's own figures, as for every file; reserved is the prediction's).
  const written = join(scratch, 'predicted-context-1024.pickle');
  execFileSync(bin, ['predict', `${a}@context=128`, `${b}@context=256`, '--to', 'context=1024', '--snapshot', written]);
  const [expected] = cliPeaks(written);
  assert.equal(expected.reserved, cli.peak_reserved_bytes);
  await page.click('[data-testid=fits-open]');
  await painted(page, 2);
  assert.match(await page.textContent('#source-name'), /predicted at context=1024/);
  assert.deepEqual(await peaks(page), { allocated: expected.allocated, reserved: expected.reserved });
  await page.screenshot({ path: join(shots, 'fits-predicted-timeline.png') });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a file dropped on What fits is one of its recordings, not the page\'s trace', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  const before = await page.textContent('#source-name');
  await page.locator('#fits-card').scrollIntoViewIfNeeded();
  const box = await page.locator('#fits-card').boundingBox();
  const drop = (name, text) => page.evaluate(({ name, text, x, y }) => {
    const data = new DataTransfer();
    data.items.add(new File([text], name));
    const at = document.elementFromPoint(x, y);
    for (const type of ['dragenter', 'dragover', 'drop']) at.dispatchEvent(new DragEvent(type, { bubbles: true, cancelable: true, dataTransfer: data, clientX: x, clientY: y }));
  }, { name, text, x: box.x + box.width / 2, y: box.y + 20 });
  await drop('not-a-snapshot.pickle', 'hello');
  await page.waitForFunction(() => /Could not load not-a-snapshot\.pickle/.test(document.querySelector('[data-testid=fits-error]').textContent), null, { timeout: 30000 });
  assert.equal(await page.textContent('#source-name'), before, 'the page\'s trace is still shown');
  assert.equal(await page.isVisible('[data-testid=error]'), false);
  assert.equal(await page.isVisible('#drop'), false);
  assert.deepEqual(page.errors, []);
  await page.close();
});

// ---- Size a model (www/size.js): `tensormem run hf-train` with every rank simulated.
// A run that runs out of memory still prints its JSON, then exits non-zero.
function cliRun(name, set) {
  let out;
  try {
    out = execFileSync(bin, ['run', name, '--set', set, '--json'], { encoding: 'utf8', maxBuffer: 1 << 26, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    if (!/ran out of memory/.test(e.stderr) || !e.stdout) throw e;
    out = e.stdout;
  }
  return JSON.parse(out);
}
// Fills the Size a model form: `values` by field (size-<name>), then runs it.
async function sizeModel(page, values) {
  for (const [name, value] of Object.entries(values)) {
    const selector = `[data-testid=size-${name}]`;
    if (await page.$eval(selector, (e) => e.tagName) === 'SELECT') await page.selectOption(selector, value);
    else await page.fill(selector, value);
  }
  const before = await page.$eval('[data-testid=size-result]', (e) => e.firstElementChild);
  await page.click('[data-testid=size-run]');
  // A new result or an error; the button comes back.
  await page.waitForFunction((old) => {
    const result = document.querySelector('[data-testid=size-result]');
    const error = document.querySelector('[data-testid=size-error]');
    return !document.querySelector('[data-testid=size-run]').disabled && (!error.hidden || (result.firstElementChild && result.firstElementChild !== old));
  }, before, { timeout: 120000 });
}
async function sizeGroups(page) {
  return page.$$eval('[data-testid=size-group]', (figures) => figures.map((f) => ({
    ranks: f.dataset.ranks.split(',').map(Number), label: f.dataset.label, count: Number(f.dataset.count),
    allocated: Number(f.dataset.peakAllocated), reserved: Number(f.dataset.peakReserved), oom: f.dataset.oom === 'true',
    text: f.querySelector('figcaption').textContent.replace(/\s+/g, ' ').trim(),
  })));
}
// Fraction of a canvas's pixels that are not blank.
async function canvasInk(locator) {
  return locator.evaluate((c) => {
    const { data } = c.getContext('2d').getImageData(0, 0, c.width, c.height);
    let n = 0;
    for (let i = 3; i < data.length; i += 4) if (data[i] > 0) n++;
    return n / (data.length / 4);
  });
}

test('Size a model: llama-3-8b on 8 GPUs with FSDP fits an H100, its 8 ranks alike in one chart with the peaks tensormem run reports', async () => {
  const set = 'config=llama-3-8b,world=8,strategy=fsdp,context=256,attn=sdpa,amp=bfloat16';
  const cli = cliRun('hf-train', set);
  assert.equal(cli.ranks.length, 8);
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  // The model list is the library's presets (and a config.json of one's own); the choices are the scenario's.
  assert.deepEqual(await page.$$eval('[data-testid=size-model] option', (o) => o.map((x) => x.value)),
    ['llama-3-8b', 'llama-3-70b', 'mistral-7b', 'qwen2.5-7b', 'gpt2', 'custom']);
  assert.deepEqual(await page.$$eval('[data-testid=size-strategy] option', (o) => o.map((x) => x.value)), ['ddp', 'zero1', 'zero2', 'fsdp', 'hsdp']);
  assert.equal(await page.inputValue('[data-testid=size-card-select]'), 'H100-80GB');
  await page.addStyleTag({ content: 'header.bar { position: static !important; }' });
  await sizeModel(page, { model: 'llama-3-8b', context: '256', attn: 'sdpa', amp: 'bfloat16', world: '8', strategy: 'fsdp' });
  assert.equal(await page.isVisible('[data-testid=size-error]'), false);
  const groups = await sizeGroups(page);
  assert.equal(groups.length, 1, JSON.stringify(groups));
  const [g] = groups;
  assert.deepEqual(g.ranks, [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.equal(g.label, '0-7');
  assert.match(g.text, /^ranks 0-7 \(8 alike\)/);
  assert.equal(g.allocated, cli.ranks[0].peak_allocated_bytes);
  assert.equal(g.reserved, cli.ranks[0].peak_reserved_bytes);
  assert.ok(cli.ranks.every((r) => r.peak_allocated_bytes === g.allocated));
  assert.equal(g.oom, false);
  assert.ok(g.text.includes(`${(cli.ranks[0].peak_allocated_bytes / 2 ** 30).toFixed(2)} GiB allocated`), g.text);
  const verdict = page.locator('[data-testid=size-verdict]');
  assert.equal(await verdict.getAttribute('data-fits'), 'true');
  assert.equal(Number(await verdict.getAttribute('data-peak-allocated')), cli.ranks[0].peak_allocated_bytes);
  assert.equal(Number(await verdict.getAttribute('data-capacity')), cli.capacity_bytes);
  assert.match(await verdict.textContent(), /^Fits on H100-80GB \(79\.20 GiB\) on 8 GPUs \(fsdp\): the heaviest rank, rank 0, peaks at [\d.]+ GiB allocated, [\d.]+ GiB reserved: \d+% of the card\.$/);
  assert.ok(await canvasInk(page.locator('[data-testid=size-group] canvas')) > 0.03);
  // Every rank can be opened.
  assert.equal(await page.locator('[data-testid=size-rank] option').count(), 8);
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-llama-3-8b-fsdp-8.png') });
  // DDP's first bucket holds Llama-3-8B's 8.03 G gradients: more elements than a 32-bit index,
  // counted in bytes, as on the command line.
  await sizeModel(page, { world: '2', strategy: 'ddp', optimizer: 'sgd' });
  const ddp = cliRun('hf-train', 'config=llama-3-8b,world=2,strategy=ddp,context=256,attn=sdpa,amp=bfloat16,optimizer=sgd');
  assert.equal(ddp.out_of_memory, null);
  assert.equal(await verdict.getAttribute('data-fits'), 'true');
  assert.equal(Number(await verdict.getAttribute('data-peak-allocated')), ddp.ranks[0].peak_allocated_bytes);

  assert.equal(await page.isVisible('[data-testid=error]'), false);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('Size a model: ZeRO-1 shards the optimizer unevenly, so the ranks differ; picking a rank opens its trace in the timeline', async () => {
  const cli = cliRun('hf-train', 'config=gpt2,world=4,strategy=zero1,context=128');
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.addStyleTag({ content: 'header.bar { position: static !important; }' });
  await sizeModel(page, { model: 'gpt2', context: '128', world: '4', strategy: 'zero1' });
  const groups = await sizeGroups(page);
  assert.ok(groups.length > 1, JSON.stringify(groups));
  // Each group: ranks with the same figures as the CLI's, every rank in exactly one group.
  assert.deepEqual(groups.flatMap((x) => x.ranks).sort(), [0, 1, 2, 3]);
  for (const x of groups) {
    for (const k of x.ranks) {
      assert.equal(x.allocated, cli.ranks[k].peak_allocated_bytes, `rank ${k}`);
      assert.equal(x.reserved, cli.ranks[k].peak_reserved_bytes, `rank ${k}`);
    }
  }
  const heaviest = [...cli.ranks].sort((a, b) => b.peak_allocated_bytes - a.peak_allocated_bytes || b.peak_reserved_bytes - a.peak_reserved_bytes)[0];
  assert.equal(Number(await page.getAttribute('[data-testid=size-verdict]', 'data-heaviest-rank')), heaviest.rank);
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-gpt2-zero1-4.png') });

  // Rank 2 from the list: the run again with rank=2, its trace in the timeline and the scenario panel.
  const rank2 = cliRun('hf-train', 'config=gpt2,world=4,strategy=zero1,context=128,rank=2');
  await page.selectOption('[data-testid=size-rank]', '2');
  await page.click('[data-testid=size-open]');
  await painted(page, 2);
  assert.match(await page.textContent('#source-name'), /hf-train gpt2 · zero1 × 4 · rank 2/);
  const run = JSON.parse(await page.getAttribute('#scenario-result', 'data-run'));
  assert.equal(run.parameters.rank, 2);
  assert.equal(run.peak_allocated_bytes, rank2.peak_allocated_bytes);
  assert.equal(run.peak_allocated_bytes, cli.ranks[2].peak_allocated_bytes);
  assert.equal(Number(await page.getAttribute('[data-testid=scenario-peak-allocated]', 'data-bytes')), cli.ranks[2].peak_allocated_bytes);
  assert.equal(Number(await page.getAttribute('[data-testid=peak-reserved]', 'data-bytes')), cli.ranks[2].peak_reserved_bytes);
  // The scenarios panel is set to the run, so that its Run button makes it again.
  assert.equal(await page.inputValue('[data-testid=scenario-select]'), 'hf-train');
  assert.equal(await page.inputValue('input[data-param=rank]'), '2');
  assert.equal(await page.inputValue('select[data-param=strategy]'), 'zero1');
  // Clicking a chart opens its first rank.
  const other = groups.find((x) => !x.ranks.includes(2));
  await page.locator(`[data-testid=size-group][data-ranks="${other.ranks.join(',')}"]`).click();
  await painted(page, 3);
  assert.match(await page.textContent('#source-name'), new RegExp(`rank ${other.ranks[0]}$`));
  assert.equal(Number(await page.getAttribute('[data-testid=scenario-peak-allocated]', 'data-bytes')), cli.ranks[other.ranks[0]].peak_allocated_bytes);
  assert.equal(await page.$eval(`[data-testid=size-group][data-ranks="${other.ranks.join(',')}"]`, (f) => f.classList.contains('open')), true);
  await page.screenshot({ path: join(shots, 'size-rank-opened.png') });

  // A card of one's own that only rank 0 (the most optimizer state) overflows: the verdict names it, its chart says so, the others fit.
  let oomCli;
  try {
    execFileSync(bin, ['run', 'hf-train', '--set', 'config=gpt2,world=4,strategy=zero1,context=128', '--device', 'sim:1100MiB', '--json'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    oomCli = JSON.parse(e.stdout);
  }
  assert.deepEqual(oomCli.ranks.map((r) => Boolean(r.out_of_memory)), [true, false, false, false]);
  await page.locator('#size-card').scrollIntoViewIfNeeded();
  await page.selectOption('[data-testid=size-card-select]', 'custom');
  await sizeModel(page, { capacity: '1100MiB' });
  const verdict = page.locator('[data-testid=size-verdict]');
  assert.equal(await verdict.getAttribute('data-fits'), 'false');
  assert.equal(await verdict.getAttribute('data-oom-ranks'), '0');
  assert.equal(Number(await verdict.getAttribute('data-capacity')), 1100 * 2 ** 20);
  const text = (await verdict.textContent()).replace(/\s+/g, ' ');
  assert.match(text, /^Out of memory on a 1\.07 GiB card: rank 0 of 4 \(Tried to allocate [\d.]+ MiB at [\d.]+ [MG]iB allocated\); ranks 1-3 fit, the heaviest, rank (\d), peaking at /);
  const fitting = oomCli.ranks.slice(1).sort((a, b) => b.peak_allocated_bytes - a.peak_allocated_bytes)[0];
  assert.equal(Number(await verdict.getAttribute('data-heaviest-rank')), fitting.rank);
  assert.equal(Number(await verdict.getAttribute('data-peak-allocated')), fitting.peak_allocated_bytes);
  const oomGroups = await sizeGroups(page);
  assert.deepEqual(oomGroups.filter((x) => x.oom).map((x) => x.ranks), [[0]]);
  for (const x of oomGroups) for (const k of x.ranks) assert.equal(x.allocated, oomCli.ranks[k].peak_allocated_bytes, `rank ${k}`);
  assert.match(await page.textContent('[data-testid=size-group][data-oom=true] .size-oom'), /^ran out of memory: Tried to allocate/);
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-oom.png') });
  assert.equal(await page.isVisible('[data-testid=error]'), false);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('Size a model: a request the library refuses is said in the view; then a config.json of one\'s own with LoRA, and one GPU', async () => {
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.addStyleTag({ content: 'header.bar { position: static !important; }' });
  await sizeModel(page, { model: 'gpt2', context: '64', world: '12', strategy: 'hsdp' });
  assert.equal(await page.isVisible('[data-testid=size-node]'), true);
  assert.equal(await page.isVisible('[data-testid=size-error]'), true);
  assert.match(await page.textContent('[data-testid=size-error]'), /world=12 is not a whole number of nodes/);
  assert.equal(await page.locator('[data-testid=size-group]').count(), 0);
  assert.equal(await page.isVisible('[data-testid=error]'), false);
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-error.png') });
  // A config.json of one's own, with LoRA: Llama-3-8B's own config pasted.
  const config = readFileSync(join(root, 'src/nn/hf_configs/llama-3-8b.json'), 'utf8');
  await page.selectOption('[data-testid=size-model]', 'custom');
  await page.fill('[data-testid=size-config]', '{ "not": "a model" }');
  await sizeModel(page, { world: '12', node: '4' });
  assert.equal(await page.isVisible('[data-testid=size-error]'), true);
  assert.doesNotMatch(await page.textContent('[data-testid=size-error]'), /whole number of nodes/);
  await page.fill('[data-testid=size-config]', config);
  await page.selectOption('[data-testid=size-finetune]', 'lora');
  await page.fill('[data-testid=size-lora]', '8');
  const cli = cliRun('hf-train', 'config=llama-3-8b,context=64,world=12,strategy=hsdp,node=4,lora=8,lora_targets=q,v');
  await sizeModel(page, {});
  assert.equal(await page.isVisible('[data-testid=size-error]'), false);
  const groups = await sizeGroups(page);
  assert.deepEqual(groups.flatMap((x) => x.ranks).sort((a, b) => a - b), [...Array(12).keys()]);
  for (const x of groups) assert.equal(x.allocated, cli.ranks[x.ranks[0]].peak_allocated_bytes);
  assert.match(await page.textContent('#size-result'), new RegExp(`your config\\.json · ${(cli.model_parameters / 1e9).toFixed(2)} B parameters, ${(cli.trainable_parameters / 1e6).toFixed(1)} M trainable · .* · LoRA r=8 on q,v`));
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-lora-hsdp.png') });
  // One GPU: the run lists no ranks; its one chart is the run, its peak by category read from its trace.
  const one = cliRun('hf-train', 'config=gpt2,context=64');
  await page.selectOption('[data-testid=size-model]', 'gpt2');
  await page.selectOption('[data-testid=size-finetune]', 'full');
  await sizeModel(page, { world: '1' });
  const [single] = await sizeGroups(page);
  assert.equal(await page.locator('[data-testid=size-group]').count(), 1);
  assert.match(single.text, /^the one GPU/);
  assert.equal(single.allocated, one.peak_allocated_bytes);
  assert.equal(single.reserved, one.peak_reserved_bytes);
  const byCategory = JSON.parse(await page.getAttribute('[data-testid=size-group]', 'data-by-category'));
  // GPT-2's peak is AdamW's step: parameters, gradients, both moments and the step's temporaries.
  for (const c of ['parameter', 'gradient', 'optimizer_state', 'temporary']) assert.ok(byCategory[c] > 0, JSON.stringify(byCategory));
  assert.equal(byCategory.optimizer_state, 2 * byCategory.parameter);
  const total = Object.values(byCategory).reduce((a, b) => a + b, 0);
  assert.ok(total <= one.peak_allocated_bytes && total > 0.95 * one.peak_allocated_bytes, `${total} of ${one.peak_allocated_bytes}`);
  assert.match(await page.textContent('[data-testid=size-verdict]'), /^Fits on H100-80GB \(79\.20 GiB\) on one GPU: the run peaks at /);
  assert.deepEqual(page.errors, []);
  await page.close();
});

// ---- Size a model's "What fits" table: `tensormem fit` in the page, a cell per strategy and card.
const FIT_CARDS = ['H100-80GB', 'A100-80GB', 'A100-40GB', 'RTX4090-24GB', 'L4-24GB'];
function cliFit(set, vary, strategies, cards = FIT_CARDS) {
  const out = execFileSync(bin, ['fit', 'hf-train', '--set', set, '--vary', vary, '--strategies', strategies.join(','), '--cards', cards.join(','), '--json'],
    { encoding: 'utf8', maxBuffer: 1 << 26, stdio: ['ignore', 'pipe', 'pipe'] });
  return JSON.parse(out);
}
// Fills the Size a model form, picks what to vary and runs the table; waits for it (or an error).
async function fitTable(page, values, vary = 'batch') {
  for (const [name, value] of Object.entries(values)) {
    const selector = `[data-testid=size-${name}]`;
    if (await page.$eval(selector, (e) => e.tagName) === 'SELECT') await page.selectOption(selector, value);
    else await page.fill(selector, value);
  }
  await page.selectOption('[data-testid=size-fit-vary]', vary);
  const before = await page.$eval('[data-testid=size-fit]', (e) => e.firstElementChild);
  await page.click('[data-testid=size-fit-run]');
  await page.waitForFunction((old) => {
    const result = document.querySelector('[data-testid=size-fit]');
    const error = document.querySelector('[data-testid=size-error]');
    return !document.querySelector('[data-testid=size-fit-run]').disabled && (!error.hidden || (result.firstElementChild && result.firstElementChild !== old));
  }, before, { timeout: 240000 });
}
async function fitCells(page) {
  return page.$$eval('[data-testid=size-fit-cell]', (tds) => tds.map((td) => ({
    strategy: td.dataset.strategy, card: td.dataset.card, largest: td.dataset.largest === '' ? null : Number(td.dataset.largest),
    peak: td.dataset.peakAllocated === '' ? null : Number(td.dataset.peakAllocated), limitedBy: td.dataset.limitedBy || null,
    best: td.classList.contains('best'), value: td.querySelector('.size-fit-value').textContent, second: td.querySelector('.size-fit-peak').textContent, title: td.title,
  })));
}

test('Size a model: what fits, strategies × cards: gpt2 on 4 GPUs, every cell the largest batch tensormem fit finds; a cell clicked is sized', async () => {
  const strategies = ['ddp', 'zero1', 'zero2', 'fsdp'];
  const cli = cliFit('config=gpt2,world=4,context=256', 'batch', strategies);
  assert.equal(cli.cells.length, strategies.length * FIT_CARDS.length);
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.addStyleTag({ content: 'header.bar { position: static !important; }' });
  assert.equal(await page.inputValue('[data-testid=size-fit-vary]'), 'batch');
  await fitTable(page, { model: 'gpt2', context: '256', world: '4' });
  assert.equal(await page.isVisible('[data-testid=size-error]'), false);
  const table = page.locator('[data-testid=size-fit-table]');
  assert.equal(await table.getAttribute('data-vary'), 'batch');
  // Rows: the strategies (no hsdp: 4 GPUs are one node); columns: the cards.
  assert.deepEqual(await page.$$eval('[data-testid=size-fit-table] tbody th', (t) => t.map((x) => x.textContent)), strategies);
  assert.deepEqual(await page.$$eval('[data-testid=size-fit-table] thead th', (t) => t.slice(1).map((x) => x.firstChild.textContent)), FIT_CARDS);
  const cells = await fitCells(page);
  assert.equal(cells.length, cli.cells.length);
  for (const c of cli.cells) {
    const mine = cells.find((x) => x.strategy === c.strategy && x.card === c.card);
    assert.ok(mine, `${c.strategy} on ${c.card}`);
    assert.equal(mine.largest, c.largest, `${c.strategy} on ${c.card}`);
    assert.equal(mine.peak, c.peak_allocated_bytes, `${c.strategy} on ${c.card}`);
    assert.ok(c.largest > 0 && c.limited_by === null, JSON.stringify(c));
    assert.equal(mine.value, String(c.largest));
    assert.ok(mine.second.startsWith(`rank ${c.heaviest_rank}: `), mine.second);
    // The best strategy on each card is highlighted.
    const best = Math.max(...cli.cells.filter((x) => x.card === c.card).map((x) => x.largest));
    assert.equal(mine.best, c.largest === best, `${c.strategy} on ${c.card}`);
  }
  // A bigger card fits a bigger batch.
  const ddp = (card) => cli.cells.find((x) => x.strategy === 'ddp' && x.card === card).largest;
  assert.ok(ddp('H100-80GB') > ddp('A100-40GB') && ddp('A100-40GB') > ddp('L4-24GB'));
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-fit-table.png') });

  // A cell clicked after the form changed: said, nothing sized.
  await page.fill('[data-testid=size-context]', '128');
  await page.click('[data-testid=size-fit-cell][data-strategy=zero1][data-card=L4-24GB]');
  assert.match(await page.textContent('[data-testid=size-error]'), /the form's context changed since this table was made/);
  assert.equal(await page.locator('[data-testid=size-verdict]').count(), 0);
  await page.fill('[data-testid=size-context]', '256');
  // A cell clicked: the form takes its strategy, card and batch, and "Size it" runs it.
  const pick = cli.cells.find((x) => x.strategy === 'zero1' && x.card === 'L4-24GB');
  await page.click('[data-testid=size-fit-cell][data-strategy=zero1][data-card=L4-24GB]');
  await page.waitForFunction((peak) => {
    const v = document.querySelector('[data-testid=size-verdict]');
    return v && v.dataset.peakAllocated === String(peak) && !document.querySelector('[data-testid=size-run]').disabled;
  }, pick.peak_allocated_bytes, { timeout: 120000 });
  assert.equal(await page.inputValue('[data-testid=size-strategy]'), 'zero1');
  assert.equal(await page.inputValue('[data-testid=size-card-select]'), 'L4-24GB');
  assert.equal(await page.inputValue('[data-testid=size-batch]'), String(pick.largest));
  const verdict = page.locator('[data-testid=size-verdict]');
  assert.equal(await verdict.getAttribute('data-fits'), 'true');
  assert.equal(Number(await verdict.getAttribute('data-peak-allocated')), pick.peak_allocated_bytes);
  assert.equal(Number(await verdict.getAttribute('data-heaviest-rank')), pick.heaviest_rank);
  assert.equal(Number(await verdict.getAttribute('data-capacity')), pick.capacity_bytes);
  assert.equal(await page.$eval('[data-testid=size-fit-cell][data-strategy=zero1][data-card=L4-24GB]', (td) => td.classList.contains('open')), true);
  // One more in the batch runs out of memory on that card, as the command line says.
  let over = null;
  try {
    execFileSync(bin, ['run', 'hf-train', '--set', `config=gpt2,world=4,context=256,strategy=zero1,batch=${pick.largest + 1}`, '--device', 'sim:L4-24GB', '--json'], { encoding: 'utf8', maxBuffer: 1 << 26, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    over = JSON.parse(e.stdout);
  }
  assert.ok(over?.ranks.some((r) => r.out_of_memory), 'one more runs out of memory');
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-fit-sized.png') });
  assert.equal(await page.isVisible('[data-testid=error]'), false);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('Size a model: what fits on one GPU: the sharding strategies are refused, ddp\'s context stops at GPT-2\'s 1024 positions (+); a bad form is said', async () => {
  const strategies = ['ddp', 'zero1', 'zero2', 'fsdp'];
  const cli = cliFit('config=gpt2,world=1,batch=1', 'context', strategies);
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.addStyleTag({ content: 'header.bar { position: static !important; }' });
  // A form the table cannot run: said in the view, no table.
  await fitTable(page, { model: 'gpt2', batch: 'two', world: '1' }, 'context');
  assert.equal(await page.isVisible('[data-testid=size-error]'), true);
  assert.match(await page.textContent('[data-testid=size-error]'), /batch: "two" is not a whole number/);
  assert.equal(await page.locator('[data-testid=size-fit-table]').count(), 0);
  await fitTable(page, { batch: '1' }, 'context');
  assert.equal(await page.isVisible('[data-testid=size-error]'), false);
  assert.equal(await page.getAttribute('[data-testid=size-fit-table]', 'data-vary'), 'context');
  const cells = await fitCells(page);
  assert.equal(cells.length, cli.cells.length);
  for (const c of cli.cells) {
    const mine = cells.find((x) => x.strategy === c.strategy && x.card === c.card);
    assert.equal(mine.largest, c.largest, `${c.strategy} on ${c.card}`);
    assert.equal(mine.peak, c.peak_allocated_bytes, `${c.strategy} on ${c.card}`);
    assert.equal(mine.limitedBy, c.limited_by, `${c.strategy} on ${c.card}`);
    if (c.strategy === 'ddp') {
      // The search stopped at the model's own limit, not at the card's: "+", the reason in its tooltip.
      assert.equal(c.largest, 1024);
      assert.match(c.limited_by, /GPT-2's learned positions cover 1024 tokens/);
      assert.equal(mine.value, '1024+');
      assert.ok(mine.title.includes(c.limited_by), mine.title);
    } else {
      assert.equal(c.largest, null);
      assert.match(c.limited_by, new RegExp(`^strategy=${c.strategy} shards over several data-parallel ranks`));
      assert.equal(mine.value, 'refused');
      assert.equal(mine.title, c.limited_by);
      assert.equal(mine.best, false);
    }
  }
  // The reasons are listed once under the table.
  const notes = (await page.textContent('[data-testid=size-fit-notes]')).replace(/\s+/g, ' ');
  assert.ok(notes.includes(`refused zero2: ${cli.cells.find((x) => x.strategy === 'zero2').limited_by}`), notes);
  assert.ok(notes.includes(`+ ddp: stopped by the scenario's own limit, not by memory: ${cli.cells[0].limited_by}`), notes);
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-fit-one-gpu.png') });
  // A refused cell does nothing when clicked.
  await page.click('[data-testid=size-fit-cell][data-strategy=zero2][data-card=L4-24GB]');
  assert.equal(await page.locator('[data-testid=size-verdict]').count(), 0);
  assert.equal(await page.isVisible('[data-testid=error]'), false);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('Size a model: what fits Llama-3-8B on 16 GPUs in nodes of 8: hsdp joins the rows, "does not fit" where not even batch 1 does; the button waits for the table', async () => {
  const strategies = ['ddp', 'zero1', 'zero2', 'fsdp', 'hsdp'];
  const cli = cliFit('config=llama-3-8b,world=16,node=8,context=2048,attn=sdpa,amp=bfloat16', 'batch', strategies);
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page);
  await page.addStyleTag({ content: 'header.bar { position: static !important; }' });
  for (const [name, value] of Object.entries({ model: 'llama-3-8b', context: '2048', attn: 'sdpa', amp: 'bfloat16', world: '16' })) {
    const selector = `[data-testid=size-${name}]`;
    if (await page.$eval(selector, (e) => e.tagName) === 'SELECT') await page.selectOption(selector, value);
    else await page.fill(selector, value);
  }
  // While the table runs, its button is disabled and the page's progress bar says how far it is.
  await page.click('[data-testid=size-fit-run]');
  assert.equal(await page.isDisabled('[data-testid=size-fit-run]'), true);
  await page.waitForFunction(() => !document.getElementById('progress').hidden && /searching the largest batch that fits: \d+ of 25/.test(document.getElementById('progress-text').textContent), null, { timeout: 60000 });
  await page.waitForFunction(() => !document.querySelector('[data-testid=size-fit-run]').disabled, null, { timeout: 240000 });
  assert.equal(await page.isVisible('[data-testid=size-error]'), false);
  assert.equal(await page.isHidden('#progress'), true);
  assert.deepEqual(await page.$$eval('[data-testid=size-fit-table] tbody th', (t) => t.map((x) => x.textContent)), strategies);
  const cells = await fitCells(page);
  assert.equal(cells.length, 25);
  for (const c of cli.cells) {
    const mine = cells.find((x) => x.strategy === c.strategy && x.card === c.card);
    assert.equal(mine.largest, c.largest, `${c.strategy} on ${c.card}`);
    assert.equal(mine.peak, c.peak_allocated_bytes, `${c.strategy} on ${c.card}`);
    assert.equal(mine.value, c.largest === null ? 'does not fit' : String(c.largest), `${c.strategy} on ${c.card}`);
  }
  // Llama-3-8B's full fine-tune with DDP fits no card at batch 1; FSDP fits even the 24 GB ones.
  assert.ok(cli.cells.filter((c) => c.strategy === 'ddp').every((c) => c.largest === null));
  assert.ok(cli.cells.filter((c) => c.strategy === 'fsdp').every((c) => c.largest >= 1));
  await page.locator('#size-card').screenshot({ path: join(shots, 'size-fit-llama-16.png') });
  // The hsdp cell on an H100 sized: its nodes of 8 go with it.
  const pick = cli.cells.find((x) => x.strategy === 'hsdp' && x.card === 'H100-80GB');
  await page.click('[data-testid=size-fit-cell][data-strategy=hsdp][data-card=H100-80GB]');
  await page.waitForFunction((peak) => {
    const v = document.querySelector('[data-testid=size-verdict]');
    return v && v.dataset.peakAllocated === String(peak) && !document.querySelector('[data-testid=size-run]').disabled;
  }, pick.peak_allocated_bytes, { timeout: 120000 });
  assert.equal(await page.inputValue('[data-testid=size-strategy]'), 'hsdp');
  assert.equal(await page.isVisible('[data-testid=size-node]'), true);
  assert.equal(await page.getAttribute('[data-testid=size-verdict]', 'data-fits'), 'true');
  assert.deepEqual(page.errors, []);
  await page.close();
});
