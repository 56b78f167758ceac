// SPDX-License-Identifier: GPL-2.0
/*
 * vma_cherrypick: share a stopped process's anonymous pages with another
 * stopped process, copy-on-write, the way fork() shares them with a child.
 *
 * The heavy lifting is the kernel's own fork machinery: anon_vma_fork() links
 * the destination area into the source's anon_vma tree, and copy_page_range()
 * copies the page tables, write-protecting both sides and taking the rmap and
 * RSS references exactly as dup_mmap() does. What this module adds is what
 * fork gets for free: the destination is a live process whose areas already
 * exist, so it checks that both layouts match and that the destination is
 * empty, takes both mmap locks without ever blocking while holding one, and
 * flushes the source's TLB. See README.md for the contract and the locking.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/highmem.h>
#include <linux/kallsyms.h>
#include <linux/kprobes.h>
#include <linux/ksm.h>
#include <linux/memcontrol.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/mmap_lock.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/pagewalk.h>
#include <linux/pid.h>
#include <linux/pkeys.h>
#include <linux/ptrace.h>
#include <linux/rmap.h>
#include <linux/sched/coredump.h>
#include <linux/sched/jobctl.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/userfaultfd_k.h>
#include <linux/utsname.h>
#include <linux/version.h>
#include <asm/tlbflush.h>

#include "vcp_compat.h"
#include "vcp_internal.h"
#include "vma_cherrypick.h"

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
#error "vma_cherrypick supports Linux 6.12 and later"
#endif

#if VCP_V7
/*
 * struct mmu_gather comes from <asm/tlb.h>, whose inline tlb_flush() uses
 * flush_tlb_mm_range(), which x86 declares only outside modules. Nothing
 * here calls tlb_flush(); the declaration only lets the header compile, and
 * modpost would reject any reference to the symbol.
 */
void flush_tlb_mm_range(struct mm_struct *mm, unsigned long start,
			unsigned long end, unsigned int stride_shift,
			bool freed_tables);
#include <asm/tlb.h>
#define vcp_mm_flag(mm, bit) mm_flags_test(bit, mm)
#else
#define vcp_mm_flag(mm, bit) test_bit(bit, &(mm)->flags)
#endif

/*
 * The series this module has been reviewed against and passes the VM suite
 * on (kernel/README.md). Any other series is refused at load unless the
 * administrator sets allow_untested_kernel=1: the module calls internal
 * functions whose behaviour, not only whose prototype, may change.
 */
static const unsigned int vcp_tested_series[] = {
#ifndef VCP_PRETEND_UNTESTED	/* set by the VM suite to test the refusal */
	KERNEL_VERSION(6, 12, 0),
	KERNEL_VERSION(7, 3, 0),
#endif
	0,
};

static bool allow_untested_kernel;
module_param(allow_untested_kernel, bool, 0444);
MODULE_PARM_DESC(allow_untested_kernel,
		 "Load on a kernel series the module was not tested on (default: refuse)");

/*
 * The user ABI is fixed-width with no padding; the Go bindings' test reads
 * the header and checks the same numbers.
 */
static_assert(sizeof(struct vcp_version) == 16);
static_assert(sizeof(struct vcp_cherrypick) == 56);
static_assert(offsetof(struct vcp_cherrypick, start) == 8);
static_assert(offsetof(struct vcp_cherrypick, areas) == 32);
static_assert(offsetof(struct vcp_cherrypick, swap_entries) == 48);

/* Unexported kernel functions, resolved once at load (see vcp_internal.h). */
struct vcp_syms vcp_sym;

/*
 * The same list as text, one "ret name(params)" per line, readable in
 * /sys/module/vma_cherrypick/parameters/prototypes: the VM suite compares
 * each with the running kernel's BTF, which also covers the functions no
 * kernel header declares.
 */
#define VCP_FN(ret, name, ...) #ret " " #name "(" #__VA_ARGS__ ")\n"
#define VCP_FN_INTERNAL VCP_FN
#define VCP_FN0(ret, name) #ret " " #name "()\n"
static const char vcp_prototypes[] =
#include "vcp_syms.h"
	;
#undef VCP_FN
#undef VCP_FN_INTERNAL
#undef VCP_FN0

static int vcp_get_prototypes(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%s", vcp_prototypes);
}

