#!/usr/bin/env bash
# Formats the C++ sources with the checked-in .clang-format (clang-format 14,
# Debian 12's), or with --check reports any file that differs and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(find shared proxy master tests integration -name '*.cpp' -o -name '*.hpp' | sort)
if [ "${1:-}" = "--check" ]; then
  clang-format --dry-run --Werror "${files[@]}"
  echo "format: ${#files[@]} files as .clang-format says"
else
  clang-format -i "${files[@]}"
fi
