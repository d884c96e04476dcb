package e2b

import (
	"context"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/corral-dev/corral/internal/iam"
)

// TestTokenAuth: corral tokens pass as keys, as printed or wrapped in the
// e2b_<hex> form; other keys go to the operator's key, and without one
// they reach the token check (and fail there).
func TestTokenAuth(t *testing.T) {
	const token = "corral_0123456789ab_secret"
	var checked []string
	check := func(_ context.Context, key string) (iam.Principal, error) {
		checked = append(checked, key)
		if key != token {
			return iam.Principal{}, errors.New("bad token")
		}
		return iam.Principal{Project: "p", Role: iam.RoleMember, TokenID: "0123456789ab"}, nil
	}
	operator := KeyAuth("e2b_00112233445566778899", "")
	ctx := context.Background()
	auth := TokenAuth(check, operator)
	for _, key := range []string{token, "e2b_" + hex.EncodeToString([]byte(token))} {
		p, err := auth(ctx, key)
		if err != nil || p.Project != "p" {
			t.Errorf("key %q: %+v %v, want project p", key, p, err)
		}
	}
	if _, err := auth(ctx, "e2b_00112233445566778899"); err != nil {
		t.Errorf("operator key: %v", err)
	}
	if _, err := auth(ctx, "e2b_ffff0000ffff0000ffff"); !errors.Is(err, ErrBadKey) {
		t.Errorf("unknown e2b key: %v, want ErrBadKey", err)
	}
	checked = nil
	if _, err := TokenAuth(check, nil)(ctx, "e2b_ffff0000ffff0000ffff"); err == nil || len(checked) != 1 {
		t.Errorf("without an operator key: %v (checked %q), want the token check to refuse", err, checked)
	}
}
