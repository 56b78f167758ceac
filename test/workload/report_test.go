package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// requiredFields are the report fields the integration harness relies on.
var requiredFields = []string{
	"hostname", "mark", "cwd", "counter", "counter_file", "max_gap_ms",
	"tree", "threads", "thread_sigblk",
	"file_offset", "file_size", "deleted_path_exists", "deleted_sha256",
	"pipe_roundtrip", "socketpair_roundtrip", "unix_listen_roundtrip",
	"timerfd_ticks", "timerfd_ticking", "timerfd_interval_ns",
	"mem_mib", "mem_seed", "mem_sha256", "tag",
	"flock_held", "posix_lock_held", "posix_lock_pid",
	"eventfd_total", "epoll_ok", "tcp_reply", "errors",
}

var requiredProcFields = []string{"role", "pid", "ppid", "pgid", "sid", "mark", "cwd"}

func TestReportJSONHasAllFields(t *testing.T) {
	// An empty report must still carry every field, with [] for lists: the
	// harness must be able to tell "false" and "empty" from "missing".
	r := newReport()
	r.Tree = append(r.Tree, ProcInfo{Role: roleServe})
	r.Threads = append(r.Threads, ThreadInfo{})
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range requiredFields {
		if _, ok := m[f]; !ok {
			t.Errorf("field %q missing from %s", f, b)
		}
	}
	if got := string(m["errors"]); got != "[]" {
		t.Errorf("errors = %s, want []", got)
	}
	if got := string(m["mem_sha256"]); got != `""` {
		t.Errorf("mem_sha256 = %s, want \"\"", got)
	}

	var tree []map[string]json.RawMessage
	if err := json.Unmarshal(m["tree"], &tree); err != nil {
		t.Fatal(err)
	}
	for _, f := range requiredProcFields {
		if _, ok := tree[0][f]; !ok {
			t.Errorf("tree field %q missing from %s", f, m["tree"])
		}
	}
	if _, ok := tree[0]["error"]; ok {
		t.Errorf("tree entry without a problem has an error field: %s", m["tree"])
	}
	var threads []map[string]json.RawMessage
	if err := json.Unmarshal(m["threads"], &threads); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tid", "count"} {
		if _, ok := threads[0][f]; !ok {
			t.Errorf("thread field %q missing from %s", f, m["threads"])
		}
	}
}

func TestReportJSONNonEmpty(t *testing.T) {
	var r Report
	b, err := json.Marshal(newReport())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Tree == nil || r.Threads == nil || r.Errors == nil {
		t.Fatal("empty lists did not survive a round trip as empty lists")
	}
}

// goodTree is a tree as serve builds it, serve being a container's PID 1.
func goodTree() []ProcInfo {
	p := func(role string, pid, ppid, pgid, sid int) ProcInfo {
		return ProcInfo{Role: role, PID: pid, PPID: ppid, PGID: pgid, SID: sid, Mark: "m", Cwd: "/var/tmp/workload"}
	}
	return []ProcInfo{
		p(roleServe, 1, 0, 1, 1),
		p(roleA, 7, 1, 7, 1),
		p(roleA1, 12, 7, 7, 1),
		p(roleB, 8, 1, 8, 8),
	}
}

func TestCheckTreeGood(t *testing.T) {
	if problems := checkTree(goodTree()); len(problems) != 0 {
		t.Fatalf("good tree: %q", problems)
	}
}

func TestCheckTreeProblems(t *testing.T) {
	for name, tc := range map[string]struct {
		change func([]ProcInfo)
		want   string
	}{
		"A not in own group": {func(tr []ProcInfo) { tr[1].PGID = 1 }, "A's process group"},
		"A in other session": {func(tr []ProcInfo) { tr[1].SID = 7 }, "A's session"},
		"A1 reparented":      {func(tr []ProcInfo) { tr[2].PPID = 1 }, "A1's parent"},
		"A1 own group":       {func(tr []ProcInfo) { tr[2].PGID = 12 }, "A1's process group"},
		"B not setsid":       {func(tr []ProcInfo) { tr[3].SID = 1 }, "B's session"},
		"B wrong parent":     {func(tr []ProcInfo) { tr[3].PPID = 0 }, "B's parent"},
		"mark lost":          {func(tr []ProcInfo) { tr[3].Mark = "" }, "B's WORKLOAD_MARK"},
		"cwd lost":           {func(tr []ProcInfo) { tr[2].Cwd = "/" }, "A1's cwd"},
		"child unreachable":  {func(tr []ProcInfo) { tr[1] = ProcInfo{Role: roleA, Error: "timed out"} }, "process A: timed out"},
	} {
		tree := goodTree()
		tc.change(tree)
		problems := checkTree(tree)
		if !strings.Contains(strings.Join(problems, "\n"), tc.want) {
			t.Errorf("%s: problems %q do not mention %q", name, problems, tc.want)
		}
	}
}

func TestCheckTCPReply(t *testing.T) {
	if p := checkTCPReply("workload vm 123", "vm"); p != "" {
		t.Errorf("good reply: %s", p)
	}
	for _, reply := range []string{"", "workload vm ", "workload other 1", "workload vm 12x", "hello"} {
		if checkTCPReply(reply, "vm") == "" {
			t.Errorf("reply %q accepted", reply)
		}
	}
}
