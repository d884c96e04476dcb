package e2b

import (
	"net/http/httptest"
	"net/url"
	"testing"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

func TestSandboxOf(t *testing.T) {
	s := &Server{cfg: Config{Domain: "sbx.example:3000"}}
	for _, c := range []struct {
		host, header, port string
		id                 string
		wantPort           int
	}{
		{host: "127.0.0.1:3000", header: "n1-abc", id: "n1-abc", wantPort: EnvdPort},
		{host: "127.0.0.1:3000", header: "n1-abc", port: "8080", id: "n1-abc", wantPort: 8080},
		{host: "49983-n1-abc.sbx.example:3000", id: "n1-abc", wantPort: EnvdPort},
		{host: "8080-n1-abc.SBX.example", id: "n1-abc", wantPort: 8080},
		{host: "api.sbx.example"},                 // control API
		{host: "49983-n1-abc.other.example:3000"}, // another domain
		{host: "x-n1-abc.sbx.example"},            // no port
		{host: "127.0.0.1:3000"},
	} {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = c.host
		if c.header != "" {
			r.Header.Set("E2b-Sandbox-Id", c.header)
		}
		if c.port != "" {
			r.Header.Set("E2b-Sandbox-Port", c.port)
		}
		id, port := s.sandboxOf(r)
		if id != c.id || (id != "" && port != c.wantPort) {
			t.Errorf("host %q header %q: got %q %d, want %q %d", c.host, c.header, id, port, c.id, c.wantPort)
		}
	}
}

func TestNetworkPolicy(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		internet *bool
		n        *networkConfig
		mode     corralv1.NetworkMode
		err      string
	}{
		{mode: corralv1.NetworkMode_NETWORK_MODE_NONE},
		{internet: &no, mode: corralv1.NetworkMode_NETWORK_MODE_NONE},
		{internet: &yes, mode: corralv1.NetworkMode_NETWORK_MODE_OPEN},
		{internet: &yes, n: &networkConfig{DenyOut: []string{"0.0.0.0/0"}}, mode: corralv1.NetworkMode_NETWORK_MODE_NONE},
		{n: &networkConfig{AllowOut: []string{"pypi", "1.2.3.4"}, DenyOut: []string{"0.0.0.0/0"}}, mode: corralv1.NetworkMode_NETWORK_MODE_ALLOWLIST},
		{n: &networkConfig{DenyOut: []string{"0.0.0.0/0", "8.8.8.8"}}, err: `network.denyOut[1]: "8.8.8.8": only 0.0.0.0/0 is supported (corral egress rules are allowlists)`},
	} {
		p, err := networkPolicy(c.internet, c.n)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("%+v: error %v, want %q", c, err, c.err)
			}
			continue
		}
		if err != nil || p.Mode != c.mode {
			t.Errorf("%+v: %v %v, want mode %v", c, p, err, c.mode)
		}
	}
}

func TestParseList(t *testing.T) {
	q := url.Values{"metadata": {"suite=a%20b&role=main"}, "state": {"paused"}, "limit": {"5"}, "nextToken": {"tok"}}
	f, err := parseList(q, true)
	if err != nil || f.labels["suite"] != "a b" || f.labels["role"] != "main" || f.phase != corralv1.SandboxState_SANDBOX_STATE_PAUSED || f.limit != 5 || f.token != "tok" {
		t.Fatalf("parsed %+v %v", f, err)
	}
	for _, both := range []url.Values{{"state": {"running,paused"}}, {"state": {"running", "paused"}}} {
		if f, err := parseList(both, true); err != nil || f.phase != corralv1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
			t.Fatalf("%v: %v %v", both, f.phase, err)
		}
	}
	for _, bad := range []url.Values{{"limit": {"0"}}, {"limit": {"101"}}, {"state": {"stopped"}}} {
		if _, err := parseList(bad, true); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
}

func TestCheckKeyFormat(t *testing.T) {
	for key, ok := range map[string]bool{
		"e2b_0123456789abcdef0123": true, "e2b_short": false, "E2B_0123456789abcdef0123": false,
		"e2b_0123456789ABCDEF0123": false, "": false,
	} {
		if err := CheckKeyFormat(key); (err == nil) != ok {
			t.Errorf("%q: %v", key, err)
		}
	}
}
