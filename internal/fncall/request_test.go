package fncall

import (
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"golang.org/x/sys/unix"
)

func TestNormalize(t *testing.T) {
	req := Request{Language: "python", Source: "print(1)"}
	argv, err := normalize(&req)
	if err != nil || strings.Join(argv, " ") != "python3 -c print(1)" || req.Image != "debian" {
		t.Fatalf("python: %v %q %+v", err, argv, req)
	}
	if req.WallLimit != DefaultWall || req.CPULimit != DefaultWall || req.MemoryBytes != DefaultMemory || req.OutputBytes != DefaultOutput {
		t.Fatalf("defaults: %+v", req)
	}
	req = Request{Language: "sh", Source: "true", Image: "x"}
	if argv, _ := normalize(&req); strings.Join(argv, " ") != "/bin/sh -c true" || req.Image != "x" {
		t.Fatalf("sh: %q %+v", argv, req)
	}
	for _, tc := range []struct {
		req     Request
		mention string
	}{
		{Request{Language: "cobol", Source: "x"}, "python, sh"},
		{Request{}, "language"},
		{Request{Argv: []string{"a"}, Language: "sh"}, "argv"},
		{Request{Argv: []string{""}}, "argv"},
		{Request{Language: "sh", Source: strings.Repeat("x", MaxSource+1)}, "source"},
		{Request{Language: "sh", WallLimit: -1}, "wall_time_limit"},
		{Request{Language: "sh", CPULimit: time.Hour}, "cpu_time_limit"},
		{Request{Language: "sh", MemoryBytes: 1}, "memory_limit_bytes"},
		{Request{Language: "sh", OutputBytes: MaxOutput + 1}, "output_limit_bytes"},
		{Request{Language: "sh", Files: map[string][]byte{"": nil}}, "files"},
		{Request{Language: "sh", OutputFiles: []string{""}}, "output_files"},
	} {
		_, err := normalize(&tc.req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%+v: err %v, want invalid argument mentioning %q", tc.req, err, tc.mention)
		}
	}
}

func TestVerdict(t *testing.T) {
	req := &Request{CPULimit: time.Second}
	for _, tc := range []struct {
		er   backend.ExecResult
		want Verdict
	}{
		{backend.ExecResult{}, VerdictOK},
		{backend.ExecResult{ExitCode: 3}, VerdictRuntimeError},
		{backend.ExecResult{ExitCode: -1, Signal: 11}, VerdictRuntimeError},
		{backend.ExecResult{TimedOut: true, Truncated: true}, VerdictTimeLimit},
		{backend.ExecResult{ExitCode: -1, Signal: int(unix.SIGXCPU)}, VerdictTimeLimit},
		{backend.ExecResult{CPUTime: time.Second}, VerdictTimeLimit},
		{backend.ExecResult{OOMKilled: true, ExitCode: -1, Signal: 9}, VerdictMemoryLimit},
		{backend.ExecResult{Truncated: true, ExitCode: -1, Signal: 13}, VerdictOutputLimit},
	} {
		res := &Result{ExitCode: tc.er.ExitCode, Signal: tc.er.Signal}
		if got := verdict(req, tc.er, res); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.er, got, tc.want)
		}
	}
}

func TestPoolTarget(t *testing.T) {
	s := &Service{cfg: Config{PoolFloor: 2, PoolCeiling: 10}}
	p := &pool{svc: s, last: time.Now()}
	if got := p.target(); got != 2 {
		t.Fatalf("idle pool: target %d, want the floor 2", got)
	}
	p.rate, p.busy = 1000, 0.05 // 50 calls in flight
	if got := p.target(); got != 10 {
		t.Fatalf("busy pool: target %d, want the ceiling 10", got)
	}
	p.rate, p.busy = 40, 0.05 // 2 in flight, x1.5 headroom, +1
	if got := p.target(); got != 4 {
		t.Fatalf("target %d, want 4", got)
	}
}
