/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vcp_sealed_call(fn, a1..a5): call the kernel function fn with up to five
 * arguments, without an indirect call. Each vcp_call_* alias is declared in
 * C with fn's exact prototype (plus fn first), so arguments and the return
 * value pass through the registers exactly as for a direct call.
 *
 * The unexported functions this module uses are only ever called directly
 * inside the kernel, so objtool "seals" them: their ENDBR64 is replaced, and
 * on a CPU that enforces IBT an indirect call to them faults. IBT polices
 * indirect CALL and JMP only, so this jumps by pushing fn and returning to
 * it; fn then returns straight to our caller. The "ret" is a jump, not a
 * function return, so it is annotated to stay a plain ret (no return thunk),
 * and the unwind hint tells objtool the pushed address is a return address.
 */
#include <linux/linkage.h>
#include <asm/nospec-branch.h>
#include <asm/unwind_hints.h>

	.text
SYM_FUNC_START(vcp_sealed_call)
	mov	%rdi, %r11
	mov	%rsi, %rdi
	mov	%rdx, %rsi
	mov	%rcx, %rdx
	mov	%r8, %rcx
	mov	%r9, %r8
	push	%r11
	/* fn is on top, our caller's return address below it. */
	UNWIND_HINT_FUNC
	ANNOTATE_UNRET_SAFE
	ret
SYM_FUNC_END(vcp_sealed_call)

SYM_FUNC_ALIAS(vcp_call_kallsyms_lookup_name, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_anon_vma_fork, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_copy_page_range, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_pidfd_get_task, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_ptrace_may_access, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_flush_tlb_mm_range, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_tlb_gather_mmu, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_tlb_finish_mmu, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_zap_vma_range_batched, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_unlink_anon_vmas, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_walk_page_range, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_mm_alloc, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_vm_area_dup, vcp_sealed_call)
SYM_FUNC_ALIAS(vcp_call_vm_area_free, vcp_sealed_call)
