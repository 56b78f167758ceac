// SPDX-License-Identifier: GPL-2.0
/*
 * Snapshots: the private anonymous areas of a stopped process, copied into
 * an address space of their own that a file descriptor holds, the way
 * dup_mmap() copies them into a child's. Taking one costs the page-table
 * copy; the source then runs on, and copy-on-write keeps the snapshot's
 * pages as they were. A snapshot is the source of later cherrypicks
 * (VCP_CHERRYPICK_SRC_SNAPSHOT), so that memory captured inside a short
 * freeze can be shared with destinations made long after it.
 *
 * The address space is a real mm_struct (mm_alloc()) that no task ever
 * runs in: no fault, no mmap, no exec. Only what teardown needs is kept
 * consistent: the area tree and map_count, the anon_vma chains, the page
 * tables and their counters. mmput() then frees it as exit_mmap() frees a
 * process's.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/anon_inodes.h>
#include <linux/file.h>
#include <linux/maple_tree.h>
#include <linux/memcontrol.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/pid.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/uio.h>
#include <asm/tlbflush.h>

#include "vcp_internal.h"
#include "vma_cherrypick.h"

static_assert(sizeof(struct vcp_snapshot) == 64);
static_assert(offsetof(struct vcp_snapshot, fd) == 24);
static_assert(offsetof(struct vcp_snapshot, swap_entries) == 56);

struct vcp_snap {
	struct mm_struct *mm;	/* one mm_users reference */
	pid_t pid;		/* the source, in the taker's PID namespace */
	u64 areas;
};

static int vcp_snap_release(struct inode *inode, struct file *file)
{
	struct vcp_snap *snap = file->private_data;

	mmput(snap->mm);
	kfree(snap);
	return 0;
}

/*
 * What a snapshot holds, for whoever lists the runtime's descriptors
 * (/proc/PID/fdinfo): the pages it maps now, shared or its own since the
 * source changed them.
 */
static void vcp_snap_show_fdinfo(struct seq_file *m, struct file *file)
{
	struct vcp_snap *snap = file->private_data;

	seq_printf(m, "vcp_source_pid:\t%d\n", snap->pid);
	seq_printf(m, "vcp_areas:\t%llu\n", snap->areas);
	seq_printf(m, "vcp_anon_pages:\t%lu\n", vcp_anon_count(snap->mm));
	seq_printf(m, "vcp_swap_entries:\t%lu\n", vcp_swap_count(snap->mm));
}

/* Pages one read pins at a time. */
#define VCP_READ_BATCH 16

/*
 * pread() at an offset that is a virtual address reads the snapshot's
 * memory there, as /proc/PID/mem reads a process's: what a lazy-pages
 * daemon copies into a destination that cannot share the pages (one that
 * has memory of its own in the area already). A page the source never had
 * reads as zeros (the zero page), a swapped-out one is read back in, and an
 * address outside every area fails with EFAULT, or ends a read that began
 * inside one. Protection does not matter: a snapshot holds the contents.
 */
static ssize_t vcp_snap_read_iter(struct kiocb *iocb, struct iov_iter *to)
{
	struct vcp_snap *snap = iocb->ki_filp->private_data;
	struct page *pages[VCP_READ_BATCH];
	loff_t pos = iocb->ki_pos;
	ssize_t done = 0;
	int err = 0;

	while (iov_iter_count(to) && !err) {
		unsigned long addr = pos, first = addr & PAGE_MASK;
		unsigned long nr = min_t(unsigned long, VCP_READ_BATCH,
			DIV_ROUND_UP(offset_in_page(addr) + iov_iter_count(to), PAGE_SIZE));
		long got, i;

		if (pos < 0 || addr >= TASK_SIZE_MAX) {
			err = -EFAULT;
			break;
		}
		nr = min(nr, (TASK_SIZE_MAX - first) >> PAGE_SHIFT);
		if (mmap_read_lock_killable(snap->mm)) {
			err = -EINTR;
			break;
		}
		got = get_user_pages_remote(snap->mm, first, nr, FOLL_FORCE, pages, NULL);
		mmap_read_unlock(snap->mm);
		if (got <= 0) {
			err = got ? got : -EFAULT;
			break;
		}
		for (i = 0; i < got; i++) {
			size_t off = offset_in_page(pos);
			size_t n = min_t(size_t, PAGE_SIZE - off, iov_iter_count(to));
			size_t copied = 0;

			if (!err && n)
				copied = copy_page_to_iter(pages[i], off, n, to);
			put_page(pages[i]);
			done += copied;
			pos += copied;
			if (copied < n)
				err = -EFAULT;
		}
		if (fatal_signal_pending(current))
			err = -EINTR;
		cond_resched();
	}
	if (!done)
		return err;
	iocb->ki_pos = pos;
	return done;
}

static const struct file_operations vcp_snap_fops = {
	.owner = THIS_MODULE,
	.release = vcp_snap_release,
	.show_fdinfo = vcp_snap_show_fdinfo,
	.read_iter = vcp_snap_read_iter,
};

