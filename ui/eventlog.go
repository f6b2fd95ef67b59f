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

// logEntry is an engine event, or (ev nil) a note of the dashboard's own: a view that
// diverged, events lost, a snapshot started over from. bad marks the notes of trouble.
type logEntry struct {
	num  uint64
	ev   engine.Event
	text string
	bad  bool
}

// defaultLogSize bounds the event log; a long run does not grow.
const defaultLogSize = 2048

func newEventLog(size int) *eventLog {
	return &eventLog{buf: make([]logEntry, size)}
}

func (l *eventLog) push(ev engine.Event) { l.add(logEntry{ev: ev}) }

// note adds a line of the dashboard's own at a step.
func (l *eventLog) note(step uint64, text string, bad bool) {
	l.add(logEntry{text: fmt.Sprintf("%6d  %-16s %s", step, "dashboard", text), bad: bad})
}

func (l *eventLog) add(e logEntry) {
	l.total++
	e.num = l.total
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
	return fmt.Sprintf("%6d  %-16s %s", ev.When().Step, engine.KindOf(ev), ev.String())
}
