// A button's job where only the latest press counts, as the What fits and Size a model views
// run theirs: the inputs read first (a mistake in them said at once), the button disabled and
// a status shown while the worker runs, the answer or error of an earlier press dropped, and
// the button back when the latest press ends.
export function latestOnly({ button, status, read, busy, work, show, fail, showError, clearError, hideProgress }) {
  let ticket = 0;
  return async () => {
    clearError();
    let input;
    try {
      input = read();
    } catch (e) {
      return showError(e.message);
    }
    const mine = ++ticket;
    button.disabled = true;
    status.textContent = busy(input);
    try {
      const out = await work(input);
      if (mine === ticket) show(input, out);
    } catch (e) {
      if (mine !== ticket) return;
      // No figures of an earlier run under an error about this one.
      fail();
      showError(e.message);
    } finally {
      if (mine === ticket) {
        button.disabled = false;
        status.textContent = '';
        hideProgress();
      }
    }
  };
}
