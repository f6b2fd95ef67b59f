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
	"github.com/kvtop/kvtop/engine/prepare"
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

// reqRow is one request as the table sorts, filters and draws it, made again only when the
// request changed (its View.RequestVersions version moved). Text is made only for the rows
// drawn (and, while a filter is on, to match the rows made again).
type reqRow struct {
	r     *engine.RequestView
	ver   uint64           // the request's version the row was made at
	cond  engine.Condition // the sort's state order: stuck first
	pages int32            // -1: holds none
	kv    int32            // per mille received; -1: nothing reserved
	stuck bool
	// hazard: a hazard was flagged; match: the filter matches; volatile: the text the
	// filter reads changes with the clock or the head of the line, not only with the
	// request (prepared, past the age limit in time; blocked behind the head).
	hazard, match, volatile bool
}

func (r *reqRow) label() string { return r.cond.String() }

// age returns how long a request has been in the table, in milliseconds and in steps: until
// it ended, or until now.
func (r *reqRow) age(now engine.Stamp) (int64, uint64) {
	end := now
	if r.r.State.Ended() {
		end = r.r.Ended
	}
	return end.At - r.r.Arrived.At, end.Step - r.r.Arrived.Step
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

	// all is a row for each request of the View, in table order; rows lists those the
	// filter lets through, in the sort's order (indexes into all). stuck and hazards count
	// the rows listed that are stuck and that have hazards.
	all            []reqRow
	view           *engine.View // the View all was made from
	rows           []int32
	spare          []int32 // the other buffer rows are sorted into
	refs           []sortRef
	stuck, hazards int
	rowsKey        struct {
		ver     uint64
		sort    sortKey
		reverse bool
		filter  string
	}
	at  engine.Stamp // the View's stamp when the rows were last brought up to date
	cur cursor
	sel string // the selected request's id, kept across re-sorts
	// selR is the selected request, to find its row by.
	selR *engine.RequestView
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
		p = p.selectRow(p.cur.pos)
		km, _ := msg.(tea.KeyPressMsg)
		p.chosen = !key.Matches(km, p.keys.Home)
	}
	return p, nil
}

// row returns the i-th row listed.
func (p *requestsPanel) row(i int) *reqRow { return &p.all[p.rows[i]] }

// selectRow selects the i-th row listed.
func (p requestsPanel) selectRow(i int) requestsPanel {
	r := p.row(i).r
	p.sel, p.selR = r.ID, r
	return p
}

// find places the cursor on the selected request's row, if it is listed.
func (p *requestsPanel) find() {
	for i, k := range p.rows {
		if p.all[k].r == p.selR {
			p.cur.pos = i
			return
		}
	}
	for i, k := range p.rows { // another View: by id
		if r := p.all[k].r; r.ID == p.sel {
			p.cur.pos, p.selR = i, r
			return
		}
	}
}

func (p requestsPanel) selected() string { return p.sel }

