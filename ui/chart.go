package ui

import (
	"math"
	"strconv"
	"strings"
)

// plot is one chart's drawing in braille: w cells by h rows, two values a cell across and
// four dots a row up. Area is filled from the bottom to each value; Line, when set, is a
// dot at each value, and Level a dashed line at one value across the plot. A line crossing
// the area clears its dots there instead of setting them, so both read without colour: a
// notch running through the fill. Values are NaN where there is none.
type plot struct {
	w, h  int
	top   float64 // the value of the plot's top edge; 0 is its bottom
	area  []float64
	line  []float64
	level float64
	from  int // the first x-position with a value: the level starts there
}

// Braille cells: U+2800 plus a bit a dot. dotBits[col][row] is the bit of the dot in the
// cell's left or right column, row 0 at the top.
var dotBits = [2][4]rune{{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}}

// dots returns how many dots of the plot's 4h a value reaches: a value above zero shows at
// least one.
func (p *plot) dots(v float64) int {
	if math.IsNaN(v) || v <= 0 || p.top <= 0 {
		return 0
	}
	n := int(math.Round(v / p.top * float64(4*p.h)))
	return min(max(n, 1), 4*p.h)
}

// cells returns the plot as h rows of w braille cells, top row first.
func (p *plot) cells() [][]rune {
	rows := make([][]rune, p.h)
	for r := range rows {
		rows[r] = make([]rune, p.w)
		for c := range rows[r] {
			rows[r][c] = 0x2800
		}
	}
	areaDots := make([]int, 2*p.w)
	for x := range min(len(p.area), 2*p.w) {
		areaDots[x] = p.dots(p.area[x])
	}
	// set sets dot d (0 at the bottom) of x-position x, or clears it when it lies inside
	// the area below the area's top edge; on the top edge it is set already.
	set := func(x, d int) {
		if d < 0 || d >= 4*p.h {
			return
		}
		row := p.h - 1 - d/4
		bit := dotBits[x%2][3-d%4]
		switch {
		case d >= areaDots[x]:
			rows[row][x/2] |= bit
		case d < areaDots[x]-1:
			rows[row][x/2] &^= bit
		}
	}
	for x, n := range areaDots {
		for d := range n {
			rows[p.h-1-d/4][x/2] |= dotBits[x%2][3-d%4]
		}
	}
	for x := range min(len(p.line), 2*p.w) {
		if v := p.line[x]; !math.IsNaN(v) {
			set(x, max(p.dots(v)-1, 0))
		}
	}
	if n := p.dots(p.level); n > 0 {
		for x := p.from &^ 1; x < 2*p.w; x += 2 {
			set(x, n-1)
		}
	}
	return rows
}

// shortNum writes a chart's axis value in at most 5 columns: 512, 1.2k, 65k, 1.3M.
func shortNum(v float64) string {
	switch a := math.Abs(v); {
	case a >= 10e6:
		return trimZero(v/1e6, 0) + "M"
	case a >= 1e6:
		return trimZero(v/1e6, 1) + "M"
	case a >= 10e3:
		return trimZero(v/1e3, 0) + "k"
	case a >= 1e3:
		return trimZero(v/1e3, 1) + "k"
	case a >= 10 || a == math.Trunc(a):
		return trimZero(v, 0)
	}
	return trimZero(v, 1)
}

// trimZero writes v with prec decimals at most, without trailing zeros.
func trimZero(v float64, prec int) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if prec > 0 {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// niceTop rounds a chart's largest value up to 1, 2 or 5 times a power of ten, so that the
// axis reads at a glance and does not move with every sample.
func niceTop(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
