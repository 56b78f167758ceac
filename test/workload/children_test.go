package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func TestChildLineRoundtrip(t *testing.T) {
	line := encodeChildLine(42, "echo abc")
	if line != "42 echo abc\n" {
		t.Fatalf("encodeChildLine = %q", line)
	}
	id, rest, err := parseChildLine(strings.TrimSuffix(line, "\n"))
	if err != nil || id != 42 || rest != "echo abc" {
		t.Fatalf("parseChildLine = %d, %q, %v", id, rest, err)
	}
	for _, bad := range []string{"", "42", "x echo", "-1 echo"} {
		if _, _, err := parseChildLine(bad); err == nil {
			t.Errorf("parseChildLine(%q) accepted it", bad)
		}
	}
}

func TestAnswerChild(t *testing.T) {
	got, err := answerChild(roleB, "3 echo tok")
	if err != nil || got != "3 tok\n" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	got, err = answerChild(roleB, "4 info")
	if err != nil {
		t.Fatal(err)
	}
	id, payload, err := parseChildLine(strings.TrimSuffix(got, "\n"))
	if err != nil || id != 4 {
		t.Fatalf("info answer %q: id %d, %v", got, id, err)
	}
	var info ProcInfo
	if err := json.Unmarshal([]byte(payload), &info); err != nil {
		t.Fatal(err)
	}
	if info.Role != roleB || info.PID != os.Getpid() || info.PPID != os.Getppid() || info.Cwd == "" || info.Error != "" {
		t.Fatalf("info = %+v", info)
	}
	if _, err := answerChild(roleB, "5 explode"); err == nil {
		t.Fatal("an unknown verb was answered")
	}
}

// fakeChild returns serve's link to a goroutine speaking the child
// protocol over a socketpair; answer decides what to send for each line
// ("" sends nothing).
func fakeChild(t *testing.T, answer func(line string) string) *childLink {
	t.Helper()
	serveEnd, childEnd, err := socketpair()
	if err != nil {
		t.Fatal(err)
	}
	s, err := pollableFile(serveEnd, "serve-end")
	if err != nil {
		t.Fatal(err)
	}
	c := os.NewFile(uintptr(childEnd), "child-end")
	t.Cleanup(func() { s.Close(); c.Close() })
	go func() {
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if a := answer(sc.Text()); a != "" {
				c.WriteString(a)
			}
		}
	}()
	l := newChildLink(roleB, 0, s, s)
	l.timeout = 200 * time.Millisecond
	return l
}

func TestChildLinkRealProtocol(t *testing.T) {
	l := fakeChild(t, func(line string) string {
		a, err := answerChild(roleB, line)
		if err != nil {
			return "0 " + err.Error() + "\n"
		}
		return a
	})
	if err := l.roundtrip(); err != nil {
		t.Fatal(err)
	}
	if info := l.info(); info.Error != "" || info.PID != os.Getpid() {
		t.Fatalf("info = %+v", info)
	}
}

func TestChildLinkDropsLateAnswers(t *testing.T) {
	// The first question is answered too late; its answer must not be taken
	// for the answer to the second one.
	l := fakeChild(t, func(line string) string {
		id, rest, _ := parseChildLine(line)
		if id == 1 {
			time.Sleep(300 * time.Millisecond)
		}
		_, arg, _ := strings.Cut(rest, " ")
		return encodeChildLine(id, arg)
	})
	if _, err := l.call(verbEcho, "first"); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("first call: %v, want a timeout", err)
	}
	got, err := l.call(verbEcho, "second")
	if err != nil || got != "second" {
		t.Fatalf("second call = %q, %v; want second", got, err)
	}
}

func TestChildLinkReportsEOF(t *testing.T) {
	serveEnd, childEnd, err := socketpair()
	if err != nil {
		t.Fatal(err)
	}
	s, err := pollableFile(serveEnd, "serve-end")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.NewFile(uintptr(childEnd), "child-end").Close()
	l := newChildLink(roleA, 0, s, s)
	if _, err := l.call(verbEcho, "x"); err == nil {
		t.Fatal("a call to a closed child succeeded")
	}
}

func TestChildLinkExited(t *testing.T) {
	l := fakeChild(t, func(string) string { return "" })
	l.pid = 99
	tree := &processTree{a: l, a1: l, b: l}
	if !tree.markExited(99, "was killed by killed") {
		t.Fatal("markExited did not find the child")
	}
	_, err := l.call(verbInfo, "")
	if err == nil || !strings.Contains(err.Error(), "was killed") {
		t.Fatalf("call to an exited child: %v", err)
	}
}
