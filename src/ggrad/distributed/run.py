"""``python -m ggrad.distributed.run -n N script.py [args]``: mpiexec, found beside this
Python (pip's mpich) or on PATH."""

from __future__ import annotations

import argparse
import os
import shutil
import sys


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ggrad.distributed.run")
    ap.add_argument("-n", "--nproc", type=int, required=True, help="processes to start")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else shutil.which("mpiexec")
    if mpiexec is None:
        raise SystemExit("no mpiexec: `pip install mpich` (or install an MPI)")
    os.execv(mpiexec, [mpiexec, "-n", str(args.nproc), sys.executable, args.script, *args.args])


if __name__ == "__main__":
    main()
