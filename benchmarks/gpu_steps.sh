#!/usr/bin/env bash
# A batch of GPU work in one call, on any CUDA machine: benchmarks/gpu_steps.sh STEP [STEP ...]
# Steps run in the order given, from the repository root; each step's log goes to $OUT (a failed step does not
# stop the next). Steps:
#   wheels         install the optional comparison libraries (quack, Liger and what they need) offline from
#                  $WHEELS/*.whl into $SITE; later steps, in this call and later ones, import from there. A wheel
#                  over one call's carry limit travels split (split -n 2 -d W.whl $WHEELS/W.whl.part, one part
#                  per call, each part copied to $WHEELS there by the call that carries it): parts are joined first.
#                  quack 0.6.5 needs nvidia-cutlass-dsl and its libs-base, libs-core and libs-cu12 wheels (the
#                  Python package `cutlass` is in libs-core), apache-tvm-ffi, torch-c-dlpack-ext and einops
#   restore        unpack a build cache that `pack` wrote ($BUILD_CACHE), so that `build` rebuilds nothing
#   build          build every solution's extension in parallel (python -m harness build)
#   eval:PROBLEM   make eval PROBLEM=PROBLEM (extra arguments in $EVAL_ARGS); results/ as the run leaves it
#   old-eval:PROBLEM  the same with an older harness, for its wall time only: make it first with
#                  mkdir "$OLD" && git archive REV harness problems solutions | tar -x -C "$OLD"
#   tests          the GPU-marked tests (under $TEST_PATHS, all when unset), $TEST_JOBS at once. Tests at once
#                  share the GPU: processes time-slice it, so the parent's clock sees the others' work between
#                  calls and honest kernels can fail escaped-timing. Timing verdicts to quote come from TEST_JOBS=1
#   trust          the trust-boundary and exploit suites on the GPU
#   check:PROBLEM  benchmarks/check.py PROBLEM --quick (correctness of every solution, timing beside eager)
#   timing         benchmarks/timing_check.py: the harness's timing against do_bench, every timing shape
#   batch          $BATCH_COUNT mixed softmax candidates (benchmarks/batch_candidates.py) through eval-batch on every
#                  visible GPU, from an empty build cache, then again with the cache warm; summaries and the
#                  verdicts against what each file should get into $OUT/batch_{cold,warm}
#   batch-start    the same in a detached session (it outlives this call; the device keeps it running while the
#                  machine is held), working in $BATCH_WORK
#   batch-wait     wait up to $BATCH_WAIT s for a started batch, then copy what it has into $OUT (call again if
#                  it is not done: a call may last 10 minutes)
#   pack           results/ and the build cache (object files included: without them ninja rebuilds) into $OUT
# Environment (defaults): OUT (out/), PYTHON (.venv/bin/python if present, else python3), WHEELS (.whl),
# SITE ($TMPDIR/gpu-steps-site), BUILD_CACHE ($OUT/build_cache.tgz), OLD (.old), TEST_JOBS (1), BATCH_COUNT (100),
# BATCH_ARGS (--timeout 30: a hung candidate costs 30 s, not the default 300), BATCH_WORK ($TMPDIR/batch-work),
# BATCH_WAIT (540).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac  # old-eval runs elsewhere
TEST_JOBS=${TEST_JOBS:-1}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-${TMPDIR:-/tmp}/gpu-steps-site}
BUILD_CACHE=${BUILD_CACHE:-$OUT/build_cache.tgz}
OLD=${OLD:-.old}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
# The wheels' packages need their .pth files processed: a sitecustomize beside them adds $SITE as a site dir.
if [ -d "$SITE/.custom" ]; then export PYTHONPATH="$SITE/.custom${PYTHONPATH:+:$PYTHONPATH}"; fi
log() { echo "=== $(date +%T) $*" | tee -a "$OUT/steps.log"; }
timed() { local start=$SECONDS; "$@"; log "took $((SECONDS - start)) s"; }
BATCH_WORK=${BATCH_WORK:-${TMPDIR:-/tmp}/batch-work}

# The batch benchmark, cold then warm, in $BATCH_WORK (not $OUT: a detached run outlives the call that started it).
batch_run() {
  local dir="$BATCH_WORK/candidates" run start
  rm -rf "$BATCH_WORK" && mkdir -p "$BATCH_WORK"
  "$PYTHON" benchmarks/batch_candidates.py "$dir" --count "${BATCH_COUNT:-100}"
  export HARNESS_BUILD_DIR="$BATCH_WORK/build"  # cold: an empty build cache
  for run in cold warm; do
    start=$SECONDS
    timeout 3000 "$PYTHON" -m harness eval-batch softmax --dir "$dir" --results "$BATCH_WORK/batch_$run" \
      ${BATCH_ARGS:---timeout 30} > "$BATCH_WORK/batch_$run.log" 2>&1
    echo "batch $run: $((SECONDS - start)) s wall (exit $?)" >> "$BATCH_WORK/times.txt"
    "$PYTHON" benchmarks/batch_candidates.py "$dir" --check "$BATCH_WORK/batch_$run" > "$BATCH_WORK/check_$run.txt" 2>&1
  done
  touch "$BATCH_WORK/DONE"
}

