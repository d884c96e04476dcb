package fncall

import (
	"path"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Request is one call, as the control layer hands it over.
type Request struct {
	// Image defaults to "busybox" for sh and argv, "debian" for python.
	Image string
	// Argv, or Language and Source.
	Argv             []string
	Language, Source string
	Stdin            []byte
	Env              []string
	// Files are written before the call: absolute paths, or relative to
	// Workdir.
	Files map[string][]byte
	// OutputFiles are read back after the call (same path rules).
	OutputFiles []string
	WallLimit   time.Duration
	CPULimit    time.Duration
	MemoryBytes int64
	OutputBytes int64
}

// Verdict is how a call ended.
type Verdict int

const (
	VerdictOK Verdict = iota + 1
	VerdictRuntimeError
	VerdictTimeLimit
	VerdictMemoryLimit
	VerdictOutputLimit
)

var verdictNames = map[Verdict]string{VerdictOK: "ok", VerdictRuntimeError: "runtime_error",
	VerdictTimeLimit: "time_limit", VerdictMemoryLimit: "memory_limit", VerdictOutputLimit: "output_limit"}

func (v Verdict) String() string { return verdictNames[v] }

// Result is how one call went.
type Result struct {
	Stdout, Stderr   []byte
	ExitCode, Signal int
	Verdict          Verdict
	CPUTime          time.Duration
	WallTime         time.Duration
	PeakMemory       int64
	Files            map[string][]byte
}

// Limits of a request: a zero field takes the default, a value outside the
// range is an InvalidArgument error naming the field and the range.
const (
	Workdir            = "/tmp"
	DefaultWall        = 10 * time.Second
	MaxWall            = 10 * time.Minute
	DefaultMemory      = 256 << 20
	MinMemory          = 16 << 20
	MaxMemory          = 16 << 30
	DefaultOutput      = 1 << 20
	MaxOutput          = 64 << 20
	MaxSource          = 1 << 20
	MaxFilesBytes      = 32 << 20
	MaxOutputFiles     = 64
	MaxArgvBytes       = 1 << 20
	defaultPath        = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	defaultImageSh     = "busybox"
	defaultImagePython = "debian"
)

// Languages are the known values of Request.Language.
var Languages = []string{"python", "sh"}

// normalize checks req, fills in defaults and returns the argv to run.
func normalize(req *Request) ([]string, error) {
	argv, err := command(req)
	if err != nil {
		return nil, err
	}
	if err := limits(req); err != nil {
		return nil, err
	}
	if err := files(req); err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(req.Env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		req.Env = append(slices.Clip(req.Env), defaultPath)
	}
	return argv, nil
}

// withDefaults returns env with each of defaults whose name env lacks.
func withDefaults(env, defaults []string) []string {
	for _, kv := range defaults {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, name+"=") }) {
			env = append(slices.Clip(env), kv)
		}
	}
	return env
}

func command(req *Request) ([]string, error) {
	if len(req.Argv) > 0 {
		if req.Language != "" || req.Source != "" {
			return nil, errdefs.InvalidArgument("argv: set either argv or language and source, not both")
		}
		n := 0
		for _, a := range req.Argv {
			n += len(a)
		}
		if req.Argv[0] == "" || n > MaxArgvBytes {
			return nil, errdefs.InvalidArgument("argv: argv[0] must not be empty and argv must stay under %d bytes", MaxArgvBytes)
		}
		if req.Image == "" {
			req.Image = defaultImageSh
		}
		return req.Argv, nil
	}
	if len(req.Source) > MaxSource {
		return nil, errdefs.InvalidArgument("source: %d bytes is over the limit of %d", len(req.Source), MaxSource)
	}
	switch req.Language {
	case "sh":
		if req.Image == "" {
			req.Image = defaultImageSh
		}
		return []string{"/bin/sh", "-c", req.Source}, nil
	case "python":
		if req.Image == "" {
			req.Image = defaultImagePython
		}
		return []string{"python3", "-c", req.Source}, nil
	case "":
		return nil, errdefs.InvalidArgument("argv or language: one is required (languages: %s)", strings.Join(Languages, ", "))
	}
	return nil, errdefs.InvalidArgument("language: unknown language %q (known: %s)", req.Language, strings.Join(Languages, ", "))
}

func limits(req *Request) error {
	switch {
	case req.WallLimit < 0 || req.WallLimit > MaxWall:
		return errdefs.InvalidArgument("wall_time_limit: %v is outside 0 (default %v) .. %v", req.WallLimit, DefaultWall, MaxWall)
	case req.CPULimit < 0 || req.CPULimit > MaxWall:
		return errdefs.InvalidArgument("cpu_time_limit: %v is outside 0 (default: the wall limit) .. %v", req.CPULimit, MaxWall)
	case req.MemoryBytes != 0 && (req.MemoryBytes < MinMemory || req.MemoryBytes > MaxMemory):
		return errdefs.InvalidArgument("memory_limit_bytes: %d is outside %d .. %d (0: default %d)", req.MemoryBytes, MinMemory, MaxMemory, DefaultMemory)
	case req.OutputBytes < 0 || req.OutputBytes > MaxOutput:
		return errdefs.InvalidArgument("output_limit_bytes: %d is outside 0 (default %d) .. %d", req.OutputBytes, DefaultOutput, MaxOutput)
	}
	if req.WallLimit == 0 {
		req.WallLimit = DefaultWall
	}
	if req.CPULimit == 0 {
		req.CPULimit = req.WallLimit
	}
	if req.MemoryBytes == 0 {
		req.MemoryBytes = DefaultMemory
	}
	if req.OutputBytes == 0 {
		req.OutputBytes = DefaultOutput
	}
	return nil
}

func files(req *Request) error {
	total := 0
	for p, b := range req.Files {
		if p == "" {
			return errdefs.InvalidArgument("files: a path must not be empty")
		}
		total += len(b)
	}
	if total > MaxFilesBytes {
		return errdefs.InvalidArgument("files: %d bytes in all is over the limit of %d", total, MaxFilesBytes)
	}
	if len(req.OutputFiles) > MaxOutputFiles {
		return errdefs.InvalidArgument("output_files: %d names is over the limit of %d", len(req.OutputFiles), MaxOutputFiles)
	}
	for _, p := range req.OutputFiles {
		if p == "" {
			return errdefs.InvalidArgument("output_files: a path must not be empty")
		}
	}
	return nil
}

// absPath resolves a request path against Workdir (the file API confines
// it to the sandbox either way).
func absPath(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(Workdir, p)
}
