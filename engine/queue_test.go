package engine

import (
	"fmt"
	"slices"
	"testing"
)

// A queue keeps its requests in order whatever joins at either end or leaves from anywhere,
// as a slice would.
func TestQueueKeepsOrder(t *testing.T) {
	q := queue{id: qRunning}
	var want []*request
	reqs := make([]*request, 50)
	for i := range reqs {
		reqs[i] = &request{id: fmt.Sprint("r", i)}
	}
	check := func(step string) {
		t.Helper()
		if got := q.appendTo(nil); !slices.Equal(got, want) || q.Len() != len(want) {
			t.Fatalf("%s: the queue holds %d, want %d in order", step, q.Len(), len(want))
		}
		if err := q.check(); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	for i, r := range reqs {
		if i%3 == 0 {
			q.pushFront(r)
			want = slices.Insert(want, 0, r)
		} else {
			q.pushBack(r)
			want = append(want, r)
		}
		check(fmt.Sprint("after adding ", r.id))
	}
	for i, r := range reqs {
		if i%2 == 1 {
			q.remove(r)
			want = slices.DeleteFunc(want, func(x *request) bool { return x == r })
			check(fmt.Sprint("after removing ", r.id))
		}
	}
	q.remove(reqs[1]) // not in it: nothing changes
	check("after removing one that left")
	for r := range q.all() { // removing the one given, while iterating
		q.remove(r)
	}
	want = nil
	check("after removing every one while iterating")
}

// A bounded list keeps its last limit elements, oldest first, and a list handed out earlier
// keeps its elements.
func TestAppendBounded(t *testing.T) {
	var s []int
	var lists [][]int
	for i := range 100 {
		s = appendBounded(s, i, 8)
		lists = append(lists, s)
	}
	for i, l := range lists {
		var want []int
		for v := max(0, i-7); v <= i; v++ {
			want = append(want, v)
		}
		if !slices.Equal(l, want) {
			t.Fatalf("after appending %d: %v, want %v", i, l, want)
		}
	}
	if got := appendBounded([]int{1, 2}, 3, 0); len(got) != 0 {
		t.Errorf("a bound of 0 keeps %v", got)
	}
}
