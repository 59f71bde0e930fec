# Sourced by the GPU scripts: installs the carried wheels (.whl/: diffusers, soundfile, cffi, pycparser,
# cryptography - the GPU image lacks them) and the project, and defines `phase NAME SECONDS COMMAND...`,
# one timed step whose log goes to $OUT/NAME.log and whose last line is echoed.
OUT=${OUT:-/tmp/h3-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
nvidia-smi -L
phase() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $(( $(date +%s) - start )) s; $(tail -n 1 "$OUT/$name.log")"
}
