// The "Size a model" view: a Hugging Face model's fine-tuning step (`tensormem run hf-train`) on a
// simulated card across GPUs, every rank simulated. The verdict (does it fit, which ranks run out
// of memory, the heaviest rank against the card), and the ranks side by side as small multiples:
// ranks with identical results share one, each its peak split by category against the card and
// its memory per step. A rank (picked in the list, or a small multiple clicked) is run again with
// `rank=k` and opens in the timeline above, as a scenario run does.
import { escapeHtml as escape, formatBytes, ticks } from './format.js';
import { prepareCanvas } from './canvas.js';
import { latestOnly } from './job.js';
import { CATEGORY_ORDER, categoryColor } from './palette.js';

const $ = (id) => document.getElementById(id);
const SCENARIO = 'hf-train';
// The choices the form offers as lists, in the form's order (their options and defaults come
// from the scenario's parameters).
const CHOICES = ['dtype', 'amp', 'attn', 'optimizer', 'strategy'];
const NUMBERS = ['batch', 'context', 'world', 'node'];
// "What fits": the cards compared, the simulator's presets among these. The strategies are
// `tensormem fit`'s defaults (scenarios.fit_strategies), hsdp too where the GPUs span nodes.
const FIT_CARDS = ['H100-80GB', 'A100-80GB', 'A100-40GB', 'RTX4090-24GB', 'L4-24GB'];
const RESERVED_FILL = '#e5e7eb';
const STEP_MAX = '#c7d2fe';
const STEP_NOW = '#3a5bd9';
// Rank lists longer than this offer one entry per group instead of one per rank.
const MAX_RANK_OPTIONS = 1024;

// A byte count short enough for an axis: 64 GiB, 1.5 GiB, 512 MiB.
export function shortBytes(bytes) {
  const text = formatBytes(bytes);
  return text.replace(/\.00 /, ' ').replace(/(\.\d)0 /, '$1 ');
}

// Ranks as text: [0,1,2,3,5,7] -> "0-3, 5, 7".
export function rankRanges(ranks) {
  const parts = [];
  for (let i = 0; i < ranks.length;) {
    let j = i;
    while (j + 1 < ranks.length && ranks[j + 1] === ranks[j] + 1) j++;
    parts.push(j > i ? `${ranks[i]}-${ranks[j]}` : String(ranks[i]));
    i = j + 1;
  }
  return parts.join(', ');
}

