package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/client"
)

func newCpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file or a directory tree into or out of a sandbox (SANDBOX:/path on one side, - for stdin/stdout)",
		Long: `Copy a file or a directory tree into or out of a sandbox, like docker cp.
A directory goes as a tar stream with modes, owners, symlinks, hard links,
mtimes and user.* xattrs; when DST is an existing directory the copy lands
inside it under SRC's name, otherwise DST becomes the copy.`,
		Example: `  corral cp ./solution.py n1a2b3c-0123456789ab:/work/solution.py
  corral cp n1a2b3c-0123456789ab:/work/out.txt ./out.txt
  corral cp ./repo n1a2b3c-0123456789ab:/work        # -> /work/repo
  corral cp n1a2b3c-0123456789ab:/work/repo ./back   # ./back is the copy`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return fmt.Errorf("exactly one of SRC and DST must be SANDBOX:/path")
			}
			return g.withClient(cmd, func(_ context.Context, c *client.Client) error {
				if srcRemote {
					return copyOut(cmd, c.Sandbox(srcID), srcPath, dstPath)
				}
				return copyIn(cmd, c.Sandbox(dstID), srcPath, dstPath)
			})
		},
	}
}

// splitRemote recognises SANDBOX:/path (a local path never has ":/" after
// an id-like prefix without a slash).
func splitRemote(arg string) (id, path string, remote bool) {
	id, path, ok := strings.Cut(arg, ":")
	if !ok || id == "" || strings.Contains(id, "/") || !strings.HasPrefix(path, "/") {
		return "", arg, false
	}
	return id, path, true
}

func copyIn(cmd *cobra.Command, sb *client.Sandbox, local, remote string) error {
	var r io.Reader = os.Stdin
	mode := os.FileMode(0)
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if st.IsDir() {
			if fi, err := sb.Files().Stat(cmd.Context(), remote); err == nil && fi.IsDir {
				remote = path.Join(remote, filepath.Base(local))
			}
			_, err := sb.Files().UploadDir(cmd.Context(), local, remote)
			return err
		}
		r, mode = f, st.Mode().Perm()
	}
	_, err := sb.Files().WriteFrom(cmd.Context(), remote, r, mode)
	return err
}

func copyOut(cmd *cobra.Command, sb *client.Sandbox, remote, local string) error {
	if local == "-" {
		_, err := sb.Files().ReadTo(cmd.Context(), remote, os.Stdout)
		return err
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, path.Base(remote))
	}
	if fi, err := sb.Files().Stat(cmd.Context(), remote); err == nil && fi.IsDir {
		return sb.Files().DownloadDir(cmd.Context(), remote, local)
	}
	tmp, err := os.CreateTemp(dirOf(local), ".corral-cp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := sb.Files().ReadTo(cmd.Context(), remote, tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), local)
}

func dirOf(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[:i+1]
	}
	return "."
}
