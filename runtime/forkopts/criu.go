package forkopts

// Dumped is what a dump asked of CRIU, as plan.json records it: a restore
// of its images must declare the same.
type Dumped struct {
	// TCPEstablished: the dump holds the state of established TCP
	// connections (CRIU's tcp_established), for siblings that keep them.
	TCPEstablished bool `json:"tcp_established"`
	// TCPClose: the dump left established connections alone (CRIU's
	// tcp_close); CRIU then insists on tcp_close at restore too.
	TCPClose  bool `json:"tcp_close,omitempty"`
	FileLocks bool `json:"file_locks"`
	ExtUnixSk bool `json:"ext_unix_sk"`
	ShellJob  bool `json:"shell_job"`
	// GhostLimit is CRIU's ghost_limit, in bytes (0: CRIU's default); a
	// restore needs nothing of it.
	GhostLimit uint32 `json:"ghost_limit,omitempty"`
}

// Dump decides the dump's options. Close dumps with tcp_close: the
// source's connections are left alone and no network lock is needed. Keep
// needs tcp_established and the network lock, both costly while the tree
// is held, so they are asked for only when connected says the source's
// network namespace has a connection at all.
func (c Capture) Dump(connected func() (bool, error)) (Dumped, error) {
	d := Dumped{FileLocks: c.FileLocks, ExtUnixSk: c.ExtUnixSk, ShellJob: c.ShellJob}
	if c.GhostLimit > 0 && c.GhostLimit <= maxGhostLimit {
		d.GhostLimit = uint32(c.GhostLimit)
	}
	if c.TCP.OrClose() == TCPClose {
		d.TCPClose = true
		return d, nil
	}
	has, err := connected()
	if err != nil {
		return d, err
	}
	d.TCPEstablished = has
	return d, nil
}

// NeedsNetworkLock tells whether the dump must lock the source's network:
// only a dump that reads connections' state in repair mode does.
func (d Dumped) NeedsNetworkLock() bool { return d.TCPEstablished }

// Restore is what a restore of these images must declare for a sibling with
// the given TCP policy (the options the dump allowed), and whether CRIU
// must close the restored connections (tcp-close). A dump with tcp_close
// must be restored with it; one with connection state is closed unless the
// sibling keeps them.
func (d Dumped) Restore(policy TCPPolicy) (declared Dumped, tcpClose bool) {
	keep := policy == TCPKeep
	declared = Dumped{TCPEstablished: d.TCPEstablished && keep, FileLocks: d.FileLocks, ExtUnixSk: d.ExtUnixSk, ShellJob: d.ShellJob}
	return declared, d.TCPClose || (d.TCPEstablished && !keep)
}

// PodmanRestoreFlags are the flags `podman container restore` needs for a
// checkpoint dumped with d, and what it cannot be told (Podman's restore
// has no flag for it).
func (d Dumped) PodmanRestoreFlags() (flags, missing []string) {
	if d.TCPEstablished {
		flags = append(flags, "--tcp-established")
	}
	if d.FileLocks {
		flags = append(flags, "--file-locks")
	}
	if d.ExtUnixSk {
		missing = append(missing, "ext-unix-sk")
	}
	if d.ShellJob {
		missing = append(missing, "shell-job")
	}
	if d.TCPClose {
		missing = append(missing, "tcp-close")
	}
	return flags, missing
}
