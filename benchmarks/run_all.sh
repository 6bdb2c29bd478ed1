#!/usr/bin/env bash
# Re-record every benchmark in this folder on the current machine (run from the project root or here).
# The reference recordings are made on 2xH200 (tools/gpu_session.sh --bench); file names say where:
#   benchmarks/run_all.sh                        # BENCH_TAG=2xH200 (default): bench_2xH200.*, ...
#   BENCH_TAG=cpu_gloo benchmarks/run_all.sh     # a machine without GPUs: gloo ranks, no CUDA-graph run
# Every text file carries the machine's fingerprint.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${BENCH_TAG:-2xH200}"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")

# 1. eager (each call launched by the host, as a training loop launches it): every collective,
#    with a bare loop of the same torch call timed beside the benchmark's (the "bench / bare" line)
if [ "$gpus" -ge 2 ]; then sizes=(-b 8 -e 1G -f 2); else sizes=(-b 8 -e 4M -f 2); fi
python3 -m labutils bench "${sizes[@]}" --json "benchmarks/bench_$tag.json" --csv "benchmarks/bench_$tag.csv" \
  --plot "benchmarks/bench_$tag.png" --no-progress > "benchmarks/bench_$tag.txt"
grep -E "^# (8-byte latency|bench / bare|Wrong|Peak|Duration)" "benchmarks/bench_$tag.txt"
note() {  # the Markdown note of a recorded run, generated from its JSON
  python3 -c "import sys; from labutils.bench import files, report; print(report.link_note(files.load_json(sys.argv[1])))" "$1"
}
note "benchmarks/bench_$tag.json" > "benchmarks/bench_$tag.md"

# 2. CUDA graphs (nccl-tests' -G): each point's calls captured once and replayed 20 times, so the
#    host's launch drops out; the same collectives, 8 B .. 128 MiB (NCCL only)
if [ "$gpus" -ge 2 ]; then
  python3 -m labutils bench -b 8 -e 128M -f 4 --cuda-graph 20 --json "benchmarks/bench_graph_$tag.json" \
    --csv "benchmarks/bench_graph_$tag.csv" --no-progress > "benchmarks/bench_graph_$tag.txt"
  grep -E "^# (8-byte latency|Wrong|Duration)" "benchmarks/bench_graph_$tag.txt"
  note "benchmarks/bench_graph_$tag.json" > "benchmarks/bench_graph_$tag.md"
fi

# 3. the forms of send/recv (which one the benchmark times), and the RankPool round trip
python3 benchmarks/p2p_forms.py > "benchmarks/p2p_forms_$tag.txt"
tail -6 "benchmarks/p2p_forms_$tag.txt"
python3 benchmarks/pool_roundtrip.py > "benchmarks/pool_roundtrip_$tag.txt"
cat "benchmarks/pool_roundtrip_$tag.txt"

# 4. where a rank's start-up goes: import torch with and without cached bytecode, then each phase
python3 benchmarks/startup.py > "benchmarks/startup_$tag.txt"
cat "benchmarks/startup_$tag.txt"
