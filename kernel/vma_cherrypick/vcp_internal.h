/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the module's units share: the kernel functions resolved at load, and
 * the checks a cherrypick and a snapshot both make. vcp_main.c defines them,
 * vcp_snapshot.c is the other user.
 */
#ifndef _VCP_INTERNAL_H
#define _VCP_INTERNAL_H

#include <linux/fs.h>
#include <linux/mm_types.h>
#include <linux/sched.h>

#include "vcp_compat.h"

/*
 * Unexported kernel functions, resolved once at load (see README.md). They
 * are called through vcp_sealed_call.S, never through these pointers.
 */
struct vcp_syms {
	void *anon_vma_fork;
	void *unlink_anon_vmas;
	void *copy_page_range;
	void *pidfd_get_task;
	void *ptrace_may_access;
	void *flush_tlb_mm_range;
	void *walk_page_range;
	void *mm_alloc;
	void *vm_area_dup;
	void *vm_area_free;
#if VCP_V7
	void *tlb_gather_mmu;
	void *tlb_finish_mmu;
	void *zap_vma_range_batched;
#endif
#ifdef CONFIG_KSM
	atomic_long_t *ksm_zero_pages;	/* data: the global KSM counter */
#endif
};
extern struct vcp_syms vcp_sym;

/* The vcp_sealed_call.S aliases, one per entry of vcp_syms.h. */
struct mm_walk_ops;
struct mmu_gather;
struct zap_details;
#define VCP_FN(ret, name, ...) ret vcp_call_##name(void *fn, __VA_ARGS__);
#define VCP_FN_INTERNAL VCP_FN
#define VCP_FN0(ret, name) ret vcp_call_##name(void *fn);
#include "vcp_syms.h"
#undef VCP_FN
#undef VCP_FN_INTERNAL
#undef VCP_FN0

#define VCP_CALL(name, ...) vcp_call_##name(vcp_sym.name, ##__VA_ARGS__)

/* Checks and helpers both ioctls use (vcp_main.c). */
int vcp_check_range(u64 start, u64 len);
struct task_struct *vcp_get_task(int pidfd);
struct mm_struct *vcp_task_mm(struct task_struct *task);
bool vcp_mm_is_parked(struct mm_struct *mm);
int vcp_check_source_mm(struct mm_struct *mm);
int vcp_check_kind(struct vm_area_struct *vma);
int vcp_lock_vmas(struct mm_struct *mm, unsigned long start, unsigned long end);
void vcp_account_ksm_zero(struct vm_area_struct *src, struct vm_area_struct *dst);
unsigned long vcp_anon_count(struct mm_struct *mm);
unsigned long vcp_swap_count(struct mm_struct *mm);

/*
 * The caller's argument structure, pinned for writing before anything
 * changes, so that results can always be written back: a call never
 * reports a failure after it changed something, nor success with results
 * it could not deliver.
 */
struct vcp_out {
	unsigned long addr;
	int nr;
	struct page *pages[2];
};

int vcp_out_pin(struct vcp_out *out, void __user *uarg, size_t size);
void vcp_out_write(struct vcp_out *out, const void *data, size_t size);
void vcp_out_unpin(struct vcp_out *out);

/* Snapshots (vcp_snapshot.c). */
long vcp_ioctl_snapshot(struct file *file, void __user *uarg);
struct mm_struct *vcp_snapshot_mm(int fd);

#endif /* _VCP_INTERNAL_H */
