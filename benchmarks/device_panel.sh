#!/usr/bin/env bash
# The speedup panel on a CUDA machine, in bfloat16, with the fused-kernel eligibility check: the one
# prepared script a session runs when it is lent a GPU (issue "Sound by construction", item 3).
#
#   bash benchmarks/device_panel.sh [OUT_DIR]          # OUT_DIR defaults to ./device-out
#
# The GPU machine cannot reach a package index. Wheels it lacks travel in .whl/ (Python 3.12,
# manylinux x86_64, `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`):
# transformers==4.34.1 (the panel's corpus) with tokenizers==0.14.1 and huggingface_hub==0.17.3 it
# pins, and Adopter's own libcst, lark, jsonschema (+ referencing, jsonschema-specifications,
# rpds-py) and ruff. They are installed into that machine's Python, which is thrown away after.
# Verification compares on the CPU (float32 against a float64 reference); every kernel call is then
# offered to the fused backends alone on CUDA in bfloat16, and the panel prints how many they took.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-device-out}}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
# the panel's corpus is our own pinned transformers, not repository code: no bubblewrap on that machine
export ADOPTER_SANDBOX=off
PY="${PYTHON:-python3}"
started=$(date +%s)
log() { echo "[device_panel +$(( $(date +%s) - started ))s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || log "no nvidia-smi"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | grep -v -i warning | tail -5
fi
"$PY" - <<'PY' || { log "environment check failed"; exit 3; }
import torch, transformers, libcst, lark, jsonschema
print(f"python ok: torch {torch.__version__} (cuda {torch.version.cuda}, available {torch.cuda.is_available()}), "
      f"transformers {transformers.__version__}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")
assert torch.cuda.is_available(), "no CUDA device"
PY
log "environment ready"

# 1. The panel: every model verified first (several at once), then each benchmarked alone on CUDA
timeout "${PANEL_TIMEOUT:-400}" "$PY" -m benchmarks.speedup_panel --device cuda --dtype bfloat16 \
  --batch-size "${BATCH:-8}" --seq-len "${SEQ:-512}" --jobs "${JOBS:-6}" --bench-budget "${BUDGET:-20}" \
  --repeats 10 --no-library-sdpa \
  --json "$OUT_DIR/panel.json" 2>&1 | grep -v "WITHOUT a sandbox" | tee "$OUT_DIR/panel.log"
log "panel done (exit ${PIPESTATUS[0]})"

# 2. The README's main job on CUDA in bfloat16
if [ "$(( $(date +%s) - started ))" -lt "${MINIGPT_AFTER_LIMIT:-430}" ]; then
  timeout "${MINIGPT_TIMEOUT:-75}" "$PY" -m engine.cli scan examples/minigpt --verify --bench --device cuda \
    --dtype bfloat16 --no-history --report "$OUT_DIR/minigpt-pr.md" --format json --output "$OUT_DIR/minigpt.json" \
    2>&1 | grep -v "WITHOUT a sandbox" | tail -12 | tee "$OUT_DIR/minigpt.log"
  log "minigpt done (exit ${PIPESTATUS[0]})"
fi
log "finished"
