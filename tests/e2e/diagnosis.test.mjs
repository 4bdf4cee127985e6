// End-to-end tests of the Diagnosis panel (the doctor's findings on the page) and of colouring by
// category, in headless Chromium (see harness.mjs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync, existsSync, utimesSync } from 'node:fs';
import { join, resolve } from 'node:path';
import {
  root, bin, fixtures, shots, scratch, server, baseUrl, browser, serve, newPage, painted, peaks, openFile, cliPeaks,
  inkedFraction, LEGEND_CAPTION, colorBy, timelineState, frame, viewOf, cliDoctor,
} from './harness.mjs';

// ---- the Diagnosis panel (issue 23): the doctor's findings as cards above the timeline

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
