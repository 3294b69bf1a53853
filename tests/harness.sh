# Sourced by the shell tests: a temporary directory removed on exit, `check NAME CMD...` that runs
# a case and records ok/FAIL, and `finish`, which prints "N passed, N failed" and sets the status.
# `on_exit CMD` adds a command to run on exit (before the directory is removed), e.g. to kill
# processes a failed case left behind. TANDEM_TEST_ONLY=REGEX runs only the matching cases.
# TANDEM_TEST_LIGHT=REGEX, set by CTest in the sanitizer build of make test for a few slow tests,
# does the same unless TANDEM_TEST_FULL=1 (make test-san-full); finish says how many it left out.
TMP=$(mktemp -d /tmp/tandem-test-XXXXXX)
_exit_cmds='rm -rf "$TMP"'
trap 'eval "$_exit_cmds"' EXIT
on_exit() { _exit_cmds="$1; $_exit_cmds"; }
passed=0 failed=0 light_skipped=0
check() {
  local name=$1; shift
  # TANDEM_TEST_ONLY=REGEX runs only the cases whose name matches (to rerun one case by hand)
  [[ -n ${TANDEM_TEST_ONLY:-} && ! $name =~ $TANDEM_TEST_ONLY ]] && return 0
  if [[ -n ${TANDEM_TEST_LIGHT:-} && ${TANDEM_TEST_FULL:-0} != 1 && ! $name =~ $TANDEM_TEST_LIGHT ]]; then
    light_skipped=$((light_skipped + 1))
    return 0
  fi
  local t0=$EPOCHREALTIME # each case's wall time: what to trim when make test grows
  if "$@"; then passed=$((passed + 1)); echo "ok   $name ($(_secs "$t0"))"; else failed=$((failed + 1)); echo "FAIL $name ($(_secs "$t0"))"; fi
}
_secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f s", b - a }'; }
finish() {
  [[ $light_skipped -gt 0 ]] && echo "($light_skipped cases left out by TANDEM_TEST_LIGHT; TANDEM_TEST_FULL=1 runs them)"
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
