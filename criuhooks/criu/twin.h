/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What tclone's twin plugin tells tclone, one SOCK_SEQPACKET message per
 * process of the dumped tree. criuhooks/twin.go reads the same layout.
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

#define TWIN_MSG_VERSION 3
#define TWIN_WHY_LEN 240
/* The PID namespace levels a message carries, from the host's down. */
#define TWIN_NS_MAX 8

struct twin_msg {
	uint32_t version;
	int32_t pid;  /* the process, as CRIU sees it (CRIU's PID namespace) */
	int32_t twin; /* its twin, likewise; 0 with err */
	int32_t err;  /* an errno value when no twin was made */
	int32_t clone_us; /* the clone, in the process's pause */
	int32_t park_us;  /* parking the twin, likewise: 0 when parked after it */
	char why[TWIN_WHY_LEN];
	/*
	 * With a twin: the process's pid at each level of its PID namespaces
	 * (NSpid in /proc/PID/status, read while CRIU holds it), so that
	 * tclone can find its twin by the pid CRIU's images give it.
	 */
	int32_t nslevels;
	int32_t nspid[TWIN_NS_MAX];
	/*
	 * With a twin: 1 when a userfaultfd of the process's follows its
	 * descriptors, 0 when none was asked for, an errno value (negated)
	 * when making it failed.
	 */
	int32_t track;
	/*
	 * With a twin: SCM_RIGHTS carries its pidfd, then its lifeline (the
	 * pipe's write end), then the process's userfaultfd (track 1).
	 */
};

#endif
