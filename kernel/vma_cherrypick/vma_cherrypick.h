/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * vma_cherrypick: user ABI.
 *
 * The misc device /dev/vma_cherrypick (mode 0600) shares the anonymous pages
 * of a stopped source process with a destination process, copy-on-write, the
 * way fork() shares them between parent and child. See README.md beside this
 * file for the full contract.
 *
 * ABI rules: structures only grow at the end; a new field is announced by a
 * feature bit in struct vcp_version.features, and VCP_ABI_VERSION changes
 * only for an incompatible change.
 */
#ifndef _UAPI_VMA_CHERRYPICK_H
#define _UAPI_VMA_CHERRYPICK_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define VCP_DEVICE_PATH "/dev/vma_cherrypick"
#define VCP_ABI_VERSION 1

/* Private anonymous areas (MAP_PRIVATE|MAP_ANONYMOUS, heap, stack). */
#define VCP_FEATURE_ANON		(1ULL << 0)
/* Private file mappings: only their copied-on-write pages are shared. */
#define VCP_FEATURE_FILE_PRIVATE	(1ULL << 1)
/* PMD-mapped transparent huge pages are shared as huge pages. */
#define VCP_FEATURE_THP			(1ULL << 2)
/*
 * VCP_IOC_SNAPSHOT, and VCP_CHERRYPICK_SRC_SNAPSHOT in vcp_cherrypick.flags:
 * the source of a cherrypick may be a snapshot instead of a process.
 */
#define VCP_FEATURE_SNAPSHOT		(1ULL << 3)

struct vcp_version {
	__u32 abi_version;	/* out: VCP_ABI_VERSION */
	__u32 args_size;	/* out: sizeof(struct vcp_cherrypick) */
	__u64 features;		/* out: VCP_FEATURE_* */
};

struct vcp_cherrypick {
	__s32 src_pidfd;	/* in: pidfd of the stopped source process, or a
				 * snapshot fd with VCP_CHERRYPICK_SRC_SNAPSHOT */
	__s32 dst_pidfd;	/* in: pidfd of the destination process */
	__u64 start;		/* in: page-aligned start, same in both */
	__u64 len;		/* in: page-aligned length, > 0 */
	__u64 flags;		/* in: 0 or VCP_CHERRYPICK_SRC_SNAPSHOT */
	__u64 areas;		/* out: number of areas processed */
	__u64 anon_pages;	/* out: resident anonymous base pages now shared */
	__u64 swap_entries;	/* out: swapped-out anonymous pages now shared */
};

/* vcp_cherrypick.flags: src_pidfd is a snapshot (VCP_FEATURE_SNAPSHOT). */
#define VCP_CHERRYPICK_SRC_SNAPSHOT	(1ULL << 0)

/*
 * A snapshot is a copy-on-write copy of the private anonymous areas of a
 * stopped or frozen process, held by a file descriptor rather than by a
 * process: what fork() gives a child, without the child. Taking one costs
 * the page-table copy; the source may then run on and change its memory,
 * and the snapshot keeps the pages as they were. It is the source of later
 * cherrypicks (VCP_CHERRYPICK_SRC_SNAPSHOT), into any number of
 * destinations, and its memory is freed when the last descriptor closes.
 * pread(2) at an offset equal to a virtual address reads its memory there,
 * as /proc/PID/mem reads a process's (zeros where the source had no page,
 * EFAULT outside its areas); /proc/PID/fdinfo shows what it holds.
 */
struct vcp_snapshot {
	__s32 src_pidfd;	/* in: pidfd of the stopped source process */
	__u32 flags;		/* in: must be 0 */
	__u64 start;		/* in: page-aligned start */
	__u64 len;		/* in: page-aligned length, > 0 */
	__s32 fd;		/* out: the snapshot, close-on-exec */
	__u32 reserved;		/* out: 0 */
	__u64 areas;		/* out: areas taken */
	__u64 skipped;		/* out: areas of the range not taken: shared,
				 * file-backed, special, mlocked, hugetlb,
				 * MADV_DONTFORK/WIPEONFORK, userfaultfd */
	__u64 anon_pages;	/* out: resident anonymous base pages held */
	__u64 swap_entries;	/* out: swapped-out anonymous pages held */
};

