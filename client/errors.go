package client

import (
	"errors"
	"syscall"

	"connectrpc.com/connect"
)

// Code classifies an error from the server.
type Code string

const (
	CodeInvalidArgument    Code = "invalid_argument"
	CodeNotFound           Code = "not_found"
	CodeAlreadyExists      Code = "already_exists"
	CodeFailedPrecondition Code = "failed_precondition"
	CodeResourceExhausted  Code = "resource_exhausted"
	CodeUnavailable        Code = "unavailable"
	CodePermissionDenied   Code = "permission_denied"
	CodeUnauthenticated    Code = "unauthenticated"
	CodeUnimplemented      Code = "unimplemented"
	CodeDeadlineExceeded   Code = "deadline_exceeded"
	CodeCanceled           Code = "canceled"
	CodeInternal           Code = "internal"
)

// Error is an error returned by the corral server.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// wrapErr turns a transport error into an *Error.
func wrapErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	code := Code(ce.Code().String())
	switch {
	case ce.Code() == connect.CodeUnknown:
		code = CodeInternal
	case ce.Code() == connect.CodeCanceled && connectionLost(err):
		// Connect calls a reset connection "canceled" (on a server it is
		// the client going away); here the server went away, and the
		// caller, who cancelled nothing, may retry elsewhere.
		code = CodeUnavailable
	}
	return &Error{Code: code, Message: ce.Message()}
}

func connectionLost(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// CodeOf returns the server's code for err, or "" for a local error.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func IsNotFound(err error) bool        { return CodeOf(err) == CodeNotFound }
func IsInvalidArgument(err error) bool { return CodeOf(err) == CodeInvalidArgument }
func IsFailedPrecondition(err error) bool {
	return CodeOf(err) == CodeFailedPrecondition
}
func IsUnimplemented(err error) bool     { return CodeOf(err) == CodeUnimplemented }
func IsUnavailable(err error) bool       { return CodeOf(err) == CodeUnavailable }
func IsResourceExhausted(err error) bool { return CodeOf(err) == CodeResourceExhausted }
func IsUnauthenticated(err error) bool   { return CodeOf(err) == CodeUnauthenticated }
func IsPermissionDenied(err error) bool  { return CodeOf(err) == CodePermissionDenied }
