// Command kvtop is a terminal dashboard for the decode instance of disaggregated LLM serving:
// what its prepare-receive action admits, where the prefill instance's KV lands, and why a
// request is stuck.
//
//	kvtop                          the demo: an embedded engine under a built-in workload
//	kvtop --attach host:port       the dashboard on a running `kvtop serve`
//	kvtop serve [flags]            the engine as a decode instance over HTTP
//	kvtop replay FILE              play a recording back in the dashboard
//	kvtop tap [flags]              shadows of a real MLC deployment's decode instances
//	kvtop kv-events tcp://H:P      print a vLLM-format KV-event publisher's events
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// untilSignal runs a command until it returns or the process is asked to stop
// (stopSignals), and returns its exit status.
func untilSignal(cmd func(ctx context.Context, args []string, stdout, stderr io.Writer) int, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	return cmd(ctx, args, stdout, stderr)
}

// run dispatches to a command and returns the process's exit status: 0, 1 for a failure,
// 2 for bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			return untilSignal(serveCommand, args[1:], stdout, stderr)
		case "replay":
			return runReplay(args[1:], stdout, stderr)
		case "tap":
			return untilSignal(tapCommand, args[1:], stdout, stderr)
		case "kv-events":
			return untilSignal(kvEventsCommand, args[1:], stdout, stderr)
		case "help":
			fmt.Fprint(stdout, usage)
			return 0
		case "-h", "-help", "--help":
			// The commands, then the flags of the default one (the demo and --attach).
			fmt.Fprint(stdout, usage, "\n")
			return runDashboard([]string{"-h"}, stdout, stdout)
		case "version", "-version", "--version":
			fmt.Fprintf(stdout, "kvtop %s\n", version)
			return 0
		}
	}
	return runDashboard(args, stdout, stderr)
}

const usage = `kvtop: a terminal dashboard for a disaggregated-serving decode instance

Usage:
  kvtop [flags]                  the demo: an embedded engine under a built-in workload
  kvtop --attach HOST:PORT       the dashboard on a running 'kvtop serve' (or a ws:// URL)
  kvtop serve [flags]            run the engine headless as a decode instance over HTTP
  kvtop tap [flags]              watch a real MLC deployment: a proxy and a shadow engine per D
  kvtop replay FILE              play a recording (--record) back in the dashboard
  kvtop kv-events tcp://HOST:PORT  print a vLLM-format KV-event publisher's events as JSON lines
  kvtop help                     this text
  kvtop --version                the version

'kvtop --help' adds the demo's scenarios and flags; 'kvtop serve --help' and
'kvtop replay --help' give theirs.
`
