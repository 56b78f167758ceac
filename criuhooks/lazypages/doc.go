// Package lazypages is tclone's lazy-pages daemon: it lets a sibling run as
// soon as `criu restore --lazy-pages` has rebuilt its tasks, and gives the
// tasks their memory from the dump's page images while they run, on demand
// and in the background. One daemon serves every sibling restored from one
// dump, one restore connection each.
//
// # The protocol (criu/uffd.c, CRIU 4.x)
//
// A restore with --lazy-pages connects to lazy-pages.socket in its work
// directory before it restores anything (and fails if nobody listens). Each
// task, from its own process, just before it enters the restorer, opens a
// userfaultfd (O_NONBLOCK, with the FORK, REMAP, REMOVE and UNMAP events) and
// sends its pid in the images as an int32, then one byte carrying the
// userfaultfd in SCM_RIGHTS; a zombie sends only its negated pid. The
// restorer registers every VMA that may be lazy, whole, in MISSING mode and
// closes its own copy of the descriptor. When every task is restored, CRIU
// sends 0x52535446 ("ReSTore Finished") and lets the tasks run; it expects no
// answer. Faults can come at any time; the daemon copies ahead of faults only
// after restore-finished, since before it an area may not be registered yet.
//
// # Which pages are lazy, in a dump made without --lazy-pages
//
// tclone dumps without --lazy-pages, because a lazy dump keeps the source
// frozen until a page server has sent every page. That is no obstacle: CRIU
// marks every page of a lazily restorable VMA PE_LAZY in every dump
// ("pages that can be lazily restored are always marked as such",
// ppb_xfer_flags in criu/page-xfer.c), and a plain dump adds PE_PRESENT,
// with the data in the local pages image. `restore --lazy-pages` skips
// exactly the PE_LAZY entries, present or not (restore_priv_vma_content in
// criu/mem.c), and registers exactly the VMAs those pages can be in. So the
// plain dump already is what a lazy restore wants: no rewritten pagemap is
// needed, per sibling or otherwise. A VMA may be lazy when it is private and
// anonymous, not locked, not hugetlb, and not the vdso, vvar or vsyscall
// page (vma_entry_can_be_lazy); the page each thread's stack pointer is in
// is kept eager by the dump (is_stack). A dump made with --lazy-pages has PE_LAZY pages without
// PE_PRESENT, which this daemon refuses: their data is not in the images.
// (A 256 MiB test process dumps 257 MiB of lazy pages in 106 spans; the
// rest, a few stack pages and file-backed memory, CRIU restores as usual.)
//
// # Serving a task
//
// For each task the daemon keeps the set of pages it still misses (spans of
// addresses with the offset of their data in the pages image, cut at VMA
// boundaries, since one UFFDIO_COPY cannot cross one) and one goroutine that
// alone touches the userfaultfd and the set. A fault gets its page with
// UFFDIO_COPY, or the zero page where the dump had none (memory never
// touched, stack grown into); background copies continue from the last
// fault, in chunks that grow from 64 KiB to 4 MiB while the task does not
// fault. Events: FORK gives the child's userfaultfd and a copy of the set,
// REMAP moves spans, REMOVE (MADV_DONTNEED) and UNMAP drop them. The kernel
// fails a copy with EAGAIN while an event is queued and unread, and the
// goroutine reads events before it copies again, so the set always matches
// the task. Unlike CRIU's daemon, a REMOVEd range stays registered: CRIU
// unregisters it, which splits the VMA and makes a later mremap of the whole
// area fail with EFAULT where the source's succeeds. When a task's set is
// empty its userfaultfd is closed, which unregisters its areas; a sibling is
// complete when all of its tasks, and the children they forked while
// filling, are.
//
// # Memory is never wrong
//
// When the last reference to a userfaultfd is dropped, the kernel
// unregisters its areas and wakes the faults waiting there; from then on a
// missing page of private anonymous memory reads as zeros. A daemon that
// dies, however it dies, would leave its siblings running on zeros where the
// source had data.
//
// The guard prevents it. It is a process made with clone(CLONE_FILES) and no
// exec (exec would unshare the table), so it holds the daemon's very
// descriptor table: every userfaultfd the daemon holds, receives, or has in
// flight on one of its sockets is held by the guard at the same instant, with
// no window. When the daemon dies, even of SIGKILL, the table survives in
// the guard, the areas stay registered, and a faulting task waits (killably)
// instead of reading zeros. The guard watches the daemon's pidfd, and when it
// becomes readable it kills every task it was armed with, then the senders of
// every message left unread on an armed connection and of every restore left
// unaccepted on an armed listener (SO_PASSCRED names them), waits until they
// are gone, and only then exits, dropping the last references.
//
// The daemon arms a task with its pidfd after reading the task's pid and
// before reading its userfaultfd, so at every instant a task at risk is
// either armed or still unread on an armed connection. A task is disarmed
// only when its sibling is complete. A sibling that fails, or is still
// filling when the daemon closes, is killed before any of its userfaultfds
// is closed. Children forked while filling are not known by pid; killing the
// root of the tree kills them when the root is the init of its PID
// namespace, which a tclone sibling always is. A dead guard is replaced and
// armed again; if it cannot be, every sibling still filling is failed.
//
// What remains is a SIGKILL of both the daemon and its guard at once. The
// guard is out of the daemon's session and process group and blocks every
// signal but SIGKILL, so a signal to the daemon's group does not take both;
// it also asks for an oom_score_adj of -1000, out of the OOM killer's reach,
// which takes CAP_SYS_RESOURCE.
//
// A sibling that is still filling must not be dumped (forked): CRIU dumps
// only present pages, so the missing ones would be left out. Filling tells,
// from the task's own smaps.
//
// # Costs
//
// Each task gets its own copy of its pages: memory that tasks of the source
// shared copy-on-write (a fork without exec) is shared after a plain restore
// but not after a lazy one. Filled memory is in 4 KiB pages.
package lazypages
