package ui

import (
	"fmt"

	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/feed"
)

// Rewinding: the dashboard keeps what it receives in a bounded feed.History (the last
// 10,000 steps or 64 MB by default), and [ ] { } : and the charts show the state at any step
// it holds while the engine runs on. The state is rebuilt by the History, the same code a
// recording played back seeks with, and drawn as a world of its own: every panel shows
// that step, the charts mark it, and the header says how far behind live it is. What
// arrives meanwhile is folded into the live world as usual; L (or stepping past the last
// step) goes back to it. Embedded, attached or replaying, it is the same: the history is
// of what this dashboard received.

// rewound is the world of a past step.
type rewound struct {
	step uint64
	w    *world
}

// rewindStep is how far { and } go.
const rewindStep = 100

// drawnStep returns the step the drawn world is at, and whether there is one.
func (m *Model) drawnStep() (uint64, bool) {
	if m.rw != nil {
		return m.rw.step, true
	}
	if w := m.drawn(); w.view != nil {
		return w.view.Stamp().Step, true
	}
	return 0, false
}

// liveStep returns the live world's step.
func (m *Model) liveStep() uint64 {
	if m.live.view == nil {
		return 0
	}
	return m.live.view.Stamp().Step
}

// rewindBy moves the step drawn by d steps, back when negative.
func (m *Model) rewindBy(d int64) {
	cur, ok := m.drawnStep()
	if !ok {
		m.setMessage("nothing to rewind yet: no snapshot has come", false)
		return
	}
	to := int64(cur) + d
	first, _, _ := m.hist.Steps()
	if to < int64(first) {
		if cur == first && m.rw != nil {
			m.setMessage(fmt.Sprintf("step %s is the oldest the history holds (%s)", humanize.Comma(int64(first)), m.historyText()), false)
			return
		}
		to = int64(first)
	}
	m.rewindTo(uint64(to))
}

// rewindTo shows the state at a step the history holds; at or past the live step, the
// live view again.
func (m *Model) rewindTo(step uint64) {
	first, _, ok := m.hist.Steps()
	if !ok {
		m.setMessage("nothing to rewind yet: no snapshot has come", false)
		return
	}
	if step >= m.liveStep() {
		m.goLive()
		return
	}
	step = max(step, first)
	v, next, err := m.hist.StateAt(step)
	if err != nil {
		m.setMessage(fmt.Sprintf("cannot show step %d: %v", step, err), true)
		return
	}
	w := &world{view: v, events: m.logAt(next)}
	m.touch(w)
	w.prefixVer, w.pageVer, w.viewPages = w.ver, w.ver, v.PagesVersion()
	m.rw = &rewound{step: step, w: w}
}

// goLive leaves the rewound view.
func (m *Model) goLive() {
	if m.rw != nil {
		m.setMessage("live", false)
	}
	m.rw = nil
}

// logAt is the event log as it stood when the history's entry next came: its last events
// before it, numbered as the live log numbered them.
func (m *Model) logAt(next int) *eventLog {
	size := len(m.live.events.buf)
	i, n := next-1, 0
	for ; i >= 0 && n < size; i-- {
		if m.hist.At(i).Event != nil {
			n++
		}
	}
	l := newEventLog(size)
	before := 0 // the history's events before next
	for j := range next {
		if m.hist.At(j).Event != nil {
			before++
		}
	}
	after := m.hist.Events() - before
	l.total = m.live.events.total - uint64(min(after, int(m.live.events.total))) - uint64(n)
	for j := i + 1; j < next; j++ {
		if ev := m.hist.At(j).Event; ev != nil {
			l.push(ev)
		}
	}
	return l
}

// historyText says what the rewind history holds.
func (m *Model) historyText() string {
	first, last, ok := m.hist.Steps()
	if !ok {
		return "the history is empty"
	}
	return fmt.Sprintf("steps %s–%s, %s", humanize.Comma(int64(first)), humanize.Comma(int64(last)), humanize.IBytes(uint64(m.hist.Bytes())))
}

// rewindBadge is the header's word on a rewound view: REWIND step 1,234 · live 1,500 (+266).
func (m *Model) rewindBadge() string {
	live := m.liveStep()
	return fmt.Sprintf(" REWIND step %s · live %s (+%s) ", humanize.Comma(int64(m.rw.step)), humanize.Comma(int64(live)),
		humanize.Comma(int64(live-min(m.rw.step, live))))
}

// heldFrom is the first step the history holds (0 when it holds none).
func heldFrom(h *feed.History) uint64 {
	first, _, _ := h.Steps()
	return first
}
