package criuhooks

import (
	"errors"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
)

// CaptureHooks are the dump-side callbacks of a fork capture.
//
// CRIU calls post-dump after every image is written and before it lets the
// tree run again: the tree is still frozen and seized, so whatever OnPostDump
// records (the root filesystem) belongs to the same instant as the memory.
type CaptureHooks struct {
	criu.NoNotify
	// OnPreDump runs before CRIU freezes anything, with the PID of the criu
	// process doing the dump.
	OnPreDump  func(criuPid int) error
	OnPostDump func() error

	// PostDumpAt is when CRIU reached post-dump: the end of the dump proper.
	PostDumpAt time.Time
	// PostDumpDone is when OnPostDump returned.
	PostDumpDone time.Time
	// ResumedAt is when CRIU said the tree runs again (its dump-resumed
	// notification, which tclone's build of CRIU sends before it finishes
	// what the tree need not wait for); zero from a CRIU without it.
	ResumedAt time.Time

	criuPid int
}

// CriuStarted implements CriuStarted.
func (h *CaptureHooks) CriuStarted(pid int) { h.criuPid = pid }

// PreDump implements criu.Notify.
func (h *CaptureHooks) PreDump() error {
	if h.OnPreDump == nil {
		return nil
	}
	if h.criuPid == 0 {
		return errors.New("pre-dump came before the criu process of the call was known")
	}
	return h.OnPreDump(h.criuPid)
}

// DumpResumed records when CRIU let the tree run again.
func (h *CaptureHooks) DumpResumed() error {
	h.ResumedAt = time.Now()
	return nil
}

// PostDump implements criu.Notify.
func (h *CaptureHooks) PostDump() error {
	h.PostDumpAt = time.Now()
	defer func() { h.PostDumpDone = time.Now() }()
	if h.OnPostDump == nil {
		return nil
	}
	return h.OnPostDump()
}
