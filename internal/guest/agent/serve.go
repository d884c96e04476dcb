package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/agentproto"
	"github.com/corral-dev/corral/internal/safefs"
)

type runtimeConfig struct {
	secret  string
	channel channel
	// service: the agent is a service of a full VM, not its PID 1.
	service bool
}

// server serves the node's streams; it outlives sessions.
type server struct {
	// secret is replaced by OpIdentity (a VM restored into a new sandbox).
	secretMu sync.Mutex
	secret   string
	procs    *reaper
	files    *safefs.FS
	// cmds holds the commands to the node's limits once it sent them.
	cmds commandsGroup
	// maxVersion is agentproto.Version; tests lower it to play an older
	// agent.
	maxVersion int
}

// serve returns only when the channel fails.
func serve(cfg *runtimeConfig) error {
	unix.Umask(0o022)
	// PID 1 gets no default signal handling; catch everything so that no
	// signal a command sends ends the guest. A service keeps the default
	// handling (its service manager stops it with SIGTERM) and reaps only
	// its own children.
	sigs := make(chan os.Signal, 64)
	if cfg.service {
		signal.Notify(sigs, unix.SIGCHLD)
	} else {
		signal.Notify(sigs)
	}
	s := &server{secret: cfg.secret, procs: newReaper(), maxVersion: agentproto.Version}
	go s.procs.run(sigs)
	s.files = safefs.New(func() (*os.File, error) {
		return os.OpenFile("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if !cfg.service {
		// A microVM's commands run under the group's memory.max from the
		// first one (a full VM's are its systemd's to place).
		if err := s.cmds.ensure(); err != nil {
			logf("commands cgroup: %v", err)
		}
	}
	logf("ready")
	for {
		conn, err := cfg.channel.next()
		if err != nil {
			return err
		}
		s.session(conn)
	}
}

// session serves one yamux session until the node goes away or detaches.
func (s *server) session(conn io.ReadWriteCloser) {
	yc := yamux.DefaultConfig()
	yc.EnableKeepAlive = false // a paused VM must not look dead
	yc.LogOutput = io.Discard
	yc.StreamOpenTimeout = 0
	yc.ConnectionWriteTimeout = time.Minute
	sess, err := yamux.Server(conn, yc)
	if err != nil {
		conn.Close()
		return
	}
	detach := make(chan struct{}, 1)
	go func() {
		<-detach
		sess.Close()
	}()
	for {
		st, err := sess.Accept()
		if err != nil {
			sess.Close()
			return
		}
		go s.handle(st, detach)
	}
}

func (s *server) handle(st io.ReadWriteCloser, detach chan<- struct{}) {
	defer st.Close()
	fs := agentproto.NewStream(st)
	var req agentproto.Request
	if err := fs.ReadJSON(agentproto.KindRequest, &req); err != nil {
		return
	}
	s.secretMu.Lock()
	secret := s.secret
	s.secretMu.Unlock()
	if !agentproto.CheckSecret(req.Secret, secret) {
		_ = fs.WriteJSON(agentproto.KindReply, agentproto.ErrorReply(errdefs.PermissionDenied("agent: request without the sandbox's secret")))
		return
	}
	if req.Version < agentproto.RequestVersion(&req) || req.Version > s.maxVersion {
		_ = fs.WriteJSON(agentproto.KindReply, agentproto.ErrorReply(agentproto.VersionError(&req, s.maxVersion)))
		return
	}
	switch req.Op {
	case agentproto.OpPing:
		setClock(req.Now)
		_ = fs.WriteJSON(agentproto.KindReply, agentproto.Reply{Op: agentproto.ReplyOK, Pid: os.Getpid()})
	case agentproto.OpDetach:
		_ = fs.WriteJSON(agentproto.KindReply, agentproto.Reply{Op: agentproto.ReplyOK})
		detach <- struct{}{}
	case agentproto.OpIdentity:
		s.identity(fs, req.Identity)
	case agentproto.OpLimits:
		s.limits(fs, req.Limits)
	case agentproto.OpExec:
		s.exec(fs, req.Exec)
	case agentproto.OpExtract, agentproto.OpArchive:
		s.tree(fs, req.Op, req.File)
	default:
		s.file(fs, req.Op, req.File)
	}
}

// identity takes over a new sandbox's secret, hostname and network
// addresses; requests with the old secret are refused from here on.
func (s *server) identity(fs *agentproto.Stream, id *agentproto.Identity) {
	if id == nil || len(id.Secret) < 32 {
		replyErr(fs, errdefs.InvalidArgument("agent: identity without a secret"))
		return
	}
	if id.Hostname != "" {
		if err := unix.Sethostname([]byte(id.Hostname)); err != nil {
			replyErr(fs, fmt.Errorf("agent: sethostname: %w", err))
			return
		}
	}
	if id.Network != nil {
		if err := readdressNetwork(id.Network); err != nil {
			replyErr(fs, err)
			return
		}
	}
	s.secretMu.Lock()
	s.secret = id.Secret
	s.secretMu.Unlock()
	reply(fs, agentproto.Reply{Op: agentproto.ReplyOK})
}

// limits holds every command started from here on to lim.
func (s *server) limits(fs *agentproto.Stream, lim *agentproto.Limits) {
	if lim == nil {
		replyErr(fs, errdefs.InvalidArgument("agent: limits without limits"))
		return
	}
	if err := s.cmds.set(lim); err != nil {
		replyErr(fs, err)
		return
	}
	reply(fs, agentproto.Reply{Op: agentproto.ReplyOK})
}

func reply(fs *agentproto.Stream, r agentproto.Reply) { _ = fs.WriteJSON(agentproto.KindReply, r) }

func replyErr(fs *agentproto.Stream, err error) { reply(fs, agentproto.ErrorReply(err)) }

// decode is a helper for JSON payloads of control frames.
func decode(p []byte, v any) error {
	if err := json.Unmarshal(p, v); err != nil {
		return fmt.Errorf("decode frame: %w", err)
	}
	return nil
}
