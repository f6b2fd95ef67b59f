// Package sim is kvtop's built-in workload: a router and a prefill-instance simulator that
// drive a decode instance through the calls a real router makes. For each request it calls
// prep_recv, writes the KV of the reserved slots at a simulated transfer rate (as a prefill
// instance's remote_send would), then calls start_generate and consumes the completion.
//
// Scenarios (see Scenarios) shape the traffic: multi-turn chat over shared system prompts,
// and the stall situations kvtop exists to explain (the watermark, the recycling stall,
// leaks, fork races, preemption), plus the replay of a Mooncake-format trace.
//
// A Driver is a deterministic state machine: it is ticked with a time and told what the
// engine answered; it never reads a clock or starts a goroutine. Lockstep runs it against an
// engine in simulated time (the same seed gives the same event stream, byte for byte); the
// demo runs it on the runner's goroutine through a runner.Hook; `kvtop serve --drive` runs it
// against the HTTP API.
//
// # Imports
//
// sim imports engine and below; nothing imports sim but cmd/kvtop.
package sim
