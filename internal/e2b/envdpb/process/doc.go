// Package processpb holds the types of E2B envd's process.Process service, generated from
// process.proto by ./scripts/generate.sh; processpbconnect holds its Connect stubs.
// Only internal/e2b imports it; it imports nothing from corral.
package processpb
