// Saves `data` as a file the browser downloads: NAME.tensormem.pickle or .json.
export function download(data, name, format) {
  const blob = new Blob([data], { type: format === 'json' ? 'application/json' : 'application/octet-stream' });
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = `${name.replace(/(\.tensormem)?\.(pickle|pkl|json)$/i, '').replace(/[^\w.-]+/g, '_')}.tensormem.${format === 'json' ? 'json' : 'pickle'}`;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}