static const struct kernel_param_ops vcp_prototypes_ops = {
	.get = vcp_get_prototypes,
};
module_param_cb(prototypes, &vcp_prototypes_ops, NULL, 0444);
MODULE_PARM_DESC(prototypes, "The internal kernel functions this module calls, with the prototypes it calls them with");

struct vcp_symbol {
	const char *name;
	void **slot;
};

#define VCP_SYMBOL(fn) { #fn, (void **)&vcp_sym.fn }
static const struct vcp_symbol vcp_symbols[] = {
	VCP_SYMBOL(anon_vma_fork),
	VCP_SYMBOL(unlink_anon_vmas),
	VCP_SYMBOL(copy_page_range),
	VCP_SYMBOL(pidfd_get_task),
	VCP_SYMBOL(ptrace_may_access),
	VCP_SYMBOL(flush_tlb_mm_range),
	VCP_SYMBOL(walk_page_range),
	VCP_SYMBOL(mm_alloc),
	VCP_SYMBOL(vm_area_dup),
	VCP_SYMBOL(vm_area_free),
#if VCP_V7
	VCP_SYMBOL(tlb_gather_mmu),
	VCP_SYMBOL(tlb_finish_mmu),
	VCP_SYMBOL(zap_vma_range_batched),
#endif
#ifdef CONFIG_KSM
	VCP_SYMBOL(ksm_zero_pages),
#endif
};

/*
 * kallsyms_lookup_name() itself is unexported since 5.7; a kprobe on it
 * reports its address without calling anything.
 */
static void *vcp_lookup_name;

static int vcp_find_lookup_name(void)
{
	struct kprobe kp = { .symbol_name = "kallsyms_lookup_name" };
	int err;

	err = register_kprobe(&kp);
	if (err) {
		pr_err("cannot resolve kallsyms_lookup_name through a kprobe (%d); the kernel needs CONFIG_KPROBES and CONFIG_KALLSYMS_ALL\n",
		       err);
		return err;
	}
	vcp_lookup_name = kp.addr;
	unregister_kprobe(&kp);
	return 0;
}

static int vcp_resolve_symbols(void)
{
	size_t i;
	int err;

	err = vcp_find_lookup_name();
	if (err)
		return err;
	for (i = 0; i < ARRAY_SIZE(vcp_symbols); i++) {
		unsigned long addr = vcp_call_kallsyms_lookup_name(vcp_lookup_name,
								   vcp_symbols[i].name);

		if (!addr) {
			pr_err("kernel symbol %s not found; this kernel (%s) is not supported, see README.md for the supported versions\n",
			       vcp_symbols[i].name, init_utsname()->release);
			return -ENOENT;
		}
		*vcp_symbols[i].slot = (void *)addr;
	}
	return 0;
}

static int vcp_check_series(void)
{
	unsigned int series = LINUX_VERSION_CODE & ~0xffU;
	size_t i;

	for (i = 0; vcp_tested_series[i]; i++)
		if (vcp_tested_series[i] == series)
			return 0;
	if (allow_untested_kernel) {
		pr_notice("kernel series %u.%u (%s) is untested; loading because allow_untested_kernel=1\n",
			  series >> 16, (series >> 8) & 0xff, init_utsname()->release);
		return 0;
	}
	pr_err("kernel series %u.%u (%s) is not one this module was tested on (see README.md); load with allow_untested_kernel=1 to override\n",
	       series >> 16, (series >> 8) & 0xff, init_utsname()->release);
	return -EOPNOTSUPP;
}

/*
 * Zaps an area. With keep_anon, CoW'd (anonymous) pages, swap entries and
 * markers stay and only page-cache (and other non-anonymous) pages go.
 */
static void vcp_zap(struct vm_area_struct *vma, bool keep_anon)
{
	unsigned long size = vma->vm_end - vma->vm_start;
#if VCP_V7
	struct zap_details details = { .skip_cows = true };
	struct mmu_gather tlb;

	if (!keep_anon) {
		zap_vma_range(vma, vma->vm_start, size);
		return;
	}
	VCP_CALL(tlb_gather_mmu, &tlb, vma->vm_mm);
	VCP_CALL(zap_vma_range_batched, &tlb, vma, vma->vm_start, size, &details);
	VCP_CALL(tlb_finish_mmu, &tlb);
#else
	struct zap_details details = { .even_cows = false };

	zap_page_range_single(vma, vma->vm_start, size,
			      keep_anon ? &details : NULL);
#endif
}

