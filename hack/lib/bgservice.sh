# Used by hack/podman-service.sh and hack/tclone-service.sh (sourced, not
# run): an API service run as a plain background process, for machines
# without systemd. Its PID is kept in a file beside its socket.

# bg_service start|stop|status SOCKET PIDFILE LOGFILE COMMAND...
# It is up once SOCKET answers HTTP's /_ping, or, with BG_READY set, once
# that command succeeds (a gRPC service, or one on TCP: SOCKET is then only
# removed before the start, and may name no socket at all).
bg_service() {
	local verb=$1 sock=$2 pidfile=$3 logfile=$4
	shift 4
	case "$verb" in
	start)
		if bg_running "$pidfile"; then return 0; fi
		mkdir -p "$(dirname "$sock")"
		rm -f "$sock"
		# The service outlives the caller: it must not keep the caller's
		# open files (a lock the caller holds, a pipe it waits on), so
		# every descriptor above stderr is closed for it; nor its working
		# directory, which may be removed (a checkout in /tmp) while the
		# service runs on: conmon, which inherits it, then fails every
		# container ("Failed to get working directory").
		(
			for fd in /proc/self/fd/*; do
				fd=${fd##*/}
				if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
			done
			cd /
			exec setsid "$@" </dev/null >"$logfile" 2>&1
		) &
		echo $! >"$pidfile"
		for _ in $(seq 150); do
			if [ -n "${BG_READY:-}" ]; then
				$BG_READY >/dev/null 2>&1 && return 0
			else
				[ -S "$sock" ] && curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1 && return 0
			fi
			bg_running "$pidfile" || break
			sleep 0.1
		done
		echo "$(basename "$0"): the service did not answer on $sock; see $logfile:" >&2
		tail -5 "$logfile" >&2 || true
		return 1
		;;
	stop)
		if bg_running "$pidfile"; then
			kill "$(cat "$pidfile")"
			# A service finishes the requests under way before it exits.
			for _ in $(seq "${BG_STOP_WAIT:-50}"); do bg_running "$pidfile" || break; sleep 0.1; done
		fi
		rm -f "$pidfile"
		;;
	status)
		if bg_running "$pidfile"; then echo "running (pid $(cat "$pidfile"))"; else echo stopped; return 1; fi
		;;
	*)
		echo "usage: $0 start|stop|status" >&2
		return 2
		;;
	esac
}

bg_running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
