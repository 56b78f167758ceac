package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The control protocol between the client commands and serve is one JSON
// object per line over a unix stream socket: the client sends a
// controlRequest, serve answers with a controlResponse. A connection may
// carry any number of requests, handled in order.

// Control operations.
const (
	opReport  = "report"
	opMutate  = "mutate"
	opEventfd = "eventfd"
)

// maxEventfdWrites bounds one eventfd request; each write is a syscall.
const maxEventfdWrites = 1_000_000

// maxMessageSize bounds one protocol line.
const maxMessageSize = 16 << 20

type controlRequest struct {
	Op       string `json:"op"`
	Hash     bool   `json:"hash,omitempty"`      // report: include the memory sha256
	ResetGap bool   `json:"reset_gap,omitempty"` // report: reset max_gap_ms after reading it
	Tag      string `json:"tag,omitempty"`       // mutate
	Mem      bool   `json:"mem,omitempty"`       // mutate: also rewrite the memory head
	N        int    `json:"n,omitempty"`         // eventfd: number of writes
}

// validate checks a request before serve acts on it.
func (r controlRequest) validate() error {
	switch r.Op {
	case opReport:
	case opMutate:
		if err := validateTag(r.Tag); err != nil {
			return err
		}
	case opEventfd:
		if r.N < 1 || r.N > maxEventfdWrites {
			return fmt.Errorf("eventfd: n must be between 1 and %d, got %d", maxEventfdWrites, r.N)
		}
	default:
		return fmt.Errorf("unknown op %q", r.Op)
	}
	return nil
}

type controlResponse struct {
	OK     bool    `json:"ok"`
	Error  string  `json:"error,omitempty"` // why the request was refused
	Report *Report `json:"report,omitempty"`
}

// encodeMessage returns v as one protocol line.
func encodeMessage(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// decodeRequest parses one request line. Unknown fields are refused so a
// misspelt option fails loudly instead of being ignored.
func decodeRequest(line []byte) (controlRequest, error) {
	var req controlRequest
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return controlRequest{}, fmt.Errorf("bad request: %w", err)
	}
	if dec.More() {
		return controlRequest{}, errors.New("bad request: more than one JSON value on the line")
	}
	return req, nil
}

// decodeResponse parses one response line. A response without a report is
// only valid as a refusal.
func decodeResponse(line []byte) (controlResponse, error) {
	var resp controlResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		return controlResponse{}, fmt.Errorf("bad response: %w", err)
	}
	if resp.OK && resp.Report == nil {
		return controlResponse{}, errors.New("bad response: ok without a report")
	}
	if !resp.OK && resp.Error == "" {
		return controlResponse{}, errors.New("bad response: refusal without a reason")
	}
	return resp, nil
}

// newLineScanner reads protocol lines of up to maxMessageSize bytes.
func newLineScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxMessageSize)
	return sc
}

// callServe sends one request to serve's control socket and returns its
// report. timeout bounds the whole exchange (hashing a big region is slow).
func callServe(controlPath string, req controlRequest, timeout time.Duration) (*Report, error) {
	conn, err := net.DialTimeout("unix", controlPath, min(timeout, 10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("cannot reach serve at %s: %w", controlPath, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("control connection to %s: %w", controlPath, err)
	}
	msg, err := encodeMessage(req)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(msg); err != nil {
		return nil, fmt.Errorf("send request to serve at %s: %w", controlPath, err)
	}
	sc := newLineScanner(conn)
	if !sc.Scan() {
		err := sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read answer from serve at %s: %w", controlPath, err)
	}
	resp, err := decodeResponse(sc.Bytes())
	if err != nil {
		return nil, fmt.Errorf("serve at %s: %w", controlPath, err)
	}
	if !resp.OK {
		return nil, fmt.Errorf("serve at %s refused the request: %s", controlPath, resp.Error)
	}
	return resp.Report, nil
}
