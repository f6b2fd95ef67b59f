// Command kvtop is a terminal dashboard for a disaggregated-serving decode instance.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kvtop: not built yet")
	os.Exit(1)
}
