// Package fork is tclone's engine: it captures a running container into a
// fork plan (Phase A) and materialises siblings from a plan (Phase B), and it
// recovers from operations that a crash left half done. Its files, by phase:
//
// Every phase: engine.go (the Engine, on a host's layout and crun), log.go
// (each operation's phases in the debug log), crash.go (the crash points
// the fault tests kill a fork at).
//
// Capture (Phase A): checkpoint.go (a checkpoint Podman asked for, which
// a fork intent makes a capture), fork.go (`tclone fork`: a capture and
// its sibling), source.go (the source as crun and /proc show it),
// credentials.go (a tree CRIU can dump), capture.go (the operation:
// journal, CRIU's dump, the root filesystem snapshot, plan.json),
// criuopts.go (CRIU's dump options), volumes.go (volumes copied in the
// frozen window), tcp.go (connections, network namespaces), inotify.go
// (watched inodes CRIU must find), cow.go and twin.go (copy-on-write
// memory with and without the module), held.go (the snapshots a plan's
// daemon holds).
//
// Materialise (Phase B): materialize.go (the operation: the sibling's
// images and root, crun's restore with CRIU's configuration), identity.go
// (a sibling's own hostname and machine-id), filling.go (waiting until a
// lazy sibling has all of its memory), ksm.go (mergeable siblings),
// watch.go (the watchdog that undoes a materialisation whose tclone died).
//
// Recovery: recover.go (what dead operations left, from the journal),
// release.go (a source left held or frozen).
package fork
