// Package agentproto is the wire protocol between the node and corral-agent,
// the init of a microVM guest. The transport is one byte stream (a
// virtio-serial port under QEMU, after the port handshake of portsync.go;
// a vsock connection under Firecracker) carrying a yamux session; every operation is one yamux stream that the
// node opens. On a stream both sides write frames: a kind byte, a
// big-endian uint32 length and the payload. The first frame is always a
// KindRequest carrying Version and the sandbox's Secret; the agent refuses
// any stream whose request lacks either.
//
// It is imported by the static agent, so it stays small: the standard
// library, yamux and internal/errdefs only.
//
// Changelog of Version:
//
//	1 (2026-11-30): ping, exec (streamed stdio, signals, exit), file
//	  operations (write, read, list, stat, remove, mkdir), detach.
//	1 (2026-12-01): FileInfo carries link_target, optional (an older
//	  agent omits it), so the version stays.
//	2 (2026-12-01): extract and archive (directory trees as tar streams
//	  in KindData frames; Reply.Count is the entries extracted). An agent
//	  serves every version from an op's MinVersion up to its own, and the
//	  node sends each request with its op's MinVersion, so a guest still
//	  running an agent of version 1 refuses only the new ops. Request.Now
//	  (optional) on pings sets the guest's clock. Identity (a restored guest takes its
//	  new sandbox's secret, hostname and network).
//	3 (2026-12-01): exec on a terminal: Exec.PTY opens a pseudo-terminal
//	  of that size as the command's stdin, stdout and stderr (output
//	  arrives as KindStdout), KindResize frames change its size. Only such
//	  an exec is sent with version 3 (RequestVersion); an agent of version
//	  2 refuses it with its version error, which the node reports as the
//	  missing capability (RefusedVersion).
//	4 (2026-12-02): limits (Limits): the agent starts every later command
//	  in a guest cgroup holding them (pids.max). Sent with version 4 only;
//	  an agent of version 3 refuses it, and its guest runs without them.
package agentproto

