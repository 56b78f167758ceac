/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The code tclone's twin plugin runs its system calls at, in the process
 * and in its twin (twin.c). The plugin copies it, with its data, into the
 * zero padding at the end of the process's vDSO, where nothing of the
 * process's ever runs, and runs the clone at its first instruction. What
 * follows the call runs only if CRIU dies while the thread is here (the
 * plugin puts its registers back otherwise), and makes that harmless:
 *  - in the process (the clone returned a pid or failed, and the parent
 *    flag is set), it puts back the process's signal mask and every
 *    register as they were when CRIU stopped it, and jumps back to where
 *    it was: the process goes on as if nothing had happened;
 *  - in the twin (the clone returned 0), it names the twin "tclone-twin"
 *    and exits: the twin never runs the process's code.
 * The plugin's other call in the process (its userfaultfd, for write
 * tracking) runs at twin_tramp_uffd, which closes what the call made and
 * puts the process back whatever the call returned: a 0 there is no twin.
 * The twin's parking runs here too (twin_tramp_park): the plugin points
 * the twin at it once the twin is traced and dies with CRIU, and the twin
 * makes itself harmless with its own system calls, one after another,
 * instead of one ptrace round trip each (see park_begin() in twin.c). It stops
 * once, at an int3, for the plugin to take its lifeline; let go, it
 * closes its own copy and waits in pause() for SIGKILL. Nothing else ever
 * runs it: a twin that runs untraced comes out of the clone at the exit.
 * Everything is addressed relative to rip, so the copy runs wherever it
 * lands.
 */
/* Offsets in struct user_regs_struct (sys/user.h). */
#define R15	0
#define R14	8
#define R13	16
#define R12	24
#define RBP	32
#define RBX	40
#define R11	48
#define R10	56
#define R9	64
#define R8	72
#define RAX	80
#define RCX	88
#define RDX	96
#define RSI	104
#define RDI	112
#define RIP	128
#define RFLAGS	144
#define RSP	152

	.section .note.GNU-stack,"",@progbits
	.text
	.globl	twin_tramp_start, twin_tramp_end
	.globl	twin_tramp_parent, twin_tramp_mask, twin_tramp_regs, twin_tramp_name, twin_tramp_park, twin_tramp_park_stop
	.globl	twin_tramp_uffd
	/* Not for any other object: references stay PC-relative. */
	.hidden	twin_tramp_start, twin_tramp_end
	.hidden	twin_tramp_parent, twin_tramp_mask, twin_tramp_regs, twin_tramp_name, twin_tramp_park, twin_tramp_park_stop
	.hidden	twin_tramp_uffd

/*
 * A parking step: the call whose number and arguments are loaded, with
 * the step's number in bl; a failure stops at the int3 with -errno in
 * rax, which the plugin reports.
 */
	.macro	step n
	movb	$\n, %bl
	syscall
	testq	%rax, %rax
	js	8f
	.endm

twin_tramp_start:
	syscall
	test	%rax, %rax
	jz	1f
	cmpb	$1, twin_tramp_parent(%rip)
	jne	1f
2:	/* The process: its mask first (on its own stack, below the red zone). */
	movq	twin_tramp_regs+RSP(%rip), %rsp
	subq	$256, %rsp
	movl	$14, %eax			/* rt_sigprocmask */
	movl	$2, %edi			/* SIG_SETMASK */
	leaq	twin_tramp_mask(%rip), %rsi
	xorl	%edx, %edx
	movl	$8, %r10d
	syscall
	pushq	twin_tramp_regs+RFLAGS(%rip)
	popfq
	movq	twin_tramp_regs+RAX(%rip), %rax
	movq	twin_tramp_regs+RBX(%rip), %rbx
	movq	twin_tramp_regs+RCX(%rip), %rcx
	movq	twin_tramp_regs+RDX(%rip), %rdx
	movq	twin_tramp_regs+RSI(%rip), %rsi
	movq	twin_tramp_regs+RDI(%rip), %rdi
	movq	twin_tramp_regs+RBP(%rip), %rbp
	movq	twin_tramp_regs+R8(%rip), %r8
	movq	twin_tramp_regs+R9(%rip), %r9
	movq	twin_tramp_regs+R10(%rip), %r10
	movq	twin_tramp_regs+R11(%rip), %r11
	movq	twin_tramp_regs+R12(%rip), %r12
	movq	twin_tramp_regs+R13(%rip), %r13
	movq	twin_tramp_regs+R14(%rip), %r14
	movq	twin_tramp_regs+R15(%rip), %r15
	movq	twin_tramp_regs+RSP(%rip), %rsp
	jmpq	*twin_tramp_regs+RIP(%rip)
