#!/usr/bin/env bash
# run_check.sh MOEJIT FILECHECK CHECKFILE: runs `MOEJIT <ARGS>` from the check file, checks the
# exit code (EXIT:, default 0) and matches the output with FileCheck.
set -uo pipefail
moejit="$1" filecheck="$2" check="$3"
args=$(sed -n 's/^; ARGS: //p' "$check" | head -n 1)
expected_exit=$(sed -n 's/^; EXIT: //p' "$check" | head -n 1)
expected_exit=${expected_exit:-0}
output=$(eval "\"$moejit\" $args" 2>&1)
status=$?
if [ "$status" != "$expected_exit" ]; then
  echo "moejit $args exited $status, expected $expected_exit; output:"
  echo "$output"
  exit 1
fi
printf '%s\n' "$output" | "$filecheck" --dump-input=fail "$check"
