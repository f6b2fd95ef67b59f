package record

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/wire/protocol"
)

// FlushEvery is how long a recorded frame may wait in the recorder's buffer: a recorder
// killed without warning (kill -9, a crash) loses at most that much, and perhaps leaves a
// last line cut short, which Load skips.
const FlushEvery = 100 * time.Millisecond

// Recorder writes updates as frames, one a line. What it writes reaches the file within
// FlushEvery, and at once on Flush and Close.
type Recorder struct {
	mu      sync.Mutex
	f       io.WriteCloser
	w       *bufio.Writer
	buf     bytes.Buffer
	seq     uint64
	err     error
	last    uint64 // dropped count already written
	epoch   uint64 // of the last snapshot written
	started bool   // a snapshot has been written
	timer   *time.Timer
	closed  bool
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
		if !r.started || u.Epoch != r.epoch {
			// A hello starts each epoch: the viewer's source started over on a new
			// connection, whose steps may start again (a restarted server).
			r.frame(&protocol.Frame{Type: protocol.FrameHello, Hello: &protocol.Hello{Protocol: protocol.Version, Server: "kvtop record", Config: u.Snapshot.Config}})
			r.started, r.epoch = true, u.Epoch
		}
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
	if r.timer == nil && !r.closed && r.w.Buffered() > 0 {
		r.timer = time.AfterFunc(FlushEvery, r.flushBuffered)
	}
	return r.err
}

// flushBuffered is the timer's flush of what Write left in the buffer.
func (r *Recorder) flushBuffered() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = nil
	r.flush()
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
	return r.flush()
}

// flush writes what is buffered. r.mu is held.
func (r *Recorder) flush() error {
	if r.err == nil {
		if err := r.w.Flush(); err != nil {
			r.err = fmt.Errorf("record: %w", err)
		}
	}
	return r.err
}

// Close flushes and closes the file.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.err
	}
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	err := r.flush()
	if cerr := r.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("record: %w", cerr)
	}
	return err
}

// MaxLineBytes bounds one line of a recording: a snapshot of the largest engine kvtop runs
// is a fraction of it, and a file that is not a recording is refused before this much of it
// is read (a line must start with "{").
const MaxLineBytes = 256 << 20

// lineLimit is MaxLineBytes; tests lower it.
var lineLimit = MaxLineBytes

// Load reads a recording. Every frame must parse, each epoch's first frame that carries
// state must be a snapshot, and events must apply to the state before them: a recording
// that does not replay is refused with the line at fault. The one exception is a last line
// cut short, which a recorder that was killed leaves behind: everything before it is kept,
// and Truncated says so.
//
// A hello frame starts a new epoch (the recorder's source reconnected), and so does a
// snapshot whose step is lower than the last one recorded (a server restarted, recorded
// before hellos marked it): steps are ordered within an epoch, not across them.
func Load(r io.Reader) (*Recording, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	rec := &Recording{}
	var view *engine.View
	line := 0
	newEpoch := func() {
		if n := len(rec.epochs); n == 0 || rec.epochs[n-1].h.Len() > 0 {
			rec.epochs = append(rec.epochs, epochSpan{start: rec.n, h: feed.NewHistory(feed.HistoryLimits{})})
		}
		view = nil
	}
	newEpoch()
	for {
		b, complete, err := readLine(br)
		if err != nil {
			return nil, fmt.Errorf("record: line %d: %w", line+1, err)
		}
		if b == nil {
			break
		}
		line++
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		f, err := protocol.DecodeFrame(b)
		if err != nil && !complete {
			rec.Truncated = fmt.Sprintf("line %d is cut short after %d bytes (the recorder stopped mid-frame); the %d lines before it are kept", line, len(b), line-1)
			break
		}
		if err != nil {
			return nil, fmt.Errorf("record: line %d: %w", line, err)
		}
		switch f.Type {
		case protocol.FrameHello:
			newEpoch()
		case protocol.FrameSnapshot:
			if _, last, ok := rec.epochs[len(rec.epochs)-1].h.Steps(); ok && f.Snapshot.Stamp.Step < last {
				newEpoch()
			}
			v, err := engine.NewView(*f.Snapshot)
			if err != nil {
				return nil, fmt.Errorf("record: line %d: %w", line, err)
			}
			view = v
			rec.epochs[len(rec.epochs)-1].h.AddSnapshot(f.Snapshot)
			rec.n++
		case protocol.FrameEvents:
			if view == nil {
				return nil, fmt.Errorf("record: line %d: events before any snapshot", line)
			}
			for _, ev := range f.Events {
				if err := view.Apply(ev); err != nil {
					return nil, fmt.Errorf("record: line %d: %w", line, err)
				}
			}
			rec.epochs[len(rec.epochs)-1].h.AddEvents(f.Events)
			rec.n += len(f.Events)
		case protocol.FrameDropped:
			rec.Dropped += f.Dropped.Count
		case protocol.FrameStatus, protocol.FrameError:
		}
	}
	if rec.n == 0 {
		return nil, fmt.Errorf("record: the recording holds no snapshot")
	}
	if last := rec.epochs[len(rec.epochs)-1]; last.h.Len() == 0 {
		rec.epochs = rec.epochs[:len(rec.epochs)-1] // a hello with nothing after it
	}
	for i := range rec.epochs {
		e := &rec.epochs[i]
		e.first, e.last, _ = e.h.Steps()
	}
	return rec, nil
}

