# Sourced by the shell tests: a temporary directory removed on exit, `check NAME CMD...` that runs
# a case and records ok/FAIL, and `finish`, which prints "N passed, N failed" and sets the status.
TMP=$(mktemp -d /tmp/tandem-test-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
passed=0 failed=0
check() {
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi
}
finish() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
