package record

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire/protocol"
)

// Recorder writes updates as frames, one a line.
type Recorder struct {
	mu   sync.Mutex
	f    io.WriteCloser
	w    *bufio.Writer
	buf  bytes.Buffer
	seq  uint64
	err  error
	last uint64 // dropped count already written
}

// Create opens a recording file, truncating it.
func Create(path string) (*Recorder, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	return NewRecorder(f), nil
}

// NewRecorder records to w; Close closes it.
func NewRecorder(w io.WriteCloser) *Recorder {
	return &Recorder{f: w, w: bufio.NewWriterSize(w, 1<<16)}
}

// Write records one update: its drop notice, snapshot, events and status, as frames.
func (r *Recorder) Write(u feed.Update) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if u.Dropped > r.last {
		r.frame(&protocol.Frame{Type: protocol.FrameDropped, Dropped: &protocol.Dropped{Count: u.Dropped - r.last, Total: u.Dropped}})
		r.last = u.Dropped
	}
	if u.Snapshot != nil {
		r.seq++
		r.frame(&protocol.Frame{Type: protocol.FrameSnapshot, Seq: r.seq, Snapshot: u.Snapshot})
	}
	if len(u.Events) > 0 {
		r.seq++
		r.frame(&protocol.Frame{Type: protocol.FrameEvents, Seq: r.seq, Events: u.Events})
	}
	if u.Status != nil {
		r.frame(&protocol.Frame{Type: protocol.FrameStatus, Status: u.Status})
	}
	return r.err
}

func (r *Recorder) frame(f *protocol.Frame) {
	if r.err != nil {
		return
	}
	r.buf.Reset()
	if err := protocol.EncodeFrame(&r.buf, f); err != nil {
		r.err = fmt.Errorf("record: %w", err)
		return
	}
	r.buf.WriteByte('\n')
	if _, err := r.w.Write(r.buf.Bytes()); err != nil {
		r.err = fmt.Errorf("record: %w", err)
	}
}

// Flush writes what is buffered.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		if err := r.w.Flush(); err != nil {
			r.err = fmt.Errorf("record: %w", err)
		}
	}
	return r.err
}

// Close flushes and closes the file.
func (r *Recorder) Close() error {
	err := r.Flush()
	if cerr := r.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("record: %w", cerr)
	}
	return err
}

// Load reads a recording. Every frame must parse, the first frame that carries state must be
// a snapshot, and events must apply to the state before them: a recording that does not
// replay is refused with the line at fault.
func Load(r io.Reader) (*Recording, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<30)
	rec := &Recording{h: feed.NewHistory(feed.HistoryLimits{})}
	var view *engine.View
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		f, err := protocol.DecodeFrame(b)
		if err != nil {
			return nil, fmt.Errorf("record: line %d: %w", line, err)
		}
		switch f.Type {
		case protocol.FrameSnapshot:
			v, err := engine.NewView(*f.Snapshot)
			if err != nil {
				return nil, fmt.Errorf("record: line %d: %w", line, err)
			}
			view = v
			rec.h.AddSnapshot(f.Snapshot)
		case protocol.FrameEvents:
			if view == nil {
				return nil, fmt.Errorf("record: line %d: events before any snapshot", line)
			}
			for _, ev := range f.Events {
				if err := view.Apply(ev); err != nil {
					return nil, fmt.Errorf("record: line %d: %w", line, err)
				}
			}
			rec.h.AddEvents(f.Events)
		case protocol.FrameDropped:
			rec.Dropped += f.Dropped.Count
		case protocol.FrameStatus, protocol.FrameHello, protocol.FrameError:
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("record: line %d: %w", line+1, err)
	}
	if rec.h.Len() == 0 {
		return nil, fmt.Errorf("record: the recording holds no snapshot")
	}
	return rec, nil
}

// Open loads a recording file.
func Open(path string) (*Recording, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	defer f.Close()
	rec, err := Load(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rec, nil
}

// Recording is a loaded recording: snapshots and events in order, held as the unbounded
// feed.History the player walks and seeks in.
type Recording struct {
	h *feed.History
	// Dropped is how many events the recording dashboard lost (the snapshot after each loss
	// is in the recording).
	Dropped uint64
}

// Steps returns the first and last step numbers the recording covers.
func (rec *Recording) Steps() (first, last uint64) {
	first, last, _ = rec.h.Steps()
	return first, last
}

// StateAt returns the state after everything recorded up to and including step: the last
// snapshot at or before it with the events after it applied (feed.History.StateAt), and
// the index of the entry after it. It is how a player seeks.
func (rec *Recording) StateAt(step uint64) (*engine.View, int, error) {
	return rec.h.StateAt(step)
}
