"""``tensormem`` and ``python -m tensormem``: the command line, as the cargo-built one."""

import signal
import sys


def main():
    from . import _page
    from ._tensormem import cli

    # This process is the command line now: Ctrl-C stops it (Python would only set a flag that
    # the Rust code never reads), and a closed pipe ends it quietly as it ends other tools.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    page = _page.page_folder()
    sys.exit(cli(sys.argv[1:], None if page is None else str(page)))


if __name__ == "__main__":
    main()
