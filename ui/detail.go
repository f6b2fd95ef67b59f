package ui

import (
	"fmt"
	"slices"
	"strings"

	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/viewport"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prefix"
	"github.com/kvtop/kvtop/engine/prepare"
)

// detailPanel is one request whole: why it is stuck (the admission evaluation with every
// predicate and its numbers, or its prepared age and KV progress, or its leak), its
// timeline, its pages, its metadata runs, its prefix path and its hazards. A
// viewport.Model scrolls it.
type detailPanel struct {
	w        *world
	st       *Styles
	styleGen int
	keys     KeyMap
	// vp is shared by the copies of the panel (a panel is a value, copied on every
	// refresh; the viewport is 2.6 KB).
	vp *viewport.Model

	id            string
	width, height int

	// The prefix path walks the whole tree: it is kept while the tree does not change.
	prefixLines []string
	prefixBy    struct {
		ver uint64
		id  string
		seq int64
	}

	lines   []string
	linesBy struct {
		ver      uint64
		id       string
		width    int
		styleGen int
	}

	out string
	key renderKey
}

func (p detailPanel) with(w *world, st *Styles, gen int) detailPanel {
	p.w, p.st, p.styleGen = w, st, gen
	p.init()
	return p
}

// init gives a zero panel its keys and its viewport.
func (p *detailPanel) init() {
	if p.keys.Up.Keys() == nil {
		p.keys = DefaultKeyMap()
		vp := newDetailViewport(p.keys)
		p.vp = &vp
	}
}

// newDetailViewport returns a viewport scrolled by the dashboard's own bindings: the
// viewport's defaults (space, f, b, d, u) are global keys here or mean nothing else in
// kvtop, and the lines are cut to the panel's width, so there is nothing to scroll
// sideways.
func newDetailViewport(k KeyMap) viewport.Model {
	vp := viewport.New()
	off := key.NewBinding(key.WithDisabled())
	vp.KeyMap = viewport.KeyMap{
		Up:           k.Up,
		Down:         k.Down,
		PageUp:       k.PageUp,
		PageDown:     k.PageDown,
		HalfPageUp:   off,
		HalfPageDown: off,
		Left:         off,
		Right:        off,
	}
	vp.MouseWheelEnabled = false // the root turns the wheel into up and down
	vp.SetHorizontalStep(0)
	return vp
}

// SetSize sets the panel's size, and the viewport's.
func (p detailPanel) SetSize(w, h int) detailPanel {
	p.init()
	p.width, p.height = w, h
	if h := max(h, 1); h != p.vp.Height() || w != p.vp.Width() {
		p.vp.SetWidth(w)
		p.vp.SetHeight(h)
		p.vp.SetYOffset(p.vp.YOffset()) // a taller panel shows more of the end
	}
	return p
}

// View returns the rendered detail.
func (p detailPanel) View() string { return p.out }

// open shows a request, from its top when it is another one.
func (p detailPanel) open(id string) detailPanel {
	p.init()
	if id != p.id {
		p.vp.GotoTop()
	}
	p.id = id
	return p
}

// Update scrolls: the viewport takes up, down and the pages, and home and end (which it
// has no bindings for) go to the first and the last line.
func (p detailPanel) Update(msg tea.Msg) (detailPanel, tea.Cmd) {
	p.init()
	if k, ok := msg.(tea.KeyPressMsg); ok {
		switch {
		case key.Matches(k, p.keys.Home):
			p.vp.GotoTop()
			return p, nil
		case key.Matches(k, p.keys.End):
			p.vp.GotoBottom()
			return p, nil
		}
	}
	vp, cmd := p.vp.Update(msg)
	*p.vp = vp
	return p, cmd
}

// Refresh rebuilds the lines when the request or the data changed (cut to the width
// there, once, not per frame), and joins the ones in the viewport's window when they or
// the scroll changed.
//
// The viewport keeps the scroll and takes the keys, but its View is not used: it renders
// the window through a lipgloss style that measures, wraps and pads every line to the
// width on every call, which made a scrolled frame 7 times and a frame after a data change
// 1.6 times as costly (BenchmarkDetail), for a text already cut to the width.
func (p detailPanel) Refresh() detailPanel {
	if p.w == nil {
		return p
	}
	lb := p.linesBy
	lb.ver, lb.id, lb.width, lb.styleGen = p.w.ver, p.id, p.width, p.styleGen
	if lb != p.linesBy || p.lines == nil {
		p.linesBy = lb
		// One line a line: the viewport would split a line holding a newline in its own
		// copy, and the window below is cut from this one.
		var lines []string
		for _, l := range p.build() {
			for part := range strings.SplitSeq(l, "\n") {
				lines = append(lines, fit(part, p.width))
			}
		}
		p.lines = lines
		p.vp.SetContentLines(lines)
	}
	top := p.vp.YOffset()
	k := renderKey{ver: p.w.ver, width: p.width, height: p.height, top: top, styleGen: p.styleGen, extra: p.id}
	if k != p.key || p.out == "" {
		p.key = k
		end := min(top+p.vp.Height(), len(p.lines))
		p.out = strings.Join(p.lines[top:end], "\n")
	}
	return p
}

