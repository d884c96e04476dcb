package lazy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Client talks to a lazy blob server over its control socket.
type Client struct {
	socket string
	http   *http.Client
}

// Dial returns a client of the server at socket (nothing is sent yet).
func Dial(socket string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{socket: socket, http: &http.Client{Transport: tr}}
}

// Start returns a client of the server on sc.Socket, first starting one
// with argv (a command that runs ServeStdin, e.g. corral's hidden
// lazyblob-serve) when none answers. The server gets its own session, so
// it outlives the caller; its output goes to logPath.
func Start(ctx context.Context, sc ServerConfig, argv, env []string, logPath string) (*Client, error) {
	c := Dial(sc.Socket)
	if c.Ping(ctx) == nil {
		return c, nil
	}
	cfg, err := json.Marshal(sc)
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lazy blob server log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start lazy blob server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it if it ends while we run
	for {
		if c.Ping(ctx) == nil {
			return c, nil
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("lazy blob server exited (%v): see %s", err, logPath)
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("lazy blob server did not answer: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://lazyblob"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return errdefs.Unavailable("lazy blob server %s: %v", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		for _, cl := range errorClasses {
			if cl.status == resp.StatusCode {
				return cl.make("%s", e.Error)
			}
		}
		return errors.New(e.Error)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Ping checks that the server answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Pid(ctx)
	return err
}

// Pid is the server's process id (to watch it, or to kill a stuck one).
func (c *Client) Pid(ctx context.Context) (int, error) {
	var out struct {
		Pid int `json:"pid"`
	}
	return out.Pid, c.do(ctx, "GET", "/v1/ping", nil, &out)
}

// Register is FS.Register in the server: the path is on its mount.
func (c *Client) Register(ctx context.Context, digest string, size int64) (string, error) {
	var out struct {
		Path string `json:"path"`
	}
	err := c.do(ctx, "POST", "/v1/register", map[string]any{"digest": digest, "size": size}, &out)
	return out.Path, err
}

// Stats is FS.Stats.
func (c *Client) Stats(ctx context.Context, digest string) (Stats, error) {
	var s Stats
	return s, c.do(ctx, "GET", "/v1/stats?digest="+url.QueryEscape(digest), nil, &s)
}

// AllStats is FS.AllStats.
func (c *Client) AllStats(ctx context.Context) ([]Stats, error) {
	var s []Stats
	return s, c.do(ctx, "GET", "/v1/stats", nil, &s)
}

// GroupStats is FS.GroupStats.
func (c *Client) GroupStats(ctx context.Context, group string) (GroupStats, error) {
	var s GroupStats
	return s, c.do(ctx, "GET", "/v1/groups?group="+url.QueryEscape(group), nil, &s)
}

// ForgetGroup is FS.ForgetGroup.
func (c *Client) ForgetGroup(ctx context.Context, group string) error {
	return c.do(ctx, "DELETE", "/v1/groups?group="+url.QueryEscape(group), nil, nil)
}

// Faults is FS.Faults: poll it to mark the sandboxes of failing layers
// degraded.
func (c *Client) Faults(ctx context.Context, after uint64) ([]FaultEvent, error) {
	var s []FaultEvent
	return s, c.do(ctx, "GET", "/v1/faults?after="+strconv.FormatUint(after, 10), nil, &s)
}

// Record is FS.Record.
func (c *Client) Record(ctx context.Context, digest string) (stop func(context.Context) error, err error) {
	var out struct {
		Token string `json:"token"`
	}
	if err := c.do(ctx, "POST", "/v1/record", map[string]string{"digest": digest}, &out); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return c.do(ctx, "POST", "/v1/record/stop", map[string]string{"token": out.Token}, nil)
	}, nil
}

// StartPrefetch is FS.StartPrefetch.
func (c *Client) StartPrefetch(ctx context.Context, digest string, mode PrefetchMode) error {
	return c.do(ctx, "POST", "/v1/prefetch", map[string]any{"digest": digest, "mode": mode}, nil)
}

// Metrics returns the server's figures in the Prometheus text format, for
// the node's metrics endpoint to pass on.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://lazyblob/v1/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, errdefs.Unavailable("lazy blob server %s: %v", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errdefs.Unavailable("lazy blob server %s: metrics: %s", c.socket, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 16<<20))
}

// Shutdown closes the server's FS and ends it; errdefs.FailedPrecondition
// while layers still use it (it keeps serving then).
func (c *Client) Shutdown(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/shutdown", nil, nil)
}
