// Package deptest holds the tests of the repository's shape: which package
// may import which (one row per package, the rows of docs/ARCHITECTURE.md),
// which packages the static sandbox binaries must never link, and that every
// package carries a doc comment. It has no code of its own and nothing
// imports it; its tests import only the standard library.
package deptest
