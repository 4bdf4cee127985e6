// End-to-end tests of the page served by `tensormem serve`, in headless Chromium: loading files
// (every fixture, big ones kept and opened again, broken ones), scenarios, export, the wheel's
// server, what-if, private pools, the keyboard and the hit test. The Diagnosis panel is in
// diagnosis.test.mjs, What fits and Size a model in size.test.mjs. Run by scripts/test-e2e.sh,
// which builds the page and the binary; screenshots land in target/e2e-screenshots/.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync, existsSync, utimesSync } from 'node:fs';
import { join, resolve } from 'node:path';
import {
  root, bin, fixtures, shots, scratch, server, baseUrl, browser, serve, newPage, painted, peaks, openFile, cliPeaks,
  inkedFraction, LEGEND_CAPTION, colorBy, timelineState, frame, viewOf, cliDoctor,
} from './harness.mjs';

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
  // Drawn from the timeline kept with its view, its decode read back after.
  assert.ok((await page.evaluate(() => window.__progressTexts)).includes('reading back the timeline kept by this browser'));
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
  // What the timeline shows: its groups, curves and every allocation's band, summed.
  const laidOut = () => page.evaluate(() => {
    const { arrays, meta } = window.__tensormem.timeline.data;
    const sum = (a) => a.reduce((s, v, i) => (s + v * ((i % 7) + 1)) % 1e12, 0);
    const bands = ['allocated', 'reserved', 'timeUs', 'allocSize', 'allocAddr', 'allocStart', 'allocEnd', 'allocStack', 'allocGroup', 'pieceOffsets', 'pieceX0', 'pieceY', 'stackFrames'];
    return { groups: meta.groups.map((g) => `${g.name} ${g.bytes_at_peak}`), ...Object.fromEntries(bands.map((k) => [k, [arrays[k].length, sum(arrays[k])]])) };
  });
  await openFile(page, changing, 2);
  assert.equal(await marks('preview'), 0);
  const drawn = await laidOut();
  // The view kept once drawn: the second open shows it before the kept decode is read back,
  // and draws the timeline from the layout kept with it, not laid out again.
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 2, null, { timeout: 60000 });
  await page.evaluate(() => {
    window.__progressTexts = [];
    new MutationObserver((records) => records.forEach((r) => r.addedNodes.forEach((n) => window.__progressTexts.push(n.textContent))))
      .observe(document.querySelector('#progress-text'), { childList: true });
  });
  await openFile(page, changing, 3);
  assert.equal(await marks('preview'), 1);
  assert.equal(await page.getAttribute('#source-name', 'data-reopened'), 'true');
  assert.deepEqual(await peaks(page), { allocated: expected.allocated, reserved: expected.reserved });
  const said = await page.evaluate(() => window.__progressTexts);
  assert.ok(said.includes('reading back the timeline kept by this browser') && !said.includes('laying out the timeline'), said.join('\n'));
  assert.deepEqual(await laidOut(), drawn);
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:diagnosed').length >= 3, null, { timeout: 60000 });
  // One decode kept, with its view, whose pixels count in the decode's size (the 1 GiB bound).
  const kept = () => page.evaluate(async () => {
    const db = await new Promise((ok, fail) => { const r = indexedDB.open('tensormem'); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
    const all = (store) => new Promise((ok) => {
      const s = db.transaction(store).objectStore(store);
      const keys = s.getAllKeys();
      const values = s.getAll();
      values.onsuccess = () => ok(keys.result.map((k, i) => [k, values.result[i]]));
    });
    const out = { uses: await all('decodedUse'), views: await all('views') };
    db.close();
    return out.uses.map(([k, use]) => {
      const view = out.views.find(([v]) => v === k)?.[1];
      return { k, use, view: view?.image.pixels.byteLength, layout: view?.layout && view.layout.bytes.size + view.layout.curves.size + view.layout.pixels.byteLength };
    });
  });
  const first = await kept();
  assert.equal(first.length, 1);
  // The view's size counts its image, and the layout kept with it (its bytes and first image).
  assert.ok(first[0].view > 0 && first[0].layout > first[0].view, JSON.stringify(first));
  assert.ok(first[0].use.viewSize === first[0].view + first[0].layout && first[0].use.size > first[0].use.viewSize, JSON.stringify(first));
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
  // The trace read back from the old bytes was drawn (the 4th paint) but never diagnosed, and
  // the decode and view kept of the old bytes are gone.
  assert.equal(await marks('diagnosed'), 4);
  assert.ok(!(await kept()).some((e) => e.k === first[0].k));
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

test('a view kept without its layout (by an older version), or with one that cannot be read back, gets one when next drawn, and the file is then drawn from it', async () => {
  const big = join(scratch, 'lm-train-16-steps.pickle');
  if (!existsSync(big)) execFileSync(bin, ['run', 'lm-train', '--set', 'size=medium,steps=16', '--snapshot', big], { stdio: 'ignore' });
  const page = await newPage();
  await page.goto(baseUrl);
  await painted(page, 1);
  const marks = (name) => page.evaluate((n) => performance.getEntriesByName(`tensormem:${n}`).length, name);
  const said = () => page.evaluate(() => window.__progressTexts.splice(0));
  await page.evaluate(() => {
    window.__progressTexts = [];
    new MutationObserver((records) => records.forEach((r) => r.addedNodes.forEach((n) => window.__progressTexts.push(n.textContent))))
      .observe(document.querySelector('#progress-text'), { childList: true });
  });
  // The views kept, without their layouts: as an older version kept them.
  const stripLayouts = () => page.evaluate(async () => {
    const db = await new Promise((ok, fail) => { const r = indexedDB.open('tensormem'); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
    const store = db.transaction('views').objectStore('views');
    const [keys, views] = await Promise.all([store.getAllKeys(), store.getAll()].map((q) => new Promise((ok) => { q.onsuccess = () => ok(q.result); })));
    const tx = db.transaction('views', 'readwrite');
    keys.forEach((k, i) => { const { layout, page: info, ...older } = views[i]; tx.objectStore('views').put(older, k); });
    await new Promise((ok) => { tx.oncomplete = ok; });
    db.close();
    return views.map((v) => Boolean(v.layout && v.page));
  });
  await openFile(page, big, 2);
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:kept').length >= 1, null, { timeout: 60000 });
  assert.deepEqual(await stripLayouts(), [true]);
  await said();
  await openFile(page, big, 3);
  assert.ok((await said()).includes('laying out the timeline'));
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:kept').length >= 2, null, { timeout: 60000 });
  assert.equal(await page.getAttribute('#source-name', 'data-reopened'), 'true');
  await openFile(page, big, 4);
  const texts = await said();
  assert.ok(texts.includes('reading back the timeline kept by this browser') && !texts.includes('laying out the timeline'), texts.join('\n'));
  assert.equal(await marks('preview'), 2);
  // A layout kept that cannot be read back (damaged, or kept by another version) is laid out
  // again, and kept anew for the next open.
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:kept').length >= 3, null, { timeout: 60000 });
  await page.evaluate(async () => {
    const db = await new Promise((ok, fail) => { const r = indexedDB.open('tensormem'); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
    const store = db.transaction('views').objectStore('views');
    const [keys, views] = await Promise.all([store.getAllKeys(), store.getAll()].map((q) => new Promise((ok) => { q.onsuccess = () => ok(q.result); })));
    const tx = db.transaction('views', 'readwrite');
    keys.forEach((k, i) => tx.objectStore('views').put({ ...views[i], layout: { ...views[i].layout, bytes: new Blob([new Uint8Array(100)]) } }, k));
    await new Promise((ok) => { tx.oncomplete = ok; });
    db.close();
  });
  await openFile(page, big, 5);
  assert.ok((await said()).includes('laying out the timeline'));
  await page.waitForFunction(() => performance.getEntriesByName('tensormem:kept').length >= 4, null, { timeout: 60000 });
  await openFile(page, big, 6);
  assert.ok((await said()).includes('reading back the timeline kept by this browser'));
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

test('a long trace is drawn first from bands laid out for its first image, then laid out fully (here any trace, by ?first-image-alone=0)', async () => {
  const file = join(fixtures, 'gpt-medium-ctx128-training.pickle');
  const pieces = async (page) => page.evaluate(() => {
    const a = window.__tensormem.timeline.data.arrays;
    return { offsets: Array.from(a.pieceOffsets), x0: a.pieceX0.length, y: a.pieceY.length };
  });
  const fullBands = (page, n) => page.waitForFunction((k) => performance.getEntriesByName('tensormem:full-bands').length === k, n, { timeout: 30000 });
  const full = await newPage();
  await full.goto(baseUrl);
  await painted(full);
  await openFile(full, file, 2);
  const expected = await pieces(full);
  await full.close();

  const page = await newPage();
  await page.goto(`${baseUrl}?first-image-alone=0`);
  await painted(page);
  await fullBands(page, 1);
  // How many pieces the first image's layout had, seen as the full layout replaces it.
  await page.evaluate(() => {
    const t = window.__tensormem.timeline;
    const setPieces = t.setPieces;
    t.setPieces = function (data, arrays) {
      window.firstPieces = data.arrays.pieceX0.length;
      return setPieces.call(this, data, arrays);
    };
  });
  await openFile(page, file, 2);
  assert.ok(await inkedFraction(page) > 0.1, 'the first image has bands');
  await fullBands(page, 2);
  const first = await page.evaluate(() => window.firstPieces);
  assert.ok(first < expected.x0, `the first image's layout has fewer pieces (${first} against ${expected.x0})`);
  const marks = await page.evaluate(() => ['painted', 'full-bands'].map((m) => performance.getEntriesByName(`tensormem:${m}`)[1].startTime));
  assert.ok(marks[0] < marks[1], 'painted before the full layout');
  assert.deepEqual(await pieces(page), expected, 'laid out fully, the pieces are those of a page that laid them out at once');
  // The page's hit test reads the new pieces, and answers as the worker does.
  const differ = await page.evaluate(async () => {
    const t = window.__tensormem.timeline;
    const p = t.plot;
    const out = [];
    for (let i = 0; i < 20; i++) {
      const request = { pos: t.positionAt(t.xOfPx(p.x + ((i + 0.5) / 20) * p.w, p)), bytes: t.yMax() * (0.05 + (i % 10) / 12), slack: t.yMax() / p.h };
      const mine = await t.backend.hitTest(request);
      const worker = await window.__tensormem.ask('hitTest', { view: t.data.view, ...request });
      if (mine !== worker) out.push({ ...request, mine, worker });
    }
    return out;
  });
  assert.deepEqual(differ, []);
  await frame(page);
  assert.ok(await inkedFraction(page) > 0.1, 'the image drawn again from the full layout has bands');
  await page.locator('[data-testid=timeline]').screenshot({ path: join(shots, 'first-image-then-full-bands.png') });
  assert.deepEqual(page.errors, []);
  await page.close();
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