func (p *detailPanel) build() []string {
	st := p.st
	v := p.w.view
	switch {
	case v == nil:
		return []string{st.Dim.Render("waiting for the first snapshot…")}
	case p.id == "":
		return []string{st.Dim.Render("no request selected: pick one in the requests panel and press enter")}
	}
	r, ok := v.Request(p.id)
	if !ok {
		return []string{st.Heading.Render("Request " + p.id), "",
			st.Dim.Render("the engine no longer holds this request (retired: it ended and was forgotten to keep the table bounded)")}
	}
	now := v.Stamp()
	limit := v.Config().PreparedAgeLimit.Milliseconds()
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	section := func(title string) { out = append(out, "", st.Heading.Render(title)) }

	status, _ := v.StatusOf(r.ID)
	head := st.Heading.Render("Request "+r.ID) + "  " + status.Condition.String()
	if status.Stuck {
		head += "  " + st.Bad.Render("! STUCK")
	}
	out = append(out, head)
	seq := "-"
	if r.Seq >= 0 {
		seq = fmt.Sprint(r.Seq)
	}
	add("prompt %d · end %d · max_tokens %d · seq %s · matched %d (%s) · generated %d",
		r.PromptLength, r.End, r.MaxTokens, seq, r.Matched, matchText(r), r.Generated)
	end := now
	if r.State.Ended() {
		end = r.Ended
	}
	add("arrived at step %d · age %s, %s%s", r.Arrived.Step, dur(end.At-r.Arrived.At), plural(int(end.Step-r.Arrived.Step), "step"), endedText(r))

	section("Why")
	out = append(out, p.why(v, r, now, limit)...)

	section("Timeline")
	if len(r.History) == 0 {
		add("  (no marks)")
	}
	for _, m := range r.History {
		add("  step %-6d %8s  %s", m.Step, "+"+dur(m.At-r.Arrived.At), m.Line())
	}

	section("Pages")
	out = append(out, p.pagesText(v, r)...)

	section("Metadata")
	if len(r.Runs) == 0 {
		add("  none: not admitted yet")
	} else {
		add("  kv_append_metadata %s", r.Encoded)
		if arr, err := prepare.Decode(r.Encoded); err == nil {
			add("  decodes to %s", intsText(arr))
		}
		for m, runs := range r.Runs {
			for i, run := range runs {
				line := fmt.Sprintf("  model %d run %d: slots %d–%d (%d)", m, i, run.Start, run.End()-1, run.Len)
				if m == 0 && i < len(r.RunReceived) {
					g := stripGlyph[runClass(r.RunReceived[i], run.Len)]
					line += fmt.Sprintf(" · %s %d/%d received", g, r.RunReceived[i], run.Len)
				}
				out = append(out, line)
			}
		}
		add("  KV received %d of %d reserved slots", r.Received, r.Reserved)
	}

	section("Prefix path")
	if pb := p.prefixBy; pb.ver != p.w.prefixVer || pb.id != r.ID || pb.seq != r.Seq || p.prefixLines == nil {
		p.prefixBy.ver, p.prefixBy.id, p.prefixBy.seq = p.w.prefixVer, r.ID, r.Seq
		p.prefixLines = p.prefixText(v, r)
	}
	out = append(out, p.prefixLines...)

	section("Hazards")
	n := 0
	for _, h := range v.Hazards() {
		if h.Hazard.ID == r.ID {
			out = append(out, st.Hazard.Render("  step "+fmt.Sprint(h.Step)+"  "+h.Hazard.String()))
			n++
		}
	}
	if n == 0 && len(r.Hazards) > 0 {
		for _, k := range r.Hazards {
			out = append(out, st.Hazard.Render("  "+k.String()))
		}
	} else if n == 0 {
		add("  none")
	}
	return out
}

