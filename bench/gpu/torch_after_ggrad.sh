#!/usr/bin/env bash
# Issue 11 on the GPU host: `import ggrad; import torch` aborts with ggml-python's CUDA build.
# Found 2026-12-03: the libraries exported a static copy of libstdc++ (fixed in scripts/build_cuda.sh
# by a version script; this probe builds without it, then relinks with it).
# Builds the CUDA wheel, bisects the import in subprocesses (torch_after_ggml.py), records
# which libraries bind where (LD_DEBUG) and a native backtrace (cuda-gdb), tries a relinked
# variant that exports only ggml's API, and runs the test suite with the candidate fix.
#   bash bench/gpu/torch_after_ggrad.sh ROOT
# ROOT (a stable copy of the repo, e.g. .cuda-probe/) holds src/, src-fixed/ (ggrad with the
# candidate fix), tests/, probe/step.py, bench/gpu/, scripts/ and sdist/ggml_python-0.0.45.tar.gz.
set -uo pipefail
ROOT="$(cd "${1:-.cuda-probe}" && pwd)"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
T0=$(date +%s); el() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
left() { echo $(( ${DEADLINE:-500} - ($(date +%s) - T0) )); }
cd "$ROOT"
el "host"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -V; gcc --version | head -1
python3 -c "import torch, numpy, ml_dtypes; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'ml_dtypes', ml_dtypes.__version__)"
ldconfig -p | grep -E "libcudart.so|libcublas.so|libcublasLt.so|libgomp.so|libstdc\+\+.so" | sed 's/^\s*/  /'

el "build as before the fix (GGML_EXPORT_ALL=1; build tree kept in /tmp/gbuild)"
rm -rf /tmp/gpsrc
GGML_NO_BUILD_ISOLATION=1 GGML_EXPORT_ALL=1 GGML_BUILD_DIR=/tmp/gbuild GGML_SRC_DIR=/tmp/gpsrc SHIM_DIR=/tmp/gshim \
  bash scripts/build_cuda.sh sdist/ggml_python-0.0.45.tar.gz /tmp/cudawheel > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/ggml-cuda /tmp/cudawheel/ggml_python-*.whl
L=/tmp/ggml-cuda/ggml/lib
el "built"; ls -la $L
for f in $L/*.so; do
  echo "-- $(basename $f): $(readelf -d $f | grep -E 'NEEDED|RUNPATH|RPATH' | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
  echo "   exported (defined): $(nm -D --defined-only $f | wc -l), not ggml/gguf: $(nm -D --defined-only $f | grep -vic 'ggml\|gguf')"
done
ldd $L/libggml-cuda.so | sed 's/^\s*/  /'
echo "libggml-cuda.so exports, not ggml/gguf, by kind:"; nm -D --defined-only $L/libggml-cuda.so | grep -vi 'ggml\|gguf' | awk '{print $2}' | sort | uniq -c
nm -D --defined-only -C $L/libggml-cuda.so | grep -vi 'ggml\|gguf' | head -25
PYTHONPATH=/tmp/ggml-cuda:src python3 -c "import ggrad; print('\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))" > "$OUT/maps-after-import-ggrad.txt" 2>&1
grep -E "cudart|cublas|gomp|stdc|libcuda" "$OUT/maps-after-import-ggrad.txt"

el "bisect"
python3 bench/gpu/torch_after_ggml.py /tmp/ggml-cuda "$OUT/bisect.log" "$ROOT"

el "evidence (LD_DEBUG, cuda-gdb) and the suite with the fix, in the background; a relinked variant meanwhile"
mkdir -p /tmp/ldd
(PYTHONPATH=/tmp/ggml-cuda:src LD_DEBUG=libs,bindings LD_DEBUG_OUTPUT=/tmp/ldd/fail timeout 90 python3 -c "import ggrad; import torch" >/dev/null 2>&1; echo "LD_DEBUG run rc=$?") &
P1=$!
(PYTHONPATH=/tmp/ggml-cuda:src timeout 100 cuda-gdb -q -batch -ex "set pagination off" -ex "set confirm off" -ex run -ex bt -ex "info sharedlibrary" --args python3 -c "import ggrad; import torch" > "$OUT/gdb.txt" 2>&1; echo "cuda-gdb rc=$?") &
P2=$!
(PYTHONPATH=/tmp/ggml-cuda:src-fixed timeout $(( $(left) - 10 )) python3 -m pytest tests -q -x -p no:cacheprovider > "$OUT/tests-cuda-fixed.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/tests-cuda-fixed.txt") &
PYTEST=$!
cat > /tmp/gshim/hide.map <<'MAP'
{ global: *ggml*; *gguf*; quantize*; dequantize*; iq2xs*; iq3xs*; llamafile*; local: *; };
MAP
{ cat /tmp/gshim/shim.cmake; echo 'add_link_options("LINKER:--version-script=/tmp/gshim/hide.map")'; } > /tmp/gshim/shim2.cmake
if cmake -S /tmp/gpsrc -B /tmp/gbuild -DCMAKE_PROJECT_INCLUDE=/tmp/gshim/shim2.cmake > /tmp/variant.log 2>&1 &&
   timeout 120 cmake --build /tmp/gbuild -j 16 >> /tmp/variant.log 2>&1; then
  el "variant relinked: $(grep -c 'Building' /tmp/variant.log) compiled, $(grep -c 'Linking' /tmp/variant.log) linked"
  rm -rf /tmp/ggml-vs && cp -r /tmp/ggml-cuda /tmp/ggml-vs && cp /tmp/gbuild/libggml*.so /tmp/ggml-vs/ggml/lib/
  for f in /tmp/ggml-vs/ggml/lib/*.so; do echo "   $(basename $f) exported not ggml/gguf: $(nm -D --defined-only $f | grep -vic 'ggml\|gguf')"; done
  ONLY='^(ggml|ggml-devinit|ggrad|ggrad,_exit|STEP plain src)$' python3 bench/gpu/torch_after_ggml.py /tmp/ggml-vs "$OUT/bisect-variant.log" "$ROOT"
else
  echo "variant build failed or ran out of time:"; tail -8 /tmp/variant.log
fi
wait $P1 $P2
el "LD_DEBUG summary"
python3 bench/gpu/ld_bindings.py /tmp/ldd/fail > "$OUT/ld_bindings.txt" 2>&1; head -70 "$OUT/ld_bindings.txt"
echo "--- cuda-gdb backtrace"; grep -E "^#|signal|SIG" "$OUT/gdb.txt" | head -40
el "waiting for the suite"; wait $PYTEST; tail -15 "$OUT/tests-cuda-fixed.txt"
el "done"
