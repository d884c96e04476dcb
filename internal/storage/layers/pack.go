package layers

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultPackExcludes are left out of every packed layer: what a sandbox
// leaves behind that belongs to that sandbox only (temporary files,
// runtime state, shell and REPL histories) and the mount points the
// sandbox's init fills at start. PackOptions.Exclude adds to them.
var DefaultPackExcludes = []string{
	"/tmp/*", "/var/tmp/*", "/run/*", "/dev/*", "/proc/*", "/sys/*", "/.corral",
	"/root/.bash_history", "/root/.ash_history", "/root/.python_history",
	"/root/.lesshst", "/root/.viminfo", "/root/.wget-hsts",
	"/home/*/.bash_history", "/home/*/.ash_history", "/home/*/.python_history",
	"/home/*/.lesshst", "/home/*/.viminfo", "/home/*/.wget-hsts",
}

// Limits of PackOptions.Exclude.
const (
	maxExcludes       = 64
	maxExcludePattern = 256
)

// PackOptions say how to pack a sandbox's upper directory.
type PackOptions struct {
	// Ref is the new layer's NAME@VERSION.
	Ref string
	// Exclude are more paths to leave out: absolute paths inside the
	// sandbox, where * and ? match within one path component. A
	// directory that matches goes with everything under it.
	Exclude []string
	// NoDefaultExcludes packs what DefaultPackExcludes would leave out.
	NoDefaultExcludes bool
}

// CheckPackOptions validates opts (fields "name" and "exclude").
func CheckPackOptions(opts PackOptions) error {
	if err := checkRef(opts.Ref); err != nil {
		return err
	}
	_, err := excludeRegexps(opts)
	return err
}

// CheckFree fails with AlreadyExists when a layer or composition is called
// ref: pack checks before the work, so that it never makes a layer whose
// composition it then cannot record.
func (s *Store) CheckFree(ref string) error {
	if err := checkRef(ref); err != nil {
		return err
	}
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	if d, ok := idx.Layers[ref]; ok {
		return errdefs.AlreadyExists("name: layer %s exists with digest %s (versions are immutable: pick a new version)", ref, d)
	}
	if _, err := s.composition(ref); err == nil {
		return errdefs.AlreadyExists("name: composition %s exists (versions are immutable: pick a new version)", ref)
	}
	return nil
}

// Pack makes the layer opts.Ref of upper, a sandbox's overlayfs upper
// directory, read as it is: overlay whiteouts (0/0 character devices) and
// opaque directories (trusted.overlay.opaque) stay what they are, so the
// layer stacked on the sandbox's own layers gives back the sandbox's
// files. Files keep their mtimes (builds depend on them), as every layer
// does.
func (s *Store) Pack(ctx context.Context, upper string, opts PackOptions) (Layer, error) {
	if err := checkRef(opts.Ref); err != nil {
		return Layer{}, err
	}
	res, err := excludeRegexps(opts)
	if err != nil {
		return Layer{}, err
	}
	apparent, err := packBudget(ctx, upper, res)
	if err != nil {
		return Layer{}, err
	}
	return s.createLayer(ctx, opts.Ref, upper, false, mkfsOptions{excludeRegexps: res,
		cpuSeconds: packCPUSeconds(apparent)})
}

// packCPUSeconds is mkfs.erofs's CPU budget for a tree of apparent bytes:
// a minute, plus a second per 16 MiB (it reads and hashes hundreds of MiB
// per second of CPU here).
func packCPUSeconds(apparent int64) uint64 { return 60 + uint64(apparent>>24) }

// excludeRegexps turns the exclusion patterns into mkfs.erofs regexps on
// paths relative to the tree.
func excludeRegexps(opts PackOptions) ([]string, error) {
	if len(opts.Exclude) > maxExcludes {
		return nil, errdefs.InvalidArgument("exclude: %d patterns, at most %d", len(opts.Exclude), maxExcludes)
	}
	patterns := opts.Exclude
	if !opts.NoDefaultExcludes {
		patterns = append(append([]string(nil), DefaultPackExcludes...), patterns...)
	}
	out := make([]string, 0, len(patterns))
	for i, p := range patterns {
		if !strings.HasPrefix(p, "/") || len(p) > maxExcludePattern || strings.Contains(p, "//") ||
			strings.ContainsAny(p, "\x00\n") || p == "/" {
			return nil, errdefs.InvalidArgument("exclude[%d]: %q must be an absolute path other than / (at most %d bytes), * and ? matching within a component", i, p, maxExcludePattern)
		}
		var re strings.Builder
		re.WriteString("^")
		for _, r := range strings.TrimSuffix(strings.TrimPrefix(p, "/"), "/") {
			switch r {
			case '*':
				re.WriteString("[^/]*")
			case '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(string(r)))
			}
		}
		re.WriteString("$")
		if _, err := regexp.Compile(re.String()); err != nil {
			return nil, errdefs.InvalidArgument("exclude[%d]: %q: %v", i, p, err)
		}
		out = append(out, re.String())
	}
	return out, nil
}

// PackComposition is the composition that stacks a packed layer on the
// layers its sandbox was made from (pinned by version): creating a sandbox
// from it branches the packed one.
func PackComposition(ref string, base []Layer, env []string) (Composition, error) {
	if len(base) == 0 {
		return Composition{}, fmt.Errorf("pack %s: the sandbox's record names no layers (made by an earlier version)", ref)
	}
	c := Composition{Ref: ref, Env: env}
	for _, l := range base {
		c.Layers = append(c.Layers, l.Ref)
	}
	c.Layers = append(c.Layers, ref)
	return c, nil
}
