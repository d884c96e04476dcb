// Package initproto is the wire protocol between the node and a container
// sandbox's init (cmd/corral-init): one JSON message per SOCK_SEQPACKET
// packet, file descriptors passed with SCM_RIGHTS, and one integer Version
// carried by every request and checked by init. It is imported by init, so it
// must stay tiny: the standard library and golang.org/x/sys/unix only.
//
// Changelog of Version:
//
//	1 (2025-06): config/ready on the setup socket; ping, exec, kill.
//	2 (2026-11-30): Config.Disk and Config.DiskDir: init mounts the
//	  sandbox's ext4 disk and keeps the overlay's upper and work dirs on it.
//	3 (2026-11-30): Config.Seccomp: the node compiles the filter once and
//	  sends the program; init installs it without compiling.
//	4 (2026-11-30): pool mode for fncall (Config.Pool, PoolSeccomp,
//	  ViewBytes): the sandbox's view is mounted under init's own tmpfs root
//	  and every command is chrooted into it; OpReset kills every process
//	  and re-mounts a dirtied view (sparing Request.Keep when clean); the
//	  exit reply carries CPU time.
//	5 (2026-11-30): Config.FileSizeBytes: init sets RLIMIT_FSIZE for itself
//	  and every process of the sandbox.
//	6 (2026-11-30): Config.Shell: init mounts the node's static shell
//	  read-only at ShellPath for shell execs.
//	7 (2026-11-30): Config.ResolvConf: init binds the node's resolv.conf
//	  (naming the DNS proxy) read-only over /etc/resolv.conf.
//	8 (2026-11-30): user namespaces. Init starts as root of its own user
//	  namespace, started in the directory of its root; the config message
//	  carries Config.Mounts fds of detached mounts the node made idmapped
//	  to it (the sandbox's root overlay, or in pool mode one read-only
//	  mount per layer). Init mounts neither layers nor disks itself any more (Disk,
//	  DiskDir, UpperDir, WorkDir, Layers and Rootfs are gone).
//	  Config.BestEffort: SCHED_IDLE for every process, RLIMIT_NICE 0.
//	  Config.ResolvConf is a bool: the node's resolv.conf comes as the
//	  mount after the root (init could not walk the node's run dir);
//	  Config.Sysfs: a networked sandbox's /sys comes from the node too.
//	9 (2026-12-01): ExecRequest.Tty: the command starts as a session
//	  leader with its stdin (a terminal the node made) as controlling
//	  terminal.
//	10 (2026-12-01): Config.FileSizeBytes is gone: sandboxes get no
//	  RLIMIT_FSIZE (the disk quota bounds writes, as under Docker).
//	11 (2026-12-02): Config.Stub: the config message carries one more fd,
//	  the node's corral-initstub, which init execs as PID 1 in place of
//	  its serving stage; the stub answers ping and kill and starts
//	  corral-init's server (serve child) for every other request. Pool
//	  mode keeps the Go PID 1.
//	12 (2026-12-06): Config.View: in pool mode the one mount is the
//	  sandbox's root overlay the node made (its writable layer a disk),
//	  which init attaches as the view (with the node's shell) instead of
//	  mounting layers over a tmpfs; a reset that finds it written detaches
//	  it and answers Dirty, and OpView on the same connection brings the
//	  fresh overlay that replaces it. Execs in such a sandbox keep the PID
//	  counter where it is (a reset still rewinds it).
//	13 (2026-12-07): ExecRequest.ThenReset and ResetKeep (pool mode):
//	  once the command has exited, init resets the sandbox as for OpReset
//	  before it sends the exit reply, which carries the reset's Dirty and
//	  ResetError, so that a node resetting after every call makes one
//	  round trip to init per call instead of three (the exec, the kill of
//	  what the call left running, the reset). ExecRequest.NoStarted: no
//	  started reply; the first is the exit, or the error of a command
//	  that could not start.
//	14 (2026-12-07): an exec connection stays open after the exec's last
//	  reply: init serves the next request sent on it (kills of the exec
//	  first, in order), so that a node may keep one connection for a
//	  sandbox's execs instead of dialing (and init accepting) one per
//	  exec.
package initproto

// ShellPath is where a sandbox sees the node's shell (Config.Shell). Its
// directory is a read-only mount point, so it cannot be replaced, renamed
// or removed from inside.
const ShellPath = "/.corral/sh"

// Version is the protocol version; bump it with a dated changelog line.
const Version = 14

// Fds init is started with (ExtraFiles order).
const (
	// ListenFd is the listening SOCK_SEQPACKET control socket.
	ListenFd = 3
	// SetupFd is one end of a socketpair carrying Config and the ready reply.
	SetupFd = 4
)

// Ops of requests and replies.
const (
	OpPing    = "ping"
	OpExec    = "exec"
	OpKill    = "kill"
	OpReset   = "reset"
	OpView    = "view"
	OpConfig  = "config"
	OpReady   = "ready"
	OpPong    = "pong"
	OpStarted = "started"
	OpExit    = "exit"
	OpError   = "error"
)

// Error classes in replies, mapped to errdefs by the node.
const (
	ClassNotFound         = "not_found"
	ClassInvalidArgument  = "invalid_argument"
	ClassPermissionDenied = "permission_denied"
	ClassResource         = "resource_exhausted"
	ClassInternal         = "internal"
)

