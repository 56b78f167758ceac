// SPDX-License-Identifier: GPL-2.0
/*
 * vma_cherrypick: share a stopped process's anonymous pages with another
 * process, copy-on-write, the way fork() shares them with a child.
 *
 * The heavy lifting is the kernel's own fork machinery: anon_vma_fork() links
 * the destination area into the source's anon_vma tree, and copy_page_range()
 * copies the page tables, write-protecting both sides and taking the rmap and
 * RSS references exactly as dup_mmap() does. What this module adds is what
 * fork gets for free: the destination is a live process whose areas already
 * exist, so it checks that both layouts match and that the destination is
 * empty, takes both mmap locks in a fixed order, and flushes the source's TLB.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/kprobes.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/mmap_lock.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/pid.h>
#include <linux/ptrace.h>
#include <linux/rmap.h>
#include <linux/sched/coredump.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/uaccess.h>
#include <linux/userfaultfd_k.h>
#include <linux/utsname.h>
#include <linux/version.h>
#include <asm/tlbflush.h>

#include "vma_cherrypick.h"

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
#error "vma_cherrypick supports Linux 6.12 and later"
#endif

/*
 * From 7.0 zap_page_range_single() lost its zap_details argument (and was
 * renamed zap_vma_range()); the variant that still takes one needs an
 * mmu_gather, whose helpers are not exported either.
 */
#define VCP_ZAP_BATCHED (LINUX_VERSION_CODE >= KERNEL_VERSION(7, 0, 0))

#if VCP_ZAP_BATCHED
/*
 * struct mmu_gather comes from <asm/tlb.h>, whose inline tlb_flush() uses
 * flush_tlb_mm_range(), which x86 hides from modules. Nothing here calls
 * tlb_flush(), so declaring it only lets the header compile; the module has
 * no reference to it (modpost would reject one).
 */
void flush_tlb_mm_range(struct mm_struct *mm, unsigned long start,
			unsigned long end, unsigned int stride_shift,
			bool freed_tables);
#include <asm/tlb.h>
#endif

/*
 * Unexported kernel functions, resolved once at load (see README.md). They
 * are called through vcp_sealed_call.S, never through these pointers.
 */
static struct {
	void *anon_vma_fork;
	void *copy_page_range;
	void *pidfd_get_task;
	void *ptrace_may_access;
	void *flush_tlb_mm_range;
#if VCP_ZAP_BATCHED
	void *tlb_gather_mmu;
	void *tlb_finish_mmu;
	void *zap_vma_range_batched;
#endif
} vcp_sym;

/* vcp_sealed_call.S aliases, each with its target's exact prototype. */
int vcp_call_anon_vma_fork(void *fn, struct vm_area_struct *vma,
			   struct vm_area_struct *pvma);
int vcp_call_copy_page_range(void *fn, struct vm_area_struct *dst_vma,
			     struct vm_area_struct *src_vma);
struct task_struct *vcp_call_pidfd_get_task(void *fn, int pidfd,
					    unsigned int *flags);
bool vcp_call_ptrace_may_access(void *fn, struct task_struct *task,
				unsigned int mode);
void vcp_call_flush_tlb_mm_range(void *fn, struct mm_struct *mm,
				 unsigned long start, unsigned long end,
				 unsigned int stride_shift, bool freed_tables);
#if VCP_ZAP_BATCHED
void vcp_call_tlb_gather_mmu(void *fn, struct mmu_gather *tlb,
			     struct mm_struct *mm);
void vcp_call_tlb_finish_mmu(void *fn, struct mmu_gather *tlb);
void vcp_call_zap_vma_range_batched(void *fn, struct mmu_gather *tlb,
				    struct vm_area_struct *vma,
				    unsigned long addr, unsigned long size,
				    struct zap_details *details);
#endif

#define VCP_CALL(name, ...) vcp_call_##name(vcp_sym.name, ##__VA_ARGS__)

struct vcp_symbol {
	const char *name;
	void **slot;
};

