package ui

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/record"
)

// buffer is a file for a recorder.
type buffer struct {
	syncBuffer
	closed atomic.Bool
}

func (b *buffer) Close() error {
	b.closed.Store(true)
	return nil
}

// R records the history the dashboard holds and what comes after, until R again: the file
// is a recording that replays to the engine's own states, from the first step the history
// held to the last one folded.
func TestRecordKeyWritesTheHistoryAndWhatFollows(t *testing.T) {
	s := longRun(t)
	var file buffer
	opened := 0
	opts := Options{Record: func() (Recorder, string, error) {
		opened++
		return record.NewRecorder(&file), "test.jsonl", nil
	}}
	m, _ := feedModel(t, nil, opts, 120, 40)
	snap := s.snap
	half := s.states[150].end
	m.Update(updateMsg{feed.Update{Snapshot: &snap, Events: s.events[:half]}})
	press(m, "R")
	if m.rec == nil || opened != 1 || !strings.Contains(screen(m), "● REC test.jsonl") {
		t.Fatalf("R: recording %v, opened %d; want one under way, shown in the header", m.rec != nil, opened)
	}
	for from := half; from < len(s.events); from += 200 {
		m.Update(updateMsg{feed.Update{Events: s.events[from:min(from+200, len(s.events))]}})
	}
	_, cmd := m.Update(keyMsg("R"))
	if m.rec != nil || cmd == nil {
		t.Fatal("R again did not stop the recording")
	}
	m.Update(cmd())
	if !strings.Contains(m.message, "recorded test.jsonl") {
		t.Errorf("after the recording closed: message %q", m.message)
	}
	data := []byte(file.String())
	if !file.closed.Load() {
		t.Error("the recording's file was not closed")
	}
	rec, err := record.Load(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the recording does not load: %v", err)
	}
	first, last := rec.Steps()
	if first != 0 || last != 300 {
		t.Errorf("the recording covers steps %d–%d, want 0–300 (the history held from 0)", first, last)
	}
	for _, step := range []uint64{0, 100, 149, 150, 151, 250, 300} {
		v, _, err := rec.StateAt(step)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(v.Snapshot(), s.states[step].snap) {
			t.Errorf("the recording at step %d is not the engine's state there", step)
		}
	}
}

// A recording under way when the dashboard ends is closed with everything written; a
// dashboard that cannot record says so, and one whose recorder fails says why.
func TestRecordingEnds(t *testing.T) {
	var file buffer
	m, _ := feedModel(t, watermark(t), Options{Record: func() (Recorder, string, error) {
		return record.NewRecorder(&file), "end.jsonl", nil
	}}, 100, 30)
	press(m, "R")
	if err := m.finishRecording(); err != nil {
		t.Fatal(err)
	}
	if data := file.String(); !file.closed.Load() || !strings.Contains(data, `"snapshot"`) {
		t.Errorf("at the end: closed %v, %d bytes; want the history written and the file closed", file.closed.Load(), len(data))
	}
	n, _ := feedModel(t, watermark(t), Options{}, 100, 30)
	press(n, "R")
	if n.rec != nil || !strings.Contains(n.message, "cannot record") {
		t.Errorf("R with no recorder: message %q", n.message)
	}
	f, _ := feedModel(t, watermark(t), Options{Record: func() (Recorder, string, error) {
		return nil, "", errors.New("disk full")
	}}, 100, 30)
	press(f, "R")
	if f.rec != nil || !f.messageErr || !strings.Contains(f.message, "disk full") {
		t.Errorf("R with a failing recorder: message %q", f.message)
	}
}
