// SPDX-License-Identifier: Apache-2.0
/*
 * tclone's CRIU plugin: memory twins.
 *
 * While CRIU holds a tree for a dump, this plugin gives every process of it
 * a twin: a child made by a clone() without CLONE_VM that the plugin runs in
 * one of the process's threads. The twin's memory is a copy-on-write copy
 * of the process's at the dump's instant, made as fork() makes it (page
 * tables only). tclone reads the twin's memory through /proc/PID/mem once
 * the tree runs on, while the process itself writes to its own copy.
 *
 * The twin never runs a line of the process's code:
 *  - the clone runs at a trampoline of the plugin's (tramp.S), copied
 *    into the zero padding of the process's vDSO for the call and zeroed
 *    right after it, so the twin is born at code that names it
 *    "tclone-twin" and exits;
 *  - it is born traced (CLONE_PTRACE: it stops before it reaches user
 *    space); once its parking starts CRIU's death kills it
 *    (PTRACE_O_EXITKILL), and a CRIU that dies before lets it run the
 *    trampoline's exit;
 *  - once the tree runs again (CRIU's dump-resumed hook: only the clone
 *    needs the tree held), and before CRIU lets it go, it parks itself,
 *    by its own calls at the trampoline, in pause() with every signal
 *    blocked, in a session of its own, with a root and working directory
 *    of its own, no descriptor of the process's and a single one of its
 *    own: the read end of a pipe that kills it (F_SETSIG SIGKILL) once the
 *    last copy of the write end is closed. The write end (its "lifeline")
 *    and a pidfd of the twin go to tclone, which ends the twin when it is
 *    done with it, or dies and so ends it. Until it parks, it runs nothing
 *    and every signal but SIGKILL is blocked in it (its process's thread
 *    had them blocked for the clone).
 * Its exit signal is 0: its birth and death send no SIGCHLD, and no wait()
 * of the process's own sees it (only __WALL or __WCLONE do); tclone reaps
 * it. Each birth is foretold in a file (TWIN_BIRTHS_ENV, twin.h), so that
 * tclone can find a twin killed before it named itself even when no
 * message of the plugin's names it.
 *
 * What a twin cannot hold is tclone's to find, outside the pause: memory
 * fork() does not copy (MADV_DONTFORK), which
 * CRIU records in the images, and memory registered with a userfaultfd,
 * whose reader might be told of, and hold, the clone (/proc/PID/smaps, read
 * before the dump: reading it here would walk every page table again while
 * the tree is held).
 *
 * The plugin acts only when CRIU's environment names its socket
 * (TCLONE_TWIN_FD, a SOCK_SEQPACKET descriptor CRIU inherits); otherwise it
 * does nothing, so that it may sit in a plugin directory other dumps read
 * too. It makes the twins in CRIU's checkpoint-devices hook, after CRIU has
 * seized every task and before it dumps any, and parks them in its
 * dump-resumed hook (criuhooks/criu/dump-resumed.patch), in CRIU's
 * process, the tracer.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/sched.h>

#include "criu-plugin.h"

#include "twin.h"

/* CRIU's logger, which CRIU exports to its plugins. */
extern void print_on_level(unsigned int loglevel, const char *format, ...) __attribute__((format(printf, 2, 3)));
#define TWIN_LOG_ERROR 1
#define TWIN_LOG_WARN 2
#define TWIN_LOG_INFO 3
#define twin_info(fmt, ...) print_on_level(TWIN_LOG_INFO, "tclone twin: " fmt "\n", ##__VA_ARGS__)
#define twin_error(fmt, ...) print_on_level(TWIN_LOG_ERROR, "Error (tclone twin): " fmt "\n", ##__VA_ARGS__)

#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif
#ifndef __NR_close_range
#define __NR_close_range 436
#endif
#ifndef __NR_pidfd_open
#define __NR_pidfd_open 434
#endif
#ifndef __NR_pidfd_getfd
#define __NR_pidfd_getfd 438
#endif
#ifndef __NR_kcmp
#define __NR_kcmp 312
#endif
#ifndef KCMP_VM
#define KCMP_VM 1
#endif
#ifndef PTRACE_GETSIGMASK
#define PTRACE_GETSIGMASK 0x420a
#define PTRACE_SETSIGMASK 0x420b
#endif

/* The codes a system call interrupted by a stop returns, on x86-64. */
#define ERESTARTSYS 512
#define ERESTARTNOINTR 513
#define ERESTARTNOHAND 514
#define ERESTART_RESTARTBLOCK 516

/* tramp.S: the code every system call runs at, with its data. */
extern const unsigned char twin_tramp_start[], twin_tramp_end[];
extern const unsigned char twin_tramp_parent[], twin_tramp_mask[], twin_tramp_regs[], twin_tramp_name[];
extern const unsigned char twin_tramp_park[], twin_tramp_park_stop[], twin_tramp_uffd[];
#define TRAMP_LEN ((size_t)(twin_tramp_end - twin_tramp_start))
#define TRAMP_OFF(sym) ((size_t)((sym) - twin_tramp_start))

static int twin_sock = -1;
/* TWIN_BIRTHS_ENV's file, open for appending, or -1. */
static int births_fd = -1;

/* Write tracking (TWIN_TRACK_ENV): asked for, and the processes left out. */
static bool track_asked;
static pid_t *track_skip;
static int track_nskip;

static bool track_wanted(pid_t pid)
{
	if (!track_asked)
		return false;
	for (int i = 0; i < track_nskip; i++)
		if (track_skip[i] == pid)
			return false;
	return true;
}

static int track_init(const char *path)
{
	FILE *f;
	long v;

	track_asked = true;
	if (!*path)
		return 0;
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fscanf(f, "%ld", &v) == 1) {
		pid_t *n = realloc(track_skip, (track_nskip + 1) * sizeof(*n));

		if (!n) {
			fclose(f);
			return -1;
		}
		track_skip = n;
		track_skip[track_nskip++] = v;
	}
	fclose(f);
	return 0;
}

/*
 * test_stall waits where TCLONE_TWIN_TEST_STALL (POINT:MS) says, for the
 * tests that kill CRIU there: "after-clone" (the process at the trampoline,
 * its twin just born), "uffd-open" (the process at the trampoline, its
 * userfaultfd made and not closed yet), "uffd" (the process at the
 * trampoline after its userfaultfd's calls) or "parking" (the twin half
 * parked). It says so in
 * CRIU's log first, as a warning: a capture's log keeps warnings and
 * errors only, unless tclone runs at debug level.
 */
