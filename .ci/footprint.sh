#!/usr/bin/env bash
# make footprint: binary size, idle RSS of `jobq serve` on an empty store,
# time from start to /readyz 200 on an empty store and with PENDING jobs
# stored (default 1000000).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${JOBQ_BIN:-bin/jobq}
pending=${PENDING:-1000000}
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
pid=
port=$((20000 + RANDOM % 20000)); http=$((port + 1))

# start_serve starts serve in the background, sets pid, and sets ms to the
# milliseconds until /readyz answered 200.
start_serve() {
	local t0 t1
	t0=$(date +%s%N)
	"$bin" serve --store-dir "$dir/store" --listen "127.0.0.1:$port" --http "127.0.0.1:$http" --log-level warn --log-format json "$@" >>"$dir/log" 2>&1 &
	pid=$!
	until curl -fs "http://127.0.0.1:$http/readyz" >/dev/null 2>&1; do
		kill -0 "$pid" 2>/dev/null || { echo "jobq serve exited:"; cat "$dir/log"; exit 1; }
		sleep 0.005
	done
	t1=$(date +%s%N)
	ms=$(((t1 - t0) / 1000000))
}

stop_serve() { kill -TERM "$pid"; wait "$pid" || true; }

printf 'binary size:            %s MB (%s)\n' "$(awk '{printf "%.1f", $1/1048576}' <<<"$(stat -c %s "$bin")")" "$bin"
start_serve
printf 'cold start, empty:      %s ms to /readyz 200\n' "$ms"
sleep 2
printf 'idle RSS, empty store:  %s MB\n' "$(awk '/VmRSS/ {printf "%.1f", $2/1024}' /proc/$pid/status)"

# Fill the store with pending jobs (broker mode: no handlers run).
awk -v n="$pending" 'BEGIN { for (i = 0; i < n; i++) printf "{\"subject\":\"job.fill\",\"id\":\"fill-%d\",\"payload\":\"x\"}\n", i }' |
	"$bin" import - --server "nats://127.0.0.1:$port" --window 1024 >/dev/null
stop_serve
start_serve
printf 'start with %d pending: %s ms to /readyz 200\n' "$pending" "$ms"
printf 'RSS with %d pending:   %s MB\n' "$pending" "$(awk '/VmRSS/ {printf "%.1f", $2/1024}' /proc/$pid/status)"
stop_serve
