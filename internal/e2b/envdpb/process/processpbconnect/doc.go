// Package processpbconnect holds the generated Connect stubs of E2B envd's
// process.Process service (see package processpb). Only internal/e2b imports it.
package processpbconnect