static void test_stall(const char *point)
{
	const char *v = getenv("TCLONE_TWIN_TEST_STALL");
	size_t n = strlen(point);

	if (v && !strncmp(v, point, n) && v[n] == ':') {
		print_on_level(TWIN_LOG_WARN, "Warn (tclone twin): test stall at %s for %d ms\n", point, atoi(v + n + 1));
		usleep(atoi(v + n + 1) * 1000);
	}
}

struct twin_err {
	int err;
	char why[TWIN_WHY_LEN];
};

static int fail(struct twin_err *e, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->why, sizeof(e->why), fmt, ap);
	va_end(ap);
	e->err = err ? err : EINVAL;
	return -1;
}

static double ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* wait_stop waits for tid's next stop. */
static int wait_stop(pid_t tid, int *status, struct twin_err *e)
{
	for (;;) {
		pid_t w = waitpid(tid, status, __WALL);

		if (w == tid)
			break;
		if (w < 0 && errno == EINTR)
			continue;
		return fail(e, errno, "waiting for thread %d: %s", tid, strerror(errno));
	}
	if (!WIFSTOPPED(*status))
		return fail(e, ESRCH, "thread %d ended (status %#x) while it ran a system call for tclone", tid,
			    *status);
	return 0;
}

/*
 * inject_regs and inject_go start one system call in tid, a stopped
 * tracee, at site: the thread runs on to the call's entry. inject_next lets it on into the
 * call, and inject_end waits until it stops at the call's exit and reads
 * the result, leaving the thread stopped there with its registers
 * changed: the caller saved them (orig) and puts them back. Between these
 * steps the caller may take other tracees through theirs, so that their
 * calls run side by side. A result of -4095..-1 is an errno.
 */
static int inject_regs(pid_t tid, const struct user_regs_struct *orig, unsigned long site, struct twin_err *e,
		       long nr, unsigned long a1, unsigned long a2, unsigned long a3, unsigned long a4,
		       unsigned long a5, unsigned long a6)
{
	struct user_regs_struct r = *orig;

	r.rip = site;
	r.rax = nr;
	r.orig_rax = -1; /* no restart of whatever the thread was in */
	r.rdi = a1;
	r.rsi = a2;
	r.rdx = a3;
	r.r10 = a4;
	r.r8 = a5;
	r.r9 = a6;
	r.eflags &= ~(0x100UL /* TF */ | 0x400UL /* DF */);
	if (ptrace(PTRACE_SETREGS, tid, NULL, &r))
		return fail(e, errno, "setting the registers of thread %d: %s", tid, strerror(errno));
	return 0;
}

/* inject_go sends tid, its registers set (inject_regs), to its call's entry. */
static int inject_go(pid_t tid, struct twin_err *e)
{
	if (ptrace(PTRACE_SYSCALL, tid, NULL, NULL))
		return fail(e, errno, "resuming thread %d: %s", tid, strerror(errno));
	return 0;
}

/*
 * inject_next waits for the next stop of the call inject_go started,
 * passing event stops (a clone's): at the call's entry it lets the thread
 * on into the call; at its exit it leaves it stopped. stops counts them.
 */
static int inject_next(pid_t tid, int *stops, struct twin_err *e)
{
	int status;

	for (;;) {
		if (wait_stop(tid, &status, e))
			return -1;
		if ((status >> 16) == 0) {
			/* Every signal is blocked but SIGKILL and SIGSTOP. */
			if (WSTOPSIG(status) != (SIGTRAP | 0x80))
				return fail(e, EINTR, "thread %d stopped with signal %d while it ran a system call for tclone",
					    tid, WSTOPSIG(status));
			if (++*stops == 2)
				return 0;
		}
		if (ptrace(PTRACE_SYSCALL, tid, NULL, NULL))
			return fail(e, errno, "resuming thread %d: %s", tid, strerror(errno));
		if ((status >> 16) == 0)
			return 0; /* on into the call */
	}
}

/* inject_end waits until the call reaches its exit and reads its result. */
static int inject_end(pid_t tid, int *stops, long *ret, struct twin_err *e)
{
	struct user_regs_struct r;

	while (*stops < 2)
		if (inject_next(tid, stops, e))
			return -1;
	if (ptrace(PTRACE_GETREGS, tid, NULL, &r))
		return fail(e, errno, "reading the registers of thread %d: %s", tid, strerror(errno));
	*ret = (long)r.rax;
	return 0;
}

/* inject runs one system call in tid and waits for it. */
static int inject(pid_t tid, const struct user_regs_struct *orig, unsigned long site, long *ret, struct twin_err *e,
		  long nr, unsigned long a1, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5,
		  unsigned long a6)
{
	int stops = 0;

	if (inject_regs(tid, orig, site, e, nr, a1, a2, a3, a4, a5, a6) || inject_go(tid, e))
		return -1;
	return inject_end(tid, &stops, ret, e);
}

#define A1(a) (unsigned long)(a), 0, 0, 0, 0, 0

/*
 * resumable gives regs as they must be for the thread to go on where it
 * was: a system call its stop interrupted is restarted, as the kernel does
 * on the way out of a signal stop (the thread now waits in another stop,
 * out of which the kernel would not).
 */
static void resumable(struct user_regs_struct *regs)
{
	if ((long)regs->orig_rax < 0)
		return;
	switch ((long)regs->rax) {
	case -ERESTARTSYS:
	case -ERESTARTNOINTR:
	case -ERESTARTNOHAND:
		regs->rax = regs->orig_rax;
		break;
	case -ERESTART_RESTARTBLOCK:
		regs->rax = __NR_restart_syscall;
		break;
	default:
		return;
	}
	regs->rip -= 2;
	regs->orig_rax = -1;
}

/* The most of a vDSO's padding the trampoline's writes cover. */
#define TAIL_MAX 16384

/* The vDSO image's length: up to the end of its section headers, which come last. */
static size_t vdso_image_len(const unsigned char *buf, size_t len)
{
	const Elf64_Ehdr *h = (const Elf64_Ehdr *)buf;
	size_t shend;

	if (len < sizeof(*h) || memcmp(h->e_ident, ELFMAG, SELFMAG) || h->e_ident[EI_CLASS] != ELFCLASS64)
		return len;
	shend = h->e_shoff + (size_t)h->e_shnum * h->e_shentsize;
	return shend <= len ? shend : len;
}

