package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestRequestRoundtrip(t *testing.T) {
	for _, req := range []controlRequest{
		{Op: opReport},
		{Op: opReport, Hash: true, ResetGap: true},
		{Op: opMutate, Tag: "after fork", Mem: true},
		{Op: opEventfd, N: 3},
	} {
		line, err := encodeMessage(req)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 {
			t.Fatalf("encoded request %q is not exactly one line", line)
		}
		got, err := decodeRequest(bytes.TrimSuffix(line, []byte("\n")))
		if err != nil {
			t.Fatalf("decode %s: %v", line, err)
		}
		if got != req {
			t.Fatalf("round trip of %+v gave %+v", req, got)
		}
		if err := got.validate(); err != nil {
			t.Fatalf("validate %+v: %v", got, err)
		}
	}
}

func TestDecodeRequestErrors(t *testing.T) {
	for _, line := range []string{
		``,
		`not json`,
		`{"op":"report","hsah":true}`, // misspelt option must not be ignored
		`{"op":"report"} {"op":"report"}`,
		`{"op":"eventfd","n":"3"}`,
	} {
		if req, err := decodeRequest([]byte(line)); err == nil {
			t.Errorf("decodeRequest(%q) = %+v, want an error", line, req)
		}
	}
}

func TestValidateRequest(t *testing.T) {
	for _, req := range []controlRequest{
		{Op: ""},
		{Op: "shutdown"},
		{Op: opMutate},
		{Op: opMutate, Tag: "two\nlines"},
		{Op: opEventfd},
		{Op: opEventfd, N: -1},
		{Op: opEventfd, N: maxEventfdWrites + 1},
	} {
		if err := req.validate(); err == nil {
			t.Errorf("validate(%+v) accepted it", req)
		}
	}
}

func TestResponseRoundtrip(t *testing.T) {
	r := newReport()
	r.Hostname, r.Counter, r.Tag = "host", 12, "initial"
	r.Tree = append(r.Tree, ProcInfo{Role: roleServe, PID: 1})
	line, err := encodeMessage(controlResponse{OK: true, Report: r})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := decodeResponse(bytes.TrimSuffix(line, []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.OK || resp.Report.Hostname != "host" || resp.Report.Counter != 12 || resp.Report.Tree[0].PID != 1 {
		t.Fatalf("round trip gave %+v / %+v", resp, resp.Report)
	}

	line, err = encodeMessage(controlResponse{Error: "tag is empty"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err = decodeResponse(line)
	if err != nil || resp.OK || resp.Error != "tag is empty" {
		t.Fatalf("refusal round trip gave %+v, %v", resp, err)
	}
}

func TestDecodeResponseErrors(t *testing.T) {
	for _, line := range []string{
		`{"ok":true}`,  // no report
		`{"ok":false}`, // no reason
		`garbage`,
	} {
		if resp, err := decodeResponse([]byte(line)); err == nil {
			t.Errorf("decodeResponse(%q) = %+v, want an error", line, resp)
		}
	}
}

func TestControlLinesLongerThanDefaultScanner(t *testing.T) {
	// A report can outgrow bufio.Scanner's 64 KiB default (many errors).
	r := newReport()
	for range 2000 {
		r.addError("%s", strings.Repeat("e", 100))
	}
	line, err := encodeMessage(controlResponse{OK: true, Report: r})
	if err != nil {
		t.Fatal(err)
	}
	sc := newLineScanner(bytes.NewReader(line))
	if !sc.Scan() {
		t.Fatalf("scan %d-byte line: %v", len(line), sc.Err())
	}
	var resp controlResponse
	if err := json.Unmarshal(sc.Bytes(), &resp); err != nil || len(resp.Report.Errors) != 2000 {
		t.Fatalf("long line did not round-trip: %v", err)
	}
}
