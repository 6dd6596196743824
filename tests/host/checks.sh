# The host test scripts' checks: one line each ("SUITE: ok   WHAT" or "SUITE: FAIL WHAT")
# and a last line "SUITE: N passed, M failed" that scripts/test counts. Set suite= before
# sourcing; end with `summary`.
passed=0
failed=0
check() { # WHAT CMD...
	if "${@:2}"; then
		echo "$suite: ok   $1"
		passed=$((passed + 1))
	else
		echo "$suite: FAIL $1"
		failed=$((failed + 1))
	fi
}
summary() {
	echo "$suite: $passed passed, $failed failed"
	[ "$failed" = 0 ]
}