/* thread_at fails if a thread of pid, seized, has its next instruction in [lo, hi). */
static int thread_at(pid_t pid, unsigned long lo, unsigned long hi, struct twin_err *e)
{
	struct user_regs_struct r;
	char path[64];
	struct dirent *d;
	DIR *dir;
	int ret = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	dir = opendir(path);
	if (!dir)
		return fail(e, errno, "reading %s: %s", path, strerror(errno));
	while (!ret && (d = readdir(dir))) {
		pid_t tid = atoi(d->d_name);

		if (tid <= 0)
			continue;
		if (ptrace(PTRACE_GETREGS, tid, NULL, &r))
			ret = fail(e, errno, "reading the registers of thread %d of %d: %s", tid, pid, strerror(errno));
		else if (r.rip >= lo && r.rip < hi)
			ret = fail(e, EBUSY, "thread %d of process %d runs the trampoline a killed CRIU left in its vDSO: fork again", tid, pid);
	}
	closedir(dir);
	return ret;
}

/*
 * vdso_pad finds, in pid's vDSO, room for the trampoline in the zero
 * padding after the vDSO's image: an address where nothing of the
 * process's ever runs or reads, and tail, the bytes from there to the
 * vDSO's end, which the trampoline and zeros fill. Every tclone has put
 * its trampoline at the same place, 17 to 32 bytes past the image's last
 * byte that is not zero. A trampoline found there was left by a CRIU
 * killed while the process was at it (the process went on through it and
 * back to its own code): this tclone's, or another's (an older one, which
 * starts with the same clone and names the twin the same), it is written
 * over, unless a thread of the process is at it still; so is the code of
 * CRIU's own injected calls, which tclone's CRIU puts at the same place
 * for each infection and a killed CRIU leaves too.
 */
static int vdso_pad(pid_t pid, unsigned long *site, size_t *tail, struct twin_err *e)
{
	static const unsigned char sig[] = { 0x0f, 0x05, 0x48, 0x85, 0xc0 }; /* syscall; test %rax, %rax */
	static const char name[] = "tclone-twin";
	/* The code of CRIU's kill-safe injected calls (compel-safe-calls.patch), which goes at the same place. */
	static const unsigned char calls_sig[] = { 0x0f, 0x05, 0x49, 0x89, 0xc4 }; /* syscall; mov %rax, %r12 */
	static const char calls_mark[] = "compel-safe-call";
	unsigned long start = 0, end = 0;
	char path[64], line[512];
	unsigned char *buf;
	size_t len, last, off, i;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	if (!f)
		return fail(e, errno, "reading %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "[vdso]") && sscanf(line, "%lx-%lx", &start, &end) == 2)
			break;
	fclose(f);
	if (!end)
		return fail(e, ENOENT, "process %d has no vDSO, where tclone runs its system calls", pid);
	len = end - start;
	buf = malloc(len);
	if (!buf)
		return fail(e, ENOMEM, "no memory for a copy of the vDSO");
	struct iovec local = { buf, len }, remote = { (void *)start, len };
	if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != (ssize_t)len) {
		int err = errno;
		free(buf);
		return fail(e, err, "reading the vDSO of process %d: %s", pid, strerror(err));
	}
	last = vdso_image_len(buf, len);
	while (last > 0 && buf[last - 1] == 0)
		last--;
	/* Clear of the image's last byte, 16-aligned. */
	off = (last + 32) & ~15UL;
	if (off + TRAMP_LEN > len) {
		free(buf);
		return fail(e, ENOSPC, "the vDSO of process %d has %zu bytes of padding, and tclone needs %zu", pid, len - last,
			    TRAMP_LEN + 48);
	}
	for (i = off; i < len && buf[i] == 0; i++)
		;
	if (i < len) {
		bool ours = i == off && !memcmp(buf + off, sig, sizeof(sig)) && memmem(buf + off, len - off, name, sizeof(name));
		bool same = ours && !memcmp(buf + off, twin_tramp_start, TRAMP_OFF(twin_tramp_parent));
		bool calls = i == off && !memcmp(buf + off, calls_sig, sizeof(calls_sig)) &&
			     memmem(buf + off, len - off, calls_mark, sizeof(calls_mark));

		free(buf);
		if (!ours && !calls)
			return fail(e, EEXIST, "the vDSO of process %d holds bytes of someone else's at %#lx, where tclone puts its trampoline",
				    pid, start + i);
		if (thread_at(pid, start + off, end, e))
			return -1;
		twin_info("process %d: %s left by a killed CRIU at %#lx is written over", pid,
			  calls ? "the code of CRIU's injected calls" : same ? "a trampoline" : "a trampoline of another tclone",
			  start + off);
	} else {
		free(buf);
	}
	*site = start + off;
	*tail = len - off < TAIL_MAX ? len - off : TAIL_MAX;
	return 0;
}

/* poke writes len bytes at addr of pid's memory, read-only or not. */
static int poke(pid_t pid, unsigned long addr, const void *data, size_t len, struct twin_err *e)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/mem", pid);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail(e, errno, "opening %s: %s", path, strerror(errno));
	n = pwrite(fd, data, len, addr);
	close(fd);
	if (n != (ssize_t)len)
		return fail(e, n < 0 ? errno : EIO, "writing %zu bytes at %#lx in process %d: %s", len, addr, pid,
			    n < 0 ? strerror(errno) : "short write");
	return 0;
}

/*
 * live_thread picks the thread of pid that makes the clone (the leader, or
 * another where the leader has exited) and reads its registers.
 */
static pid_t live_thread(pid_t pid, struct user_regs_struct *regs, struct twin_err *e)
{
	char path[64];
	struct dirent *d;
	DIR *dir;

	if (ptrace(PTRACE_GETREGS, pid, NULL, regs) == 0)
		return pid;
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	dir = opendir(path);
	if (!dir) {
		fail(e, errno, "reading %s: %s", path, strerror(errno));
		return -1;
	}
	while ((d = readdir(dir))) {
		pid_t tid = atoi(d->d_name);

		if (tid > 0 && tid != pid && ptrace(PTRACE_GETREGS, tid, NULL, regs) == 0) {
			closedir(dir);
			return tid;
		}
	}
	closedir(dir);
	fail(e, ESRCH, "process %d has no thread whose registers can be read", pid);
	return -1;
}

/*
 * children reads the children of thread tid of pid, as CRIU's PID
 * namespace sees them, into out (up to max); it returns how many.
 */
static int children(pid_t pid, pid_t tid, pid_t *out, int max)
{
	char path[80];
	FILE *f;
	int n = 0;
	long c;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", pid, tid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (n < max && fscanf(f, "%ld", &c) == 1)
		out[n++] = c;
	fclose(f);
	return n;
}

/*
 * new_child finds the child of tid that is not among before: the clone's,
 * whose pid the clone returned as the process's PID namespace sees it.
 */
