// SPDX-License-Identifier: Apache-2.0
/*
 * Write tracking for incremental branches (docs/design.md, "Incremental
 * branches"), measured on its own: an asynchronous write-protect
 * userfaultfd (UFFD_FEATURE_WP_ASYNC, Linux 6.7+) kept registered on a
 * process's memory, read and re-armed with PAGEMAP_SCAN on
 * /proc/PID/pagemap. It answers what a branch's pause would hold, what the
 * tracking costs the process's writes, and which changes of memory it
 * reports. Not part of tclone.
 *
 *   gcc -O2 -o /tmp/uffd-wp-async hack/prototypes/uffd-wp-async.c && /tmp/uffd-wp-async 1024 20
 *
 * For MIB MiB of touched private memory, DIRTY MiB of it rewritten:
 *   arm          userfaultfd (user-mode only) + WP_ASYNC + register +
 *                protect every present page (PAGEMAP_SCAN, WP_MATCHING)
 *   scan/0       read and re-arm with nothing written
 *   scan/DIRTY   the same after DIRTY MiB were rewritten: pages reported
 *   fork         fork() of the process (what a twin costs in the pause)
 *   writes       one word per page of all of it: untracked and writable,
 *                tracked, after a fork() whose child lives, and both
 *   cases        which writes and discards the scan reports
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL

/* Linux 6.7 uapi, missing from older headers. */
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#define PAGE_IS_WPALLOWED (1 << 0)
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)

struct page_region {
	uint64_t start, end, categories;
};

struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};

#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct page_region vec[1 << 16];

/*
 * scan reports the pages of [start, end) written since they were last
 * protected, and protects them again when rearm is set. It returns the
 * number of written pages, or -errno.
 */
static long scan(int pagemap, char *start, char *end, int rearm)
{
	long pages = 0;
	uint64_t at = (uint64_t)start;

	while (at < (uint64_t)end) {
		struct pm_scan_arg a = {
			.size = sizeof(a),
			.flags = PM_SCAN_CHECK_WPASYNC | (rearm ? PM_SCAN_WP_MATCHING : 0),
			.start = at,
			.end = (uint64_t)end,
			.vec = (uint64_t)vec,
			.vec_len = sizeof(vec) / sizeof(vec[0]),
			.category_mask = PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_WRITTEN | PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
		};
		long n = ioctl(pagemap, PAGEMAP_SCAN, &a);

		if (n < 0)
			return -errno;
		for (long i = 0; i < n; i++)
			pages += (vec[i].end - vec[i].start) / PAGE;
		at = a.walk_end;
	}
	return pages;
}

/* arm makes a write-protect-async userfaultfd for this process's memory
 * [mem, mem+len), registers it and protects every present page. */
static int arm(char *mem, size_t len, int pagemap)
{
	int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_WP_ASYNC };
	struct uffdio_register reg = {
		.range = { .start = (uint64_t)mem, .len = len },
		.mode = UFFDIO_REGISTER_MODE_WP,
	};

	if (uffd < 0)
		die("userfaultfd");
	if (ioctl(uffd, UFFDIO_API, &api))
		die("UFFDIO_API (UFFD_FEATURE_WP_ASYNC needs Linux 6.7)");
	if (ioctl(uffd, UFFDIO_REGISTER, &reg))
		die("UFFDIO_REGISTER");
	if (scan(pagemap, mem, mem + len, 1) < 0)
		die("PAGEMAP_SCAN");
	return uffd;
}

static double touch(char *mem, size_t len, char v)
{
	double t = now_ms();

	for (size_t off = 0; off < len; off += PAGE)
		mem[off] = v;
	return now_ms() - t;
}

/* forked keeps a child that shares mem copy-on-write until released. */
static pid_t forked(double *ms)
{
	double t = now_ms();
	pid_t pid = fork();

	if (pid < 0)
		die("fork");
	if (pid == 0) {
		pause();
		_exit(0);
	}
	*ms = now_ms() - t;
	return pid;
}

