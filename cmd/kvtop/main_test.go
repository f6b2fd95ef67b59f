package main

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/record"
)

// The command line refuses bad flags with a clear message and status 2, before anything
// starts.
func TestBadFlagsAreClearErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "nope"}, `unknown scenario "nope"`},
		{[]string{"--max-total-seq-len", "8"}, "max_total_sequence_length 8"},
		{[]string{"--prefix-cache", "lru"}, `prefix cache mode "lru"`},
		{[]string{"--evict-order", "fifo"}, `--evict-order "fifo": want mlc or lru`},
		{[]string{"--arena", "32x8"}, `--arena "32x8"`},
		{[]string{"--arena", "80x64x128"}, "over the limit"},
		{[]string{"--steps-per-sec", "-1"}, "--steps-per-sec -1"},
		{[]string{"--speed", "0"}, "--speed 0"},
		{[]string{"--trace", "x.jsonl"}, "--trace is for --scenario trace"},
		{[]string{"--token", "t"}, "--token is for --attach"},
		{[]string{"--attach", "localhost:7070", "--watermark", "10"}, "--watermark is for the demo"},
		{[]string{"--attach", "ftp://x"}, `scheme "ftp"`},
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"replay"}, "want one recording file"},
		{[]string{"replay", "--speed", "0", "x"}, "--speed 0"},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("kvtop %s = %d, %q; want 2 and a message containing %q", strings.Join(tc.args, " "), code, errb.String(), tc.want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--version"}, "kvtop " + version},
		{[]string{"help"}, "kvtop serve"},
		{[]string{"--help"}, "kvtop replay FILE"},
		{[]string{"--help"}, "-max-num-seq"},
		{[]string{"--help"}, "-evict-order"},
		{[]string{"-h"}, "recycle-stall"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != 0 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("kvtop %s = %d, %q; want 0 and %q", strings.Join(tc.args, " "), code, out.String(), tc.want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"-h"}, &out, &errb); code != 0 {
		t.Errorf("kvtop -h = %d", code)
	}
	// The dashboard's own flags, scenarios included, are listed by its usage.
	out.Reset()
	errb.Reset()
	if code := runDashboard([]string{"-h"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "recycle-stall") || !strings.Contains(errb.String(), "-max-num-seq") {
		t.Errorf("kvtop -h (dashboard) = %d, %q", code, errb.String())
	}
}

func TestReplayRefusesABrokenRecording(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(path, []byte("{\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"replay", path}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "line 1") {
		t.Errorf("kvtop replay bad.jsonl = %d, %q; want 1 and the line at fault", code, errb.String())
	}
}

// A scenario's settings apply unless a flag overrides them.
func TestScenarioSettingsYieldToFlags(t *testing.T) {
	dc, err := parseDashboard([]string{"--scenario", "watermark"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if dc.engine.MaxTotalSequenceLength != 8192 || dc.engine.MaxRecycling != 0 || dc.rate != demoStepsPerSec {
		t.Errorf("watermark scenario: max total %d, recycling %d, rate %v; want 8192, 0, %d", dc.engine.MaxTotalSequenceLength, dc.engine.MaxRecycling, dc.rate, demoStepsPerSec)
	}
	if dc.engine.EvictOrder != prefix.EvictMLC {
		t.Errorf("default eviction order %v, want mlc (MLC's own)", dc.engine.EvictOrder)
	}
	dc, err = parseDashboard([]string{"--scenario", "watermark", "--max-total-seq-len", "16384", "--steps-per-sec", "0", "--evict-order", "lru"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if dc.engine.EvictOrder != prefix.EvictLRU {
		t.Errorf("--evict-order lru: %v", dc.engine.EvictOrder)
	}
	if dc.engine.MaxTotalSequenceLength != 16384 || dc.rate != 0 {
		t.Errorf("with flags: max total %d, rate %v; want 16384, 0", dc.engine.MaxTotalSequenceLength, dc.rate)
	}
}

// A recording survives the signal that ends the dashboard: SIGHUP (the terminal closed) is
// caught like SIGINT and SIGTERM, and what was recorded is in the file.
func TestRecordingSurvivesSIGHUP(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	rec, closeRec, err := startRecording(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s := engine.Snapshot{Stamp: engine.Stamp{Step: 7}}
	if err := rec.Write(feed.Update{Snapshot: &s}); err != nil {
		t.Fatal(err)
	}
	// Without SIGHUP among the signals caught, this would kill the test binary.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	waitForFile(t, path, `"step":7`)
	if err := closeRec(); err != nil {
		t.Fatal(err)
	}
}

// waitForFile polls a file until it holds want; it fails after 10 seconds.
func waitForFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not hold %q: %q", path, want, b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kvtop replay plays what a killed recorder left, saying the last line was cut short, and
// refuses a file that is not a recording from its first byte.
func TestReplayOfACutRecording(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cut.jsonl")
	rec, err := record.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	e.Step(time.UnixMilli(1))
	s := e.Snapshot()
	if err := rec.Write(feed.Update{Snapshot: &s}); err != nil {
		t.Fatal(err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"type":"events","seq":2,"events":[{"kind":"req`) // killed mid-line
	f.Close()
	var out, errb bytes.Buffer
	// --step 99 is past the recording's steps: refused (2) once loaded, before the dashboard.
	if code := run([]string{"replay", "--step", "99", path}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "line 3 is cut short") || !strings.Contains(errb.String(), "outside the recording's steps 1-1") {
		t.Errorf("kvtop replay --step 99 cut.jsonl = %d, %q; want 2, the cut line named and the steps", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"replay", "/dev/zero"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "not a kvtop recording") {
		t.Errorf("kvtop replay /dev/zero = %d, %q; want 1 and not a recording", code, errb.String())
	}
}
