package ui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// headerKey is what the header depends on: it is rebuilt only when this changes.
type headerKey struct {
	ver        uint64
	width      int
	styleGen   int
	status     feed.Status
	link       feed.Link
	dropped    uint64
	frozen     bool
	behind     uint64
	rewound    uint64 // the step drawn while rewound, and the live one
	live       uint64
	recording  string
	diverged   bool
	closed     bool
	controllbl bool
}

// refreshHeader builds the three header lines: who and how (instance, link, step, rate,
// badges), the pages, and the requests by state with the prefix hit ratio and hazards.
func (m *Model) refreshHeader(w *world) {
	k := headerKey{ver: w.ver, width: m.width, styleGen: m.styleGen, status: m.status, link: m.link,
		dropped: m.dropped, frozen: m.frozen != nil, behind: m.behind, diverged: m.diverged != nil,
		closed: m.closed, controllbl: m.controllable(), live: m.liveStep()}
	if m.rw != nil {
		k.rewound = m.rw.step + 1
	}
	if m.rec != nil {
		k.recording = m.rec.name
	}
	if k == m.headerKey && m.header != "" {
		return
	}
	m.headerKey = k
	st := m.st
	wide := m.width >= 120
	v := w.view

	// Line 1: badges first (a narrow terminal cuts the end), then identity, link, step,
	// rate, hazards.
	var l1 strings.Builder
	l1.WriteString(st.Title.Render("kvtop"))
	if m.rw != nil {
		l1.WriteString(" " + st.Frozen.Render(m.rewindBadge()))
	}
	if m.frozen != nil {
		badge := " PAUSED "
		if m.behind > 0 {
			badge = fmt.Sprintf(" PAUSED +%s events ", humanize.Comma(int64(m.behind)))
		}
		l1.WriteString(" " + st.Frozen.Render(badge))
	}
	if m.haveStatus && m.status.Paused {
		l1.WriteString(" " + st.Paused.Render(" ENGINE PAUSED "))
	}
	if m.closed {
		l1.WriteString(" " + st.Bad.Render("source ended"))
	}
	if m.rec != nil {
		l1.WriteString(" " + st.Bad.Render(m.recordBadge()))
	}
	l1.WriteString(" " + st.Value.Render(m.name()) + " ")
	l1.WriteString(m.linkText())
	if m.dropped > 0 {
		l1.WriteString(" · " + st.Warn.Render("dropped "+humanize.Comma(int64(m.dropped))))
	}
	if v != nil {
		fmt.Fprintf(&l1, " · step %s", st.Value.Render(humanize.Comma(int64(v.Stamp().Step))))
	}
	if m.haveStatus {
		fmt.Fprintf(&l1, " · %s steps/s", st.Value.Render(rate(m.status.Rate)))
		if m.status.Target > 0 && wide {
			fmt.Fprintf(&l1, " (target %s)", rate(m.status.Target))
		}
	}
	if v != nil {
		var hz uint64
		for _, n := range v.Totals().Hazards {
			hz += n
		}
		if hz > 0 {
			l1.WriteString(" · " + st.Hazard.Render("* hazards "+humanize.Comma(int64(hz))))
		} else {
			l1.WriteString(" · " + st.Dim.Render("hazards 0"))
		}
	}
	if v != nil {
		if sd, ok := v.Follow(); ok {
			// A tap's shadow: how far it can be trusted.
			style := st.Dim
			if !sd.Exact() {
				style = st.Warn
			}
			l1.WriteString(" · " + style.Render("shadow: "+sd.Describe(v.Stamp().At)))
		}
	}
	if m.controllable() {
		l1.WriteString(" · " + st.Dim.Render("control"))
	} else {
		l1.WriteString(" · " + st.Dim.Render("read-only"))
	}

	// Line 2: pages.
	var l2 strings.Builder
	if v == nil {
		l2.WriteString(st.Dim.Render("waiting for the first snapshot…"))
	} else {
		c := v.Cache()
		total, free := c.NumPages(), c.NumAvailablePages()
		used := total - free
		text := fmt.Sprintf(" %s/%s used · %s free", humanize.Comma(int64(used)), humanize.Comma(int64(total)), humanize.Comma(int64(free)))
		ps := v.PrefixStats()
		hit := ratio(ps.HitTokens, ps.QueryTokens, 0)
		other, alt := "", ""
		if cf, ok := v.Counterfactual(); ok {
			other = fmt.Sprintf(" · %s would give %s", strings.ToUpper(cf.Order.String()), ratio(cf.Stats.HitTokens, cf.Stats.QueryTokens, 0))
			alt = fmt.Sprintf(" (%s %s)", cf.Order, ratio(cf.Stats.HitTokens, cf.Stats.QueryTokens, 0))
		}
		extra := fmt.Sprintf(" · seqs %s · seq len %s · recycling %d · prefix hit %s (%s/%s tok)%s", humanize.Comma(int64(c.NumSequences())),
			humanize.Comma(int64(c.TotalSequenceLength())), len(v.Recycling()), hit,
			humanize.Comma(int64(ps.HitTokens)), humanize.Comma(int64(ps.QueryTokens)), other)
		if m.width-len("pages ")-ansi.StringWidth(text)-ansi.StringWidth(extra) < 16 {
			extra = fmt.Sprintf(" · rec %d · hit %s%s", len(v.Recycling()), hit, alt)
		}
		label := "pages "
		barW := m.width - len(label) - ansi.StringWidth(text) - ansi.StringWidth(extra)
		barW = min(barW, 60)
		l2.WriteString(st.Label.Render(label))
		if barW >= 8 {
			l2.WriteString(bar(st, used, total, barW))
		}
		l2.WriteString(text)
		l2.WriteString(st.Dim.Render(extra))
	}

	// Line 3: requests by state, prefix hits, hazards; short names when the long ones do
	// not fit.
	l3 := ""
	if v != nil {
		l3 = m.requestsLine(w, true)
		if ansi.StringWidth(l3) > m.width {
			l3 = m.requestsLine(w, false)
		}
	}
	m.header = fit(l1.String(), m.width) + "\n" + fit(l2.String(), m.width) + "\n" + fit(l3, m.width)
}