static void release(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

static char *region(size_t len)
{
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED)
		die("mmap");
	madvise(m, len, MADV_NOHUGEPAGE);
	touch(m, len, 1);
	return m;
}

/* The cases: what the scan says after each kind of change. */
static void cases(int pagemap)
{
	size_t len = 64 * PAGE;
	char *m = region(len);
	int uffd = arm(m, len, pagemap);
	int p[2];
	struct iovec local, remote;
	char b = 7;
	long n;
	pid_t child;

	/* A page written by the kernel for the process (a read()). */
	if (pipe(p))
		die("pipe");
	if (write(p[1], "x", 1) != 1 || read(p[0], m + 1 * PAGE, 1) != 1)
		die("pipe read");
	n = scan(pagemap, m + 1 * PAGE, m + 2 * PAGE, 0);
	printf("case read() into a page: %ld of 1 written\n", n);

	/* A page written by another process (process_vm_writev, as a debugger). */
	child = fork();
	if (child == 0) {
		local = (struct iovec){ &b, 1 };
		remote = (struct iovec){ m + 2 * PAGE, 1 };
		_exit(process_vm_writev(getppid(), &local, 1, &remote, 1, 0) == 1 ? 0 : 1);
	}
	waitpid(child, NULL, 0);
	n = scan(pagemap, m + 2 * PAGE, m + 3 * PAGE, 0);
	printf("case process_vm_writev into a page: %ld of 1 written\n", n);

	/* Pages written by a child after fork(): not the parent's. */
	child = fork();
	if (child == 0) {
		m[3 * PAGE] = 9;
		_exit(0);
	}
	waitpid(child, NULL, 0);
	n = scan(pagemap, m + 3 * PAGE, m + 4 * PAGE, 0);
	printf("case a child's write after fork(): %ld of 1 written in the parent\n", n);
	m[4 * PAGE] = 9;
	n = scan(pagemap, m + 4 * PAGE, m + 5 * PAGE, 0);
	printf("case the parent's write after fork(): %ld of 1 written\n", n);

	/* Discarded pages: not written, and not present either, so a
	 * reader must take a page that is neither as a hole, never as the
	 * last branch's page. */
	madvise(m + 8 * PAGE, 16 * PAGE, MADV_DONTNEED);
	{
		struct pm_scan_arg a = {
			.size = sizeof(a), .start = (uint64_t)(m + 8 * PAGE), .end = (uint64_t)(m + 24 * PAGE),
			.vec = (uint64_t)vec, .vec_len = 16,
			.category_anyof_mask = PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_PRESENT | PAGE_IS_WRITTEN,
		};

		n = ioctl(pagemap, PAGEMAP_SCAN, &a);
		printf("case MADV_DONTNEED of 16 pages: %ld regions present or written (0: holes)\n", n);
		for (long i = 0; i < n; i++)
			printf("  region +%lu..+%lu categories %#lx\n", (unsigned long)((vec[i].start - (uint64_t)m) / PAGE),
			       (unsigned long)((vec[i].end - (uint64_t)m) / PAGE), (unsigned long)vec[i].categories);
	}
	/* A discarded page read again maps the zero page: reported? */
	b = m[8 * PAGE];
	n = scan(pagemap, m + 8 * PAGE, m + 9 * PAGE, 0);
	printf("case a discarded page read again: %ld of 1 written\n", n);
	m[9 * PAGE] = 5;
	n = scan(pagemap, m + 9 * PAGE, m + 10 * PAGE, 0);
	printf("case a discarded page written again: %ld of 1 written\n", n);

	/* Memory mapped after the arming is not tracked: the scan refuses it
	 * rather than calling it unwritten. */
	{
		char *fresh = region(4 * PAGE);

		n = scan(pagemap, fresh, fresh + 4 * PAGE, 0);
		printf("case memory mapped after arming: %s\n", n == -EPERM ? "refused (EPERM)" : "NOT refused");
		munmap(fresh, 4 * PAGE);
	}
	/* A registered area moved by mremap loses its registration. */
	{
		char *moved = mmap(NULL, 8 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		moved = mremap(m + 32 * PAGE, 8 * PAGE, 8 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, moved);
		if (moved == MAP_FAILED)
			die("mremap");
		n = scan(pagemap, moved, moved + 8 * PAGE, 0);
		printf("case an area moved by mremap: %s\n", n == -EPERM ? "refused (EPERM)" : "NOT refused");
	}
	/* Our registration makes the process's own fail. */
	{
		int own = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
		struct uffdio_api api = { .api = UFFD_API };
		struct uffdio_register reg = { .range = { (uint64_t)m, PAGE }, .mode = UFFDIO_REGISTER_MODE_MISSING };

		if (own < 0 || ioctl(own, UFFDIO_API, &api))
			die("a second userfaultfd");
		printf("case the process registering the area itself: %s\n",
		       ioctl(own, UFFDIO_REGISTER, &reg) ? strerror(errno) : "allowed");
		close(own);
	}
	/* A huge page: one byte written reports the whole of it. */
	{
		size_t hl = 4UL << 20;
		char *raw = mmap(NULL, 2 * hl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		char *h = (char *)(((uintptr_t)raw + hl - 1) & ~(hl - 1));
		int hu;

		madvise(h, hl, MADV_HUGEPAGE);
		memset(h, 1, hl);
		hu = arm(h, hl, pagemap);
		h[5 * PAGE] = 2;
		n = scan(pagemap, h, h + hl, 0);
		printf("case one byte written in transparent huge pages: %ld pages written\n", n);
		close(hu);
		munmap(raw, 2 * hl);
	}
	close(uffd);
	n = scan(pagemap, m, m + 8 * PAGE, 0);
	printf("case the userfaultfd closed: %s\n", n == -EPERM ? "refused (EPERM)" : "NOT refused");
	munmap(m, len);
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
	size_t dirty = argc > 2 ? strtoul(argv[2], NULL, 10) : 20;
	size_t len = mib << 20, dlen = dirty << 20;
	int pagemap = open("/proc/self/pagemap", O_RDONLY);
	double t, forkms, plain, wp, forkw, both;
	char *mem;
	int uffd;
	long n;
	pid_t child;

	if (pagemap < 0)
		die("/proc/self/pagemap");
	mem = region(len);
	plain = touch(mem, len, 2);

	child = forked(&forkms);
	forkw = touch(mem, len, 3);
	release(child);

	t = now_ms();
	uffd = arm(mem, len, pagemap);
	printf("arm %zu MiB: %.1f ms\n", mib, now_ms() - t);
	printf("fork %zu MiB: %.1f ms\n", mib, forkms);

	t = now_ms();
	n = scan(pagemap, mem, mem + len, 1);
	printf("scan/0: %.1f ms, %ld pages written\n", now_ms() - t, n);

	touch(mem, dlen, 4);
	t = now_ms();
	n = scan(pagemap, mem, mem + len, 1);
	printf("scan/%zu MiB: %.1f ms, %ld pages written (%zu rewritten)\n", dirty, now_ms() - t, n, dlen / PAGE);

	wp = touch(mem, len, 5);
	n = scan(pagemap, mem, mem + len, 1);
	child = forked(&t);
	both = touch(mem, len, 6);
	release(child);
	n = scan(pagemap, mem, mem + len, 1);
	printf("writes/plain %.1f ms, writes/tracked %.1f ms, writes/fork %.1f ms, writes/fork+tracked %.1f ms (%ld written)\n",
	       plain, wp, forkw, both, n);
	close(uffd);
	munmap(mem, len);
	cases(pagemap);
	return 0;
}