// Ranks whose figures are the same (peaks, categories, steps, out of memory), in rank order:
// [{ranks: [..], rank: the first one's figures}].
export function groupRanks(ranks) {
  const groups = new Map();
  for (const r of [...ranks].sort((a, b) => a.rank - b.rank)) {
    const { rank } = r;
    const categories = Object.entries(r.by_category || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    const key = JSON.stringify([r.peak_allocated_bytes, r.peak_reserved_bytes, r.out_of_memory || null, categories, r.steps]);
    if (!groups.has(key)) groups.set(key, { ranks: [], rank: r });
    groups.get(key).ranks.push(rank);
  }
  return [...groups.values()];
}

// "Tried to allocate 112.00 MiB" out of PyTorch's out-of-memory text.
const triedOf = (text) => /Tried to allocate [\d.]+ \w+/.exec(text || '')?.[0] || 'out of memory';

export function setUpSize({ ask, load, scenarios, showProgress, hideProgress, showRequestInScenarios }) {
  const scenario = scenarios.scenarios.find((s) => s.name === SCENARIO);
  if (!scenario) {
    $('size-card').hidden = true;
    return;
  }
  const param = (name) => scenario.parameters.find((p) => p.name === name);
  const presets = scenarios.hf_presets || [];
  $('size-model').replaceChildren(...presets.map((n) => new Option(n, n)), new Option('config.json of your own…', 'custom'));
  $('size-model').value = presets.includes(param('config')?.default) ? param('config').default : presets[0] || 'custom';
  for (const name of CHOICES) {
    const p = param(name);
    if (!p) continue;
    $(`size-${name}`).replaceChildren(...p.kind.options.map((o) => new Option(o, o)));
    $(`size-${name}`).value = p.default;
  }
  for (const name of NUMBERS) if (param(name)) $(`size-${name}`).value = param(name).default;
  $('size-checkpointing').checked = param('checkpointing')?.default === 'true';
  // LoRA's targets as checkboxes, by the names `lora_targets=` takes (q, k, ..., down).
  const defaults = (param('lora_targets')?.default || 'q,v').split(',');
  $('size-targets').replaceChildren(...(scenarios.lora_targets || []).map((full) => {
    const short = full.replace(/_proj$/, '');
    const label = document.createElement('label');
    label.className = 'check';
    label.innerHTML = `<input type="checkbox" value="${escape(short)}"${defaults.includes(short) ? ' checked' : ''}>${escape(short)}`;
    return label;
  }));
  $('size-card-select').replaceChildren(
    ...scenarios.presets.map((p) => new Option(`${p.name} (${formatBytes(p.bytes)})`, p.name)),
    new Option('memory of your own…', 'custom'),
  );
  $('size-card-select').value = scenarios.presets.some((p) => p.name === 'H100-80GB') ? 'H100-80GB' : scenarios.presets[0]?.name;
  const showInputs = () => {
    $('size-config').hidden = $('size-model').value !== 'custom';
    const lora = $('size-finetune').value === 'lora';
    $('size-lora-box').hidden = !lora;
    $('size-targets-box').hidden = !lora;
    $('size-node-box').hidden = $('size-strategy').value !== 'hsdp';
    $('size-capacity-box').hidden = $('size-card-select').value !== 'custom';
  };
  for (const id of ['size-model', 'size-finetune', 'size-strategy', 'size-card-select']) $(id).addEventListener('change', showInputs);
  showInputs();

  function showError(message) {
    $('size-error').textContent = message;
    $('size-error').hidden = false;
  }
  const clearError = () => { $('size-error').hidden = true; };

  // The run's request from the form ({scenario, set, device}), or an error in words.
  function request() {
    const set = {};
    const model = $('size-model').value;
    if (model === 'custom') {
      const text = $('size-config').value.trim();
      if (!text) throw new Error('paste the model\'s config.json, or pick a preset');
      set.config = text;
    } else {
      set.config = model;
    }
    for (const name of NUMBERS) {
      const text = $(`size-${name}`).value.trim();
      if (name === 'node' && $('size-strategy').value !== 'hsdp') continue;
      if (!/^\d+$/.test(text)) throw new Error(`${name}: "${text}" is not a whole number`);
      set[name] = text;
    }
    for (const name of CHOICES) set[name] = $(`size-${name}`).value;
    // One GPU: no strategy (nothing is sharded or all-reduced).
    if (set.world === '1') {
      delete set.strategy;
      delete set.node;
    }
    set.checkpointing = String($('size-checkpointing').checked);
    if ($('size-finetune').value === 'lora') {
      const r = $('size-lora').value.trim();
      if (!/^\d+$/.test(r) || Number(r) < 1) throw new Error(`LoRA rank: "${r}" is not a whole number of 1 or more`);
      const targets = [...$('size-targets').querySelectorAll('input:checked')].map((c) => c.value);
      if (!targets.length) throw new Error('LoRA: pick the linears it adapts (q, v, ...)');
      set.lora = r;
      set.lora_targets = targets.join(',');
    } else {
      set.lora = '0';
    }
    const card = $('size-card-select').value;
    const size = $('size-capacity').value.trim();
    if (card === 'custom' && !size) throw new Error('say the card\'s memory, e.g. 48GiB');
    return { scenario: SCENARIO, set, device: `sim:${card === 'custom' ? size : card}` };
  }

  let shown = null; // {request, run, groups}
  const size = latestOnly({
    button: $('size-run'),
    status: $('size-status'),
    read: request,
    busy: (r) => `simulating ${r.set.world} GPU${r.set.world === '1' ? '' : 's'}…`,
    work: (r) => ask('sizeModel', { request: r }),
    show,
    fail: () => {
      shown = null;
      $('size-result').replaceChildren();
    },
    showError,
    clearError,
    hideProgress,
  });
  $('size-run').onclick = size;

  // ---- What fits: the largest batch (or context) for every strategy on every card.
  const fitCards = FIT_CARDS.filter((c) => scenarios.presets.some((p) => p.name === c));
  // The table's request: the form's settings but for the strategy, searched over `vary`.
  function fitRequest() {
    const r = request();
    const vary = $('size-fit-vary').value;
    const set = { ...r.set };
    delete set.strategy;
    delete set.node;
    const world = Number(set.world);
    const node = $('size-node').value.trim();
    const strategies = [...scenarios.fit_strategies];
    if (/^\d+$/.test(node) && world > Number(node)) {
      strategies.push('hsdp');
      set.node = node;
    }
    return { scenario: SCENARIO, set, vary, strategies, cards: fitCards };
  }
  $('size-fit-run').onclick = latestOnly({
    button: $('size-fit-run'),
    status: $('size-fit-status'),
    read: fitRequest,
    busy: (req) => `searching the largest ${req.vary}: ${req.strategies.length} strategies × ${req.cards.length} cards…`,
    work: (req) => ask('sizeFitTable', { request: req }),
    show: showFit,
    fail: () => $('size-fit').replaceChildren(),
    showError,
    clearError,
    hideProgress,
  });

  // A cell clicked: the form set to its strategy, card and value, then sized.
  // The form must still hold the table's settings (but for the strategy, card and the value
  // searched, which the cell sets): otherwise the cell would be sized under other settings.
  function sizeCell(req, table, cell) {
    if (cell.largest == null) return;
    let now;
    try {
      now = request().set;
    } catch (e) {
      return showError(e.message);
    }
    const changed = Object.keys({ ...now, ...req.set }).filter((k) => !['strategy', 'node', table.vary].includes(k) && now[k] !== req.set[k]);
    if (req.set.node && $('size-node').value.trim() !== req.set.node) changed.push('GPUs per node');
    if (changed.length) {
      return showError(`the form's ${changed.join(', ')} changed since this table was made: run "What fits" again, then pick a cell`);
    }
    clearError();
    const world = Number(table.world);
    if (world > 1) $('size-strategy').value = cell.strategy;
    $('size-card-select').value = cell.card;
    $(`size-${table.vary}`).value = String(cell.largest);
    showInputs();
    for (const td of $('size-fit').querySelectorAll('td.size-fit-cell')) td.classList.toggle('open', td.dataset.strategy === cell.strategy && td.dataset.card === cell.card);
    size();
  }

  function showFit(req, table) {
    const { vary, cells } = table;
    const world = Number(table.world);
    const cell = (strategy, card) => cells.find((c) => c.strategy === strategy && c.card === card);
    const best = new Map(req.cards.map((card) => [card, Math.max(0, ...cells.filter((c) => c.card === card).map((c) => c.largest || 0))]));
    const capacity = new Map(cells.map((c) => [c.card, c.capacity_bytes]));
    // Notes under the table: each refusal and each limit of the scenario's own, once.
    const notes = new Map();
    const note = (mark, text) => {
      const key = `${mark} ${text}`;
      if (!notes.has(key)) notes.set(key, { mark, text, strategies: new Set() });
      return notes.get(key);
    };
    const td = (c) => {
      const attrs = `class="size-fit-cell${c.largest != null && c.largest === best.get(c.card) ? ' best' : ''}${c.largest == null ? ' none' : ''}" data-testid="size-fit-cell"
        data-strategy="${escape(c.strategy)}" data-card="${escape(c.card)}" data-largest="${c.largest ?? ''}" data-peak-allocated="${c.peak_allocated_bytes ?? ''}"
        data-peak-reserved="${c.peak_reserved_bytes ?? ''}" data-heaviest-rank="${c.heaviest_rank ?? ''}" data-limited-by="${escape(c.limited_by || '')}"`;
      if (c.largest == null) {
        if (c.limited_by) {
          note('refused', c.limited_by).strategies.add(c.strategy);
          return `<td ${attrs} title="${escape(c.limited_by)}"><span class="size-fit-value">refused</span><span class="size-fit-peak">see below</span></td>`;
        }
        return `<td ${attrs} title="${escape(`${vary} 1 runs out of memory`)}"><span class="size-fit-value">does not fit</span><span class="size-fit-peak">not even ${escape(vary)} 1</span></td>`;
      }
      const plus = c.limited_by ? '<sup class="size-fit-plus">+</sup>' : '';
      if (c.limited_by) note('+', c.limited_by).strategies.add(c.strategy);
      const share = Math.round((100 * c.peak_allocated_bytes) / c.capacity_bytes);
      const title = `${c.strategy} on ${c.card}: ${vary} ${c.largest} fits${c.limited_by ? ` (and more might: the search stopped at the scenario's limit: ${c.limited_by})` : ''}; `
        + `${world > 1 ? `the heaviest rank, rank ${c.heaviest_rank}, peaks` : 'it peaks'} at ${formatBytes(c.peak_allocated_bytes)} allocated, ${formatBytes(c.peak_reserved_bytes)} reserved; click to size it`;
      return `<td ${attrs} title="${escape(title)}" tabindex="0" role="button"><span class="size-fit-value">${c.largest}${plus}</span>`
        + `<span class="size-fit-peak">${world > 1 ? `rank ${c.heaviest_rank}: ` : ''}${formatBytes(c.peak_allocated_bytes)} · ${share}%</span></td>`;
    };
    const body = req.strategies.map((s) => `<tr><th scope="row">${escape(s)}</th>${req.cards.map((card) => td(cell(s, card) || { strategy: s, card, largest: null, limited_by: 'not in the answer' })).join('')}</tr>`).join('');
    const p = req.set;
    const about = [
      p.config.startsWith('{') ? 'your config.json' : p.config, `${world > 1 ? `${world} GPUs` : 'one GPU'}`,
      vary === 'batch' ? `context ${p.context}` : `batch ${p.batch}`, `${p.dtype}${p.amp && p.amp !== 'false' ? `, autocast ${p.amp}` : ''}`,
      p.lora && p.lora !== '0' ? `LoRA r=${p.lora}` : 'full fine-tune', `attention ${p.attn}`, p.optimizer, p.checkpointing === 'true' ? 'checkpointing' : '',
    ].filter(Boolean).map(escape).join(' · ');
    const runs = cells.reduce((a, c) => a + c.runs, 0);
    $('size-fit').innerHTML = `
      <p class="result-line"><b>The largest ${escape(vary)} that fits</b>, by strategy and card <span class="muted">(${about}; ${runs} steps simulated)</span></p>
      <div class="size-fit-scroll"><table class="size-fit-table" data-testid="size-fit-table" data-vary="${escape(vary)}" data-world="${world}">
        <thead><tr><th></th>${req.cards.map((card) => `<th scope="col">${escape(card)}<span class="size-fit-peak">${capacity.has(card) ? formatBytes(capacity.get(card)) : ''}</span></th>`).join('')}</tr></thead>
        <tbody>${body}</tbody></table></div>
      <p class="result-line muted size-fit-notes" data-testid="size-fit-notes">Each cell: the largest ${escape(vary)} at which no rank runs out of memory; below it, ${world > 1 ? 'the heaviest rank\'s' : 'the'} peak allocated and its share of the card.
        <span class="size-fit-best-key">Highlighted</span>: the best strategy on each card. Click a cell to size it.
        ${[...notes.values()].map((n) => `<br><b>${escape(n.mark)}</b> ${escape([...n.strategies].join(', '))}: ${n.mark === '+' ? 'stopped by the scenario\'s own limit, not by memory: ' : ''}${escape(n.text)}`).join('')}</p>`;
    for (const el of $('size-fit').querySelectorAll('td.size-fit-cell')) {
      const c = cell(el.dataset.strategy, el.dataset.card);
      if (!c || c.largest == null) continue;
      el.onclick = () => sizeCell(req, table, c);
      el.onkeydown = (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); sizeCell(req, table, c); } };
    }
  }

  // One rank's trace in the timeline and every panel above: the run again, recording rank k.
  async function openRank(k) {
    if (!shown) return;
    const { request: r } = shown;
    $('size-rank').value = String(k);
    for (const f of $('size-result').querySelectorAll('.size-group')) f.classList.toggle('open', f.dataset.ranks.split(',').includes(String(k)));
    const label = `${SCENARIO} ${r.set.config.startsWith('{') ? 'config.json' : r.set.config} · ${r.set.world > 1 ? `${r.set.strategy} × ${r.set.world} · ` : ''}rank ${k}`;
    const request = { ...r, set: { ...r.set, rank: String(k) } };
    await load('runScenario', { request, label });
    if ($('source-name').textContent !== label) return;
    $('size-result').dataset.openRank = String(k);
    showRequestInScenarios?.(request);
    document.querySelector('.timeline-card').scrollIntoView();
  }

  function show(r, run) {
    const capacity = run.capacity_bytes;
    const card = r.device.replace(/^sim:/, '');
    const custom = $('size-card-select').value === 'custom';
    const groups = groupRanks(run.ranks);
    shown = { request: r, run, groups };
    const world = run.ranks.length;
    const oomRanks = run.ranks.filter((x) => x.out_of_memory).map((x) => x.rank).sort((a, b) => a - b);
    // The heaviest rank: the most allocated at its peak (then reserved), among the ranks that
    // finished where some did not (a run stopped by out-of-memory has not reached its peak).
    const finished = run.ranks.filter((x) => !x.out_of_memory);
    const heaviest = [...(finished.length ? finished : run.ranks)]
      .sort((a, b) => b.peak_allocated_bytes - a.peak_allocated_bytes || b.peak_reserved_bytes - a.peak_reserved_bytes || a.rank - b.rank)[0];
    const share = (b) => `${Math.round((100 * b) / capacity)}%`;
    const gpus = world > 1 ? `${world} GPUs (${escape(r.set.strategy)})` : 'one GPU';
    const cardName = custom ? `a ${formatBytes(capacity)} card` : `${escape(card)} (${formatBytes(capacity)})`;
    const peaks = (x) => `<b>${formatBytes(x.peak_allocated_bytes)}</b> allocated, <b>${formatBytes(x.peak_reserved_bytes)}</b> reserved: ${share(x.peak_reserved_bytes)} of the card`;
    const firstOom = run.ranks.find((x) => x.out_of_memory);
    let verdict;
    if (!oomRanks.length) {
      verdict = `<strong>Fits</strong> on ${cardName} on ${gpus}: ${world > 1 ? `the heaviest rank, rank ${heaviest.rank},` : 'the run'} peaks at ${peaks(heaviest)}.`;
    } else if (oomRanks.length === world) {
      verdict = `<strong>Out of memory</strong> on ${cardName}: ${world > 1 ? `every rank of ${world} (${escape(r.set.strategy)})` : 'the one GPU'} `
        + `(${escape(triedOf(firstOom.out_of_memory))} at ${formatBytes(firstOom.peak_allocated_bytes)} allocated).`;
    } else {
      const fit = finished.map((x) => x.rank).sort((a, b) => a - b);
      verdict = `<strong>Out of memory</strong> on ${cardName}: ${oomRanks.length === 1 ? 'rank' : 'ranks'} ${rankRanges(oomRanks)} of ${world} `
        + `(${escape(triedOf(firstOom.out_of_memory))} at ${formatBytes(firstOom.peak_allocated_bytes)} allocated); `
        + `${fit.length === 1 ? 'rank' : 'ranks'} ${rankRanges(fit)} fit, the heaviest, rank ${heaviest.rank}, peaking at ${peaks(heaviest)}.`;
    }
    const millions = (n) => (n >= 1e9 ? `${(n / 1e9).toFixed(2)} B` : `${(n / 1e6).toFixed(1)} M`);
    const params = run.model_parameters ? `${millions(run.model_parameters)} parameters${run.trainable_parameters != null && run.trainable_parameters !== run.model_parameters ? `, ${millions(run.trainable_parameters)} trainable` : ''}` : '';
    const p = run.parameters || {};
    const about = [
      r.set.config.startsWith('{') ? 'your config.json' : r.set.config, params,
      `batch ${p.batch} × context ${p.context}`, `${p.dtype}${p.amp && p.amp !== 'false' ? `, autocast ${p.amp}` : ''}`,
      p.lora ? `LoRA r=${p.lora} on ${p.lora_targets}` : 'full fine-tune', `attention ${p.attn}`, p.optimizer, p.checkpointing ? 'checkpointing' : '',
    ].filter(Boolean).map(escape).join(' · ');
    const categories = CATEGORY_ORDER.filter((c) => run.ranks.some((x) => x.by_category?.[c]));
    const steps = run.ranks[0].steps;
    const longest = run.ranks.reduce((a, x) => (x.steps.length > a.length ? x.steps : a), steps);
    const options = world <= MAX_RANK_OPTIONS
      ? run.ranks.map((x) => x.rank).sort((a, b) => a - b).map((k) => {
        const alike = groups.find((g) => g.ranks.includes(k)).ranks;
        return new Option(`rank ${k}${alike.length > 1 ? ` (ranks ${rankRanges(alike)} alike)` : ''}`, String(k));
      })
      : groups.map((g) => new Option(`rank ${g.ranks[0]} (ranks ${rankRanges(g.ranks)})`, String(g.ranks[0])));
    $('size-result').innerHTML = `
      <p class="size-verdict ${oomRanks.length ? 'bad' : 'good'}" data-testid="size-verdict" data-fits="${!oomRanks.length}" data-oom-ranks="${oomRanks.join(',')}"
        data-heaviest-rank="${heaviest.rank}" data-peak-allocated="${heaviest.peak_allocated_bytes}" data-peak-reserved="${heaviest.peak_reserved_bytes}" data-capacity="${capacity}">${verdict}</p>
      <p class="result-line muted">${about}</p>
      <div class="compare-keys size-keys">${categories.map((c) => `<span><i class="swatch-box" style="background:${categoryColor(c)}"></i>${escape(c.replace(/_/g, ' '))}</span>`).join('')}
        <span><i class="swatch-box" style="background:${RESERVED_FILL};border:1px solid #9ca3af"></i>reserved, not allocated</span>
        <span><i class="line" style="border-color:#111827;border-top-style:dashed"></i>${custom ? 'the card' : escape(card)}</span>
        <span><i class="swatch-box" style="background:${STEP_MAX}"></i>max allocated in the step</span>
        <span><i class="swatch-box" style="background:${STEP_NOW};border-radius:50%"></i>allocated at its end</span></div>
      <p class="result-line muted size-steps">steps: ${longest.map((s, i) => `<b>${i + 1}</b> ${escape(s.label)}`).join(' · ')}</p>
      <div class="size-multiples" data-testid="size-multiples"></div>
      <div class="form size-open">
        <label>open a rank's trace in the timeline <select id="size-rank" data-testid="size-rank"></select></label>
        <button class="button" id="size-open" data-testid="size-open">Open</button>
        <span class="hint">or click a rank's chart</span>
      </div>`;
    // One scale for every chart: up to the card, unless the card is far above every peak (the
    // charts then show the peaks, and the card is named above them).
    const tallest = Math.max(1, ...run.ranks.map((x) => Math.max(x.peak_reserved_bytes, x.peak_allocated_bytes, ...x.steps.map((q) => q.max_allocated_bytes))));
    const ymax = capacity > 2 * tallest ? tallest * 1.12 : Math.max(capacity, tallest) * 1.08;
    const box = $('size-result').querySelector('.size-multiples');
    for (const g of groups) {
      const x = g.rank;
      const figure = document.createElement('figure');
      figure.className = `size-group${x.out_of_memory ? ' oom' : ''}`;
      figure.tabIndex = 0;
      figure.setAttribute('role', 'button');
      figure.title = `open rank ${g.ranks[0]}'s trace in the timeline`;
      Object.assign(figure.dataset, {
        testid: 'size-group', ranks: g.ranks.join(','), count: String(g.ranks.length), label: rankRanges(g.ranks),
        peakAllocated: String(x.peak_allocated_bytes), peakReserved: String(x.peak_reserved_bytes), oom: x.out_of_memory ? 'true' : 'false',
        byCategory: JSON.stringify(x.by_category || {}),
      });
      const name = world === 1 ? 'the one GPU' : `${g.ranks.length > 1 ? 'ranks' : 'rank'} ${rankRanges(g.ranks)}`;
      figure.innerHTML = `<figcaption><b>${escape(name)}</b>${g.ranks.length > 1 && world > 1 ? ` <span class="muted">(${g.ranks.length} alike)</span>` : ''}
          <span class="size-peak">${formatBytes(x.peak_allocated_bytes)} allocated · ${formatBytes(x.peak_reserved_bytes)} reserved</span></figcaption>
        <canvas aria-label="${escape(name)}: peak memory by category and memory per step"></canvas>
        ${x.out_of_memory ? `<p class="size-oom" title="${escape(x.out_of_memory)}">ran out of memory: ${escape(triedOf(x.out_of_memory))}</p>` : ''}`;
      figure.onclick = () => openRank(g.ranks[0]);
      figure.onkeydown = (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); openRank(g.ranks[0]); } };
      box.appendChild(figure);
      // A slot after the steps for the one an out-of-memory stopped, where any rank ran out.
      drawRank(figure.querySelector('canvas'), x, { ymax, capacity, card: custom ? 'card' : card, categories, steps: longest.length + (oomRanks.length ? 1 : 0), labelled: longest.length, tallest });
    }
    $('size-rank').replaceChildren(...options);
    $('size-open').onclick = () => openRank(Number($('size-rank').value));
  }
}

