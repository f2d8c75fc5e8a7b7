#!/usr/bin/env bash
# benchmarks/verl/build.sh [OUTDIR]
#
# Dev machine (PyPI reachable). Builds ONE offline bundle for the lent GPU machine: the shared vLLM 0.26 + TRL +
# datasets set (../shared/gpu/wheels.txt) plus verl 0.9.1 and its extras (wheels.txt here), with the shared
# ../shared/gpu/build-bundle (its WHEELS_TXT, PIP_FIND_LINKS and PART_SIZE knobs; nothing of it is copied). The same
# split-archive scheme: part_NN, SHA256, MANIFEST, stage, assemble. Default OUTDIR: <repo>/.wheels/gpu-verl-bundle
# (git-ignored; the device runner only carries it when a call names it in `carry`).
#
# Before build-bundle runs, two local wheels go into OUTDIR/.verl/links, which pip prefers over PyPI:
#   * antlr4-python3-runtime 4.9.3, built from its sdist (PyPI has no wheel; hydra-core/omegaconf pin 4.9.*);
#   * ray 2.55.1 without ray/jars (the Java worker jar, 33 MiB, already compressed, never used by verl), repacked
#     with build tag "1nojars" (same version and platform tags; pip prefers the higher build tag) and its RECORD
#     lines dropped. Every other byte of the wheel is unchanged.
# Afterwards it checks the unpacked site (verl, ray binaries and their executable bits, no jars), and downloads
# transformers.txt's wheels into OUTDIR/verl-transformers/ (carried by the run call, see README.md).
#
# Parts are 32 MiB, not build-bundle's 53: a device call carries at most 64 MiB INCLUDING the repository that travels
# with it (11 MiB on 2026-12-01 morning, 19 MiB by its evening, 25 MiB on 2026-12-05), so 48 MiB parts stopped
# fitting, then 38 MiB ones left no room for the repository to grow.
#
# Knobs: PYTHON (default python3), GRPO_GPU_SHARED (default <repo>/../shared/gpu), PART_SIZE (default 32M),
# FORCE=1 (passed to build-bundle), KEEP_SITE=1 (keep OUTDIR/.work/site for inspection).
set -euo pipefail

