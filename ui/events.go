package ui

import (
	"fmt"
	"strconv"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine"
)

// eventsPanel is the event log, newest last: it follows the newest event until the
// cursor moves up, and it filters like the request table. The routine events of every step
// (decoded, step_completed) are folded into one line a run of them ("steps 238–246: decode
// ×9, 10 requests") unless a shows them all; i groups the log by request, the engine's own
// events last. Hazards and the dashboard's own notes of trouble (a view that diverged,
// events lost) are marked with ! and stand out.
type eventsPanel struct {
	w        *world
	st       *Styles
	styleGen int
	keys     KeyMap

	width, height int
	filter        filterSpec
	follow        bool
	all           bool // routine events unfolded
	byRequest     bool
	cur           cursor

	idx    []int   // the log entries the filter keeps, by index in the log
	rows   []evRow // the lines, over idx
	idxKey struct {
		log       *eventLog
		total     uint64
		filter    string
		all, byID bool
	}

	out string
	key renderKey
}

// evRow is one line of the log: an entry, a run of routine entries folded, or the heading
// of a request's group. from and to index idx.
type evRow struct {
	kind     rowKind
	from, to int
	id       string
}

type rowKind uint8

const (
	rowEntry rowKind = iota
	rowFold
	rowHeading
)

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

// Update moves the cursor (reaching the last line follows the log again), and folds,
// unfolds and groups the log.
func (p eventsPanel) Update(msg tea.Msg) (eventsPanel, tea.Cmd) {
	if k, ok := msg.(tea.KeyPressMsg); ok {
		switch {
		case key.Matches(k, p.keys.AllEvents):
			p.all = !p.all
			p.follow = true
			return p, nil
		case key.Matches(k, p.keys.ByRequest):
			p.byRequest = !p.byRequest
			p.follow = !p.byRequest
			p.cur = cursor{}
			return p, nil
		}
	}
	if p.cur.move(msg, p.keys, len(p.rows), p.visible()) {
		p.follow = p.cur.pos >= len(p.rows)-1 && !p.byRequest
	}
	return p, nil
}

func (p eventsPanel) setFilter(f filterSpec) eventsPanel {
	p.filter = f
	p.follow = !p.byRequest
	return p
}

// selected returns the request of the line under the cursor, if it concerns one.
func (p eventsPanel) selected() string {
	if p.w == nil || p.cur.pos >= len(p.rows) {
		return ""
	}
	r := p.rows[p.cur.pos]
	switch r.kind {
	case rowHeading:
		return r.id
	case rowEntry:
		if e := p.w.events.at(p.idx[r.from]); e.ev != nil {
			id, _ := engine.RequestOf(e.ev)
			return id
		}
	}
	return ""
}

// routine says whether an event is one of those every step brings, which the log folds.
func routine(e *logEntry) bool {
	switch e.ev.(type) {
	case engine.Decoded, engine.StepCompleted:
		return true
	}
	return false
}

// Refresh re-filters and re-folds when the log, the filter or the mode changed, and
// renders when anything drawn changed.
func (p eventsPanel) Refresh() eventsPanel {
	if p.w == nil {
		return p
	}
	log := p.w.events
	ik := p.idxKey
	ik.log, ik.total, ik.filter, ik.all, ik.byID = log, log.total, p.filter.text, p.all, p.byRequest
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
		p.buildRows()
	}
	if p.follow {
		p.cur.pos = len(p.rows) - 1
	}
	p.cur.clamp(len(p.rows), p.visible())
	k := renderKey{ver: log.total, width: p.width, height: p.height, pos: p.cur.pos, top: p.cur.top, styleGen: p.styleGen,
		extra: fmt.Sprintf("%p %v %v %v", log, p.follow, p.all, p.byRequest)}
	if k != p.key || p.out == "" {
		p.key = k
		p.out = p.render()
	}
	return p
}

// buildRows lays the kept entries out as lines: in order, or grouped by request (which
// orders idx by group).
func (p *eventsPanel) buildRows() {
	rows := p.rows[:0]
	if !p.byRequest {
		p.rows = p.fold(rows, p.idx)
		return
	}
	// Grouped: a request's entries under its heading, the requests in the order they first
	// appear; then the engine's own entries.
	log := p.w.events
	groups := map[string][]int{}
	var order []string
	var engineOwn []int
	for _, i := range p.idx {
		e := log.at(i)
		id, ok := "", false
		if e.ev != nil {
			id, ok = engine.RequestOf(e.ev)
		}
		if !ok {
			engineOwn = append(engineOwn, i)
			continue
		}
		if _, seen := groups[id]; !seen {
			order = append(order, id)
		}
		groups[id] = append(groups[id], i)
	}
	// The rows index p.idx: lay it out again in the grouped order.
	p.idx = p.idx[:0]
	for _, id := range order {
		rows = append(rows, evRow{kind: rowHeading, from: len(p.idx), to: len(p.idx) + len(groups[id]), id: id})
		from := len(p.idx)
		p.idx = append(p.idx, groups[id]...)
		for k := from; k < len(p.idx); k++ {
			rows = append(rows, evRow{kind: rowEntry, from: k, to: k + 1})
		}
	}
	if len(engineOwn) > 0 {
		rows = append(rows, evRow{kind: rowHeading, from: len(p.idx), to: len(p.idx) + len(engineOwn)})
		from := len(p.idx)
		p.idx = append(p.idx, engineOwn...)
		rows = p.fold(rows, p.idx[from:])
		for k := len(rows) - 1; k >= 0 && rows[k].kind != rowHeading; k-- {
			rows[k].from += from
			rows[k].to += from
		}
	}
	p.rows = rows
}

