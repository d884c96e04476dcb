package control

import (
	"io/fs"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/state"
)

var phaseToState = map[state.Phase]corralv1.SandboxState{
	state.PhaseCreating: corralv1.SandboxState_SANDBOX_STATE_UNSPECIFIED,
	state.PhaseRunning:  corralv1.SandboxState_SANDBOX_STATE_RUNNING,
	state.PhasePaused:   corralv1.SandboxState_SANDBOX_STATE_PAUSED,
	state.PhaseStopped:  corralv1.SandboxState_SANDBOX_STATE_STOPPED,
}

func phaseOf(s corralv1.SandboxState) (state.Phase, error) {
	if s == corralv1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
		return "", nil
	}
	for p, st := range phaseToState {
		if st == s && p != state.PhaseCreating {
			return p, nil
		}
	}
	return "", errdefs.InvalidArgument("state: unknown value %d", s)
}

func sandboxToProto(sb *node.Sandbox) *corralv1.Sandbox {
	return &corralv1.Sandbox{
		Id:      sb.ID,
		NodeId:  sb.NodeID,
		Backend: sb.Backend,
		Image:   sb.Image,
		State:   phaseToState[sb.Phase],
		Resources: &corralv1.Resources{
			CpuMillis:   sb.CPUMillis,
			MemoryBytes: sb.MemoryBytes,
			DiskBytes:   sb.DiskBytes,
			Pids:        sb.Pids,
			BestEffort:  sb.BestEffort,
			Io:          ioToProto(sb.IO),
		},
		Env:          sb.Env,
		Workdir:      sb.Workdir,
		User:         sb.User,
		Labels:       sb.Labels,
		IdleTimeout:  durationpb.New(sb.IdleTimeout),
		MaxLifetime:  durationpb.New(sb.MaxLifetime),
		CreatedAt:    timestamppb.New(sb.CreatedAt),
		LastActiveAt: timestamppb.New(sb.LastActiveAt),
		StopReason:   sb.StopReason,
		Network:      networkToProto(sb.NetworkMode, sb.NetworkAllow),
		Degraded:     sb.Degraded,
		Project:      sb.Project,
		MigratingTo:  sb.MigratingTo,
		IdleAction:   idleActionOf(sb.IdleAction),
	}
}

func idleActionOf(a string) string {
	if a == "" {
		return node.IdleStop
	}
	return a
}

var modeToProto = map[string]corralv1.NetworkMode{
	"":          corralv1.NetworkMode_NETWORK_MODE_NONE,
	"none":      corralv1.NetworkMode_NETWORK_MODE_NONE,
	"allowlist": corralv1.NetworkMode_NETWORK_MODE_ALLOWLIST,
	"open":      corralv1.NetworkMode_NETWORK_MODE_OPEN,
}

func networkToProto(mode string, allow []string) *corralv1.NetworkPolicy {
	return &corralv1.NetworkPolicy{Mode: modeToProto[mode], Allow: allow}
}

// networkModeFromProto maps the enum to the node's mode names; UNSPECIFIED is "".
func networkModeFromProto(field string, m corralv1.NetworkMode) (string, error) {
	switch m {
	case corralv1.NetworkMode_NETWORK_MODE_UNSPECIFIED:
		return "", nil
	case corralv1.NetworkMode_NETWORK_MODE_NONE:
		return "none", nil
	case corralv1.NetworkMode_NETWORK_MODE_ALLOWLIST:
		return "allowlist", nil
	case corralv1.NetworkMode_NETWORK_MODE_OPEN:
		return "open", nil
	}
	return "", errdefs.InvalidArgument("%s: unknown network mode %d", field, m)
}

func statsToProto(st backend.NetworkStats) *corralv1.NetworkStatsResponse {
	out := &corralv1.NetworkStatsResponse{RefusedTotal: st.Total}
	for _, r := range st.Refusals {
		out.Refusals = append(out.Refusals, &corralv1.NetworkRefusal{
			Address: r.Address, Port: uint32(r.Port), Protocol: r.Protocol, Hook: r.Hook, Name: r.Name, Count: r.Count,
		})
	}
	return out
}

// optionalDuration converts an unset field to nil and checks a set one.
func optionalDuration(field string, d *durationpb.Duration) (*time.Duration, error) {
	if d == nil {
		return nil, nil
	}
	if err := d.CheckValid(); err != nil {
		return nil, errdefs.InvalidArgument("%s: %v", field, err)
	}
	v := d.AsDuration()
	return &v, nil
}

