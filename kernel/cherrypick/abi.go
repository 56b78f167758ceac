// Package cherrypick drives the vma_cherrypick kernel module: it shares a
// stopped process's anonymous memory with another process, copy-on-write, as
// fork() shares it with a child. The ABI mirrors
// kernel/vma_cherrypick/vma_cherrypick.h; a unit test keeps the two in step.
package cherrypick

import "unsafe"

// DevicePath is where the module's misc device appears.
const DevicePath = "/dev/vma_cherrypick"

// ABIVersion is the module ABI these bindings speak.
const ABIVersion = 1

// Features are capability bits the module reports.
type Features uint64

const (
	// FeatureAnon: private anonymous areas (heap, stacks, MAP_ANONYMOUS).
	FeatureAnon Features = 1 << 0
	// FeatureFilePrivate: private file mappings; only their copied-on-write
	// pages are shared, file pages refault from the destination's file.
	FeatureFilePrivate Features = 1 << 1
	// FeatureTHP: PMD-mapped transparent huge pages are shared unsplit.
	FeatureTHP Features = 1 << 2
	// FeatureSnapshot: Device.Snapshot, and snapshots as the source of a
	// cherrypick (Device.CherrypickFrom).
	FeatureSnapshot Features = 1 << 3
)

// flagSrcSnapshot is VCP_CHERRYPICK_SRC_SNAPSHOT: the source descriptor of
// a cherrypick is a snapshot.
const flagSrcSnapshot = 1 << 0

// versionArgs is struct vcp_version.
type versionArgs struct {
	ABIVersion uint32
	ArgsSize   uint32
	Features   uint64
}

// cherrypickArgs is struct vcp_cherrypick.
type cherrypickArgs struct {
	SrcPidfd    int32
	DstPidfd    int32
	Start       uint64
	Len         uint64
	Flags       uint64
	Areas       uint64
	AnonPages   uint64
	SwapEntries uint64
}

// snapshotArgs is struct vcp_snapshot.
type snapshotArgs struct {
	SrcPidfd    int32
	Flags       uint32
	Start       uint64
	Len         uint64
	Fd          int32
	Reserved    uint32
	Areas       uint64
	Skipped     uint64
	AnonPages   uint64
	SwapEntries uint64
}

const (
	iocMagic = 0xE4

	iocWrite = 1
	iocRead  = 2

	iocNRShift   = 0
	iocTypeShift = 8
	iocSizeShift = 16
	iocDirShift  = 30
)

// ioc is the kernel's _IOC() from include/uapi/asm-generic/ioctl.h.
func ioc(dir, typ, nr, size uintptr) uintptr {
	return dir<<iocDirShift | size<<iocSizeShift | typ<<iocTypeShift | nr<<iocNRShift
}

var (
	iocVersion    = ioc(iocRead, iocMagic, 0x00, unsafe.Sizeof(versionArgs{}))
	iocCherrypick = ioc(iocRead|iocWrite, iocMagic, 0x01, unsafe.Sizeof(cherrypickArgs{}))
	iocSnapshot   = ioc(iocRead|iocWrite, iocMagic, 0x02, unsafe.Sizeof(snapshotArgs{}))
)
