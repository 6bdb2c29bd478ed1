#!/usr/bin/env bash
# Re-record every benchmark in this folder on the current machine (run from the project root).
# The reference recordings are made on 2xH200 (tools/gpu_session.sh --bench); file names say where.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${BENCH_TAG:-2xH200}"
python3 -m labutils bench -b 1K -e 1G -f 2 --json "benchmarks/bench_$tag.json" --csv "benchmarks/bench_$tag.csv" \
  --plot "benchmarks/bench_$tag.png" --no-progress > "benchmarks/bench_$tag.txt"
tail -12 "benchmarks/bench_$tag.txt"
python3 benchmarks/pool_roundtrip.py > "benchmarks/pool_roundtrip_$tag.txt"
cat "benchmarks/pool_roundtrip_$tag.txt"
