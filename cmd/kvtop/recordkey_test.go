package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/record"
)

// R opens a new file named after the time, never one that exists, and what it writes is a
// recording replay loads.
func TestRecordKeyOpensANewFile(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	open := recordIn(dir, func() time.Time { return at })
	if err := os.WriteFile(filepath.Join(dir, "kvtop-20260102-150405.jsonl"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, name, err := open()
	if err != nil {
		t.Fatal(err)
	}
	if name != "kvtop-20260102-150405-2.jsonl" {
		t.Errorf("name %q, want kvtop-20260102-150405-2.jsonl (the first is taken)", name)
	}
	e, _ := engine.New(engine.DefaultConfig())
	s := e.Snapshot()
	if err := w.Write(feed.Update{Snapshot: &s}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := record.Open(filepath.Join(dir, name)); err != nil {
		t.Errorf("the recording does not load: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "kvtop-20260102-150405.jsonl")); string(b) != "keep" {
		t.Errorf("the existing file was overwritten: %q", b)
	}
	if _, _, err := recordIn(filepath.Join(dir, "no-such-dir"), time.Now)(); err == nil {
		t.Error("R in a directory that does not exist: no error")
	}
}