func createFromProto(req *corralv1.CreateRequest) (node.CreateRequest, error) {
	idle, err := optionalDuration("idle_timeout", req.IdleTimeout)
	if err != nil {
		return node.CreateRequest{}, err
	}
	lifetime, err := optionalDuration("max_lifetime", req.MaxLifetime)
	if err != nil {
		return node.CreateRequest{}, err
	}
	mode, err := networkModeFromProto("network.mode", req.GetNetwork().GetMode())
	if err != nil {
		return node.CreateRequest{}, err
	}
	r := req.GetResources()
	return node.CreateRequest{
		Network: backend.Network{Mode: mode, Allow: req.GetNetwork().GetAllow()},
		Backend: req.Backend,
		Image:   req.Image,
		Resources: node.Resources{
			CPUMillis:   r.GetCpuMillis(),
			MemoryBytes: r.GetMemoryBytes(),
			DiskBytes:   r.GetDiskBytes(),
			Pids:        r.GetPids(),
			BestEffort:  r.GetBestEffort(),
			IO: state.IOLimits{ReadBPS: r.GetIo().GetReadBps(), WriteBPS: r.GetIo().GetWriteBps(),
				ReadIOPS: r.GetIo().GetReadIops(), WriteIOPS: r.GetIo().GetWriteIops()},
		},
		Env:         req.Env,
		Workdir:     req.Workdir,
		User:        req.User,
		Labels:      req.Labels,
		IdleTimeout: idle,
		MaxLifetime: lifetime,
		IdleAction:  req.IdleAction,
		Fresh:       req.Fresh,
	}, nil
}

func execFromProto(req *corralv1.ExecRequest) (node.ExecRequest, error) {
	timeout, err := optionalDuration("timeout", req.Timeout)
	if err != nil {
		return node.ExecRequest{}, err
	}
	r := node.ExecRequest{
		Argv:        req.Argv,
		Shell:       req.Shell,
		Env:         req.Env,
		Cwd:         req.Cwd,
		User:        req.User,
		Stdin:       req.Stdin,
		OutputLimit: req.OutputLimitBytes,

		IdempotencyKey: req.IdempotencyKey,
	}
	if timeout != nil {
		if *timeout <= 0 {
			return node.ExecRequest{}, errdefs.InvalidArgument("timeout: %s must be positive", *timeout)
		}
		r.Timeout = *timeout
	}
	if r.OutputLimit < 0 {
		return node.ExecRequest{}, errdefs.InvalidArgument("output_limit_bytes: %d must not be negative", r.OutputLimit)
	}
	return r, nil
}

func resultToProto(res backend.ExecResult) *corralv1.ExecResult {
	return &corralv1.ExecResult{
		ExitCode:  int32(res.ExitCode),
		Signal:    int32(res.Signal),
		TimedOut:  res.TimedOut,
		OomKilled: res.OOMKilled,
		Truncated: res.Truncated,
		Duration:  durationpb.New(res.Duration),
	}
}

func fileInfoToProto(fi backend.FileInfo) *corralv1.FileInfo {
	return &corralv1.FileInfo{
		Name:       fi.Name,
		Path:       fi.Path,
		Size:       fi.Size,
		Mode:       uint32(fi.Mode.Perm()),
		IsDir:      fi.Mode.IsDir(),
		IsSymlink:  fi.Mode&fs.ModeSymlink != 0,
		ModifiedAt: timestamppb.New(fi.ModTime),
		Uid:        fi.UID,
		Gid:        fi.GID,
	}
}

// modeFromProto checks permission bits; 0 takes def.
func modeFromProto(field string, mode uint32, def fs.FileMode) (fs.FileMode, error) {
	if mode == 0 {
		return def, nil
	}
	if mode&^0o7777 != 0 {
		return 0, errdefs.InvalidArgument("%s: %#o has bits outside 07777", field, mode)
	}
	return fs.FileMode(mode&0o777) | unixSpecialBits(mode), nil
}

func unixSpecialBits(mode uint32) fs.FileMode {
	var m fs.FileMode
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// ioToProto is nil for a sandbox that asked for no I/O limits of its own.
func ioToProto(io state.IOLimits) *corralv1.IOLimits {
	if io == (state.IOLimits{}) {
		return nil
	}
	return &corralv1.IOLimits{ReadBps: io.ReadBPS, WriteBps: io.WriteBPS, ReadIops: io.ReadIOPS, WriteIops: io.WriteIOPS}
}

// toProtos converts each of xs with f (nil for none).
func toProtos[T, P any](xs []T, f func(T) P) []P {
	var out []P
	for _, x := range xs {
		out = append(out, f(x))
	}
	return out
}
