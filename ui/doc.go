// Package ui is kvtop's dashboard: a Bubble Tea program that draws one decode instance from a
// small source interface, which both an in-process engine subscription and the websocket
// client satisfy, and explains why any request is stuck.
//
// # Usage
//
// Run it on the terminal:
//
//	src := rn.Local()                      // or the websocket client, or a replay
//	err := ui.Run(ctx, src, ui.Options{
//		Name:     "embedded",
//		Control:  true,                    // pause and single step reach the engine
//		OnUpdate: rec.Write,               // --record: every update, before it is folded
//	})
//
// or build the model with New and run it in a tea.Program of your own; tests drive it with
// tea.WithInput, tea.WithOutput, tea.WithWindowSize and tea.WithColorProfile, or by calling
// Update and View directly.
//
// # What is on the screen
//
// A three-line header (instance, link, step and rate, hazards, badges; pages used and free;
// requests by state), a tab bar, the body and a footer. The panels: requests (one row a
// request, stuck ones first), pages (every page of the KV cache as a cell), prefix (the radix
// tree), segments (the kv_append_metadata answers), events (the log, routine steps folded),
// detail (one request: why it is stuck, with the admission test's numbers) and charts (the
// history of the last steps). From 160×45 the body is the overview, several panels in boxes
// at once (layout.go), tab moving the focus and z zooming; below it, one panel at a time,
// with the page map beside the requests and the detail from 150 columns. The mouse
// (Options.Mouse) focuses, selects and seeks where it clicks (mouse.go).
//
// # Data flow
//
// One re-armed command waits on Source.C and returns everything pending (Source.Take) as
// one message; the model folds it into an engine.View (a snapshot starts a new one) and
// arms the next wait only a frame later, so data is drawn at most Options.FPS times a
// second however fast the engine steps, and nothing is drawn while nothing changes. An
// event that does not fit the view stops the folding and asks the source for a snapshot.
//
// What the panels draw is derived from the View when a panel asks for it and the data has
// changed since, in Update, never in View; each panel caches its text by the data's
// version, its size and its selection, and the page map joins pre-rendered cell strings.
// The View keeps its page map and its requests' statuses current event by event; the
// requests table makes again only the rows of the requests that changed
// (engine.View.RequestVersions) and the page map's cells take in only the pages that
// changed (engine.PageMap.Changes), so a frame costs what changed, not the table's or the
// cache's size.
//
// Bubble Tea's renderer runs at Options.FPS too: its ticker wakes the program at that rate
// whatever there is to draw (Bubble Tea v2.1), the only thing besides the link's poll, once
// a second, that does while the dashboard is idle (BenchmarkIdleCPU).
//
// Folding also keeps the update in a bounded feed.History (Options.History: the last
// 10,000 steps or 64 MB), checkpointed with a snapshot of the live View when the history
// asks, and takes one sample a step for the charts (series.go) from the step summary,
// whose counts the engine derives (engine/derive.go): the dashboard derives nothing itself.
//
// Pausing (p) freezes what is drawn: the View is copied, the source is still read and
// folded into the live View (nothing backs up), and the header counts what arrived. With
// Options.Control the engine is paused too, and n steps it once, the frozen view following.
//
// Rewinding ([ ] { } :, the charts) draws the state at a past step instead (rewind.go): the
// History rebuilds it (StateAt, the code the replay player seeks with) into a world of its
// own, which every panel draws as it draws the live one, while the live View goes on
// folding. R writes the History and every later update to a Recorder (recording.go).
//
// # Concurrency
//
// The model runs on the Bubble Tea goroutine; the wait command and controls run on
// command goroutines and only touch the Source, which must be safe for that. A recording
// writes on a goroutine of its own, from a queue the model appends to without waiting.
//
// # Imports
//
// ui imports engine and feed (for their value types, and feed.History) and never wire,
// engine/runner, record or net: Source is its own small interface, which the runner's
// Local, the wire client and the replay player satisfy without ui knowing them, and
// Recorder another, which record.Recorder satisfies (record writes the stream's frames,
// through wire/protocol, which ui must not reach).
package ui
