/*
 * Lets PostgreSQL run as root, for hosts whose root lacks CAP_SYS_RESOURCE:
 * there CRIU cannot read the resource limits of another user's process, so
 * a server running as postgres cannot be forked (tclone refuses it, saying
 * so). PostgreSQL refuses to start as root; preloaded, this library makes
 * it see the user given in TCLONE_PG_UID instead. Nothing else changes:
 * shared memory, semaphores and the postmaster's children are PostgreSQL's
 * own. hack/ci-example.sh uses it only on such hosts.
 */
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

static uid_t seen(void)
{
	const char *v = getenv("TCLONE_PG_UID");
	return v ? (uid_t)strtoul(v, NULL, 10) : 0;
}

uid_t getuid(void) { return seen(); }
uid_t geteuid(void) { return seen(); }
