package main

import (
	"fmt"
	"io"
)

// The commands below are filled in by their own files as they land.

func runServe(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvtop serve: not built yet")
	return 1
}

func runReplay(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvtop replay: not built yet")
	return 1
}

func runDashboard(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvtop: the dashboard is not built yet")
	return 1
}
