package ui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine/prefix"
)

// prefixPanel is the prefix cache's radix tree: one line a node with its token span,
// depth, hit count and the sequences that end there (active or recycling, with their
// requests). The path of the most recent match is marked and labelled. Enter folds a node.
type prefixPanel struct {
	w        *world
	st       *Styles
	styleGen int
	keys     KeyMap

	width, height int
	collapsed     map[uint32]bool // by node id; a map, so value copies share it
	foldGen       int

	lines    []trieLine
	onPath   map[prefix.NodeID]bool
	linesKey struct{ ver, fold int }
	nodes    int
	cur      cursor

	out string
	key renderKey
}

type trieLine struct {
	node   prefix.Node
	indent string
	kids   int
	folded bool
}

func (p prefixPanel) with(w *world, st *Styles, gen int) prefixPanel {
	p.w, p.st, p.styleGen = w, st, gen
	if p.keys.Up.Keys() == nil {
		p.keys = DefaultKeyMap()
	}
	if p.collapsed == nil {
		p.collapsed = make(map[uint32]bool)
	}
	return p
}

// SetSize sets the panel's size.
func (p prefixPanel) SetSize(w, h int) prefixPanel {
	p.width, p.height = w, h
	return p
}

// View returns the rendered tree.
func (p prefixPanel) View() string { return p.out }

const prefixHead, prefixFoot = 2, 2

func (p prefixPanel) visible() int { return max(p.height-prefixHead-prefixFoot, 1) }

// Update moves the cursor and folds nodes.
func (p prefixPanel) Update(msg tea.Msg) (prefixPanel, tea.Cmd) {
	if p.cur.move(msg, p.keys, len(p.lines), p.visible()) {
		return p, nil
	}
	if k, ok := msg.(tea.KeyPressMsg); ok && key.Matches(k, p.keys.Enter) && p.cur.pos < len(p.lines) {
		l := p.lines[p.cur.pos]
		if l.kids > 0 {
			id := uint32(l.node.ID)
			if p.collapsed[id] {
				delete(p.collapsed, id)
			} else {
				p.collapsed[id] = true
			}
			p.foldGen++
		}
	}
	return p, nil
}

// Refresh rebuilds the lines when the tree or the folds changed.
func (p prefixPanel) Refresh() prefixPanel {
	if p.w == nil {
		return p
	}
	if p.w.view != nil && (p.linesKey.ver != int(p.w.prefixVer) || p.linesKey.fold != p.foldGen || p.lines == nil) {
		p.linesKey.ver, p.linesKey.fold = int(p.w.prefixVer), p.foldGen
		p.build()
	}
	p.cur.clamp(len(p.lines), p.visible())
	k := renderKey{ver: p.w.ver, width: p.width, height: p.height, pos: p.cur.pos, top: p.cur.top, styleGen: p.styleGen}
	if k != p.key || p.out == "" {
		p.key = k
		p.out = p.render()
	}
	return p
}

func (p *prefixPanel) build() {
	nodes := p.w.view.PrefixNodes()
	p.nodes = len(nodes)
	kids := make(map[prefix.NodeID][]int, len(nodes))
	for i, n := range nodes {
		if i > 0 {
			kids[n.Parent] = append(kids[n.Parent], i)
		}
	}
	p.onPath = make(map[prefix.NodeID]bool)
	if m, ok := p.w.view.LastMatch(); ok {
		for _, id := range m.Path {
			p.onPath[id] = true
		}
	}
	p.lines = p.lines[:0]
	if len(nodes) == 0 {
		return
	}
	var walk func(i int, indent string, last bool, root bool)
	walk = func(i int, indent string, last bool, root bool) {
		n := nodes[i]
		l := trieLine{node: n, kids: len(kids[n.ID]), folded: p.collapsed[uint32(n.ID)]}
		child := indent
		if !root {
			if last {
				l.indent = indent + "└─"
				child = indent + "  "
			} else {
				l.indent = indent + "├─"
				child = indent + "│ "
			}
		}
		p.lines = append(p.lines, l)
		if l.folded {
			return
		}
		for j, c := range kids[n.ID] {
			walk(c, child, j == len(kids[n.ID])-1, false)
		}
	}
	walk(0, "", true, true)
}