func (p requestsPanel) selectID(id string) requestsPanel {
	p.sel, p.selR = id, nil
	p.chosen = true
	p.find()
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

// Refresh brings the rows up to date when the data, the sort or the filter changed, and
// renders when anything drawn changed.
func (p requestsPanel) Refresh() requestsPanel {
	if p.w == nil {
		return p
	}
	rk := p.rowsKey
	rk.ver, rk.sort, rk.reverse, rk.filter = p.w.ver, p.sort, p.reverse, p.filter.text
	if rk != p.rowsKey || p.rows == nil {
		reorder := rk.sort != p.rowsKey.sort || rk.reverse != p.rowsKey.reverse || p.rows == nil
		refilter := rk.filter != p.rowsKey.filter
		p.rowsKey = rk
		if p.update(refilter) || reorder || refilter {
			p.order()
			// A chosen selection follows its request through re-sorts (a request gone
			// leaves the cursor where it was); otherwise the cursor stays on the top row.
			if p.chosen {
				p.find()
			}
		}
	}
	if !p.chosen {
		p.cur.pos = 0
	}
	p.cur.clamp(len(p.rows), p.visibleRows())
	if len(p.rows) > 0 {
		p = p.selectRow(p.cur.pos)
	}
	k := renderKey{ver: p.w.ver, width: p.width, height: p.height, pos: p.cur.pos, top: p.cur.top,
		styleGen: p.styleGen, extra: p.rowsKey.filter + "\x00" + strconv.Itoa(int(p.sort)) + strconv.FormatBool(p.reverse)}
	if k != p.key || p.out == "" {
		p.key = k
		p.out = p.render()
	}
	return p
}

// update brings the rows up to date with the View: it drops those of the requests retired,
// adds those of the requests arrived, and makes again those of the requests that changed (all
// of them for another View); with refilter, or when the clock moved and a filter is on, it
// matches again what the filter reads. It reports whether the order of the rows may have
// changed.
func (p *requestsPanel) update(refilter bool) bool {
	v := p.w.view
	if v == nil {
		p.all, p.view, p.stuck, p.hazards = p.all[:0], nil, 0, 0
		return true
	}
	reqs := v.Requests()
	vers := v.RequestVersions()
	sts := v.Statuses()
	now := v.Stamp()
	moved := false
	if v != p.view {
		p.all, p.view, p.stuck, p.hazards = p.all[:0], v, 0, 0
		moved = true
	}
	if n := len(p.all); n > len(reqs) || n > 0 && reqs[n-1] != p.all[n-1].r {
		// Requests were retired: keep the rows of the others, in order (arrivals come after).
		k := 0
		for j := 0; j < len(p.all) && k < len(reqs); j++ {
			if p.all[j].r == reqs[k] {
				p.all[k] = p.all[j]
				k++
			} else {
				p.count(&p.all[j], -1)
			}
		}
		for j := k; j < len(p.all); j++ {
			if p.all[j].r != nil {
				p.count(&p.all[j], -1)
			}
		}
		p.all = p.all[:k]
		moved = true
	}
	for i := len(p.all); i < len(reqs); i++ {
		p.all = append(p.all, reqRow{}) // made below: its version is none
		moved = true
	}
	limit := v.Config().PreparedAgeLimit.Milliseconds()
	ticked := now != p.at
	clock := p.filter.active() && ticked
	p.at = now
	for i := range p.all {
		row := &p.all[i]
		switch {
		case row.ver != vers[i] || row.r != reqs[i]:
			old := *row
			p.count(row, -1)
			p.make(row, reqs[i], &sts[i], vers[i], v, now.At, limit)
			p.count(row, 1)
			moved = moved || row.match != old.match || p.sortKeyChanged(&old, row)
		case refilter || clock && row.volatile:
			was := row.match
			p.count(row, -1)
			row.match = !p.filter.active() || p.filter.match(rowText(v, row, now.At, limit))
			p.count(row, 1)
			moved = moved || row.match != was
		}
	}
	return moved || p.sort == sortAge && ticked
}

// count adds a row (d = 1) to the counts of what is listed, or takes it out (-1).
func (p *requestsPanel) count(row *reqRow, d int) {
	if row.r == nil || !row.match {
		return
	}
	if row.stuck {
		p.stuck += d
	}
	if row.hazard {
		p.hazards += d
	}
}

// make makes the row of request r, whose status is st, at version ver.
func (p *requestsPanel) make(row *reqRow, r *engine.RequestView, st *engine.RequestStatus, ver uint64, v *engine.View, now, limit int64) {
	*row = reqRow{r: r, ver: ver, cond: st.Condition, pages: int32(st.Pages), kv: -1, stuck: st.Stuck, hazard: len(r.Hazards) > 0}
	if r.Reserved > 0 {
		row.kv = int32(r.Received * 1000 / r.Reserved)
	}
	row.volatile = st.Blocked == prepare.ReasonHeadOfLine ||
		limit > 0 && (r.State == engine.StatePrepared || r.State == engine.StateKVComplete)
	row.match = !p.filter.active() || p.filter.match(rowText(v, row, now, limit))
}

// sortKeyChanged says whether a row's place in the sort's order may differ from old's.
func (p *requestsPanel) sortKeyChanged(old, row *reqRow) bool {
	switch p.sort {
	case sortStuck:
		return old.cond != row.cond || old.stuck != row.stuck
	case sortPages:
		return old.pages != row.pages
	case sortKV:
		return old.kv != row.kv
	case sortAge:
		return old.r.State.Ended() != row.r.State.Ended()
	}
	return false // arrival and id: fixed
}

// order lists the rows the filter lets through, in the sort's order.
func (p *requestsPanel) order() {
	p.rows = p.rows[:0]
	for i := range p.all {
		if p.all[i].match {
			p.rows = append(p.rows, int32(i))
		}
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
		return // listed in arrival order
	case p.sort == sortStuck && !p.reverse:
		p.rows, p.spare = bucketSort(p.all, p.rows, p.spare[:0]), p.rows
		return
	}
	refs := slices.Grow(p.refs[:0], len(p.rows))[:len(p.rows)]
	p.refs = refs
	now := p.at
	for i, idx := range p.rows {
		r := &p.all[idx]
		var k int64
		switch p.sort {
		case sortStuck:
			k = int64(r.cond) << 32
			if !r.stuck {
				k |= 1 << 50
			}
		case sortAge:
			ms, _ := r.age(now)
			k = -ms
		case sortPages:
			k = -int64(r.pages)
		case sortKV:
			k = int64(r.kv)
		}
		refs[i] = sortRef{key: k, idx: idx}
	}
	by := func(a, b sortRef) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.idx, b.idx)) }
	if p.sort == sortID {
		by = func(a, b sortRef) int {
			return cmp.Or(cmp.Compare(p.all[a.idx].r.ID, p.all[b.idx].r.ID), cmp.Compare(a.idx, b.idx))
		}
	}
	if p.reverse {
		fwd := by
		by = func(a, b sortRef) int { return fwd(b, a) }
	}
	slices.SortFunc(refs, by)
	for i, ref := range refs {
		p.rows[i] = ref.idx
	}
}

