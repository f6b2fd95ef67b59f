package ui

import (
	"fmt"
	"sync"

	tea "charm.land/bubbletea/v2"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// Recorder is where R records: the history the dashboard holds, then every update as it is
// folded. record.Recorder satisfies it; ui does not import record (which reads and writes
// the stream's frames, and ui knows no wire format), so the command hands the dashboard a
// function that opens one (Options.Record).
type Recorder interface {
	Write(feed.Update) error
	Close() error
}

// recording writes to a Recorder on a goroutine of its own, in order: the history first,
// then each update pushed. The dashboard never waits for the file: push appends to a queue.
type recording struct {
	name string
	w    Recorder

	mu     sync.Mutex
	queue  []feed.Update
	closed bool
	wake   chan struct{}
	done   chan error
}

// recordChunk is how many events of the history go in one update written.
const recordChunk = 4096

// startRecording starts writing the history h holds, of the source's connection epoch, to
// w, and what is pushed after.
func startRecording(w Recorder, name string, h *feed.History, epoch uint64) *recording {
	r := &recording{name: name, w: w, wake: make(chan struct{}, 1), done: make(chan error, 1)}
	var evs []engine.Event
	flush := func() {
		if len(evs) > 0 {
			r.queue = append(r.queue, feed.Update{Events: evs, Epoch: epoch})
			evs = nil
		}
	}
	for i := range h.Len() {
		e := h.At(i)
		if e.Snapshot != nil {
			flush()
			r.queue = append(r.queue, feed.Update{Snapshot: e.Snapshot, Epoch: epoch})
			continue
		}
		evs = append(evs, e.Event)
		if len(evs) == recordChunk {
			flush()
		}
	}
	flush()
	go r.run()
	r.signal()
	return r
}

func (r *recording) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// push queues an update to be written after everything before it.
func (r *recording) push(u feed.Update) {
	r.mu.Lock()
	r.queue = append(r.queue, u)
	r.mu.Unlock()
	r.signal()
}

// stop writes what is queued and closes the recorder; done then says how it went.
func (r *recording) stop() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.signal()
}

func (r *recording) run() {
	var err error
	for range r.wake {
		r.mu.Lock()
		q, closed := r.queue, r.closed
		r.queue = nil
		r.mu.Unlock()
		for _, u := range q {
			if err == nil {
				err = r.w.Write(u)
			}
		}
		if closed {
			if cerr := r.w.Close(); err == nil {
				err = cerr
			}
			r.done <- err
			return
		}
	}
}

// recordDoneMsg says a recording is closed, and how it went.
type recordDoneMsg struct {
	name string
	err  error
}

// toggleRecording starts a recording (R), or stops the one under way.
func (m *Model) toggleRecording() tea.Cmd {
	if m.rec != nil {
		r := m.rec
		m.rec = nil
		r.stop()
		m.setMessage("closing the recording "+r.name+"…", false)
		return func() tea.Msg { return recordDoneMsg{r.name, <-r.done} }
	}
	if m.opts.Record == nil {
		m.setMessage("this dashboard cannot record (R): start it with --record FILE", false)
		return nil
	}
	w, name, err := m.opts.Record()
	if err != nil {
		m.setMessage("cannot record: "+err.Error(), true)
		return nil
	}
	m.rec = startRecording(w, name, m.hist, m.epoch)
	m.setMessage(fmt.Sprintf("recording to %s: %s held, then what comes (R stops)", name, m.historyText()), false)
	return nil
}

// finishRecording closes a recording under way and waits for it: when the dashboard ends.
func (m *Model) finishRecording() error {
	if m.rec == nil {
		return nil
	}
	r := m.rec
	m.rec = nil
	r.stop()
	if err := <-r.done; err != nil {
		return fmt.Errorf("recording %s: %w", r.name, err)
	}
	return nil
}

// recordBadge is the header's word on a recording under way.
func (m *Model) recordBadge() string {
	return "● REC " + m.rec.name
}

// recorded says how a closed recording went.
func (m *Model) recorded(msg recordDoneMsg) {
	if msg.err != nil {
		m.setMessage(fmt.Sprintf("the recording %s failed: %v", msg.name, msg.err), true)
		return
	}
	first, last, _ := m.hist.Steps()
	m.setMessage(fmt.Sprintf("recorded %s (play it with kvtop replay %s); the history holds steps %s–%s", msg.name, msg.name,
		humanize.Comma(int64(first)), humanize.Comma(int64(last))), false)
}
