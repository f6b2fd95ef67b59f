// Package invariants switches kvtop's costly self-checks on and off.
//
// Build or test with -tags invariants to run them: the engine's packages then check the
// invariants of docs/kv-cache.md after every operation that could break them, and panic
// when one does not hold. CI runs the engine's tests both ways.
//
// invariants is a leaf: it imports nothing.
package invariants
