package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	filesystempb "github.com/corral-dev/corral/internal/e2b/envdpb/filesystem"
	"github.com/corral-dev/corral/internal/e2b/envdpb/filesystem/filesystempbconnect"
	processpb "github.com/corral-dev/corral/internal/e2b/envdpb/process"
	"github.com/corral-dev/corral/internal/e2b/envdpb/process/processpbconnect"
)

// sandboxHeaders routes every request to one sandbox's envd.
type sandboxHeaders struct{ id, token string }

func (h sandboxHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("X-Access-Token", h.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestEnvdCallsTheJSSDKDoesNotMake covers the envd calls the e2b JS SDK
// never makes (the polling watcher, StreamInput, tags) and the control
// API's error bodies, with Go Connect clients of the envd protocol.
func TestEnvdCallsTheJSSDKDoesNotMake(t *testing.T) {
	key, url := startE2B(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	post := func(path, key string, body any) (*http.Response, map[string]any) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(b))
		req.Header.Set("X-API-KEY", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp, out
	}
	resp, body := post("/sandboxes", "e2b_"+"ab"+"00000000000000000000", map[string]any{"templateID": "busybox"})
	if resp.StatusCode != http.StatusUnauthorized || body["code"] != float64(401) {
		t.Fatalf("wrong key: %d %v", resp.StatusCode, body)
	}
	resp, body = post("/sandboxes", key, map[string]any{"templateID": "busybox", "network": map[string]any{"denyOut": []string{"10.0.0.0/8"}}})
	if resp.StatusCode != http.StatusBadRequest || body["message"] != `network.denyOut[0]: "10.0.0.0/8": only 0.0.0.0/0 is supported (corral egress rules are allowlists)` {
		t.Fatalf("denyOut: %d %v", resp.StatusCode, body)
	}
	resp, body = post("/sandboxes", key, map[string]any{"templateID": "no-such-image"})
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown template: %d %v", resp.StatusCode, body)
	}
	resp, body = post("/v2/sandboxes", key, map[string]any{"templateID": "busybox", "timeout": 120})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %v", resp.StatusCode, body)
	}
	id, token := body["sandboxID"].(string), body["envdAccessToken"].(string)
	if body["envdVersion"] != "0.5.7" || token == "" {
		t.Fatalf("create response: %v", body)
	}
	if resp, body = post("/sandboxes/"+id+"/resume", key, nil); resp.StatusCode != http.StatusConflict {
		t.Fatalf("resume of a running sandbox: %d %v, want 409", resp.StatusCode, body)
	}
	if resp, body = post("/sandboxes/"+id+"/refreshes", key, map[string]any{"duration": 3600}); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("refresh: %d %v", resp.StatusCode, body)
	}
	if resp, body = post("/sandboxes/"+id+"/snapshots", key, nil); resp.StatusCode != http.StatusNotImplemented || body["code"] != float64(501) {
		t.Fatalf("snapshots: %d %v, want 501", resp.StatusCode, body)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var info struct{ StartedAt, EndAt time.Time }
	_ = json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if life := info.EndAt.Sub(info.StartedAt); life < 3500*time.Second {
		t.Fatalf("lifetime after a refresh of 3600 s: %s", life)
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, url+"/templates", nil)
	req.Header.Set("X-API-KEY", key)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	var templates []struct {
		TemplateID string `json:"templateID"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&templates)
	resp.Body.Close()
	if len(templates) == 0 || templates[0].TemplateID != "busybox" {
		t.Fatalf("templates: %+v", templates)
	}
	hc := &http.Client{Transport: sandboxHeaders{id, token}}
	fs := filesystempbconnect.NewFilesystemClient(hc, url, connect.WithProtoJSON())
	proc := processpbconnect.NewProcessClient(hc, url, connect.WithProtoJSON())

	forged := filesystempbconnect.NewFilesystemClient(&http.Client{Transport: sandboxHeaders{id, "forged"}}, url, connect.WithProtoJSON())
	if _, err := forged.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: "/"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("forged access token: %v, want unauthenticated", err)
	}

	if _, err := fs.MakeDir(ctx, connect.NewRequest(&filesystempb.MakeDirRequest{Path: "/tmp/pw"})); err != nil {
		t.Fatal(err)
	}
	w, err := fs.CreateWatcher(ctx, connect.NewRequest(&filesystempb.CreateWatcherRequest{Path: "/tmp/pw", IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	// A tagged process whose stdin comes through StreamInput.
	tag := "writer"
	stream, err := proc.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "read x; echo $x > /tmp/pw/f"}},
		Tag:     &tag, Stdin: ptr(true),
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().Event.GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	in := proc.StreamInput(ctx)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: tag}}
	if err := in.Send(&processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Start{Start: &processpb.StreamInputRequest_StartEvent{Process: sel}}}); err != nil {
		t.Fatal(err)
	}
	data := &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("streamed\n")}}
	if err := in.Send(&processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Data{Data: &processpb.StreamInputRequest_DataEvent{Input: data}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("stream input: %v", err)
	}
	var end *processpb.ProcessEvent_EndEvent
	for stream.Receive() {
		if e := stream.Msg().Event.GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.ExitCode != 0 || !end.Exited {
		t.Fatalf("end: %+v %v", end, stream.Err())
	}
	var names []string
	deadline := time.Now().Add(10 * time.Second)
	for len(names) < 2 && time.Now().Before(deadline) {
		ev, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: w.Msg.WatcherId}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev.Msg.Events {
			names = append(names, e.Type.String()+":"+e.Name)
			if e.Type == filesystempb.EventType_EVENT_TYPE_CREATE && e.GetEntry().GetPath() != "/tmp/pw/f" {
				t.Errorf("create event's entry: %v", e.GetEntry())
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(names) < 2 || names[0] != "EVENT_TYPE_CREATE:f" || names[1] != "EVENT_TYPE_WRITE:f" {
		t.Fatalf("polled events: %v", names)
	}
	if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: w.Msg.WatcherId})); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: w.Msg.WatcherId})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("events of a removed watcher: %v, want not found", err)
	}
	if _, err := proc.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to an ended process: %v, want not found", err)
	}
	if _, err := fs.ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: "/tmp", Depth: 99})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("depth 99: %v, want invalid argument", err)
	}
}

func ptr[T any](v T) *T { return &v }
