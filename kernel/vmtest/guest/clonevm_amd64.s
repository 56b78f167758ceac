#include "textflag.h"

// func cloneVMPause(flags, stack uintptr) uintptr
// Returns the child's pid (or -errno) in the parent. The child runs on the
// given stack without ever using it: pause() in a loop until it is killed.
TEXT ·cloneVMPause(SB),NOSPLIT,$0-24
	MOVQ	flags+0(FP), DI
	MOVQ	stack+8(FP), SI
	MOVQ	$0, DX		// parent_tid
	MOVQ	$0, R10		// child_tid
	MOVQ	$0, R8		// tls
	MOVQ	$56, AX		// SYS_clone
	SYSCALL
	CMPQ	AX, $0
	JNE	parent
child:
	MOVQ	$34, AX		// SYS_pause
	SYSCALL
	JMP	child
parent:
	MOVQ	AX, ret+16(FP)
	RET
