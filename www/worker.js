// The page's worker: all heavy work (read, parse, lay out, replay, diagnose, scenario runs, export) runs
// here in tensormem's wasm so the page stays responsive. Messages in: {id, type, ...}; out: the
// same id with a result or {error}, plus {type: 'progress'} while reading and parsing.
import init, { LoadedTrace, Predictor, TimelineArrays, SourceHasher, TraceLoader, diagnose_scenario, finder_running, fit_table, make_finder_fail_for_tests, parse_size, run_scenario, scenarios_json, take_panic } from './pkg/tensormem.js';
import { colorGroups, topBytes, GHOST } from './palette.js';

// Once the wasm is instantiated, run the decode and layout paths once on a small trace of our
// own: the engine compiles wasm in tiers, and the first large file would otherwise pay for the
// slow first tier (measured: 65 ms instead of 12 ms to parse the 3 MB training fixture).
let wasm = null;
// Linear memory size after the last parse and layout, for the benchmark.
const wasmAt = { parsed: 0, laidOut: 0 };
const ready = init().then(async (exports) => {
  wasm = exports;
  const warm = await run_scenario(JSON.stringify({ scenario: 'variable-batch', set: { layers: '24' } }));
  const bytes = warm.to_pickle();
  for (let k = 0; k < 3; k++) {
    // Fed in two chunks, as files are.
    const loader = new TraceLoader(bytes.length);
    loader.feed(bytes.subarray(0, bytes.length >> 1));
    loader.feed(bytes.subarray(bytes.length >> 1));
    const again = loader.finish();
    loader.free();
    const t = again.timeline(0);
    again.curves(t);
    const n = t.events() + 1;
    t.raster(0, n, 1200, 400, 2e9, Uint32Array.from({ length: 64 }, (_, i) => i), new Uint32Array(64).fill(1), new Uint8Array(0), 0);
    t.free();
    again.free();
  }
  warm.free();
});
// Traces by id: the page's current one, candidates still being opened, and the compared one.
// The page says which candidate became current ('use') so that a slow load finishing after a
// newer one never replaces it.
const traces = new Map();
let nextTrace = 1;
let other = null; // the trace the current one is compared with

function progress(phase, fraction) {
  postMessage({ type: 'progress', phase, fraction });
}

// A stream's reader and a `read()` giving its next chunk. Byte streams (File.stream() and fetch
// bodies in Chromium) are read into one reusable 1 MB buffer: reading a large file then leaves no
// trail of 64 KB chunks for the garbage collector, and takes a task hop per megabyte only.
function chunkReader(stream) {
  let byob = null;
  try { byob = stream.getReader({ mode: 'byob' }); } catch { /* not a byte stream */ }
  if (!byob) {
    const reader = stream.getReader();
    return { reader, read: () => reader.read() };
  }
  let buffer = new ArrayBuffer(1 << 20);
  return {
    reader: byob,
    read: async () => {
      const { done, value } = await byob.read(new Uint8Array(buffer));
      // The buffer was handed to the stream and comes back as `value`'s.
      if (value) buffer = value.buffer;
      return { done, value };
    },
  };
}

// A file's bytes as a stream: Chromium's own, read with one buffer (see chunkReader), started
// again where it stopped, without that buffer, if a read takes longer than STALLED_MS: that
// stream could stall for good while blobs kept by the page were read (the page tests saw it in a
// file opened beside one drawn from its layout kept, in the page's worker and in the doctor's).
const STALLED_MS = 5000;
function fileStream(file) {
  let at = 0;
  let source = chunkReader(file.stream());
  return new ReadableStream({
    async pull(controller) {
      for (;;) {
        let timer;
        const stalled = new Promise((resolve) => { timer = setTimeout(() => resolve(null), STALLED_MS); });
        const got = await Promise.race([source.read(), stalled]);
        clearTimeout(timer);
        if (got) {
          if (got.done) controller.close();
          else {
            at += got.value.length;
            controller.enqueue(got.value);
          }
          return;
        }
        console.warn(`reading ${file.name} stalled at byte ${at}: reading on from there`);
        source.reader.cancel().catch(() => {});
        const reader = file.slice(at).stream().getReader();
        source = { reader, read: () => reader.read() };
      }
    },
    cancel() {
      return source.reader.cancel();
    },
    // A chunk is read only when asked for: the one buffer is handed back to the file's stream
    // only once the chunk read into it was parsed.
  }, { highWaterMark: 0 });
}

// Parses a snapshot as it streams in (a file or a download): each chunk goes straight to the
// wasm parser, so neither the file's bytes nor its node tree is ever held whole.
// `onKey(key)`, when given, is told the key of the bytes read (see SourceHasher) before the loader
// is freed.
async function loadStream(stream, total, name, onKey) {
  const loader = new TraceLoader(total || 0);
  const { reader, read } = chunkReader(stream);
  let received = 0;
  let lastReport = 0;
  try {
    for (;;) {
      const { done, value } = await read();
      if (done) break;
      loader.feed(value);
      received += value.length;
      if (received - lastReport > (total || 1 << 24) / 50) {
        lastReport = received;
        const mb = (n) => (n / 1048576).toFixed(1);
        const entries = loader.entries_decoded();
        progress(`reading ${name}: ${mb(received)}${total ? ` of ${mb(total)}` : ''} MB${entries ? `, ${entries.toLocaleString('en-US')} trace entries decoded` : ''}`, total ? received / total : 0.5);
      }
    }
    progress(`indexing ${name}`, 1);
    onKey?.(loader.source_key());
    return loader.finish();
  } catch (e) {
    reader.cancel().catch(() => {});
    throw e;
  } finally {
    loader.free();
  }
}