struct task_struct *vcp_get_task(int pidfd)
{
	unsigned int flags;

	if (pidfd < 0)
		return ERR_PTR(-EBADF);
	return VCP_CALL(pidfd_get_task, pidfd, &flags);
}

/*
 * The permission check and the mm it is about, under exec_update_lock as
 * mm_access() does them: without it, a task that execs a setuid program
 * between the two would be checked as its old image and used as its new.
 */
struct mm_struct *vcp_task_mm(struct task_struct *task)
{
	struct mm_struct *mm;

	if (down_read_killable(&task->signal->exec_update_lock))
		return ERR_PTR(-EINTR);
	mm = get_task_mm(task);
	if (!mm) {
		mm = ERR_PTR(-ESRCH);
	} else if (!VCP_CALL(ptrace_may_access, task, PTRACE_MODE_ATTACH_REALCREDS)) {
		mmput(mm);
		mm = ERR_PTR(-EACCES);
	}
	up_read(&task->signal->exec_update_lock);
	return mm;
}

/*
 * A thread that cannot run user code until someone lets it. Every test here
 * is cleared synchronously by whatever lets the thread go (SIGCONT, the
 * tracer, a thaw), so a thread let go before the check is never counted as
 * parked. t->frozen alone would not do: a stopped thread has it set too,
 * and a thread clears it only once it runs again, some time after SIGCONT
 * or a thaw has made it runnable.
 */
static bool vcp_thread_is_parked(struct task_struct *t)
{
	unsigned long jobctl = READ_ONCE(t->jobctl);

	if (READ_ONCE(t->exit_state))
		return true;
	/* SIGSTOP (group stop) or ptrace stop */
	if (jobctl & (JOBCTL_STOPPED | JOBCTL_TRACED))
		return true;
	/* cgroup v1 freezer and the system freezer: asleep in the refrigerator */
	if (READ_ONCE(t->__state) & TASK_FROZEN)
		return true;
	/* cgroup v2 freezer: told to freeze, and asleep in its freezer trap */
	return (jobctl & JOBCTL_TRAP_FREEZE) && data_race(!!t->frozen);
}

/*
 * Every thread of every process using @mm must be parked: a running thread
 * could write through a stale TLB entry into a page that is being shared,
 * fault a page table into an area just found empty, or (the hardware walker
 * needs no lock) read a page that is mapped only for the duration of the
 * call. Processes outside the thread group can share the mm (CLONE_VM
 * without CLONE_THREAD), hence the walk over all processes; a kernel thread
 * that borrowed the mm (kthread_use_mm) is never parked.
 */
bool vcp_mm_is_parked(struct mm_struct *mm)
{
	struct task_struct *p, *t;
	bool parked = true;

	rcu_read_lock();
	for_each_process(p) {
		for_each_thread(p, t) {
			if (READ_ONCE(t->mm) != mm)
				continue;
			if ((t->flags & PF_KTHREAD) || !vcp_thread_is_parked(t)) {
				parked = false;
				goto out;
			}
		}
	}
out:
	rcu_read_unlock();
	return parked;
}

/* The area kinds this module can share; everything else is EOPNOTSUPP. */
int vcp_check_kind(struct vm_area_struct *vma)
{
	if (vma->vm_flags & (VM_SHARED | VM_MAYSHARE | VM_IO | VM_PFNMAP |
			     VM_MIXEDMAP | VM_DONTCOPY | VM_WIPEONFORK))
		return -EOPNOTSUPP;
	if (is_vm_hugetlb_page(vma) || userfaultfd_armed(vma))
		return -EOPNOTSUPP;
	/* vDSO and other special mappings have vm_ops but no file. */
	if (!vma_is_anonymous(vma) && !vma->vm_file)
		return -EOPNOTSUPP;
	return 0;
}

/*
 * Flags twins must agree on: protection, stack growth, shadow stack (its
 * pages have their own PTE encoding), mlock mode (a locked destination must
 * not receive swap entries, an unlocked one must not keep locked pages
 * resident) and commit accounting (VM_ACCOUNT: MAP_NORESERVE or not).
 */
