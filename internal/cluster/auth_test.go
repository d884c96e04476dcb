package cluster

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// TestSignedPrincipal: the node accepts a call only when signed with the
// cluster secret for that procedure, and then sees the control instance's
// caller as the request's principal.
func TestSignedPrincipal(t *testing.T) {
	secret := Secret("0123456789abcdef-secret")
	var seen iam.Principal
	var ok bool
	h := RequireSigned(secret, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, ok = iam.FromContext(r.Context())
	}))
	call := func(sign func(http.Header)) int {
		req := httptest.NewRequest("POST", "/corral.v1.SandboxService/Create", nil)
		sign(req.Header)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	p := iam.Principal{Project: "job42/agent7", Role: iam.RoleMember, TokenID: "tok1"}
	for i := range 2 { // the second time from the remembered headers
		ok = false
		if code := call(func(h http.Header) { secret.sign(h, "/corral.v1.SandboxService/Create", p) }); code != http.StatusOK || !ok || seen != p {
			t.Fatalf("signed call %d: %d, principal %+v (%v); want 200 and %+v", i, code, seen, ok, p)
		}
	}
	cases := map[string]func(http.Header){
		"unsigned":        func(http.Header) {},
		"other secret":    func(h http.Header) { Secret("another-secret-of-16+").sign(h, "/corral.v1.SandboxService/Create", p) },
		"other procedure": func(h http.Header) { secret.sign(h, "/corral.v1.SandboxService/Delete", p) },
		// The first call's headers are remembered as verified: a changed
		// MAC must not match them.
		"remembered, other mac": func(h http.Header) {
			secret.sign(h, "/corral.v1.SandboxService/Create", p)
			h.Set(macHeader, secret.mac("/corral.v1.SandboxService/Delete", h.Get(principalHeader), h.Get(timeHeader)))
		},
		"forged principal": func(h http.Header) {
			secret.sign(h, "/corral.v1.SandboxService/Create", p)
			h.Set(principalHeader, "eyJOb2RlQWRtaW4iOnRydWV9") // {"NodeAdmin":true}
		},
	}
	for name, sign := range cases {
		ok = false
		if code := call(sign); code != http.StatusForbidden || ok {
			t.Errorf("%s: %d (handler reached: %v), want 403", name, code, ok)
		}
	}
	if _, err := secret.verify(httptest.NewRequest("POST", "/x", nil), "/x"); !errdefs.IsPermissionDenied(err) {
		t.Errorf("verify of no headers: %v", err)
	}
	// With no secret, only a verified client certificate admits a call.
	if _, err := Secret(nil).verify(httptest.NewRequest("POST", "/x", nil), "/x"); !errdefs.IsPermissionDenied(err) {
		t.Errorf("no secret, no client certificate: %v", err)
	}
}
