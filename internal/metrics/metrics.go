// Package metrics owns corral's Prometheus registry and the instruments
// that code below the API records into (operation latency, events, API
// requests, fncall verdicts), plus a gatherer for figures another process
// serves in the text format. It imports only Prometheus libraries and the
// standard library; nothing of corral.
package metrics

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Operations whose latency is recorded per backend.
const (
	OpCreate = "create"
	OpExec   = "exec"
	OpDelete = "delete"
	OpPause  = "pause"
	OpResume = "resume"
)

// Metrics is one process's registry and instruments. A nil *Metrics
// records nothing, so packages can take one optionally.
type Metrics struct {
	Registry *prometheus.Registry
	ops      *prometheus.HistogramVec
	events   *prometheus.CounterVec
	api      *prometheus.CounterVec
	verdicts *prometheus.CounterVec
	recycles *prometheus.CounterVec
	handouts *prometheus.CounterVec
}

// New makes a registry with the Go runtime and process collectors and
// corral's instruments.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "corral_sandbox_operation_duration_seconds",
			Help: "Latency of sandbox operations (create, exec, delete, pause, resume) by backend.",
			// 1 ms .. ~65 s: fncall resets sit at the bottom, microVM
			// boots under TCG at the top.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 17),
		}, []string{"backend", "operation"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_events_total",
			Help: "Lifecycle events by type.",
		}, []string{"type"}),
		api: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_api_requests_total",
			Help: "API requests by procedure and Connect code.",
		}, []string{"method", "code"}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_fncall_calls_total",
			Help: "fncall calls by verdict.",
		}, []string{"verdict"}),
		recycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_sandbox_recycles_total",
			Help: "Deleted sandboxes a recycling node tried to keep for reuse, by outcome: pooled (scrubbed, renewed if written, back in its image's pool), torn_down, or evicted (pooled before, then dropped for a newer one: from a full pool, or on an init-stub node for a create of another class).",
		}, []string{"outcome"}),
		handouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_warm_pool_handouts_total",
			Help: "Creates served by a warm pool, by where the sandbox came from: made ahead of demand, or recycled from a deleted one.",
		}, []string{"source"}),
	}
	m.Registry.MustRegister(m.ops, m.events, m.api, m.verdicts, m.recycles, m.handouts,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveOp records one operation's latency.
func (m *Metrics) ObserveOp(backend, op string, d time.Duration) {
	if m != nil {
		m.ops.WithLabelValues(backend, op).Observe(d.Seconds())
	}
}

// CountEvent counts one lifecycle event.
func (m *Metrics) CountEvent(typ string) {
	if m != nil {
		m.events.WithLabelValues(typ).Inc()
	}
}

// CountRequest counts one API request.
func (m *Metrics) CountRequest(method, code string) {
	if m != nil {
		m.api.WithLabelValues(method, code).Inc()
	}
}

// CountVerdict counts one fncall call.
func (m *Metrics) CountVerdict(verdict string) {
	if m != nil {
		m.verdicts.WithLabelValues(verdict).Inc()
	}
}

// CountRecycle counts one deleted sandbox's recycling by its outcome.
func (m *Metrics) CountRecycle(outcome string) {
	if m != nil {
		m.recycles.WithLabelValues(outcome).Inc()
	}
}

// CountHandout counts one create served by a warm pool, by source.
func (m *Metrics) CountHandout(source string) {
	if m != nil {
		m.handouts.WithLabelValues(source).Inc()
	}
}

// Handler serves the registry and the extra gatherers in one exposition.
func (m *Metrics) Handler(extra ...prometheus.Gatherer) http.Handler {
	g := append(prometheus.Gatherers{m.Registry}, extra...)
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// TextGatherer gathers what fetch returns in the Prometheus text format
// (e.g. the lazy blob server's figures), under a short deadline.
func TextGatherer(fetch func(ctx context.Context) ([]byte, error)) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b, err := fetch(ctx)
		if err != nil {
			return nil, fmt.Errorf("gather: %w", err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("gather: parse: %w", err)
		}
		out := make([]*dto.MetricFamily, 0, len(fams))
		for _, f := range fams {
			out = append(out, f)
		}
		return out, nil
	})
}

// Gauge is one sample of a gauge with its label values, for collectors
// that compute figures when scraped.
type Gauge struct {
	Labels []string
	Value  float64
}

// funcCollector computes its samples on each scrape.
type funcCollector struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	fn   func() []Gauge
}

// NewFunc makes a collector of metric name with the given labels whose
// samples fn computes when scraped.
func NewFunc(name, help string, typ prometheus.ValueType, labels []string, fn func() []Gauge) prometheus.Collector {
	return funcCollector{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ, fn: fn}
}

func (f funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

func (f funcCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range f.fn() {
		ch <- prometheus.MustNewConstMetric(f.desc, f.typ, g.Value, g.Labels...)
	}
}