#define VCP_MATCH_FLAGS (VM_READ | VM_WRITE | VM_EXEC | VM_GROWSDOWN | \
			 VM_SHADOW_STACK | VM_LOCKED | VM_LOCKONFAULT | VM_ACCOUNT)

static int vcp_check_twins(struct vm_area_struct *src,
			   struct vm_area_struct *dst, vm_flags_t match)
{
	if (!dst || dst->vm_start != src->vm_start || dst->vm_end != src->vm_end)
		return -ENXIO;
	if ((src->vm_flags ^ dst->vm_flags) & match)
		return -ENXIO;
	/* A page readable through one key must not appear under another. */
	if (vma_pkey(src) != vma_pkey(dst))
		return -ENXIO;
	if (vma_is_anonymous(src) != vma_is_anonymous(dst))
		return -ENXIO;
	if (!vma_is_anonymous(src) &&
	    (!dst->vm_file || src->vm_pgoff != dst->vm_pgoff))
		return -ENXIO;
	return vcp_check_kind(dst) ? -ENXIO : 0;
}

/*
 * The PMD entry covering @addr in @mm, or NULL if there is none. Sets *leaf
 * if a PUD-level mapping covers it instead.
 */
static pmd_t *vcp_pmd_of(struct mm_struct *mm, unsigned long addr, bool *leaf)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud;

	*leaf = false;
	if (pgd_none(READ_ONCE(*pgd)))
		return NULL;
	p4d = p4d_offset(pgd, addr);
	if (p4d_none(READ_ONCE(*p4d)))
		return NULL;
	pud = pud_offset(p4d, addr);
	if (pud_none(READ_ONCE(*pud)))
		return NULL;
	if (pud_leaf(READ_ONCE(*pud))) {
		*leaf = true;
		return NULL;
	}
	return pmd_offset(pud, addr);
}

/* A PMD-level mapping (THP, or its swap or migration entry), not a table. */
static bool vcp_pmd_is_huge(pmd_t pmd)
{
	return !pmd_none(pmd) && (pmd_leaf(pmd) || !pmd_present(pmd));
}

/*
 * True if copy_page_range() would write a source PMD-level mapping over a
 * page table of the destination's, which would leak that table. Everything
 * else the empty destination may have (zero-page or huge-zero-page entries
 * it read, empty page tables left by an earlier failed call) is zapped or
 * reused. Checked with both areas write-locked: no fault can add a table,
 * and the source's huge mappings can only be split meanwhile (by rmap),
 * never made, which makes the copy only safer.
 */
static bool vcp_table_under_huge(struct vm_area_struct *src,
				 struct vm_area_struct *dst)
{
	unsigned long addr = ALIGN(src->vm_start, PMD_SIZE);
	bool leaf;

	for (; addr + PMD_SIZE <= src->vm_end && addr >= src->vm_start;
	     addr += PMD_SIZE) {
		pmd_t *pmd = vcp_pmd_of(src->vm_mm, addr, &leaf);

		if (!pmd || !vcp_pmd_is_huge(pmdp_get(pmd)))
			continue;
		pmd = vcp_pmd_of(dst->vm_mm, addr, &leaf);
		if (leaf)
			return true;
		if (pmd && !pmd_none(pmdp_get(pmd)) && !pmd_leaf(pmdp_get(pmd)))
			return true;
		cond_resched();
	}
	return false;
}

static int vcp_check_empty(struct vm_area_struct *src, struct vm_area_struct *dst)
{
	if (dst->anon_vma)
		return -EEXIST;
	if (vma_is_anonymous(dst) && vcp_table_under_huge(src, dst))
		return -EEXIST;
	return 0;
}

/*
 * Write-locks every area of @mm that meets [start, end), so that page faults
 * under the per-VMA lock (which do not take the mmap lock) stay out of them
 * from here until the mmap write lock is released.
 */
int vcp_lock_vmas(struct mm_struct *mm, unsigned long start,
		  unsigned long end)
{
	struct vm_area_struct *vma;
	VMA_ITERATOR(vmi, mm, start);

	for_each_vma_range(vmi, vma, end) {
#if VCP_V7
		if (vma_start_write_killable(vma))
			return -EINTR;
#else
		vma_start_write(vma);
#endif
	}
	return 0;
}

/*
 * Validates every area of the range in both processes before anything is
 * changed, so a refusal leaves both untouched. Runs with both mmap locks and
 * every area's VMA lock held for write, so nothing it checks can change
 * before the areas are shared.
 */
