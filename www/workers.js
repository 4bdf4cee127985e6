// The page's workers, as promises: `connect` makes a worker's requests promises, and the
// doctor's own worker (for large files, where there are cores to spare) is started, used and
// ended here. app.js starts the page's worker.
// `connect(worker, others)`: a function asking `worker` for work (`ask(type, payload)`, a promise
// of its answer); messages that answer no request go to `others`. When the worker reports an
// error of its own (it could not start, or a script error escaped its handlers), it is not
// trusted again: every waiting request and every later one fails with the reason (a
// WorkerFailed), and `onFailure(reason)` is told.
class WorkerFailed extends Error {}
export function connect(w, others, onFailure) {
  let nextId = 1;
  const waiting = new Map();
  let failed = null;
  w.onmessage = (event) => {
    const m = event.data;
    if (m.id === undefined) return others(m);
    const waiter = waiting.get(m.id);
    if (!waiter) return;
    waiting.delete(m.id);
    if (m.error !== undefined) waiter.reject(new Error(m.error)); else waiter.resolve(m.result);
  };
  w.onerror = (e) => {
    failed = e.message || 'unknown error';
    for (const waiter of waiting.values()) waiter.reject(new WorkerFailed(failed));
    waiting.clear();
    onFailure(failed);
  };
  return (type, payload = {}) => new Promise((resolve, reject) => {
    if (failed) return reject(new WorkerFailed(failed));
    const id = nextId++;
    waiting.set(id, { resolve, reject });
    // The request's own id and type last: a payload's fields never replace them.
    w.postMessage({ ...payload, id, type });
  });
}
// The doctor's own worker, for large files, so that the page's worker, free once it has drawn the
// timeline, answers hovering, panning and zooming while the doctor runs (it held them for seconds
// on a 1 GB file). It reads the file at once, beside the page's worker (the page's keeps its
// decode for the next open). That takes cores to spare: on two, both reading at once delayed the
// first paint of a 237 MB file by 1.3 to 1.9 s, and a doctor's worker that waited for the page's
// (reading the file after it, or the decode it handed over) gave the 1 GB file's findings 10 to
// 15 s later than the page's worker does, which holds hovers for about 4 s; so with fewer than
// four cores the page's worker diagnoses. The price is a second decoded copy of the trace, so a
// file is diagnosed apart only when both copies fit the memory the browser reports
// (`navigator.deviceMemory`; 4 GB assumed where it says nothing); smaller files are diagnosed by
// the page's worker, quickly. The doctor's worker ends when it holds no trace (wasm memory never
// shrinks), and after any failure: the page's worker diagnoses instead.
export const DOCTOR_APART = { fromBytes: 32 << 20, memoryPerFileByte: 5, fromCores: 4 };
const doctor = { worker: null, ask: null, uses: 0 };
export function doctorApart(file) {
  const memory = (navigator.deviceMemory || 4) * 2 ** 30;
  return navigator.hardwareConcurrency >= DOCTOR_APART.fromCores && file.size >= DOCTOR_APART.fromBytes
    && file.size * DOCTOR_APART.memoryPerFileByte <= memory;
}
function endDoctorWorker(w) {
  w.terminate();
  if (doctor.worker === w) Object.assign(doctor, { worker: null, ask: null, uses: 0 });
}
// One use of the doctor's worker fewer: it ends with the last.
function doctorUseEnds(w) {
  if (doctor.worker === w && --doctor.uses <= 0) endDoctorWorker(w);
}
// Opens `file` in the doctor's worker (started on first use); then, if `wanted()` still, the
// doctor starts on the device the page shows first. A promise of {trace, ask, worker, findings:
// Map(device -> promise of the findings)}, or of null when the doctor's worker could not open it
// (or it is no longer wanted).
export function openForDoctor(file, wanted) {
  if (!doctor.worker) {
    const w = new Worker(new URL('./worker.js', import.meta.url), { type: 'module', name: 'doctor' });
    doctor.worker = w;
    doctor.ask = connect(w, () => {}, (reason) => {
      console.warn(`the doctor's worker failed (${reason}): the page's worker diagnoses instead`);
      endDoctorWorker(w);
    });
  }
  const { worker: w, ask: asking } = doctor;
  doctor.uses++;
  // The page's worker keeps the decode for the next open.
  return asking('openFile', { file, keep: false }).then((d) => {
    const opened = { trace: d.trace, ask: asking, worker: w, findings: new Map() };
    if (!wanted()) {
      closeApart(opened);
      return null;
    }
    const first = d.devices.includes(d.defaultDevice) ? d.defaultDevice : d.devices[0];
    if (first !== undefined) findingsApart(opened, first);
    return opened;
  }, (e) => {
    if (wanted()) console.warn(`the doctor's worker could not open ${file.name} (${e.message}): the page's worker diagnoses it`);
    doctorUseEnds(w);
    return null;
  });
}
function findingsApart(opened, d) {
  if (!opened.findings.has(d)) opened.findings.set(d, opened.ask('diagnose', { trace: opened.trace, device: d }));
  return opened.findings.get(d);
}
function closeApart(opened) {
  opened.ask('drop', { trace: opened.trace }).catch(() => {}).finally(() => doctorUseEnds(opened.worker));
}
// The doctor's findings on device `d` of the trace `info`: from its doctor's worker where it has
// one, else, or if that fails in any way (a crash, memory), from the page's (`ask`).
export async function findingsOf(info, d, ask) {
  const opened = info.doctor && (await info.doctor);
  if (opened) {
    try {
      return { ...(await findingsApart(opened, d)), apart: true };
    } catch (e) {
      console.warn(`the doctor's worker could not diagnose ${info.name} (${e.message}): the page's worker diagnoses it`);
      info.doctor = null;
      endDoctorWorker(opened.worker);
    }
  }
  return ask('diagnose', { trace: info.trace, device: d });
}
// Closes the doctor's copy of a trace the page no longer shows.
export function dropDoctor(info) {
  const opening = info?.doctor;
  if (info) info.doctor = null;
  opening?.then((opened) => opened && closeApart(opened));
}
