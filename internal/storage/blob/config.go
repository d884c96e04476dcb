package blob

import (
	"net/http"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Config names a store in a form that can be written down (a node's
// configuration, or the lazy blob server's command line).
type Config struct {
	// Kind is "dir", "http" (a peer node) or "s3".
	Kind string `json:"kind"`
	Dir  string `json:"dir,omitempty"` // kind dir: the directory
	URL  string `json:"url,omitempty"` // kind http: the peer's base URL
	// S3 is the bucket for kind s3 (its Transport is not written down).
	S3 S3Config `json:"s3,omitzero"`
}

// Open returns the store cfg names.
func Open(cfg Config) (Store, error) {
	switch cfg.Kind {
	case "dir":
		if cfg.Dir == "" {
			return nil, errdefs.InvalidArgument("dir: empty (kind dir needs a directory)")
		}
		return OpenDir(cfg.Dir)
	case "http":
		if cfg.URL == "" {
			return nil, errdefs.InvalidArgument("url: empty (kind http needs the peer's base URL)")
		}
		return NewHTTP(cfg.URL, &http.Client{}), nil
	case "s3":
		return NewS3(cfg.S3)
	}
	return nil, errdefs.InvalidArgument("kind: %q must be dir, http or s3", cfg.Kind)
}