1:	/* The twin. */
	movl	$157, %eax			/* prctl */
	movl	$15, %edi			/* PR_SET_NAME */
	leaq	twin_tramp_name(%rip), %rsi
	syscall
	movl	$60, %eax			/* exit */
	xorl	%edi, %edi
	syscall
	ud2

/*
 * The process's userfaultfd (make_uffd() in twin.c): the call, the close
 * of the descriptor it made, and back. The plugin takes the descriptor at
 * the call's exit and lets the thread on through the close: a CRIU that
 * dies anywhere from the call on leaves no descriptor in the process.
 */
twin_tramp_uffd:
	syscall
	testq	%rax, %rax
	js	2b
	movq	%rax, %rdi
	movl	$3, %eax			/* close */
	syscall
	jmp	2b

twin_tramp_park:
	/* Its name, and no descriptor of the process's (a table of its own). */
	movl	$157, %eax			/* prctl */
	movl	$15, %edi			/* PR_SET_NAME */
	leaq	twin_tramp_name(%rip), %rsi
	step	1
	movl	$436, %eax			/* close_range */
	xorl	%edi, %edi
	movl	$-1, %esi			/* ~0U */
	movl	$2, %edx			/* CLOSE_RANGE_UNSHARE */
	step	2
	/* Out of the process's session and group: no job control or group signal reaches it. */
	movl	$112, %eax			/* setsid */
	step	3
	/*
	 * A root and working directory of its own, working in the root: while
	 * the twin shared the process's, the process's execve() of a
	 * set-user-ID program would run without its owner's rights
	 * (LSM_UNSAFE_SHARE), and the twin would keep the process's working
	 * directory, and its mount, in use.
	 */
	movl	$272, %eax			/* unshare */
	movl	$0x200, %edi			/* CLONE_FS */
	step	4
	movl	$80, %eax			/* chdir */
	leaq	twin_tramp_root(%rip), %rdi
	step	5
	/* A page of its own, outside every area of the process, for pipe2's answer. */
	movl	$9, %eax			/* mmap */
	xorl	%edi, %edi
	movl	$4096, %esi
	movl	$3, %edx			/* PROT_READ | PROT_WRITE */
	movl	$0x22, %r10d			/* MAP_PRIVATE | MAP_ANONYMOUS */
	orq	$-1, %r8
	xorl	%r9d, %r9d
	step	6
	movq	%rax, %r13
	movl	$293, %eax			/* pipe2 */
	movq	%r13, %rdi
	movl	$0x80000, %esi			/* O_CLOEXEC */
	step	7
	movslq	(%r13), %r14			/* the read end */
	movslq	4(%r13), %r15			/* the write end: the lifeline */
	movl	$11, %eax			/* munmap */
	movq	%r13, %rdi
	movl	$4096, %esi
	step	8
	xorl	%eax, %eax
8:
twin_tramp_park_stop:
	int3					/* the plugin takes r14 and r15 */
	movl	$3, %eax			/* close */
	movq	%r15, %rdi
	syscall
	/* Nothing but SIGKILL ends it; should pause() return, it exits. */
	movl	$34, %eax			/* pause */
	syscall
	jmp	1b

	.balign	8
twin_tramp_parent:
	.quad	0
twin_tramp_mask:
	.quad	0
/* struct user_regs_struct's order, filled by the plugin. */
twin_tramp_regs:
	.fill	27, 8, 0
twin_tramp_name:
	.asciz	"tclone-twin"
twin_tramp_root:
	.asciz	"/"
twin_tramp_end:
