#!/usr/bin/env bash
# Issue 14's one-GPU checks on the H200 host (device tool), after the CUDA wheel is built:
#   OUT=$OUT bash bench/gpu/h200_distributed.sh
# Carried: .whl/mpi4py-*.whl (installed into /tmp/site by h200.sh) and .whl/mpi/mpich-*.whl
# (`pip download --only-binary=:all: --python-version 3.12 ... mpi4py mpich`): pip's mpich
# goes under a prefix of its own, mpi4py is pointed at its libmpi. The host's Python has
# nvidia-nccl. Then: the NCCL binding's tests and the distributed tests on cuda:0 (world
# size 1 on NCCL; 2 and 3 ranks sharing the GPU on MPI).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --prefix /tmp/mpi .whl/mpi/mpich-*.whl
export GGRAD_MPIEXEC=/tmp/mpi/bin/mpiexec MPI4PY_LIBMPI=/tmp/mpi/lib/libmpi.so.12 NCCL_NVLS_ENABLE=0
export PATH=/tmp/mpi/bin:$PATH
TEST_SECONDS="${TEST_SECONDS:-400}" TESTS="tests/test_nccl_binding.py tests/test_distributed.py" \
  bash bench/gpu/h200.sh cuda tests-only