static pid_t new_child(pid_t pid, pid_t tid, const pid_t *before, int nbefore)
{
	pid_t now[4096];
	int n = children(pid, tid, now, 4096);

	for (int i = 0; i < n; i++) {
		bool old = false;

		for (int j = 0; j < nbefore && !old; j++)
			old = now[i] == before[j];
		if (!old)
			return now[i];
	}
	return -1;
}

struct twin {
	int nslevels; /* the process's pid at each level of its PID namespaces */
	pid_t nspid[TWIN_NS_MAX];
	pid_t pid;    /* the twin, in CRIU's PID namespace */
	int pidfd;    /* of the twin */
	int lifeline; /* the write end of the twin's pipe */
	int uffd;     /* the process's userfaultfd, for write tracking */
	int track;    /* twin_msg's track */
	pid_t killed; /* a twin the plugin made and killed (kill_twin) */
	double clone_ms, park_ms;
};

/*
 * kill_twin kills the twin pid of a job that failed. Killed before it
 * names itself, it leaves a zombie no one can tell from a child of its
 * process's own (its process's name, no exit signal): the job's message
 * names it, and tclone reaps it.
 */
static void kill_twin(struct twin *t, pid_t pid)
{
	kill(pid, SIGKILL);
	t->killed = pid;
}

/*
 * make_uffd makes a userfaultfd in process pid, by thread tid at the
 * trampoline, takes it into t->uffd and closes it in the process again.
 * It is user-mode only, which a process without CAP_SYS_PTRACE may make
 * where vm.unprivileged_userfaultfd is 0, and which write-protect-async
 * tracking works with. The close is the trampoline's own (twin_tramp_uffd):
 * the thread goes on through it from the call's exit, so that a CRIU that
 * dies once the call has returned leaves no descriptor in the process (an
 * injected close left it there, and the process's next dump failed on it).
 * A call that fails only leaves the process untracked; an injection that
 * fails, or a close that does, fails the twin, since the process might
 * keep a descriptor of tclone's.
 */
static int make_uffd(pid_t pid, pid_t tid, const struct user_regs_struct *regs, unsigned long site, struct twin *t,
		     struct twin_err *e)
{
	long fd = -1, ret = 0;
	int pidfd, stops = 0;

	/* A CRIU that dies while the thread is at these calls lets it go on there, put back. */
	site += TRAMP_OFF(twin_tramp_uffd);
	/* A failed injection may have made the descriptor: it fails the twin. */
	if (inject(tid, regs, site, &fd, e, __NR_userfaultfd, A1(O_CLOEXEC | O_NONBLOCK | 1 /* UFFD_USER_MODE_ONLY */)))
		return -1;
	if (fd < 0) {
		t->track = fd > -4096 ? (int)fd : -EIO;
		test_stall("uffd");
		return 0;
	}
	pidfd = syscall(__NR_pidfd_open, pid, 0);
	if (pidfd >= 0) {
		t->uffd = syscall(__NR_pidfd_getfd, pidfd, (int)fd, 0);
		close(pidfd);
	}
	t->track = t->uffd >= 0 ? 1 : -errno;
	twin_info("process %d: a userfaultfd for write tracking (%s)", pid, t->uffd >= 0 ? "taken" : strerror(-t->track));
	test_stall("uffd-open");
	/* On through the trampoline's close, to its exit. */
	if (inject_go(tid, e) || inject_end(tid, &stops, &ret, e) ||
	    (ret < 0 && fail(e, (int)-ret, "closing the userfaultfd %ld of process %d: %s", fd, pid, strerror((int)-ret)))) {
		if (t->uffd >= 0)
			close(t->uffd);
		t->uffd = -1;
		return -1;
	}
	test_stall("uffd");
	return 0;
}

/* ns_pids reads pid's NSpid line: its pid at each level of its PID namespaces. */
static int ns_pids(pid_t pid, struct twin *t, struct twin_err *e)
{
	char path[64], line[512];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "re");
	if (!f)
		return fail(e, errno, "reading %s: %s", path, strerror(errno));
	t->nslevels = 0;
	while (fgets(line, sizeof(line), f)) {
		char *p = line + 6, *end;

		if (strncmp(line, "NSpid:", 6))
			continue;
		for (;;) {
			long v = strtol(p, &end, 10);

			if (end == p)
				break;
			if (t->nslevels == TWIN_NS_MAX) {
				fclose(f);
				return fail(e, E2BIG, "process %d is %d PID namespaces deep or more; tclone takes twins %d deep",
					    pid, TWIN_NS_MAX + 1, TWIN_NS_MAX);
			}
			t->nspid[t->nslevels++] = v;
			p = end;
		}
		break;
	}
	fclose(f);
	if (!t->nslevels)
		return fail(e, ENOENT, "%s has no NSpid line", path);
	return 0;
}

/*
 * A job is the making of one process's twin. Its steps that wait for a
 * tracee (the clone, the parking) are split in two: begin starts the
 * tracee, end waits for it, so that the steps of many jobs can run side by
 * side (twin_batch).
 */
struct job {
	pid_t pid;		/* the process */
	pid_t tid;		/* the thread that makes the clone */
	unsigned long site;	/* where the trampoline is */
	size_t tail;		/* from site to the vDSO's end */
	struct user_regs_struct saved, resume;
	uint64_t mask;		/* the thread's signal mask */
	pid_t *before;		/* the thread's children before the clone */
	int nbefore;
	bool placed;		/* the trampoline is in place, signals blocked */
	bool cloning;		/* the clone is started */
	int stops;		/* of the clone, inject_next */
	struct timespec t0;
	struct twin t;
	struct twin_err e;
	int ret;		/* 0 once the twin is made and let go */
};

static void job_init(struct job *j, pid_t pid)
{
	memset(j, 0, sizeof(*j));
	j->pid = pid;
	j->t.pidfd = j->t.lifeline = j->t.uffd = -1;
	j->ret = -1;
}

static void job_free(struct job *j)
{
	free(j->before);
	j->before = NULL;
	if (j->t.pidfd >= 0)
		close(j->t.pidfd);
	if (j->t.lifeline >= 0)
		close(j->t.lifeline);
	if (j->t.uffd >= 0)
		close(j->t.uffd);
	j->t.pidfd = j->t.lifeline = j->t.uffd = -1;
}

/* boot_ticks is now in clock ticks since boot, as /proc/PID/stat's start times. */
static unsigned long long boot_ticks(void)
{
	long hz = sysconf(_SC_CLK_TCK);
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (unsigned long long)ts.tv_sec * hz + ts.tv_nsec / (1000000000L / hz);
}

/*
 * note_birth appends the job's line to the births file (TWIN_BIRTHS_ENV),
 * before its clone: no twin is made that the file does not foretell.
 */