func matchText(r *engine.RequestView) string {
	if r.Seq < 0 {
		return "not matched yet"
	}
	switch r.Match {
	case prefix.Fork:
		return fmt.Sprintf("fork of seq %d", r.Parent)
	case prefix.Reuse:
		return fmt.Sprintf("reuse of seq %d", r.Parent)
	}
	return "new sequence"
}

func endedText(r *engine.RequestView) string {
	if !r.State.Ended() {
		return ""
	}
	return fmt.Sprintf(" · ended at step %d (%s)", r.Ended.Step, r.FinishReason)
}

// why explains what holds the request: the admission test for a waiting one, the age and
// KV progress for a prepared one, the leak for an aborted one.
func (p detailPanel) why(v *engine.View, r *engine.RequestView, now engine.Stamp, limit int64) []string {
	st := p.st
	var out []string
	switch r.State {
	case engine.StateWaiting:
		ev, ok := v.Blocked(r)
		if !ok {
			if r.Pending > 0 {
				return []string{fmt.Sprintf("  started, %d tokens of its tail wait for prefill", r.Pending)}
			}
			return []string{"  waiting, not evaluated yet: it arrived after the last prepare-receive pass; the next step evaluates it"}
		}
		out = append(out, p.para(st.Bad, ev.String())...)
		if ev.Reason == prepare.ReasonHeadOfLine {
			head := v.Head()
			if head == nil || head.Eval == nil {
				return out
			}
			out = append(out, p.para(st.Label, fmt.Sprintf("admission is first-in first-out: nothing behind %s is admitted until it is; %s is blocked by:", head.ID, head.ID))...)
			out = append(out, p.para(st.Bad, head.Eval.String())...)
			ev = *head.Eval
		}
		out = append(out, "")
		out = append(out, p.checks(ev)...)
		if ev.Evicted > 0 {
			out = append(out, fmt.Sprintf("  eviction already freed %d recycling sequence(s) for this test", ev.Evicted))
		}
	case engine.StatePrepared, engine.StateKVComplete:
		age := now.At - r.Admitted.At
		pct := 100
		if r.Reserved > 0 {
			pct = r.Received * 100 / r.Reserved
		}
		line := fmt.Sprintf("  prepared at step %d, %s (%s) ago; KV %d/%d received (%d%%)", r.Admitted.Step, dur(age), plural(int(now.Step-r.Admitted.Step), "step"), r.Received, r.Reserved, pct)
		out = append(out, line)
		switch {
		case r.State == engine.StatePrepared:
			out = append(out, p.para(st.Label, "waiting for the prefill instance to write its KV (remote_send), then for start_generate")...)
		default:
			out = append(out, p.para(st.Label, "its KV is complete: waiting for the router's start_generate")...)
		}
		if limit > 0 && age >= limit {
			out = append(out, p.para(st.Bad, fmt.Sprintf("past the %s age limit: the router likely never calls start_generate, or the prefill instance never wrote; MLC never frees it (a leak)", dur(limit)))...)
		} else if limit > 0 {
			out = append(out, st.Dim.Render(fmt.Sprintf("  flagged as a likely leak after %s", dur(limit))))
		}
	case engine.StateRunning:
		if r.Pending > 0 {
			out = append(out, fmt.Sprintf("  running: %d tokens of its tail left to prefill on this instance", r.Pending))
		} else {
			out = append(out, fmt.Sprintf("  running: decoding, %d of %d tokens generated", r.Generated, r.MaxTokens))
		}
	default:
		out = append(out, fmt.Sprintf("  %s (%s) after %d tokens", r.State, r.FinishReason, r.Generated))
		if r.Leaked {
			out = append(out, p.para(st.Bad, fmt.Sprintf("LEAKED: aborted while prepared; its sequence %d keeps its pages and its prefix entry, and MLC never frees them", r.Seq))...)
		}
	}
	return out
}

// checks is the admission predicates as a table: each with its numbers and whether it
// holds; the first that fails is the reason.
func (p detailPanel) checks(ev prepare.Evaluation) []string {
	st := p.st
	out := []string{fmt.Sprintf("  %-2s%-15s %15s  %s", "", "predicate", "lhs ≤ rhs", "test (docs/admission.md)")}
	first := true
	for _, c := range ev.Checks() {
		mark, op, style := "✓", "≤", st.Pass
		note := ""
		if !c.OK() {
			mark, op, style = "✗", ">", st.Fail
			if first {
				note = "  ← blocks"
				first = false
			}
		}
		line := fmt.Sprintf("  %-2s%-15s %15s  %s%s", mark, c.Name, fmt.Sprintf("%d %s %d", c.LHS, op, c.RHS), c.Text, note)
		out = append(out, style.Render(line))
	}
	if ev.Recycling > 0 {
		out = append(out, fmt.Sprintf("  eviction could free %d pages held by %d recycling sequences", ev.Evictable, ev.Recycling))
	} else {
		out = append(out, "  nothing is recycling: eviction cannot free anything")
	}
	return out
}

