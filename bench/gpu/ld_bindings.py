"""Summarise LD_DEBUG=bindings,libs output (files LD_DEBUG_OUTPUT.*): which symbols libraries
loaded after ggml bound to ggml's libraries or to the libraries ggml pulled in, and the last
initialisers called before the process ended.   python3 ld_bindings.py PREFIX [MARK...]
MARK: path fragments of interest (default: ggml/lib, CUDA, libgomp)."""
import collections
import glob
import os
import re
import sys

prefix = sys.argv[1]
marks = sys.argv[2:] or ["ggml/lib", "/usr/local/cuda", "libgomp", "libcublas", "libcudart", "libcuda.so"]
bind = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: (?:normal|weak) symbol `([^']+)'")
for path in sorted(glob.glob(prefix + ".*"), key=os.path.getsize, reverse=True)[:2]:  # the main process first
    pairs = collections.Counter()
    samples = collections.defaultdict(list)
    inits, tail = [], collections.deque(maxlen=14)
    with open(path, errors="replace") as f:
        for line in f:
            if line.split(":", 1)[-1].strip():
                tail.append(line.rstrip())
            if "calling init:" in line:
                inits.append(line.split("calling init:")[1].strip())
            m = bind.search(line)
            if not m:
                continue
            src, dst, sym = m.groups()
            if src == dst or not any(k in dst for k in marks) or "ggml/lib" in src:
                continue
            key = (os.path.basename(src), dst)
            pairs[key] += 1
            if len(samples[key]) < 6 and sym not in samples[key]:
                samples[key].append(sym)
    print(f"##### {path}: {len(inits)} initialisers")
    print("last initialisers:", *inits[-12:], sep="\n  ")
    print("bindings from non-ggml libraries into", marks)
    for (src, dst), n in pairs.most_common(40):
        print(f"  {n:6d}  {src} -> {dst}: {', '.join(samples[(src, dst)])}")
    print("last lines:", *tail, sep="\n  ")
