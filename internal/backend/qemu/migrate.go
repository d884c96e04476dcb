package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/qmp"
)

// RAMObject is the -object of a machine's guest RAM (id "ram"): a memfd,
// not anonymous memory (QEMU asks for transparent huge pages on anonymous
// guest RAM, and a guest's scattered first touches then cost the host
// 2 MiB each; shared memory gets none unless shmem_enabled says so), or,
// with ramFile, a private mapping of a snapshot's RAM image: every VM
// restored from it shares its page cache until it writes a page.
func RAMObject(memoryMiB int64, ramFile string) string {
	if ramFile != "" {
		return fmt.Sprintf("memory-backend-file,id=ram,size=%dM,mem-path=%s,share=off", memoryMiB, Escape(ramFile))
	}
	return fmt.Sprintf("memory-backend-memfd,id=ram,size=%dM", memoryMiB)
}

// IncomingArgs makes QEMU wait for Incoming (capabilities must be set
// before the stream is read).
var IncomingArgs = []string{"-incoming", "defer"}

// SandboxArgs turn on QEMU's own seccomp filter for both backends' VMMs:
// no obsolete syscalls, no setuid or other privilege changes, no
// scheduler or affinity changes, and no spawning of processes (a
// compromised VMM cannot start a program). Migration streams therefore go
// through descriptors the daemon opened (migrationFD), never an "exec:"
// URI's shell.
var SandboxArgs = []string{"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"}

// migrationFD names the descriptor (QMP getfd) a migration stream is read
// from or written to.
const migrationFD = "migration"

// Incoming loads a machine started with IncomingArgs from the migration
// stream in memPath (its RAM mapped from a RAMObject file when
// ignoreShared: the stream then holds the device state only) and
// continues it.
func Incoming(ctx context.Context, qc *qmp.Client, memPath string, ignoreShared bool) error {
	if ignoreShared {
		if err := SetIgnoreShared(ctx, qc, true); err != nil {
			return err
		}
	}
	f, err := os.Open(memPath)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	// QEMU holds a copy of the descriptor from here on.
	err = qc.SendFD(ctx, migrationFD, f)
	f.Close()
	if err != nil {
		return err
	}
	if _, err := qc.Run(ctx, "migrate-incoming", map[string]any{"uri": "fd:" + migrationFD}); err != nil {
		return err
	}
	for {
		st, err := qc.Status(ctx)
		if err != nil {
			return err
		}
		if st != "inmigrate" {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if ignoreShared {
		// Off for this VM's own snapshots: its RAM is no memfd.
		if err := SetIgnoreShared(ctx, qc, false); err != nil {
			return err
		}
	}
	_, err = qc.Run(ctx, "cont", nil)
	return err
}

// Hibernate stops the machine, streams its RAM and device state to
// memPath (written as a temporary file, renamed once complete) and quits
// QEMU.
func Hibernate(ctx context.Context, qc *qmp.Client, memPath string) error {
	if _, err := qc.Run(ctx, "stop", nil); err != nil {
		return err
	}
	// The RAM goes in the stream (a live snapshot cut short may have
	// left x-ignore-shared on).
	if err := SetIgnoreShared(ctx, qc, false); err != nil {
		return err
	}
	if err := migrateTo(ctx, qc, memPath); err != nil {
		return err
	}
	_, _ = qc.Run(ctx, "quit", nil) // the connection may drop before the reply
	return nil
}

// SaveLive snapshots a running machine that runs on afterwards: with the
// vCPUs stopped, device state (and RAM, unless it is copied to ramPath)
// streams to memPath; once the migration completed QEMU has flushed and
// let go of its disks, so whileStopped copies them; then the VM
// continues (cont takes the disks back), also when a step failed.
//
// Guest RAM in a memfd (every booted VM, RAMObject without a file) is
// left out of the stream (x-ignore-shared) and copied from the memfd of
// QEMU process pid, holes kept, to ramPath: a restore maps that file
// copy-on-write. A VM whose RAM is not a memfd (one restored that way)
// streams its RAM, and ramPath is not written.
func SaveLive(ctx context.Context, qc *qmp.Client, pid int, memPath, ramPath string, whileStopped func() error) (err error) {
	if _, err := qc.Run(ctx, "stop", nil); err != nil {
		return err
	}
	defer func() {
		if _, cerr := qc.Run(context.WithoutCancel(ctx), "cont", nil); cerr != nil && err == nil {
			err = fmt.Errorf("continue after snapshot: %w", cerr)
		}
	}()
	ram, err := openGuestRAM(pid)
	if err != nil {
		return err
	}
	if ram != nil {
		defer ram.Close()
	}
	if err := SetIgnoreShared(ctx, qc, ram != nil); err != nil {
		return err
	}
	if ram != nil {
		// Off again: a later hibernation must stream the RAM.
		defer func() {
			if serr := SetIgnoreShared(context.WithoutCancel(ctx), qc, false); serr != nil && err == nil {
				err = serr
			}
		}()
	}
	if err := migrateTo(ctx, qc, memPath); err != nil {
		return err
	}
	if ram != nil {
		if err := copySparse(ram, ramPath); err != nil {
			return fmt.Errorf("copy guest RAM: %w", err)
		}
	}
	return whileStopped()
}

// migrateTo streams the stopped machine's state to path through path.tmp.
func migrateTo(ctx context.Context, qc *qmp.Client, path string) error {
	// The default bandwidth cap (32 MiB/s) is for live migration over a
	// network; a stopped VM to a local file should go at disk speed.
	if _, err := qc.Run(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	// QEMU holds a copy of the descriptor from here on.
	err = qc.SendFD(ctx, migrationFD, f)
	f.Close()
	if err == nil {
		_, err = qc.Run(ctx, "migrate", map[string]any{"uri": "fd:" + migrationFD})
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := waitMigration(ctx, qc); err != nil {
		_, _ = qc.Run(context.WithoutCancel(ctx), "migrate_cancel", nil)
		os.Remove(tmp)
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// waitMigration polls query-migrate until the migration completed.
func waitMigration(ctx context.Context, qc *qmp.Client) error {
	for {
		raw, err := qc.Run(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var m struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("qmp query-migrate: %w", err)
		}
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return errors.New("migration " + m.Status + ": " + m.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SetIgnoreShared sets x-ignore-shared: guest RAM in shared memory is
// left out of the stream.
func SetIgnoreShared(ctx context.Context, qc *qmp.Client, on bool) error {
	_, err := qc.Run(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}}})
	return err
}

// openGuestRAM opens the memfd holding the guest RAM of QEMU pid (nil when
// its RAM is something else).
func openGuestRAM(pid int) (*os.File, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("guest RAM: %w", err)
	}
	for _, e := range ents {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err == nil && strings.HasPrefix(target, "/memfd:memory-backend-memfd") {
			f, err := os.Open(dir + "/" + e.Name())
			if err != nil {
				return nil, fmt.Errorf("guest RAM: %w", err)
			}
			return f, nil
		}
	}
	return nil, nil
}

// copySparse copies src's data extents to a new file dst of src's size,
// leaving its holes (pages the guest never touched or gave back) as holes.
func copySparse(src *os.File, dst string) error {
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	fd := int(src.Fd())
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // no data past off
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return out.Close()
}
