package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
	"github.com/corral-dev/corral/api/corral/v1/corralv1connect"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

const (
	// defaultTimeout is E2B's sandbox lifetime when a create names none.
	defaultTimeout = 15 * time.Second
	// maxListLimit is the largest page GET /v2/sandboxes serves.
	maxListLimit = 100
	// maxBody bounds control API request bodies.
	maxBody = 1 << 20
)

func (s *Server) controlMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.create)
	mux.HandleFunc("POST /v2/sandboxes", s.create)
	mux.HandleFunc("GET /sandboxes", s.listSandboxes(false))
	mux.HandleFunc("GET /v2/sandboxes", s.listSandboxes(true))
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.resume)
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	mux.HandleFunc("PUT /sandboxes/{id}/network", s.network)
	mux.HandleFunc("GET /templates", s.templates)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, errdefs.NotSupported("not supported: %s %s (snapshots, forks, template builds, volumes and secrets are not part of corral's E2B API)", r.Method, r.URL.Path))
	})
	return s.authenticated(mux)
}

// authenticated puts the X-API-KEY's principal into the request context.
func (s *Server) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		p, err := s.cfg.Authenticate(r.Context(), r.Header.Get("X-API-KEY"))
		if err != nil {
			writeError(w, http.StatusUnauthorized, "invalid API key: "+err.Error())
			return
		}
		next.ServeHTTP(w, r.WithContext(iam.WithPrincipal(r.Context(), p)))
	})
}

// newSandbox is the body of POST /sandboxes and /v2/sandboxes.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	AutoPause           *bool             `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
}

