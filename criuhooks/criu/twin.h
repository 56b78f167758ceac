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

#define TWIN_MSG_VERSION 1
#define TWIN_WHY_LEN 240

struct twin_msg {
	uint32_t version;
	int32_t pid;  /* the process, as CRIU sees it (CRIU's PID namespace) */
	int32_t twin; /* its twin, likewise; 0 with err */
	int32_t err;  /* an errno value when no twin was made */
	int32_t clone_us; /* the clone, in the process's pause */
	int32_t park_us;  /* parking the twin, likewise */
	char why[TWIN_WHY_LEN];
	/* With a twin: SCM_RIGHTS carries its pidfd, then its lifeline (the pipe's write end). */
};

#endif
