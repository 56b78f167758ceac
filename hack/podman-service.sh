#!/usr/bin/env bash
# Starts or stops the Podman API service on /run/podman/podman.sock, for REST
# clients and the REST tests. There is no systemd on these machines, so the
# service runs as a plain background process whose PID is kept in
# /run/podman/tclone-service.pid.
#
#   hack/podman-service.sh start|stop|status
set -euo pipefail
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
sock=/run/podman/podman.sock
pidfile=/run/podman/tclone-service.pid

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "${1:-}" in
start)
	if running; then exit 0; fi
	# A fresh machine has no /run/podman; the service then fails with
	# "bind: no such file or directory".
	mkdir -p /run/podman
	rm -f "$sock"
	# The service outlives this script: it must not keep the caller's open
	# files (a lock the caller holds, a pipe it waits on), so every
	# descriptor above stderr is closed for it.
	(
		for fd in /proc/self/fd/*; do
			fd=${fd##*/}
			if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
		done
		exec setsid /usr/bin/podman system service --time=0 "unix://$sock" </dev/null >/run/podman/service.log 2>&1
	) &
	echo $! >"$pidfile"
	for _ in $(seq 100); do
		[ -S "$sock" ] && curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1 && exit 0
		sleep 0.1
	done
	echo "podman-service: the service did not answer on $sock; see /run/podman/service.log" >&2
	exit 1
	;;
stop)
	if running; then
		kill "$(cat "$pidfile")"
		for _ in $(seq 50); do running || break; sleep 0.1; done
	fi
	rm -f "$pidfile"
	;;
status)
	if running; then echo "running (pid $(cat "$pidfile"))"; else echo stopped; exit 1; fi
	;;
*)
	echo "usage: $0 start|stop|status" >&2
	exit 2
	;;
esac
