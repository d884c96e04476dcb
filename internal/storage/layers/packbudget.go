package layers

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Pack work is bounded by what the sandbox really stored. mkfs.erofs reads
// every byte of every file, holes included, so a sparse file costs node CPU
// by its apparent size: twelve 1,000 MiB sparse files holding 36 KiB took
// 76 s of mkfs here. A pack whose files' apparent sizes exceed what they
// occupy on disk by more than this slack is refused before any work.
const (
	packSparseFactor = 2        // apparent bytes allowed per byte stored
	packSparseSlack  = 64 << 20 // plus this much (small files' tails, a few holes)
)

// packBudget walks upper (what mkfs would read: excluded paths skipped)
// and refuses, with ResourceExhausted naming the largest sparse file, a
// tree whose apparent size is over packSparseFactor x its allocated bytes
// + packSparseSlack. It returns the apparent bytes.
func packBudget(ctx context.Context, upper string, excludes []string) (int64, error) {
	res := make([]*regexp.Regexp, 0, len(excludes))
	for _, e := range excludes {
		res = append(res, regexp.MustCompile(e)) // checked by excludeRegexps
	}
	var apparent, stored, worstHole int64
	var worst string
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(upper, p)
		for _, re := range res {
			if rel != "." && re.MatchString(rel) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		apparent += st.Size
		stored += st.Blocks * 512
		if hole := st.Size - st.Blocks*512; hole > worstHole {
			worstHole, worst = hole, "/"+rel
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pack: measure the writable layer: %w", err)
	}
	if limit := packSparseFactor*stored + packSparseSlack; apparent > limit {
		return 0, errdefs.ResourceExhausted("pack: the files add up to %d bytes but only %d are stored (sparse files, the largest %s with a %d-byte hole); packing reads every byte, so at most %d x stored + %d bytes (%d) are packed: fill or remove the sparse files, or exclude them",
			apparent, stored, worst, worstHole, packSparseFactor, packSparseSlack, limit)
	}
	return apparent, nil
}