/* The snapshot behind @fd, with a reference the caller puts (mmput). */
struct mm_struct *vcp_snapshot_mm(int fd)
{
	struct mm_struct *mm = ERR_PTR(-EBADF);
	struct vcp_snap *snap;
	struct file *file;

	if (fd < 0)
		return mm;
	file = fget(fd);
	if (!file)
		return mm;
	if (file->f_op == &vcp_snap_fops) {
		snap = file->private_data;
		mmget(snap->mm);
		mm = snap->mm;
	}
	fput(file);
	return mm;
}

/*
 * The areas a snapshot takes: private anonymous memory a checkpoint would
 * otherwise copy page by page. Everything else is left to the checkpoint:
 * file mappings (memfd and tmpfs ones included: they have vm_ops), shared
 * memory, special mappings, and mlocked areas (CRIU restores them eagerly,
 * and a snapshot must not hold locked pages).
 *
 * vma_is_anonymous() is only "no vm_ops": a private mapping of /dev/zero
 * passes it with vm_file set (mmap_zero() in 6.12 calls
 * vma_set_anonymous(), 7.x's mmap_prepare_zero() clears desc->vm_ops;
 * __mmap_region() set vm_file before either). Its pages are anonymous
 * (do_anonymous_page(), anon_vma rmap) and CRIU restores it as anonymous
 * memory, so it is taken, as anonymous memory: vcp_snap_area() leaves its
 * file out of the copy.
 */
static bool vcp_snap_takes(struct vm_area_struct *vma)
{
	return vma_is_anonymous(vma) && !vcp_check_kind(vma) &&
	       !(vma->vm_flags & VM_LOCKED_MASK);
}

/*
 * Copies one source area into @mm, as dup_mmap() copies an area into a
 * child. Once the copy is in the tree a failure leaves it there, consistent
 * (counted in map_count, its pages rmapped), for the caller's mmput().
 */
static int vcp_snap_area(struct mm_struct *mm, struct vm_area_struct *src)
{
	struct vm_area_struct *vma;
	int err;

	vma = VCP_CALL(vm_area_dup, src);
	if (!vma)
		return -ENOMEM;
	vma->vm_mm = mm;
	/*
	 * vm_area_dup() copies vm_file and the file's interval-tree node
	 * (vma->shared) as they are, without get_file() and without inserting
	 * the node: dup_mmap() does both afterwards. The copy is anonymous
	 * memory that no one faults, so it must hold neither: with vm_file
	 * kept, mmput() would fput() a reference it never took and erase a
	 * node from the file's i_mmap tree it is not in (corrupting it for the
	 * source). Only a /dev/zero-like area (no vm_ops, see
	 * vcp_snap_takes()) gets here with a file.
	 */
	vma->vm_file = NULL;
	memset(&vma->shared, 0, sizeof(vma->shared));
#ifdef CONFIG_NUMA
	/* No fault ever happens here, so no policy; none to put either. */
	vma->vm_policy = NULL;
#endif
	vma->vm_userfaultfd_ctx = NULL_VM_UFFD_CTX;
	vma_start_write(vma);
	/* It commits nothing: it can never write (see the header). */
	vm_flags_clear(vma, VM_ACCOUNT);

	err = VCP_CALL(anon_vma_fork, vma, src);	/* unlinks itself on failure */
	if (err)
		goto free;
	{
		MA_STATE(mas, &mm->mm_mt, vma->vm_start, vma->vm_end - 1);

		err = mas_store_gfp(&mas, vma, GFP_KERNEL);
	}
	if (err) {
		VCP_CALL(unlink_anon_vmas, vma);
		goto free;
	}
#if VCP_V7
	vma_mark_attached(vma);
#endif
	mm->map_count++;

	err = VCP_CALL(copy_page_range, vma, src);
	/* Even after a failure: teardown uncounts what was copied. */
	vcp_account_ksm_zero(src, vma);
	return err;

free:
	VCP_CALL(vm_area_free, vma);
	return err;
}

/*
 * Under the source's mmap lock and its areas' locks, with every thread of
 * the source parked, as for a cherrypick: nothing can change the areas or
 * write through a stale TLB entry while their page tables are copied.
 */
static int vcp_snap_take(struct mm_struct *src_mm, struct mm_struct *mm,
			 struct vcp_snapshot *args)
{
	unsigned long start = args->start, end = args->start + args->len;
	struct vm_area_struct *src;
	VMA_ITERATOR(vmi, src_mm, start);
	bool copied = false;
	int err;

	if (mmap_write_lock_killable(src_mm))
		return -EINTR;
	/* Nobody else knows @mm: this cannot wait. */
	mmap_write_lock_nested(mm, SINGLE_DEPTH_NESTING);
	err = vcp_lock_vmas(src_mm, start, end);
	if (err)
		goto unlock;
	err = -EBUSY;
	if (!vcp_mm_is_parked(src_mm))
		goto unlock;
	err = vcp_check_source_mm(src_mm);
	if (err)
		goto unlock;

