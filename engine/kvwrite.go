package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
)

// ErrStaleKVWrite refuses a KV write whose metadata was not issued to a request that is still
// prepared: the request finished, was aborted or retired, and its slots may be another's.
var ErrStaleKVWrite = errors.New("engine: stale KV write")

// KVResult says what a KV write did.
type KVResult struct {
	Requests []string // the requests the slots belong to, in first-seen order
	Complete []string // of which now complete
	// Both are read-only: a write of one request's slots answers with a list the engine
	// keeps for the request.
}

// KVWrite is a prefill instance's KV write as it names its slots: by the kv_append_metadata
// string prep_recv answered, and a range of that metadata's expanded slot list (model 0's
// runs written out slot by slot).
type KVWrite struct {
	Metadata string
	Offset   int // the first token written, an index into the expanded slot list
	Tokens   int // tokens written
	// Payload is each token's KV in slot order, for each model in turn within a token; empty
	// when the engine keeps no payload (see ReceiveKV).
	Payload []byte
}

// WriteKV records a KV write addressed by its metadata. The metadata must be the one
// issued to a request that is still prepared (or kv-complete); the engine resolves the
// slots from that request's own reservation and writes them as ReceiveKV does.
//
// A write with any other well-formed metadata is refused with ErrStaleKVWrite and raises a
// stale-kv-write hazard: slots are recycled, and a late write for a finished request would
// otherwise land in whatever request holds them now. The hazard is the one thing a refused
// write changes.
func (e *Engine) WriteKV(now time.Time, w KVWrite) (KVResult, error) {
	r := e.issuedTo(w.Metadata)
	if r == nil {
		return KVResult{}, e.staleKVWrite(now, w)
	}
	if w.Offset < 0 || w.Tokens < 1 || w.Offset > r.kv.reserved-w.Tokens {
		return KVResult{}, fmt.Errorf("kv write for %s: tokens [%d, %d+%d) are outside its %d reserved slots: %w",
			r.id, w.Offset, w.Offset, w.Tokens, r.kv.reserved, ErrBadKVWrite)
	}
	runs := r.runs[0]
	if w.Offset > 0 || w.Tokens < r.kv.reserved {
		e.kvRuns = runsOf(e.kvRuns[:0], runs, w.Offset, w.Offset+w.Tokens)
		runs = e.kvRuns
	}
	return e.receive(now, runs, w.Tokens, w.Payload)
}

// ReceiveKV records a prefill instance's write of len(slots) tokens of KV. payload holds
// each token's KV in slot order, for each model in turn within a token (models ×
// TokenBytes bytes a token), and is empty when the engine keeps no payload. Every slot must
// be reserved by a prepared request and not written yet; otherwise nothing is written.
func (e *Engine) ReceiveKV(now time.Time, slots []int64, payload []byte) (KVResult, error) {
	if len(slots) == 0 {
		return KVResult{}, fmt.Errorf("kv write of no slots: %w", ErrBadKVWrite)
	}
	e.kvRuns = appendRuns(e.kvRuns[:0], slots)
	return e.receive(now, e.kvRuns, len(slots), payload)
}

// ReceiveRuns is ReceiveKV for the slots of runs, in order: [start, len] for the slots
// start, start+1, …, start+len-1. A write of a request's whole reservation (its metadata's
// runs) allocates nothing but its event.
func (e *Engine) ReceiveRuns(now time.Time, runs []pages.Run, payload []byte) (KVResult, error) {
	limit := int64(e.caches[0].NumPages()) * int64(e.cfg.PageSize)
	var n int64
	for _, r := range runs {
		if r.Len < 1 || r.Len > limit {
			return KVResult{}, fmt.Errorf("kv write: run [%d, %d] has a length outside [1, %d]: %w", r.Start, r.Len, limit, ErrBadKVWrite)
		}
		if n += r.Len; n > limit {
			return KVResult{}, fmt.Errorf("kv write: %d or more slots, more than the pool's %d: %w", n, limit, ErrBadKVWrite)
		}
	}
	if n == 0 {
		return KVResult{}, fmt.Errorf("kv write of no slots: %w", ErrBadKVWrite)
	}
	return e.receive(now, runs, int(n), payload)
}

// appendRuns appends slots to dst as runs, consecutive slots in one.
func appendRuns(dst []pages.Run, slots []int64) []pages.Run {
	for i := 0; i < len(slots); {
		j := i + 1
		for j < len(slots) && slots[j] == slots[j-1]+1 {
			j++
		}
		dst = append(dst, pages.Run{Start: slots[i], Len: int64(j - i)})
		i = j
	}
	return dst
}

