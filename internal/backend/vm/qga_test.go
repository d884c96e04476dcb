package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestQGAGuestReplies plays a hostile guest agent on the socket: stale
// replies before the sync marker are skipped, an error reply keeps the
// connection, and a reply too large to be real is refused (the daemon's
// memory is not the guest's to fill) and drops the connection.
func TestQGAGuestReplies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qga.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan int, 4)
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- n
			go serveHostile(c)
		}
	}()
	defer func(n int) { maxReply = n }(maxReply)
	maxReply = 1 << 20
	g := &qga{path: path}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var v struct {
		Version string `json:"version"`
	}
	if err := g.call(ctx, "guest-info", nil, &v); err != nil || v.Version != "9.9" {
		t.Fatalf("guest-info after stale replies: %+v, %v", v, err)
	}
	err = g.call(ctx, "guest-fail", nil, nil)
	if qe, ok := err.(*qgaError); !ok || qe.Desc != "no such command" {
		t.Fatalf("error reply: %v", err)
	}
	if err := g.call(ctx, "guest-huge", nil, nil); !errdefs.IsUnavailable(err) {
		t.Fatalf("oversized reply: %v, want Unavailable", err)
	}
	if err := g.call(ctx, "guest-info", nil, &v); err != nil {
		t.Fatalf("after the oversized reply: %v", err)
	}
	if len(conns) != 2 {
		t.Errorf("%d connections, want 2 (one dropped after the oversized reply)", len(conns))
	}
}

func serveHostile(c net.Conn) {
	defer c.Close()
	rd := bufio.NewReader(c)
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return
		}
		var req struct {
			Execute   string         `json:"execute"`
			Arguments map[string]any `json:"arguments"`
		}
		if json.Unmarshal(line, &req) != nil {
			return
		}
		switch req.Execute {
		case "guest-sync-delimited":
			fmt.Fprintf(c, "{\"return\": {\"version\": \"stale\"}}\ngarbage\xfe\n\xff{\"return\": 1}\n\xff{\"return\": %d}\n", int64(req.Arguments["id"].(float64)))
		case "guest-info":
			fmt.Fprint(c, `{"return": {"version": "9.9"}}`+"\n")
		case "guest-fail":
			fmt.Fprint(c, `{"error": {"class": "CommandNotFound", "desc": "no such command"}}`+"\n")
		case "guest-huge":
			_, _ = c.Write(bytes.Repeat([]byte("x"), 2*maxReply))
		}
	}
}