static int note_birth(const struct job *j, struct twin_err *e)
{
	size_t size = 64 + (size_t)j->nbefore * 12, n;
	char *line;
	ssize_t w;

	if (births_fd < 0)
		return 0;
	line = malloc(size);
	if (!line)
		return fail(e, ENOMEM, "no memory for the birth of the twin of %d", j->pid);
	n = snprintf(line, size, "%d %d %llu", j->pid, j->tid, boot_ticks());
	for (int i = 0; i < j->nbefore; i++)
		n += snprintf(line + n, size - n, " %d", j->before[i]);
	n += snprintf(line + n, size - n, "\n");
	w = write(births_fd, line, n);
	free(line);
	if (w != (ssize_t)n)
		return fail(e, w < 0 ? errno : EIO, "noting the birth of the twin of %d (%s): %s", j->pid,
			    getenv(TWIN_BIRTHS_ENV), w < 0 ? strerror(errno) : "a short write");
	return 0;
}

/*
 * clone_begin puts the trampoline (tramp.S) in the padding of process
 * pid's vDSO and starts the clone there. From the moment the thread is
 * pointed at the trampoline until its registers are back (clone_end), a
 * CRIU that dies lets the process resume there: the trampoline puts it
 * back as it was.
 */
static int clone_begin(struct job *j)
{
	static unsigned char tramp[TAIL_MAX];
	pid_t before[4096];
	uint64_t all = ~0ULL;
	struct twin_err *e = &j->e;

	if (ns_pids(j->pid, &j->t, e))
		return -1;
	j->tid = live_thread(j->pid, &j->saved, e);
	if (j->tid < 0)
		return -1;
	if (j->saved.cs != 0x33)
		return fail(e, EOPNOTSUPP, "process %d runs in 32-bit mode", j->pid);
	if (vdso_pad(j->pid, &j->site, &j->tail, e))
		return -1;
	if (ptrace(PTRACE_GETSIGMASK, j->tid, sizeof(j->mask), &j->mask))
		return fail(e, errno, "reading the signal mask of process %d: %s", j->pid, strerror(errno));
	j->resume = j->saved;
	resumable(&j->resume);
	/* The trampoline, and zeros over whatever an older one left after it. */
	memset(tramp, 0, j->tail);
	memcpy(tramp, twin_tramp_start, TRAMP_LEN);
	tramp[TRAMP_OFF(twin_tramp_parent)] = 1;
	memcpy(tramp + TRAMP_OFF(twin_tramp_mask), &j->mask, sizeof(j->mask));
	memcpy(tramp + TRAMP_OFF(twin_tramp_regs), &j->resume, sizeof(j->resume));
	j->nbefore = children(j->pid, j->tid, before, 4096);
	if (j->nbefore < 0)
		return fail(e, errno, "reading the children of thread %d of %d: %s", j->tid, j->pid, strerror(errno));
	j->before = malloc((j->nbefore + 1) * sizeof(pid_t));
	if (!j->before)
		return fail(e, ENOMEM, "no memory for the children of process %d", j->pid);
	memcpy(j->before, before, j->nbefore * sizeof(pid_t));
	if (note_birth(j, e))
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &j->t0);
	if (poke(j->pid, j->site, tramp, j->tail, e))
		return -1;
	j->placed = true;
	/*
	 * No exit signal: the twin's birth and death are no SIGCHLD of the
	 * process's. The clone returns the twin's pid in the process's PID
	 * namespace; its pid here is the thread's one new child. The thread
	 * is at the trampoline before its signals are blocked, so that a CRIU
	 * that dies in between leaves it where the trampoline puts the mask
	 * back.
	 */
	if (inject_regs(j->tid, &j->saved, j->site, e, __NR_clone, A1(CLONE_PTRACE | CLONE_FILES | CLONE_FS)))
		return -1;
	if (ptrace(PTRACE_SETSIGMASK, j->tid, sizeof(all), &all))
		return fail(e, errno, "blocking the signals of process %d: %s", j->pid, strerror(errno));
	if (inject_go(j->tid, e))
		return -1;
	j->cloning = true;
	return 0;
}

/*
 * clone_end waits for the clone clone_begin started, makes the process's
 * userfaultfd where tracking is asked for, and puts the process back as it
 * was, whatever failed on the way. It leaves the twin, stopped at its
 * birth and traced, in j->t.pid.
 */
static int clone_end(struct job *j)
{
	static const unsigned char zeros[TAIL_MAX];
	struct twin_err *e = &j->e;
	long child = -1, ret = 0;
	int status;

	if (j->cloning && !inject_end(j->tid, &j->stops, &ret, e)) {
		if (ret < 0 && ret > -4096)
			fail(e, (int)-ret, "system call %d in %d failed: %s", __NR_clone, j->tid, strerror((int)-ret));
		else if ((child = new_child(j->pid, j->tid, j->before, j->nbefore)) < 0)
			fail(e, ESRCH, "the clone in process %d made no child that can be found", j->pid);
		else if (track_wanted(j->pid))
			make_uffd(j->pid, j->tid, &j->saved, j->site, &j->t, e);
		test_stall("after-clone");
	}
	if (!j->placed)
		return -1;
	/* The mask first: a thread left at the trampoline gets it back there too. */
	if (ptrace(PTRACE_SETSIGMASK, j->tid, sizeof(j->mask), &j->mask) ||
	    ptrace(PTRACE_SETREGS, j->tid, NULL, &j->resume)) {
		fail(e, errno, "putting process %d back as it was: %s", j->pid, strerror(errno));
		if (child > 0)
			kill_twin(&j->t, child);
		return -1;
	}
	/* The twin has its own copy of the page by now (the clone shared it). */
	if (poke(j->pid, j->site, zeros, j->tail, e) && child > 0) {
		kill_twin(&j->t, child);
		return -1;
	}
	if (child <= 0 || e->err) {
		if (child > 0)
			kill_twin(&j->t, child);
		return -1;
	}
	/*
	 * The twin is born traced and stops before it reaches user space. Its
	 * stop is taken here: left to be reported, it would reach CRIU's own
	 * waits for any of its tracees (compel's wait4(-1)) while the tree is
	 * dumped, which would take the twin for a task of the tree's and set
	 * it running.
	 */
	if (wait_stop(child, &status, e)) {
		char why[TWIN_WHY_LEN];

		snprintf(why, sizeof(why), "%s", e->why);
		fail(e, e->err, "the twin %ld of process %d, at its birth: %s", child, j->pid, why);
		kill_twin(&j->t, child);
		return -1;
	}
	j->t.pid = child;
	twin_info("process %d (thread %d): twin %ld in %.3f ms", j->pid, j->tid, child, ms_since(&j->t0));
	return 0;
}

