"""The page from Python: ``serve`` starts ``tensormem serve`` in the background on a snapshot,
``show`` displays it (in a notebook's output cell, else in the browser)."""

import atexit
import os
import subprocess
import sys
import tempfile
import webbrowser
from pathlib import Path

_servers = []


def page_folder():
    """The page's files shipped in the wheel, or None (a source install without the page)."""
    folder = Path(__file__).parent / "www"
    return folder if (folder / "index.html").is_file() else None


def _snapshot_file(snapshot):
    """A path to serve, and whether it is a temporary copy: the given path, or the bytes / dict
    written whole to a private temporary file."""
    if snapshot is None or isinstance(snapshot, (str, os.PathLike)):
        return snapshot, False
    from . import _snapshot

    _, write = _snapshot(snapshot)
    # JSON or pickle: the page reads either; the name says which for a person who downloads it.
    is_json = isinstance(snapshot, (bytes, bytearray, memoryview)) and bytes(snapshot[:1]) != b"\x80"
    fd, path = tempfile.mkstemp(prefix="tensormem-snapshot-", suffix=".json" if is_json else ".pickle")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
    except BaseException:
        os.remove(path)
        raise
    return path, True


def serve(snapshot=None, *, port=0, host="127.0.0.1"):
    """Serves the page (on ``snapshot`` if given) in the background; returns its URL. The server
    stops when this Python process ends, however it ends (it watches a pipe from this process,
    which closes even when the process is killed), and then removes its temporary copy of a
    snapshot given as bytes or a dict."""
    path, temporary = _snapshot_file(snapshot)
    args = [sys.executable, "-m", "tensormem", "serve", "--port", str(port), "--host", host, "--until-stdin-ends"]
    if temporary:
        args.append("--remove-file-at-end")
    if path is not None:
        args.append(os.fspath(path))
    # The server's messages go to a file: a pipe nobody reads would stop it once full.
    log = tempfile.TemporaryFile(mode="w+")
    server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    line = server.stdout.readline()
    if not line.startswith("tensormem: serving "):
        server.stdin.close()
        server.wait(timeout=10)
        if temporary and os.path.exists(path):
            os.remove(path)
        log.seek(0)
        raise _error(log.read().strip() or line.strip() or "tensormem serve stopped")
    _servers.append(server)
    atexit.register(_stop, server)
    return line[len("tensormem: serving "):].strip()


def _stop(server):
    """At exit: closing the pipe stops the server, which removes its temporary copy."""
    server.stdin.close()
    try:
        server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.terminate()


def _error(message):
    from ._tensormem import TensormemError

    return TensormemError(message.removeprefix("error: "))


def show(snapshot=None, *, height=720):
    """Shows the page on ``snapshot``: in a notebook's output cell, else in the browser.
    Returns the URL."""
    url = serve(snapshot)
    try:
        from IPython import get_ipython
        from IPython.display import IFrame, display

        if get_ipython() is not None:
            display(IFrame(url, width="100%", height=height))
            return url
    except ImportError:
        pass
    webbrowser.open(url)
    return url
