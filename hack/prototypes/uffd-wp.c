// SPDX-License-Identifier: Apache-2.0
/*
 * The userfaultfd write-protect snapshot that docs/design.md weighs against
 * twins, measured on its own: what it would add to a source's pause, what
 * it costs the source's writes afterwards, and what it loses when the
 * source discards memory before it was copied. Not part of tclone.
 *
 *   gcc -O2 -pthread -o /tmp/uffd-wp hack/prototypes/uffd-wp.c && /tmp/uffd-wp 1024
 *
 * It prints, for MIB MiB of touched private memory:
 *   fork         fork() of the process (page tables: a twin's cost)
 *   wp           registering the memory for write-protection and
 *                protecting it (what the pause would hold instead)
 *   writes/plain writing one word per page, nothing tracking
 *   writes/fork  the same right after a fork() whose child lives (COW)
 *   writes/wp    the same with a handler copying each page out first
 *   dontneed     how many of 16 discarded pages the handler got in time
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

struct handler {
	int uffd;
	char *base, *copy;
	size_t len;
	volatile int stop;
	unsigned long faults, removes, lost;
};

/* serve copies a faulting page out before it is written, and unprotects it. */
static void *serve(void *arg)
{
	struct handler *h = arg;
	struct uffd_msg msg;

	while (!h->stop) {
		struct pollfd p = { .fd = h->uffd, .events = POLLIN };

		if (poll(&p, 1, 100) <= 0)
			continue;
		if (read(h->uffd, &msg, sizeof(msg)) != sizeof(msg))
			continue;
		if (msg.event == UFFD_EVENT_REMOVE) {
			/* The madvise goes on as soon as this is read: a
			 * handler that copies the range now races it. Here it
			 * takes a millisecond, as copying a large range does. */
			usleep(1000);
			for (uint64_t a = msg.arg.remove.start; a < msg.arg.remove.end; a += PAGE)
				if (((char *)a)[0] == 0)
					h->lost++;
			h->removes++;
			continue;
		}
		if (msg.event != UFFD_EVENT_PAGEFAULT)
			continue;
		uint64_t a = msg.arg.pagefault.address & ~(PAGE - 1);
		memcpy(h->copy + (a - (uint64_t)h->base), (void *)a, PAGE);
		struct uffdio_writeprotect wp = { .range = { a, PAGE }, .mode = 0 };
		if (ioctl(h->uffd, UFFDIO_WRITEPROTECT, &wp))
			die("unprotect");
		h->faults++;
	}
	return NULL;
}

static double write_pages(char *p, size_t len, char v)
{
	double t0 = now_ms();

	for (size_t i = 0; i < len; i += PAGE)
		p[i] = v;
	return now_ms() - t0;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? atol(argv[1]) : 1024, len = mib << 20;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap");
	memset(p, 1, len);
	printf("%zu MiB\n", mib);

	double t0 = now_ms();
	pid_t child = fork();
	if (child == 0) {
		pause();
		_exit(0);
	}
	printf("fork         %8.1f ms\n", now_ms() - t0);
	printf("writes/fork  %8.1f ms\n", write_pages(p, len, 2));
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	printf("writes/plain %8.1f ms\n", write_pages(p, len, 3));

	struct handler h = { .base = p, .len = len };
	h.copy = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	h.uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (h.uffd < 0)
		die("userfaultfd");
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_EVENT_REMOVE };
	if (ioctl(h.uffd, UFFDIO_API, &api))
		die("UFFDIO_API");
	t0 = now_ms();
	struct uffdio_register reg = { .range = { (uint64_t)p, len }, .mode = UFFDIO_REGISTER_MODE_WP };
	if (ioctl(h.uffd, UFFDIO_REGISTER, &reg))
		die("UFFDIO_REGISTER");
	struct uffdio_writeprotect wp = { .range = { (uint64_t)p, len }, .mode = UFFDIO_WRITEPROTECT_MODE_WP };
	if (ioctl(h.uffd, UFFDIO_WRITEPROTECT, &wp))
		die("UFFDIO_WRITEPROTECT");
	printf("wp           %8.1f ms\n", now_ms() - t0);

	pthread_t th;
	pthread_create(&th, NULL, serve, &h);
	double took = write_pages(p, len, 4);
	printf("writes/wp    %8.1f ms (%lu faults copied out)\n", took, h.faults);

	/* Protect 16 pages again, then discard them before anyone copied them. */
	wp.range.len = 16 * PAGE;
	if (ioctl(h.uffd, UFFDIO_WRITEPROTECT, &wp))
		die("UFFDIO_WRITEPROTECT");
	if (madvise(p, 16 * PAGE, MADV_DONTNEED))
		die("madvise");
	usleep(100000);
	h.stop = 1;
	pthread_join(th, NULL);
	printf("dontneed     %lu of 16 pages were gone when the handler heard of them (%lu events)\n", h.lost, h.removes);
	return 0;
}