// readLine reads one line of at most MaxLineBytes, without its newline; complete says the
// newline was there. It returns nil at the end. A line that does not start with "{" (after
// blanks) is refused as soon as its first byte says so.
func readLine(br *bufio.Reader) (b []byte, complete bool, err error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line) == 0 {
			if first := bytes.TrimLeft(chunk, " \t\r"); len(first) > 0 && first[0] != '{' && first[0] != '\n' {
				return nil, false, fmt.Errorf("does not start with \"{\" (byte %#x): not a kvtop recording", first[0])
			}
		}
		if len(line)+len(chunk) > lineLimit {
			return nil, false, fmt.Errorf("over %d bytes without a newline: not a kvtop recording", lineLimit)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(line) == 0 {
				return nil, false, nil
			}
			return line, false, nil
		default:
			return nil, false, err
		}
	}
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

// Recording is a loaded recording: snapshots and events in order, in one or more epochs,
// each held as the unbounded feed.History the player walks and seeks in.
type Recording struct {
	epochs []epochSpan
	n      int // items in all
	// Dropped is how many events the recording dashboard lost (the snapshot after each loss
	// is in the recording).
	Dropped uint64
	// Truncated, when not empty, says that the last line was cut short and skipped.
	Truncated string
}

type item struct {
	snap  *engine.Snapshot // a snapshot, or
	ev    engine.Event     // an event
	step  uint64
	at    int64
	epoch int
}

// epochSpan is one epoch: its history, the index of its first item in the recording, and
// its steps, first to last.
type epochSpan struct {
	h           *feed.History
	start       int
	first, last uint64
}

// at returns the recording's item i, in whichever epoch it is.
func (rec *Recording) at(i int) item {
	k := sort.Search(len(rec.epochs), func(k int) bool { return rec.epochs[k].start > i }) - 1
	e := rec.epochs[k].h.At(i - rec.epochs[k].start)
	return item{snap: e.Snapshot, ev: e.Event, step: e.Stamp.Step, at: e.Stamp.At, epoch: k}
}

// Epoch is a stretch of a recording with steps of its own: from a connection's first
// snapshot to the next reconnection.
type Epoch struct {
	First, Last uint64 // steps
}

// Epochs returns the recording's epochs in order; a recording of one connection has one.
func (rec *Recording) Epochs() []Epoch {
	out := make([]Epoch, len(rec.epochs))
	for i, e := range rec.epochs {
		out[i] = Epoch{First: e.first, Last: e.last}
	}
	return out
}

// Steps returns the first and last step numbers the recording covers: those of its first
// item and its last, in different epochs when it has several.
func (rec *Recording) Steps() (first, last uint64) {
	return rec.epochs[0].first, rec.epochs[len(rec.epochs)-1].last
}

// Find returns the epoch in which to seek step: prefer, when it covers the step, else the
// first that does; false when none does.
func (rec *Recording) Find(step uint64, prefer int) (int, bool) {
	if prefer >= 0 && prefer < len(rec.epochs) && rec.epochs[prefer].first <= step && step <= rec.epochs[prefer].last {
		return prefer, true
	}
	for i, e := range rec.epochs {
		if e.first <= step && step <= e.last {
			return i, true
		}
	}
	return 0, false
}

// StateAt returns the state after everything recorded up to and including step, in the
// first epoch that covers it (see StateIn).
func (rec *Recording) StateAt(step uint64) (*engine.View, int, error) {
	e, _ := rec.Find(step, -1)
	return rec.StateIn(e, step)
}

// StateIn returns the state after everything recorded in epoch e up to and including step:
// the epoch's last snapshot at or before it with the events after it applied
// (feed.History.StateAt, as the dashboard's rewind), and the index of the next item. It is
// how a player seeks.
func (rec *Recording) StateIn(e int, step uint64) (*engine.View, int, error) {
	if e < 0 || e >= len(rec.epochs) {
		return nil, 0, fmt.Errorf("record: no epoch %d (the recording has %d)", e, len(rec.epochs))
	}
	span := rec.epochs[e]
	v, next, err := span.h.StateAt(step)
	return v, span.start + next, err
}
