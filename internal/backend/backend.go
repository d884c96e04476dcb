// Package backend defines the seam between the node and the isolation
// technologies: every backend (container, fncall, microvm, vm) implements
// Backend, and every sandbox it makes implements Sandbox. The node owns
// records, TTLs and routing; a backend owns processes, mounts, cgroups and
// devices. It also holds what every backend's Create shares: the table of
// undoable steps (Step, Undo, RunSteps) and SandboxBinary. It imports
// errdefs only; packages here must not import the node, control or API
// layers (internal/deptest).
package backend

import (
	"context"
	"io"
	"io/fs"
	"net"
	"time"
)

// Resources are the limits of one sandbox, already validated and defaulted
// by the node.
type Resources struct {
	CPUMillis   int64 // 1000 = one core
	MemoryBytes int64
	DiskBytes   int64 // writable layer, blocks
	DiskInodes  int64 // writable layer, inodes
	Pids        int64
	// BestEffort: the sandbox's processes only run on CPU time that
	// others leave idle.
	BestEffort bool
	// IO bounds the sandbox's disk I/O (zero fields: the backend's limits).
	IO IOLimits
}

// IOLimits bound disk I/O in bytes and operations per second.
type IOLimits struct {
	ReadBPS, WriteBPS, ReadIOPS, WriteIOPS int64
}

// Spec is what a backend needs to create a sandbox.
type Spec struct {
	ID string
	// Layers are read-only root filesystem layers as host directories, the
	// topmost first (overlayfs lowerdir order).
	Layers []string
	// LayerDisks are the same layers as files (topmost first), for
	// backends that hand them to a guest kernel as block devices.
	LayerDisks []LayerDisk
	Resources  Resources
	Hostname   string
	// Resettable asks for a sandbox that implements Resetter (fncall
	// pools). Its writable layer is a tmpfs of Resources.DiskBytes inside
	// the sandbox, charged to its memory limit.
	Resettable bool
	// Recyclable asks for a container sandbox that implements Recycler: a
	// full container sandbox on network mode none (its usual disk with the
	// disk limit, its files, terminals, pause), whose view init can swap
	// under itself like a Resettable one's, so that a deleted one can be
	// scrubbed and handed to a later create instead of torn down.
	Recyclable bool
	// Network is the network policy; the zero value is mode none
	// (loopback only).
	Network Network
	// Image is the image name as requested, for backends implementing
	// ImageOwner (Layers and LayerDisks are empty then).
	Image string
}

// Network is a sandbox's network policy: Mode "none", "allowlist" or
// "open", and allow rules in the syntax of netpolicy.ParseRule. The node
// checks it (netpolicy.Check: errors name network.mode and
// network.allow[i]); the backend expands presets and enforces it.
type Network struct {
	Mode  string
	Allow []string
}

// Networker is implemented by sandboxes whose network policy can change
// while they run (those created with a mode other than none).
type Networker interface {
	// UpdateNetwork replaces the policy; it is in force on return.
	UpdateNetwork(ctx context.Context, n Network) error
	// NetworkStats reads the refused attempts.
	NetworkStats(ctx context.Context) (NetworkStats, error)
}

// NetworkStats are a sandbox's refused attempts.
type NetworkStats struct {
	// Total counts every refused connect, send and packet.
	Total    uint64
	Refusals []NetworkRefusal
}

// NetworkRefusal is one refused destination (or name, for Hook "dns").
type NetworkRefusal struct {
	Address  string
	Port     uint16
	Protocol string
	Hook     string
	Name     string
	Count    uint64
}

// Resetter is implemented by sandboxes created with Spec.Resettable.
type Resetter interface {
	// Reset kills every process of the sandbox but keep, restores its root
	// filesystem to the image's state and zeroes the memory peak. When the
	// filesystem had been written to, keep is killed too and dirty is set.
	// On error the sandbox must not be reused.
	Reset(ctx context.Context, keep []int) (dirty bool, err error)
	// MemoryPeak is the highest memory use since the last Reset.
	MemoryPeak() (int64, error)
	// OOMKills counts the OOM kills in the sandbox so far.
	OOMKills() (uint64, error)
	// CPUUsage is the CPU time every process of the sandbox has used so
	// far (its cgroup's, so detached processes count too).
	CPUUsage() (time.Duration, error)
	// KillAllBut kills every process of the sandbox but its init and the
	// processes keep (pids inside the sandbox), leaving its files alone.
	KillAllBut(ctx context.Context, keep []int) error
}

