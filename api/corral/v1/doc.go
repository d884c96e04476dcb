// Package corralv1 holds corral's API types, generated from the .proto
// files beside it by ./scripts/generate.sh (never edited by hand); the
// Connect service stubs are in corralv1connect. The SDK (client) and the
// API layer (internal/control, internal/cluster) import it; it imports
// nothing from corral.
package corralv1
