package ui

import (
	"charm.land/bubbles/v2/key"
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	tea "charm.land/bubbletea/v2"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine"
)

// sortKey orders the requests table.
type sortKey int

const (
	sortStuck sortKey = iota // stuck first, then by state: the default
	sortArrival
	sortAge
	sortPages
	sortKV
	sortID
	numSortKeys
)

var sortNames = [numSortKeys]string{"stuck first", "arrival", "age", "pages", "KV %", "id"}

// reqRow is one request as the table sorts and draws it. Text is made only for the rows
// drawn (and for all rows while a filter is on).
type reqRow struct {
	r      *engine.RequestView
	order  int
	label  string
	rank   int // state order for sorting: stuck first
	pages  int // -1: holds none
	kv     int // per mille received; -1: nothing reserved
	ageMs  int64
	steps  uint64
	stuck  bool
	hazard bool
}

// requestsPanel is the request table: one row a request, sortable and filterable, stuck
// and hazardous rows marked.
type requestsPanel struct {
	w        *world
	st       *Styles
	styleGen int
	keys     KeyMap

	width, height int
	sort          sortKey
	reverse       bool
	filter        filterSpec

	rows    []reqRow
	spare   []reqRow // the other buffer rows are sorted into, kept for the next build
	refs    []sortRef
	all     int
	rowsKey struct {
		ver     uint64
		sort    sortKey
		reverse bool
		filter  string
	}
	cur cursor
	sel string // the selected request's id, kept across re-sorts
	// chosen says the user picked the selection. Until then (and again after Home) the
	// cursor stays on the top row, so the most stuck request is the one in view.
	chosen bool

	out string
	key renderKey
}

// renderKey is what a panel's rendered text depends on.
type renderKey struct {
	ver           uint64
	width, height int
	pos, top      int
	styleGen      int
	extra         string
}

func (p requestsPanel) with(w *world, st *Styles, gen int) requestsPanel {
	p.w, p.st, p.styleGen = w, st, gen
	if p.keys.Up.Keys() == nil {
		p.keys = DefaultKeyMap()
	}
	return p
}

// SetSize sets the panel's size.
func (p requestsPanel) SetSize(w, h int) requestsPanel {
	p.width, p.height = w, h
	return p
}

// View returns the rendered table.
func (p requestsPanel) View() string { return p.out }

func (p requestsPanel) visibleRows() int { return max(p.height-2, 1) }

// Update moves the cursor.
func (p requestsPanel) Update(msg tea.Msg) (requestsPanel, tea.Cmd) {
	if p.cur.move(msg, p.keys, len(p.rows), p.visibleRows()) && p.cur.pos < len(p.rows) {
		p.sel = p.rows[p.cur.pos].r.ID
		km, _ := msg.(tea.KeyPressMsg)
		p.chosen = !key.Matches(km, p.keys.Home)
	}
	return p, nil
}

func (p requestsPanel) selected() string { return p.sel }

func (p requestsPanel) selectID(id string) requestsPanel {
	p.sel = id
	p.chosen = true
	for i := range p.rows {
		if p.rows[i].r.ID == id {
			p.cur.pos = i
		}
	}
	return p
}

func (p requestsPanel) cycleSort() requestsPanel {
	p.sort = (p.sort + 1) % numSortKeys
	return p
}

func (p requestsPanel) sortName() string {
	dir := "↑"
	if p.reverse {
		dir = "↓"
	}
	return sortNames[p.sort] + " " + dir
}

func (p requestsPanel) setFilter(f filterSpec) requestsPanel {
	p.filter = f
	return p
}

