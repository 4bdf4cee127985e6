// The what-if panel's report of one replay (the worker's answer to 'replay'): the recorded and
// replayed peaks side by side, out-of-memory errors, memory_summary() at the end, and whether the
// replay made PyTorch's decisions; and where the timeline marks the first failed request.
import { escapeHtml as escape, formatBytes } from './format.js';

const $ = (id) => document.getElementById(id);

// The panel's settings, as the worker's 'replay' and 'compareWhatIf' take them.
export const whatIfSettings = () => ({ allocConf: $('whatif-conf').value, capacity: $('whatif-capacity').value, start: $('whatif-start').value });

export function whatIfReport(out) {
  const r = out.replay;
  const divergence = r.first_divergence;
  const recordedPeak = r.recorded.peak_reserved_bytes;
  const replayedPeak = r.replayed.peak_reserved_bytes;
  let oomPosition = null;
  if (r.out_of_memory_at_start) oomPosition = 0;
  else if (r.first_oom_event != null) oomPosition = r.first_oom_event + 1;
  const diff = replayedPeak - recordedPeak;
  const html = `
    <p class="result-line">Settings <b>${escape(r.settings)}</b>, capacity <b>${r.capacity == null ? 'unlimited' : formatBytes(r.capacity)}</b>, start <b>${escape(r.start)}</b>.</p>
    <table>
      <tr><th></th><th class="num">recorded</th><th class="num">what if</th></tr>
      <tr><td>peak reserved</td><td class="num">${formatBytes(recordedPeak)}</td><td class="num" data-testid="whatif-peak-reserved" data-bytes="${replayedPeak}">${formatBytes(replayedPeak)}</td></tr>
      <tr><td>segment allocations</td><td class="num">${r.recorded.segment_allocs + r.recorded.segment_maps}</td><td class="num">${r.replayed.segment_allocs + r.replayed.segment_maps}</td></tr>
      <tr><td>out of memory</td><td class="num">–</td><td class="num">${r.replayed.ooms}</td></tr>
    </table>
    ${r.replayed.ooms || r.out_of_memory_at_start ? '' : `<p class="result-line">${diff === 0 ? 'Same peak reserved as recorded.' : `Peak reserved ${diff < 0 ? 'falls' : 'rises'} by <b>${formatBytes(Math.abs(diff))}</b>.`}</p>`}
    ${r.out_of_memory_at_start ? `<p class="result-line oom">Out of memory at the start: ${escape(r.out_of_memory_at_start)}</p>` : ''}
    ${!r.out_of_memory_at_start && r.replayed.ooms ? `<p class="result-line oom">PyTorch would have stopped with "CUDA out of memory" at event ${r.first_oom_event} (marked on the timeline). The replay went on without the ${r.replayed.ooms} allocation(s) that did not fit, so the figures after that point are not a run that could happen.</p>` : ''}
    <details><summary>memory_summary() at the end of the what-if run</summary><pre class="summary">${escape(out.memory_summary)}</pre></details>
    ${divergence ? `<details><summary>Where the replay first decided differently from the recording</summary><p class="result-line muted">Event ${divergence.event}: ${escape(divergence.reason)}</p></details>`
  : `<p class="result-line muted">${r.start === 'replaced' ? 'Same device memory calls as recorded (addresses differ: the start was replaced).' : 'The replay made exactly PyTorch\'s decisions.'}</p>`}`;
  return { html, oomPosition };
}