import (
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Version is the protocol version; bump it with a dated changelog line.
const Version = 4

// MinVersion is the lowest version that has op: what the node sends it
// with, so that older agents keep serving the ops they know.
func MinVersion(op string) int {
	switch op {
	case OpExtract, OpArchive, OpIdentity:
		return 2
	case OpLimits:
		return 4
	}
	return 1
}

// RequestVersion is what the node sends req with: its op's MinVersion,
// raised for the options of an op that came later.
func RequestVersion(req *Request) int {
	if req.Op == OpExec && req.Exec != nil && req.Exec.PTY != nil {
		return 3
	}
	return MinVersion(req.Op)
}

// Capability names what a request of a version above 1 needs, for the
// error the node gives when an older agent refuses it.
func Capability(req *Request) string {
	if req.Op == OpExec && req.Exec != nil && req.Exec.PTY != nil {
		return "exec on a terminal (pty)"
	}
	return fmt.Sprintf("op %q", req.Op)
}

// versionRefusal starts the error an agent of every version gives for a
// request outside the versions it serves.
const versionRefusal = "agent: protocol version "

// VersionError is the agent's refusal of a request of an unserved version.
func VersionError(req *Request, max int) error {
	return errdefs.InvalidArgument(versionRefusal+"%d for %q, this agent serves %d..%d", req.Version, req.Op, MinVersion(req.Op), max)
}

// RefusedVersion reports whether err is an agent's VersionError.
func RefusedVersion(err error) bool {
	return errdefs.IsInvalidArgument(err) && strings.HasPrefix(err.Error(), versionRefusal)
}

// MaxFrame bounds one frame's payload.
const MaxFrame = 1 << 20

// ChunkSize is the payload size data is split into.
const ChunkSize = 64 << 10

// Frame kinds.
const (
	KindRequest byte = 1 // JSON Request, node -> agent, first on a stream
	KindReply   byte = 2 // JSON Reply, agent -> node
	KindStdout  byte = 3 // command output
	KindStderr  byte = 4
	KindStdin   byte = 5 // node -> agent: command input
	KindEOF     byte = 6 // end of stdin (exec) or of file data (write/read)
	KindSignal  byte = 7 // node -> agent: JSON Signal for the exec's group
	KindData    byte = 8 // file content, either direction
	KindResize  byte = 9 // node -> agent: JSON TermSize of an exec's terminal (version 3)
)

// Ops of requests.
const (
	OpPing   = "ping"
	OpExec   = "exec"
	OpWrite  = "write"
	OpRead   = "read"
	OpList   = "list"
	OpStat   = "stat"
	OpRemove = "remove"
	OpMkdir  = "mkdir"
	// OpExtract unpacks the tar stream of the KindData frames that follow
	// (until KindEOF) into directory File.Path; OpArchive replies ok, then
	// sends a tar stream of File.Path as KindData frames and KindEOF.
	OpExtract = "extract"
	OpArchive = "archive"
	// OpDetach makes the agent drop its yamux session after replying and
	// wait for a new one: the node sends it before it snapshots the VM, so
	// that the restored agent does not expect the old session's stream ids.
	OpDetach = "detach"
	// OpIdentity gives the agent of a VM restored from a snapshot its new
	// sandbox's identity (Identity): the request carries the snapshot's
	// secret, later ones the new secret.
	OpIdentity = "identity"
	// OpLimits sets the limits (Limits) that the commands the agent
	// starts from then on are held to, together.
	OpLimits = "limits"
)

// Ops of replies.
const (
	ReplyOK      = "ok"
	ReplyStarted = "started"
	ReplyExit    = "exit"
	ReplyError   = "error"
)

// Request opens a stream.
type Request struct {
	Version int    `json:"v"`
	Secret  string `json:"secret"`
	Op      string `json:"op"`
	Exec    *Exec  `json:"exec,omitempty"`
	File    *File  `json:"file,omitempty"`
	// Identity is OpIdentity's argument.
	Identity *Identity `json:"identity,omitempty"`
	// Limits is OpLimits' argument.
	Limits *Limits `json:"limits,omitempty"`
	// Now, on a ping, is the node's clock (Unix nanoseconds): the agent
	// sets the guest's to it, since a microVM has no RTC (and a restored
	// one wakes with its snapshot's time). Optional: older agents ignore it.
	Now int64 `json:"now,omitempty"`
}

// Identity is what a restored guest takes over from its new sandbox.
type Identity struct {
	Secret   string `json:"secret"`
	Hostname string `json:"hostname"`
	// Network, for a networked guest, is its new slot: eth0 takes its MAC
	// and addresses in place of the snapshot's.
	Network *GuestNetwork `json:"network,omitempty"`
}

// Limits are the guest-side limits of the commands the agent starts
// (the VMM's host cgroup holds CPU; the disk's size holds disk).
type Limits struct {
	// Pids caps the processes and threads of all commands together (0:
	// no cap).
	Pids int64 `json:"pids,omitempty"`
}

// Exec starts a command; stdin frames follow when Stdin is set.
type Exec struct {
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	User  string   `json:"user"`
	Stdin bool     `json:"stdin"`
	// CPUSeconds, when positive, is RLIMIT_CPU of the command.
	CPUSeconds int64 `json:"cpu_s,omitempty"`
	// OutputLimit caps stdout+stderr bytes the agent forwards (0: none);
	// past it the agent closes the output pipes and reports Truncated.
	OutputLimit int64 `json:"out_limit,omitempty"`
	// PTY, when set, runs the command as a session leader on a new
	// terminal of this size (version 3); stdin frames feed the terminal.
	PTY *TermSize `json:"pty,omitempty"`
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// File is a file operation's arguments.
type File struct {
	Path      string      `json:"path"`
	Mode      fs.FileMode `json:"mode,omitempty"`
	Append    bool        `json:"append,omitempty"`
	Parents   bool        `json:"parents,omitempty"`
	Recursive bool        `json:"recursive,omitempty"`
	Offset    int64       `json:"offset,omitempty"`
	Limit     int64       `json:"limit,omitempty"`
}

// Signal asks the agent to signal the exec's process group.
type Signal struct {
	Signal int `json:"sig"`
}

// FileInfo mirrors backend.FileInfo.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
	UID     uint32      `json:"uid"`
	GID     uint32      `json:"gid"`
	// LinkTarget is a symlink's target as stored.
	LinkTarget string `json:"link_target,omitempty"`
}

// Reply is an agent -> node message.
type Reply struct {
	Op        string     `json:"op"`
	Pid       int        `json:"pid,omitempty"`
	ExitCode  int        `json:"code"`
	Signal    int        `json:"sig,omitempty"`
	CPUNanos  int64      `json:"cpu_ns,omitempty"`
	Truncated bool       `json:"truncated,omitempty"`
	OOMKilled bool       `json:"oom,omitempty"`
	Written   int64      `json:"written,omitempty"`
	Count     int64      `json:"count,omitempty"`
	Info      *FileInfo  `json:"info,omitempty"`
	Entries   []FileInfo `json:"entries,omitempty"`
	Error     string     `json:"error,omitempty"`
	Class     string     `json:"class,omitempty"`
}

// CheckSecret compares a request's secret in constant time.
func CheckSecret(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// Stream writes and reads frames on one stream. Writes are serialized, so
// output and exit goroutines may share it.
type Stream struct {
	rw  io.ReadWriter
	wmu sync.Mutex
	hdr [5]byte
}

// NewStream wraps a yamux stream.
func NewStream(rw io.ReadWriter) *Stream { return &Stream{rw: rw} }

// Write sends one frame.
func (s *Stream) Write(kind byte, p []byte) error {
	if len(p) > MaxFrame {
		return fmt.Errorf("frame of %d bytes exceeds %d", len(p), MaxFrame)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := s.rw.Write(append(hdr[:], p...)); err != nil {
		return err
	}
	return nil
}

// WriteJSON sends v as one frame of kind.
func (s *Stream) WriteJSON(kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.Write(kind, b)
}

// Read returns the next frame; the payload is freshly allocated.
func (s *Stream) Read() (byte, []byte, error) {
	if _, err := io.ReadFull(s.rw, s.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(s.hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d", n, MaxFrame)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(s.rw, p); err != nil {
		return 0, nil, fmt.Errorf("read frame: %w", err)
	}
	return s.hdr[0], p, nil
}

// ReadJSON reads a frame that must be of kind and decodes it into v.
func (s *Stream) ReadJSON(kind byte, v any) error {
	k, p, err := s.Read()
	if err != nil {
		return err
	}
	if k != kind {
		return fmt.Errorf("got frame kind %d, want %d", k, kind)
	}
	return json.Unmarshal(p, v)
}

// ErrorReply turns err into a reply that keeps its errdefs class.
func ErrorReply(err error) Reply {
	return Reply{Op: ReplyError, Error: err.Error(), Class: classOf(err)}
}

// Err returns the error a reply carries (nil unless it is an error reply),
// with its errdefs class restored.
func (r Reply) Err() error {
	if r.Op != ReplyError {
		return nil
	}
	for _, c := range classes {
		if c.name == r.Class {
			return c.make("%s", r.Error)
		}
	}
	return errors.New(r.Error)
}

var classes = []struct {
	name  string
	class error
	make  func(string, ...any) error
}{
	{"invalid_argument", errdefs.ErrInvalidArgument, errdefs.InvalidArgument},
	{"not_found", errdefs.ErrNotFound, errdefs.NotFound},
	{"already_exists", errdefs.ErrAlreadyExists, errdefs.AlreadyExists},
	{"failed_precondition", errdefs.ErrFailedPrecondition, errdefs.FailedPrecondition},
	{"resource_exhausted", errdefs.ErrResourceExhausted, errdefs.ResourceExhausted},
	{"permission_denied", errdefs.ErrPermissionDenied, errdefs.PermissionDenied},
	{"unavailable", errdefs.ErrUnavailable, errdefs.Unavailable},
	{"not_supported", errdefs.ErrNotSupported, errdefs.NotSupported},
}

func classOf(err error) string {
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.name
		}
	}
	return ""
}

// Paths of the guest.
const (
	// ConfigPath holds FileConfig in the initramfs; the agent deletes it.
	ConfigPath = "/corral/config.json"
	// BusyboxPath is the static busybox in the initramfs.
	BusyboxPath = "/corral/busybox"
	// ShellPath is where commands see that busybox, read-only: shell
	// execs run it, not the image's /bin/sh.
	ShellPath = "/.corral/sh"
)

// FileConfig is /corral/config.json in the guest's initramfs, written per
// sandbox by the node and deleted by the agent once read.
type FileConfig struct {
	Secret   string `json:"secret"`
	Hostname string `json:"hostname"`
	// Layers are the read-only layers, topmost first, by virtio-blk serial.
	Layers []LayerDisks `json:"layers"`
	// Disk is the serial of the writable ext4 disk.
	Disk string `json:"disk"`
	// Port is the virtio-serial port name of the control channel; when
	// empty the agent listens on vsock port VsockPort instead.
	Port      string `json:"port,omitempty"`
	VsockPort uint32 `json:"vsock_port,omitempty"`
	// Modules are kernel module paths in the initramfs, in load order.
	Modules []string `json:"modules"`
	// Network configures the guest's eth0; nil: loopback only.
	Network *GuestNetwork `json:"network,omitempty"`
}

// GuestNetwork is the guest's side of its sandbox network slot.
type GuestNetwork struct {
	MAC      string `json:"mac"`      // of the NIC to configure (named eth0)
	Addr4    string `json:"addr4"`    // prefix, e.g. 10.88.0.7/24
	Addr6    string `json:"addr6"`    // prefix
	Gateway4 string `json:"gateway4"` // default routes
	Gateway6 string `json:"gateway6"`
	// ResolvConf is bound read-only over /etc/resolv.conf.
	ResolvConf string `json:"resolv_conf"`
}

// LayerDisks is one layer: its EROFS image disk and extra blob devices.
type LayerDisks struct {
	Image   string   `json:"image"`
	Devices []string `json:"devices,omitempty"`
}
