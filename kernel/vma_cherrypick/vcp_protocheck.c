// SPDX-License-Identifier: GPL-2.0
/*
 * Build-time check that every kernel function vma_cherrypick calls through
 * kallsyms (vcp_syms.h) has the prototype the module calls it with. This
 * unit emits no code. It is compiled as if it were not a module because x86
 * hides some declarations, flush_tlb_mm_range() among them, from modules;
 * they are what is checked here, not what is called.
 */
#undef MODULE
#include <linux/kallsyms.h>
#include <linux/ksm.h>
#include <linux/mm.h>
#include <linux/pagewalk.h>
#include <linux/pid.h>
#include <linux/ptrace.h>
#include <linux/rmap.h>
#include <linux/sched/mm.h>
#include <linux/version.h>
#include <asm/tlbflush.h>

#include "vcp_compat.h"

#if VCP_V7
#include <asm/tlb.h>
#endif

#define VCP_FN(ret, name, ...)						\
	static_assert(__builtin_types_compatible_p(typeof(name),	\
						   ret(__VA_ARGS__)),	\
		      "the kernel's " #name "() differs from the prototype vma_cherrypick calls");
#define VCP_FN_INTERNAL(ret, name, ...)
#define VCP_FN0(ret, name) VCP_FN(ret, name, void)
#include "vcp_syms.h"

#ifdef CONFIG_KSM
static_assert(__builtin_types_compatible_p(typeof(ksm_zero_pages), atomic_long_t),
	      "the kernel's ksm_zero_pages is not the atomic_long_t vma_cherrypick updates");
#endif