// Recycler is implemented by sandboxes of a backend that makes them with
// Spec.Recyclable: a deleted one made so is made as good as new for a
// later create of the same project instead of being torn down (see node's
// warm pools).
type Recycler interface {
	// Recyclable says whether the sandbox was made with Spec.Recyclable:
	// only such a one may be scrubbed and renewed.
	Recyclable() bool
	// Scrub kills every process of the sandbox but its init and removes
	// what they left in its kernel namespaces (SysV IPC objects, POSIX
	// message queues; the PID counter goes back to the start); it notes
	// whether the sandbox's files were changed. When it returns nothing of
	// the sandbox runs. On error the sandbox must be stopped, not reused.
	Scrub(ctx context.Context) error
	// Renew, after Scrub, gives a sandbox whose files were changed a fresh
	// writable layer (and /dev, /dev/shm), and starts its usage figures
	// (CPU time, OOM kills, memory peak) again from zero. On error the
	// sandbox must be stopped, not reused.
	Renew(ctx context.Context) error
}

// Backend creates sandboxes of one kind and cleans up after them.
type Backend interface {
	// Name is the value of CreateRequest.backend that selects this backend.
	Name() string
	// Create makes and starts a sandbox. On error nothing of it remains.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Recover re-attaches to a sandbox that outlived a daemon restart, from
	// the record its Sandbox.Record returned, and leaves it running (thawed).
	// It returns an errdefs.NotFound error when the sandbox is no longer alive.
	Recover(ctx context.Context, id string, record []byte) (Sandbox, error)
	// Cleanup removes every process, mount, cgroup and file ever made for id.
	// It is idempotent and needs no live Sandbox (record may be nil).
	Cleanup(ctx context.Context, id string, record []byte) error
	// Sweep removes leftovers of sandboxes for which keep returns false:
	// what a crash between create steps may have left without a record.
	Sweep(ctx context.Context, keep func(id string) bool) error
}

// UpperSnapshotter is implemented by backends whose sandboxes' upper
// directories the node can copy (pack).
type UpperSnapshotter interface {
	// SnapshotUpper copies sandbox id's upper directory as it is
	// (whiteouts, xattrs, hard links, holes; reflinked where the
	// filesystem can) into a host directory of the node's, and returns it
	// with the function that removes it. A running sandbox must be paused
	// around the call for a consistent copy, and only around it: what is
	// then built from the copy needs no pause.
	SnapshotUpper(ctx context.Context, id string) (dir string, remove func() error, err error)
}

// Sandbox is one live sandbox. Methods are safe for concurrent use.
type Sandbox interface {
	Files
	ID() string
	// Record is an opaque blob the node persists so that Recover and Cleanup
	// can find this sandbox after a restart.
	Record() []byte
	// Exec runs a command and streams its output to out. It returns when the
	// command's main process has exited (background processes it started
	// keep running). Cancelling ctx kills the command's process group.
	Exec(ctx context.Context, spec ExecSpec, out OutputFunc) (ExecResult, error)
	// Pause freezes every process; Resume thaws them. Both are idempotent.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Done is closed when the sandbox's processes are gone for any reason.
	Done() <-chan struct{}
	// Stop kills every process and releases runtime resources (cgroups,
	// mounts); the writable layer stays until Backend.Cleanup.
	Stop(ctx context.Context) error
}

// ExecSpec is one command, already validated and defaulted by the node.
type ExecSpec struct {
	Argv []string
	// Shell: Argv is ["/bin/sh", "-c", script]. A backend with a shell of
	// its own (out of the agent's reach) runs the script with that one, so
	// that an agent replacing the image's /bin/sh cannot hijack later
	// shell commands.
	Shell bool
	// Env is the complete environment ("KEY=VALUE").
	Env []string
	// Cwd is an absolute path inside the sandbox.
	Cwd string
	// User is a name from the sandbox's /etc/passwd, "uid" or "uid:gid".
	User  string
	Stdin []byte
	// StdinReader, when set instead of Stdin, is copied to the command's
	// stdin until EOF (a long-running helper fed by its caller).
	StdinReader io.Reader
	Timeout     time.Duration
	// OutputLimit caps stdout+stderr bytes delivered to out; past it the
	// output pipes are closed and ExecResult.Truncated is set.
	OutputLimit int64
	// CPULimit, when positive, is the command's CPU time limit (RLIMIT_CPU,
	// rounded up to whole seconds).
	CPULimit time.Duration
	// PTY, when set, runs the command as a session leader on a new
	// terminal of that size: its stdin, stdout and stderr are the
	// terminal, output arrives as Stdout, and StdinReader feeds the
	// terminal's input. Only sandboxes implementing Interactive honour it.
	PTY *TermSize
	// Started, when set, is called once the command runs, before any of
	// its output, with a handle valid until Exec returns. Only sandboxes
	// implementing Interactive call it.
	Started func(Process)
	// ThenReset (sandboxes implementing Resetter): once the command has
	// exited, the sandbox is reset, sparing ResetKeep, before Exec returns,
	// and the next Reset returns that reset's outcome instead of making
	// another. For a caller that resets after every command (fncall) it
	// saves round trips to the sandbox, and nothing the command started
	// runs once Exec returns. What the command wrote is gone by then too.
	// The caller calls Reset next; an Exec in between voids the outcome
	// kept (Reset then resets again).
	ThenReset bool
	ResetKeep []int
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Cols, Rows uint16
}

