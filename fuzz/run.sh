#!/usr/bin/env bash
# Runs libFuzzer targets, each for SECONDS, on a working copy of its seed corpus.
#   fuzz/run.sh SECONDS WORKDIR path/to/fuzz_NAME...
# New inputs go to WORKDIR/corpus/NAME (the seeds in fuzz/corpus/NAME are only read), crashes to
# WORKDIR/crashes/NAME-*, each run's log to WORKDIR/NAME.log. Prints one line per target with the
# executions run; exits non-zero if any target found a crash, a leak, a timeout or a failed check.
set -u
SECONDS_EACH=${1:?usage: run.sh SECONDS WORKDIR FUZZER...}
WORK=${2:?usage: run.sh SECONDS WORKDIR FUZZER...}
shift 2
SRC=$(cd "$(dirname "$0")" && pwd)
failed=0
for bin in "$@"; do
  name=$(basename "$bin"); name=${name#fuzz_}
  mkdir -p "$WORK/corpus/$name" "$WORK/crashes"
  dict=()
  [[ -f $SRC/dict/$name.dict ]] && dict=(-dict="$SRC/dict/$name.dict")
  # -close_fd_mask=1: --help output stays quiet; failed checks and sanitizer reports go to the log
  # -rss_limit_mb / -malloc_limit_mb: an input that makes a parser allocate far beyond its size is a finding too.
  "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -close_fd_mask=1 \
    -print_final_stats=1 -artifact_prefix="$WORK/crashes/$name-" "${dict[@]}" \
    "$WORK/corpus/$name" "$SRC/corpus/$name" >"$WORK/$name.log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$WORK/$name.log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$WORK/$name.log" | tail -1)
  if [[ $rc -eq 0 ]]; then
    echo "fuzz $name: ${execs:-?} executions in ${SECONDS_EACH}s, ${cov:-cov: ?}, $(ls "$WORK/corpus/$name" | wc -l) corpus files: ok"
  else
    failed=1
    echo "fuzz $name: FAILED (exit $rc) after ${execs:-?} executions; log $WORK/$name.log, inputs $WORK/crashes/$name-*"
    grep -m1 -E 'ERROR: |fuzz check failed|runtime error' "$WORK/$name.log"
    echo "  reproduce: $bin $(ls -t "$WORK/crashes/$name-"* 2>/dev/null | head -1)"
  fi
done
exit $failed
