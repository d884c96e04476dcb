// Package filesystempb holds the types of E2B envd's filesystem.Filesystem service, generated from
// filesystem.proto by ./scripts/generate.sh; filesystempbconnect holds its Connect stubs.
// Only internal/e2b imports it; it imports nothing from corral.
package filesystempb