/*
 * park_begin starts making the twin harmless for when CRIU lets it go (see
 * the top of this file); t->pid is stopped at its birth. The twin does it
 * itself, at twin_tramp_park (tramp.S), traced and dying with CRIU: its
 * name, a descriptor table of its own with nothing of the process's in
 * it, a session of its own, a root and working directory of its own, and a
 * pipe. It stops at an int3 with the pipe's ends
 * in r14 and r15: the plugin arms the read end to kill the twin once no
 * write end is left, and takes the write end as its lifeline. Let go, the
 * twin closes its own copy of the write end and enters pause().
 */
static int park_begin(struct twin *t, unsigned long code, struct twin_err *e)
{
	struct user_regs_struct regs;
	uint64_t all = ~0ULL;

	/* The twin dies with CRIU from here on. */
	if (ptrace(PTRACE_SETOPTIONS, t->pid, NULL, PTRACE_O_EXITKILL | PTRACE_O_TRACESYSGOOD) ||
	    ptrace(PTRACE_SETSIGMASK, t->pid, sizeof(all), &all) || ptrace(PTRACE_GETREGS, t->pid, NULL, &regs))
		return fail(e, errno, "taking hold of the twin %d: %s", t->pid, strerror(errno));
	regs.rip = code + TRAMP_OFF(twin_tramp_park);
	regs.orig_rax = -1;
	regs.eflags &= ~(0x100UL /* TF */ | 0x400UL /* DF */);
	if (ptrace(PTRACE_SETREGS, t->pid, NULL, &regs) || ptrace(PTRACE_CONT, t->pid, NULL, NULL))
		return fail(e, errno, "starting the parking of the twin %d: %s", t->pid, strerror(errno));
	return 0;
}

/* park_end waits for the parking park_begin started and takes the lifeline. */
static int park_end(struct twin *t, unsigned long code, struct twin_err *e)
{
	struct user_regs_struct regs;
	uint64_t all = ~0ULL;
	char path[64];
	int status, rd;
	FILE *f;

	if (wait_stop(t->pid, &status, e))
		return -1;
	if ((status >> 16) != 0 || WSTOPSIG(status) != SIGTRAP)
		return fail(e, EINTR, "the twin %d stopped with signal %d (event %d) while it parked", t->pid,
			    WSTOPSIG(status), status >> 16);
	if (ptrace(PTRACE_GETREGS, t->pid, NULL, &regs))
		return fail(e, errno, "reading the registers of the twin %d: %s", t->pid, strerror(errno));
	if ((long)regs.rax < 0) {
		/* The steps of twin_tramp_park, by the number its step macro loads. */
		static const char *const steps[] = {
			"?", "prctl(PR_SET_NAME)", "close_range", "setsid", "unshare(CLONE_FS)", "chdir", "mmap", "pipe2", "munmap",
		};
		unsigned int n = regs.rbx & 0xff;

		return fail(e, (int)-(long)regs.rax, "parking the twin %d: its %s failed: %s", t->pid,
			    steps[n < sizeof(steps) / sizeof(steps[0]) ? n : 0], strerror((int)-(long)regs.rax));
	}
	if (regs.rax != 0 || regs.rip != code + TRAMP_OFF(twin_tramp_park_stop) + 1)
		return fail(e, EINVAL, "the twin %d stopped at %#llx, not at the end of its parking", t->pid, regs.rip);
	test_stall("parking");
	t->pidfd = syscall(__NR_pidfd_open, t->pid, 0);
	if (t->pidfd < 0)
		return fail(e, errno, "pidfd of the twin %d: %s", t->pid, strerror(errno));
	t->lifeline = syscall(__NR_pidfd_getfd, t->pidfd, (int)regs.r15, 0);
	if (t->lifeline < 0)
		return fail(e, errno, "taking the twin's pipe: %s", strerror(errno));
	/*
	 * The read end kills the twin once no write end is left: its owner,
	 * signal and O_ASYNC belong to the open file description, which a
	 * copy of the read end sets as well as the twin's own (closing the
	 * copy is not its last close, which would undo O_ASYNC). The kernel
	 * checks the signal against the credentials of whoever set the owner
	 * (sigio_perm): CRIU's, root's, which may kill the twin.
	 */
	rd = syscall(__NR_pidfd_getfd, t->pidfd, (int)regs.r14, 0);
	if (rd < 0)
		return fail(e, errno, "taking the twin's pipe: %s", strerror(errno));
	if (fcntl(rd, F_SETOWN, t->pid) || fcntl(rd, F_SETSIG, SIGKILL) || fcntl(rd, F_SETFL, O_ASYNC)) {
		fail(e, errno, "arming the pipe of the twin %d: %s", t->pid, strerror(errno));
		close(rd);
		return -1;
	}
	close(rd);
	/* The int3 unblocked SIGTRAP: every signal but SIGKILL stays blocked. */
	if (ptrace(PTRACE_SETSIGMASK, t->pid, sizeof(all), &all))
		return fail(e, errno, "blocking the signals of the twin %d: %s", t->pid, strerror(errno));
	/* The OOM killer takes the twin before any process of the source. */
	snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", t->pid);
	f = fopen(path, "we");
	if (!f || fputs("1000", f) < 0 || fclose(f)) {
		if (f)
			fclose(f);
		return fail(e, errno, "raising the twin's oom_score_adj: %s", strerror(errno));
	}
	return 0;
}

