// Package record writes what a dashboard receives to a file, and plays such a file back as
// a dashboard source: a recording of a stuck decode instance is a bug report anyone can
// open with `kvtop replay FILE`.
//
// A recording is one JSON frame a line, in the stream's own format (wire/protocol's Frame): a
// hello frame, a snapshot frame, then events frames (and status and dropped frames as they
// came). Every later snapshot (after a resync) is written too, so a player can seek without
// replaying from the start.
//
// A recording must survive the crash it is meant to capture. The recorder flushes within
// FlushEvery (100ms) of a write; the loader keeps everything before a last line cut short
// (Recording.Truncated says so) and reads at most MaxLineBytes of a line. A dashboard that
// reconnects (perhaps to a restarted server, whose steps start again) starts a new epoch
// (feed.Update.Epoch), which the recorder marks with a hello frame; steps are ordered within
// an epoch, and a player seeks within the epoch it is playing first.
//
// # Concurrency
//
// A Recorder is safe for concurrent use. A Player runs its own goroutine; its Source methods
// are safe for concurrent use. It never waits for the dashboard: what it plays waits in a
// feed.Mailbox of PlayerOptions.Backlog events, past which the dashboard loses them (counted)
// and gets the state the player has reached instead.
//
// # Imports
//
// record imports engine, feed and wire/protocol (the codec alone): no HTTP server, no
// websocket, no Prometheus.
package record