// kvSeg is a piece of a KV write: slots on one page, consecutive in the write and in one
// request's reservation, its token indexes [lo, hi).
type kvSeg struct {
	r      *request
	start  int64
	lo, hi int
}

// receive writes n slots given as runs, after checking every one of them: it is reserved
// by a prepared request and not yet written, and the write names it once. Its checks, and
// their errors, are those of a slot-by-slot pass in write order, made a page at a time.
func (e *Engine) receive(now time.Time, runs []pages.Run, n int, payload []byte) (KVResult, error) {
	var res KVResult
	tb := e.stores[0].TokenBytes()
	if want := n * tb * len(e.stores); len(payload) != want {
		return res, fmt.Errorf("kv write of %d slots: payload is %d bytes, want %d (%d models × %d bytes a token): %w",
			n, len(payload), want, len(e.stores), tb, ErrBadKVWrite)
	}
	ps := int64(e.cfg.PageSize)
	limit := int64(e.caches[0].NumPages()) * ps
	segs := e.kvSegs[:0]
	defer func() { clear(segs); e.kvSegs = segs[:0] }()
	hint := -1
	var last *request
	for _, run := range runs {
		for s := run.Start; s < run.End(); {
			if s < 0 || s >= limit {
				return res, fmt.Errorf("kv write: slot %d is outside the pool [0, %d): %w", s, limit, ErrBadKVWrite)
			}
			r := e.pageKV[s/ps]
			if r == nil {
				return res, fmt.Errorf("kv write: slot %d (page %d) is not reserved by a prepared request: %w", s, s/ps, ErrBadKVWrite)
			}
			if r != last {
				hint, last = -1, r
			}
			lo, k, sp, ok := r.kv.locate(s, run.End()-s, int(ps), hint)
			hint = sp
			if !ok {
				return res, fmt.Errorf("kv write: slot %d is on a page of %s but not one of its reserved slots: %w", s, r.id, ErrBadKVWrite)
			}
			if i, ok := r.kv.firstGot(lo, lo+k); ok {
				return res, fmt.Errorf("kv write: slot %d of %s (token %d) was already written: %w", s+int64(i-lo), r.id, r.matched+i, ErrBadKVWrite)
			}
			segs = append(segs, kvSeg{r: r, start: s, lo: lo, hi: lo + k})
			s += int64(k)
		}
	}
	if err := e.checkTwice(segs, runs); err != nil {
		return res, err
	}
	e.setNow(now)
	// Everything checked: write.
	if tb > 0 {
		i := 0
		for _, sg := range segs {
			for s := sg.start; s < sg.start+int64(sg.hi-sg.lo); s++ {
				for m, st := range e.stores {
					off := (i*len(e.stores) + m) * tb
					st.WriteSlot(s, payload[off:off+tb])
				}
				i++
			}
		}
	}
	for _, sg := range segs {
		sg.r.kv.add(sg.lo, sg.hi)
	}
	e.totals.KVTokens += uint64(n)
	one := true
	for _, sg := range segs {
		one = one && sg.r == segs[0].r
	}
	if one {
		e.received(&res, segs[0].r, segs)
		return res, nil
	}
	// Several requests (a write by slots can span them): each in first-seen order, with its
	// own pieces.
	done := map[*request]bool{}
	for _, sg := range segs {
		if r := sg.r; !done[r] {
			done[r] = true
			mine := slices.DeleteFunc(slices.Clone(segs), func(o kvSeg) bool { return o.r != r })
			e.received(&res, r, mine)
		}
	}
	return res, nil
}

// received says what a write did to one of its requests, whose pieces of it are segs: the
// event, and the answer.
func (e *Engine) received(res *KVResult, r *request, segs []kvSeg) {
	res.Requests = appendOrShare(res.Requests, r.self)
	e.emit(KVReceived{Stamp: e.mark(), ID: r.id, Runs: writtenRuns(r.runs[0], segs), Received: r.kv.received, Reserved: r.kv.reserved})
	if r.kv.complete() {
		res.Complete = appendOrShare(res.Complete, r.self)
		r.state = StateKVComplete
		e.unmapKV(r)
		if e.cfg.ExcludeUnreceived && !r.extQueued {
			e.queueExtension(r)
		}
	}
}

// appendOrShare appends one request's id list to a list, sharing it when the list is empty.
func appendOrShare(list, self []string) []string {
	if len(list) == 0 {
		return self
	}
	return append(slices.Clip(list), self...)
}

