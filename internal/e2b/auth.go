package e2b

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/corral-dev/corral/internal/iam"
)

// Authenticator maps an X-API-KEY value to the caller, or fails.
type Authenticator func(ctx context.Context, key string) (iam.Principal, error)

// ErrBadKey is returned for a missing or unknown API key.
var ErrBadKey = errors.New("invalid API key")

// keyPattern is the e2b_<hex> form the Python SDK validates keys against.
var keyPattern = regexp.MustCompile(`^e2b_[0-9a-f]{16,128}$`)

// CheckKeyFormat validates a key handed to `--e2b-api-key`.
func CheckKeyFormat(key string) error {
	if !keyPattern.MatchString(key) {
		return fmt.Errorf("e2b api key: must be e2b_ followed by 16 to 128 lowercase hex digits (the form the e2b SDKs accept)")
	}
	return nil
}

// TokenAuth accepts corral tokens as API keys, as they are or in the
// e2b_<hex> form (the token's bytes in hex) that the Python SDK's key
// check lets through, checked by check; fallback (nil: none) takes any
// other key.
func TokenAuth(check Authenticator, fallback Authenticator) Authenticator {
	return func(ctx context.Context, key string) (iam.Principal, error) {
		if hexed, ok := strings.CutPrefix(key, "e2b_"); ok {
			if raw, err := hex.DecodeString(hexed); err == nil && strings.HasPrefix(string(raw), "corral_") {
				key = string(raw)
			}
		}
		if strings.HasPrefix(key, "corral_") || fallback == nil {
			return check(ctx, key)
		}
		return fallback(ctx, key)
	}
}

// KeyAuth accepts exactly one key, as a member of project; it stands in
// until keys are corral tokens.
func KeyAuth(key, project string) Authenticator {
	return func(_ context.Context, got string) (iam.Principal, error) {
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(key)) != 1 {
			return iam.Principal{}, ErrBadKey
		}
		return iam.Principal{Project: project, Role: iam.RoleMember, TokenID: "e2b-api-key"}, nil
	}
}