// ---- Decodes kept for the next open (IndexedDB), keyed by the file's hash and length: opening
// the same bytes again reads back what was decoded instead of parsing the pickle again.
// Files under 16 MiB parse in a fraction of a second and are not kept; all kept decodes
// together stay under KEPT_LIMIT, the least recently used going first. Without IndexedDB (some
// private windows) or when it fails, files are simply parsed each time.
const WORTH_KEEPING = 16 << 20;
const KEPT_LIMIT = 1 << 30;
let keptDb = null;
// The last decode being written: a second open of the same file waits for it.
let keeping = Promise.resolve();
// Decodes to keep, by trace ({key, t, name, file, byPage}): encoding a 1 GB file's decode takes
// seconds, which neither the first paint nor the doctor's findings wait for. A file the page
// opens to draw (`byPage`) is kept when the page asks (keepView, after its first paint and its
// diagnosis) or once this worker has diagnosed it; any other (a recording for "What fits", a
// compared file) after the request that follows its opening; every one before another file is
// opened.
const toKeep = new Map();

function keepPending(which = () => true) {
  const pending = [...toKeep.values()].filter(which);
  for (const p of pending) toKeep.delete(p.t);
  for (const p of pending) {
    // A trace already closed (wasm-bindgen zeroes a freed object's pointer) is not kept.
    if (!p.t.__wbg_ptr) continue;
    progress(`keeping the decode of ${p.name} for the next open`, 1);
    const kept = keep(p.key, p.t, p.file).catch((e) => console.warn(`the decode of ${p.name} could not be kept (${e.message})`));
    keeping = Promise.all([keeping, kept]);
  }
}

