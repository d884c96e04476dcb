// Package seaweed starts a real SeaweedFS server (master, volume, filer and
// S3 gateway in one `weed server -s3` process) on free loopback ports, for
// the S3 blob store's tests and the lazy-loading benchmark. weed is built by
// scripts/deps.sh. It imports blob and errdefs only.
package seaweed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/storage/blob"
)

// Find returns the weed binary: on PATH, else in $(go env GOPATH)/bin.
func Find() (string, error) {
	if p, err := exec.LookPath("weed"); err == nil {
		return p, nil
	}
	var dirs []string
	if gp := os.Getenv("GOPATH"); gp != "" {
		dirs = append(dirs, filepath.SplitList(gp)...)
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "bin", "weed")
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errdefs.FailedPrecondition("needs weed (SeaweedFS): run scripts/deps.sh, which builds it into $(go env GOPATH)/bin")
}

// Server is a running SeaweedFS with its S3 gateway.
type Server struct {
	Endpoint string // host:port of the S3 gateway
	Dir      string // its data and log
	cmd      *exec.Cmd
	done     chan error
}

// Start runs weed in dir (which it owns until Stop) and waits until its S3
// gateway creates bucket.
func Start(ctx context.Context, dir, bucket string) (*Server, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(8)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	args := []string{"server", "-s3",
		"-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port=" + p(0), "-master.port.grpc=" + p(1),
		"-volume.port=" + p(2), "-volume.port.grpc=" + p(3),
		"-filer.port=" + p(4), "-filer.port.grpc=" + p(5),
		"-s3.port=" + p(6), "-s3.port.grpc=" + p(7),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-filer.localSocket=" + filepath.Join(dir, "filer.sock"),
		"-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
		"-master.telemetry=false", // no network beyond loopback
		"-master.volumeSizeLimitMB=1024", "-volume.max=16",
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// No AWS_* credentials from the environment: with none configured the
	// gateway allows anonymous access, which is what the tests use.
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "AWS_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start weed: %w", err)
	}
	s := &Server{Endpoint: "127.0.0.1:" + p(6), Dir: dir, cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	if err := s.waitReady(ctx, bucket); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitReady retries creating the bucket until the whole chain (S3 → filer
// → master → volume) answers, up to a minute.
func (s *Server) waitReady(ctx context.Context, bucket string) error {
	st, err := blob.NewS3(blob.S3Config{Endpoint: s.Endpoint, Bucket: bucket})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		err = st.EnsureBucket(ctx)
		if err == nil {
			return nil
		}
		select {
		case exit := <-s.done:
			s.done <- exit
			tail, _ := os.ReadFile(filepath.Join(s.Dir, "weed.log"))
			return fmt.Errorf("weed exited (%v) before it was ready: %s", exit, lastLines(string(tail), 20))
		case <-ctx.Done():
			return fmt.Errorf("weed not ready: %w (last error %v; log in %s)", ctx.Err(), err, s.Dir)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Store returns an S3 blob store in bucket on this server.
func (s *Server) Store(bucket string) (*blob.S3, error) {
	return blob.NewS3(blob.S3Config{Endpoint: s.Endpoint, Bucket: bucket})
}

// Stop ends weed and its process group and waits for it: SIGTERM, then
// SIGKILL after 2 s (its data is scratch; a graceful stop takes ~10 s).
func (s *Server) Stop() error {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(2 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	return nil
}

func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(errdefs.Unavailable("free port"), err)
		}
		lns = append(lns, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
