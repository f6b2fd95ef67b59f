// Package feed is what a viewer of an engine receives and asks, wherever the engine runs: the
// Update it takes (a snapshot to start over from, events in order, the latest Status, the
// count of what it lost), the Control it sends, the Link it came over, and the Mailbox that
// every producer of updates delivers through.
//
// Three producers share the Mailbox: the engine's runner (engine/runner, one subscription a
// viewer), the websocket client attached to `kvtop serve` (wire), and the replay player
// (record). They differ only in how they pay a snapshot that is owed: the runner takes one on
// the engine's goroutine, the client asks the server, the player builds one from its view.
//
// A History keeps what a viewer received and rebuilds the state at any step it holds: a
// recording loaded for the player is one, and the dashboard keeps a bounded one to rewind.
//
// # Usage
//
// A producer:
//
//	mb := feed.NewMailbox(backlog)
//	mb.Snapshot(&snap)               // the first update: where the viewer starts
//	if !mb.Offer(events) && mb.Owed() {
//		// the viewer fell behind: its events were dropped and counted;
//		// resolve with mb.Snapshot(fresh) (now, or when asked)
//	}
//	mb.SetStatus(st)                 // the latest one wins
//	mb.Close()                       // the viewer sees C closed
//
// A viewer:
//
//	for range mb.C() {
//		u := mb.Take() // u.Snapshot (start over), then u.Events in order; u.Dropped so far
//	}
//
// # Concurrency
//
// Every Mailbox method is safe for concurrent use, and none waits for the other side: a
// producer's Offer takes a mutex for an append and a non-blocking send on a channel of
// capacity one, so an engine with a viewer that never reads runs as fast as one with
// none; what the slow viewer misses is dropped, counted and replaced by a snapshot. Close
// may race with offers: the send and the close happen under the same mutex, so nothing is
// ever sent on a closed channel.
//
// # Imports
//
// feed imports engine for its value types (Snapshot, Event; engine/pages and engine/prefix
// for the sizes of theirs in a History's estimate), and nothing that does I/O;
// the engine's packages never import feed.
package feed
