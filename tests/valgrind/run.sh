#!/usr/bin/env bash
# valgrind memcheck over a short engine workload; exit non-zero on any report not in
# python.supp (CPython's own). Usage: tests/valgrind/run.sh [python]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${1:-python3}
PYTHONMALLOC=malloc OPENBLAS_NUM_THREADS=1 valgrind --tool=memcheck --error-exitcode=3 \
    --leak-check=no --suppressions="$here/python.supp" -q "$py" "$here/workload.py"
