package agent

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/guest/agentproto"
)

// stdio is an exec's standard streams: three pipes, or one terminal.
type stdio struct {
	// child are the command's fds 0, 1 and 2, closed once it started.
	child [3]*os.File
	// in feeds the command (nil: /dev/null, or closed); out and errOut
	// are read by the agent (errOut nil on a terminal).
	in, out, errOut *os.File
	// ptm is the terminal's master (nil for pipes): in and out are it.
	ptm *os.File
}

func pipeStdio(withStdin bool) (*stdio, error) {
	s := &stdio{}
	var err error
	if withStdin {
		if s.child[0], s.in, err = os.Pipe(); err != nil {
			return nil, err
		}
	} else if s.child[0], err = os.Open("/dev/null"); err != nil {
		return nil, err
	}
	if s.out, s.child[1], err = os.Pipe(); err != nil {
		s.closeChild()
		s.closeParent()
		return nil, err
	}
	if s.errOut, s.child[2], err = os.Pipe(); err != nil {
		s.closeChild()
		s.closeParent()
		return nil, err
	}
	return s, nil
}

// ptyStdio opens a terminal of the guest's devpts: the master stays with
// the agent, the peer (from TIOCGPTPEER, not a path) is the command's
// stdin, stdout and stderr.
func ptyStdio(size agentproto.TermSize) (*stdio, error) {
	if size.Cols == 0 || size.Rows == 0 {
		return nil, fmt.Errorf("pty size %dx%d: columns and rows must be positive", size.Cols, size.Rows)
	}
	var mfd int
	var err error
	// /dev/pts/ptmx is the multiplexer of the devpts instance at
	// /dev/pts (a guest's own init may leave /dev/ptmx elsewhere).
	for _, p := range []string{"/dev/pts/ptmx", "/dev/ptmx"} {
		if mfd, err = unix.Open(p, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, fmt.Errorf("unlock pty: %w", err)
	}
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Col: size.Cols, Row: size.Rows}); err != nil {
		unix.Close(mfd)
		return nil, fmt.Errorf("set pty size: %w", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		unix.Close(mfd)
		return nil, fmt.Errorf("open pty peer: %w", errno)
	}
	// Non-blocking, so the runtime poller serves reads and their deadline.
	ptm := os.NewFile(uintptr(mfd), "ptmx")
	pts := os.NewFile(sfd, "pts")
	return &stdio{child: [3]*os.File{pts, pts, pts}, in: ptm, out: ptm, ptm: ptm}, nil
}

// closeChild closes the command's ends (the agent's copies).
func (s *stdio) closeChild() {
	for i, f := range s.child {
		if f != nil && (i == 0 || f != s.child[i-1]) {
			f.Close()
		}
	}
}

// closeParent closes the agent's ends, for a command that did not start.
func (s *stdio) closeParent() {
	s.closeInput()
	s.closeOutputs()
}

type output struct {
	f      *os.File
	stream backend.Stream
}

func (s *stdio) outputs() []output {
	if s.ptm != nil {
		return []output{{s.ptm, backend.Stdout}}
	}
	return []output{{s.out, backend.Stdout}, {s.errOut, backend.Stderr}}
}

// write feeds the command; a pipe it closed is closed here too.
func (s *stdio) write(p []byte) {
	if s.in == nil {
		return
	}
	if _, err := s.in.Write(p); err != nil && s.ptm == nil {
		s.closeInput()
	}
}

// closeInput ends the command's input. A terminal has no end of input
// short of hanging up, which closing the output does.
func (s *stdio) closeInput() {
	if s.in != nil && s.ptm == nil {
		s.in.Close()
		s.in = nil
	}
}

func (s *stdio) resize(size agentproto.TermSize) error {
	if s.ptm == nil {
		return errors.New("resize: the command has no terminal")
	}
	if size.Cols == 0 || size.Rows == 0 {
		return fmt.Errorf("pty size %dx%d: columns and rows must be positive", size.Cols, size.Rows)
	}
	rc, err := s.ptm.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: size.Cols, Row: size.Rows})
	}); err != nil {
		return err
	}
	return serr
}

// drain bounds the reading of output left after the command exited.
func (s *stdio) drain(deadline time.Time) {
	for _, o := range s.outputs() {
		_ = o.f.SetReadDeadline(deadline)
	}
}

func (s *stdio) closeOutputs() {
	for _, o := range s.outputs() {
		if o.f != nil {
			o.f.Close()
		}
	}
}
