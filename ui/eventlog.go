package ui

import (
	"fmt"

	"github.com/kvtop/kvtop/engine"
)

// eventLog is a bounded ring of the most recent events, oldest first. Text is formatted
// lazily, when a line is drawn or filtered, so folding an event costs a copy.
type eventLog struct {
	buf   []logEntry
	start int // index of the oldest entry in buf
	n     int
	total uint64 // events ever pushed; an entry's number is its place in this count
}

type logEntry struct {
	num  uint64
	ev   engine.Event
	text string
}

// defaultLogSize bounds the event log; a long run does not grow.
const defaultLogSize = 2048

func newEventLog(size int) *eventLog {
	return &eventLog{buf: make([]logEntry, size)}
}

func (l *eventLog) push(ev engine.Event) {
	l.total++
	e := logEntry{num: l.total, ev: ev}
	if l.n < len(l.buf) {
		l.buf[(l.start+l.n)%len(l.buf)] = e
		l.n++
		return
	}
	l.buf[l.start] = e
	l.start = (l.start + 1) % len(l.buf)
}

// len returns how many entries the log holds.
func (l *eventLog) len() int { return l.n }

// at returns entry i, oldest first.
func (l *eventLog) at(i int) *logEntry { return &l.buf[(l.start+i)%len(l.buf)] }

// line returns entry i's text, formatting it once.
func (l *eventLog) line(i int) string {
	e := l.at(i)
	if e.text == "" {
		e.text = describe(e.ev)
	}
	return e.text
}

// clone copies the log, for a frozen view.
func (l *eventLog) clone() *eventLog {
	c := &eventLog{buf: make([]logEntry, len(l.buf)), n: l.n, total: l.total}
	for i := range l.n {
		c.buf[i] = *l.at(i)
	}
	return c
}

// describe is an event's log line: its step, its kind and the engine's own text.
func describe(ev engine.Event) string {
	return fmt.Sprintf("%6d  %-16s %s", ev.When().Step, ev.Kind(), ev.String())
}

// eventRequest returns the request an event concerns, if one.
func eventRequest(ev engine.Event) (string, bool) {
	switch e := ev.(type) {
	case engine.RequestArrived:
		return e.ID, true
	case engine.PrepareBlocked:
		return e.ID, true
	case engine.PrepareAdmitted:
		return e.ID, true
	case engine.PrefixMatched:
		return e.ID, true
	case engine.SeqAdded:
		return e.ID, true
	case engine.SeqForked:
		return e.ID, true
	case engine.PagesReserved:
		return e.ID, true
	case engine.SeqRecycled:
		return e.ID, true
	case engine.MetadataEmitted:
		return e.ID, true
	case engine.KVReceived:
		return e.ID, true
	case engine.RequestStarted:
		return e.ID, true
	case engine.Prefilled:
		return e.ID, true
	case engine.RequestFinished:
		return e.ID, true
	case engine.RequestAborted:
		return e.ID, true
	case engine.RequestRetired:
		return e.ID, true
	case engine.HazardDetected:
		return e.Hazard.ID, true
	}
	return "", false
}
