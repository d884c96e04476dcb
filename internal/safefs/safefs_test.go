package safefs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// sandbox is a root directory with a canary file outside it.
type sandbox struct {
	fs      *FS
	root    string // host path of the root
	outside string // host dir next to the root, holding canary.txt
}

const canary = "host secret"

func newSandbox(t *testing.T, opts ...Option) *sandbox {
	t.Helper()
	base := t.TempDir()
	s := &sandbox{root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{s.root + "/etc", s.outside} {
		must(t, os.MkdirAll(d, 0o755))
	}
	must(t, os.WriteFile(s.outside+"/canary.txt", []byte(canary), 0o644))
	must(t, os.WriteFile(s.root+"/etc/passwd", []byte("inside"), 0o644))
	s.fs = New(func() (*os.File, error) {
		return os.OpenFile(s.root, unix.O_PATH|unix.O_DIRECTORY, 0)
	}, opts...)
	return s
}

// checkCanary fails the test if the canary outside the root changed.
func (s *sandbox) checkCanary(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(s.outside + "/canary.txt")
	if err != nil || string(b) != canary {
		t.Fatalf("canary outside the root touched: %q, %v", b, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, f *FS, p string, off, limit int64) (string, error) {
	t.Helper()
	r, err := f.ReadFile(context.Background(), p, off, limit)
	if err != nil {
		return "", err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	return string(b), err
}

func write(f *FS, p, data string, opts backend.WriteOptions) error {
	_, err := f.WriteFile(context.Background(), p, strings.NewReader(data), opts)
	return err
}

// wantErr checks an error's class and that its message contains want.
func wantErr(t *testing.T, err error, class error, want string) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("error %v: want class %v", err, class)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q: want it to mention %q", err, want)
	}
}

func TestReadWriteRoundTrip(t *testing.T) {
	s := newSandbox(t)
	ctx := context.Background()
	n, err := s.fs.WriteFile(ctx, "/a/b/c.txt", strings.NewReader("hello"), backend.WriteOptions{MakeParents: true})
	must(t, err)
	if n != 5 {
		t.Fatalf("wrote %d bytes, want 5", n)
	}
	must(t, write(s.fs, "/a/b/c.txt", " world", backend.WriteOptions{Append: true}))
	got, err := read(t, s.fs, "/a/b/c.txt", 0, 0)
	must(t, err)
	if got != "hello world" {
		t.Fatalf("read %q", got)
	}
	must(t, write(s.fs, "/a/b/c.txt", "new", backend.WriteOptions{Mode: 0o600}))
	got, _ = read(t, s.fs, "/a/b/c.txt", 0, 0)
	info, err := s.fs.Stat(ctx, "/a/b/c.txt")
	must(t, err)
	if got != "new" || info.Mode != 0o644 || info.Size != 3 {
		t.Fatalf("truncate: %q mode %v size %d (existing file keeps its mode)", got, info.Mode, info.Size)
	}
}

func TestModesAndOwner(t *testing.T) {
	s := newSandbox(t, WithOwner(1234, 5678))
	ctx := context.Background()
	must(t, write(s.fs, "/x/f", "", backend.WriteOptions{Mode: 0o777, MakeParents: true}))
	must(t, s.fs.MakeDir(ctx, "/d", fs.ModeSticky|0o777, false))
	for p, want := range map[string]fs.FileMode{"/x/f": 0o777, "/x": fs.ModeDir | 0o755, "/d": fs.ModeDir | fs.ModeSticky | 0o777} {
		info, err := s.fs.Stat(ctx, p)
		must(t, err)
		if info.Mode != want || info.UID != 1234 || info.GID != 5678 {
			t.Errorf("%s: mode %v owner %d:%d, want %v 1234:5678", p, info.Mode, info.UID, info.GID, want)
		}
	}
	wantErr(t, write(s.fs, "/y", "", backend.WriteOptions{Mode: fs.ModeSetuid | 0o755}), errdefs.ErrInvalidArgument, "mode")
}

func TestListDirAndStat(t *testing.T) {
	s := newSandbox(t)
	ctx := context.Background()
	must(t, os.Mkdir(s.root+"/dir", 0o755))
	must(t, os.WriteFile(s.root+"/dir/b", []byte("12"), 0o600))
	must(t, os.Mkdir(s.root+"/dir/c", 0o700))
	must(t, os.Symlink("/", s.root+"/dir/a"))
	must(t, os.Symlink("dir", s.root+"/link"))
	list, err := s.fs.ListDir(ctx, "/link")
	must(t, err)
	var names []string
	for _, e := range list {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "a,b,c" {
		t.Fatalf("names %v", names)
	}
	if list[0].Mode&fs.ModeSymlink == 0 || list[1].Size != 2 || !list[2].Mode.IsDir() || list[1].Path != "/link/b" {
		t.Fatalf("entries %+v", list)
	}
	info, err := s.fs.Stat(ctx, "/link")
	must(t, err)
	if info.Mode&fs.ModeSymlink == 0 || info.Name != "link" {
		t.Fatalf("Stat follows the final symlink: %+v", info)
	}
	info, err = s.fs.Stat(ctx, "/")
	must(t, err)
	if !info.Mode.IsDir() || info.Path != "/" {
		t.Fatalf("stat /: %+v", info)
	}
}

func TestErrors(t *testing.T) {
	s := newSandbox(t)
	ctx := context.Background()
	must(t, os.Mkdir(s.root+"/full", 0o755))
	must(t, os.WriteFile(s.root+"/full/f", nil, 0o644))
	_, err := s.fs.Stat(ctx, "/missing/x")
	wantErr(t, err, errdefs.ErrNotFound, `path "/missing/x": no such file or directory`)
	_, err = s.fs.ReadFile(ctx, "/etc", 0, 0)
	wantErr(t, err, errdefs.ErrInvalidArgument, `"/etc": is a directory`)
	_, err = s.fs.ListDir(ctx, "/etc/passwd")
	wantErr(t, err, errdefs.ErrInvalidArgument, `"/etc/passwd": not a directory`)
	wantErr(t, s.fs.MakeDir(ctx, "/etc", 0, false), errdefs.ErrAlreadyExists, `"/etc"`)
	wantErr(t, s.fs.MakeDir(ctx, "/etc/passwd/x", 0, true), errdefs.ErrInvalidArgument, `"/etc/passwd"`)
	wantErr(t, s.fs.Remove(ctx, "/full", false), errdefs.ErrFailedPrecondition, `"/full": directory not empty`)
	wantErr(t, s.fs.Remove(ctx, "/", true), errdefs.ErrInvalidArgument, "root")
	wantErr(t, s.fs.Remove(ctx, "/../..", true), errdefs.ErrInvalidArgument, "root")
	for p, want := range map[string]string{
		"":                              "path: must not be empty",
		"etc/passwd":                    `path "etc/passwd": must be absolute`,
		"/a\x00b":                       "NUL",
		"/" + strings.Repeat("a", 4096): "longer than 4096",
	} {
		_, err := s.fs.Stat(ctx, p)
		wantErr(t, err, errdefs.ErrInvalidArgument, want)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.fs.ListDir(cancelled, "/"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
}

func TestRemove(t *testing.T) {
	s := newSandbox(t)
	ctx := context.Background()
	tree := s.root + "/tree/deep/er"
	must(t, os.MkdirAll(tree, 0o755))
	must(t, os.WriteFile(tree+"/f", []byte("x"), 0o644))
	must(t, os.Symlink(s.outside, s.root+"/tree/abs-out"))        // host path
	must(t, os.Symlink("../../outside", s.root+"/tree/deep/rel")) // climbs out on the host
	must(t, os.Symlink("../../outside/canary.txt", s.root+"/tree/file-out"))
	must(t, s.fs.Remove(ctx, "/tree", true))
	if _, err := os.Lstat(s.root + "/tree"); !os.IsNotExist(err) {
		t.Fatalf("tree left: %v", err)
	}
	s.checkCanary(t)
	must(t, os.Symlink("/", s.root+"/escape"))
	must(t, s.fs.Remove(ctx, "/escape", true))
	if _, err := os.Stat(s.root + "/etc/passwd"); err != nil {
		t.Fatalf("removing a symlink followed it: %v", err)
	}
	must(t, s.fs.Remove(ctx, "/etc/passwd", false))
	must(t, s.fs.Remove(ctx, "/etc", false))
	wantErr(t, s.fs.Remove(ctx, "/etc", false), errdefs.ErrNotFound, `"/etc"`)
}

func TestLargeFileOffsetLimit(t *testing.T) {
	s := newSandbox(t)
	data := make([]byte, 20<<20)
	for i := range data {
		data[i] = byte(i * 7 / 5)
	}
	n, err := s.fs.WriteFile(context.Background(), "/big", bytes.NewReader(data), backend.WriteOptions{})
	must(t, err)
	if n != int64(len(data)) {
		t.Fatalf("wrote %d", n)
	}
	for _, c := range []struct{ off, limit, want int64 }{
		{0, 0, 20 << 20}, {3 << 20, 5<<20 + 3, 5<<20 + 3}, {20<<20 - 10, 100, 10}, {30 << 20, 0, 0},
	} {
		got, err := read(t, s.fs, "/big", c.off, c.limit)
		must(t, err)
		end := min(c.off+c.want, int64(len(data)))
		if int64(len(got)) != c.want || (c.want > 0 && got != string(data[c.off:end])) {
			t.Fatalf("offset %d limit %d: got %d bytes, want %d", c.off, c.limit, len(got), c.want)
		}
	}
	_, err = s.fs.ReadFile(context.Background(), "/big", -1, 0)
	wantErr(t, err, errdefs.ErrInvalidArgument, "offset")
}

func TestSpecialFilesRefused(t *testing.T) {
	s := newSandbox(t)
	must(t, unix.Mkfifo(s.root+"/fifo", 0o666))
	must(t, unix.Mknod(s.root+"/null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(t, os.Symlink("/fifo", s.root+"/to-fifo"))
	for _, p := range []string{"/fifo", "/to-fifo", "/null"} {
		_, err := read(t, s.fs, p, 0, 0)
		wantErr(t, err, errdefs.ErrInvalidArgument, p)
		wantErr(t, write(s.fs, p, "x", backend.WriteOptions{}), errdefs.ErrInvalidArgument, p)
	}
	// With a reader present the open succeeds; the type check refuses it.
	rd, err := os.OpenFile(s.root+"/fifo", unix.O_RDONLY|unix.O_NONBLOCK, 0)
	must(t, err)
	defer rd.Close()
	wantErr(t, write(s.fs, "/fifo", "x", backend.WriteOptions{}), errdefs.ErrInvalidArgument, "named pipe")
	if n, _ := rd.Read(make([]byte, 1)); n != 0 {
		t.Fatal("wrote into a FIFO")
	}
}
