/* SPDX-License-Identifier: GPL-2.0 */
/* Kernel version switches shared by the module's units. */
#ifndef _VCP_COMPAT_H
#define _VCP_COMPAT_H

#include <linux/version.h>

/*
 * From 7.0 zap_page_range_single() lost its zap_details argument (and was
 * renamed zap_vma_range()); the variant that still takes one needs an
 * mmu_gather, whose helpers are not exported either. 7.0 also moved
 * anon_vma_fork() and unlink_anon_vmas() into mm/internal.h, and mm->flags
 * behind mm_flags_test().
 */
#define VCP_V7 (LINUX_VERSION_CODE >= KERNEL_VERSION(7, 0, 0))

#endif /* _VCP_COMPAT_H */