// Config is what init needs to build the sandbox, sent on the setup socket.
type Config struct {
	Version int    `json:"v"`
	Op      string `json:"op"`
	// Mounts is how many fds of detached mounts come with the config
	// message, all idmapped to init's user namespace: the root overlay, or
	// in pool mode one read-only mount per layer, topmost first. Init
	// attaches the root on its working directory at start (see
	// launch.SpawnConfig.Dir).
	Mounts   int    `json:"mounts"`
	Hostname string `json:"hostname"`
	// Seccomp is the compiled seccomp program (seccomp.Encode); init refuses
	// a config without one unless NoSeccomp is set (runtime tests only).
	Seccomp []byte `json:"seccomp,omitempty"`
	// Shell is a host path of a static POSIX shell that init bind-mounts
	// read-only at ShellPath inside the sandbox (empty: none).
	Shell string `json:"shell,omitempty"`
	// ResolvConf: the mount after the root is a detached read-only bind
	// of the node's resolv.conf (naming its DNS proxy), for init to put
	// over /etc/resolv.conf.
	ResolvConf bool `json:"resolv_conf,omitempty"`
	// Sysfs: the last mount is a read-only sysfs the node made in the
	// sandbox's network namespace. The kernel mounts a sysfs only for a
	// holder of CAP_SYS_ADMIN over the owner of the mounter's network
	// namespace, and a pooled one belongs to the node, not to init.
	Sysfs     bool `json:"sysfs,omitempty"`
	NoSeccomp bool `json:"no_seccomp,omitempty"`
	// BestEffort: init and every process of the sandbox run under
	// SCHED_IDLE, with RLIMIT_NICE 0 so that none can leave it.
	BestEffort bool `json:"best_effort,omitempty"`
	// Pool selects the resettable pool mode: init's root is a small tmpfs
	// holding the layers (bind mounts) and the view, an overlay of them
	// with its upper on a tmpfs of ViewBytes, that commands are chrooted
	// into. Seccomp is then init's own (relaxed: mount, umount2, chroot and
	// unshare(CLONE_FS) for resets) and PoolSeccomp the commands' filter,
	// stacked on it.
	Pool        bool   `json:"pool,omitempty"`
	PoolSeccomp []byte `json:"pool_seccomp,omitempty"`
	ViewBytes   int64  `json:"view_bytes,omitempty"`
	// View (pool mode): the one mount is the view itself, an overlay the
	// node made on a writable layer of its own (a recyclable container
	// sandbox, backend.Spec.Recyclable), in place of the layers and the
	// tmpfs upper; ViewBytes is unused. A dirty reset detaches it and waits
	// for OpView.
	View bool `json:"view,omitempty"`
	// Stub: the fd after the mounts is the node's corral-initstub, PID 1
	// of the hardened sandbox (not in pool mode).
	Stub bool `json:"stub,omitempty"`
}

// Request is a node -> init message; the first on a connection opens it.
type Request struct {
	Version int          `json:"v"`
	Op      string       `json:"op"`
	Exec    *ExecRequest `json:"exec,omitempty"`
	// Pgid and Signal for OpKill. On an exec connection Pgid may be 0: the
	// exec's own group.
	Pgid   int `json:"pgid,omitempty"`
	Signal int `json:"sig,omitempty"`
	// Keep are pids an OpReset spares (and continues, should they be
	// stopped) unless the view was written to: then every process goes.
	// An OpView request, sent on a reset connection after a Dirty reply
	// of a Config.View sandbox, carries the fd of the fresh view.
	Keep []int `json:"keep,omitempty"`
}

// ExecRequest starts a command. The message carries stdout and stderr fds,
// then stdin when Stdin is set.
type ExecRequest struct {
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	User  string   `json:"user"`
	Stdin bool     `json:"stdin"`
	// CPUSeconds, when positive, is the command's RLIMIT_CPU (soft; the
	// hard limit is one second more), set right after it starts.
	CPUSeconds int64 `json:"cpu_s,omitempty"`
	// Tty: stdin is a terminal; the command gets its own session (its pid
	// is still its process group) with stdin as controlling terminal.
	Tty bool `json:"tty,omitempty"`
	// ThenReset (pool mode only): once the command has exited, init
	// resets the sandbox sparing ResetKeep, as OpReset does, before the
	// exit reply, which carries the reset's Dirty and ResetError. A
	// command that does not start is not followed by a reset.
	ThenReset bool  `json:"then_reset,omitempty"`
	ResetKeep []int `json:"reset_keep,omitempty"`
	// NoStarted: init sends no started reply (the node needs the pid only
	// to hand it out): the first reply is the exit, or the error of a
	// command that could not start. A message fewer on every exec.
	NoStarted bool `json:"no_started,omitempty"`
}

// Reply is an init -> node message.
type Reply struct {
	Op       string `json:"op"`
	Pid      int    `json:"pid,omitempty"`
	ExitCode int    `json:"code"`
	Signal   int    `json:"sig,omitempty"`
	Error    string `json:"error,omitempty"`
	Class    string `json:"class,omitempty"`
	// CPUNanos is the user+system CPU time of an exited command (and of
	// the children it waited for), from wait4.
	CPUNanos int64 `json:"cpu_ns,omitempty"`
	// Dirty: a reset found the view written to and re-mounted it (with
	// Config.View: detached it; the node sends the next with OpView).
	Dirty bool `json:"dirty,omitempty"`
	// ResetError: the reset of ExecRequest.ThenReset failed (the exit
	// reply's other fields hold); the sandbox must not be reused.
	ResetError string `json:"reset_error,omitempty"`
}
