package ui

import (
	"regexp"
	"strings"
	"unicode/utf8"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
)

// filterSpec is a panel's filter: a case-insensitive regular expression, inverted by a
// leading '!'.
type filterSpec struct {
	text   string
	re     *regexp.Regexp
	invert bool
}

func parseFilter(text string) (filterSpec, error) {
	f := filterSpec{text: text}
	expr := text
	if strings.HasPrefix(expr, "!") {
		f.invert = true
		expr = expr[1:]
	}
	if expr == "" {
		return f, nil
	}
	re, err := regexp.Compile("(?i)" + expr)
	if err != nil {
		return filterSpec{}, err
	}
	f.re = re
	return f, nil
}

// active says whether the filter selects anything out.
func (f filterSpec) active() bool { return f.re != nil }

func (f filterSpec) match(s string) bool {
	if f.re == nil {
		return true
	}
	return f.re.MatchString(s) != f.invert
}

// cursor is a selection in a list of n items shown h at a time.
type cursor struct {
	pos, top int
}

// move handles the navigation keys; it reports whether the key was one.
func (c *cursor) move(k tea.Msg, keys KeyMap, n, h int) bool {
	km, ok := k.(tea.KeyPressMsg)
	if !ok {
		return false
	}
	switch {
	case key.Matches(km, keys.Up):
		c.pos--
	case key.Matches(km, keys.Down):
		c.pos++
	case key.Matches(km, keys.PageUp):
		c.pos -= max(h-1, 1)
	case key.Matches(km, keys.PageDown):
		c.pos += max(h-1, 1)
	case key.Matches(km, keys.Home):
		c.pos = 0
	case key.Matches(km, keys.End):
		c.pos = n - 1
	default:
		return false
	}
	c.clamp(n, h)
	return true
}

// clamp keeps the cursor in the list and on the screen.
func (c *cursor) clamp(n, h int) {
	c.pos = min(max(c.pos, 0), max(n-1, 0))
	h = max(h, 1)
	if c.pos < c.top {
		c.top = c.pos
	}
	if c.pos >= c.top+h {
		c.top = c.pos - h + 1
	}
	c.top = min(max(c.top, 0), max(n-h, 0))
}

// width is ansi.StringWidth with a fast path for ASCII (escape sequences included) and for
// the one-column symbols the dashboard draws with (box drawing, blocks, geometric shapes,
// braille, arrows, dashes), which most cells and chart lines are: grapheme clustering costs
// a microsecond a cell.
func width(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 0x80:
			r, size := utf8.DecodeRuneInString(s[i:])
			if !narrow(r) {
				return ansi.StringWidth(s)
			}
			n++
			i += size - 1
		case c == 0x1b && i+1 < len(s) && s[i+1] == '[':
			// CSI: parameters and intermediates up to a final byte in 0x40–0x7e.
			i += 2
			for i < len(s) && (s[i] < 0x40 || s[i] > 0x7e) {
				i++
			}
		case c == 0x1b:
			return ansi.StringWidth(s)
		case c >= 0x20:
			n++
		}
	}
	return n
}

// narrow says whether a rune is one of the symbols width counts as one column by itself:
// each one that ansi.StringWidth measures as one column on its own and that combines with
// nothing.
func narrow(r rune) bool {
	switch {
	case r == 0xb7: // ·
		return true
	case r >= 0x2010 && r <= 0x2027: // dashes, quotes, bullets, …
		return true
	case r >= 0x2190 && r <= 0x21ff: // arrows
		return true
	case r >= 0x2500 && r <= 0x25fc: // box drawing, blocks, geometric shapes
		return true
	case r >= 0x2800 && r <= 0x28ff: // braille
		return true
	}
	return false
}

// pad cuts or pads plain text to exactly w columns.
func pad(s string, w int) string {
	if w <= 0 {
		return ""
	}
	sw := width(s)
	if sw > w {
		return ansi.Truncate(s, w, "…")
	}
	return s + strings.Repeat(" ", w-sw)
}

// padLeft right-aligns plain text in w columns.
func padLeft(s string, w int) string {
	sw := width(s)
	if sw > w {
		return ansi.Truncate(s, w, "…")
	}
	return strings.Repeat(" ", w-sw) + s
}
