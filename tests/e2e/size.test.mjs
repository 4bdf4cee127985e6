// End-to-end tests of What fits (predictions from the user's snapshots) and Size a model (a model's
// training step with every rank simulated, and what fits each card), in headless Chromium (see
// harness.mjs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync, existsSync, utimesSync } from 'node:fs';
import { join, resolve } from 'node:path';
import {
  root, bin, fixtures, shots, scratch, server, baseUrl, browser, serve, newPage, painted, peaks, openFile, cliPeaks,
  inkedFraction, LEGEND_CAPTION, colorBy, timelineState, frame, viewOf, cliDoctor,
} from './harness.mjs';

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
