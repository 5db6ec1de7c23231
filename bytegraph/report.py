"""``python -m bytegraph.report DEBUG_DIR -o report.html``: the HTML report of a debug
directory (``BYTEGRAPH_DEBUG_DIR``); the page is built by ``debug/report.py``."""
import sys

from .debug.report import main, render

__all__ = ["main", "render"]

if __name__ == "__main__":
    sys.exit(main())