static int vcp_validate(struct mm_struct *src_mm, struct mm_struct *dst_mm,
			unsigned long start, unsigned long end, bool snapshot,
			u64 *areas)
{
	/* A snapshot commits no memory (see the header): not compared. */
	vm_flags_t match = snapshot ? VCP_MATCH_FLAGS & ~VM_ACCOUNT : VCP_MATCH_FLAGS;
	struct vm_area_struct *src, *dst;
	VMA_ITERATOR(src_vmi, src_mm, start);
	VMA_ITERATOR(dst_vmi, dst_mm, start);
	u64 n = 0;
	int err;

	/* Kind first: an unsupported area is refused whatever the other side. */
	for_each_vma_range(src_vmi, src, end) {
		err = vcp_check_kind(src);
		if (err)
			return err;
	}
	vma_iter_set(&src_vmi, start);
	for_each_vma_range(src_vmi, src, end) {
		if (src->vm_start < start || src->vm_end > end)
			return -ENXIO;
		err = vcp_check_twins(src, vma_lookup(dst_mm, src->vm_start), match);
		if (err)
			return err;
		n++;
	}
	/* Every destination area in the range must have a source twin. */
	for_each_vma_range(dst_vmi, dst, end) {
		if (dst->vm_start < start || dst->vm_end > end)
			return -ENXIO;
		src = vma_lookup(src_mm, dst->vm_start);
		if (!src || src->vm_end != dst->vm_end)
			return -ENXIO;
		err = vcp_check_empty(src, dst);
		if (err)
			return err;
	}
	if (!n)
		return -ENXIO;	/* nothing to share is a caller's mistake */
	*areas = n;
	return 0;
}

#ifdef CONFIG_KSM
static int vcp_count_ksm_zero(pte_t *pte, unsigned long addr,
			      unsigned long next, struct mm_walk *walk)
{
	pte_t entry = ptep_get(pte);

	if (pte_present(entry) && is_ksm_zero_pte(entry))
		(*(unsigned long *)walk->private)++;
	return 0;
}

/*
 * KSM zero pages are PTE-level. Without this, the walk would split every
 * huge PMD it meets to look at its PTEs: the destination's shared THPs.
 */
static int vcp_skip_huge_pmd(pmd_t *pmd, unsigned long addr,
			     unsigned long next, struct mm_walk *walk)
{
	pmd_t entry = pmdp_get(pmd);

	if (vcp_pmd_is_huge(entry))
		walk->action = ACTION_CONTINUE;
	return 0;
}

static const struct mm_walk_ops vcp_ksm_zero_ops = {
	.pmd_entry = vcp_skip_huge_pmd,
	.pte_entry = vcp_count_ksm_zero,
	.walk_lock = PGWALK_WRLOCK_VERIFY,
};

/*
 * KSM maps its zero page with a marked PTE and counts those per mm and
 * globally; unmapping one decrements both. copy_page_range() copies the
 * marked PTEs, so count what the destination got, as ksm_fork() does for a
 * child, or its unmap would drive both counters negative.
 */
void vcp_account_ksm_zero(struct vm_area_struct *src,
			  struct vm_area_struct *dst)
{
	unsigned long n = 0;

	if (!atomic_long_read(&src->vm_mm->ksm_zero_pages))
		return;
	VCP_CALL(walk_page_range, dst->vm_mm, dst->vm_start, dst->vm_end,
		 &vcp_ksm_zero_ops, &n);
	if (!n)
		return;
	atomic_long_add(n, &dst->vm_mm->ksm_zero_pages);
	atomic_long_add(n, vcp_sym.ksm_zero_pages);
}
#else
void vcp_account_ksm_zero(struct vm_area_struct *src,
			  struct vm_area_struct *dst)
{
}
#endif