func (m *Model) linkText() string {
	st := m.st
	l := m.link
	switch l.State {
	case feed.LinkUp:
		s := st.Good.Render("● connected")
		if l.LagMs > 0 {
			lag := fmt.Sprintf(" lag %s", dur(l.LagMs))
			if l.LagMs >= 1000 {
				s += st.Warn.Render(lag)
			} else {
				s += st.Dim.Render(lag)
			}
		}
		return s
	case feed.LinkConnecting, feed.LinkReconnecting:
		s := fmt.Sprintf("◌ %s", l.State)
		if l.Attempts > 0 {
			s += fmt.Sprintf(" (attempt %d)", l.Attempts)
		}
		if l.Err != "" {
			s += ": " + l.Err
		}
		return st.Bad.Render(s)
	case feed.LinkClosed:
		return st.Bad.Render("○ closed")
	}
	return st.Dim.Render(string(l.State))
}

// bar draws used of total as a bar of w cells; the numbers are written beside it.
func bar(st *Styles, used, total, w int) string {
	n := 0
	if total > 0 {
		n = (used*w + total - 1) / total
		if used == 0 {
			n = 0
		}
	}
	return st.BarUsed.Render(strings.Repeat("█", n)) + st.BarFree.Render(strings.Repeat("░", w-n))
}

func rate(r float64) string {
	switch {
	case r >= 1000:
		return humanize.Comma(int64(r))
	case r >= 10:
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.1f", r)
}

// ratio writes part/whole as a percentage with prec decimals, "-" when whole is 0.
func ratio(part, whole uint64, prec int) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.*f%%", prec, 100*float64(part)/float64(whole))
}

// dur writes milliseconds compactly: 850ms, 12.3s, 4m05s, 2h03m.
func dur(ms int64) string {
	switch {
	case ms < 0:
		return "-" + dur(-ms)
	case ms < 1000:
		return fmt.Sprintf("%dms", ms)
	case ms < 60_000:
		return fmt.Sprintf("%.1fs", float64(ms)/1000)
	case ms < 3_600_000:
		return fmt.Sprintf("%dm%02ds", ms/60_000, ms/1000%60)
	}
	return fmt.Sprintf("%dh%02dm", ms/3_600_000, ms/60_000%60)
}

func (m *Model) requestsLine(w *world, long bool) string {
	st := m.st
	var s engine.Derived
	if w.view != nil {
		s = w.view.Derived()
	}
	var l3 strings.Builder
	num := func(n int) string { return st.Value.Render(humanize.Comma(int64(n))) }
	names := [...]string{"waiting", "blocked", "prepared", "awaiting KV", "running", "prefilling", "stuck"}
	if !long {
		names = [...]string{"wait", "blocked", "prep", "await-KV", "run", "prefill", "stuck"}
	}
	fmt.Fprintf(&l3, "%s %s", st.Label.Render(names[0]), num(s.Waiting))
	if s.Blocked > 0 {
		fmt.Fprintf(&l3, " %s", st.Bad.Render(fmt.Sprintf("(%s %s)", names[1], humanize.Comma(int64(s.Blocked)))))
	} else {
		fmt.Fprintf(&l3, " %s", st.Dim.Render(fmt.Sprintf("(%s 0)", names[1])))
	}
	fmt.Fprintf(&l3, " · %s %s", st.Label.Render(names[2]), num(s.Prepared))
	fmt.Fprintf(&l3, " (%s %s)", names[3], num(s.AwaitingKV))
	fmt.Fprintf(&l3, " · %s %s", st.Label.Render(names[4]), num(s.Running))
	fmt.Fprintf(&l3, " +%s %s", num(s.Prefilling), names[5])
	if s.Stuck > 0 {
		l3.WriteString(" · " + st.Bad.Render(fmt.Sprintf("! %s %s", names[6], humanize.Comma(int64(s.Stuck)))))
	}
	return l3.String()
}