die() { echo "verl build: ERROR: $*" >&2; exit 1; }
log() { printf '[verl build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(git -C "$HERE" rev-parse --show-toplevel)
SHARED=${GRPO_GPU_SHARED:-$(realpath -m "$REPO/../shared/gpu")}
OUTDIR=$(realpath -m "${1:-$REPO/.wheels/gpu-verl-bundle}")
PY=${PYTHON:-python3}
VERL=$OUTDIR/.verl                 # this wrapper's scratch: local wheels, the joined pin list
LINKS=$VERL/links
RAY_PIN=ray==2.55.1
RAY_TAG=1nojars
TARGET_OPTS=(--only-binary=:all: --python-version 3.12 --implementation cp
             --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1

[ -x "$SHARED/build-bundle" ] || die "build-bundle not found in $SHARED (set GRPO_GPU_SHARED)"
[ -f "$SHARED/wheels.txt" ] || die "$SHARED/wheels.txt not found"
mkdir -p "$LINKS"

# 1. antlr4-python3-runtime 4.9.3: pure Python, built once from the sdist.
if ! ls "$LINKS"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  log "building antlr4-python3-runtime 4.9.3 from its sdist"
  "$PY" -m pip wheel --quiet --no-deps --no-binary antlr4-python3-runtime antlr4-python3-runtime==4.9.3 \
    -w "$LINKS" || die "could not build antlr4-python3-runtime 4.9.3"
fi

# 2. ray without ray/jars.
if ! ls "$LINKS"/ray-2.55.1-$RAY_TAG-*.whl >/dev/null 2>&1; then
  log "repacking $RAY_PIN without ray/jars"
  rm -rf "$VERL/ray-src" && mkdir -p "$VERL/ray-src"
  env -u PIP_FIND_LINKS "$PY" -m pip download --quiet --no-deps --no-cache-dir "${TARGET_OPTS[@]}" "$RAY_PIN" \
    -d "$VERL/ray-src" || die "pip download $RAY_PIN failed"
  "$PY" - "$VERL/ray-src" "$LINKS" "$RAY_TAG" <<'PYEOF'
import pathlib, sys, zipfile
src, links, tag = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = next(src.glob("ray-*.whl"))
name, version, rest = wheel.name.split("-", 2)            # rest: python-abi-platform.whl (no build tag on PyPI)
out = links / f"{name}-{version}-{tag}-{rest}"
dropped = 0
with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out.with_suffix(".tmp"), "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():                           # ZipInfo keeps external_attr: executables stay executable
        if info.filename.startswith("ray/jars/"):
            dropped += info.file_size
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(line for line in data.splitlines(keepends=True) if not line.startswith(b"ray/jars/"))
        elif info.filename.endswith(".dist-info/WHEEL"):
            data = data.rstrip(b"\n") + f"\nBuild: {tag}\n".encode()
        info.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(info, data)
out.with_suffix(".tmp").rename(out)
print(f"    {out.name}: {out.stat().st_size / 2**20:.1f} MiB ({dropped / 2**20:.1f} MiB of ray/jars dropped)")
PYEOF
  rm -rf "$VERL/ray-src"
fi
# build-bundle caches downloads in OUTDIR/.work/wheels and picks one file per pin: keep only the repacked ray there.
find "$OUTDIR/.work/wheels" -maxdepth 1 -name 'ray-2.55.1-cp312-*.whl' -print -delete 2>/dev/null | sed 's/^/    removed from the cache: /' || true

# 3. One pin list: the shared set, then verl's.
{ echo "# generated by benchmarks/verl/build.sh: $SHARED/wheels.txt + benchmarks/verl/wheels.txt"
  cat "$SHARED/wheels.txt"; echo; cat "$HERE/wheels.txt"; } > "$VERL/wheels.txt"

# 4. The shared builder, unchanged.
log "running $SHARED/build-bundle $OUTDIR"
WHEELS_TXT="$VERL/wheels.txt" PIP_FIND_LINKS="$LINKS" KEEP_SITE=1 PYTHON="$PY" PART_SIZE="${PART_SIZE:-32M}" \
  "$SHARED/build-bundle" "$OUTDIR" | tee "$VERL/build-bundle.out"

# 5. Check what verl needs in the site (only when build-bundle just built it; it keeps the site with KEEP_SITE=1).
SITE=$OUTDIR/.work/site
if [ -d "$SITE" ]; then
  log "checking the site"
  for f in verl/trainer/main_ppo.py verl/model_merger/__main__.py ray/_raylet.so transfer_queue/__init__.py \
           tensordict/_C.so hydra/__init__.py antlr4/__init__.py torchdata/stateful_dataloader/__init__.py \
           peft/__init__.py vllm/__init__.py trl/__init__.py; do
    ls "$SITE"/$f >/dev/null 2>&1 || die "missing in the site: $f"
  done
  for f in ray/core/src/ray/raylet/raylet ray/core/src/ray/gcs/gcs_server; do
    [ -x "$SITE/$f" ] || die "$f is missing or not executable"
  done
  [ ! -e "$SITE/ray/jars" ] || die "ray/jars is still in the site"
  grep -q "^Build: $RAY_TAG" "$SITE"/ray-2.55.1.dist-info/WHEEL || die "the site's ray is not the repacked wheel"
  if [ "${KEEP_SITE:-0}" != 1 ]; then
    rm -rf "$SITE" "$OUTDIR/.work/grpo-gpu-bundle.tar.xz"
  fi
fi

# 6. verl's transformers (carried by the run call, not part of the bundle).
mkdir -p "$OUTDIR/verl-transformers"
env -u PIP_FIND_LINKS "$PY" -m pip download --quiet --no-deps --no-cache-dir "${TARGET_OPTS[@]}" \
  -r "$HERE/transformers.txt" -d "$OUTDIR/verl-transformers" || die "pip download of transformers.txt failed"
(cd "$OUTDIR/verl-transformers" && sha256sum ./*.whl > SHA256)

n=$(grep -cE '  part_[0-9]+$' "$OUTDIR/SHA256")
log "bundle: $n parts in $OUTDIR"
(cd "$OUTDIR" && stat -c '    %n %s bytes' part_* && du -ch part_* | tail -1 | sed 's/^/    /')
log "verl's transformers: $(cd "$OUTDIR/verl-transformers" && ls ./*.whl | xargs -n1 basename | tr '\n' ' ')($(du -sh "$OUTDIR/verl-transformers" | cut -f1))"
echo "Then the run call: see benchmarks/verl/README.md (carry the verl-transformers folder with it)."