// Refresh rebuilds the rows when the data, the sort or the filter changed, and renders
// when anything drawn changed.
func (p requestsPanel) Refresh() requestsPanel {
	if p.w == nil {
		return p
	}
	rk := p.rowsKey
	rk.ver, rk.sort, rk.reverse, rk.filter = p.w.ver, p.sort, p.reverse, p.filter.text
	if rk != p.rowsKey || p.rows == nil {
		p.rowsKey = rk
		p.buildRows()
	}
	// A chosen selection follows its request through re-sorts (a request gone leaves the
	// cursor where it was); otherwise the cursor stays on the top row.
	if !p.chosen {
		p.cur.pos = 0
	}
	for i := range p.rows {
		if p.chosen && p.rows[i].r.ID == p.sel {
			p.cur.pos = i
			break
		}
	}
	p.cur.clamp(len(p.rows), p.visibleRows())
	if len(p.rows) > 0 {
		p.sel = p.rows[p.cur.pos].r.ID
	}
	k := renderKey{ver: p.w.ver, width: p.width, height: p.height, pos: p.cur.pos, top: p.cur.top,
		styleGen: p.styleGen, extra: p.rowsKey.filter + "\x00" + strconv.Itoa(int(p.sort)) + strconv.FormatBool(p.reverse)}
	if k != p.key || p.out == "" {
		p.key = k
		p.out = p.render()
	}
	return p
}

func (p *requestsPanel) buildRows() {
	v := p.w.view
	p.rows = p.rows[:0]
	p.all = 0
	if v == nil {
		return
	}
	sts := v.Statuses()
	now := v.Stamp()
	limit := v.Config().PreparedAgeLimit.Milliseconds()
	for i, r := range v.Requests() {
		st := sts[i]
		row := reqRow{r: r, order: i, pages: st.Pages, kv: -1}
		row.label, row.rank = st.Condition.String(), int(st.Condition)
		row.stuck = st.Stuck
		row.hazard = len(r.Hazards) > 0
		if r.Reserved > 0 {
			row.kv = r.Received * 1000 / r.Reserved
		}
		end := now
		if r.State.Ended() {
			end = r.Ended
		}
		row.ageMs = end.At - r.Arrived.At
		row.steps = end.Step - r.Arrived.Step
		p.all++
		if p.filter.active() && !p.filter.match(rowText(v, &row, now.At, limit)) {
			continue
		}
		p.rows = append(p.rows, row)
	}
	p.sortRows()
}

// sortRef is a row's place and its sort key: sorting these small values and then placing
// the rows costs a fraction of sorting the rows themselves.
type sortRef struct {
	key int64
	idx int32
}

func (p *requestsPanel) sortRows() {
	switch {
	case p.sort == sortArrival && !p.reverse:
		return // built in arrival order
	case p.sort == sortStuck && !p.reverse:
		p.rows, p.spare = bucketSort(p.rows, p.spare[:0]), p.rows
		return
	}
	refs := slices.Grow(p.refs[:0], len(p.rows))[:len(p.rows)]
	p.refs = refs
	for i := range p.rows {
		r := &p.rows[i]
		var k int64
		switch p.sort {
		case sortStuck:
			k = int64(r.rank) << 32
			if !r.stuck {
				k |= 1 << 50
			}
		case sortAge:
			k = -r.ageMs
		case sortPages:
			k = -int64(r.pages)
		case sortKV:
			k = int64(r.kv)
		}
		refs[i] = sortRef{key: k, idx: int32(i)}
	}
	by := func(a, b sortRef) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.idx, b.idx)) }
	if p.sort == sortID {
		by = func(a, b sortRef) int {
			return cmp.Or(cmp.Compare(p.rows[a.idx].r.ID, p.rows[b.idx].r.ID), cmp.Compare(a.idx, b.idx))
		}
	}
	if p.reverse {
		fwd := by
		by = func(a, b sortRef) int { return fwd(b, a) }
	}
	slices.SortFunc(refs, by)
	sorted := p.spare[:0]
	for _, ref := range refs {
		sorted = append(sorted, p.rows[ref.idx])
	}
	p.rows, p.spare = sorted, p.rows
}