	/* A range that cuts an area is refused, as a cherrypick refuses it. */
	for_each_vma_range(vmi, src, end) {
		if (src->vm_start < start || src->vm_end > end) {
			err = -ENXIO;
			goto unlock;
		}
	}
	vma_iter_set(&vmi, start);
	for_each_vma_range(vmi, src, end) {
		if (!vcp_snap_takes(src)) {
			args->skipped++;
			continue;
		}
		copied = true;
		err = vcp_snap_area(mm, src);
		if (err)
			break;
		args->areas++;
		cond_resched();
	}
	/*
	 * copy_page_range() write-protected the source's PTEs: flush, as
	 * dup_mmap() does, before the source runs again.
	 */
	if (copied)
		VCP_CALL(flush_tlb_mm_range, src_mm, 0UL, TLB_FLUSH_ALL, 0U, true);
	if (!err && !args->areas)
		err = -ENXIO;
	if (!err) {
		args->anon_pages = vcp_anon_count(mm);
		args->swap_entries = vcp_swap_count(mm);
	}
unlock:
	mmap_write_unlock(mm);
	mmap_write_unlock(src_mm);
	return err;
}

/*
 * A new address space for a snapshot. mm_alloc() makes the caller its
 * owner for memory cgroup purposes; the caller (the runtime) exits long
 * before the snapshot may go, and nothing updates an owner that is not
 * using the mm, so it has none: the rare page a copy must allocate (a source
 * page pinned for DMA) is charged to the root group. Page tables are
 * charged to the source's group (vcp_snapshot()).
 */
static struct mm_struct *vcp_snap_mm_alloc(void)
{
	struct mm_struct *mm = VCP_CALL(mm_alloc);

	if (!mm)
		return NULL;
#ifdef CONFIG_MEMCG
	RCU_INIT_POINTER(mm->owner, NULL);
#endif
	return mm;
}

static int vcp_snapshot(struct vcp_snapshot *args, struct vcp_snap *snap)
{
	struct mem_cgroup *memcg, *old_memcg;
	struct mm_struct *src_mm, *mm;
	struct task_struct *task;
	int err;

	task = vcp_get_task(args->src_pidfd);
	if (IS_ERR(task))
		return PTR_ERR(task);
	snap->pid = task_tgid_vnr(task);
	src_mm = vcp_task_mm(task);
	put_task_struct(task);
	if (IS_ERR(src_mm))
		return PTR_ERR(src_mm);

	/* Cheap refusals first, without waiting for any lock; repeated later. */
	err = -EBUSY;
	if (!vcp_mm_is_parked(src_mm))
		goto put_src;
	err = vcp_check_source_mm(src_mm);
	if (err)
		goto put_src;

	err = -ENOMEM;
	mm = vcp_snap_mm_alloc();
	if (!mm)
		goto put_src;
	memcg = get_mem_cgroup_from_mm(src_mm);
	old_memcg = set_active_memcg(memcg);
	err = vcp_snap_take(src_mm, mm, args);
	set_active_memcg(old_memcg);
	mem_cgroup_put(memcg);
	if (err) {
		mmput(mm);
		goto put_src;
	}
	snap->mm = mm;
	snap->areas = args->areas;
put_src:
	mmput(src_mm);
	return err;
}

long vcp_ioctl_snapshot(struct file *file, void __user *uarg)
{
	struct vcp_snapshot args;
	struct vcp_snap *snap;
	struct vcp_out out;
	struct file *sfile;
	int fd, err;

	/* Taking one write-protects the source's pages: a write. */
	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (args.flags)
		return -EINVAL;
	err = vcp_check_range(args.start, args.len);
	if (err)
		return err;
	if (!checkpoint_restore_ns_capable(&init_user_ns))
		return -EPERM;
	args.fd = -1;
	args.reserved = 0;
	args.areas = args.skipped = args.anon_pages = args.swap_entries = 0;
	if (vcp_out_pin(&out, uarg, sizeof(args)))
		return -EFAULT;

	/* Everything that can fail without undoing a snapshot, first. */
	err = -ENOMEM;
	snap = kzalloc(sizeof(*snap), GFP_KERNEL_ACCOUNT);
	if (!snap)
		goto unpin;
	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0) {
		err = fd;
		goto free_snap;
	}

	err = vcp_snapshot(&args, snap);
	if (err)
		goto put_fd;
	sfile = anon_inode_getfile("[vma_cherrypick-snapshot]", &vcp_snap_fops,
				   snap, O_RDONLY | O_CLOEXEC);
	if (IS_ERR(sfile)) {
		err = PTR_ERR(sfile);
		mmput(snap->mm);
		goto put_fd;
	}
	/* Read with pread(); anonymous files get no positional I/O by default. */
	sfile->f_mode |= FMODE_PREAD;
	args.fd = fd;
	vcp_out_write(&out, &args, sizeof(args));
	fd_install(fd, sfile);
	vcp_out_unpin(&out);
	return 0;

put_fd:
	put_unused_fd(fd);
free_snap:
	kfree(snap);
unpin:
	vcp_out_unpin(&out);
	return err;
}