static int vcp_share_area(struct vm_area_struct *src, struct vm_area_struct *dst)
{
	int err;

	/*
	 * The destination has no anonymous pages (checked), but may map the
	 * zero page or file pages it read; copy_page_range() expects empty
	 * entries, so drop those. They refault unchanged.
	 */
	vcp_zap(dst, false);

	if (!src->anon_vma)
		return 0;	/* never written: nothing anonymous to share */

	/*
	 * copy_page_range() would also map the source file's page-cache pages
	 * into the destination, whose area is not in that file's i_mmap tree:
	 * rmap (truncation, reclaim, migration) could not find them, and the
	 * destination could read a file it never opened. Unmapping them from
	 * the source first leaves only anonymous pages to copy; the source
	 * refaults them from the page cache. Nothing can map them again before
	 * the copy: faults need the locks held here.
	 */
	if (!vma_is_anonymous(src))
		vcp_zap(src, true);

	/*
	 * Anonymous rmap finds a page's address from its index and vm_pgoff,
	 * so the twin must use the source's base, as a forked child does.
	 * The destination is anonymous with no anon_vma here, so nothing
	 * indexed by its old base exists.
	 */
	if (vma_is_anonymous(dst))
		dst->vm_pgoff = src->vm_pgoff;

	err = VCP_CALL(anon_vma_fork, dst, src);
	if (err)
		return err;
	err = VCP_CALL(copy_page_range, dst, src);
	/* Even after a failure: the rollback's zap uncounts what was copied. */
	vcp_account_ksm_zero(src, dst);
	return err;
}

/*
 * Puts a destination area back as it was before the call: no pages, no
 * anon_vma, its old vm_pgoff. The zap must come first, while rmap can still
 * find the pages through the anon_vma.
 */
static void vcp_unshare_area(struct vm_area_struct *dst, unsigned long pgoff)
{
	vcp_zap(dst, false);
	if (dst->anon_vma)
		VCP_CALL(unlink_anon_vmas, dst);
	dst->vm_pgoff = pgoff;
}

unsigned long vcp_anon_count(struct mm_struct *mm)
{
	return get_mm_counter_sum(mm, MM_ANONPAGES);
}

unsigned long vcp_swap_count(struct mm_struct *mm)
{
	return get_mm_counter_sum(mm, MM_SWAPENTS);
}

/* Source properties that rule out sharing; see the header's errnos. */
int vcp_check_source_mm(struct mm_struct *mm)
{
	/* The OOM reaper is tearing it down: its pages may be gone already. */
	if (vcp_mm_flag(mm, MMF_UNSTABLE))
		return -ESRCH;
	/*
	 * Uprobe breakpoints live in the source's CoW'd text pages; shared,
	 * they would trap in a destination that has no uprobe state.
	 */
	if (vcp_mm_flag(mm, MMF_HAS_UPROBES))
		return -EOPNOTSUPP;
	return 0;
}

static int vcp_share_locked(struct mm_struct *src_mm, struct mm_struct *dst_mm,
			    struct vcp_cherrypick *args)
{
	unsigned long start = args->start, end = args->start + args->len;
	unsigned long anon_before, swap_before, *pgoffs;
	struct vm_area_struct *src, *dst;
	VMA_ITERATOR(vmi, src_mm, start);
	u64 n = 0, i;
	int err;

	err = vcp_lock_vmas(src_mm, start, end);
	if (!err)
		err = vcp_lock_vmas(dst_mm, start, end);
	if (err)
		return err;
	if (!vcp_mm_is_parked(src_mm) || !vcp_mm_is_parked(dst_mm))
		return -EBUSY;
	err = vcp_check_source_mm(src_mm);
	if (err)
		return err;
	err = vcp_validate(src_mm, dst_mm, start, end,
			   args->flags & VCP_CHERRYPICK_SRC_SNAPSHOT, &args->areas);
	if (err)
		return err;

	/* For the rollback: allocated before anything changes. */
	pgoffs = kvmalloc_array(args->areas, sizeof(*pgoffs), GFP_KERNEL);
	if (!pgoffs)
		return -ENOMEM;

	anon_before = vcp_anon_count(dst_mm);
	swap_before = vcp_swap_count(dst_mm);
	for_each_vma_range(vmi, src, end) {
		dst = vma_lookup(dst_mm, src->vm_start);
		pgoffs[n++] = dst->vm_pgoff;
		err = vcp_share_area(src, dst);
		if (err)
			break;
		cond_resched();
	}

	/*
	 * copy_page_range() write-protected the source's PTEs; like
	 * dup_mmap(), flush so no CPU keeps a writable translation into a
	 * page that is now shared (the source resumes later).
	 */
	VCP_CALL(flush_tlb_mm_range, src_mm, 0UL, TLB_FLUSH_ALL, 0U, true);

