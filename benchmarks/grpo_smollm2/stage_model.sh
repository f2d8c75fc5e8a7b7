#!/usr/bin/env bash
# Device machine, once per carried file: copy it to /tmp/grpo-smollm2/stage and check its sha256.
# With --assemble: join the parts, check the GGUF, unpack `gguf`, convert to /tmp/grpo-smollm2/model.
set -euo pipefail
STAGE=/tmp/grpo-smollm2/stage
MODEL=/tmp/grpo-smollm2/model
mkdir -p "$STAGE"
assemble=0
for arg in "$@"; do
  if [ "$arg" = --assemble ]; then assemble=1; continue; fi
  cp "$arg" "$STAGE/"
done
cd "$STAGE"
for f in part_* gguf-pkg.tar.gz; do
  [ -f "$f" ] && grep " $f\$" SHA256 | sha256sum -c --quiet - && echo "staged $f"
done
if [ "$assemble" = 1 ] && [ ! -f "$MODEL/model.safetensors" ]; then
  cat part_* > model.gguf
  grep " model.gguf\$" SHA256 | sha256sum -c -
  mkdir -p gguf-pkg && tar -C gguf-pkg -xzf gguf-pkg.tar.gz
  cd - >/dev/null
  PYTHONPATH="$STAGE/gguf-pkg:${PYTHONPATH:-}" python3 benchmarks/grpo_smollm2/convert_gguf.py "$STAGE/model.gguf" "$MODEL"
fi
ls "$MODEL" 2>/dev/null || echo "model not assembled yet"
