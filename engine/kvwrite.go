package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/engine/prepare"
)

// ErrStaleKVWrite refuses a KV write whose metadata was not issued to a request that is still
// prepared: the request finished, was aborted or retired, and its slots may be another's.
var ErrStaleKVWrite = errors.New("engine: stale KV write")

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
	slots := pages.Expand(make([]int64, 0, r.kv.reserved), r.runs[0])
	if w.Offset < 0 || w.Tokens < 1 || w.Offset > len(slots)-w.Tokens {
		return KVResult{}, fmt.Errorf("kv write for %s: tokens [%d, %d+%d) are outside its %d reserved slots: %w",
			r.id, w.Offset, w.Offset, w.Tokens, len(slots), ErrBadKVWrite)
	}
	return e.ReceiveKV(now, slots[w.Offset:w.Offset+w.Tokens], w.Payload)
}

// issuedTo returns the prepared request whose metadata this is, or nil.
func (e *Engine) issuedTo(metadata string) *request {
	for _, r := range e.prepared {
		if r.encoded == metadata {
			return r
		}
	}
	return nil
}

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