// fold appends the lines of entries idx (a slice of p.idx, which the rows index from its
// start): one a line, except runs of routine entries, one a run, unless all are shown.
func (p eventsPanel) fold(rows []evRow, idx []int) []evRow {
	log := p.w.events
	for k := 0; k < len(idx); {
		if p.all || !routine(log.at(idx[k])) {
			rows = append(rows, evRow{kind: rowEntry, from: k, to: k + 1})
			k++
			continue
		}
		j := k + 1
		for j < len(idx) && routine(log.at(idx[j])) {
			j++
		}
		rows = append(rows, evRow{kind: rowFold, from: k, to: j})
		k = j
	}
	return rows
}

// foldText says what a run of routine entries did: "steps 238–246: decode ×9, 10 requests".
func (p eventsPanel) foldText(r evRow) string {
	log := p.w.events
	var actions [4]int
	decoded := 0
	ids := map[string]bool{}
	first, last := log.at(p.idx[r.from]).ev.When().Step, log.at(p.idx[r.to-1]).ev.When().Step
	for _, i := range p.idx[r.from:r.to] {
		switch e := log.at(i).ev.(type) {
		case engine.StepCompleted:
			if int(e.Action) < len(actions) {
				actions[e.Action]++
			}
		case engine.Decoded:
			decoded++
			for _, id := range e.IDs {
				ids[id] = true
			}
		}
	}
	// A decode step whose summary the run does not hold (events came between) still counts.
	actions[engine.ActionDecode] = max(actions[engine.ActionDecode], decoded)
	var b strings.Builder
	if first == last {
		fmt.Fprintf(&b, "step %d", first)
	} else {
		fmt.Fprintf(&b, "steps %d–%d", first, last)
	}
	b.WriteString(":")
	sep := " "
	for _, a := range []engine.Action{engine.ActionDecode, engine.ActionPrefill, engine.ActionPrepareReceive, engine.ActionIdle} {
		if n := actions[a]; n > 0 {
			fmt.Fprintf(&b, "%s%s ×%d", sep, a, n)
			sep = ", "
		}
	}
	if len(ids) > 0 {
		fmt.Fprintf(&b, "%s%s", sep, plural(len(ids), "request"))
	}
	return fmt.Sprintf("%6d  %-16s %s", first, "routine ×"+strconv.Itoa(r.to-r.from), b.String())
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
	if p.all {
		title += " · all shown (a folds)"
	} else {
		title += " · routine folded (a shows)"
	}
	if p.byRequest {
		title += " · by request (i)"
	}
	if !p.follow && !p.byRequest {
		title += " · scrolled (G follows)"
	}
	b.WriteString(fit(title, p.width-6))
	if len(p.rows) == 0 {
		b.WriteString("\n" + st.Dim.Render("no events"))
		return b.String()
	}
	end := min(p.cur.top+p.visible(), len(p.rows))
	for i := p.cur.top; i < end; i++ {
		r := p.rows[i]
		var text string
		style := &st.cut.dim
		switch r.kind {
		case rowHeading:
			name := r.id
			if name == "" {
				name = "the engine's own events"
			}
			text = fmt.Sprintf("── %s · %s", name, plural(r.to-r.from, "event"))
			style = &st.cut.value
		case rowFold:
			text = "  " + p.foldText(r)
		default:
			e := log.at(p.idx[r.from])
			mark := "  "
			style = nil
			switch {
			case e.bad:
				mark, style = "! ", &st.cut.err
			case e.ev == nil:
				style = &st.cut.warn
			default:
				switch e.ev.(type) {
				case engine.HazardDetected, engine.Divergence:
					mark, style = "! ", &st.cut.hazard
				case engine.PrepareBlocked:
					style = &st.cut.warn
				case engine.RequestAborted:
					style = &st.cut.bad
				}
			}
			text = mark + log.line(p.idx[r.from])
		}
		text = pad(text, p.width)
		b.WriteByte('\n')
		switch {
		case i == p.cur.pos && (!p.follow || p.byRequest):
			paint(&b, st.cut.cursor, text)
		case style != nil:
			paint(&b, *style, text)
		default:
			b.WriteString(text)
		}
	}
	return b.String()
}
