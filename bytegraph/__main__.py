"""``python -m bytegraph script.py [args]``: run a script with torch.compile on bytegraph.

The script runs unchanged as ``__main__`` (``sys.argv`` is its own); every
``torch.compile(...)`` and ``nn.Module.compile(...)`` it makes compiles with
bytegraph, with the same arguments (``bytegraph.patch_torch_compile``).
``python -m bytegraph -m package.module [args]`` runs a module the same way.
"""
import runpy
import sys

from .api import patch_torch_compile


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    patch_torch_compile()
    if argv[0] == "-m":
        if len(argv) < 2:
            print("python -m bytegraph -m: a module name is needed", file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