// writtenRuns returns the slots of a request's pieces of a write as runs, consecutive
// slots in one: the request's reservation itself when they are all of it (which it can
// share, as events do), else a new list.
func writtenRuns(reserved []pages.Run, segs []kvSeg) []pages.Run {
	same, k := true, 0 // whether the runs so far are reserved's first k
	var cur pages.Run
	for i, sg := range segs {
		n := int64(sg.hi - sg.lo)
		if i > 0 && sg.start == cur.End() {
			cur.Len += n
			continue
		}
		if i > 0 {
			same = same && k < len(reserved) && reserved[k] == cur
			k++
		}
		cur = pages.Run{Start: sg.start, Len: n}
	}
	if same && k == len(reserved)-1 && reserved[k] == cur {
		return reserved
	}
	out := make([]pages.Run, 0, k+1)
	for i, sg := range segs {
		n := int64(sg.hi - sg.lo)
		if i > 0 && sg.start == out[len(out)-1].End() {
			out[len(out)-1].Len += n
			continue
		}
		out = append(out, pages.Run{Start: sg.start, Len: n})
	}
	return out
}

// checkTwice refuses a write that names a slot twice, with the first slot, in write order,
// that it names again. The pieces of one request are usually in order, which shows there
// is none; otherwise they are compared sorted, and only a write that does name one is
// gone through slot by slot, for the message.
func (e *Engine) checkTwice(segs []kvSeg, runs []pages.Run) error {
	ordered := true
	for i := 1; i < len(segs) && ordered; i++ {
		ordered = segs[i].r == segs[i-1].r && segs[i].lo >= segs[i-1].hi
	}
	if ordered {
		return nil
	}
	sorted := append(e.kvSorted[:0], segs...)
	defer func() { clear(sorted); e.kvSorted = sorted[:0] }()
	slices.SortFunc(sorted, func(a, b kvSeg) int {
		if a.r != b.r {
			return int(a.r.seq - b.r.seq)
		}
		return a.lo - b.lo
	})
	twice := false
	for i := 1; i < len(sorted) && !twice; i++ {
		twice = sorted[i].r == sorted[i-1].r && sorted[i].lo < sorted[i-1].hi
	}
	if !twice {
		return nil
	}
	seen := map[int64]bool{}
	for _, r := range runs {
		for s := r.Start; s < r.End(); s++ {
			if seen[s] {
				return fmt.Errorf("kv write: slot %d appears twice: %w", s, ErrBadKVWrite)
			}
			seen[s] = true
		}
	}
	panic("engine: a KV write's pieces overlap but no slot appears twice")
}

// issuedTo returns the prepared request whose metadata this is, or nil.
func (e *Engine) issuedTo(metadata string) *request { return e.issued[metadata] }

// staleKVWrite refuses a write whose metadata no prepared request holds, naming the request
// it was issued to and the one its slots now belong to, and flags it.
func (e *Engine) staleKVWrite(now time.Time, w KVWrite) error {
	arr, err := prepare.Decode(w.Metadata)
	if err != nil {
		return fmt.Errorf("kv write: %w", err)
	}
	md, err := prepare.Split(arr)
	if err != nil {
		return fmt.Errorf("kv write: %w", err)
	}
	e.setNow(now)
	h := Hazard{Kind: HazardStaleKVWrite, Seq: -1, Offset: w.Offset, Tokens: w.Tokens}
	issuer := "no request this engine knows"
	for i := len(e.order) - 1; i >= 0; i-- {
		if r := e.order[i]; r.encoded == w.Metadata {
			h.ID, h.Seq = r.id, r.seq
			issuer = fmt.Sprintf("%s, which is %s", r.id, r.state)
			break
		}
	}
	holder := ""
	if s, ok := slotAt(md[0], w.Offset); ok && s >= 0 && s < int64(e.caches[0].NumPages())*int64(e.cfg.PageSize) {
		if r := e.pageKV[int32(s/int64(e.cfg.PageSize))]; r != nil {
			h.Holder = r.id
			holder = "; its slots now belong to " + r.id
		}
	}
	e.hazard(h)
	return fmt.Errorf("kv write: the metadata was issued to %s, not to a request still prepared%s: %w", issuer, holder, ErrStaleKVWrite)
}

// slotAt returns the slot at index i of the runs written out slot by slot, without writing
// them out (a stale write's metadata can claim any number of slots).
func slotAt(runs []pages.Run, i int) (int64, bool) {
	n := int64(i)
	for _, r := range runs {
		if n < 0 {
			break
		}
		if n < r.Len {
			return r.Start + n, true
		}
		n -= r.Len
	}
	return 0, false
}