// bucketSort orders rows stuck first, then by state rank, keeping arrival order within
// each: the default order, in linear time.
func bucketSort(rows, dst []reqRow) []reqRow {
	const ranks = int(engine.NumConditions)
	var count [2 * ranks]int
	bucket := func(r *reqRow) int {
		b := min(r.rank, ranks-1)
		if !r.stuck {
			b += ranks
		}
		return b
	}
	for i := range rows {
		count[bucket(&rows[i])]++
	}
	at := 0
	for b := range count {
		at, count[b] = at+count[b], at
	}
	out := slices.Grow(dst[:0], len(rows))[:len(rows)]
	for i := range rows {
		b := bucket(&rows[i])
		out[count[b]] = rows[i]
		count[b]++
	}
	return out
}

// why says in a few words what a request is doing or waiting for.
func why(v *engine.View, r *engine.RequestView, now, limitMs int64) string {
	var s string
	switch r.State {
	case engine.StateWaiting:
		if ev, ok := v.Blocked(r); ok {
			s = ev.Short()
		} else if r.Pending > 0 {
			s = fmt.Sprintf("prefill %d left", r.Pending)
		} else {
			s = "not evaluated yet"
		}
	case engine.StatePrepared, engine.StateKVComplete:
		if r.State == engine.StatePrepared {
			s = fmt.Sprintf("awaiting KV %d/%d", r.Received, r.Reserved)
		} else {
			s = "KV complete, awaiting start_generate"
		}
		if age := now - r.Admitted.At; limitMs > 0 && age >= limitMs {
			s = fmt.Sprintf("prepared %s: ", dur(age)) + s
		}
	case engine.StateRunning:
		if r.Pending > 0 {
			s = fmt.Sprintf("prefill %d tokens left", r.Pending)
		} else {
			s = fmt.Sprintf("decoding %d/%d", r.Generated, r.MaxTokens)
		}
	case engine.StateFinished:
		s = fmt.Sprintf("%s, %d tokens", r.FinishReason, r.Generated)
	default:
		s = r.FinishReason
		if r.Leaked {
			s += ", seq leaked"
		}
	}
	if len(r.Hazards) > 0 {
		names := make([]string, len(r.Hazards))
		for i, h := range r.Hazards {
			names[i] = h.String()
		}
		s += " · hazard " + strings.Join(slices.Compact(names), ",")
	}
	return s
}

// rowText is what the filter matches: id, state and the why column.
func rowText(v *engine.View, row *reqRow, now, limitMs int64) string {
	return row.r.ID + " " + row.label + " " + why(v, row.r, now, limitMs)
}

// column is one column of the table; those with a drop rank go, highest first, when the
// table is too narrow to give the last column room.
type column struct {
	title string
	width int
	right bool
	drop  int
}

func (p requestsPanel) columns(idW int) []column {
	cols := []column{
		{"", 2, false, 0},
		{"ID", idW, false, 0},
		{"STATE", 11, false, 0},
		{"AGE", 7, true, 4},
		{"STEPS", 6, true, 7},
		{"PROMPT", 6, true, 3},
		{"END", 6, true, 5},
		{"MATCH", 6, true, 6},
		{"PAGES", 6, true, 2},
		{"KV%", 5, true, 1},
		{"WHY", 0, false, 0},
	}
	const minWhy = 24
	for {
		used := 0
		for _, c := range cols {
			used += c.width + 1
		}
		if p.width-used >= minWhy {
			cols[len(cols)-1].width = p.width - used
			return cols
		}
		worst := -1
		for i, c := range cols {
			if c.drop > 0 && (worst < 0 || c.drop > cols[worst].drop) {
				worst = i
			}
		}
		if worst < 0 {
			cols[len(cols)-1].width = max(p.width-used, 4)
			return cols
		}
		cols = slices.Delete(cols, worst, worst+1)
	}
}

