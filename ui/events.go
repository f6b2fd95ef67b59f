package ui

import (
	"fmt"
	"strings"

	tea "charm.land/bubbletea/v2"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine"
)

// eventsPanel is the event log, newest last: it follows the newest event until the
// cursor moves up, and it filters like the request table. Hazards stand out.
type eventsPanel struct {
	w        *world
	st       *Styles
	styleGen int
	keys     KeyMap

	width, height int
	filter        filterSpec
	follow        bool
	cur           cursor

	idx    []int // entries shown, by index in the log
	idxKey struct {
		log    *eventLog
		total  uint64
		filter string
	}

	out string
	key renderKey
}

func (p eventsPanel) with(w *world, st *Styles, gen int) eventsPanel {
	p.w, p.st, p.styleGen = w, st, gen
	if p.keys.Up.Keys() == nil {
		p.keys = DefaultKeyMap()
		p.follow = true
	}
	return p
}

// SetSize sets the panel's size.
func (p eventsPanel) SetSize(w, h int) eventsPanel {
	p.width, p.height = w, h
	return p
}

// View returns the rendered log.
func (p eventsPanel) View() string { return p.out }

func (p eventsPanel) visible() int { return max(p.height-1, 1) }

// Update moves the cursor; reaching the last line follows the log again.
func (p eventsPanel) Update(msg tea.Msg) (eventsPanel, tea.Cmd) {
	if p.cur.move(msg, p.keys, len(p.idx), p.visible()) {
		p.follow = p.cur.pos >= len(p.idx)-1
	}
	return p, nil
}

func (p eventsPanel) setFilter(f filterSpec) eventsPanel {
	p.filter = f
	p.follow = true
	return p
}

func (p eventsPanel) selected() string {
	if p.w == nil || p.cur.pos >= len(p.idx) {
		return ""
	}
	id, _ := engine.RequestOf(p.w.events.at(p.idx[p.cur.pos]).ev)
	return id
}

// Refresh re-filters when the log or the filter changed and renders when anything drawn
// changed.
func (p eventsPanel) Refresh() eventsPanel {
	if p.w == nil {
		return p
	}
	log := p.w.events
	ik := p.idxKey
	ik.log, ik.total, ik.filter = log, log.total, p.filter.text
	if ik != p.idxKey || p.idx == nil {
		p.idxKey = ik
		p.idx = p.idx[:0]
		for i := range log.len() {
			if !p.filter.active() || p.filter.match(log.line(i)) {
				p.idx = append(p.idx, i)
			}
		}
		if p.idx == nil {
			p.idx = []int{}
		}
	}
	if p.follow {
		p.cur.pos = len(p.idx) - 1
	}
	p.cur.clamp(len(p.idx), p.visible())
	k := renderKey{ver: log.total, width: p.width, height: p.height, pos: p.cur.pos, top: p.cur.top, styleGen: p.styleGen,
		extra: fmt.Sprintf("%p", log)}
	if k != p.key || p.out == "" {
		p.key = k
		p.out = p.render()
	}
	return p
}

func (p eventsPanel) render() string {
	st := p.st
	log := p.w.events
	var b strings.Builder
	b.WriteString(st.Heading.Render("Events"))
	title := fmt.Sprintf(" %s kept of %s seen", humanize.Comma(int64(log.len())), humanize.Comma(int64(log.total)))
	if p.filter.active() {
		title += fmt.Sprintf(" · %s match /%s/", humanize.Comma(int64(len(p.idx))), p.filter.text)
	}
	if !p.follow {
		title += " · scrolled (G follows)"
	}
	b.WriteString(fit(title, p.width-6))
	if len(p.idx) == 0 {
		b.WriteString("\n" + st.Dim.Render("no events"))
		return b.String()
	}
	end := min(p.cur.top+p.visible(), len(p.idx))
	for i := p.cur.top; i < end; i++ {
		e := log.at(p.idx[i])
		text := pad(log.line(p.idx[i]), p.width)
		b.WriteByte('\n')
		switch {
		case i == p.cur.pos && !p.follow:
			b.WriteString(st.Cursor.Render(text))
		default:
			switch e.ev.(type) {
			case engine.HazardDetected:
				b.WriteString(st.Hazard.Render(text))
			case engine.PrepareBlocked:
				b.WriteString(st.Warn.Render(text))
			case engine.RequestAborted:
				b.WriteString(st.Bad.Render(text))
			default:
				b.WriteString(text)
			}
		}
	}
	return b.String()
}