#define VCP_SYMBOL(fn) { #fn, &vcp_sym.fn }
static const struct vcp_symbol vcp_symbols[] = {
	VCP_SYMBOL(anon_vma_fork),
	VCP_SYMBOL(copy_page_range),
	VCP_SYMBOL(pidfd_get_task),
	VCP_SYMBOL(ptrace_may_access),
	VCP_SYMBOL(flush_tlb_mm_range),
#if VCP_ZAP_BATCHED
	VCP_SYMBOL(tlb_gather_mmu),
	VCP_SYMBOL(tlb_finish_mmu),
	VCP_SYMBOL(zap_vma_range_batched),
#endif
};

/*
 * kallsyms_lookup_name() itself is unexported since 5.7; a kprobe on it
 * reports its address without calling anything.
 */
static void *vcp_lookup_name;
unsigned long vcp_call_kallsyms_lookup_name(void *fn, const char *name);

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

/*
 * Zaps a destination area. With keep_anon, CoW'd (anonymous) pages stay and
 * only page-cache pages go: those are the source file's pages, which
 * copy_page_range() mapped but which must refault from the destination's own
 * file.
 */
static void vcp_zap(struct vm_area_struct *vma, bool keep_anon)
{
	unsigned long size = vma->vm_end - vma->vm_start;
#if VCP_ZAP_BATCHED
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

static struct task_struct *vcp_get_task(int pidfd)
{
	unsigned int flags;

	if (pidfd < 0)
		return ERR_PTR(-EBADF);
	return VCP_CALL(pidfd_get_task, pidfd, &flags);
}

/* A thread that cannot run user code until someone lets it. */
static bool vcp_thread_is_parked(struct task_struct *t)
{
	if (READ_ONCE(t->exit_state))
		return true;
	if (task_is_stopped_or_traced(t))
		return true;
	/* cgroup v1 freezer and the system freezer */
	if (READ_ONCE(t->__state) & TASK_FROZEN)
		return true;
	/* cgroup v2 freezer; racy by design, the caller keeps it frozen */
	return data_race(!!t->frozen);
}

/*
 * Every thread of every process using @mm must be parked: a running thread
 * could write through a stale TLB entry into a page that is being shared.
 * Processes outside the source's thread group can share its mm (CLONE_VM
 * without CLONE_THREAD), hence the walk over all processes.
 */
static bool vcp_mm_is_parked(struct mm_struct *mm)
{
	struct task_struct *p, *t;
	bool parked = true;

	rcu_read_lock();
	for_each_process(p) {
		if (p->flags & PF_KTHREAD)
			continue;
		for_each_thread(p, t) {
			if (READ_ONCE(t->mm) != mm)
				continue;
			if (!vcp_thread_is_parked(t)) {
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
static int vcp_check_kind(struct vm_area_struct *vma)
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

#define VCP_MATCH_FLAGS (VM_READ | VM_WRITE | VM_EXEC | VM_GROWSDOWN)

static int vcp_check_twins(struct vm_area_struct *src,
			   struct vm_area_struct *dst)
{
	if (!dst || dst->vm_start != src->vm_start || dst->vm_end != src->vm_end)
		return -ENXIO;
	if ((src->vm_flags ^ dst->vm_flags) & VCP_MATCH_FLAGS)
		return -ENXIO;
	if (vma_is_anonymous(src) != vma_is_anonymous(dst))
		return -ENXIO;
	if (!vma_is_anonymous(src) &&
	    (!dst->vm_file || src->vm_pgoff != dst->vm_pgoff))
		return -ENXIO;
	return vcp_check_kind(dst) ? -ENXIO : 0;
}

/*
 * True if the destination has a page table or huge mapping in a PMD slot that
 * lies wholly inside @vma. copy_page_range() writes a source THP straight
 * into the destination PMD, so a page table there would be leaked. Slots at
 * the area's edges may hold page tables of neighbouring areas; a THP cannot
 * sit in those, and their entries inside @vma are zapped before copying.
 */
static bool vcp_has_page_tables(struct vm_area_struct *vma)
{
	struct mm_struct *mm = vma->vm_mm;
	unsigned long addr = ALIGN(vma->vm_start, PMD_SIZE);

	for (; addr + PMD_SIZE <= vma->vm_end && addr >= vma->vm_start;
	     addr += PMD_SIZE) {
		pgd_t *pgd = pgd_offset(mm, addr);
		p4d_t *p4d;
		pud_t *pud;
		pmd_t *pmd;

		if (pgd_none(READ_ONCE(*pgd)))
			continue;
		p4d = p4d_offset(pgd, addr);
		if (p4d_none(READ_ONCE(*p4d)))
			continue;
		pud = pud_offset(p4d, addr);
		if (pud_none(READ_ONCE(*pud)))
			continue;
		if (pud_leaf(READ_ONCE(*pud)))
			return true;
		pmd = pmd_offset(pud, addr);
		if (!pmd_none(pmdp_get(pmd)))
			return true;
		cond_resched();
	}
	return false;
}

static int vcp_check_empty(struct vm_area_struct *dst)
{
	if (dst->anon_vma)
		return -EEXIST;
	if (vma_is_anonymous(dst) && vcp_has_page_tables(dst))
		return -EEXIST;
	return 0;
}

/*
 * Validates every area of the range in both processes before anything is
 * changed, so a refusal leaves both untouched.
 */
static int vcp_validate(struct mm_struct *src_mm, struct mm_struct *dst_mm,
			unsigned long start, unsigned long end, u64 *areas)
{
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
		err = vcp_check_twins(src, vma_lookup(dst_mm, src->vm_start));
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
		err = vcp_check_empty(dst);
		if (err)
			return err;
	}
	if (!n)
		return -ENXIO;	/* nothing to share is a caller's mistake */
	*areas = n;
	return 0;
}

static int vcp_share_area(struct vm_area_struct *src, struct vm_area_struct *dst)
{
	struct address_space *mapping = NULL;
	unsigned int noreclaim;
	int err;

	vma_start_write(src);
	vma_start_write(dst);

	/*
	 * The destination has no anonymous pages (checked), but may map the
	 * zero page or file pages it read; copy_page_range() expects empty
	 * entries, so drop those. They refault unchanged.
	 */
	vcp_zap(dst, false);

	if (!src->anon_vma)
		return 0;	/* never written: nothing anonymous to share */

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

	if (!vma_is_anonymous(src)) {
		/*
		 * copy_page_range() also maps the source file's page-cache
		 * pages, and the destination area is not in that file's
		 * i_mmap tree, so rmap could not find those mappings until
		 * vcp_zap() removes them. Holding i_mmap_rwsem for write keeps
		 * every rmap walker (reclaim, migration, truncation) of that
		 * file out meanwhile. Reclaim would take the same lock, so
		 * allocations in between must not enter it.
		 */
		mapping = src->vm_file->f_mapping;
		i_mmap_lock_write(mapping);
		noreclaim = memalloc_noreclaim_save();
	}
	err = VCP_CALL(copy_page_range, dst, src);
	if (mapping) {
		vcp_zap(dst, true);
		memalloc_noreclaim_restore(noreclaim);
		i_mmap_unlock_write(mapping);
	}
	return err;
}

static unsigned long vcp_anon_count(struct mm_struct *mm)
{
	return get_mm_counter_sum(mm, MM_ANONPAGES);
}

static unsigned long vcp_swap_count(struct mm_struct *mm)
{
	return get_mm_counter_sum(mm, MM_SWAPENTS);
}

static int vcp_share_range(struct mm_struct *src_mm, struct mm_struct *dst_mm,
			   struct vcp_cherrypick *args)
{
	unsigned long start = args->start, end = args->start + args->len;
	unsigned long anon_before, swap_before;
	struct vm_area_struct *src, *dst;
	VMA_ITERATOR(vmi, src_mm, start);
	int err;

	if (!vcp_mm_is_parked(src_mm))
		return -EBUSY;
	err = vcp_validate(src_mm, dst_mm, start, end, &args->areas);
	if (err)
		return err;

	anon_before = vcp_anon_count(dst_mm);
	swap_before = vcp_swap_count(dst_mm);
	err = 0;
	for_each_vma_range(vmi, src, end) {
		dst = vma_lookup(dst_mm, src->vm_start);
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
		/* Empty what was filled; see ENOMEM in the header. */
		vma_iter_set(&vmi, start);
		for_each_vma_range(vmi, src, end)
			vcp_zap(vma_lookup(dst_mm, src->vm_start), false);
		return err;
	}
	args->anon_pages = vcp_anon_count(dst_mm) - anon_before;
	args->swap_entries = vcp_swap_count(dst_mm) - swap_before;
	return 0;
}

/*
 * Both mmap locks are taken for write, lower mm address first, so two
 * concurrent calls on the same pair in opposite directions cannot deadlock.
 */
static int vcp_lock_pair(struct mm_struct *a, struct mm_struct *b)
{
	struct mm_struct *first = a < b ? a : b, *second = a < b ? b : a;

	if (mmap_write_lock_killable(first))
		return -EINTR;
	mmap_write_lock_nested(second, SINGLE_DEPTH_NESTING);
	return 0;
}

static void vcp_unlock_pair(struct mm_struct *a, struct mm_struct *b)
{
	mmap_write_unlock(a);
	mmap_write_unlock(b);
}

static int vcp_check_args(const struct vcp_cherrypick *args)
{
	if (args->flags || !args->len)
		return -EINVAL;
	if (!PAGE_ALIGNED(args->start) || !PAGE_ALIGNED(args->len))
		return -EINVAL;
	if (args->start + args->len < args->start ||
	    args->start + args->len > TASK_SIZE_MAX)
		return -EINVAL;
	return 0;
}

static int vcp_cherrypick(struct vcp_cherrypick *args)
{
	struct task_struct *src_task, *dst_task;
	struct mm_struct *src_mm = NULL, *dst_mm = NULL;
	int err;

	err = vcp_check_args(args);
	if (err)
		return err;
	if (!checkpoint_restore_ns_capable(&init_user_ns))
		return -EPERM;

	src_task = vcp_get_task(args->src_pidfd);
	if (IS_ERR(src_task))
		return PTR_ERR(src_task);
	dst_task = vcp_get_task(args->dst_pidfd);
	if (IS_ERR(dst_task)) {
		err = PTR_ERR(dst_task);
		goto put_src_task;
	}

	err = -EACCES;
	if (!VCP_CALL(ptrace_may_access, src_task, PTRACE_MODE_ATTACH_REALCREDS) ||
	    !VCP_CALL(ptrace_may_access, dst_task, PTRACE_MODE_ATTACH_REALCREDS))
		goto put_tasks;

	err = -ESRCH;
	src_mm = get_task_mm(src_task);
	dst_mm = get_task_mm(dst_task);
	if (!src_mm || !dst_mm)
		goto put_mms;
	err = -ELOOP;
	if (src_mm == dst_mm)
		goto put_mms;

	err = vcp_lock_pair(src_mm, dst_mm);
	if (err)
		goto put_mms;
	err = vcp_share_range(src_mm, dst_mm, args);
	vcp_unlock_pair(src_mm, dst_mm);

put_mms:
	if (src_mm)
		mmput(src_mm);
	if (dst_mm)
		mmput(dst_mm);
put_tasks:
	put_task_struct(dst_task);
put_src_task:
	put_task_struct(src_task);
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
				    VCP_FEATURE_THP,
		};

		return copy_to_user(uarg, &v, sizeof(v)) ? -EFAULT : 0;
	}
	case VCP_IOC_CHERRYPICK: {
		struct vcp_cherrypick args;
		int err;

		if (copy_from_user(&args, uarg, sizeof(args)))
			return -EFAULT;
		args.areas = args.anon_pages = args.swap_entries = 0;
		err = vcp_cherrypick(&args);
		if (err)
			return err;
		return copy_to_user(uarg, &args, sizeof(args)) ? -EFAULT : 0;
	}
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
