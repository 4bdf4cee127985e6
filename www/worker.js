// The page's worker: all heavy work (read, parse, lay out, replay, scenario runs, export) runs
// here in tensormem's wasm so the page stays responsive. Messages in: {id, type, ...}; out: the
// same id with a result or {error}, plus {type: 'progress'} while reading and parsing.
import init, { LoadedTrace, parse_size, run_scenario, scenarios_json } from './pkg/tensormem.js';

const ready = init();
let loaded = null; // the current LoadedTrace

function progress(phase, fraction) {
  postMessage({ type: 'progress', phase, fraction });
}

// Reads a stream to one buffer, reporting progress against the expected size.
async function readAll(stream, total, what) {
  const reader = stream.getReader();
  const chunks = [];
  let received = 0;
  let lastReport = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    received += value.length;
    if (total && received - lastReport > total / 50) {
      lastReport = received;
      progress(`reading ${what}`, received / total);
    }
  }
  const bytes = new Uint8Array(received);
  let at = 0;
  for (const c of chunks) { bytes.set(c, at); at += c.length; }
  return bytes;
}

async function open(bytes, name) {
  progress(`parsing ${name} (${(bytes.length / 1048576).toFixed(1)} MB)`, 1);
  const t = LoadedTrace.parse(bytes);
  replace(t);
  return describe(name);
}

function replace(t) {
  if (loaded) loaded.free();
  loaded = t;
}

function describe(name) {
  return { name, devices: Array.from(loaded.devices()), run: loaded.run_json() ?? null };
}

function timeline(device) {
  progress('laying out the timeline', 1);
  const t = loaded.timeline(device);
  const arrays = {
    allocated: t.take_allocated(),
    reserved: t.take_reserved(),
    timeUs: t.take_time_us(),
    allocSize: t.take_alloc_size(),
    allocAddr: t.take_alloc_addr(),
    allocStream: t.take_alloc_stream(),
    allocStart: t.take_alloc_start(),
    allocEnd: t.take_alloc_end(),
    allocStack: t.take_alloc_stack(),
    allocGroup: t.take_alloc_group(),
    pieceX0: t.take_piece_x0(),
    pieceX1: t.take_piece_x1(),
    pieceY: t.take_piece_y(),
    pieceAlloc: t.take_piece_alloc(),
    stackOffsets: t.take_stack_offsets(),
    stackFrames: t.take_stack_frames(),
  };
  const meta = JSON.parse(t.meta_json());
  t.free();
  return { result: { device, arrays, meta }, transfer: Object.values(arrays).map((a) => a.buffer) };
}

const handlers = {
  async scenarios() {
    return JSON.parse(scenarios_json());
  },
  async openFile({ file }) {
    const bytes = await readAll(file.stream(), file.size, file.name);
    return open(bytes, file.name);
  },
  async openUrl({ url }) {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`${url}: the server answered ${response.status} ${response.statusText}`);
    const total = Number(response.headers.get('content-length')) || 0;
    const name = decodeURIComponent(url.split('/').pop() || url);
    const bytes = await readAll(response.body, total, name);
    return open(bytes, name);
  },
  async runScenario({ request }) {
    progress(`running ${request.scenario}`, 1);
    replace(run_scenario(JSON.stringify(request)));
    return describe(`scenario ${request.scenario}${request.variant ? ` (${request.variant})` : ''}`);
  },
  async timeline({ device }) {
    return timeline(device);
  },
  async replay({ device, allocConf, capacity, start }) {
    progress('replaying through the allocator', 1);
    return JSON.parse(loaded.replay(device, allocConf, capacity, start));
  },
  async parseSize({ text }) {
    return parse_size(text);
  },
  async stateAt({ device, position }) {
    return JSON.parse(loaded.state_at(device, position));
  },
  async exportTrace({ format }) {
    if (format === 'json') return loaded.to_json();
    const bytes = loaded.to_pickle();
    return { result: bytes, transfer: [bytes.buffer] };
  },
};

onmessage = async (event) => {
  const { id, type } = event.data;
  try {
    await ready;
    if (!handlers[type]) throw new Error(`unknown request ${type}`);
    const out = await handlers[type](event.data);
    if (out && out.transfer) postMessage({ id, result: out.result }, out.transfer);
    else postMessage({ id, result: out });
  } catch (e) {
    postMessage({ id, error: String(e && e.message ? e.message : e) });
  }
};