/* send_twin hands the twin of pid to tclone, or says why there is none. */
static int send_twin(pid_t pid, const struct twin *t, const struct twin_err *e)
{
	struct twin_msg m = { .version = TWIN_MSG_VERSION, .pid = pid };
	char cbuf[CMSG_SPACE(2 * sizeof(int))] = {};
	struct iovec iov = { &m, sizeof(m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (e) {
		m.err = e->err;
		m.twin = t->killed;
		snprintf(m.why, sizeof(m.why), "%s", e->why);
	} else {
		int fds[2] = { t->pidfd, t->lifeline };
		int nfds = 2;
		struct cmsghdr *c;

		m.twin = t->pid;
		m.clone_us = (int32_t)(t->clone_ms * 1000);
		m.nslevels = t->nslevels;
		memcpy(m.nspid, t->nspid, sizeof(m.nspid));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
	}
	return sendmsg(twin_sock, &mh, MSG_NOSIGNAL) == sizeof(m) ? 0 : -1;
}

/*
 * send_track hands tclone the userfaultfd make_uffd took for process pid,
 * or says why there is none, while CRIU holds the tree: tclone starts or
 * re-arms its write tracking in its post-dump hook. The plugin's copy is
 * closed either way; a process whose message is lost is only untracked.
 */
static void send_track(pid_t pid, struct twin *t)
{
	struct twin_msg m = { .version = TWIN_MSG_VERSION, .pid = pid, .kind = TWIN_KIND_TRACK, .track = t->track };
	char cbuf[CMSG_SPACE(sizeof(int))] = {};
	struct iovec iov = { &m, sizeof(m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (!t->track)
		return;
	if (t->uffd >= 0) {
		struct cmsghdr *c;

		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int));
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &t->uffd, sizeof(int));
	}
	if (sendmsg(twin_sock, &mh, MSG_NOSIGNAL) != sizeof(m))
		twin_error("cannot hand the userfaultfd of %d to tclone: %s", pid, strerror(errno));
	if (t->uffd >= 0)
		close(t->uffd);
	t->uffd = -1;
	t->track = 0;
}

/*
 * job_park ends the parking park_begin started and lets the twin go. A
 * twin that fails is killed.
 */
static int job_park(struct job *j)
{
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (park_end(&j->t, j->site, &j->e))
		goto fail;
	if (ptrace(PTRACE_DETACH, j->t.pid, NULL, NULL)) {
		fail(&j->e, errno, "letting the twin %d go: %s", j->t.pid, strerror(errno));
		goto fail;
	}
	j->t.park_ms = ms_since(&t0);
	j->ret = 0;
	return 0;
fail:
	kill_twin(&j->t, j->t.pid);
	return -1;
}

/* job_send hands the job's twin to tclone, or says why there is none. */
static int job_send(struct job *j)
{
	int ret = j->ret;

	if (send_twin(j->pid, &j->t, ret ? &j->e : NULL)) {
		twin_error("cannot hand the twin of %d to tclone: %s", j->pid, strerror(errno));
		if (!ret && j->t.pid > 0)
			kill(j->t.pid, SIGKILL);
		ret = -1;
	} else if (ret) {
		twin_error("%s", j->e.why);
	} else {
		twin_info("process %d: twin %d parked in %.3f ms", j->pid, j->t.pid, j->t.park_ms);
	}
	job_free(j);
	return ret ? -1 : 0;
}

/* alive tells whether pid is a task CRIU dumps (not a zombie, not dead). */
static bool alive(pid_t pid)
{
	char path[64], buf[512], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X' && p[2] != 'x';
}

/*
 * tree lists root and every live process under it, as CRIU collects its
 * tree (the children of every thread, from /proc), root first. The tree
 * is frozen and seized: it does not change under the walk.
 */
static int tree(pid_t root, pid_t **out)
{
	pid_t *list = malloc(64 * sizeof(*list)), kids[4096];
	int n = 1, cap = 64;

	if (!list)
		return -1;
	list[0] = root;
	for (int i = 0; i < n; i++) {
		char path[64];
		struct dirent *d;
		DIR *dir;

		snprintf(path, sizeof(path), "/proc/%d/task", list[i]);
		dir = opendir(path);
		if (!dir)
			goto err;
		while ((d = readdir(dir))) {
			pid_t tid = atoi(d->d_name);
			int nk = tid > 0 ? children(list[i], tid, kids, 4096) : 0;

			for (int k = 0; k < nk; k++) {
				if (!alive(kids[k]))
					continue;
				if (n == cap) {
					pid_t *m = realloc(list, (cap *= 2) * sizeof(*m));

					if (!m) {
						closedir(dir);
						goto err;
					}
					list = m;
				}
				list[n++] = kids[k];
			}
			if (nk < 0) {
				closedir(dir);
				goto err;
			}
		}
		closedir(dir);
	}
	*out = list;
	return n;
err:
	free(list);
	return -1;
}

/*
 * The batch: on CRIU's first call (the tree's root), the plugin makes the
 * twins of the whole tree side by side. Each step that waits for a
 * tracee is started in every process before the first is waited for, so
 * that the processes run their clones on every CPU at once, instead of
 * one after another with the plugin waiting on each. CRIU's later calls
 * find their process done; a process the walk did not find is made alone.
 *
 * Only the clones need the tree held. The twins, stopped at their birth
 * and traced, are parked once CRIU lets the tree run again (CRIU's
 * dump-resumed hook, twin_resumed), side by side too, and handed to
 * tclone then. Until then each shares its process's descriptor table,
 * root and working directory, session and name, and runs nothing. A dump
 * that fails before lets them go at the trampoline's exit (twin_exit);
 * a CRIU that dies lets them go there too.
 */
static pid_t *batch_pids;
static int batch_n = -1;
static int batch_ret;
static struct job *pending; /* the batch's twins, made, not yet parked */
static int npending;

/*
 * by_mm orders processes by their memory (kcmp's order); kcmp_failed
 * says it could not, and kcmp_err why.
 */
static bool kcmp_failed;
static int kcmp_err;

static int by_mm(const void *a, const void *b)
{
	long r = syscall(__NR_kcmp, *(const pid_t *)a, *(const pid_t *)b, KCMP_VM, 0, 0);

	if (r < 0) {
		if (!kcmp_failed)
			kcmp_err = errno;
		kcmp_failed = true;
		return 0;
	}
	return r == 0 ? 0 : r == 1 ? -1 : 1;
}

/*
 * one_per_mm keeps in pids the first of the processes that share their
 * memory (a clone with CLONE_VM that is no thread) and drops the others:
 * they share the vDSO page the trampoline goes in, so their twins are made
 * one at a time, on their own calls. It returns how many it kept, or -1.
 */
static int one_per_mm(pid_t *pids, int n)
{
	pid_t *sorted = malloc(n * sizeof(*sorted));
	bool *drop = calloc(n, sizeof(*drop));
	int kept = 0;

	if (!sorted || !drop)
		goto out;
	memcpy(sorted, pids, n * sizeof(*sorted));
	kcmp_failed = false;
	qsort(sorted, n, sizeof(*sorted), by_mm);
	for (int i = 0, j; i < n && !kcmp_failed; i = j) {
		int first = n;

		for (j = i + 1; j < n && !by_mm(&sorted[i], &sorted[j]); j++)
			;
		if (j - i < 2)
			continue;
		/* sorted[i..j) share one memory: all but the first of the walk go. */
		for (int k = 0; k < n; k++)
			for (int m = i; m < j; m++)
				if (pids[k] == sorted[m]) {
					if (first == n)
						first = k;
					else
						drop[k] = true;
				}
	}
	for (int k = 0; k < n; k++)
		if (!drop[k])
			pids[kept++] = pids[k];
out:
	free(sorted);
	free(drop);
	return !sorted || !drop || kcmp_failed ? -1 : kept;
}

/*
 * keep keeps a job whose clone is made for twin_resumed. A job that
 * failed fails the dump: tclone hears why at once.
 */
static int keep(struct job *j)
{
	struct job *p;

	if (j->e.err) {
		job_send(j);
		return -1;
	}
	p = realloc(pending, (npending + 1) * sizeof(*p));
	if (!p) {
		fail(&j->e, ENOMEM, "no memory for the twin of %d", j->pid);
		ptrace(PTRACE_DETACH, j->t.pid, NULL, NULL);
		job_send(j);
		return -1;
	}
	send_track(j->pid, &j->t);
	pending = p;
	pending[npending++] = *j;
	return 0;
}

/* twin_reset ends the plugin's part in a dump. */
static void twin_reset(void)
{
	free(batch_pids);
	batch_pids = NULL;
	batch_n = -1;
	batch_ret = 0;
	if (twin_sock >= 0)
		close(twin_sock);
	twin_sock = -1;
	if (births_fd >= 0)
		close(births_fd);
	births_fd = -1;
}

static bool in_batch(pid_t pid)
{
	for (int i = 0; i < batch_n; i++)
		if (batch_pids[i] == pid)
			return true;
	return false;
}

static void twin_batch(pid_t root)
{
	struct timespec t0;
	struct job *jobs;
	double walk_ms, clone_ms;
	pid_t *pids = NULL;
	int n, made = 0;

	batch_n = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	n = tree(root, &pids);
	if (n > 0 && (n = one_per_mm(pids, n)) < 0)
		twin_info("cannot tell which processes share their memory (%s): every twin is made alone",
			  kcmp_failed ? strerror(kcmp_err) : "no memory");
	if (n < 2) {
		/* One process, or no walk: each is made alone. */
		free(pids);
		return;
	}
	jobs = calloc(n, sizeof(*jobs));
	if (!jobs) {
		free(pids);
		return;
	}
	walk_ms = ms_since(&t0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < n; i++) {
		job_init(&jobs[i], pids[i]);
		clone_begin(&jobs[i]);
	}
	/* Every thread waits at its clone's entry: into the clones, all at once. */
	for (int i = 0; i < n; i++)
		if (jobs[i].cloning && inject_next(jobs[i].tid, &jobs[i].stops, &jobs[i].e))
			jobs[i].cloning = false;
	/* A step that fails says why in the job's e, and its job goes no further. */
	for (int i = 0; i < n; i++)
		clone_end(&jobs[i]);
	clone_ms = ms_since(&t0);
	for (int i = 0; i < n; i++) {
		/* What each adds to the pause: its share of the clones. */
		jobs[i].t.clone_ms = clone_ms / n;
		if (keep(&jobs[i]))
			batch_ret = -1;
		else
			made++;
	}
	free(jobs);
	twin_info("%d twins of %d processes side by side: walk %.3f ms, clones %.3f ms", made, n, walk_ms, clone_ms);
	batch_pids = pids;
	batch_n = n;
}

/*
 * twin_resumed parks the batch's twins, side by side, once the tree runs
 * again, and hands them to tclone. A twin that fails to park is killed,
 * and fails the dump.
 */
static int twin_resumed(void)
{
	struct timespec t0;
	sigset_t chld, old;
	double park_ms;
	int made = 0, ret = 0;

	if (!pending)
		return -ENOTSUP;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &old);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < npending; i++)
		if (!pending[i].e.err && park_begin(&pending[i].t, pending[i].site, &pending[i].e))
			kill_twin(&pending[i].t, pending[i].t.pid);
	for (int i = 0; i < npending; i++)
		if (!pending[i].e.err && !job_park(&pending[i]))
			made++;
	park_ms = ms_since(&t0);
	twin_info("%d twins of %d parked side by side once the tree ran again, in %.3f ms", made, npending, park_ms);
	for (int i = 0; i < npending; i++)
		if (job_send(&pending[i]))
			ret = -1;
	free(pending);
	pending = NULL;
	npending = 0;
	sigprocmask(SIG_SETMASK, &old, NULL);
	twin_reset();
	return ret;
}

