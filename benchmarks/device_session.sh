#!/usr/bin/env bash
# One batched session on an offline GPU machine, as used for the shipped results. Steps run in order:
#   wheels        install the optional comparison packages carried in .whl/ (+ the split cutlass wheel)
#   restore       unpack a build cache that an earlier call's `pack` returned (carry it as .build_device/)
#   build         build every solution's extension in parallel (only what changed, after `restore`)
#   eval:NAME     make eval PROBLEM=NAME (logs and results to $OUT)
#   tests         the GPU-marked tests, four at a time to save device time (`make test` runs them one at a time)
#   crosscheck    harness timing vs triton.testing.do_bench
#   check:NAME    benchmarks/check_NAME.py
#   old-eval:NAME the harness as it was before the trust boundary moved, wall time only; make .old/ first:
#                 mkdir .old && git archive dcc4c38 harness problems solutions | tar -x -C .old (then carry .old)
#   trust         the trust-boundary suite on the GPU (tests/test_trust_boundary.py, tests/test_adversarial.py -m gpu)
#   pack          results/ and the build cache (with its object files, ~10 MB) back to $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/sitecust; fi
log() { echo "=== $(date +%T) $*" | tee -a "$OUT/session.log"; }
for step in "$@"; do
  case "$step" in
    keep-part)
      mkdir -p /tmp/keep && cp .whl_parts/* /tmp/keep/ && ls -la /tmp/keep ;;
    wheels)
      log wheels
      if [ -f .whl_parts_b/ab ] && [ -f /tmp/keep/aa ]; then
        cat /tmp/keep/aa .whl_parts_b/ab > .whl/nvidia_cutlass_dsl_libs_cu12-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
      fi
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -3
      mkdir -p /tmp/sitecust && echo "import site; site.addsitedir('/tmp/site')" > /tmp/sitecust/sitecustomize.py
      export PYTHONPATH=/tmp/sitecust
      python3 -c "import quack.softmax, liger_kernel; print('quack and liger import')" 2>&1 | tail -2 ;;
    restore)
      log restore; tar xzf .build_device/build_cache.tgz && du -sh .build ;;
    build)
      log build; timeout 900 python3 -m harness build --jobs 8 2>&1 | tee -a "$OUT/build.log" ;;
    eval:*)
      name=${step#eval:}; log "eval $name"
      if command -v make >/dev/null; then cmd=(make eval PROBLEM="$name" PYTHON=python3 ARGS="${EVAL_ARGS:-}");
      else cmd=(python3 -m harness eval "$name" ${EVAL_ARGS:-}); fi
      start=$(date +%s)
      timeout 1500 "${cmd[@]}" 2>&1 | tee -a "$OUT/eval_$name.log" | grep -v "^  "
      log "eval $name took $(( $(date +%s) - start )) s"
      cp results/runs.jsonl "$OUT/" 2>/dev/null ;;
    old-eval:*)
      name=${step#old-eval:}; log "old eval $name"
      start=$(date +%s)
      (cd .old && timeout 1500 python3 -m harness eval "$name" ${EVAL_ARGS:-} --results /tmp/old_results > "$OUT/old_eval_$name.log" 2>&1)
      log "old eval $name took $(( $(date +%s) - start )) s" ;;
    trust)
      log trust; timeout 900 python3 -m pytest -q -m gpu -ra --tb=short tests/test_trust_boundary.py tests/test_adversarial.py 2>&1 | tee "$OUT/tests_trust.log" | tail -30 ;;
    tests)
      log tests; timeout 900 python3 -m pytest -q -m gpu -ra --tb=short -n 4 2>&1 | tee "$OUT/tests_gpu.log" | tail -30 ;;
    crosscheck)
      log crosscheck; timeout 900 python3 benchmarks/crosscheck_do_bench.py 2>&1 | tee "$OUT/crosscheck.log" ;;
    check:*)
      name=${step#check:}; log "check $name"; timeout 600 python3 "benchmarks/check_$name.py" --quick 2>&1 | tee "$OUT/check_$name.log" | tail -40 ;;
    pack)
      log pack
      cp results/runs.jsonl results/leaderboard.md results/leaderboard.json "$OUT/" 2>/dev/null
      # With the object files: without them ninja rebuilds everything (it did, fourth session).
      tar czf "$OUT/build_cache.tgz" .build 2>/dev/null; ls -la "$OUT" ;;
    *) echo "unknown step $step" ;;
  esac
done
