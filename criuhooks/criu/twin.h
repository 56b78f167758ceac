/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What tclone's twin plugin tells tclone, SOCK_SEQPACKET messages: for each
 * process of the dumped tree, its twin (or why there is none), once the
 * tree runs again, and before that, while CRIU holds the tree, the
 * process's userfaultfd where write tracking is asked for.
 * criuhooks/twin.go reads the same layout.
 */
#ifndef TCLONE_TWIN_H
#define TCLONE_TWIN_H

#include <stdint.h>

/* The environment variable naming the socket's descriptor in CRIU. */
#define TWIN_FD_ENV "TCLONE_TWIN_FD"
/*
 * Set, the plugin also makes a userfaultfd in each process (for tclone's
 * write tracking, runtime/wptrack), but for the processes whose pids (as
 * CRIU sees them) the file it names lists, one per line; empty, in all.
 */
#define TWIN_TRACK_ENV "TCLONE_TWIN_TRACK"
/*
 * Set, the plugin appends to the file it names, before each clone, a line
 * "PID TID TICKS CHILD...": the process (as CRIU sees it), its thread that
 * makes the clone, the time in clock ticks since boot (as the start times
 * of /proc/PID/stat count) and that thread's children then. A twin killed
 * before it names itself is a zombie of the process's that nothing else
 * tells from a child of its own; if its capture dies before it reaps it,
 * tclone's recovery finds it from here (runtime/lazy.ReapUnnamedTwins).
 */
#define TWIN_BIRTHS_ENV "TCLONE_TWIN_BIRTHS"

#define TWIN_MSG_VERSION 4
#define TWIN_WHY_LEN 240
/* The PID namespace levels a message carries, from the host's down. */
#define TWIN_NS_MAX 8

struct twin_msg {
	uint32_t version;
	int32_t pid;  /* the process, as CRIU sees it (CRIU's PID namespace) */
	/*
	 * Its twin, likewise. With err: the twin the plugin made and killed,
	 * whose zombie tclone reaps (its process's name, no exit signal), or 0.
	 */
	int32_t twin;
	int32_t err;  /* an errno value when no twin was made */
	int32_t clone_us; /* the clone, in the process's pause (parking comes after it) */
	char why[TWIN_WHY_LEN];
	/*
	 * With a twin: the process's pid at each level of its PID namespaces
	 * (NSpid in /proc/PID/status, read while CRIU holds it), so that
	 * tclone can find its twin by the pid CRIU's images give it.
	 */
	int32_t nslevels;
	int32_t nspid[TWIN_NS_MAX];
	/*
	 * TWIN_KIND_TRACK: 1 when the process's userfaultfd comes with the
	 * message, an errno value (negated) when making it failed. 0 in a
	 * TWIN_KIND_TWIN message.
	 */
	int32_t track;
	/*
	 * TWIN_KIND_TWIN: the twin, or err; SCM_RIGHTS carries its pidfd,
	 * then its lifeline (the pipe's write end). TWIN_KIND_TRACK: sent
	 * while CRIU holds the tree (tclone reads and re-arms the tracking in
	 * its post-dump hook), before the twin's; SCM_RIGHTS carries the
	 * userfaultfd (track 1).
	 */
	int32_t kind;
};

#define TWIN_KIND_TWIN 0
#define TWIN_KIND_TRACK 1

#endif
