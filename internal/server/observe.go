package server

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/control"
	"github.com/corral-dev/corral/internal/metrics"
	"github.com/corral-dev/corral/internal/node"
	"github.com/corral-dev/corral/internal/ui"
)

// registerCollectors adds the figures computed at scrape time: sandboxes
// by backend, state and project; node capacity, committed and used
// resources; fncall pool sizes; network refusals; and, with
// Config.MetricsPerSandbox, each sandbox's latest sample.
func (s *Server) registerCollectors(m *metrics.Metrics) {
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	m.Registry.MustRegister(
		metrics.NewFunc("corral_sandboxes", "Sandboxes by backend, state and project.", gauge,
			[]string{"backend", "state", "project"}, func() []metrics.Gauge {
				var out []metrics.Gauge
				for k, v := range s.node.Overview().Sandboxes {
					out = append(out, metrics.Gauge{Labels: k[:], Value: float64(v)})
				}
				return out
			}),
		metrics.NewFunc("corral_node_resources", "Node capacity, and the limits (committed) and sampled use (used) of its running and paused sandboxes; cpu in millicores, memory and disk in bytes.", gauge,
			[]string{"kind", "resource"}, func() []metrics.Gauge {
				o := s.node.Overview()
				var out []metrics.Gauge
				for _, k := range []struct {
					kind string
					r    node.Resources
				}{{"capacity", o.Capacity}, {"committed", o.Committed}, {"used", o.Used}} {
					out = append(out,
						metrics.Gauge{Labels: []string{k.kind, "cpu_millis"}, Value: float64(k.r.CPUMillis)},
						metrics.Gauge{Labels: []string{k.kind, "memory_bytes"}, Value: float64(k.r.MemoryBytes)},
						metrics.Gauge{Labels: []string{k.kind, "disk_bytes"}, Value: float64(k.r.DiskBytes)},
						metrics.Gauge{Labels: []string{k.kind, "pids"}, Value: float64(k.r.Pids)})
				}
				return out
			}),
		metrics.NewFunc("corral_fncall_pool_sandboxes", "Sandboxes of each fncall pool (idle, or all of it).", gauge,
			[]string{"image", "memory_bytes", "kind"}, func() []metrics.Gauge {
				var out []metrics.Gauge
				for _, p := range s.fncall.PoolSizes() {
					mem := strconv.FormatInt(p.MemoryBytes, 10)
					out = append(out,
						metrics.Gauge{Labels: []string{p.Image, mem, "idle"}, Value: float64(p.Idle)},
						metrics.Gauge{Labels: []string{p.Image, mem, "total"}, Value: float64(p.Total)})
				}
				return out
			}),
		// The refusal counters keep the names and labels they had before
		// the registry: dashboards and alerts written against them stay.
		metrics.NewFunc("corral_network_refused_total", "Refused connects, sends and packets of a sandbox.", counter,
			[]string{"sandbox"}, func() []metrics.Gauge {
				var out []metrics.Gauge
				for id, st := range s.networkCounters() {
					out = append(out, metrics.Gauge{Labels: []string{id}, Value: float64(st.Total)})
				}
				return out
			}),
		metrics.NewFunc("corral_network_refused_destination_total", "Refusals of a sandbox by hook and destination (or name, for DNS).", counter,
			[]string{"sandbox", "hook", "protocol", "address", "port", "name"}, func() []metrics.Gauge {
				var out []metrics.Gauge
				for id, st := range s.networkCounters() {
					for _, r := range st.Refusals {
						out = append(out, metrics.Gauge{Labels: []string{id, r.Hook, r.Protocol, r.Address, strconv.Itoa(int(r.Port)), r.Name}, Value: float64(r.Count)})
					}
				}
				return out
			}),
	)
	if s.cfg.MetricsPerSandbox {
		s.registerPerSandbox(m)
	}
}

// registerPerSandbox adds one series per sandbox and figure: off by
// default, as a node with thousands of sandboxes makes thousands of series.
func (s *Server) registerPerSandbox(m *metrics.Metrics) {
	figure := func(name, help string, v func(node.Sample) float64) prometheus.Collector {
		return metrics.NewFunc(name, help, prometheus.GaugeValue, []string{"sandbox", "backend", "project"}, func() []metrics.Gauge {
			var out []metrics.Gauge
			for _, st := range s.node.Latest() {
				if st.Current.Time.IsZero() {
					continue
				}
				out = append(out, metrics.Gauge{Labels: []string{st.Record.ID, st.Record.Backend, st.Project}, Value: v(st.Current)})
			}
			return out
		})
	}
	m.Registry.MustRegister(
		figure("corral_sandbox_cpu_percent", "A sandbox's CPU use at the latest sample (100 = one core).", func(x node.Sample) float64 { return x.CPUPercent }),
		figure("corral_sandbox_memory_bytes", "A sandbox's charged memory at the latest sample.", func(x node.Sample) float64 { return float64(x.MemoryBytes) }),
		figure("corral_sandbox_disk_bytes", "A sandbox's writable layer use at the latest sample.", func(x node.Sample) float64 { return float64(x.DiskBytes) }),
		figure("corral_sandbox_network_receive_bytes", "Bytes a sandbox's interfaces received.", func(x node.Sample) float64 { return float64(x.NetRxBytes) }),
		figure("corral_sandbox_network_transmit_bytes", "Bytes a sandbox's interfaces sent.", func(x node.Sample) float64 { return float64(x.NetTxBytes) }),
	)
}

// observeRoutes serves /metrics, the ObserveService and the dashboard,
// on the API listeners and behind whatever guards them.
func (s *Server) observeRoutes(mux *http.ServeMux, opts ...connect.HandlerOption) {
	var extra []prometheus.Gatherer
	if s.share != nil {
		extra = append(extra, metrics.TextGatherer(s.share.Lazy().Metrics))
	}
	mux.HandleFunc("GET /metrics", s.authHTTP(s.metrics.Handler(extra...).ServeHTTP))
	path, h := corralv1connect.NewObserveServiceHandler(control.NewObserveService(s.node, s.events), opts...)
	mux.Handle(path, h)
	ui.Register(mux, s.events, s.authHTTP)
}

// networkCounters reads every sandbox's refusal counters for a scrape.
func (s *Server) networkCounters() map[string]backend.NetworkStats {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.node.NetworkCounters(ctx)
}