batch_collect() {
  cp -r "$BATCH_WORK"/batch_cold "$BATCH_WORK"/batch_warm "$OUT/" 2>/dev/null
  cp "$BATCH_WORK"/*.log "$BATCH_WORK"/*.txt "$OUT/" 2>/dev/null
  cat "$BATCH_WORK/times.txt" 2>/dev/null
  for f in "$BATCH_WORK"/check_*.txt; do [ -f "$f" ] && { echo "-- $f"; tail -12 "$f"; }; done
  if [ -f "$BATCH_WORK/batch_warm/summary.md" ]; then head -30 "$BATCH_WORK/batch_warm/summary.md"; fi
}

# The GPU-marked tests under the given paths (all when none), $TEST_JOBS at once (pytest-xdist, which the device's
# image has), logged as they run to $OUT/NAME.log (a call cut short still brings back what ran); the failures follow.
gpu_tests() {
  local name=$1; shift
  local jobs=()
  [ "$TEST_JOBS" -gt 1 ] && jobs=(-n "$TEST_JOBS")
  timeout 1800 "$PYTHON" -m pytest -v -m gpu -ra --tb=short -p no:cacheprovider "${jobs[@]}" "$@" > "$OUT/$name.log" 2>&1
  grep -h "^FAILED\|^ERROR\|^XFAIL\|^XPASS" "$OUT/$name.log"
  tail -n 1 "$OUT/$name.log"
}

for step in "$@"; do
  case "$step" in
    wheels)
      log "wheels from $WHEELS into $SITE"
      for first in "$WHEELS"/*.whl.part00; do
        [ -e "$first" ] && cat "${first%00}"?? > "${first%.part00}" && rm "${first%00}"??
      done
      "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$WHEELS"/*.whl 2>&1 | tail -3
      mkdir -p "$SITE/.custom" && echo "import site; site.addsitedir('$SITE')" > "$SITE/.custom/sitecustomize.py"
      export PYTHONPATH="$SITE/.custom${PYTHONPATH:+:$PYTHONPATH}"
      "$PYTHON" -c "import quack, liger_kernel; print('quack and liger import')" 2>&1 | tail -1 ;;
    restore)
      log "restore $BUILD_CACHE"; tar xzf "$BUILD_CACHE" && du -sh .build ;;
    build)
      log build; timed timeout 1800 "$PYTHON" -m harness build --jobs 8 2>&1 | tee -a "$OUT/build.log" | tail -20 ;;
    eval:*)
      name=${step#eval:}; log "eval $name"
      if command -v make > /dev/null; then cmd=(make eval PROBLEM="$name" PYTHON="$PYTHON" ARGS="${EVAL_ARGS:-}")
      else cmd=("$PYTHON" -m harness eval "$name" ${EVAL_ARGS:-}); fi
      timed timeout 1800 "${cmd[@]}" 2>&1 | tee -a "$OUT/eval_$name.log" | grep -v "^  "
      cp results/runs.jsonl "$OUT/" 2>/dev/null ;;
    old-eval:*)
      name=${step#old-eval:}; log "old eval $name in $OLD"
      (cd "$OLD" && timed timeout 1800 "$PYTHON" -m harness eval "$name" ${EVAL_ARGS:-} --results "$OUT/old_results" > "$OUT/old_eval_$name.log" 2>&1) ;;
    tests)
      log tests; timed gpu_tests tests_gpu ${TEST_PATHS:-} ;;
    trust)
      log trust; timed gpu_tests tests_trust tests/test_trust_boundary.py tests/test_adversarial.py ;;
    check:*)
      name=${step#check:}; log "check $name"
      timed timeout 1800 "$PYTHON" benchmarks/check.py "$name" --quick 2>&1 | tee "$OUT/check_$name.log" | grep -v "^  PASS" | tail -40 ;;
    timing)
      log timing; timed timeout 1800 "$PYTHON" benchmarks/timing_check.py --json "$OUT/timing_check.json" 2>&1 | tee "$OUT/timing_check.log" ;;
    batch)
      log batch; timed batch_run; batch_collect ;;
    batch-start)
      log "batch started in $BATCH_WORK"
      export -f batch_run; export PYTHON BATCH_WORK BATCH_COUNT BATCH_ARGS
      setsid nohup bash -c batch_run > /dev/null 2>&1 < /dev/null & ;;
    batch-wait)
      log "waiting for the batch in $BATCH_WORK"
      waited=0
      while [ ! -f "$BATCH_WORK/DONE" ] && [ "$waited" -lt "${BATCH_WAIT:-540}" ]; do sleep 10; waited=$((waited + 10)); done
      [ -f "$BATCH_WORK/DONE" ] && log "batch done" || { log "batch still running after ${waited} s"; tail -3 "$BATCH_WORK"/batch_*.log; }
      batch_collect ;;
    pack)
      log pack
      cp results/runs.jsonl results/leaderboard.md results/leaderboard.json "$OUT/" 2>/dev/null
      tar czf "$OUT/build_cache.tgz" .build 2>/dev/null; ls -la "$OUT" ;;
    *) log "unknown step $step (see the list at the top of $0)" ;;
  esac
done
