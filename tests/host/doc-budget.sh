#!/usr/bin/env bash
# The documentation's word budget: README.md and docs/*.md at most 20,000 words in all
# (wc -w), none over 4,000. The docs are reference (tables, commands, short reasons); the
# history of how a figure was found belongs in commit messages and issue notes. A change
# that adds words takes as many out elsewhere.
#   bash tests/host/doc-budget.sh
set -u

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
suite=doc-budget
. tests/host/checks.sh

total=$(cat README.md docs/*.md | wc -w)
check "README.md and docs/*.md: $total words, at most 20000" test "$total" -le 20000
for f in README.md docs/*.md; do
	n=$(wc -w <"$f")
	check "$f: $n words, at most 4000" test "$n" -le 4000
done
summary
