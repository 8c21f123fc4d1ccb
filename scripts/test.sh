#!/usr/bin/env bash
# The README's test command: installs missing packages, builds, runs every test
# (without [slow]): the C++ suite with ctest, then the Python package's tests with
# Debian's /usr/bin/python3 -m pytest (python/tests, importing the extension from the
# build directory). Usage: scripts/test.sh [build-dir] [extra cmake args...]
# The Python tests are skipped (with a message) in a sanitizer build: the extension is
# built there too, but loading it into a python that is not instrumented needs the
# sanitizer runtime preloaded, which the leak checker and TSan do not survive.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build}
shift || true
"$root/scripts/build.sh" "$dir" "$@"
dir=$(cd "$dir" && pwd)
cd "$dir"
ctest --output-on-failure -j "${TEST_JOBS:-2}" --timeout 300
if grep -q '^PSCORE_SANITIZE:STRING=.\+' CMakeCache.txt; then
  echo "test.sh: sanitizer build: python/tests not run (the extension is built: $dir/python/pscore)"
elif grep -q '^PSCORE_PYTHON:STRING=OFF' CMakeCache.txt; then
  echo "test.sh: configured with -DPSCORE_PYTHON=OFF: python/tests not run"
elif [ -f "$dir/python/pscore/__init__.py" ]; then
  cd "$root/python/tests"
  PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 -m pytest -q -p no:cacheprovider .
else
  echo "test.sh: no Python package in $dir (python3-pybind11 or python3-numpy missing): python/tests not run" >&2
  exit 1
fi