func (p prefixPanel) render() string {
	st := p.st
	v := p.w.view
	if v == nil {
		return st.Dim.Render("waiting for the first snapshot…")
	}
	var b strings.Builder
	ps := v.PrefixStats()
	hit := fmt.Sprintf("%s of %s tokens", ratio(ps.HitTokens, ps.QueryTokens, 1), humanize.Comma(int64(ps.QueryTokens)))
	if cf, ok := v.Counterfactual(); ok {
		hit += fmt.Sprintf(" (%s order would give %s)", cf.Order, ratio(cf.Stats.HitTokens, cf.Stats.QueryTokens, 1))
	}
	mode := v.Config().PrefixCache
	if mode == "radix" {
		mode += ", evicting in " + v.Config().EvictOrder.String() + " order"
	}
	b.WriteString(st.Heading.Render("Prefix tree"))
	b.WriteString(fit(fmt.Sprintf(" %s nodes · %s recycling · hit %s · inserts %s, forks %s, reuses %s, evictions %s · %s",
		humanize.Comma(int64(p.nodes)), humanize.Comma(int64(len(v.Recycling()))), hit,
		humanize.Comma(int64(ps.Inserts)), humanize.Comma(int64(ps.Forks)), humanize.Comma(int64(ps.Reuses)),
		humanize.Comma(int64(ps.Evictions)), mode), p.width-11))
	b.WriteByte('\n')
	last, hasLast := v.LastMatch()
	if hasLast {
		m := last
		var what string
		switch m.Match {
		case prefix.Fork:
			what = fmt.Sprintf("fork of seq %d at %d tokens", m.Parent, m.Matched)
		case prefix.Reuse:
			what = fmt.Sprintf("reuse of seq %d, %d tokens matched, %d popped", m.Parent, m.Matched, m.Pop)
		default:
			what = "new sequence, nothing matched"
		}
		path := []string{"root"}
		for _, id := range m.Path {
			if id != 0 {
				path = append(path, fmt.Sprintf("#%d", id))
			}
		}
		b.WriteString(fit(st.Path.Render(fmt.Sprintf("last match (%s): %s → seq %d, %s (%d candidates) · path %s",
			m.Match, m.ID, m.Seq, what, m.Candidates, strings.Join(path, " → "))), p.width))
	} else {
		b.WriteString(st.Dim.Render("no match seen since the dashboard started"))
	}
	h := p.visible()
	end := min(p.cur.top+h, len(p.lines))
	for i := p.cur.top; i < end; i++ {
		l := p.lines[i]
		n := l.node
		var t strings.Builder
		t.WriteString(l.indent)
		switch {
		case l.kids > 0 && l.folded:
			t.WriteString("▸ ")
		case l.kids > 0:
			t.WriteString("▾ ")
		default:
			t.WriteString("─ ")
		}
		if n.ID == 0 {
			fmt.Fprintf(&t, "root · hits %d", n.Hits)
		} else {
			fmt.Fprintf(&t, "#%d +%d =%d · hits %d", n.ID, n.Span, n.Depth, n.Hits)
		}
		if l.folded {
			fmt.Fprintf(&t, " · %d children folded", l.kids)
		}
		for j, s := range n.Seqs {
			if j == 3 {
				fmt.Fprintf(&t, " +%d more", len(n.Seqs)-3)
				break
			}
			t.WriteString(" · " + seqText(v, s))
		}
		if p.onPath[n.ID] {
			t.WriteString("  ◀ " + last.Match.String())
		}
		text := pad(t.String(), p.width)
		b.WriteByte('\n')
		switch {
		case i == p.cur.pos:
			b.WriteString(st.Cursor.Render(text))
		case p.onPath[n.ID]:
			b.WriteString(st.Path.Render(text))
		default:
			b.WriteString(text)
		}
	}
	for i := end - p.cur.top; i < h; i++ {
		b.WriteByte('\n')
	}
	// The node under the cursor, whole.
	b.WriteByte('\n')
	if p.cur.pos < len(p.lines) {
		n := p.lines[p.cur.pos].node
		var seqs []string
		for _, s := range n.Seqs {
			seqs = append(seqs, seqText(v, s))
		}
		if len(seqs) == 0 {
			seqs = []string{"no sequence ends here"}
		}
		b.WriteString(fit(fmt.Sprintf("node #%d: tokens %d–%d (span %d) · %d matches passed · %s", n.ID, n.Depth-n.Span, n.Depth, n.Span, n.Hits, strings.Join(seqs, ", ")), p.width))
	}
	return b.String()
}

func seqText(v interface {
	Owner(int64) (string, bool)
}, s prefix.SeqRef) string {
	t := fmt.Sprintf("seq %d %s", s.ID, s.State)
	if id, ok := v.Owner(s.ID); ok {
		t += " (" + id + ")"
	}
	return t
}
