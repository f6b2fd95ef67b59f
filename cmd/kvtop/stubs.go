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
