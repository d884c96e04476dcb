// Package filesystempbconnect holds the generated Connect stubs of E2B envd's
// filesystem.Filesystem service (see package filesystempb). Only internal/e2b imports it.
package filesystempbconnect