const M = { left: 56, right: 10, top: 16, bottom: 22 };
const BAR = 30;

// One rank: its peak as a stacked bar by category (reserved above it, lighter), the card as a
// dashed line, then each step's max allocated (a column) and allocated at its end (a dot).
function drawRank(canvas, rank, { ymax, capacity, card, categories, steps, labelled, tallest }) {
  const height = 190;
  const { ctx, width } = prepareCanvas(canvas, height);
  const h = height - M.top - M.bottom;
  const Y = (b) => M.top + h - (b / ymax) * h;
  ctx.strokeStyle = '#eef0f3';
  ctx.fillStyle = '#6b7280';
  ctx.textAlign = 'right';
  for (const v of ticks(0, ymax, 4, true)) {
    if (Y(v) < M.top + 4) continue;
    ctx.beginPath(); ctx.moveTo(M.left, Y(v)); ctx.lineTo(width - M.right, Y(v)); ctx.stroke();
    ctx.fillText(shortBytes(v), M.left - 6, Y(v));
  }
  // The peak, by category, bottom up; reserved above what is allocated.
  const x0 = M.left + 10;
  ctx.fillStyle = RESERVED_FILL;
  ctx.fillRect(x0, Y(rank.peak_reserved_bytes), BAR, Y(0) - Y(rank.peak_reserved_bytes));
  let below = 0;
  for (const c of categories) {
    const bytes = rank.by_category?.[c] || 0;
    if (!bytes) continue;
    ctx.fillStyle = categoryColor(c);
    ctx.fillRect(x0, Y(below + bytes), BAR, Y(below) - Y(below + bytes));
    below += bytes;
  }
  ctx.fillStyle = '#374151';
  ctx.textAlign = 'center';
  ctx.fillText('peak', x0 + BAR / 2, height - 9);
  // The steps.
  const s0 = x0 + BAR + 18;
  const sw = Math.max(1, width - M.right - s0);
  const slot = sw / Math.max(1, steps);
  const every = Math.max(1, Math.ceil(14 / slot));
  ctx.fillStyle = STEP_MAX;
  rank.steps.forEach((s, i) => {
    const x = s0 + i * slot;
    ctx.fillRect(x + slot * 0.15, Y(s.max_allocated_bytes), slot * 0.7, Y(0) - Y(s.max_allocated_bytes));
  });
  ctx.strokeStyle = STEP_NOW;
  ctx.fillStyle = STEP_NOW;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  rank.steps.forEach((s, i) => {
    const x = s0 + (i + 0.5) * slot;
    if (i) ctx.lineTo(x, Y(s.allocated_bytes)); else ctx.moveTo(x, Y(s.allocated_bytes));
  });
  ctx.stroke();
  for (const [i, s] of rank.steps.entries()) {
    ctx.beginPath(); ctx.arc(s0 + (i + 0.5) * slot, Y(s.allocated_bytes), 2.5, 0, 2 * Math.PI); ctx.fill();
  }
  ctx.fillStyle = '#6b7280';
  const stopped = rank.out_of_memory ? rank.steps.length : -1;
  for (let i = 0; i < (rank.out_of_memory ? stopped : labelled); i += every) ctx.fillText(String(i + 1), s0 + (i + 0.5) * slot, height - 9);
  // Out of memory: the step it stopped, a red line named on the axis.
  if (rank.out_of_memory) {
    const x = s0 + (stopped + 0.5) * slot;
    ctx.strokeStyle = '#b91c1c';
    ctx.lineWidth = 2;
    ctx.beginPath(); ctx.moveTo(x, M.top); ctx.lineTo(x, Y(0)); ctx.stroke();
    ctx.fillStyle = '#b91c1c';
    ctx.textAlign = 'center';
    ctx.fillText('OOM', x, height - 9);
    ctx.lineWidth = 1;
  }
  // The card: a dashed line, named at its right end (below the line when it is at the top); a
  // card far above the chart is named at its top.
  ctx.fillStyle = '#111827';
  ctx.textAlign = 'right';
  if (capacity <= ymax) {
    ctx.strokeStyle = '#111827';
    ctx.lineWidth = 1;
    ctx.setLineDash([6, 4]);
    ctx.beginPath(); ctx.moveTo(M.left, Y(capacity)); ctx.lineTo(width - M.right, Y(capacity)); ctx.stroke();
    ctx.setLineDash([]);
    const above = Y(capacity) - 8 > 4;
    label(ctx, `${card} ${shortBytes(capacity)}`, width - M.right, Y(capacity) + (above ? -8 : 9));
  } else {
    label(ctx, `↑ ${card} ${shortBytes(capacity)}: ${(capacity / tallest).toFixed(1)}× the tallest peak`, width - M.right, 6);
  }
}

// Right-aligned text on a white box, readable over the lines beneath it.
function label(ctx, text, x, y) {
  const w = ctx.measureText(text).width;
  const fill = ctx.fillStyle;
  ctx.fillStyle = 'rgba(255, 255, 255, 0.9)';
  ctx.fillRect(x - w - 3, y - 7, w + 6, 14);
  ctx.fillStyle = fill;
  ctx.fillText(text, x, y);
}
