// Package qmp is a minimal client of QEMU's machine protocol (QMP) on a
// unix socket, shared by the microvm and vm backends: one command at a
// time, asynchronous events skipped. It imports nothing of corral.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Client is one QMP connection. Its methods are safe for concurrent use
// (commands are serialized).
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	rd   *bufio.Reader
}

// Dial connects, reads the greeting and leaves capability negotiation
// mode. It retries until QEMU has created the socket or ctx ends.
func Dial(ctx context.Context, path string) (*Client, error) {
	var conn net.Conn
	for {
		var err error
		var d net.Dialer
		conn, err = d.DialContext(ctx, "unix", path)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp %s: %w", path, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	q := &Client{conn: conn, rd: bufio.NewReader(conn)}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	var greeting map[string]json.RawMessage
	if err := q.readMsg(&greeting); err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if _, err := q.Run(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

func (q *Client) readMsg(v any) error {
	line, err := q.rd.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}

type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// Run executes one command and returns its "return" value.
func (q *Client) Run(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return q.run(ctx, cmd, args, nil)
}

// SendFD hands QEMU a copy of f's descriptor under name (QMP getfd), for
// a later command to name: a migration to or from "fd:<name>" reads or
// writes a file the caller opened, where an "exec:" URI would have QEMU
// spawn a shell.
func (q *Client) SendFD(ctx context.Context, name string, f *os.File) error {
	if _, ok := q.conn.(*net.UnixConn); !ok {
		return fmt.Errorf("qmp getfd: not a unix socket")
	}
	_, err := q.run(ctx, "getfd", map[string]any{"fdname": name}, syscall.UnixRights(int(f.Fd())))
	return err
}

// run writes one command, its descriptors (oob, SCM_RIGHTS) with it, and
// reads until its reply.
func (q *Client) run(ctx context.Context, cmd string, args any, oob []byte) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		q.conn.SetDeadline(d)
	} else {
		q.conn.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { q.conn.SetDeadline(time.Now()) })
	defer stop()
	msg := map[string]any{"execute": cmd}
	if args != nil {
		msg["arguments"] = args
	}
	b, _ := json.Marshal(msg)
	var err error
	if oob != nil {
		_, _, err = q.conn.(*net.UnixConn).WriteMsgUnix(append(b, '\n'), oob, nil)
	} else {
		_, err = q.conn.Write(append(b, '\n'))
	}
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctxOr(ctx, err))
	}
	for {
		var r reply
		if err := q.readMsg(&r); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, ctxOr(ctx, err))
		}
		if r.Event != "" {
			continue
		}
		if r.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	}
}

// Close ends the connection.
func (q *Client) Close() error { return q.conn.Close() }

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Status is QEMU's run state ("running", "paused", "inmigrate", ...).
func (q *Client) Status(ctx context.Context) (string, error) {
	raw, err := q.Run(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var s struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("qmp query-status: %w", err)
	}
	return s.Status, nil
}
