#!/usr/bin/env bash
# A CI pipeline that branches a test database instead of loading it again:
# one container starts PostgreSQL and loads a fixture once; the pipeline
# forks it into SHARDS siblings over tclone's REST endpoint (curl, the way
# any CI runner could), runs one test shard in each at once, checks that
# every shard wrote to its own copy only, and reports the time saved against
# loading the fixture once per shard.
#
#   hack/ci-example.sh            (make ci-example; as root, after the set-up)
#
# Environment: SCALE (pgbench scale of the fixture's bulk data, default 20:
# 2 million accounts), SEED_ROWS (rows of its seed, one transaction each,
# default 20000), SHARDS (default 4), TEST_SECONDS (each shard's pgbench run,
# default 10), TCLONE_SOCKET (default /run/tclone/tclone.sock; started with
# hack/tclone-service.sh when nothing answers there, and stopped after, with
# Podman's service when that was started for it too).
set -euo pipefail
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
here=$(cd "$(dirname "$0")" && pwd)
scale=${SCALE:-20}
seed=${SEED_ROWS:-20000}
shards=${SHARDS:-4}
seconds=${TEST_SECONDS:-10}
sock=${TCLONE_SOCKET:-/run/tclone/tclone.sock}
image=localhost/tclone-postgres:latest
db=ci-db-$$
api=http://d/v5.4.2/libpod

log() { printf 'ci-example: %s\n' "$*"; }
die() { printf 'ci-example: error: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" = 0 ] || die "run as root, after the set-up (make ci-example does both)"
podman image exists "$image" || die "$image is missing: hack/build-images.sh builds it"
case "$scale$seed$shards$seconds" in *[!0-9]*) die "SCALE, SEED_ROWS, SHARDS and TEST_SECONDS must be whole numbers" ;; esac
[ "$shards" -ge 1 ] && [ "$shards" -le 32 ] || die "SHARDS=$shards: give 1 to 32"

work=$(mktemp -d /tmp/tclone-ci-example.XXXXXX)
started_service=0
podman_was_running=1
cleanup() {
	# Every step runs, whatever failed before it.
	set +e
	local id
	id=$(podman inspect --format '{{.Id}}' "$db" 2>/dev/null || true)
	if [ -n "$id" ]; then
		podman ps -aq --filter "label=io.tclone.forked-from=$id" | xargs -r podman rm -f -t 0 >/dev/null
		podman rm -f -t 0 "$db" >/dev/null
	fi
	if [ "$started_service" = 1 ]; then
		"$here/tclone-service.sh" stop
		# and Podman's, when it was started for this run too.
		if [ "$podman_was_running" = 0 ]; then "$here/podman-service.sh" stop; fi
	fi
	rm -rf "$work"
}
trap cleanup EXIT

if ! curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; then
	[ "$sock" = /run/tclone/tclone.sock ] || die "nothing answers at TCLONE_SOCKET=$sock"
	podman_was_running=0
	if "$here/podman-service.sh" status >/dev/null 2>&1; then podman_was_running=1; fi
	log "starting tclone's API service (hack/tclone-service.sh)"
	"$here/tclone-service.sh" start
	started_service=1
fi

