//go:build !linux

package stepbench_test

import "time"

// threadCPU returns 0: a thread's CPU time is read on Linux only.
func threadCPU() time.Duration { return 0 }

// processCPU returns 0: read on Linux only.
func processCPU() time.Duration { return 0 }