	if (err) {
		/* All or nothing: see ENOMEM in the header. */
		vma_iter_set(&vmi, start);
		for (i = 0; i < n; i++) {
			src = vma_next(&vmi);
			vcp_unshare_area(vma_lookup(dst_mm, src->vm_start), pgoffs[i]);
		}
		args->areas = 0;
	} else {
		args->anon_pages = vcp_anon_count(dst_mm) - anon_before;
		args->swap_entries = vcp_swap_count(dst_mm) - swap_before;
	}
	kvfree(pgoffs);
	return err;
}

static inline bool vcp_mmap_write_trylock(struct mm_struct *mm)
{
	bool locked;

	/* mmap_write_lock_killable() without the wait; there is no helper. */
	__mmap_lock_trace_start_locking(mm, true);
	locked = down_write_trylock(&mm->mmap_lock);
	if (locked)
		mm_lock_seqcount_begin(mm);
	__mmap_lock_trace_acquire_returned(mm, true, locked);
	return locked;
}

/*
 * Takes both mmap locks for write without ever waiting for one while holding
 * the other: wait (killably) for one, then only try the other; if that is
 * busy, let go and wait for the busy one instead. A third party that holds
 * either lock for long (a reader of /proc/PID/mem stuck on a FUSE mapping,
 * say) thus delays the call, which a fatal signal ends, but never leaves the
 * other process's address space locked meanwhile, and two calls on the same
 * pair in opposite directions cannot deadlock.
 */
static int vcp_lock_pair(struct mm_struct *a, struct mm_struct *b)
{
	for (;;) {
		if (mmap_write_lock_killable(a))
			return -EINTR;
		if (vcp_mmap_write_trylock(b))
			return 0;
		mmap_write_unlock(a);
		swap(a, b);
	}
}

static void vcp_unlock_pair(struct mm_struct *a, struct mm_struct *b)
{
	mmap_write_unlock(a);
	mmap_write_unlock(b);
}

/*
 * Under both mmap locks: the page tables and anon_vma chains the call
 * allocates belong to the destination, so they are charged to its memory
 * cgroup, not the caller's (the runtime's).
 */
static int vcp_share_range(struct mm_struct *src_mm, struct mm_struct *dst_mm,
			   struct vcp_cherrypick *args)
{
	struct mem_cgroup *memcg, *old_memcg;
	int err;

	memcg = get_mem_cgroup_from_mm(dst_mm);
	err = vcp_lock_pair(src_mm, dst_mm);
	if (!err) {
		old_memcg = set_active_memcg(memcg);
		err = vcp_share_locked(src_mm, dst_mm, args);
		set_active_memcg(old_memcg);
		vcp_unlock_pair(src_mm, dst_mm);
	}
	mem_cgroup_put(memcg);
	return err;
}

int vcp_check_range(u64 start, u64 len)
{
	if (!len || !PAGE_ALIGNED(start) || !PAGE_ALIGNED(len))
		return -EINVAL;
	if (start + len < start || start + len > TASK_SIZE_MAX)
		return -EINVAL;
	return 0;
}

static int vcp_cherrypick(struct vcp_cherrypick *args)
{
	bool snapshot = args->flags & VCP_CHERRYPICK_SRC_SNAPSHOT;
	struct task_struct *src_task = NULL, *dst_task;
	struct mm_struct *src_mm = NULL, *dst_mm;
	int err;

	if (args->flags & ~VCP_CHERRYPICK_SRC_SNAPSHOT)
		return -EINVAL;
	err = vcp_check_range(args->start, args->len);
	if (err)
		return err;
	if (!checkpoint_restore_ns_capable(&init_user_ns))
		return -EPERM;

	/*
	 * A snapshot needs no check beyond being one: whoever holds its
	 * descriptor was allowed to take it.
	 */
	if (snapshot)
		src_mm = vcp_snapshot_mm(args->src_pidfd);
	else
		src_task = vcp_get_task(args->src_pidfd);
	if (IS_ERR(src_mm))
		return PTR_ERR(src_mm);
	if (IS_ERR(src_task))
		return PTR_ERR(src_task);
	dst_task = vcp_get_task(args->dst_pidfd);
	if (IS_ERR(dst_task)) {
		err = PTR_ERR(dst_task);
		goto put_src;
	}

	if (!snapshot) {
		src_mm = vcp_task_mm(src_task);
		if (IS_ERR(src_mm)) {
			err = PTR_ERR(src_mm);
			src_mm = NULL;
			goto put_dst_task;
		}
	}
	dst_mm = vcp_task_mm(dst_task);
	if (IS_ERR(dst_mm)) {
		err = PTR_ERR(dst_mm);
		goto put_dst_task;
	}

	err = -ELOOP;
	if (src_mm == dst_mm)
		goto put_mms;
	/* Cheap refusals first, without waiting for any lock; repeated later. */
	err = -EBUSY;
	if (!vcp_mm_is_parked(src_mm) || !vcp_mm_is_parked(dst_mm))
		goto put_mms;
	err = vcp_check_source_mm(src_mm);
	if (err)
		goto put_mms;

	err = vcp_share_range(src_mm, dst_mm, args);

put_mms:
	mmput(dst_mm);
put_dst_task:
	put_task_struct(dst_task);
put_src:
	if (src_mm)
		mmput(src_mm);
	if (src_task)
		put_task_struct(src_task);
	return err;
}

