package iam

import (
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Service is IAM over a Store: tokens, projects, quota admission and the
// audit log. It holds no record of its own beyond rate buckets and audit
// subscribers, so several instances may share one Store.
type Service struct {
	store    Store
	now      func() time.Time
	log      *slog.Logger
	contents Contents
	usage    func(project string) Usage

	rateMu  sync.Mutex
	buckets map[string]*bucket

	subMu sync.Mutex
	subs  map[chan AuditEntry]struct{}

	// auditQ feeds the audit writer (writeAudit); stopAudit ends it and
	// auditDone says it has ended.
	auditQ    chan auditWrite
	stopAudit chan struct{}
	auditDone chan struct{}

	// journal, when set, takes audit entries before the store (see
	// journal.go); pending are its entries not yet compacted into the
	// store, in journal order (the writer appends under pendMu); held are
	// the results the writer holds back (resultHold), shown to listings
	// (the writer sets it under pendMu).
	journal *AuditJournal
	pendMu  sync.Mutex
	pending []AuditEntry
	held    []auditWrite
	// resultHold is Config.ResultHold.
	resultHold time.Duration

	closeOnce sync.Once
	closeErr  error
}

// Config configures a Service.
type Config struct {
	Store Store
	// Contents empties deleted projects (nil: projects hold nothing).
	Contents Contents
	// Usage reports what a project and its subprojects use now (for
	// listings; admission is given the usage by its caller).
	Usage  func(project string) Usage
	Now    func() time.Time
	Logger *slog.Logger
	// Journal, when set, is the audit journal in front of Store (opened
	// with OpenAuditJournal over the same Store); the Service closes it.
	Journal *AuditJournal
	// ResultHold is how long the audit writer may hold a successful begun
	// call's result for the next batch (0: 10 ms; see resultHold).
	ResultHold time.Duration
}

// New returns a Service over cfg.Store.
func New(cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Usage == nil {
		cfg.Usage = func(string) Usage { return Usage{} }
	}
	if cfg.ResultHold <= 0 {
		cfg.ResultHold = resultHold
	}
	s := &Service{resultHold: cfg.ResultHold, store: cfg.Store, now: cfg.Now, log: cfg.Logger, contents: cfg.Contents, usage: cfg.Usage,
		buckets: map[string]*bucket{}, subs: map[chan AuditEntry]struct{}{}, journal: cfg.Journal,
		auditQ: make(chan auditWrite, maxAuditBatch), stopAudit: make(chan struct{}), auditDone: make(chan struct{})}
	go s.writeAudit()
	return s
}

// Usage reports what project (with its subprojects) uses now.
func (s *Service) Usage(project string) Usage { return s.usage(project) }

// SetContents plugs in what projects hold once the node exists.
func (s *Service) SetContents(c Contents, usage func(project string) Usage) {
	s.contents = c
	if usage != nil {
		s.usage = usage
	}
}

// Close stops the audit writer (which compacts the journal), and releases
// the journal and the store; later calls do nothing.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		close(s.stopAudit)
		<-s.auditDone
		var jerr error
		if s.journal != nil {
			jerr = s.journal.Close()
		}
		s.closeErr = errors.Join(jerr, s.store.Close())
	})
	return s.closeErr
}

// Store is the store the service keeps its records in.
func (s *Service) Store() Store { return s.store }