# CRIU reads each process's resource limits, which needs CAP_SYS_RESOURCE
# for another user's process; where root lacks it, PostgreSQL runs as root
# with a one-function preload (see ci-example/pg-as-root.c).
run_as=()
cap_eff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
if (((16#$cap_eff >> 24 & 1) == 0)); then
	log "this host's root lacks CAP_SYS_RESOURCE, so CRIU cannot dump another user's process: PostgreSQL runs as root here (ci-example/pg-as-root.c)"
	gcc -shared -fPIC -O2 -o "$work/pg-as-root.so" "$here/ci-example/pg-as-root.c" || die "building the preload needs gcc"
	pg_uid=$(podman run --rm --runtime crun "$image" id -u)
	run_as=(--user 0 -e LD_PRELOAD=/usr/local/lib/pg-as-root.so -e "TCLONE_PG_UID=$pg_uid" -v "$work/pg-as-root.so:/usr/local/lib/pg-as-root.so:ro")
fi

# --- the database, and its fixture, once ------------------------------------
podman run -d --name "$db" "${run_as[@]}" "$image" >/dev/null
for _ in $(seq 100); do podman exec "$db" pg_isready -q 2>/dev/null && break; sleep 0.2; done
podman exec "$db" pg_isready -q || die "PostgreSQL did not start: $(podman logs --tail 5 "$db" 2>&1)"
# The fixture as CI fixtures are made: bulk data (pgbench's tables, by
# COPY), then an application's seed, one row per transaction as an ORM
# writes it.
log "loading the fixture: pgbench scale $scale ($((scale * 100000)) accounts) by COPY, then $seed seed rows one transaction each"
t0=$(now)
podman exec "$db" pgbench -q -i -s "$scale" postgres >/dev/null 2>&1 || die "loading the fixture failed"
tb=$(now)
podman exec "$db" sh -c "psql -U postgres -q -v ON_ERROR_STOP=1 -c 'create table seed(id serial primary key, v text)' &&
	seq $seed | sed 's/.*/insert into seed(v) values (\$\$row &\$\$);/' | psql -U postgres -q -v ON_ERROR_STOP=1" ||
	die "seeding the fixture failed"
t1=$(now)
load=$(secs "$t0" "$t1")
log "fixture loaded in ${load} s ($(secs "$t0" "$tb") s bulk, $(secs "$tb" "$t1") s seed)"
accounts=$(podman exec "$db" psql -U postgres -Atc 'select count(*) from pgbench_accounts')

# --- the fork, over REST -----------------------------------------------------
log "forking $db into $shards shards through $sock"
t0=$(now)
code=$(curl -sS --unix-socket "$sock" -X POST -o "$work/fork.json" -w '%{http_code}' \
	"$api/containers/$db/fork?count=$shards&name=$db-shard&label=ci-example=$db&ready=exec&readyTimeout=2m")
t1=$(now)
[ "$code" = 200 ] || die "the fork answered $code: $(jq -r .message "$work/fork.json" 2>/dev/null || cat "$work/fork.json")"
fork=$(secs "$t0" "$t1")
mapfile -t names < <(jq -r '.siblings[].name' "$work/fork.json")
log "forked in ${fork} s: ${names[*]}"
log "$(jq -r '"  the database was paused \(.source_pause_ms | round) ms, of which \(.capture.timings.fs_snapshot_ms | round) ms copying \(.capture.rootfs.stats.bytes / 1048576 | round) MiB of its files (\(.capture.rootfs.stats.reflinked_bytes / 1048576 | round) MiB by reflink); restores took \([.siblings[].restore_ms] | add / length | round) ms each"' "$work/fork.json")"

# --- one test shard in each, at once ------------------------------------------
log "running the $shards test shards at once (pgbench, ${seconds} s each)"
t0=$(now)
pids=()
for i in "${!names[@]}"; do
	n=${names[$i]}
	(
		podman exec "$n" pg_isready -q -t 30 &&
			podman exec "$n" psql -U postgres -q -v ON_ERROR_STOP=1 \
				-c "create table shard_marker(shard int); insert into shard_marker values ($((i + 1)))" &&
			podman exec "$n" pgbench -n -T "$seconds" -c 2 -j 2 postgres >"$work/shard-$i.out" 2>&1 &&
			podman exec "$n" psql -U postgres -q -v ON_ERROR_STOP=1 -c checkpoint
	) &
	pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
	wait "${pids[$i]}" || { log "shard $((i + 1)) (${names[$i]}) failed: $(tail -3 "$work/shard-$i.out" 2>/dev/null)"; failed=1; }
done
t1=$(now)
[ "$failed" = 0 ] || die "a test shard failed"
tests=$(secs "$t0" "$t1")

# --- isolation and survival checks -------------------------------------------
q() { podman exec "$1" psql -U postgres -Atc "$2"; }
for i in "${!names[@]}"; do
	n=${names[$i]}
	got=$(q "$n" 'select string_agg(shard::text, $$,$$) from shard_marker')
	[ "$got" = $((i + 1)) ] || die "$n sees shard markers '$got', want only its own ($((i + 1)))"
	[ "$(q "$n" 'select count(*) from pgbench_accounts')" = "$accounts" ] || die "$n lost fixture rows"
	[ "$(q "$n" 'select count(*) from seed')" = "$seed" ] || die "$n lost seed rows"
	# The postmaster's children came through the fork.
	kids=$(q "$n" "select count(*) from pg_stat_activity where backend_type in ('checkpointer','background writer','walwriter','autovacuum launcher')")
	[ "$kids" = 4 ] || die "$n has $kids of the postmaster's 4 background processes"
	# Its System V shared memory segment (the postmaster's interlock).
	podman exec "$n" sh -c 'test "$(wc -l </proc/sysvipc/shm)" -ge 2' || die "$n has no System V shared memory segment"
	tps=$(awk '/^tps/ { printf "%.0f", $3; exit }' "$work/shard-$i.out")
	log "shard $((i + 1)) ($n): $tps transactions/s, sees only its own writes"
done
[ "$(q "$db" "select count(*) from pg_tables where tablename = 'shard_marker'")" = 0 ] || die "a shard's table reached the source"
[ "$(q "$db" 'select sum(abalance) from pgbench_accounts')" = 0 ] || die "a shard's updates reached the source"
log "the source database is untouched by the shards and still serves"

# --- the time saved ------------------------------------------------------------
awk -v l="$load" -v f="$fork" -v n="$shards" -v t="$tests" 'BEGIN {
	without = n * l; with = l + f
	printf "ci-example: setting up %d shards: loading the fixture %d times would take %.1f s (%.1f s each);\n", n, n, without, l
	printf "ci-example: loading it once and forking took %.1f s (%.1f + %.1f): %.1f s saved (%.1fx faster); the shards then ran at once in %.1f s\n", with, l, f, without - with, without / with, t
}'