static int twin_checkpoint(int pid)
{
	sigset_t chld, old;
	struct timespec t0;
	struct job j;

	if (twin_sock < 0)
		return -ENOTSUP;
	/* The twin's stops are waited for here: no handler of CRIU's may take them. */
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &old);
	if (batch_n < 0)
		twin_batch(pid);
	if (in_batch(pid)) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		/* A failed twin fails the dump, as on its own call. */
		return batch_ret;
	}
	job_init(&j, pid);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	clone_begin(&j); /* clone_end puts back whatever it did */
	if (!clone_end(&j))
		j.t.clone_ms = ms_since(&t0);
	sigprocmask(SIG_SETMASK, &old, NULL);
	return keep(&j);
}

static int twin_init(int stage)
{
	const char *fd = getenv(TWIN_FD_ENV);
	const char *track = getenv(TWIN_TRACK_ENV);
	const char *births = getenv(TWIN_BIRTHS_ENV);

	if (stage != CR_PLUGIN_STAGE__DUMP || !fd)
		return 0;
	if (track && track_init(track)) {
		twin_error("%s=%s: %s", TWIN_TRACK_ENV, track, strerror(errno));
		return -1;
	}
	if (births) {
		births_fd = open(births, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
		if (births_fd < 0) {
			twin_error("%s=%s: %s", TWIN_BIRTHS_ENV, births, strerror(errno));
			return -1;
		}
	}
	twin_sock = atoi(fd);
	if (fcntl(twin_sock, F_SETFD, FD_CLOEXEC) < 0) {
		twin_error("%s=%s names no descriptor: %s", TWIN_FD_ENV, fd, strerror(errno));
		twin_sock = -1;
		return -1;
	}
	return 0;
}

/*
 * twin_exit runs while CRIU still holds the tree. A dump that failed lets
 * the batch's unparked twins go: each runs the trampoline's exit, named
 * as a twin, and tclone reaps what it leaves. A dump that did not keeps
 * them for twin_resumed.
 */
static void twin_exit(int stage, int ret)
{
	if (pending && ret) {
		for (int i = 0; i < npending; i++) {
			ptrace(PTRACE_DETACH, pending[i].t.pid, NULL, NULL);
			job_free(&pending[i]);
		}
		free(pending);
		pending = NULL;
		npending = 0;
	}
	if (!pending)
		twin_reset();
}

CR_PLUGIN_REGISTER("tclone_twin", twin_init, twin_exit)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__CHECKPOINT_DEVICES, twin_checkpoint)
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__DUMP_RESUMED, twin_resumed)
