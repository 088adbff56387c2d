#!/usr/bin/env bash
# go test, then once more for the tests that failed: a test that fails twice
# fails the run; one that passes the second time is named in a summary, so a
# timing-sensitive test's flake is reported, not hidden.
#
#   tools/gotest-retry.sh [go test flags and packages]
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[[ $rc -eq 0 ]] && exit 0

# Failed top-level tests per package: "--- FAIL: TestX" lines precede the
# package's "FAIL<TAB>pkg" line. A package that failed to build has none.
mapfile -t reruns < <(awk '
	/^--- FAIL: / { names = names (names ? "|" : "") $3; next }
	/^FAIL\t/ { if ($0 ~ /build failed|setup failed/) { print $2 "\t-" } else if (names) { print $2 "\t" names } names = ""; next }
	/^ok\t/ { names = "" }' "$log")
if [[ ${#reruns[@]} -eq 0 ]]; then
	exit "$rc"
fi
# The flags given before the first package (-p, -count, -timeout, ...).
flags=()
for a in "$@"; do
	[[ $a == ./* ]] && break
	flags+=("$a")
done
echo
echo "==> running the failed tests once more"
failed=0
flaky=()
for r in "${reruns[@]}"; do
	pkg=${r%%$'\t'*} names=${r#*$'\t'}
	if [[ $names == - ]]; then
		failed=1
		continue
	fi
	if go test "${flags[@]}" -run "^(${names})\$" "$pkg"; then
		flaky+=("$pkg: ${names//|/ }")
	else
		failed=1
	fi
done
if ((${#flaky[@]})); then
	echo
	echo "passed on the second run (timing-sensitive; see the first run's output above):"
	printf '  %s\n' "${flaky[@]}"
fi
exit "$failed"
