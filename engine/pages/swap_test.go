package pages

import (
	"slices"
	"testing"
)

// SwapPages renames two pages everywhere (blocks, the free list) and the cache stays sound;
// SinkFree moves free pages to the bottom of the free list and leaves held ones alone.
func TestSwapPagesAndSinkFree(t *testing.T) {
	c, err := New(Config{PageSize: 4, NumPages: 8})
	if err != nil {
		t.Fatal(err)
	}
	c.AddSequence(1)
	if _, err := c.ReserveAppend(1, 6, nil); err != nil { // pages 0, 1
		t.Fatal(err)
	}
	if err := c.ForkSequence(1, 2, 4); err != nil { // shares page 0
		t.Fatal(err)
	}
	if _, err := c.ReserveAppend(2, 2, nil); err != nil { // page 2
		t.Fatal(err)
	}
	for _, sw := range [][2]int32{{0, 5}, {1, 2}, {3, 4}, {5, 6}} {
		if err := c.SwapPages(sw[0], sw[1]); err != nil {
			t.Fatal(err)
		}
		if err := c.Check(); err != nil {
			t.Fatalf("after swapping %v: %v", sw, err)
		}
	}
	p1, _ := c.SequencePages(1, nil)
	p2, _ := c.SequencePages(2, nil)
	if !slices.Equal(p1, []int32{6, 2}) || !slices.Equal(p2, []int32{6, 1}) {
		t.Errorf("pages after the swaps: seq 1 %v, seq 2 %v; want [6 2] and [6 1]", p1, p2)
	}
	if err := c.SwapPages(0, 8); err == nil {
		t.Error("a swap outside the pool was accepted")
	}
	c.SinkFree([]int32{7, 6, 0})
	if free := c.FreeList(); free[0] != 7 || free[1] != 0 || slices.Contains(free, 6) {
		t.Errorf("free list after sinking 7 and 0 (6 is held) = %v", free)
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
}
