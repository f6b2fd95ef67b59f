package engine

import (
	"fmt"

	"github.com/kvtop/kvtop/engine/prefix"
)

// Counterfactual is what the prefix cache would have matched under the other eviction order:
// Stats are those of a second prefix cache, of tokens only, fed the same requests as the real
// one (docs/prefix-cache.md, "what the order costs").
type Counterfactual struct {
	Order prefix.EvictOrder `json:"order"`
	Stats prefix.Stats      `json:"stats"`
}

func (c *Counterfactual) clone() *Counterfactual {
	if c == nil {
		return nil
	}
	x := *c
	return &x
}

// counterfactual is that second cache. It decides nothing: it matches each admitted
// request's prompt as the real cache does, takes the same extensions, recycles and removes
// what the real one recycles and removes, and evicts one of its own (in its order) whenever
// the real cache evicts for want of memory; its cap on recycling evicts as the real one's
// does. So it sees the same requests under the same memory pressure, and only the choice of
// victim differs. Its sequence ids are its own.
type counterfactual struct {
	c    *prefix.Cache
	next int64
}

// otherOrder is the order the counterfactual runs: the one the engine does not.
func otherOrder(o prefix.EvictOrder) prefix.EvictOrder {
	if o == prefix.EvictLRU {
		return prefix.EvictMLC
	}
	return prefix.EvictLRU
}

func newCounterfactual(cfg Config) *counterfactual {
	if !cfg.Counterfactual || cfg.PrefixCache != "radix" {
		return nil
	}
	return &counterfactual{c: prefix.New(prefix.Config{Mode: prefix.Radix, MaxRecycling: cfg.Recycling(), Evict: otherOrder(cfg.EvictOrder)})}
}

// state returns what the counterfactual has matched, or nil when there is none.
func (cf *counterfactual) state(cfg Config) *Counterfactual {
	if cf == nil {
		return nil
	}
	return &Counterfactual{Order: otherOrder(cfg.EvictOrder), Stats: cf.c.Stats()}
}

// insert matches an admitted request's window, as the real cache matched it.
func (cf *counterfactual) insert(r *request) {
	r.alt, r.altMatched = -1, 0
	if cf == nil || r.end == 0 {
		return
	}
	id := cf.next
	cf.next++
	res, err := cf.c.InsertSequence(id, r.prompt[:r.end], prefix.NoWindow)
	if err != nil {
		panic(fmt.Sprintf("engine: counterfactual insert of %s: %v", r.id, err))
	}
	r.alt, r.altMatched = id, res.Offset
	if res.Kind == prefix.Reuse {
		r.alt = res.Parent
	}
}

// extend queues tokens the request's sequence now holds (prompt[from:to)).
func (cf *counterfactual) extend(r *request, tokens []int32) {
	if cf != nil && r.alt >= 0 && len(tokens) > 0 && cf.c.HasSequence(r.alt) {
		cf.c.ExtendSequence(r.alt, tokens)
	}
}

// release recycles or removes the request's sequence as the real cache did its own.
func (cf *counterfactual) release(r *request, recycle bool) {
	if cf == nil || r.alt < 0 || !cf.c.HasSequence(r.alt) {
		return
	}
	var err error
	if recycle {
		err = cf.c.RecycleSequence(r.alt)
	} else {
		err = cf.c.RemoveSequence(r.alt)
	}
	if err != nil {
		panic(fmt.Sprintf("engine: counterfactual release of %s: %v", r.id, err))
	}
	r.alt = -1
}

// evict frees memory as the real cache just did.
func (cf *counterfactual) evict() {
	if cf != nil {
		cf.c.TryFreeMemory()
	}
}