#define VCP_IOC_MAGIC 0xE4
#define VCP_IOC_VERSION		_IOR(VCP_IOC_MAGIC, 0x00, struct vcp_version)
#define VCP_IOC_CHERRYPICK	_IOWR(VCP_IOC_MAGIC, 0x01, struct vcp_cherrypick)
#define VCP_IOC_SNAPSHOT	_IOWR(VCP_IOC_MAGIC, 0x02, struct vcp_snapshot)

/*
 * VCP_IOC_CHERRYPICK returns 0 after sharing, or -1 with errno set to exactly
 * one of these. Each refusal has its own errno so the caller can tell them
 * apart without parsing logs. With every one of them, nothing observable has
 * changed in either process: a failure is never reported after the
 * destination changed, and success is reported only with the out fields
 * written. (A source whose page-cache pages were unmapped, and whose PTEs
 * were write-protected, for a call that then failed sees neither; both
 * refault or copy on write as usual.)
 *
 * EINVAL      malformed request: unaligned start or len, len == 0, the range
 *             wraps or leaves user space, or an unknown flag.
 * EFAULT      the argument structure could not be read, or is not writable
 *             (checked before anything is done).
 * EPERM       the caller lacks CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE in the
 *             initial user namespace.
 * EBADF       a pidfd is not an open file descriptor or not a pidfd (with
 *             VCP_CHERRYPICK_SRC_SNAPSHOT: src_pidfd is not a snapshot), or
 *             the device was not opened for writing.
 * ESRCH       a pidfd's process has exited (or is exiting and has no memory),
 *             or the source's memory is being torn down by the OOM reaper.
 * EACCES      ptrace_may_access(PTRACE_MODE_ATTACH_REALCREDS) fails for the
 *             source or the destination (checked under the task's
 *             exec_update_lock, against the image whose memory is used).
 * ELOOP       source and destination share one address space.
 * EBUSY       a thread of the source or of the destination (or of another
 *             process sharing either's memory) is neither stopped (SIGSTOP,
 *             ptrace-stop) nor frozen (cgroup freezer), or a kernel thread is
 *             using either's memory.
 * EOPNOTSUPP  an area of the source in the range is shared (VM_SHARED), I/O
 *             or PFN-mapped (VM_IO, VM_PFNMAP, VM_MIXEDMAP), hugetlb, excluded
 *             from fork (MADV_DONTFORK, MADV_WIPEONFORK), registered with
 *             userfaultfd, or a special mapping (vDSO and the like); or the
 *             source has uprobes installed.
 * ENXIO       the layouts differ: the range holds no area of the source,
 *             it cuts through an area of either process, an area of one has
 *             no twin with the same bounds in the other, twins differ in
 *             protection, protection key, shadow stack, mlock mode, commit
 *             accounting (MAP_NORESERVE), kind (anonymous or file) or file
 *             offset, or the destination's twin is of a kind EOPNOTSUPP lists.
 * EEXIST      the destination already has anonymous memory (an anon_vma) in
 *             an area of the range, or a page table where the source maps a
 *             huge page (it read from that part of its area before, say).
 * EINTR       a fatal signal arrived while waiting for a lock (exec_update_lock,
 *             a memory map lock or an area's lock).
 * ENOMEM      out of memory while linking or copying page tables, in the
 *             destination's memory cgroup or the system. Every destination
 *             area is back as it was (no pages, no anon_vma), so the same call
 *             can be retried. copy_page_range() also reports a hardware-
 *             poisoned source page and a device-exclusive entry it could not
 *             restore as ENOMEM; those fail the same way.
 */

/*
 * VCP_IOC_SNAPSHOT returns 0 with a new descriptor in fd, or -1 with errno
 * set as for VCP_IOC_CHERRYPICK: EINVAL, EFAULT, EPERM, EBADF, ESRCH,
 * EACCES, EBUSY (the source only), EINTR, ENOMEM, and
 * EOPNOTSUPP  the source has uprobes installed;
 * ENXIO       the range cuts through an area, or holds no area a snapshot
 *             can take;
 * EMFILE      the caller has no descriptor left.
 * Areas of other kinds in the range are skipped and counted, not refused:
 * a checkpoint restores those itself. With every refusal the source is
 * unchanged (write-protected PTEs aside, as for a cherrypick) and no
 * descriptor is created.
 *
 * A cherrypick from a snapshot follows the rules above with the snapshot's
 * areas as the source's, except that commit accounting (VM_ACCOUNT) is not
 * compared: a snapshot commits no memory of its own, since it can never
 * write. A snapshot needs no parking; its areas never change.
 */

#endif /* _UAPI_VMA_CHERRYPICK_H */
