# Sourced by the bench/h200_*.sh device scripts: simpy from the carried wheel (.whl), the repo on
# the path, and `stamp NAME` printing the seconds since the script started.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/simpy-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "== $1: $(( $(date +%s) - t0 )) s"; }
# liger-kernel for bench/kernels/speed.py's same-run comparison (its wheel in .whl, no dependencies)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/liger_kernel-*.whl 2>/dev/null || echo "liger wheel not carried"
