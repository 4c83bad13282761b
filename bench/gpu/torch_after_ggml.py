"""Issue 11 bisect: run each case in its own process, several at a time; print exit codes.

   python3 bench/gpu/torch_after_ggml.py GGML_SITE LOG [ROOT]
GGML_SITE: folder holding the CUDA build of ggml-python; ROOT holds src/ (ggrad as
committed), src-fixed/ (a candidate fix) and probe/step.py. A case is (name, PYTHONPATH
source folder, code); env ONLY (a regex) picks cases by name, JOBS how many at a time.
'END' printed means the code ran to its end; rc 134 / -6: aborted.
"""
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

GGML, LOG = sys.argv[1], sys.argv[2]
ROOT = os.path.abspath(sys.argv[3] if len(sys.argv) > 3 else ".")
STUB = ("import sys, types; m = types.ModuleType('ggrad'); m.__path__ = ['src/ggrad']; "
        "sys.modules['ggrad'] = m")  # a ggrad package whose __init__ does not run
EXTRA = sys.argv[4:]  # more cases: name=src=code

cases = [
    ("torch-alone", "src", "import torch"),
    ("ggml", "src", "import ggml.ggml; import torch"),
    ("ggml-devinit", "src", "import ggml.ggml as G; [G.ggml_backend_dev_init(G.ggml_backend_dev_get(i), None) "
     "for i in range(G.ggml_backend_dev_count())]; import torch"),
    ("numpy+ml_dtypes-alone", "src", "import numpy, ml_dtypes; import torch"),
    ("ggml,numpy", "src", "import ggml.ggml; import numpy; import torch"),
    ("ggml,ml_dtypes", "src", "import ggml.ggml; import ml_dtypes; import torch"),
    ("ggml,numpy,ml_dtypes", "src", "import ggml.ggml; import numpy, ml_dtypes; import torch"),
    ("numpy,ggml", "src", "import numpy; import ggml.ggml; import torch"),
    ("ml_dtypes,ggml", "src", "import ml_dtypes; import ggml.ggml; import torch"),
    ("ggml,safetensors", "src", "import ggml.ggml; import safetensors, safetensors.numpy; import torch"),
    ("ggml,tqdm", "src", "import ggml.ggml; import tqdm; import torch"),
    ("ggml,stdlib", "src", "import ggml.ggml; import dataclasses, json, weakref, itertools, numbers; import torch"),
]
for sub in ["runtime.handle", "runtime.backend", "runtime.transfers", "runtime.pools", "runtime.device",
            "runtime.graph", "runtime", "dtypes", "lazy", "tensor", "autograd", "functional", "nn", "optim",
            "random", "data", "capture", "io", "train"]:
    cases.append((f"stub:ggrad.{sub}", "src", f"{STUB}; import ggrad.{sub}; import torch"))
cases += [
    ("ggrad", "src", "import ggrad; print('torch next', flush=True); import torch; print('torch imported', flush=True)"),
    ("ggrad,_exit", "src", "import os, ggrad, torch; print('torch imported', flush=True); os._exit(0)"),
    ("torch,ggrad", "src", "import torch; import ggrad"),
    ("FIX rtld_local(hack)+ggrad", "src", "import ctypes; g = ctypes.RTLD_GLOBAL; ctypes.RTLD_GLOBAL = ctypes.RTLD_LOCAL; "
     "import ggml.ggml; ctypes.RTLD_GLOBAL = g; import ggrad; import torch"),
    ("FIX src-fixed ggrad", "src-fixed", "import ggrad; import torch"),
    ("FIX numpy,ml_dtypes first", "src", "import numpy, ml_dtypes; import ggrad; import torch"),
    ("STEP plain src", "src", "import runpy, sys; sys.argv = ['step', 'plain']; runpy.run_path('probe/step.py')"),
    ("STEP src-fixed", "src-fixed", "import runpy, sys; sys.argv = ['step', 'plain']; runpy.run_path('probe/step.py')"),
    ("STEP rtld_local(hack)", "src", "import runpy, sys; sys.argv = ['step', 'local']; runpy.run_path('probe/step.py')"),
]
for spec in EXTRA:
    name, src, code = spec.split("=", 2)
    cases.append((name, src, code))


ONLY = os.environ.get("ONLY")  # a regular expression: run only the cases it finds in their names
if ONLY:
    import re
    cases = [c for c in cases if re.search(ONLY, c[0])]


def run(case):
    name, src, code = case
    env = dict(os.environ, PYTHONPATH=f"{GGML}:{src}", PYTHONUNBUFFERED="1")
    t = time.time()
    try:
        p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code + "; print('END', flush=True)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", str(e.stdout), str(e.stderr)
    return name, src, code, rc, time.time() - t, out, err


with ThreadPoolExecutor(int(os.environ.get("JOBS", "8"))) as pool, open(LOG, "w") as log:
    for name, src, code, rc, dt, out, err in pool.map(run, cases):
        end = "END" in out
        last = [line for line in err.strip().splitlines() if line.strip()][-1:] or [""]
        print(f"rc={rc!s:>4} end={'y' if end else 'n'} {dt:5.1f}s  {name:32s} {last[0][:110]}", flush=True)
        log.write(f"===== {name} (PYTHONPATH {src}) rc={rc} {dt:.1f}s\n$ {code}\n--- stdout\n{out}\n--- stderr\n{err[-6000:]}\n")
