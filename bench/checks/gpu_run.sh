#!/usr/bin/env bash
# The GPU check as one command on the device machine (docs/gpu-path.md §8.2), from the repository root:
#   bash bench/checks/gpu_run.sh [gpu_check.py options]      # $OUT: where the report goes (the device tool sets it)
# Installs basal serve's carried wheels (.whl/, from `make gpu-wheels`) where they exist, then runs the check
# unbuffered, its log beside its report. Exits with gpu_check.py's code.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" \
    || echo "gpu_run: the wheels in .whl/ did not install; basal serve's check will say it is skipped" >&2
else
  echo "gpu_run: no .whl/ (make gpu-wheels): basal serve's check will be skipped" >&2
fi
(command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv) \
  > "$OUT/nvidia-smi.txt" 2>&1
# tee ignores SIGTERM: a timeout signals the whole group, and the check prints its table after the signal
PYTHONUNBUFFERED=1 python3 bench/checks/gpu_check.py --out "$OUT" "$@" 2>&1 | (trap '' TERM; exec tee "$OUT/log.txt")
exit "${PIPESTATUS[0]}"
