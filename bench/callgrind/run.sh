#!/bin/bash
# Instructions per action of the 1 KiB POST, per client, under callgrind:
# TestDrive (../drive_test.go) run with N=0 and with N actions, subtracted.
#
#   go -C bench test -c -o /tmp/drive.test .
#   OUT=/tmp/cg bench/callgrind/run.sh /tmp/drive.test base 20000 nethttp idemretry-memory retryablehttp failsafe
#   python3 bench/callgrind/diff.py /tmp/cg base nethttp base idemretry-memory 20000 self 15
#
# With CPU_LOCK set to a file, each run holds it (flock), so that runs
# sharing a machine take turns.
set -u
bin=$1 tag=$2 n=$3
shift 3
out=${OUT:-.}
mkdir -p "$out"
for c in "$@"; do
	for nn in 0 "$n"; do
		f=$out/$tag.$c.$nn.out
		lock=()
		if [ -n "${CPU_LOCK:-}" ]; then lock=(flock "$CPU_LOCK"); fi
		BENCH_DRIVE=$c BENCH_DRIVE_N=$nn GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 \
			"${lock[@]}" valgrind --tool=callgrind --callgrind-out-file="$f" "$bin" -test.run '^TestDrive$' >"$f.log" 2>&1
		if grep -q Assertion "$f.log"; then
			echo "$tag $c N=$nn: callgrind aborted, see $f.log" >&2
			exit 1
		fi
	done
	i0=$(grep -m1 '^summary:\|^totals:' "$out/$tag.$c.0.out" | awk '{print $2}')
	iN=$(grep -m1 '^summary:\|^totals:' "$out/$tag.$c.$n.out" | awk '{print $2}')
	echo "$tag $c instructions/action: $(((iN - i0) / n))"
done
