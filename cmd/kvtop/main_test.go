package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	dc, err = parseDashboard([]string{"--scenario", "watermark", "--max-total-seq-len", "16384", "--steps-per-sec", "0"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if dc.engine.MaxTotalSequenceLength != 16384 || dc.rate != 0 {
		t.Errorf("with flags: max total %d, rate %v; want 16384, 0", dc.engine.MaxTotalSequenceLength, dc.rate)
	}
}
