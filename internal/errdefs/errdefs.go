// Package errdefs is corral's one error vocabulary. Code anywhere below the
// API wraps one of these classes with context (fmt.Errorf("...: %w", err) or
// the constructors here); the API edge maps classes to Connect codes and the
// SDK maps them back. It imports nothing from corral.
package errdefs

import (
	"errors"
	"fmt"
)

// The error classes. Compare with errors.Is or the Is* helpers.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrNotSupported       = errors.New("not supported")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
)

// classed keeps the message as written while errors.Is finds the class.
type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }

func newf(class error, format string, args ...any) error {
	return &classed{class: class, msg: fmt.Sprintf(format, args...)}
}

// InvalidArgument reports a bad request field; name the field and the limit.
func InvalidArgument(format string, args ...any) error {
	return newf(ErrInvalidArgument, format, args...)
}

// NotFound reports a missing object.
func NotFound(format string, args ...any) error { return newf(ErrNotFound, format, args...) }

// AlreadyExists reports a name or id that is taken.
func AlreadyExists(format string, args ...any) error {
	return newf(ErrAlreadyExists, format, args...)
}

// FailedPrecondition reports an object in the wrong state for the request.
func FailedPrecondition(format string, args ...any) error {
	return newf(ErrFailedPrecondition, format, args...)
}

// ResourceExhausted reports a quota or capacity limit.
func ResourceExhausted(format string, args ...any) error {
	return newf(ErrResourceExhausted, format, args...)
}

// Unavailable reports a transient failure worth retrying.
func Unavailable(format string, args ...any) error { return newf(ErrUnavailable, format, args...) }

// PermissionDenied reports a caller that may not do this.
func PermissionDenied(format string, args ...any) error {
	return newf(ErrPermissionDenied, format, args...)
}

// NotSupported reports a verb a backend cannot serve or a kernel feature this
// host lacks; say what is needed ("not supported: X (needs Y)").
func NotSupported(format string, args ...any) error {
	return newf(ErrNotSupported, format, args...)
}

func IsInvalidArgument(err error) bool    { return errors.Is(err, ErrInvalidArgument) }
func IsNotFound(err error) bool           { return errors.Is(err, ErrNotFound) }
func IsAlreadyExists(err error) bool      { return errors.Is(err, ErrAlreadyExists) }
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }
func IsResourceExhausted(err error) bool  { return errors.Is(err, ErrResourceExhausted) }
func IsUnavailable(err error) bool        { return errors.Is(err, ErrUnavailable) }
func IsPermissionDenied(err error) bool   { return errors.Is(err, ErrPermissionDenied) }
func IsNotSupported(err error) bool       { return errors.Is(err, ErrNotSupported) }

// ErrUnauthenticated is a request without valid credentials (no token, or
// an unknown, revoked or expired one).
var ErrUnauthenticated = errors.New("unauthenticated")

// Unauthenticated reports a caller whose credentials are missing or invalid.
func Unauthenticated(format string, args ...any) error {
	return newf(ErrUnauthenticated, format, args...)
}

func IsUnauthenticated(err error) bool { return errors.Is(err, ErrUnauthenticated) }
