package engine

import (
	"fmt"
	"iter"
)

// queueID names one of the engine's request queues; every request has a pair of links for
// each.
type queueID uint8

const (
	qWaiting queueID = iota
	qRunning
	qPrepared
	numQueues
)

// queue is one of the engine's request queues (waiting, running, prepared) as an intrusive
// doubly linked list through the requests' own links: a request joins at either end and
// leaves from anywhere in constant time, and the others keep their order. With thousands of
// requests running, a request finishing no longer shifts every request behind it.
//
// The zero queue of an id is empty and ready to use.
type queue struct {
	id         queueID
	head, tail *request
	n          int
}

// link is a request's place in one queue.
type link struct {
	prev, next *request
	in         bool
}

// Len returns the number of requests in the queue.
func (q *queue) Len() int { return q.n }

// has reports whether r is in the queue.
func (q *queue) has(r *request) bool { return r.links[q.id].in }

// front returns the first request, or nil.
func (q *queue) front() *request { return q.head }

// next returns the request after r in the queue, or nil.
func (q *queue) next(r *request) *request { return r.links[q.id].next }

// pushBack appends r, which must not be in the queue.
func (q *queue) pushBack(r *request) {
	l := &r.links[q.id]
	if l.in {
		panic("engine: request " + r.id + " joins a queue it is in")
	}
	*l = link{prev: q.tail, in: true}
	if q.tail != nil {
		q.tail.links[q.id].next = r
	} else {
		q.head = r
	}
	q.tail = r
	q.n++
}

// pushFront puts r first; it must not be in the queue.
func (q *queue) pushFront(r *request) {
	l := &r.links[q.id]
	if l.in {
		panic("engine: request " + r.id + " joins a queue it is in")
	}
	*l = link{next: q.head, in: true}
	if q.head != nil {
		q.head.links[q.id].prev = r
	} else {
		q.tail = r
	}
	q.head = r
	q.n++
}

// remove takes r out of the queue; a request not in it is left as it is.
func (q *queue) remove(r *request) {
	l := &r.links[q.id]
	if !l.in {
		return
	}
	if l.prev != nil {
		l.prev.links[q.id].next = l.next
	} else {
		q.head = l.next
	}
	if l.next != nil {
		l.next.links[q.id].prev = l.prev
	} else {
		q.tail = l.prev
	}
	*l = link{}
	q.n--
}

// all yields the requests in order. The loop's body may remove the request it was given,
// and no other.
func (q *queue) all() iter.Seq[*request] {
	return func(yield func(*request) bool) {
		for r := q.head; r != nil; {
			next := r.links[q.id].next
			if !yield(r) {
				return
			}
			r = next
		}
	}
}

// appendTo appends the queue's requests to dst, in order.
func (q *queue) appendTo(dst []*request) []*request {
	for r := q.head; r != nil; r = r.links[q.id].next {
		dst = append(dst, r)
	}
	return dst
}

// check verifies the queue's links: each request's neighbours point back at it, the count
// is right, and every request in it says so.
func (q *queue) check() error {
	n := 0
	var prev *request
	for r := q.head; r != nil; r = r.links[q.id].next {
		l := r.links[q.id]
		if !l.in || l.prev != prev {
			return fmt.Errorf("queue %d: %s is linked wrong", q.id, r.id)
		}
		prev = r
		if n++; n > q.n {
			return fmt.Errorf("queue %d holds more than its %d requests", q.id, q.n)
		}
	}
	if n != q.n || q.tail != prev {
		return fmt.Errorf("queue %d: %d requests linked, %d counted", q.id, n, q.n)
	}
	return nil
}
