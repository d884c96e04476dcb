package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a minimal client of QEMU's machine protocol on a unix socket:
// one command at a time, asynchronous events skipped.
type qmp struct {
	mu   sync.Mutex
	conn net.Conn
	rd   *bufio.Reader
}

// dialQMP connects, reads the greeting and leaves capability negotiation
// mode. It retries until QEMU has created the socket or ctx ends.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
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
	q := &qmp{conn: conn, rd: bufio.NewReader(conn)}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	var greeting map[string]json.RawMessage
	if err := q.readMsg(&greeting); err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if _, err := q.run(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) readMsg(v any) error {
	line, err := q.rd.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// run executes one command and returns its "return" value.
func (q *qmp) run(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
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
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctxOr(ctx, err))
	}
	for {
		var r qmpReply
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

func (q *qmp) close() error { return q.conn.Close() }

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// status is QEMU's run state ("running", "paused", "inmigrate", ...).
func (q *qmp) status(ctx context.Context) (string, error) {
	raw, err := q.run(ctx, "query-status", nil)
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

// waitMigration polls query-migrate until the migration completed.
func (q *qmp) waitMigration(ctx context.Context) error {
	for {
		raw, err := q.run(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var m struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("qmp query-migrate: %w", err)
		}
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return errors.New("migration " + m.Status + ": " + m.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
