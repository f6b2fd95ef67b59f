package ui

import (
	"fmt"
	"strconv"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
)

// segmentsPanel lists the recent kv_append_metadata answers, newest first: the request,
// the runs the base64 string decodes to, the string itself, a strip of the whole slot
// space showing where the runs land, and how much of each run has been received.
type segmentsPanel struct {
	w        *world
	st       *Styles
	styleGen int
	keys     KeyMap

	width, height int
	cur           cursor
	n             int

	out string
	key renderKey
}

// segLines is how many lines one answer takes.
const segLines = 4

func (p segmentsPanel) with(w *world, st *Styles, gen int) segmentsPanel {
	p.w, p.st, p.styleGen = w, st, gen
	if p.keys.Up.Keys() == nil {
		p.keys = DefaultKeyMap()
	}
	return p
}

// SetSize sets the panel's size.
func (p segmentsPanel) SetSize(w, h int) segmentsPanel {
	p.width, p.height = w, h
	return p
}

// View returns the rendered list.
func (p segmentsPanel) View() string { return p.out }

func (p segmentsPanel) visible() int { return max((p.height-1)/segLines, 1) }

// Update moves the cursor.
func (p segmentsPanel) Update(msg tea.Msg) (segmentsPanel, tea.Cmd) {
	p.cur.move(msg, p.keys, p.n, p.visible())
	return p, nil
}

// metadata returns the answers, newest first.
func (p segmentsPanel) metadata() []engine.MetadataEmitted {
	if p.w == nil || p.w.view == nil {
		return nil
	}
	md := p.w.view.Metadata()
	out := make([]engine.MetadataEmitted, len(md))
	for i := range md {
		out[i] = md[len(md)-1-i]
	}
	return out
}

func (p segmentsPanel) selected() string {
	md := p.metadata()
	if p.cur.pos < len(md) {
		return md[p.cur.pos].ID
	}
	return ""
}

// Refresh renders when anything drawn changed.
func (p segmentsPanel) Refresh() segmentsPanel {
	if p.w == nil {
		return p
	}
	if p.w.view != nil {
		p.n = len(p.w.view.Metadata())
	}
	p.cur.clamp(p.n, p.visible())
	k := renderKey{ver: p.w.ver, width: p.width, height: p.height, pos: p.cur.pos, top: p.cur.top, styleGen: p.styleGen}
	if k != p.key || p.out == "" {
		p.key = k
		p.out = p.render()
	}
	return p
}

func (p segmentsPanel) render() string {
	st := p.st
	v := p.w.view
	if v == nil {
		return st.Dim.Render("waiting for the first snapshot…")
	}
	var b strings.Builder
	md := p.metadata()
	cfg := v.Config()
	slots := int64(v.Cache().NumPages() * v.Cache().PageSize())
	b.WriteString(st.Heading.Render("Segments"))
	b.WriteString(fit(fmt.Sprintf(" %d recent kv_append_metadata answers (newest first; %d kept) · slot space 0–%d · strip: %s received %s partly %s awaiting",
		len(md), cfg.KeepMetadata, slots-1, stripGlyph[2], stripGlyph[1], stripGlyph[0]), p.width-8))
	if len(md) == 0 {
		b.WriteString("\n" + st.Dim.Render("no prepare-receive has been answered yet"))
		return b.String()
	}
	end := min(p.cur.top+p.visible(), len(md))
	for i := p.cur.top; i < end; i++ {
		e := md[i]
		recv, note := runProgress(v, e)
		total := int64(0)
		for _, r := range e.Runs[0] {
			total += r.Len
		}
		head := fmt.Sprintf("%s · seq %d · step %d · prompt %d, matched %d → %d slots in %d run(s)%s",
			e.ID, e.Seq, e.Step, e.PromptLength, e.Matched, total, len(e.Runs[0]), note)
		b.WriteByte('\n')
		if i == p.cur.pos {
			paint(&b, st.cut.cursor, pad(head, p.width))
		} else {
			paint(&b, st.cut.value, fit(head, p.width))
		}
		// The string and what it decodes to.
		dec := "?"
		if arr, err := prepare.Decode(e.Encoded); err == nil {
			dec = intsText(arr)
		} else {
			dec = "does not decode: " + err.Error()
		}
		b.WriteString("\n" + fit("  "+e.Encoded+"  = "+dec, p.width))
		// Where the runs land in the slot space.
		b.WriteString("\n  " + strip(e.Runs[0], recv, slots, max(p.width-4, 8)))
		// Each run with what has arrived.
		var rl strings.Builder
		rl.WriteString("  ")
		for j, r := range e.Runs[0] {
			if j > 0 {
				rl.WriteString("  ")
			}
			fmt.Fprintf(&rl, "[%d,%d]", r.Start, r.Len)
			if recv != nil {
				g := stripGlyph[runClass(recv[j], r.Len)]
				fmt.Fprintf(&rl, " %s%d/%d", g, recv[j], r.Len)
			}
		}
		for m := 1; m < len(e.Runs); m++ {
			fmt.Fprintf(&rl, "  model %d: %d run(s)", m, len(e.Runs[m]))
		}
		b.WriteString("\n" + fit(rl.String(), p.width))
	}
	return b.String()
}

// runProgress returns how much of each of an answer's runs has been received, when its
// request still holds that answer.
func runProgress(v *engine.View, e engine.MetadataEmitted) ([]int, string) {
	r, ok := v.Request(e.ID)
	switch {
	case !ok:
		return nil, " · request retired"
	case r.Encoded != e.Encoded || len(r.RunReceived) != len(e.Runs[0]):
		return nil, " · superseded by a later answer"
	}
	return r.RunReceived, fmt.Sprintf(" · %s, KV %d/%d", r.State, r.Received, r.Reserved)
}

var stripGlyph = [3]string{"□", "◧", "█"}

func runClass(got int, n int64) int {
	switch {
	case int64(got) >= n:
		return 2
	case got > 0:
		return 1
	}
	return 0
}

// strip draws the slot space in w cells and the runs on it; a run takes at least a cell.
func strip(runs []pages.Run, recv []int, slots int64, w int) string {
	cells := make([]string, w)
	for i := range cells {
		cells[i] = "·"
	}
	if slots <= 0 {
		return strings.Join(cells, "")
	}
	for j, r := range runs {
		a := r.Start * int64(w) / slots
		z := (r.End() - 1) * int64(w) / slots
		g := stripGlyph[0]
		if recv != nil {
			g = stripGlyph[runClass(recv[j], r.Len)]
		}
		for c := a; c <= z && c < int64(w); c++ {
			cells[c] = g
		}
	}
	return strings.Join(cells, "")
}

func intsText(a []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, x := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(x, 10))
	}
	b.WriteByte(']')
	return b.String()
}
