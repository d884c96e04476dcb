package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// qgaProbe speaks the QEMU guest agent protocol on a vm sandbox's qemu-ga
// socket (qga.sock in its run dir, on this host) to time exec through
// qemu-ga on the very VM whose API execs go through corral-agent: the
// backend uses qemu-ga only for images without corral-agent, so it leaves
// that socket free. It runs what the backend runs for a Linux guest:
// guest-exec of the command under its output-cap shell and timeout, then
// guest-exec-status polled with the backend's backoff (5 ms doubling to
// 100 ms). There is no API hop: the figure flatters qemu-ga slightly.
type qgaProbe struct {
	conn net.Conn
	rd   *bufio.Reader
}

func dialQGA(ctx context.Context, runDir string) (*qgaProbe, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(runDir, "qga.sock"))
	if err != nil {
		return nil, fmt.Errorf("qemu-ga socket: %w", err)
	}
	q := &qgaProbe{conn: conn, rd: bufio.NewReader(conn)}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// guest-sync-delimited: the reply follows a 0xFF; older bytes are stale.
	const id = 7310
	if err := q.send("guest-sync-delimited", map[string]any{"id": id}); err != nil {
		conn.Close()
		return nil, err
	}
	for {
		if _, err := q.rd.ReadBytes(0xff); err != nil {
			conn.Close()
			return nil, fmt.Errorf("qemu-ga sync: %w", err)
		}
		line, err := q.rd.ReadBytes('\n')
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("qemu-ga sync: %w", err)
		}
		var r struct {
			Return int `json:"return"`
		}
		if json.Unmarshal(bytes.TrimSpace(line), &r) == nil && r.Return == id {
			return q, nil
		}
	}
}

func (q *qgaProbe) Close() error { return q.conn.Close() }

func (q *qgaProbe) send(cmd string, args any) error {
	b, err := json.Marshal(map[string]any{"execute": cmd, "arguments": args})
	if err != nil {
		return err
	}
	_, err = q.conn.Write(append(b, '\n'))
	return err
}

func (q *qgaProbe) call(cmd string, args, out any) error {
	if err := q.send(cmd, args); err != nil {
		return fmt.Errorf("qemu-ga %s: %w", cmd, err)
	}
	line, err := q.rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("qemu-ga %s: %w", cmd, err)
	}
	var r struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Desc string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(bytes.TrimLeft(line, "\xff")), &r); err != nil {
		return fmt.Errorf("qemu-ga %s: %w", cmd, err)
	}
	if r.Error != nil {
		return fmt.Errorf("qemu-ga %s: %s", cmd, r.Error.Desc)
	}
	return json.Unmarshal(r.Return, out)
}

// qgaCapScript is the shape of the backend's output-cap wrapper (a shell
// piping the command through head), so the probe forks what it forks.
const qgaCapScript = `n=$1; shift; ( exec "$@" ) | head -c "$n"`

// runTrue times one `true` through qemu-ga.
func (q *qgaProbe) runTrue(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	argv := []string{"/bin/sh", "-c", qgaCapScript, "corral-cap", "1048577", "/usr/bin/timeout", "-s", "KILL", "600", "true"}
	var started struct {
		PID int `json:"pid"`
	}
	if err := q.call("guest-exec", map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": true}, &started); err != nil {
		return 0, err
	}
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		var st struct {
			Exited   bool `json:"exited"`
			ExitCode *int `json:"exitcode"`
		}
		if err := q.call("guest-exec-status", map[string]any{"pid": started.PID}, &st); err != nil {
			return 0, err
		}
		if st.Exited {
			if st.ExitCode == nil || *st.ExitCode != 0 {
				return 0, fmt.Errorf("qemu-ga: true exited %v", st.ExitCode)
			}
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// hasCorralAgent says whether a vm sandbox's QEMU has corral-agent's port.
func hasCorralAgent(pid int) bool {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Contains(string(b), "name=org.corral.agent.0")
}

// qgaSamples is the p50 of n execs of true through qemu-ga (after one
// warm-up), on the VM whose run dir is runDir.
func qgaSamples(ctx context.Context, runDir string, n int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	q, err := dialQGA(ctx, runDir)
	if err != nil {
		return 0, err
	}
	defer q.Close()
	var d []time.Duration
	for i := 0; i <= n; i++ {
		took, err := q.runTrue(ctx)
		if err != nil {
			return 0, err
		}
		if i > 0 {
			d = append(d, took)
		}
	}
	return Summarise(d).P50, nil
}