// bucketSort orders the rows listed stuck first, then by state rank, keeping arrival order
// within each: the default order, in linear time. It returns them in dst's array.
func bucketSort(all []reqRow, rows, dst []int32) []int32 {
	const ranks = int(engine.NumConditions)
	var count [2 * ranks]int
	bucket := func(r *reqRow) int {
		b := min(int(r.cond), ranks-1)
		if !r.stuck {
			b += ranks
		}
		return b
	}
	for _, idx := range rows {
		count[bucket(&all[idx])]++
	}
	at := 0
	for b := range count {
		at, count[b] = at+count[b], at
	}
	out := slices.Grow(dst[:0], len(rows))[:len(rows)]
	for _, idx := range rows {
		b := bucket(&all[idx])
		out[count[b]] = idx
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
	return row.r.ID + " " + row.label() + " " + why(v, row.r, now, limitMs)
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
	stuck, hz := p.stuck, p.hazards
	idW := 4
	h := p.visibleRows()
	end := min(p.cur.top+h, len(p.rows))
	for i := p.cur.top; i < end; i++ {
		idW = max(idW, len(p.row(i).r.ID))
	}
	idW = min(idW, 16)

	title := st.Heading.Render("Requests") + " " + humanize.Comma(int64(len(p.rows)))
	if p.filter.active() {
		title += fmt.Sprintf(" of %s · filter /%s/", humanize.Comma(int64(len(p.all))), p.filter.text)
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
		if len(p.all) == 0 {
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
		row := p.row(i)
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
				cell = row.label()
			case "AGE":
				ms, _ := row.age(v.Stamp())
				cell = dur(ms)
			case "STEPS":
				_, steps := row.age(v.Stamp())
				cell = strconv.FormatUint(steps, 10)
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
					cell = strconv.Itoa(int(row.pages))
				}
			case "KV%":
				cell = "-"
				if row.kv >= 0 {
					cell = strconv.Itoa(int(row.kv/10)) + "%"
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