func (p detailPanel) pagesText(v *engine.View, r *engine.RequestView) []string {
	if r.Seq < 0 {
		return []string{"  none: no sequence yet"}
	}
	if id, ok := v.Owner(r.Seq); !ok || id != r.ID {
		return []string{fmt.Sprintf("  seq %d is no longer this request's (now %s)", r.Seq, orNone(id))}
	}
	c := v.Cache()
	pgs, err := c.SequencePages(r.Seq, nil)
	if err != nil {
		return []string{fmt.Sprintf("  seq %d holds no pages (removed from the cache)", r.Seq)}
	}
	pd := p.w.pages()
	var count [numPageStates]int
	for _, pg := range pgs {
		count[pd.States[pg]]++
	}
	var mix []string
	for s := range numPageStates {
		if count[s] > 0 {
			mix = append(mix, fmt.Sprintf("%s %d %s", p.st.Glyph[s], count[s], pageStateNames[s]))
		}
	}
	n, _ := c.SequenceLength(r.Seq)
	lines := []string{
		fmt.Sprintf("  seq %d: %d tokens on %d pages: %s", r.Seq, n, len(pgs), strings.Join(mix, ", ")),
		"  pages " + engine.PageList(pgs),
	}
	if st, ok := seqState(v, r.Seq); ok && st == prefix.Recycling {
		lines = append(lines, "  recycling: kept in the prefix cache for reuse, evictable")
	}
	return lines
}

func orNone(s string) string {
	if s == "" {
		return "nobody"
	}
	return s
}

// prefixText is the request's path in the radix tree, root to the node its sequence ends
// in.
func (p detailPanel) prefixText(v *engine.View, r *engine.RequestView) []string {
	if r.Seq < 0 {
		return []string{"  none: not matched yet"}
	}
	nodes := v.PrefixNodes()
	byID := make(map[prefix.NodeID]prefix.Node, len(nodes))
	var at *prefix.Node
	for i := range nodes {
		byID[nodes[i].ID] = nodes[i]
		for _, s := range nodes[i].Seqs {
			if s.ID == r.Seq {
				at = &nodes[i]
			}
		}
	}
	if at == nil {
		return []string{fmt.Sprintf("  seq %d is not in the prefix cache (mode %s, or removed)", r.Seq, v.Config().PrefixCache)}
	}
	var path []prefix.Node
	for n := *at; ; n = byID[n.Parent] {
		path = append(path, n)
		if n.ID == 0 {
			break
		}
		if _, ok := byID[n.Parent]; !ok {
			break
		}
	}
	slices.Reverse(path)
	parts := make([]string, len(path))
	for i, n := range path {
		if n.ID == 0 {
			parts[i] = "root"
		} else {
			parts[i] = fmt.Sprintf("#%d (+%d =%d)", n.ID, n.Span, n.Depth)
		}
	}
	state := "?"
	for _, s := range at.Seqs {
		if s.ID == r.Seq {
			state = s.State.String()
		}
	}
	return []string{
		"  " + strings.Join(parts, " → "),
		fmt.Sprintf("  seq %d ends at node #%d after %d tokens, %s · matched %d tokens: %s", r.Seq, at.ID, at.Depth, state, r.Matched, matchText(r)),
	}
}

// plural writes a count and its noun: "1 step", "3 steps".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// para wraps a sentence to the panel's width, indented, each line styled: the reasons are
// what a person reads this panel for, so they are never cut.
func (p detailPanel) para(st lipgloss.Style, text string) []string {
	lines := wrap(text, max(p.width-2, 20))
	for i, l := range lines {
		lines[i] = st.Render("  " + l)
	}
	return lines
}

// wrap breaks plain text into lines of at most w columns, at spaces where it can.
func wrap(text string, w int) []string {
	var out []string
	var line strings.Builder
	lw := 0
	for word := range strings.FieldsSeq(text) {
		ww := width(word)
		if lw > 0 && lw+1+ww > w {
			out = append(out, line.String())
			line.Reset()
			lw = 0
		}
		if lw > 0 {
			line.WriteByte(' ')
			lw++
		}
		line.WriteString(word)
		lw += ww
	}
	if lw > 0 || len(out) == 0 {
		out = append(out, line.String())
	}
	return out
}