func (p requestsPanel) render() string {
	st := p.st
	v := p.w.view
	var b strings.Builder
	if v == nil {
		return st.Dim.Render("waiting for the first snapshot…")
	}
	stuck, hz := 0, 0
	idW := 4
	for i := range p.rows {
		if p.rows[i].stuck {
			stuck++
		}
		if p.rows[i].hazard {
			hz++
		}
	}
	h := p.visibleRows()
	end := min(p.cur.top+h, len(p.rows))
	for _, row := range p.rows[p.cur.top:end] {
		idW = max(idW, len(row.r.ID))
	}
	idW = min(idW, 16)

	title := st.Heading.Render("Requests") + " " + humanize.Comma(int64(len(p.rows)))
	if p.filter.active() {
		title += fmt.Sprintf(" of %s · filter /%s/", humanize.Comma(int64(p.all)), p.filter.text)
	}
	title += " · sort " + p.sortName()
	if stuck > 0 {
		title += " · " + st.Stuck.Render("! "+humanize.Comma(int64(stuck))+" stuck")
	}
	if hz > 0 {
		title += " · " + st.Hazardous.Render("* "+humanize.Comma(int64(hz))+" with hazards")
	}
	b.WriteString(fit(title, p.width))
	b.WriteByte('\n')

	cols := p.columns(idW)
	var hd strings.Builder
	for i, c := range cols {
		if i > 0 {
			hd.WriteByte(' ')
		}
		if c.right {
			hd.WriteString(padLeft(c.title, c.width))
		} else {
			hd.WriteString(pad(c.title, c.width))
		}
	}
	b.WriteString(st.Heading.Render(fit(hd.String(), p.width)))
	if len(p.rows) == 0 {
		b.WriteByte('\n')
		if p.all == 0 {
			b.WriteString(st.Dim.Render("no requests: no prep_recv has arrived"))
		} else {
			b.WriteString(st.Dim.Render("no request matches the filter"))
		}
		return b.String()
	}
	now := v.Stamp().At
	limit := v.Config().PreparedAgeLimit.Milliseconds()
	var line strings.Builder
	for i := p.cur.top; i < end; i++ {
		row := &p.rows[i]
		r := row.r
		line.Reset()
		for j, c := range cols {
			if j > 0 {
				line.WriteByte(' ')
			}
			var cell string
			switch c.title {
			case "":
				mark := []byte("  ")
				if row.stuck {
					mark[0] = '!'
				}
				if row.hazard {
					mark[1] = '*'
				}
				cell = string(mark)
			case "ID":
				cell = r.ID
			case "STATE":
				cell = row.label
			case "AGE":
				cell = dur(row.ageMs)
			case "STEPS":
				cell = strconv.FormatUint(row.steps, 10)
			case "PROMPT":
				cell = strconv.Itoa(r.PromptLength)
			case "END":
				cell = strconv.Itoa(r.End)
			case "MATCH":
				cell = strconv.Itoa(r.Matched)
				if r.Seq < 0 {
					cell = "-"
				}
			case "PAGES":
				cell = "-"
				if row.pages >= 0 {
					cell = strconv.Itoa(row.pages)
				}
			case "KV%":
				cell = "-"
				if row.kv >= 0 {
					cell = strconv.Itoa(row.kv/10) + "%"
				}
			case "WHY":
				cell = why(v, r, now, limit)
			}
			if c.right {
				line.WriteString(padLeft(cell, c.width))
			} else {
				line.WriteString(pad(cell, c.width))
			}
		}
		text := pad(line.String(), p.width)
		b.WriteByte('\n')
		switch {
		case i == p.cur.pos:
			paint(&b, st.cut.cursor, text)
		case row.stuck:
			paint(&b, st.cut.stuck, text)
		case row.hazard:
			paint(&b, st.cut.hazardous, text)
		default:
			b.WriteString(text)
		}
	}
	return b.String()
}
