// Package runner is the thin goroutine wrapper around an engine.Engine: it owns the engine,
// paces its steps in real time, takes the calls of a router and a prefill instance through a
// bounded queue, and hands every step's events to subscribers without ever waiting for them.
//
// # Usage
//
//	r := runner.New(e, runner.Config{StepsPerSec: 50, Clock: time.Now})
//	go r.Run(ctx)
//	sub := r.Subscribe()         // a feed.Mailbox: first update is a snapshot
//	ans, err := r.PrepRecv(ctx, engine.PrepRecv{...}) // waits until admitted
//
// # Concurrency
//
// Every method is safe for concurrent use. The engine is touched only by the goroutine in
// Run. A subscription never blocks the runner: a subscriber that falls more than Backlog
// events behind loses them, is told how many, and gets a fresh snapshot instead when it next
// calls Take (the subscriber waits for the engine, never the other way round).
//
// Snapshots are shared: every subscription that needs one at a time (Subscribe, an owed
// Take) waits for the next round, which builds one snapshot for all of them on the engine's
// goroutine, and none at all when the engine has not changed since the last: at most one
// between two steps. Rounds of resyncs come at most once per Config.SnapshotInterval, so
// however many viewers resync or fall behind, the engine builds at most one snapshot an
// interval for them; new subscriptions are served at once (their rate is the server's to
// cap). Consumers must treat a snapshot as read-only.
//
// What the runner holds for callers is bounded by them: a prep_recv waits for admission
// (Config.MaxWaiting of them at once), a completion's tokens wait for its reader until the
// reader's context ends, and then are dropped (Waiters counts both).
package runner
