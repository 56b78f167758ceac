/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The unexported kernel functions vma_cherrypick calls, each with the
 * prototype it calls it with. Included by vcp_main.c (which declares the
 * vcp_call_* trampolines from it) and by vcp_protocheck.c (which checks each
 * prototype against the kernel's own declaration at build time).
 *
 * VCP_FN(ret, name, params...): declared in the kernel's headers, checked.
 * VCP_FN0(ret, name): the same for a function without parameters.
 * VCP_FN_INTERNAL(...): declared only in mm/internal.h, which kernel headers
 * do not ship; the VM suite compares it with the running kernel's BTF.
 * Every entry needs its alias in vcp_sealed_call.S and its slot in vcp_sym.
 * No include guard: each includer defines the three macros and reads the list.
 */
#if VCP_V7
VCP_FN_INTERNAL(int, anon_vma_fork, struct vm_area_struct *, struct vm_area_struct *)
VCP_FN_INTERNAL(void, unlink_anon_vmas, struct vm_area_struct *)
VCP_FN_INTERNAL(void, zap_vma_range_batched, struct mmu_gather *,
		struct vm_area_struct *, unsigned long, unsigned long,
		struct zap_details *)
VCP_FN(void, tlb_gather_mmu, struct mmu_gather *, struct mm_struct *)
VCP_FN(void, tlb_finish_mmu, struct mmu_gather *)
#else
VCP_FN(int, anon_vma_fork, struct vm_area_struct *, struct vm_area_struct *)
VCP_FN(void, unlink_anon_vmas, struct vm_area_struct *)
#endif
VCP_FN(int, copy_page_range, struct vm_area_struct *, struct vm_area_struct *)
VCP_FN(struct task_struct *, pidfd_get_task, int, unsigned int *)
VCP_FN(bool, ptrace_may_access, struct task_struct *, unsigned int)
VCP_FN(void, flush_tlb_mm_range, struct mm_struct *, unsigned long,
       unsigned long, unsigned int, bool)
VCP_FN(int, walk_page_range, struct mm_struct *, unsigned long, unsigned long,
       const struct mm_walk_ops *, void *)
VCP_FN(unsigned long, kallsyms_lookup_name, const char *)
VCP_FN0(struct mm_struct *, mm_alloc)
VCP_FN(struct vm_area_struct *, vm_area_dup, struct vm_area_struct *)
VCP_FN(void, vm_area_free, struct vm_area_struct *)