type networkConfig struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// sandboxJSON carries the fields of E2B's Sandbox, SandboxDetail and
// ListedSandbox bodies.
type sandboxJSON struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          string            `json:"domain,omitempty"`
	StartedAt       *time.Time        `json:"startedAt,omitempty"`
	EndAt           *time.Time        `json:"endAt,omitempty"`
	CPUCount        *int64            `json:"cpuCount,omitempty"`
	MemoryMB        *int64            `json:"memoryMB,omitempty"`
	DiskSizeMB      *int64            `json:"diskSizeMB,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	State           string            `json:"state,omitempty"`
	Network         *networkConfig    `json:"network,omitempty"`
}

func (s *Server) describe(sb *corralv1.Sandbox, detail, token bool) sandboxJSON {
	out := sandboxJSON{
		TemplateID:  sb.Image,
		Alias:       sb.Image,
		SandboxID:   sb.Id,
		ClientID:    sb.NodeId,
		EnvdVersion: EnvdVersion,
		Domain:      s.cfg.Domain,
	}
	if token {
		out.EnvdAccessToken = s.accessToken(sb.Id)
	}
	if !detail {
		return out
	}
	started := sb.CreatedAt.AsTime()
	end := started.Add(sb.MaxLifetime.AsDuration())
	r := sb.GetResources()
	cpus := max(1, (r.GetCpuMillis()+999)/1000)
	mem, disk := r.GetMemoryBytes()>>20, r.GetDiskBytes()>>20
	out.StartedAt, out.EndAt = &started, &end
	out.CPUCount, out.MemoryMB, out.DiskSizeMB = &cpus, &mem, &disk
	out.Metadata = sb.Labels
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	out.State = "running"
	if sb.State == corralv1.SandboxState_SANDBOX_STATE_PAUSED {
		out.State = "paused"
	}
	if n := sb.GetNetwork(); n.GetMode() == corralv1.NetworkMode_NETWORK_MODE_ALLOWLIST {
		out.Network = &networkConfig{AllowOut: n.Allow, DenyOut: []string{"0.0.0.0/0"}}
	}
	return out
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.ContentLength == 0 {
		return true
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "request body: "+err.Error())
		return false
	}
	return true
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body newSandbox
	if !decode(w, r, &body) {
		return
	}
	req, err := createRequest(body)
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.may(r.Context(), corralv1connect.SandboxServiceCreateProcedure, req); err != nil {
		writeErr(w, err)
		return
	}
	resp, err := s.cfg.Control.Create(r.Context(), connect.NewRequest(req))
	if err != nil {
		writeErr(w, fmt.Errorf("create sandbox from template %q: %w", body.TemplateID, err))
		return
	}
	sb := resp.Msg.Sandbox
	if body.AutoPause != nil && *body.AutoPause {
		// Paused, not stopped, when the timeout passes.
		end := sb.CreatedAt.AsTime().Add(sb.MaxLifetime.AsDuration())
		if err := s.cfg.Node.SetEndAt(r.Context(), sb.Id, end, body.AutoPause); err != nil {
			_, _ = s.cfg.Control.Delete(context.WithoutCancel(r.Context()), connect.NewRequest(&corralv1.DeleteRequest{Id: sb.Id}))
			writeErr(w, fmt.Errorf("create sandbox: autoPause: %w", err))
			return
		}
	}
	writeJSON(w, http.StatusCreated, s.describe(sb, false, true))
}

// createRequest maps an E2B create body onto a corral create.
func createRequest(body newSandbox) (*corralv1.CreateRequest, error) {
	timeout := defaultTimeout
	if body.Timeout != nil {
		if *body.Timeout < 0 {
			return nil, errdefs.InvalidArgument("timeout: %d seconds must not be negative", *body.Timeout)
		}
		timeout = time.Duration(*body.Timeout) * time.Second
	}
	if len(body.VolumeMounts) > 0 {
		return nil, errdefs.NotSupported("not supported: volumeMounts")
	}
	image := body.TemplateID
	if image == "base" {
		image = "" // the SDKs' default template: the node's default image
	}
	net, err := networkPolicy(body.AllowInternetAccess, body.Network)
	if err != nil {
		return nil, err
	}
	env := make([]string, 0, len(body.EnvVars))
	for k, v := range body.EnvVars {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return &corralv1.CreateRequest{
		Image:       image,
		Env:         env,
		Labels:      body.Metadata,
		IdleTimeout: durationpb.New(0),
		MaxLifetime: durationpb.New(timeout),
		Network:     net,
	}, nil
}

// networkPolicy maps E2B's egress settings onto a corral policy: allowOut
// makes an allowlist (everything else denied, as E2B's denyOut 0.0.0.0/0);
// allow_internet_access true is open; anything else is no network.
func networkPolicy(internet *bool, n *networkConfig) (*corralv1.NetworkPolicy, error) {
	var allow, deny []string
	if n != nil {
		allow, deny = n.AllowOut, n.DenyOut
	}
	denyAll := false
	for i, d := range deny {
		if d != "0.0.0.0/0" && d != "::/0" {
			return nil, errdefs.InvalidArgument("network.denyOut[%d]: %q: only 0.0.0.0/0 is supported (corral egress rules are allowlists)", i, d)
		}
		denyAll = true
	}
	switch {
	case len(allow) > 0:
		return &corralv1.NetworkPolicy{Mode: corralv1.NetworkMode_NETWORK_MODE_ALLOWLIST, Allow: allow}, nil
	case internet != nil && *internet && !denyAll:
		return &corralv1.NetworkPolicy{Mode: corralv1.NetworkMode_NETWORK_MODE_OPEN}, nil
	}
	return &corralv1.NetworkPolicy{Mode: corralv1.NetworkMode_NETWORK_MODE_NONE}, nil
}

// lookup returns a sandbox as E2B sees it: a stopped one no longer exists.
func (s *Server) lookup(ctx context.Context, id string) (*corralv1.Sandbox, error) {
	get := &corralv1.GetRequest{Id: id}
	if err := s.may(ctx, corralv1connect.SandboxServiceGetProcedure, get); err != nil {
		return nil, err
	}
	resp, err := s.cfg.Control.Get(ctx, connect.NewRequest(get))
	if errdefs.IsInvalidArgument(err) {
		return nil, errdefs.NotFound("sandbox %q not found", id)
	}
	if err != nil {
		return nil, err
	}
	if resp.Msg.Sandbox.State == corralv1.SandboxState_SANDBOX_STATE_STOPPED {
		return nil, errdefs.NotFound("sandbox %s not found (stopped: %s)", id, resp.Msg.Sandbox.StopReason)
	}
	return resp.Msg.Sandbox, nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.describe(sb, true, true))
}

// listFilter is a parsed list query.
type listFilter struct {
	labels map[string]string
	phase  corralv1.SandboxState // UNSPECIFIED: running and paused
	limit  int
	token  string
}

func parseList(q url.Values, paged bool) (listFilter, error) {
	f := listFilter{limit: maxListLimit}
	if m := q.Get("metadata"); m != "" {
		// The SDKs send key=value pairs, form-encoded, as one value.
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return f, errdefs.InvalidArgument("metadata: %q is not a query of key=value pairs: %v", m, err)
		}
		f.labels = map[string]string{}
		for k, v := range pairs {
			f.labels[k] = v[len(v)-1]
		}
	}
	if !paged {
		f.phase = corralv1.SandboxState_SANDBOX_STATE_RUNNING
		return f, nil
	}
	// One comma-separated value (the JS SDK) or the parameter repeated.
	if st := strings.Join(q["state"], ","); st != "" {
		var running, paused bool
		for _, one := range strings.Split(st, ",") {
			switch one {
			case "running":
				running = true
			case "paused":
				paused = true
			default:
				return f, errdefs.InvalidArgument("state: %q is not running or paused", one)
			}
		}
		switch {
		case running && !paused:
			f.phase = corralv1.SandboxState_SANDBOX_STATE_RUNNING
		case paused && !running:
			f.phase = corralv1.SandboxState_SANDBOX_STATE_PAUSED
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			return f, errdefs.InvalidArgument("limit: %q must be a number from 1 to %d", l, maxListLimit)
		}
		f.limit = n
	}
	f.token = q.Get("nextToken")
	return f, nil
}

func (s *Server) list(ctx context.Context, f listFilter, all bool) ([]sandboxJSON, string, error) {
	out := []sandboxJSON{}
	token := f.token
	for {
		resp, err := s.cfg.Control.List(ctx, connect.NewRequest(&corralv1.ListRequest{
			Labels: f.labels, State: f.phase, PageSize: int32(f.limit), PageToken: token,
		}))
		if err != nil {
			return nil, "", err
		}
		for _, sb := range resp.Msg.Sandboxes {
			if sb.State != corralv1.SandboxState_SANDBOX_STATE_STOPPED {
				out = append(out, s.describe(sb, true, false))
			}
		}
		token = resp.Msg.NextPageToken
		if !all || token == "" {
			return out, token, nil
		}
	}
}

// listSandboxes serves GET /sandboxes (v1: every page in one answer) and
// GET /v2/sandboxes (a page, the next one's token in X-Next-Token).
func (s *Server) listSandboxes(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, err := parseList(r.URL.Query(), v2)
		if err != nil {
			writeErr(w, err)
			return
		}
		out, next, err := s.list(r.Context(), f, !v2)
		if err != nil {
			writeErr(w, err)
			return
		}
		if next != "" {
			w.Header().Set("X-Next-Token", next)
		}
		writeJSON(w, http.StatusOK, out)
	}
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := s.lookup(r.Context(), id); err != nil {
		writeErr(w, err)
		return
	}
	del := &corralv1.DeleteRequest{Id: id}
	if err := s.may(r.Context(), corralv1connect.SandboxServiceDeleteProcedure, del); err != nil {
		writeErr(w, err)
		return
	}
	resp, err := s.cfg.Control.Delete(r.Context(), connect.NewRequest(del))
	if err != nil {
		writeErr(w, err)
		return
	}
	if !resp.Msg.Existed {
		writeError(w, http.StatusNotFound, "sandbox "+id+" not found")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// extend moves the sandbox's end to timeout seconds from now; with
// onlyLater it never shortens the sandbox's life.
func (s *Server) extend(ctx context.Context, sb *corralv1.Sandbox, seconds int64, onlyLater bool) error {
	if seconds < 0 {
		return errdefs.InvalidArgument("timeout: %d seconds must not be negative", seconds)
	}
	end := time.Now().Add(time.Duration(seconds) * time.Second)
	cur := sb.CreatedAt.AsTime().Add(sb.MaxLifetime.AsDuration())
	if onlyLater && !end.After(cur) {
		return nil
	}
	// Moving a sandbox's end is a change to it, as a pause is.
	if err := s.may(ctx, corralv1connect.SandboxServicePauseProcedure, &corralv1.PauseRequest{Id: sb.Id}); err != nil {
		return err
	}
	return s.cfg.Node.SetEndAt(ctx, sb.Id, end, nil)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if !decode(w, r, &body) {
		return
	}
	if body.Timeout == nil {
		writeError(w, http.StatusBadRequest, "timeout: required (seconds)")
		return
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err == nil {
		err = s.extend(r.Context(), sb, *body.Timeout, false)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh is older SDKs' keep-alive: the end moves to duration seconds
// from now, never earlier.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if !decode(w, r, &body) {
		return
	}
	seconds := int64(defaultTimeout / time.Second)
	if body.Duration != nil {
		seconds = *body.Duration
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err == nil {
		err = s.extend(r.Context(), sb, seconds, true)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if sb.State == corralv1.SandboxState_SANDBOX_STATE_PAUSED {
		writeError(w, http.StatusConflict, "sandbox "+sb.Id+" is already paused")
		return
	}
	pause := &corralv1.PauseRequest{Id: sb.Id}
	if err := s.may(r.Context(), corralv1connect.SandboxServicePauseProcedure, pause); err != nil {
		writeErr(w, err)
		return
	}
	if _, err := s.cfg.Control.Pause(r.Context(), connect.NewRequest(pause)); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeOrConnect resumes a paused sandbox (created: true) and applies the
// body's timeout.
func (s *Server) resumeOrConnect(w http.ResponseWriter, r *http.Request, onlyLater bool) (*corralv1.Sandbox, bool, error) {
	var body timeoutBody
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
			return nil, false, errdefs.InvalidArgument("request body: %v", err)
		}
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, false, err
	}
	resumed := sb.State == corralv1.SandboxState_SANDBOX_STATE_PAUSED
	seconds := body.Timeout
	if seconds == nil && resumed && time.Now().After(sb.CreatedAt.AsTime().Add(sb.MaxLifetime.AsDuration())) {
		// Paused at its end (autoPause) and resumed without a timeout:
		// E2B's default lifetime from now, or it would pause again at once.
		d := int64(defaultTimeout / time.Second)
		seconds = &d
	}
	// The end moves before the resume, so that the reaper does not pause
	// an autoPause sandbox again in between.
	if seconds != nil {
		if err := s.extend(r.Context(), sb, *seconds, onlyLater); err != nil {
			return nil, false, err
		}
	}
	if resumed {
		resume := &corralv1.ResumeRequest{Id: sb.Id}
		if err := s.may(r.Context(), corralv1connect.SandboxServiceResumeProcedure, resume); err != nil {
			return nil, false, err
		}
		if _, err := s.cfg.Control.Resume(r.Context(), connect.NewRequest(resume)); err != nil {
			return nil, false, err
		}
	}
	sb, err = s.lookup(r.Context(), sb.Id)
	return sb, resumed, err
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	sb, resumed, err := s.resumeOrConnect(w, r, true)
	if err != nil {
		writeErr(w, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.describe(sb, false, true))
}

// resume is the older call: it refuses a running sandbox.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if sb.State != corralv1.SandboxState_SANDBOX_STATE_PAUSED {
		writeError(w, http.StatusConflict, "sandbox "+sb.Id+" is already running")
		return
	}
	sb, _, err = s.resumeOrConnect(w, r, false)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.describe(sb, false, true))
}

type networkUpdate struct {
	AllowOut            []string `json:"allowOut"`
	DenyOut             []string `json:"denyOut"`
	AllowInternetAccess *bool    `json:"allow_internet_access"`
}

// network replaces a running sandbox's egress policy.
func (s *Server) network(w http.ResponseWriter, r *http.Request) {
	var body networkUpdate
	if !decode(w, r, &body) {
		return
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	pol, err := networkPolicy(body.AllowInternetAccess, &networkConfig{AllowOut: body.AllowOut, DenyOut: body.DenyOut})
	if err != nil {
		writeErr(w, err)
		return
	}
	update := &corralv1.UpdateNetworkRequest{Id: sb.Id, Mode: pol.Mode, Allow: pol.Allow, Replace: true}
	if err := s.may(r.Context(), corralv1connect.SandboxServiceUpdateNetworkProcedure, update); err != nil {
		writeErr(w, err)
		return
	}
	_, err = s.cfg.Control.UpdateNetwork(r.Context(), connect.NewRequest(update))
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type templateJSON struct {
	TemplateID    string    `json:"templateID"`
	BuildID       string    `json:"buildID"`
	CPUCount      int64     `json:"cpuCount"`
	MemoryMB      int64     `json:"memoryMB"`
	DiskSizeMB    int64     `json:"diskSizeMB"`
	Public        bool      `json:"public"`
	Aliases       []string  `json:"aliases"`
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
	SpawnCount    int64     `json:"spawnCount"`
	BuildCount    int64     `json:"buildCount"`
	EnvdVersion   string    `json:"envdVersion"`
	BuildStatus   string    `json:"buildStatus"`
	LastSpawnedAt *string   `json:"lastSpawnedAt"`
}

func (s *Server) templates(w http.ResponseWriter, r *http.Request) {
	out := []templateJSON{}
	if s.cfg.Templates != nil {
		list, err := s.cfg.Templates(r.Context())
		if err != nil {
			writeErr(w, err)
			return
		}
		for _, t := range list {
			out = append(out, templateJSON{
				TemplateID: t.Name, BuildID: t.Name, CPUCount: 1, DiskSizeMB: t.SizeBytes >> 20,
				Aliases: []string{t.Name}, EnvdVersion: EnvdVersion, BuildStatus: "ready",
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// metricSample is E2B's SandboxMetric.
type metricSample struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int64     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metricWindow is how long CPU use is measured over for one sample.
const metricWindow = 200 * time.Millisecond

// metrics answers one sample taken now (E2B keeps a history; corral does
// not, so start and end are not used).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	before, err := s.cfg.Node.Usage(r.Context(), sb.Id)
	if err != nil {
		writeErr(w, err)
		return
	}
	t0 := time.Now()
	select {
	case <-r.Context().Done():
		return
	case <-time.After(metricWindow):
	}
	after, err := s.cfg.Node.Usage(r.Context(), sb.Id)
	if err != nil {
		writeErr(w, err)
		return
	}
	res := sb.GetResources()
	cpus := max(1, (res.GetCpuMillis()+999)/1000)
	now := time.Now()
	limit := float64(res.GetCpuMillis()) / 1000
	if limit <= 0 {
		limit = float64(cpus)
	}
	pct := 100 * float64(after.CPU-before.CPU) / float64(now.Sub(t0)) / limit
	writeJSON(w, http.StatusOK, []metricSample{{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpus, CPUUsedPct: max(0, pct),
		MemUsed: after.MemoryBytes, MemTotal: res.GetMemoryBytes(), MemCache: after.CacheBytes,
		DiskUsed: after.DiskUsedBytes, DiskTotal: after.DiskTotalBytes,
	}})
}
