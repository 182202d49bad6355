#!/usr/bin/env bash
# Proves that the mobile package binds: runs gobind (golang.org/x/mobile, at
# the version mobile/go.mod pins with its `tool` line, built from the Go
# module proxy) for Go, Java and Objective-C, as `gomobile bind` does for
# Android and iOS, and fails if
#   - generation fails;
#   - gobind skipped anything: it leaves out, with only a comment saying
#     "skipped ...", every function, method, field, constant or variable
#     whose types it cannot carry;
#   - an exported identifier of the package (go doc) is missing from the
#     generated Java or Objective-C: a type gobind does not bind at all (a
#     named number type, say) is left out without any comment.
# Usage: bash .ci/gobind.sh [OUTDIR]   (default: a temporary directory, removed)
set -euo pipefail
cd "$(dirname "$0")/../mobile"

pkg=github.com/idemretry/idemretry/mobile
out=${1:-}
if [ -z "$out" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
rm -rf "$out/gen"
gen=$out/gen

echo "gobind $(go list -m -f '{{.Version}}' golang.org/x/mobile) on $pkg"
if ! go tool gobind -lang=go,java,objc -outdir "$gen" "$pkg"; then
  echo "FAIL: gobind failed"; exit 1
fi

java_dir=$gen/java/idemretry
objc_h=$gen/src/gobind/Idemretry.objc.h
pkg_java=$java_dir/Idemretry.java
for f in "$pkg_java" "$objc_h"; do
  [ -f "$f" ] || { echo "FAIL: gobind wrote no $f"; exit 1; }
done

fail=0
skipped=$(grep -rn -- '// skipped' "$gen" || true)
if [ -n "$skipped" ]; then
  echo "FAIL: gobind skipped what it cannot bind:"; echo "$skipped"; fail=1
fi

lower() { printf '%s%s' "$(printf '%s' "${1:0:1}" | tr '[:upper:]' '[:lower:]')" "${1:1}"; }
missing() { echo "FAIL: $1 is not in the generated $2"; fail=1; }

# Every exported identifier, from go doc: kind and name (for a method, its
# type and name), one a line. Constants and variables in groups are listed
# one by one (go doc -short would hide all but the first).
if ! doc=$(go doc -all . 2>"$out/doc.err"); then
  cat "$out/doc.err"; echo "FAIL: go doc failed"; exit 1
fi
idents=$(printf '%s\n' "$doc" | awk '
  /^(const|var) \($/ { group = $1; next }
  group != "" && /^\)/ { group = ""; next }
  group != "" && match($0, /^\t[A-Z][A-Za-z0-9_]*/) { print group, substr($0, 2, RLENGTH - 1); next }
  /^(const|var|type) [A-Z]/ { split($2, n, /[^A-Za-z0-9_]/); print $1, n[1]; next }
  /^func [A-Z]/ { split($2, n, "("); print "func", n[1]; next }
  /^func \([a-z]+ \*?[A-Z][A-Za-z0-9_]*\) [A-Z]/ { t = $3; gsub(/[*)]/, "", t); split($4, n, "("); print "method", t "." n[1] }
')

checked=0
while read -r kind name; do
  case $kind in
    const | var)
      grep -Eq "public static (final )?[A-Za-z.]+ $name[ ;=]" "$pkg_java" || missing "$kind $name" Java
      grep -Eq "Idemretry$name\b" "$objc_h" || missing "$kind $name" Objective-C ;;
    func)
      grep -Eq " $(lower "$name")\(" "$pkg_java" || missing "func $name" Java
      grep -Eq "Idemretry$name\(" "$objc_h" || missing "func $name" Objective-C ;;
    type)
      [ -f "$java_dir/$name.java" ] || missing "type $name" Java
      grep -Eq "^@(interface|protocol) Idemretry$name\b" "$objc_h" || missing "type $name" Objective-C ;;
    method)
      typ=${name%%.*} m=${name#*.}
      grep -Eq " $(lower "$m")\(" "$java_dir/$typ.java" 2>/dev/null || missing "method $name" Java
      grep -Eq "\)$(lower "$m")[:;]" "$objc_h" || missing "method $name" Objective-C ;;
    *) echo "FAIL: cannot read go doc line: $kind $name"; exit 1 ;;
  esac
  checked=$((checked + 1))
done <<<"$idents"

if [ "$checked" -lt 10 ]; then
  echo "FAIL: found only $checked exported identifiers in go doc: the check is broken"; exit 1
fi
if [ "$fail" -ne 0 ]; then
  exit 1
fi
echo "gobind: all $checked exported identifiers of $pkg bound for Java and Objective-C, none skipped"