// Process is a running command of Exec (see ExecSpec.Started).
type Process interface {
	// Pid is the command's pid as the sandbox sees it; it is also its
	// process group.
	Pid() int
	// Signal signals the command's process group.
	Signal(sig int) error
	// Resize changes the size of the command's terminal (PTY commands).
	Resize(size TermSize) error
}

// Interactive is implemented by sandboxes whose Exec honours
// ExecSpec.PTY and ExecSpec.Started: the node's long-running processes
// (listed, signalled, fed stdin while they run) need it.
type Interactive interface {
	Interactive()
}

// Renamer is implemented by sandboxes that can rename files.
type Renamer interface {
	// Rename moves from to to inside the sandbox's root, replacing a file
	// at to; both paths follow the rules of Files.
	Rename(ctx context.Context, from, to string) error
}

// PortDialer is implemented by sandboxes whose TCP ports the node can
// reach from outside (as clients of servers running inside).
type PortDialer interface {
	// DialPort connects to 127.0.0.1:port inside the sandbox's network
	// namespace.
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// Chowner is implemented by sandboxes that can change a file's owner.
type Chowner interface {
	// Chown gives path (a symlink itself) to uid:gid as the sandbox sees
	// ids.
	Chown(ctx context.Context, path string, uid, gid uint32) error
}

// WatchOp is the kind of a change WatchDir reports.
type WatchOp int

const (
	WatchCreate WatchOp = iota + 1
	WatchWrite
	WatchRemove
	WatchRename // moved away; the arrival is a WatchCreate
	WatchChmod
)

// WatchEvent is one change in a watched directory.
type WatchEvent struct {
	// Name is the path of the changed entry relative to the watched
	// directory.
	Name string
	Op   WatchOp
}

// Watcher is implemented by sandboxes that can watch directories.
type Watcher interface {
	// WatchDir calls fn for every change in directory path (and its
	// subdirectories when recursive) until ctx ends, then returns nil.
	// It returns an error before watching when path is not a directory.
	// ready, when set, is called once the watch is in place.
	WatchDir(ctx context.Context, path string, recursive bool, ready func(), fn func(WatchEvent)) error
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int // -1 when killed by a signal
	Signal   int
	TimedOut bool
	// OOMKilled: the OOM killer killed a process of the sandbox while the
	// command ran (the command itself or one of its children).
	OOMKilled bool
	Truncated bool
	Duration  time.Duration
	// CPUTime is the main process's user+system time (with the children
	// it waited for).
	CPUTime time.Duration
}

// Stream names an output stream of a command.
type Stream int

const (
	Stdout Stream = 1
	Stderr Stream = 2
)

// OutputFunc receives output chunks in order. p is only valid during the
// call. An error from it kills the command and ends Exec with that error.
type OutputFunc func(stream Stream, p []byte) error

// FileInfo describes a file inside a sandbox.
type FileInfo struct {
	Name    string
	Path    string // absolute inside the sandbox
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
	UID     uint32
	GID     uint32
	// LinkTarget is a symlink's target as stored (not resolved).
	LinkTarget string
}

// WriteOptions control WriteFile.
type WriteOptions struct {
	Mode        fs.FileMode // permission bits of a new file
	Append      bool
	MakeParents bool
}

// Files are the file operations on a sandbox's root filesystem. Every path is
// absolute inside the sandbox and can never resolve outside it (symlinks and
// ".." included).
type Files interface {
	WriteFile(ctx context.Context, path string, r io.Reader, opts WriteOptions) (int64, error)
	// ReadFile opens path for reading from offset, at most limit bytes
	// (limit 0: to the end). The caller closes the reader.
	ReadFile(ctx context.Context, path string, offset, limit int64) (io.ReadCloser, error)
	ListDir(ctx context.Context, path string) ([]FileInfo, error)
	Stat(ctx context.Context, path string) (FileInfo, error)
	Remove(ctx context.Context, path string, recursive bool) error
	MakeDir(ctx context.Context, path string, mode fs.FileMode, parents bool) error
}

// LayerDisk is one read-only layer as the files a virtual machine attaches
// as block devices: Image is the EROFS image, Devices its extra blob
// devices (mounted with EROFS "device=" options), in order.
type LayerDisk struct {
	Image   string   `json:"image"`
	Devices []string `json:"devices,omitempty"`
}

// ExitReasoner is implemented by sandboxes that can tell why they ended on
// their own (a guest kernel panic, an out-of-memory kill of the VMM).
type ExitReasoner interface {
	// ExitReason is empty while the sandbox runs.
	ExitReason() string
}

// Usage is a sandbox's resource use at one moment.
type Usage struct {
	CPU            time.Duration // CPU time used so far
	MemoryBytes    int64         // memory charged now, page cache included
	CacheBytes     int64         // of which page cache
	DiskUsedBytes  int64         // writable layer
	DiskTotalBytes int64
}

// Usager is implemented by sandboxes that report their resource use.
type Usager interface {
	Usage(ctx context.Context) (Usage, error)
}
