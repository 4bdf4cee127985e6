// The scenarios panel: the library's scenarios (from the worker), a form of each one's
// parameters, variants and card, and the steps of the last run. A run loads into the page as a
// file does (app.js's load).
import { escapeHtml as escape, formatBytes } from './format.js';

const $ = (id) => document.getElementById(id);

export async function setUpScenarios({ ask, load }) {
  const scenarios = await ask('scenarios');
  $('scenario-select').replaceChildren(...scenarios.scenarios.map((s) => new Option(`${s.name}: ${s.title}`, s.name)));
  // The worker reports whether it has WebGPU (the scenario runs there); without it the option
  // is still listed, disabled, to say why.
  const { webgpu } = scenarios;
  const gpuOption = new Option(`this browser's GPU (WebGPU${webgpu ? ', real kernels' : ': not available here'})`, 'gpu');
  gpuOption.disabled = !webgpu;
  $('card-select').replaceChildren(
    ...scenarios.presets.map((p) => new Option(`simulated ${p.name} (${formatBytes(p.bytes)})`, p.name)),
    new Option('simulated card of custom size…', 'custom'),
    gpuOption,
  );
  $('scenario-select').onchange = showScenarioForm;
  $('card-select').onchange = () => { $('custom-card-box').hidden = $('card-select').value !== 'custom'; };
  $('run-scenario').onclick = runScenario;
  showScenarioForm();
  return { scenarios, runScenario, showRun, showRequestInScenarios };

  function selectedScenario() {
    return scenarios.scenarios.find((s) => s.name === $('scenario-select').value);
  }

  // A parameter's control: a list for a choice, true/false for a flag, a text field otherwise.
  // Each carries data-param; its value is the text the library parses.
  function parameterInput(p) {
    const name = escape(p.name);
    const options = p.kind.type === 'choice' ? p.kind.options : p.kind.type === 'flag' ? ['true', 'false'] : null;
    const control = options
      ? `<select data-param="${name}">${options.map((o) => `<option${o === p.default ? ' selected' : ''}>${escape(o)}</option>`).join('')}</select>`
      : `<input data-param="${name}" value="${escape(p.default)}" size="${Math.max(4, Math.min(30, p.default.length + 2))}">`;
    return `<label title="${escape(p.help)}">${name} ${control}</label>`;
  }

  function showScenarioForm() {
    const s = selectedScenario();
    // Names from the wasm side go in as text (new Option), never as markup.
    $('variant-select').replaceChildren(...(s.variants.length ? s.variants.map((v) => new Option(v, v)) : [new Option('–', '')]));
    $('variant-select').disabled = !s.variants.length;
    $('scenario-params').innerHTML = s.parameters.map(parameterInput).join('');
    $('scenario-explanation').textContent = s.explanation;
  }

  function scenarioRequest() {
    const set = {};
    const s = selectedScenario();
    for (const input of $('scenario-params').querySelectorAll('[data-param]')) {
      const p = s.parameters.find((q) => q.name === input.dataset.param);
      if (input.value.trim() !== p.default) set[p.name] = input.value.trim();
    }
    const card = $('card-select').value;
    return {
      scenario: s.name,
      variant: $('variant-select').value || null,
      set,
      device: card === 'gpu' ? 'gpu' : card === 'custom' ? `sim:${$('custom-card').value.trim()}` : `sim:${card}`,
    };
  }

  function showRun(run) {
    const rows = run.steps.map((s) => `<tr><td>${escape(s.label)}</td><td class="num">${formatBytes(s.allocated_bytes)}</td><td class="num">${formatBytes(s.reserved_bytes)}</td><td class="num">${formatBytes(s.max_allocated_bytes)}</td></tr>`).join('');
    $('scenario-result').innerHTML = `
      <p class="result-line">${escape(run.scenario)}${run.variant ? ` (${escape(run.variant)})` : ''} on ${escape(run.device)} (${formatBytes(run.capacity_bytes)}), settings ${escape(run.settings)}</p>
      <p class="result-line">max_memory_allocated <b data-testid="scenario-peak-allocated" data-bytes="${run.peak_allocated_bytes}">${formatBytes(run.peak_allocated_bytes)}</b>
        · max_memory_reserved <b data-testid="scenario-peak-reserved" data-bytes="${run.peak_reserved_bytes}">${formatBytes(run.peak_reserved_bytes)}</b></p>
      ${run.out_of_memory ? `<p class="result-line oom">${escape(run.out_of_memory)}</p>` : ''}
      <table data-testid="scenario-steps"><tr><th>step</th><th class="num">allocated</th><th class="num">reserved</th><th class="num">max allocated</th></tr>${rows}</table>`;
    $('scenario-result').dataset.run = JSON.stringify(run);
  }

  async function runScenario() {
    await load('runScenario', { request: scenarioRequest() });
  }

  // The scenarios panel set to a request run from elsewhere (a rank opened by Size a model), so
  // that its Run button runs it again.
  function showRequestInScenarios(request) {
    if (!scenarios?.scenarios.some((s) => s.name === request.scenario)) return;
    $('scenario-select').value = request.scenario;
    showScenarioForm();
    for (const [name, value] of Object.entries(request.set || {})) {
      const input = $('scenario-params').querySelector(`[data-param="${CSS.escape(name)}"]`);
      if (input) input.value = value;
    }
    const card = (request.device || '').replace(/^sim:/, '');
    const preset = scenarios.presets.some((p) => p.name === card);
    $('card-select').value = preset ? card : 'custom';
    if (!preset) $('custom-card').value = card;
    $('custom-card-box').hidden = preset;
  }
}