int vcp_out_pin(struct vcp_out *out, void __user *uarg, size_t size)
{
	unsigned long addr = (unsigned long)uarg;
	int nr = (offset_in_page(addr) + size + PAGE_SIZE - 1) >> PAGE_SHIFT;
	int got;

	got = pin_user_pages_fast(addr & PAGE_MASK, nr, FOLL_WRITE, out->pages);
	if (got != nr) {
		if (got > 0)
			unpin_user_pages(out->pages, got);
		return -EFAULT;
	}
	out->addr = addr;
	out->nr = nr;
	return 0;
}

void vcp_out_write(struct vcp_out *out, const void *data, size_t size)
{
	size_t off = offset_in_page(out->addr), done = 0;
	int i;

	for (i = 0; i < out->nr && done < size; i++, off = 0) {
		size_t n = min_t(size_t, size - done, PAGE_SIZE - off);

		memcpy_to_page(out->pages[i], off, (const char *)data + done, n);
		done += n;
	}
}

void vcp_out_unpin(struct vcp_out *out)
{
	unpin_user_pages_dirty_lock(out->pages, out->nr, true);
}

static long vcp_ioctl_cherrypick(struct file *file, void __user *uarg)
{
	struct vcp_cherrypick args;
	struct vcp_out out;
	int err;

	/* Changing another process's memory is a write. */
	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	args.areas = args.anon_pages = args.swap_entries = 0;
	if (vcp_out_pin(&out, uarg, sizeof(args)))
		return -EFAULT;
	err = vcp_cherrypick(&args);
	if (!err)
		vcp_out_write(&out, &args, sizeof(args));
	vcp_out_unpin(&out);
	return err;
}

static long vcp_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case VCP_IOC_VERSION: {
		struct vcp_version v = {
			.abi_version = VCP_ABI_VERSION,
			.args_size = sizeof(struct vcp_cherrypick),
			.features = VCP_FEATURE_ANON | VCP_FEATURE_FILE_PRIVATE |
				    VCP_FEATURE_THP | VCP_FEATURE_SNAPSHOT,
		};

		return copy_to_user(uarg, &v, sizeof(v)) ? -EFAULT : 0;
	}
	case VCP_IOC_CHERRYPICK:
		return vcp_ioctl_cherrypick(file, uarg);
	case VCP_IOC_SNAPSHOT:
		return vcp_ioctl_snapshot(file, uarg);
	default:
		return -ENOTTY;
	}
}

static const struct file_operations vcp_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = vcp_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice vcp_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "vma_cherrypick",
	.fops = &vcp_fops,
	.mode = 0600,
};

static int __init vcp_init(void)
{
	int err;

	err = vcp_check_series();
	if (err)
		return err;
	err = vcp_resolve_symbols();
	if (err)
		return err;
	err = misc_register(&vcp_dev);
	if (err) {
		pr_err("cannot register /dev/vma_cherrypick (%d)\n", err);
		return err;
	}
	pr_info("ready (ABI %d)\n", VCP_ABI_VERSION);
	return 0;
}

static void __exit vcp_exit(void)
{
	misc_deregister(&vcp_dev);
}

module_init(vcp_init);
module_exit(vcp_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Copy-on-write sharing of a stopped process's anonymous memory with another process");
