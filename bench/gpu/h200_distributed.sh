#!/usr/bin/env bash
# Issue 14's one-GPU checks on the H200 host (device tool), after the CUDA wheel is built:
#   OUT=$OUT bash bench/gpu/h200_distributed.sh
# A venv over the host's Python (which has nvidia-nccl) gets pip's mpich and mpi4py from
# .whl/mpi (carried: `pip download --only-binary=:all: --python-version 3.12 ... mpi4py mpich`),
# so mpiexec lies beside the Python the tests run. Then: the NCCL binding's tests and the
# distributed tests on cuda:0 (world size 1 on NCCL; 2 and 3 ranks sharing the GPU on MPI).
set -uo pipefail
OUT="${OUT:-/tmp/out}"
python3 -m venv --without-pip --system-site-packages /tmp/venv
python3 -m pip install -q --no-index --no-deps --prefix /tmp/venv .whl/mpi/*.whl
export PATH=/tmp/venv/bin:$PATH NCCL_NVLS_ENABLE=0
python3 -c "import sys, nvidia.nccl; from mpi4py import MPI; print(sys.executable, MPI.Get_library_version()[:40], list(nvidia.nccl.__path__))"
TEST_SECONDS="${TEST_SECONDS:-400}" TESTS="tests/test_nccl_binding.py tests/test_distributed.py" \
  bash bench/gpu/h200.sh cuda tests-only
