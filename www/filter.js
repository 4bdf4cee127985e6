// Search and filter: which allocations to hide. A filter matches an allocation's stack frames
// (function names and file paths, so module scopes and files match too) and its group name,
// size, stream and lifetime. Hidden allocations are counted, never silently dropped.

// Terms separated by spaces must all match; a term starting with '-' must not.
function textMatcher(text) {
  const terms = text.toLowerCase().split(/\s+/).filter(Boolean);
  const want = terms.filter((t) => !t.startsWith('-'));
  const avoid = terms.filter((t) => t.startsWith('-') && t.length > 1).map((t) => t.slice(1));
  if (!want.length && !avoid.length) return null;
  return (haystack) => want.every((t) => haystack.includes(t)) && !avoid.some((t) => haystack.includes(t));
}

// {text, min, max, stream, range: [x0, x1) or null} -> {mask (1 = hidden) or null, hidden, hiddenBytes}
export function applyFilter(filter, data) {
  const { arrays: a, meta } = data;
  const n = a.allocSize.length;
  const match = textMatcher(filter.text || '');
  const active = match || filter.min != null || filter.max != null || filter.stream != null || filter.range;
  if (!active) return { mask: null, hidden: 0, hiddenBytes: 0 };
  // The text of each stack, matched once per stack rather than once per allocation.
  const stacks = a.stackOffsets.length - 1;
  const stackMatches = new Int8Array(Math.max(stacks, 0)).fill(-1);
  const groupText = meta.groups.map((g) => g.name.toLowerCase());
  const stackText = (s) => {
    let text = '';
    for (let k = a.stackOffsets[s]; k < a.stackOffsets[s + 1]; k++) {
      const f = meta.frames[a.stackFrames[k]];
      text += `\n${f[0]}\n${f[1]}:${f[2]}`;
    }
    return text.toLowerCase();
  };
  const matches = (id) => {
    const s = a.allocStack[id];
    const g = a.allocGroup[id];
    if (s === 0xffffffff) return match(groupText[g]);
    // A frame group follows from the stack, so one answer per stack holds; a category does
    // not (one line can allocate a parameter and, later, a temporary).
    if (meta.groups[g].category) return match(groupText[g] + stackText(s));
    if (stackMatches[s] < 0) stackMatches[s] = match(groupText[g] + stackText(s)) ? 1 : 0;
    return stackMatches[s] === 1;
  };
  const mask = new Uint8Array(n);
  let hidden = 0;
  let hiddenBytes = 0;
  for (let id = 0; id < n; id++) {
    const size = a.allocSize[id];
    const keep = (filter.min == null || size >= filter.min)
      && (filter.max == null || size <= filter.max)
      && (filter.stream == null || a.allocStream[id] === filter.stream)
      && (!filter.range || (a.allocEnd[id] > filter.range[0] && a.allocStart[id] < filter.range[1]))
      && (!match || matches(id));
    if (!keep) {
      mask[id] = 1;
      hidden++;
      hiddenBytes += size;
    }
  }
  return { mask, hidden, hiddenBytes };
}

// The streams that occur, for the stream selector.
export function streamsOf(data) {
  return [...new Set(data.arrays.allocStream)].sort((x, y) => x - y);
}