function idb(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

// Resolves once `tx` has committed; rejects if it fails or is aborted.
function committed(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = resolve;
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
}

function openKept() {
  if (!keptDb) {
    const open = indexedDB.open('tensormem', 3);
    open.onupgradeneeded = () => {
      const db = open.result;
      if (!db.objectStoreNames.contains('decoded')) db.createObjectStore('decoded');
      // {size, used} by key, so that trimming never reads the decodes themselves.
      if (!db.objectStoreNames.contains('decodedUse')) db.createObjectStore('decodedUse');
      // The key last kept for a file's name, size and modification time: a file never seen is
      // parsed (and hashed on the way) without reading it twice first.
      if (!db.objectStoreNames.contains('decodedNames')) db.createObjectStore('decodedNames');
      // What the page showed of a kept decode's file once drawn ({image, summary} by key; see
      // 'preview'): shown at once when the same file is opened again.
      if (!db.objectStoreNames.contains('views')) db.createObjectStore('views');
    };
    keptDb = idb(open);
    keptDb.catch(() => { keptDb = null; });
  }
  return keptDb;
}

// The key of `file`'s bytes (see SourceHasher), read in slices: a second stream of a file
// another worker is reading could stall in Chromium. `report`: whether to show the progress.
async function keyOf(file, report = true) {
  const hasher = new SourceHasher();
  const SLICE = 8 << 20;
  try {
    for (let at = 0; at < file.size; at += SLICE) {
      hasher.update(new Uint8Array(await file.slice(at, at + SLICE).arrayBuffer()));
      if (report) progress(`checking ${file.name} against the decodes kept (${(Math.min(file.size, at + SLICE) / 1048576).toFixed(1)} MB)`, Math.min(1, (at + SLICE) / file.size));
    }
    return hasher.key();
  } finally {
    hasher.free();
  }
}

// Reads of what this browser kept (IndexedDB blobs) still in flight: a file's stream started
// meanwhile could stall for good in Chromium (its reader with its own buffer: a page test saw it
// about one run in four), so a file is parsed once they are done (see parse).
let keptReads = Promise.resolve();
function readingKept(promise) {
  keptReads = Promise.all([keptReads, promise.catch(() => {})]);
  return promise;
}

// The decode kept for `key` (a Blob); null when none is kept.
async function keptDecode(key) {
  const db = await openKept();
  return (await idb(db.transaction('decoded').objectStore('decoded').get(key))) ?? null;
}

// Whether the ends of `blob`, the decode kept for `key`, say it is whole (see
// LoadedTrace.decoded_ends_agree: what lies between is checked when it is read back).
async function decodeEndsAgree(blob, key) {
  const [head, tail] = LoadedTrace.decoded_ends();
  if (blob.size < head + tail) return false;
  const [h, t] = await readingKept(Promise.all([blob.slice(0, head).arrayBuffer(), blob.slice(blob.size - tail).arrayBuffer()]));
  return LoadedTrace.decoded_ends_agree(new Uint8Array(h), new Uint8Array(t), blob.size, key);
}

// The decode kept for `key`, read back; null when none is kept or it cannot be used (then it is
// removed, and the file parsed as if never opened). `report`: whether to show the progress.
async function reopen(key, name, report = true) {
  const blob = await keptDecode(key);
  if (!blob) return null;
  if (report) progress(`reading back the decode of ${name} kept by this browser`, 1);
  const db = await openKept();
  try {
    const t = LoadedTrace.from_decoded(new Uint8Array(await readingKept(blob.arrayBuffer())), key);
    touch(db, key, blob.size);
    return t;
  } catch (e) {
    console.warn(`the kept decode of ${name} could not be read back (${e.message}): parsing the file`);
    const tx = db.transaction(['decoded', 'decodedUse', 'views'], 'readwrite');
    for (const store of ['decoded', 'decodedUse', 'views']) tx.objectStore(store).delete(key);
    return null;
  }
}

const fileSeen = (file) => `${file.name}\u0000${file.size}\u0000${file.lastModified}`;

// The key of the decode kept for a file of this name, size and modification time, if any (only
// its bytes' hash says it is the same file: one changed in place reads as another).
async function seenBefore(file) {
  const db = await openKept();
  return idb(db.transaction('decodedNames').objectStore('decodedNames').get(fileSeen(file)));
}

// Posts the view kept for `key` (see keepView), if any, as 'preview' for the page's load
// `ticket`; returns what was kept with it to draw the file before its decode is read back
// ({layout, page}: both absent where a view was kept without them), or null without a view.
async function postPreview(key, ticket) {
  const db = await openKept();
  const view = await idb(db.transaction('views').objectStore('views').get(key));
  if (!view) return null;
  const { layout, page, ...shown } = view;
  postMessage({ type: 'preview', ticket, ...shown });
  return layout && page ? { layout, page } : {};
}

// The layout of the view of `trace` (`t`, a LoadedTrace) the page shows, as first drawn, to keep
// beside its decode under `key` ({device, by, width, height, pixels, bytes: a Blob, curves: its
// curves as numbers, read back without decoding: a Blob}; see timeline()): the next open draws
// the file from it before its decode is read back, instead of after, then laying it out and
// inferring its categories again (1.0, 0.8 and 0.2 s of a 1 GB file's). Null when the view
// shown has no first image of its own.
function keptLayoutOf(trace, t, key) {
  const v = [...views.values()].find((shown) => shown.trace === trace && shown.firstImage);
  if (!v) return null;
  const bytes = blobBuilder();
  // The curves go to one Blob of their chunks, not one of 32 MB Blobs: Chromium then failed to
  // read them back (NotReadableError) in about one reopen in five of the 1 GB file (276 MB of
  // curves), and the timeline was laid out from the trace instead (2-3.4 s instead of 0.7-0.9 s;
  // 0 failures in 16 reopens since). Holding them whole costs the renderer's peak 0.05 GB.
  const curves = [];
  try {
    t.keep_layout(v.t, key, bytes.add);
    t.keep_curves(v.t, (chunk) => curves.push(chunk));
  } catch (e) {
    console.warn(`the timeline could not be kept (${e.message})`);
    return null;
  }
  const { width, height, by, pixels } = v.firstImage;
  v.firstImage = null;
  return { device: v.device, by, width, height, pixels, bytes: bytes.blob(), curves: new Blob(curves) };
}

// The layout kept with `key`'s view, read (see keptLayoutOf); null if none or unreadable.
async function readLayout(layout, key) {
  if (!layout) return null;
  try {
    const [bytes, curves] = await readingKept(Promise.all([layout.bytes.arrayBuffer(), layout.curves.arrayBuffer()]));
    return { ...layout, key, bytes: new Uint8Array(bytes), curves };
  } catch (e) {
    console.warn(`the timeline kept could not be read (${e.message}): laying it out`);
    return null;
  }
}

// Marks `key`'s decode (of `size` bytes) as used now, for the least-recently-used trimming; the
// size its view adds is kept.
function touch(db, key, size) {
  const uses = db.transaction('decodedUse', 'readwrite').objectStore('decodedUse');
  uses.get(key).onsuccess = (e) => uses.put({ size, ...e.target.result, used: Date.now() }, key);
}

// Whether `file`'s bytes are still those `key` was kept for, hashed after its kept decode was
// read back (see loadFile); if not, the file is no longer taken for the one seen before, and
// the decode and view kept of its old bytes go (a file changed in place rarely changes back).
async function sameBytes(file, key) {
  let now = null;
  try {
    now = await keyOf(file, false);
  } catch (e) {
    console.warn(`${file.name} could not be read again to check it against the decode kept (${e.message})`);
  }
  const same = now === key;
  if (!same) {
    const db = await openKept();
    const stale = now !== null ? ['decoded', 'decodedUse', 'views'] : [];
    const tx = db.transaction(['decodedNames', ...stale], 'readwrite');
    tx.objectStore('decodedNames').delete(fileSeen(file));
    for (const store of stale) tx.objectStore(store).delete(key);
    await committed(tx).catch(() => {});
  }
  return same;
}

// A Blob built from chunks (Uint8Arrays) as they come, handed to the browser's blob store 32 MB at
// a time, so that the worker never holds what it keeps whole (a 1 GB file's decode and curves:
// 464 MB; the renderer's peak in the page benchmark went from 3.06 to 2.61 GB).
function blobBuilder() {
  const parts = [];
  let chunks = [];
  let size = 0;
  const seal = () => {
    if (chunks.length) parts.push(new Blob(chunks));
    chunks = [];
    size = 0;
  };
  return {
    add: (chunk) => {
      chunks.push(chunk);
      size += chunk.length;
      if (size >= 32 << 20) seal();
    },
    blob: () => {
      seal();
      return new Blob(parts);
    },
  };
}

// Keeps `t`'s decode under `key`, then trims the others to fit KEPT_LIMIT.
async function keep(key, t, file) {
  const chunks = blobBuilder();
  t.keep_decoded(key, chunks.add);
  const blob = chunks.blob();
  if (blob.size > KEPT_LIMIT) return;
  const db = await openKept();
  const tx = db.transaction(['decoded', 'decodedUse', 'decodedNames'], 'readwrite');
  tx.objectStore('decoded').put(blob, key);
  tx.objectStore('decodedUse').put({ size: blob.size, used: Date.now() }, key);
  tx.objectStore('decodedNames').put(key, fileSeen(file));
  await committed(tx);
  await trim(db, key);
}

// Removes the least recently used decodes (and their views) but `key`'s until all fit KEPT_LIMIT.
async function trim(db, key) {
  const uses = db.transaction('decodedUse').objectStore('decodedUse');
  const [keys, values] = await Promise.all([idb(uses.getAllKeys()), idb(uses.getAll())]);
  const byAge = keys.map((k, i) => ({ k, ...values[i] })).sort((a, b) => a.used - b.used);
  let total = byAge.reduce((sum, e) => sum + e.size, 0);
  const gone = new Set();
  for (const e of byAge) {
    if (total <= KEPT_LIMIT) break;
    if (e.k !== key) gone.add(e.k);
    total -= e.k === key ? 0 : e.size;
  }
  if (!gone.size) return;
  const names = db.transaction('decodedNames').objectStore('decodedNames');
  const [seen, seenKeys] = await Promise.all([idb(names.getAllKeys()), idb(names.getAll())]);
  const tx = db.transaction(['decoded', 'decodedUse', 'decodedNames', 'views'], 'readwrite');
  for (const k of gone) {
    for (const store of ['decoded', 'decodedUse', 'views']) tx.objectStore(store).delete(k);
  }
  seen.forEach((name, i) => { if (gone.has(seenKeys[i])) tx.objectStore('decodedNames').delete(name); });
  await committed(tx);
}

// Opens a file: from the decode kept by an earlier open of the same bytes when there is one
// (`reopened` is then set on the trace), else parsed, and its decode kept for the next time
// unless `mayKeep` is false (the doctor's worker: the page's keeps it). A trace whose decode is
// (or will be) kept carries its key as `key`.
// Only a file seen before (name, size, time) is hashed first; any other is hashed as it parses.
// `ticket`: the page's load this open is for, which shows the file at once: its view kept by the
// last open is posted first ('preview'), and its kept decode read back before the file is hashed
// (1.8 s of a 1 GB file's 6 s). The page asks 'sameBytes' once it has drawn the trace: the file
// is hashed then, and opened again (parsed) if it is not the one kept.
async function loadFile(file, mayKeep = true, ticket = null) {
  let keeps = false;
  if (file.size >= WORTH_KEEPING && self.indexedDB) {
    try {
      keepPending();
      await keeping;
      keeps = true;
      const seen = await seenBefore(file);
      if (seen) {
        const early = mayKeep && ticket !== null;
        const drawn = early ? await postPreview(seen, ticket) : null;
        const key = early ? seen : await keyOf(file);
        // Drawn from the layout kept, its decode read back after (or, if it cannot be, the file
        // parsed: the drawing is of the same bytes). One cut short is not used at all.
        if (drawn?.layout) {
          const blob = await keptDecode(key);
          if (blob && (await decodeEndsAgree(blob, key))) {
            const checkBytes = () => sameBytes(file, key);
            const read = async () => (await reopen(key, file.name, false)) ?? parse(file, true, true);
            return new Pending(drawn.page, key, readLayout(drawn.layout, key), checkBytes, read);
          }
        }
        const t = await reopen(key, file.name);
        if (t) {
          // A view kept before layouts were (or without one) gets its layout when next drawn.
          Object.assign(t, { reopened: true, key, layoutMissing: early && !drawn?.layout });
          if (early) t.checkBytes = () => sameBytes(file, key);
          return t;
        }
      }
    } catch (e) {
      console.warn(`the decodes kept by this browser cannot be used (${e.message}): parsing the file`);
    }
  }
  return parse(file, keeps && mayKeep);
}

// Parses `file`; its decode kept for the next open if `keep` (see toKeep; `byPage`: the page
// draws it).
async function parse(file, keep, byPage = false) {
  await keptReads;
  let key = null;
  const t = await loadStream(fileStream(file), file.size, file.name, (k) => { key = k; });
  if (keep) {
    toKeep.set(t, { key, t, name: file.name, file, byPage });
    t.key = key;
  }
  return t;
}

// A file opened again, drawn before its trace is read back (see loadFile): the page learns its
// devices from the view kept, its first timeline is read back from the layout kept with it
// (`keptLayout`, a promise), and its trace is read back once the page shows it ('use'), or as
// soon as a request needs it (`trace()`), then stands in its place in `traces`.
class Pending {
  constructor(page, key, keptLayout, checkBytes, readBack) {
    Object.assign(this, { page, key, keptLayout, checkBytes, readBack, reopened: true, id: null, promise: null, closed: false });
  }

  // The trace, read back once (never once closed).
  trace() {
    if (this.closed && !this.promise) return Promise.reject(new Error('this trace is no longer open'));
    this.promise ??= this.readBack().then((t) => {
      if (this.closed) {
        t.free();
        throw new Error('this trace is no longer open');
      }
      // Parsed instead (its kept decode could not be read back), it has a key of its own.
      t.key ??= this.key;
      Object.assign(t, { reopened: true, checkBytes: this.checkBytes, sameBytes: this.sameBytes });
      traces.set(this.id, t);
      // Its timelines read its trace from now on (the doctor reads them instead of laying it out).
      for (const v of views.values()) {
        if (v.trace === this.id && !v.t.attach(t)) console.warn('a timeline kept is not of its trace as read back: the doctor lays it out again');
      }
      return t;
    });
    return this.promise;
  }

  free() {
    this.closed = true;
  }
}

function close(id) {
  traces.get(id)?.free();
  traces.delete(id);
  for (const [v, { trace, t }] of views) if (trace === id) { t.free(); views.delete(v); }
}

// The trace `id` names: a LoadedTrace, or a Pending one (see loadedTrace).
function get(id) {
  const t = traces.get(id);
  if (!t) throw new Error('this trace is no longer open');
  return t;
}

// The LoadedTrace `id` names, read back first if it is still Pending.
async function loadedTrace(id) {
  const t = get(id);
  return t instanceof Pending ? t.trace() : t;
}

// What the page learns of a trace when it opens (and keeps with its view: see keepView).
function pageInfo(t) {
  return { devices: Array.from(t.devices()), deviceLabels: t.device_labels(), defaultDevice: t.default_device() ?? null, run: t.run_json() ?? null };
}

function add(t, name) {
  const id = nextTrace++;
  traces.set(id, t);
  if (t instanceof Pending) t.id = id;
  return {
    trace: id, name, ...(t instanceof Pending ? t.page : pageInfo(t)),
    reopened: Boolean(t.reopened),
    // Its decode is kept, and the page's view of it may be (see keepView).
    keeps: Boolean(t.key),
  };
}


// Laid-out timelines by view id ({trace, t}): the newest of each open trace (the device shown),
// kept to rasterise it and answer questions about it. Requests name the view they were made
// for, so one made for a device the page has just left is refused instead of answered from the
// new one.
const views = new Map();
let nextView = 1;

// Each allocation's inferred category ({category, confidence, reason}: Uint8Arrays by allocation
// id, indices into the lists `categories`, `confidences` and `reasons`), inferred in wasm the
// first time.
function inferredOf(t) {
  const [category, confidence, reason] = t.inferred();
  return { category, confidence, reason, ...JSON.parse(t.inferred_names_json()) };
}
const inferredBuffers = (inferred) => (inferred ? [inferred.category.buffer, inferred.confidence.buffer, inferred.reason.buffer] : []);

// `first` ({width, height} in device pixels), when the page will draw by event index: the whole
// trace is rasterised right away and sent with the timeline, saving the page a round trip.
// `colorBy`: what the bands are coloured by (`recorded`, `inferred`, `frame`), or null for the
// trace's default: its own categories where it records them (tensormem's traces), else the
// categories the doctor infers. A trace without categories of its own gets the inferred ones
// whatever colours it (the page shows an allocation's in its details).
//
// A trace of `first.alone` events or more has its first image drawn from bands laid out a sample
// per pixel column (a fraction of the full layout's time): the page asks for the full layout
// ('fullBands') once it has asked for the diagnosis, so that the findings come first.
//
// `loaded`: the LoadedTrace; or, for a Pending one, null and `kept`, the layout kept with its
// view (see keptLayoutOf): then null is returned if that cannot be read back.
function timeline(trace, device, first, colorBy, loaded, kept = null) {
  let t = null;
  let curves = null;
  if (kept) {
    progress('reading back the timeline kept by this browser', 1);
    try {
      t = TimelineArrays.from_kept(device, kept.bytes, kept.key);
      // [allocated, reserved, time_us], one after the other, where they agree with the layout's
      // figures (the layout has a hash; the curves, as numbers, only these).
      const n = t.events() + 1;
      const read = kept.curves.byteLength === 3 * n * 8 ? [0, 1, 2].map((k) => new Float64Array(kept.curves, k * n * 8, n)) : null;
      if (read && curvesAgree(t, read)) curves = read;
      else console.warn('the curves kept do not agree with their timeline: laying it out');
    } catch (e) {
      console.warn(`the timeline kept could not be read back (${e.message}): laying it out`);
    }
    if (!curves) {
      t?.free();
      return null;
    }
  } else {
    progress('laying out the timeline', 1);
    const alone = first && loaded.events_of(device) >= first.alone;
    t = alone ? loaded.timeline_for_first_image(device, first.width) : loaded.timeline(device);
  }
  const options = t.color_options();
  const by = options.includes(colorBy) ? colorBy : options[0];
  t.set_color_by(by);
  const inferred = by === 'inferred' || !options.includes('recorded') ? inferredOf(t) : null;
  for (const [v, old] of views) if (old.trace === trace) { old.t.free(); views.delete(v); }
  const viewId = nextView++;
  views.set(viewId, { trace, t, device });
  const [allocated, reserved, timeUs] = curves ?? loaded.curves(t);
  const arrays = {
    allocated,
    reserved,
    timeUs,
    allocSize: t.alloc_size(),
    allocAddr: t.alloc_addr(),
    allocStream: t.alloc_stream(),
    allocStart: t.alloc_start(),
    allocEnd: t.alloc_end(),
    allocStack: t.alloc_stack(),
    allocGroup: t.alloc_group(),
    stackOffsets: t.stack_offsets(),
    stackFrames: t.stack_frames(),
    scopeOffsets: t.scope_offsets(),
    scopeFrames: t.scope_frames(),
    // The bands' rectangles: the page hit-tests them itself (hit.js), answering a hover while
    // this worker is busy (the doctor, a what-if).
    pieceOffsets: t.piece_offsets(),
    pieceX0: t.piece_x0(),
    pieceY: t.piece_y(),
  };
  const meta = JSON.parse(t.meta_json());
  // Curves kept share one buffer.
  const transfer = [...new Set([...Object.values(arrays).map((a) => a.buffer), ...inferredBuffers(inferred)])];
  // The first image is drawn after the timeline is posted, so that the page sets itself up
  // while this worker draws (two cores at work), and posted on its own as 'firstImage'.
  // Without it (an error) the page asks for the image itself.
  const after = first && (() => {
    try {
      const { width, height } = first;
      const same = kept && kept.width === width && kept.height === height && kept.by === by;
      let pixels = same ? kept.pixels : null;
      if (!pixels) {
        const { order, pixels: colors } = colorGroups(meta.groups);
        pixels = t.raster(0, t.events() + 1, width, height, topBytes(meta.summary), order, colors, new Uint8Array(0), GHOST);
        // A trace whose decode is kept keeps this image with its layout (see keepView).
        const shown = views.get(viewId);
        if (loaded?.key && (!loaded.reopened || loaded.layoutMissing) && shown) shown.firstImage = { width, height, by, pixels: pixels.slice() };
      }
      postMessage({ type: 'firstImage', view: viewId, pixels, width, height }, [pixels.buffer]);
    } catch {
      postMessage({ type: 'firstImage', view: viewId, pixels: null });
    }
  });
  const bandsForFirstImage = t.bands_for_first_image();
  return { result: { view: viewId, device, arrays, meta, colorBy: { by, options }, inferred, bandsForFirstImage }, transfer, after };
}

function view(id) {
  const v = views.get(id);
  if (!v) throw new Error('this timeline is no longer shown');
  return v.t;
}

// Whether `curves` ([allocated, reserved, time_us]) agree with `t`'s figures at the start, the
// peak and the end.
function curvesAgree(t, [allocated, reserved]) {
  const [peakX, peakAllocated, startAllocated, startReserved, finalAllocated, finalReserved] = t.curve_figures();
  const n = allocated.length;
  return allocated[peakX] === peakAllocated && allocated[0] === startAllocated && reserved[0] === startReserved
    && allocated[n - 1] === finalAllocated && reserved[n - 1] === finalReserved;
}

// The second trace of a comparison: its curves and who held memory at its peak.
function describeOther(name, device) {
  const devices = Array.from(other.devices());
  const d = devices.includes(device) ? device : devices[0];
  if (d === undefined) throw new Error(`${name} has no segments and no trace`);
  const t = other.timeline(d);
  const [allocated, reserved] = other.curves(t);
  const arrays = { allocated, reserved };
  const meta = JSON.parse(t.meta_json());
  t.free();
  const result = { name, device: d, arrays, summary: meta.summary, groups: meta.groups };
  return { result, transfer: [arrays.allocated.buffer, arrays.reserved.buffer] };
}

function replaceOther(t) {
  if (other) other.free();
  other = t;
}

// The "What fits" view's recordings by slot ({trace, name}), and the last prediction (kept for
// its export).
const fitsSlots = new Map();
let predictor = null;

const handlers = {
  // A recording for the "What fits" view, in `slot`: its small curves.
  async fitsOpen({ slot, file }) {
    const t = await loadFile(file);
    let overview;
    try {
      overview = JSON.parse(t.overview_json());
    } catch (e) {
      t.free();
      throw e;
    }
    fitsSlots.get(slot)?.trace.free();
    fitsSlots.set(slot, { trace: t, name: file.name });
    return { slot, name: file.name, overview };
  },
  async fitsClear({ slot }) {
    fitsSlots.get(slot)?.trace.free();
    fitsSlots.delete(slot);
  },
  // `tensormem predict` from the slots given (in order) with their values; see Predictor.predict.
  async fitsPredict({ slots, request }) {
    const p = new Predictor();
    try {
      for (const slot of slots) {
        const s = fitsSlots.get(slot);
        if (!s) throw new Error('a recording of this view is no longer open: pick it again');
        p.add(s.trace, s.name);
      }
      progress(request.fit ? `searching the largest ${request.fit} that fits` : 'aligning, fitting and replaying', 0.05);
      const out = JSON.parse(p.predict(JSON.stringify(request), (done, of) => progress(`replaying the sweep: ${done} of ${of} values`, done / of)));
      predictor?.free();
      predictor = p;
      return out;
    } catch (e) {
      p.free();
      throw e;
    }
  },
  // The last prediction's trace as the page's trace (the timeline and every panel show it).
  async fitsOpenPredicted({ name }) {
    const t = predictor?.predicted_trace();
    if (!t) throw new Error('nothing to show: predict first');
    return add(t, name);
  },
  async fitsExport() {
    const bytes = predictor ? predictor.predicted_pickle() : new Uint8Array(0);
    if (!bytes.length) throw new Error('nothing to export: predict first');
    return { result: bytes, transfer: [bytes.buffer] };
  },
  async scenarios() {
    // Scenarios run here, so WebGPU must be exposed to this worker (not only to the page).
    return { ...JSON.parse(scenarios_json()), webgpu: 'gpu' in self.navigator };
  },
  async openFile({ file, keep, ticket }) {
    const t = await loadFile(file, keep, ticket ?? null);
    const pending = toKeep.get(t);
    if (pending) pending.byPage = true;
    wasmAt.parsed = wasm.memory.buffer.byteLength;
    return add(t, file.name);
  },
  async openUrl({ url }) {
    let response;
    try {
      response = await fetch(url);
    } catch (e) {
      throw new Error(`${url} could not be fetched (${e.message}): is the server that served this page (tensormem serve) still running?`);
    }
    if (!response.ok) throw new Error(`${url}: the server answered ${response.status} ${response.statusText}`);
    // A compressed body's length is not the file's.
    const total = response.headers.get('content-encoding') ? 0 : Number(response.headers.get('content-length')) || 0;
    const name = decodeURIComponent(url.split('/').pop() || url);
    return add(await loadStream(response.body, total, name), name);
  },
  // `label`: the name the page shows for the run (default: the scenario's).
  async runScenario({ request, label }) {
    const where = request.device === 'gpu' ? ' on this browser\'s GPU' : '';
    progress(`running ${request.scenario}${where}`, 1);
    return add(await run_scenario(JSON.stringify(request)), label || `scenario ${request.scenario}${request.variant ? ` (${request.variant})` : ''}`);
  },
  // The "Size a model" view's table (`tensormem fit --json`): the largest `vary` (batch or
  // context) that fits, for every strategy on every card, each cell found by running the step.
  async sizeFitTable({ request }) {
    const of = request.strategies.length * request.cards.length;
    const phase = (done) => `searching the largest ${request.vary} that fits: ${done} of ${of} strategy × card`;
    progress(phase(0), 0);
    return JSON.parse(fit_table(JSON.stringify(request), (done, n) => progress(phase(done), done / n)));
  },
  // The "Size a model" view: a training scenario's run (`tensormem run --json`) with every rank in
  // `ranks`; the trace is not kept (a rank's trace is opened with runScenario). A run on one GPU
  // lists no ranks: its one rank is the run itself, and what its peak holds is read from its
  // trace at the peak (requested bytes of the live tensors, as `ranks` counts them): by the
  // category each allocation records, and for the untagged ones (activations and temporaries)
  // by the category the doctor infers from its stack, phase and lifetime.
  async sizeModel({ request }) {
    progress(`simulating ${request.set.world || 1} GPU${request.set.world > 1 ? 's' : ''}: ${request.scenario}`, 1);
    const t = await run_scenario(JSON.stringify(request));
    try {
      const run = JSON.parse(t.run_json());
      if (!run.ranks) {
        const by_category = {};
        const devices = Array.from(t.devices());
        if (devices.length) {
          const view = t.timeline(devices[0]);
          try {
            const { groups, summary } = JSON.parse(view.meta_json());
            const [size, start, end, group] = [view.alloc_size(), view.alloc_start(), view.alloc_end(), view.alloc_group()];
            const peak = summary.peak_x;
            let inferred = null;
            for (let i = 0; i < size.length; i++) {
              if (start[i] > peak || end[i] <= peak) continue;
              const g = groups[group[i]];
              let key = g.category ? g.kind : null;
              if (!key) {
                inferred ||= inferredOf(view);
                key = inferred.categories[inferred.category[i]] || 'unknown';
              }
              by_category[key] = (by_category[key] || 0) + size[i];
            }
          } finally {
            view.free();
          }
        }
        run.ranks = [{
          rank: 0, peak_allocated_bytes: run.peak_allocated_bytes, peak_reserved_bytes: run.peak_reserved_bytes, by_category, steps: run.steps, out_of_memory: run.out_of_memory,
        }];
      }
      return run;
    } finally {
      t.free();
    }
  },
  // The candidate `trace` is now the page's, and `previous` (the one it replaces) is closed; candidates still loading are left to their own
  // 'use' or 'drop'.
  async use({ trace, previous }) {
    if (previous !== undefined && previous !== trace) close(previous);
    // A file drawn from its layout kept is read back once the page shows it (never one it gave
    // up for a newer file).
    const t = traces.get(trace);
    if (t instanceof Pending) t.trace().catch((e) => t.closed || console.warn(`the file could not be read back (${e.message})`));
    // The page clears its comparison with a new trace.
    replaceOther(null);
  },
  // Whether a trace read back before its file was hashed is of the same bytes (see loadFile):
  // if not, the page opens the file again, then parsed.
  async sameBytes({ trace }) {
    const t = get(trace);
    if (!t.checkBytes) return true;
    t.sameBytes ??= t.checkBytes();
    return t.sameBytes;
  },
  // What the page shows of a trace whose decode is kept, once it is drawn ({image: the
  // timeline's pixels as {width, height, pixels}, summary}): posted as 'preview' when the same
  // file is opened again. Kept only beside its decode, after that is written; its pixels count
  // in the decode's size, so that KEPT_LIMIT bounds both.
  async keepView({ trace, image, summary }) {
    if (!get(trace).key) return;
    const reopened = traces.get(trace);
    if (!image && !reopened.layoutMissing) {
      keepPending((p) => p.t === reopened);
      await keeping;
      return;
    }
    const t = await loadedTrace(trace);
    keepPending((p) => p.t === t);
    const key = t.key;
    const layout = keptLayoutOf(trace, t, key);
    const page = pageInfo(t);
    t.layoutMissing = false;
    const written = keeping.then(async () => {
      const db = await openKept();
      const tx = db.transaction(['decodedUse', 'views'], 'readwrite');
      const uses = tx.objectStore('decodedUse');
      // Put from the request's own callback, while the transaction is surely active.
      uses.get(key).onsuccess = (e) => {
        const use = e.target.result;
        if (use === undefined) return;
        const views = tx.objectStore('views');
        // Without an image, the view kept gets the layout it lacked.
        views.get(key).onsuccess = (got) => {
          const stored = got.target.result;
          const view = image ? { image, summary, layout: stored?.layout, page: stored?.page } : stored;
          if (!view || (!image && !layout)) return;
          const kept = layout ? { ...view, layout, page } : view;
          const l = kept.layout;
          const viewSize = (view.image.pixels.byteLength ?? view.image.pixels.length) + (l ? l.bytes.size + (l.curves?.size ?? 0) + l.pixels.byteLength : 0);
          views.put(kept, key);
          uses.put({ ...use, size: use.size - (use.viewSize || 0) + viewSize, viewSize }, key);
        };
      };
      await committed(tx);
      await trim(db, key);
    });
    // The next open of a file waits for its view too.
    keeping = Promise.all([keeping, written.catch(() => {})]);
    await written;
  },
  // A candidate the page gave up on (a newer load won, or it could not be shown).
  async drop({ trace }) {
    close(trace);
  },
  async setAxis({ view: v, xs }) {
    view(v).set_axis(xs);
  },
  async raster({ view: v, x0, x1, width, height, ymax, order, colors, hidden, ghost }) {
    const pixels = view(v).raster(x0, x1, width, height, ymax, order, colors, hidden, ghost);
    return { result: pixels, transfer: [pixels.buffer] };
  },
  // The allocation at a point, or null (wasm answers undefined for none).
  // The page hit-tests itself (hit.js); this is the reference its test compares it with.
  async hitTest({ view: v, pos, bytes, slack }) {
    return view(v).hit_test(pos, bytes, slack) ?? null;
  },
  // The allocations live at a position, bottom up, as [id, bottom] pairs (for the keyboard).
  async stackAt({ view: v, pos }) {
    const pairs = view(v).stack_at(pos);
    return { result: pairs, transfer: [pairs.buffer] };
  },
  async pieces({ view: v, alloc }) {
    return view(v).pieces_of(alloc);
  },
  // The bands coloured by `by` (see timeline()): each allocation's new group and the groups, and
  // the inferred categories when the page asks for them (the first time they are needed).
  async colorBy({ view: v, by, withInferred }) {
    const t = view(v);
    t.set_color_by(by);
    const allocGroup = t.alloc_group();
    const inferred = withInferred && by === 'inferred' ? inferredOf(t) : null;
    return { result: { allocGroup, groups: JSON.parse(t.groups_json()), by, inferred }, transfer: [allocGroup.buffer, ...inferredBuffers(inferred)] };
  },
  // The bands of a view laid out for its first image only, laid out fully: their pieces and the
  // summary's warnings; null when they were laid out fully already.
  async fullBands({ view: v }) {
    const t = view(v);
    if (!t.lay_full_bands()) return null;
    const arrays = { pieceOffsets: t.piece_offsets(), pieceX0: t.piece_x0(), pieceY: t.piece_y() };
    const warnings = JSON.parse(t.summary_warnings_json());
    return { result: { view: v, arrays, warnings }, transfer: Object.values(arrays).map((a) => a.buffer) };
  },
  async timeline({ trace, device, first, colorBy }) {
    const entry = get(trace);
    const pending = entry instanceof Pending ? entry : null;
    // A file opened again is drawn from the layout kept of this device, if any, before its
    // trace is read back (see Pending), which starts once the page shows it.
    const kept = pending && first ? await pending.keptLayout : null;
    if (pending) pending.keptLayout = Promise.resolve(null);
    get(trace); // still open
    let out = kept?.device === device ? timeline(trace, device, first, colorBy, null, kept) : null;
    if (!out) {
      const loaded = await loadedTrace(trace);
      // A layout kept that could not be used (or none, for this device) is kept anew once drawn.
      if (pending && first && kept) loaded.layoutMissing = true;
      out = timeline(trace, device, first, colorBy, loaded);
    }
    wasmAt.laidOut = wasm.memory.buffer.byteLength;
    // Read back already (a request needed it while this was drawn): tied to it now.
    if (pending?.promise) pending.promise.then((t) => views.get(out.result.view)?.t.attach(t), () => {});
    return out;
  },
  async replay({ trace, device, allocConf, capacity, start }) {
    progress('replaying through the allocator', 1);
    return JSON.parse((await loadedTrace(trace)).replay(device, allocConf, capacity, start));
  },
  async compareFile({ file, device }) {
    replaceOther(await loadFile(file));
    return describeOther(file.name, device);
  },
  async compareWhatIf({ trace, device, allocConf, capacity, start }) {
    progress('replaying through the allocator', 1);
    replaceOther((await loadedTrace(trace)).replayed(device, allocConf, capacity, start));
    return describeOther(`what if ${allocConf || 'the same settings'}${capacity ? ` on ${capacity}` : ''} (${start} start)`, device);
  },
  async exportOther({ format }) {
    if (!other) throw new Error('nothing to export: compare with a what-if run first');
    if (format === 'json') return other.to_json();
    const bytes = other.to_pickle();
    return { result: bytes, transfer: [bytes.buffer] };
  },
  // For the browser benchmark: the size of wasm's linear memory (it never shrinks), now and
  // after the last file was parsed and laid out.
  async memory() {
    return { wasmBytes: wasm.memory.buffer.byteLength, ...wasmAt };
  },
  async parseSize({ text }) {
    return parse_size(text);
  },
  // The doctor's findings on one device of a trace (`tensormem doctor FILE --device N --json`).
  async diagnose({ trace, device }) {
    return diagnoseSurviving(await loadedTrace(trace), device);
  },
  // For the page's tests: one finder made to panic whenever it runs (null: none).
  async makeFinderFailForTests({ kind }) {
    make_finder_fail_for_tests(kind);
  },
  // A scenario run only to be diagnosed (the other variant of the run on screen): its findings
  // and peaks; the trace is not kept.
  // A scenario's other variant, diagnosed as `tensormem doctor --scenario` diagnoses it (a
  // mistake's findings verified by running its fix), on its simulated card.
  async diagnoseScenario({ request }) {
    const d = surviving((skip) => diagnose_scenario(JSON.stringify(request), skip));
    return { findings: d.findings, variant: d.variant, peakAllocated: d.peak_allocated_bytes, peakReserved: d.peak_reserved_bytes };
  },
  async stateAt({ trace, device, position }) {
    return JSON.parse((await loadedTrace(trace)).state_at(device, position));
  },
  async exportTrace({ trace, format }) {
    const t = await loadedTrace(trace);
    if (format === 'json') return t.to_json();
    const bytes = t.to_pickle();
    return { result: bytes, transfer: [bytes.buffer] };
  },
};

// The doctor's findings on one device of trace `t`. A finder that panics (wasm cannot catch
// it: the call ends in `unreachable`) is a bug, not the end of the diagnosis: the doctor says
// which finder was running, and the diagnosis runs again without it, the others reporting and a
// note naming it.
//
// The doctor reads the timeline the page shows of that trace (when of that device, and grouped
// as the trace groups its allocations: wasm checks) instead of laying it out again. A PyTorch
// snapshot, coloured by inferred categories, is laid out again for the doctor: grouping the view
// as the trace does while the doctor read it, then back, made the next open of a 1 GB file 1 to
// 2.5 s slower to draw in three runs (why was not found).
function diagnoseSurviving(t, device) {
  const v = [...views.values()].find((shown) => traces.get(shown.trace) === t)?.t;
  return surviving((skip) => t.diagnose_laid_out(device, v?.laid_out(), skip));
}

// Runs `diagnose(skip)` (a diagnosis as JSON, without the finders in `skip`) again without each
// finder that panics, until one runs through.
function surviving(diagnose) {
  const skip = [];
  for (;;) {
    try {
      return JSON.parse(diagnose(skip));
    } catch (e) {
      const failed = e instanceof WebAssembly.RuntimeError ? finder_running() : undefined;
      if (!failed || skip.includes(failed)) throw e;
      take_panic();
      skip.push(failed);
    }
  }
}

onmessage = async (event) => {
  const { id, type } = event.data;
  try {
    await ready;
    if (!handlers[type]) throw new Error(`unknown request ${type}`);
    const out = await handlers[type](event.data);
    if (out && out.transfer) postMessage({ id, result: out.result }, out.transfer);
    else postMessage({ id, result: out });
    // Work the answer does not wait for (see timeline()).
    if (out && out.after) out.after();
    // A new file's decode is kept at once where the page does not draw it, and once diagnosed
    // where it does (see toKeep).
    if (toKeep.size && type !== 'openFile') {
      const diagnosed = type === 'diagnose' ? traces.get(event.data.trace) : undefined;
      setTimeout(() => keepPending((p) => !p.byPage || p.t === diagnosed));
    }
  } catch (e) {
    // A panic reaches JavaScript as `unreachable`: say what Rust said, and where.
    const panic = e instanceof WebAssembly.RuntimeError ? take_panic() : undefined;
    const message = panic ? `tensormem crashed (a bug: please report it): ${panic}` : String(e && e.message ? e.message : e);
    postMessage({ id, error: message });
  }
};
