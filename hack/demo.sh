#!/usr/bin/env bash
# make demo: fork a live workspace twice and show all three copies running
# on their own. Needs the host set up (make demo runs hack/setup-host.sh).
set -euo pipefail
export PODMAN_IGNORE_CGROUPSV1_WARNING=1
PODMAN=/usr/bin/podman
src=tclone-demo
bold() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

cleanup() {
	for c in "$src" "$src-fork-1" "$src-fork-2"; do
		$PODMAN rm -f -t 0 "$c" >/dev/null 2>&1 || true
	done
}
trap cleanup EXIT
cleanup

bold "Starting a workspace: a tmux session running a shell, a python http server, a counter job"
$PODMAN run -d --name "$src" localhost/tclone-workspace:latest bash -c '
	mkdir -p /srv && cd /srv && echo "served by $(hostname)" > index.html
	python3 -m http.server 8080 >/dev/null 2>&1 &
	tmux new-session -d -s work -x 100 -y 30 bash
	tmux send-keys -t work "cd /tmp && echo workspace shell ready" Enter
	i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done' >/dev/null
for _ in $(seq 50); do
	$PODMAN exec "$src" curl -sf http://127.0.0.1:8080/ >/dev/null 2>&1 && break
	sleep 0.2
done
sleep 1
echo "counter in $src: $($PODMAN exec "$src" cat /tmp/counter)"

bold "podman container fork --count 2 $src"
stats=$(mktemp)
podman container fork --count 2 --ready http:8080/ --print-stats "$src" >"$stats"

bold "podman ps"
$PODMAN ps --format 'table {{.Names}}\t{{.Status}}\t{{.Labels}}' | sed 's/map\[io.tclone.forked-from:\([0-9a-f]\{12\}\)[0-9a-f]*\]/forked from \1/; s/map\[\]//'

bold "Each copy now goes its own way"
for c in "$src" "$src-fork-1" "$src-fork-2"; do
	# Each writes its own page and types into its own tmux pane.
	$PODMAN exec "$c" sh -c 'echo "served by $(hostname), after the fork" > /srv/index.html'
	$PODMAN exec "$c" tmux send-keys -t work "echo typed in $c" Enter
done
sleep 1
for c in "$src" "$src-fork-1" "$src-fork-2"; do
	ip=$($PODMAN inspect --format '{{.NetworkSettings.IPAddress}}' "$c")
	a=$($PODMAN exec "$c" cat /tmp/counter); sleep 0.5; b=$($PODMAN exec "$c" cat /tmp/counter)
	page=$(curl -s "http://$ip:8080/")
	pane=$($PODMAN exec "$c" tmux capture-pane -p -t work | grep 'typed in' | tail -1)
	printf '%-16s ip %-11s counter %5s -> %-5s  http: %-45s tmux: %s\n' "$c" "$ip" "$a" "$b" "$page" "$pane"
done

bold "Timings (ms)"
python3 - "$stats" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
t = s["capture"]["timings"]
print(f"source paused          {s['source_pause_ms']:8.1f}   (freeze {t['freeze_ms']:.1f}, dump {t['dump_ms']:.1f}, fs snapshot {t['fs_snapshot_ms']:.1f}, thaw {t['thaw_ms']:.1f})")
print(f"capture (checkpoint)   {s['checkpoint_ms']:8.1f}   ({s['capture']['pages']['bytes_written']/2**20:.1f} MiB of pages to tmpfs, {s['capture']['rootfs']['stats']['bytes']/1024:.1f} KiB of files snapshotted)")
for c in s["siblings"]:
    print(f"{c['name']:<22} restore {c['restore_ms']:7.1f}, ready {c['ready_ms']:7.1f}, running {c['running_ms']:7.1f} after the request")
print(f"total                  {s['total_ms']:8.1f}")
PY
rm -f "$stats"
bold "Cleaning up"
