#!/usr/bin/env bash
# tools/gpu_session.sh in the background, for a GPU machine reached through a runner that lets one
# command run only for a limited time: start it, then collect its results with as many waits as needed.
#
#   tools/gpu_job.sh start "<gpu_session.sh options>"   # copy the tree to the job folder, start detached
#   tools/gpu_job.sh wait SECONDS OUTDIR                # wait up to SECONDS; copy logs/results to OUTDIR
#
# The job runs in a copy of the checkout ($GPU_JOB_DIR, default labutils-gpujob in the system's temp
# folder), so that whatever refreshes the working tree meanwhile cannot overwrite notebooks while they are
# being executed. `wait` returns early when the job ends and always leaves the newest partial results
# (gpu_results.tar, logs) in OUTDIR.
set -uo pipefail
cmd="${1:-}"; shift || true
job="${GPU_JOB_DIR:-${TMPDIR:-/tmp}/labutils-gpujob}"
case "$cmd" in
  start)
    rm -rf "$job" && mkdir -p "$job" && cp -a . "$job/src"
    cd "$job/src" || exit 1
    setsid nohup bash -c "tools/gpu_session.sh $1 --out $job/out; echo \$? > $job/done" \
      > "$job/session.log" 2>&1 < /dev/null &
    echo "started job in $job (pid $!)"
    ;;
  wait)
    secs="${1:-500}"; out="${2:?usage: $0 wait SECONDS OUTDIR}"; mkdir -p "$out" && out="$(cd "$out" && pwd)"
    end=$(( $(date +%s) + secs ))
    while [ ! -f "$job/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    cp "$job"/session.log "$out/" 2>/dev/null
    cp "$job"/out/*.log "$job"/out/*.txt "$out/" 2>/dev/null
    (cd "$job/src" && tar -cf "$out/gpu_results.tar" notebooks/*.ipynb notebooks/recorded benchmarks 2>/dev/null)
    if [ -f "$job/done" ]; then echo "JOB DONE rc=$(cat "$job/done")"; else echo "JOB RUNNING"; fi
    tail -25 "$job/session.log"
    ;;
  *) echo "usage: $0 start OPTIONS | wait SECONDS OUTDIR" >&2; exit 2 ;;
esac
