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

struct vcp_version {
	__u32 abi_version;	/* out: VCP_ABI_VERSION */
	__u32 args_size;	/* out: sizeof(struct vcp_cherrypick) */
	__u64 features;		/* out: VCP_FEATURE_* */
};

struct vcp_cherrypick {
	__s32 src_pidfd;	/* in: pidfd of the stopped source process */
	__s32 dst_pidfd;	/* in: pidfd of the destination process */
	__u64 start;		/* in: page-aligned start, same in both */
	__u64 len;		/* in: page-aligned length, > 0 */
	__u64 flags;		/* in: must be 0 */
	__u64 areas;		/* out: number of areas processed */
	__u64 anon_pages;	/* out: resident anonymous base pages now shared */
	__u64 swap_entries;	/* out: swapped-out anonymous pages now shared */
};

#define VCP_IOC_MAGIC 0xE4
#define VCP_IOC_VERSION		_IOR(VCP_IOC_MAGIC, 0x00, struct vcp_version)
#define VCP_IOC_CHERRYPICK	_IOWR(VCP_IOC_MAGIC, 0x01, struct vcp_cherrypick)

/*
 * VCP_IOC_CHERRYPICK returns 0, or -1 with errno set to exactly one of these.
 * Each refusal has its own errno so the caller can tell them apart without
 * parsing logs. Nothing has changed in either process when any of them is
 * returned, except where noted.
 *
 * EINVAL      malformed request: unaligned start or len, len == 0, the range
 *             wraps or leaves user space, or flags != 0.
 * EFAULT      the argument structure could not be read or written.
 * EPERM       the caller lacks CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE in the
 *             initial user namespace.
 * EBADF       a pidfd is not an open file descriptor, or not a pidfd.
 * ESRCH       a pidfd's process has exited (or is exiting and has no memory).
 * EACCES      ptrace_may_access(PTRACE_MODE_ATTACH_REALCREDS) fails for the
 *             source or the destination.
 * ELOOP       source and destination share one address space.
 * EBUSY       a thread of the source (or another process sharing its memory)
 *             is neither stopped (SIGSTOP, ptrace-stop) nor frozen (cgroup
 *             freezer).
 * EOPNOTSUPP  an area of the source in the range is shared (VM_SHARED), I/O
 *             or PFN-mapped (VM_IO, VM_PFNMAP, VM_MIXEDMAP), hugetlb, excluded
 *             from fork (MADV_DONTFORK, MADV_WIPEONFORK), registered with
 *             userfaultfd, or a special mapping (vDSO and the like).
 * ENXIO       the layouts differ: the range holds no area of the source,
 *             it cuts through an area of either process, an area of one has
 *             no twin with the same bounds in the other, twins differ in
 *             protection, in kind (anonymous or file) or in file offset, or
 *             the destination's twin is of a kind EOPNOTSUPP lists.
 * EEXIST      the destination already has anonymous memory (an anon_vma) or
 *             page tables of its own in an area of the range.
 * EINTR       a fatal signal arrived while waiting for a memory map lock.
 * ENOMEM      out of memory while copying page tables. The destination areas
 *             processed so far have been emptied again; they stay linked to
 *             the source's anon_vma, so unmap and recreate them before a
 *             retry (a retry on them returns EEXIST).
 */

#endif /* _UAPI_VMA_CHERRYPICK_H */
