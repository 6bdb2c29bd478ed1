#!/usr/bin/env bash
# Execute the labs (and optionally the tests and benchmarks) on a GPU machine, and pack what must be
# committed into one tar file.
#
#   tools/fetch-wheels.sh          # only for a GPU machine without a package index: on a machine with
#                                  # pip, once; copy .whl/ along with the checkout
#   tools/gpu_session.sh [--labs "00 01"] [--no-labs] [--single-gpu] [--tests] [--bench] [--out DIR]
#
# Installs .whl/*.whl (if any) offline into .whl/site, then:
#   --labs   python -m labutils run-labs --inplace --record   (notebooks + notebooks/recorded/*.json);
#            every lab: the course time (table, total, fingerprint, date) in benchmarks/course_<GPUs>.txt
#   --single-gpu  every lab again with CUDA_VISIBLE_DEVICES=0 (the 1-GPU mode; only its time is saved,
#            in benchmarks/course_1x<GPU>.txt)
#   --tests  pytest (unit, gloo, GPU tests and nbval over the freshly executed notebooks; $PYTEST_ARGS
#            narrows it, $PYTEST_WORKERS sets pytest-xdist's workers)
#   --bench  the benchmark scripts whose recorded output lives in benchmarks/
# and writes DIR/gpu_results.tar (notebooks/*.ipynb, notebooks/recorded, benchmarks) plus logs
# (DIR defaults to gpu_out/ in the checkout, git-ignored).
set -uo pipefail
labs="" run_labs=1 run_single=0 run_tests=0 run_bench=0 out="" cell_timeout=300
while [ $# -gt 0 ]; do
  case "$1" in
    --labs) labs="$2"; shift 2 ;;
    --no-labs) run_labs=0; shift ;;
    --single-gpu) run_single=1; shift ;;
    --tests) run_tests=1; shift ;;
    --bench) run_bench=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --cell-timeout) cell_timeout="$2"; shift 2 ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] && mkdir -p "$out" && out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
out="${out:-$PWD/gpu_out}"
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  site="$PWD/.whl/site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# Bytecode. An installation that ships torch without .pyc files, under PYTHONDONTWRITEBYTECODE=1, makes
# every interpreter (each kernel, each rank) compile torch's modules again: about 1.5 s a process on the
# reference machine (benchmarks/startup.py measures it). Then compile them once, into a folder of our
# own (the installation may be read-only; stderr, warnings about test files in packages, is dropped);
# run-labs' summary names the folder.
if python3 -c "import pathlib, sys, torch; sys.exit(not (sys.flags.dont_write_bytecode and not \
    (pathlib.Path(torch.__file__).parent / '__pycache__').is_dir()))" 2>/dev/null; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="${TMPDIR:-/tmp}/labutils-pycache"
  t0=$(date +%s)
  python3 - 2>/dev/null <<'PY'
import compileall, os, sys
# the folders on sys.path that hold packages: torch's installation, the wheels in .whl/site, the checkout
for folder in dict.fromkeys(p for p in sys.path if os.path.isdir(p) and not p.endswith(".zip")):
    compileall.compile_dir(folder, quiet=2, workers=0)  # quiet=2: a file that does not compile is skipped
PY
  echo "bytecode compiled into $PYTHONPYCACHEPREFIX in $(( $(date +%s) - t0 )) s"
fi
python3 -m labutils hw | tee "$out/hw.txt"
rc=0
# benchmarks/course_2xH200.txt on the reference machine: "<GPU count>x<first word after NVIDIA>"
tag() { python3 -c "import torch; n = torch.cuda.device_count(); \
print(f'{n}x' + (torch.cuda.get_device_name(0).replace('NVIDIA ', '').split()[0] if n else 'CPU'))"; }
if [ "$run_labs" = 1 ]; then
  # the course time goes to benchmarks/ only for a run of every lab; a subset's stays in $out
  if [ -z "$labs" ]; then summary="benchmarks/course_$(tag).txt"; else summary="$out/course_subset.txt"; fi
  # shellcheck disable=SC2086
  python3 -m labutils run-labs --inplace --record --timeout "$cell_timeout" --summary "$summary" $labs 2>&1 \
    | tee "$out/run_labs.log" || rc=1
fi
if [ "$run_single" = 1 ]; then
  summary="benchmarks/course_$(CUDA_VISIBLE_DEVICES=0 tag).txt"
  CUDA_VISIBLE_DEVICES=0 python3 -m labutils run-labs --timeout "$cell_timeout" --summary "$summary" 2>&1 \
    | tee "$out/single_gpu.log" || rc=1
fi
if [ "$run_bench" = 1 ] && [ -x benchmarks/run_all.sh ]; then
  benchmarks/run_all.sh 2>&1 | tee "$out/bench.log" || rc=1
fi
tar -cf "$out/gpu_results.tar" notebooks/*.ipynb notebooks/recorded benchmarks 2>/dev/null
if [ "$run_tests" = 1 ]; then
  # Notebooks are independent: with pytest-xdist, run several at once (--dist loadfile keeps each
  # notebook's cells on one worker, as nbval needs). Measurements are not checked, so sharing is fine.
  xdist=""; python3 -c "import xdist" 2>/dev/null && xdist="-n ${PYTEST_WORKERS:-4} --dist loadfile"
  # shellcheck disable=SC2086
  # PYTEST_ARGS: what to test (default: everything), e.g. "notebooks tests/gpu tests/test_claims.py"
  python3 -m pytest -p no:cacheprovider $xdist ${PYTEST_ARGS:-} 2>&1 | tee "$out/pytest.log" | tail -40 || rc=1
fi
tar -cf "$out/gpu_results.tar" notebooks/*.ipynb notebooks/recorded benchmarks 2>/dev/null
echo "packed $out/gpu_results.tar; exit $rc"
exit $rc
